"""AMQP field tables and arrays, in RabbitMQ's dialect of the field-value types.

Type tags (as in rabbit_binary_parser / rabbit_binary_generator, not the
0-9-1 spec's own table, which disagrees on several letters):

    t bool        b int8      B uint8     s int16     u uint16
    I int32       i uint32    l int64     L int64 (as RabbitMQ reads it)
    f float32     d float64   D decimal (scale octet + int32)
    S longstr     x byte array (longstr)  A array     F nested table    V void
    T timestamp (uint64 seconds): a datetime; past datetime's year 9999 (a client
      that sent milliseconds) the int, as RabbitMQ keeps every timestamp

Decoding works on bytes, bytearray or memoryview with explicit offsets (no
slicing copies of the input except for the values themselves) and raises
FieldTableError -- never IndexError, struct.error or RecursionError -- for
anything malformed, including keys that are not UTF-8, unknown tags (pamqp's
NUL-byte void tag is not accepted, as in RabbitMQ) and tables and arrays nested
deeper than MAX_DEPTH. A nested value may not extend past its enclosing table or
array. Nesting is walked with an explicit stack, in both directions, so depth
is bounded by MAX_DEPTH alone, never by Python's recursion limit.
"""

from __future__ import annotations

import datetime
import decimal
from struct import Struct
from typing import Any, Callable

__all__ = [
    "FieldTableError",
    "MAX_DEPTH",
    "encode_table",
    "encode_array",
    "encode_value",
    "decode_table",
    "decode_array",
    "decode_value",
]

# Tables and arrays one inside another, the outermost counting as 1. RabbitMQ
# bounds them only by the frame's size; here the steps after decoding (the
# management API's JSON, msgpack to the shards and the catalogue, comparisons)
# walk them recursively, and they stay well within Python's recursion limit of
# 1000 (600 deep needs a margin of a few hundred frames for their callers).
MAX_DEPTH = 600


class FieldTableError(ValueError):
    """A field table or value that cannot be encoded or decoded."""


UTC = datetime.timezone.utc
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = datetime.timedelta(seconds=1)
_DATETIME_MAX_SECONDS = (datetime.datetime.max.replace(tzinfo=UTC) - EPOCH) // _ONE_SECOND

_U8 = Struct(">B")
_U32 = Struct(">I")
_I32 = Struct(">i")
_I64 = Struct(">q")
_U64 = Struct(">Q")
_F64 = Struct(">d")
_DECIMAL = Struct(">Bi")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


def _too_deep() -> FieldTableError:
    return FieldTableError(f"field tables and arrays nested deeper than {MAX_DEPTH} levels")


# --- encoding --------------------------------------------------------------------
# Leaf writers append to a shared bytearray; tables and arrays reserve their
# 4-byte length prefix and patch it once their contents are written.


def encode_table(table: dict[str, Any] | None) -> bytes:
    """Encode a table, including its 4-byte length prefix. None encodes as empty."""
    out = bytearray()
    if table and not isinstance(table, dict):
        raise FieldTableError(f"field table must be a dict, not {type(table).__name__}")
    _write_nested(out, table or {}, True)
    return bytes(out)


