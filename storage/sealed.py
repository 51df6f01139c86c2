"""Stored values carry their own checksum: an 8-byte xxh3-64 of the payload in
front of it. LMDB checks its page structure but not the bytes of a value, so a
damaged disk block inside a message would otherwise be served as it is."""

from __future__ import annotations

import xxhash

_digest = xxhash.xxh3_64_digest


class Damaged(Exception):
    """A stored value does not match its checksum."""


def seal(payload: bytes) -> bytes:
    return _digest(payload) + payload


def unseal(value) -> memoryview:
    """The payload of a sealed value (bytes or buffer); Damaged if it was altered."""
    view = memoryview(value)
    payload = view[8:]
    if len(view) < 8 or _digest(payload) != view[:8]:
        raise Damaged("a stored record does not match its checksum")
    return payload
