"""AMQP's two string types on the wire, shared by the method and property codecs.

A string that runs past the end of its buffer raises IndexError; each codec turns
that into its own "truncated" error, in its own words.
"""

from __future__ import annotations

from struct import Struct
from typing import Any

LONGSTR_LENGTH = Struct(">I")


def _raw(value: Any, kind: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{kind} must be str or bytes, not {type(value).__name__}")


def encode_shortstr(value: Any) -> bytes:
    raw = _raw(value, "shortstr")
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def encode_longstr(value: Any) -> bytes:
    raw = _raw(value, "longstr")
    return LONGSTR_LENGTH.pack(len(raw)) + raw


def decode_shortstr(buf: Any, offset: int) -> tuple[str, int]:
    end = offset + 1 + buf[offset]
    if end > len(buf):
        raise IndexError("truncated shortstr")
    return str(buf[offset + 1 : end], "utf-8"), end


def decode_longstr(buf: Any, offset: int) -> tuple[bytes, int]:
    start = offset + 4
    end = start + LONGSTR_LENGTH.unpack_from(buf, offset)[0]
    if end > len(buf):
        raise IndexError("truncated longstr")
    return bytes(buf[start:end]), end