def encode_array(array: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode a field array, including its 4-byte length prefix."""
    out = bytearray()
    _write_nested(out, array, False)
    return bytes(out)


def encode_value(value: Any) -> bytes:
    """Encode one tagged field value (type tag + payload)."""
    out = bytearray()
    writer = _writer(value)
    if writer is _NESTED:
        is_table = isinstance(value, dict)
        out += b"F" if is_table else b"A"
        _write_nested(out, value, is_table)
    else:
        writer(out, value)
    return bytes(out)


def _patch_length(out: bytearray, start: int) -> None:
    length = len(out) - start - 4
    if length > _U32_MAX:
        raise FieldTableError("field table or array longer than 4 GiB")
    _U32.pack_into(out, start, length)


def _write_nested(out: bytearray, container: Any, is_table: bool) -> None:
    """A table (is_table) or an array with everything inside it, depth first: the
    stack holds each enclosing container's remaining items and length position."""
    stack: list[tuple[Any, int, bool]] = []
    start = len(out)
    out += b"\0\0\0\0"
    items = iter(container.items() if is_table else container)
    writers, nested = _WRITERS, _NESTED
    while True:
        inner = None  # the table or array met inside, to write next
        if is_table:
            for key, value in items:
                if not isinstance(key, str):
                    raise FieldTableError(f"field table key must be str, not {type(key).__name__}")
                raw_key = _utf8(key)
                if len(raw_key) > 255:
                    raise FieldTableError(f"field table key longer than 255 bytes: {key[:40]!r}...")
                out.append(len(raw_key))
                out += raw_key
                writer = writers.get(type(value)) or _writer(value)
                if writer is nested:
                    inner = value
                    break
                writer(out, value)
        else:
            for value in items:
                writer = writers.get(type(value)) or _writer(value)
                if writer is nested:
                    inner = value
                    break
                writer(out, value)
        if inner is None:  # this container is done: back to the one around it
            _patch_length(out, start)
            if not stack:
                return
            items, start, is_table = stack.pop()
            continue
        if len(stack) + 2 > MAX_DEPTH:
            raise _too_deep()
        stack.append((items, start, is_table))
        is_table = isinstance(inner, dict)
        out += b"F" if is_table else b"A"
        start = len(out)
        out += b"\0\0\0\0"
        items = iter(inner.items() if is_table else inner)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldTableError(f"string is not encodable as UTF-8: {exc}") from None


def _write_bool(out: bytearray, value: bool) -> None:
    out += b"t\x01" if value else b"t\x00"


def _write_int(out: bytearray, value: int) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        out += b"I"
        out += _I32.pack(value)
    elif _INT64_MIN <= value <= _INT64_MAX:
        out += b"l"
        out += _I64.pack(value)
    elif _INT64_MAX < value <= _U64_MAX:
        # Only a timestamp holds these (one read past year 9999 comes back so).
        out += b"T"
        out += _U64.pack(value)
    else:
        raise FieldTableError(f"integer out of the 64-bit range: {value}")


def _write_float(out: bytearray, value: float) -> None:
    out += b"d"
    out += _F64.pack(value)


def _write_decimal(out: bytearray, value: decimal.Decimal) -> None:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise FieldTableError(f"cannot encode {value} as an AMQP decimal")
    mantissa = int("".join(map(str, digits)) or "0")
    if exponent > 0:  # 1E+3: fold the exponent into the mantissa, scale 0
        if mantissa and exponent > 10:
            raise FieldTableError(f"decimal out of range: {value}")
        mantissa *= 10**exponent
        exponent = 0
    scale = -exponent
    if sign:
        mantissa = -mantissa
    if scale > 255 or not _INT32_MIN <= mantissa <= _INT32_MAX:
        raise FieldTableError(f"decimal out of range (scale 0-255, 32-bit mantissa): {value}")
    out += b"D"
    out += _DECIMAL.pack(scale, mantissa)


def _write_str(out: bytearray, value: str) -> None:
    raw = _utf8(value)
    out += b"S"
    out += _U32.pack(len(raw))
    out += raw


def _write_bytes(out: bytearray, value: bytes | bytearray | memoryview) -> None:
    out += b"x"
    out += _U32.pack(len(value) if not isinstance(value, memoryview) else value.nbytes)
    out += value


def _write_datetime(out: bytearray, value: datetime.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=UTC)  # naive datetimes are taken as UTC
    seconds = (value - EPOCH) // _ONE_SECOND
    if seconds < 0:
        raise FieldTableError(f"timestamp before 1970 cannot be encoded: {value}")
    out += b"T"
    out += _U64.pack(seconds)


def _write_void(out: bytearray, value: None) -> None:
    out += b"V"


def _nested(out: bytearray, value: Any) -> None:
    raise AssertionError("tables and arrays are written by _write_nested")


_NESTED = _nested  # the writer that says: a table or an array, to descend into

# Exact-type dispatch first (fast); subclasses fall back to the isinstance chain,
# in this order (bool before int: bool is an int subclass).
_WRITERS: dict[type, Callable[[bytearray, Any], None]] = {
    bool: _write_bool,
    int: _write_int,
    float: _write_float,
    decimal.Decimal: _write_decimal,
    str: _write_str,
    bytes: _write_bytes,
    bytearray: _write_bytes,
    memoryview: _write_bytes,
    list: _NESTED,
    tuple: _NESTED,
    datetime.datetime: _write_datetime,
    dict: _NESTED,
    type(None): _write_void,
}


def _writer(value: Any) -> Callable[[bytearray, Any], None]:
    writer = _WRITERS.get(type(value))
    if writer is not None:
        return writer
    for base, writer in _WRITERS.items():
        if isinstance(value, base):
            return writer
    raise FieldTableError(f"cannot encode {type(value).__name__} in a field table")


# --- decoding --------------------------------------------------------------------
# Readers take (buf, offset, end) -- end being the end of the innermost enclosing
# table/array -- and raise FieldTableError if a value would extend past end.

# Fixed-width numeric types: tag -> (unpack_from, size).
_FIXED: dict[int, tuple[Callable[..., tuple[Any, ...]], int]] = {
    ord(tag): (Struct(">" + fmt).unpack_from, Struct(">" + fmt).size)
    for tag, fmt in {
        "b": "b",
        "B": "B",
        "s": "h",
        "u": "H",
        "I": "i",
        "i": "I",
        "l": "q",
        "L": "q",  # RabbitMQ reads 'L' as signed too (and writes it back as 'l')
        "f": "f",
        "d": "d",
    }.items()
}

_TAG_BOOL = ord("t")
_TAG_DECIMAL = ord("D")
_TAG_LONGSTR = ord("S")
_TAG_BYTES = ord("x")
_TAG_ARRAY = ord("A")
_TAG_TIMESTAMP = ord("T")
_TAG_TABLE = ord("F")
_TAG_VOID = ord("V")


def _as_buffer(buf: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    if isinstance(buf, memoryview) and (buf.format != "B" or buf.ndim != 1):
        return buf.cast("B")
    return buf


def _truncated(what: str) -> FieldTableError:
    return FieldTableError(f"truncated field table: {what} runs past the end of its container")


def _read_length(buf: Any, offset: int, end: int, what: str) -> tuple[int, int]:
    """Read a 4-byte length prefix; return (start, stop) of the data it covers."""
    start = offset + 4
    if start > end:
        raise _truncated(f"{what} length")
    stop = start + _U32.unpack_from(buf, offset)[0]
    if stop > end:
        raise _truncated(what)
    return start, stop


def decode_table(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[dict[str, Any], int]:
    """Decode the length-prefixed table at offset; return (table, offset after it)."""
    buf = _as_buffer(buf)
    start, stop = _read_length(buf, offset, len(buf), "table")
    return _read_nested(buf, start, stop, True), stop


def decode_array(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[list[Any], int]:
    """Decode the length-prefixed field array at offset; return (list, offset after it)."""
    buf = _as_buffer(buf)
    start, stop = _read_length(buf, offset, len(buf), "array")
    return _read_nested(buf, start, stop, False), stop


def decode_value(
    buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None
) -> tuple[Any, int]:
    """Decode one tagged field value at offset; return (value, offset after it)."""
    buf = _as_buffer(buf)
    end = len(buf) if end is None else min(end, len(buf))
    if offset >= end:
        raise _truncated("value type tag")
    tag = buf[offset]
    if tag == _TAG_TABLE or tag == _TAG_ARRAY:
        start, stop = _read_length(buf, offset + 1, end, "nested table" if tag == _TAG_TABLE
                                   else "array")
        return _read_nested(buf, start, stop, tag == _TAG_TABLE), stop
    return _read_leaf(buf, tag, offset + 1, end)


def _read_nested(buf: Any, offset: int, end: int, is_table: bool) -> Any:
    """The contents of a table (is_table) or array in buf[offset:end], depth first:
    a nested one is attached to its parent at once and read next, the parent's
    (container, end, is_table) kept on the stack until it is done."""
    current: Any = {} if is_table else []  # a dict or list, as is_table says
    root = current
    stack: list[tuple[Any, int, bool]] = []
    fixed_readers = _FIXED
    while True:
        if offset >= end:  # exactly at end: every read below stays within it
            if not stack:
                return root
            current, end, is_table = stack.pop()
            continue
        if is_table:
            key_end = offset + 1 + buf[offset]
            if key_end > end:
                raise _truncated("key")
            try:
                key = str(buf[offset + 1 : key_end], "utf-8")
            except UnicodeDecodeError:
                raise FieldTableError("field table key is not valid UTF-8") from None
            if key_end >= end:
                raise _truncated("value type tag")
            offset = key_end
        tag = buf[offset]
        offset += 1
        fixed = fixed_readers.get(tag)
        if fixed is not None:  # the common cases inline: numbers and strings
            unpack_from, size = fixed
            if offset + size > end:
                raise _truncated(f"{chr(tag)!r} value")
            value = unpack_from(buf, offset)[0]
            offset += size
        elif tag == _TAG_LONGSTR:
            start, offset = _read_length(buf, offset, end, "'S' value")
            value = bytes(buf[start:offset])
            try:  # longstrs carry arbitrary bytes; text is by far the common case
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        elif tag == _TAG_TABLE or tag == _TAG_ARRAY:
            start, stop = _read_length(buf, offset, end, "nested table" if tag == _TAG_TABLE
                                       else "array")
            if len(stack) + 2 > MAX_DEPTH:
                raise _too_deep()
            value = {} if tag == _TAG_TABLE else []
            if is_table:
                current[key] = value
            else:
                current.append(value)
            stack.append((current, end, is_table))
            current, offset, end, is_table = value, start, stop, tag == _TAG_TABLE
            continue
        else:
            value, offset = _read_leaf(buf, tag, offset, end)
        if is_table:
            current[key] = value
        else:
            current.append(value)


def _read_leaf(buf: Any, tag: int, offset: int, end: int) -> tuple[Any, int]:
    """A value that is neither a table nor an array, its tag at offset - 1."""
    fixed = _FIXED.get(tag)
    if fixed is not None:
        unpack_from, size = fixed
        if offset + size > end:
            raise _truncated(f"{chr(tag)!r} value")
        return unpack_from(buf, offset)[0], offset + size
    if tag == _TAG_LONGSTR or tag == _TAG_BYTES:
        start, stop = _read_length(buf, offset, end, f"{chr(tag)!r} value")
        raw = bytes(buf[start:stop])
        if tag == _TAG_LONGSTR:
            try:
                return raw.decode("utf-8"), stop
            except UnicodeDecodeError:
                pass
        return raw, stop
    if tag == _TAG_BOOL:
        if offset + 1 > end:
            raise _truncated("'t' value")
        return buf[offset] != 0, offset + 1
    if tag == _TAG_VOID:
        return None, offset
    if tag == _TAG_TIMESTAMP:
        if offset + 8 > end:
            raise _truncated("'T' value")
        seconds = _U64.unpack_from(buf, offset)[0]
        if seconds > _DATETIME_MAX_SECONDS:
            return seconds, offset + 8
        return EPOCH + datetime.timedelta(seconds=seconds), offset + 8
    if tag == _TAG_DECIMAL:
        if offset + 5 > end:
            raise _truncated("'D' value")
        scale, mantissa = _DECIMAL.unpack_from(buf, offset)
        return decimal.Decimal(mantissa).scaleb(-scale), offset + 5
    raise FieldTableError(f"unknown field value type tag {bytes([tag])!r}")
