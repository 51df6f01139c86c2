"""Basic content properties: the part of a content-header payload after
class-id, weight and body-size.

Wire layout: property-flag words (16 bits each; in each word bit 15 flags the
first property it covers, down to bit 1, and bit 0 says another flag word
follows), then the values of the present properties, in spec order.

The broker keeps properties as the raw bytes the publisher sent, so besides
the full codec there are ``peek_*`` helpers that pull out a single property by
skipping over the ones before it.

Python types: shortstr -> str, octet -> int, timestamp -> int (seconds),
table -> dict; an absent property is None.  Decoding is strict: flags for
properties the spec does not define, truncation and trailing bytes raise
PropertiesError.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError
from typing import Any, Callable

from .fieldtable import FieldTableError, decode_table, encode_table
from .methods import Fields
from .spec import BASIC_PROPERTIES, ArgSpec
from .strings import (
    LONGSTR_LENGTH,
    decode_longstr,
    decode_shortstr,
    encode_longstr,
    encode_shortstr,
)

__all__ = [
    "BasicProperties",
    "PropertiesError",
    "encode_properties",
    "decode_properties",
    "peek_delivery_mode",
    "peek_priority",
    "peek_expiration",
    "peek_reply_to",
    "flag_mask",
    "EMPTY_PROPERTIES",
]


class PropertiesError(ValueError):
    """Content properties that cannot be encoded or decoded."""


_FLAG_WORD = Struct(">H")
_FLAGS_PER_WORD = 15  # bit 0 of each word is the continuation flag
_CONTINUATION = 1


def _flag_position(index: int) -> tuple[int, int]:
    """(flag word index, bit mask) of the index-th property."""
    return index // _FLAGS_PER_WORD, 1 << (15 - index % _FLAGS_PER_WORD)


# --- the property class --------------------------------------------------------


class BasicProperties(Fields):
    """Content properties of the basic class; every property defaults to None (absent)."""

    __slots__ = tuple(prop.py_name for prop in BASIC_PROPERTIES)
    FIELDS = __slots__
    # The spec's properties as a type checker sees them (a test holds them to FIELDS).
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any] | None
    delivery_mode: int | None
    priority: int | None
    correlation_id: str | None
    reply_to: str | None
    expiration: str | None
    message_id: str | None
    timestamp: int | None
    type: str | None
    user_id: str | None
    app_id: str | None
    cluster_id: str | None

    def __init__(self, **properties: Any) -> None:
        for name in self.FIELDS:
            setattr(self, name, properties.pop(name, None))
        if properties:
            raise TypeError(f"unknown basic properties: {', '.join(sorted(properties))}")

    def __repr__(self) -> str:
        present = (f"{name}={getattr(self, name)!r}" for name in self.FIELDS if getattr(self, name) is not None)
        return f"BasicProperties({', '.join(present)})"


#: The encoding of BasicProperties() (no property present).
EMPTY_PROPERTIES = _FLAG_WORD.pack(0)


# --- per-type value codecs ---------------------------------------------------------
# readers: (buf, offset) -> (value, new_offset), bounds-checked against len(buf).
# widths: how peeking skips a value without reading it -- a fixed byte count,
# or one of the length-prefixed markers below.

_SHORT_PREFIXED = -1  # 1-byte length + data (shortstr)
_LONG_PREFIXED = -4  # 4-byte length + data (longstr, table)


def _int_codec(fmt: str) -> tuple[Callable[..., Any], Callable[..., Any], int]:
    packer = Struct(">" + fmt)
    size = packer.size

    def read(buf: Any, offset: int) -> tuple[int, int]:
        return packer.unpack_from(buf, offset)[0], offset + size  # struct.error if truncated

    return packer.pack, read, size


# type -> (write, read, width)
_CODECS: dict[str, tuple[Callable[..., Any], Callable[..., Any], int]] = {
    "shortstr": (encode_shortstr, decode_shortstr, _SHORT_PREFIXED),
    "longstr": (encode_longstr, decode_longstr, _LONG_PREFIXED),
    "table": (encode_table, decode_table, _LONG_PREFIXED),
    "octet": _int_codec("B"),
    "short": _int_codec("H"),
    "long": _int_codec("I"),
    "longlong": _int_codec("Q"),
    "timestamp": _int_codec("Q"),
}


class _PropertyPlan:
    """How to find, read, write and skip one property."""

    def __init__(self, index: int, prop: ArgSpec) -> None:
        self.index = index
        self.name = prop.py_name
        self.word, self.mask = _flag_position(index)
        self.write, self.read, self.width = _CODECS[prop.type]


_PLAN = tuple(_PropertyPlan(index, prop) for index, prop in enumerate(BASIC_PROPERTIES))
_PLAN_BY_NAME = {plan.name: plan for plan in _PLAN}
_FLAG_WORD_COUNT = _PLAN[-1].word + 1 if _PLAN else 1
# Per flag word, the bits that stand for a defined property.
_DEFINED_FLAGS = [0] * _FLAG_WORD_COUNT
for _plan in _PLAN:
    _DEFINED_FLAGS[_plan.word] |= _plan.mask
del _plan


# --- encode / decode ---------------------------------------------------------------


def encode_properties(properties: BasicProperties) -> bytes:
    words = [0] * _FLAG_WORD_COUNT
    values = []
    for plan in _PLAN:
        value = getattr(properties, plan.name)
        if value is not None:
            words[plan.word] |= plan.mask
            try:
                values.append(plan.write(value))
            except PropertiesError:
                raise
            except (StructError, TypeError, ValueError, AttributeError) as exc:  # incl. FieldTableError
                raise PropertiesError(f"cannot encode property {plan.name}={value!r}: {exc}") from exc
    # Only as many flag words as needed; each but the last says "more follow".
    while len(words) > 1 and words[-1] == 0:
        words.pop()
    flags = b"".join(
        _FLAG_WORD.pack(word | (_CONTINUATION if i < len(words) - 1 else 0)) for i, word in enumerate(words)
    )
    return flags + b"".join(values)


def _read_flag_words(raw: Any) -> tuple[list[int], int]:
    """Return the property-flag words (continuation bits cleared) and the offset after them."""
    if len(raw) >= 2:
        first = _FLAG_WORD.unpack_from(raw, 0)[0]
        if not first & _CONTINUATION:  # the usual case: one flag word
            return [first], 2
    words = []
    offset = 0
    while True:
        if offset + 2 > len(raw):
            raise PropertiesError("truncated property flags")
        word = _FLAG_WORD.unpack_from(raw, offset)[0]
        offset += 2
        words.append(word & ~_CONTINUATION)
        if not word & _CONTINUATION:
            return words, offset


def _as_buffer(raw: Any) -> Any:
    if isinstance(raw, memoryview) and (raw.format != "B" or raw.ndim != 1):
        return raw.cast("B")
    return raw


def decode_properties(raw: bytes | bytearray | memoryview) -> BasicProperties:
    raw = _as_buffer(raw)
    words, offset = _read_flag_words(raw)
    for i, word in enumerate(words):
        defined = _DEFINED_FLAGS[i] if i < len(_DEFINED_FLAGS) else 0
        if word & ~defined:
            raise PropertiesError(f"property flags 0x{word:04x} name properties the spec does not define")
    properties = BasicProperties()
    try:
        for plan in _PLAN:
            if plan.word < len(words) and words[plan.word] & plan.mask:
                value, offset = plan.read(raw, offset)
                setattr(properties, plan.name, value)
    except PropertiesError:
        raise
    except (StructError, IndexError):
        raise PropertiesError("truncated properties") from None
    except UnicodeDecodeError:
        raise PropertiesError("shortstr property is not valid UTF-8") from None
    except FieldTableError as exc:
        raise PropertiesError(f"bad table property: {exc}") from None
    if offset != len(raw):
        raise PropertiesError(f"{len(raw) - offset} unexpected bytes after the properties")
    return properties


# --- peeking ---------------------------------------------------------------------


def _skip(raw: Any, offset: int, width: int) -> int:
    """The offset after a property value of the given width (see _CODECS)."""
    # An offset past the end surfaces as IndexError/struct.error at the next read.
    if width > 0:
        return offset + width
    if width == _SHORT_PREFIXED:
        return offset + 1 + raw[offset]
    return offset + 4 + LONGSTR_LENGTH.unpack_from(raw, offset)[0]


def _peeker(name: str) -> Callable[[Any], Any]:
    """Build a function that reads property `name` from raw properties, or None if absent."""
    target = _PLAN_BY_NAME[name]
    before = _PLAN[: target.index]
    read_target, target_word, target_mask = target.read, target.word, target.mask
    # Fast path: a single flag word (no continuation), which covers every
    # property of the basic class. Otherwise go through all the flag words.
    single_word = target_word == 0 and all(plan.word == 0 for plan in before)
    preceding = tuple((plan.mask, plan.width) for plan in before)

    def peek(raw: bytes | bytearray | memoryview) -> Any:
        if type(raw) is memoryview:
            raw = _as_buffer(raw)
        try:
            flags = _FLAG_WORD.unpack_from(raw, 0)[0]
            if single_word and not flags & _CONTINUATION:
                if not flags & target_mask:
                    return None
                offset = 2
                for mask, width in preceding:
                    if flags & mask:
                        offset = _skip(raw, offset, width)
                return read_target(raw, offset)[0]
            words, offset = _read_flag_words(raw)
            if target_word >= len(words) or not words[target_word] & target_mask:
                return None
            for plan in before:
                if words[plan.word] & plan.mask:
                    offset = _skip(raw, offset, plan.width)
            return read_target(raw, offset)[0]
        except (StructError, IndexError):
            raise PropertiesError(f"truncated properties while peeking at {name}") from None
        except UnicodeDecodeError:
            raise PropertiesError(f"{name} is not valid UTF-8") from None
        except FieldTableError as exc:
            raise PropertiesError(f"bad {name}: {exc}") from None

    peek.__name__ = peek.__qualname__ = f"peek_{name}"
    peek.__doc__ = f"The {name} property from raw properties, or None if absent."
    return peek


peek_delivery_mode: Callable[[bytes | bytearray | memoryview], int | None] = _peeker("delivery_mode")
peek_priority: Callable[[bytes | bytearray | memoryview], int | None] = _peeker("priority")
peek_expiration: Callable[[bytes | bytearray | memoryview], str | None] = _peeker("expiration")
peek_reply_to: Callable[[bytes | bytearray | memoryview], str | None] = _peeker("reply_to")


def flag_mask(name: str) -> int:
    """The bit of property `name` in the first flag word."""
    plan = _PLAN_BY_NAME[name]
    if plan.word != 0:
        raise ValueError(f"{name} is not in the first flag word")
    return plan.mask
