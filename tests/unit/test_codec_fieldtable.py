"""gateway.amqp.fieldtable: RabbitMQ's field-table dialect."""

import struct
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from warren.gateway.amqp.fieldtable import (
    MAX_DEPTH,
    FieldTableError,
    decode_array,
    decode_table,
    decode_value,
    encode_array,
    encode_table,
    encode_value,
)

UTC = timezone.utc

# --- strategies ------------------------------------------------------------------

keys = st.text(max_size=20)
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=0))
LAST_DATETIME_SECOND = 253402300799  # 9999-12-31 23:59:59
decimals = st.builds(
    lambda mantissa, scale: Decimal(mantissa).scaleb(-scale),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
)
leaf_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),  # past 2**63 - 1 as timestamps
    st.floats(allow_nan=False),
    decimals,
    st.text(max_size=40),
    st.binary(max_size=40),
    timestamps,
    st.none(),
)
field_values = st.recursive(
    leaf_values,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=20,
)
field_tables = st.dictionaries(keys, field_values, max_size=8)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def table_with(value_bytes: bytes, key: bytes = b"k") -> bytes:
    """A one-entry table whose value is the given tagged bytes."""
    body = bytes([len(key)]) + key + value_bytes
    return struct.pack(">I", len(body)) + body


# --- decoding hand-built bytes ----------------------------------------------------


@pytest.mark.parametrize(
    "value_bytes, expected",
    [
        (b"t\x01", True),
        (b"t\x00", False),
        (b"b\xff", -1),
        (b"b\x7f", 127),
        (b"B\xff", 255),
        (b"s\xff\xfe", -2),
        (b"u\xff\xfe", 65534),
        (b"I" + struct.pack(">i", -(2**31)), -(2**31)),
        (b"i\xff\xff\xff\xff", 2**32 - 1),
        (b"l" + struct.pack(">q", -(2**63)), -(2**63)),
        (b"L" + struct.pack(">q", -1), -1),  # RabbitMQ reads 'L' as signed, as 'l'
        (b"L" + struct.pack(">q", 2**63 - 1), 2**63 - 1),
        (b"f" + struct.pack(">f", 1.5), 1.5),
        (b"d" + struct.pack(">d", -0.25), -0.25),
        (b"D\x02" + struct.pack(">i", -12345), Decimal("-123.45")),
        (b"D\x00" + struct.pack(">i", 7), Decimal(7)),
        (b"S\x00\x00\x00\x06h\xc3\xa9llo", "héllo"),
        (b"S\x00\x00\x00\x00", ""),
        (b"S\x00\x00\x00\x02\xff\xfe", b"\xff\xfe"),  # not UTF-8: stays bytes
        (b"x\x00\x00\x00\x03abc", b"abc"),  # byte array: bytes even when valid text
        (b"A\x00\x00\x00\x05b\x01Vt\x01", [1, None, True]),
        (b"T" + struct.pack(">Q", 1_700_000_000), datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        (b"T\x00\x00\x00\x00\x00\x00\x00\x00", datetime(1970, 1, 1, tzinfo=UTC)),
        (b"T" + struct.pack(">Q", LAST_DATETIME_SECOND), datetime(9999, 12, 31, 23, 59, 59,
                                                                  tzinfo=UTC)),
        # Milliseconds sent as seconds (issue 56.9): RabbitMQ takes any uint64.
        (b"T" + struct.pack(">Q", 1_764_355_200_000), 1_764_355_200_000),
        (b"T" + struct.pack(">Q", 2**64 - 1), 2**64 - 1),
        (b"F" + table_with(b"V", b"n"), {"n": None}),
        (b"F\x00\x00\x00\x00", {}),
        (b"V", None),
    ],
)
def test_decode_each_type_tag(value_bytes, expected):
    table, offset = decode_table(table_with(value_bytes))
    assert table == {"k": expected}
    assert type(table["k"]) is type(expected)
    assert offset == len(table_with(value_bytes))


def test_timestamp_decodes_as_aware_utc():
    table, _ = decode_table(table_with(b"T" + struct.pack(">Q", 86400)))
    assert table["k"].tzinfo is not None
    assert table["k"].utcoffset() == timedelta(0)
    assert table["k"] == datetime(1970, 1, 2, tzinfo=UTC)


def test_decode_empty_and_none():
    assert decode_table(b"\x00\x00\x00\x00") == ({}, 4)
    assert encode_table(None) == b"\x00\x00\x00\x00"
    assert encode_table({}) == b"\x00\x00\x00\x00"


def test_decode_at_offset_in_memoryview():
    encoded = encode_table({"a": "b", "n": [1, 2]})
    buffer = memoryview(b"junk" + encoded + b"trailer")
    table, offset = decode_table(buffer, 4)
    assert table == {"a": "b", "n": [1, 2]}
    assert offset == 4 + len(encoded)
    assert isinstance(table["a"], str)


def test_decode_value_and_array_helpers():
    assert decode_value(b"xxI\x00\x00\x00\x05", 2) == (5, 7)
    assert decode_array(encode_array([1, "a", None])) == ([1, "a", None], 4 + 5 + 6 + 1)
    assert decode_array(bytearray(encode_array(()))) == ([], 4)


# --- encoding choices -------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, b"t\x01"),
        (False, b"t\x00"),
        (0, b"I\x00\x00\x00\x00"),
        (2**31 - 1, b"I" + struct.pack(">i", 2**31 - 1)),
        (-(2**31), b"I" + struct.pack(">i", -(2**31))),
        (2**31, b"l" + struct.pack(">q", 2**31)),
        (-(2**31) - 1, b"l" + struct.pack(">q", -(2**31) - 1)),
        (2**63 - 1, b"l" + struct.pack(">q", 2**63 - 1)),
        (1.5, b"d" + struct.pack(">d", 1.5)),
        (Decimal("1.50"), b"D\x02" + struct.pack(">i", 150)),
        (Decimal("-7"), b"D\x00" + struct.pack(">i", -7)),
        (Decimal("1E+3"), b"D\x00" + struct.pack(">i", 1000)),
        ("hé", b"S\x00\x00\x00\x03h\xc3\xa9"),
        (b"\x00\x01", b"x\x00\x00\x00\x02\x00\x01"),
        (bytearray(b"z"), b"x\x00\x00\x00\x01z"),
        (memoryview(b"zz"), b"x\x00\x00\x00\x02zz"),
        ([1, None], b"A\x00\x00\x00\x06I\x00\x00\x00\x01V"),
        ((), b"A\x00\x00\x00\x00"),
        (datetime(1970, 1, 1, 0, 1, tzinfo=UTC), b"T" + struct.pack(">Q", 60)),
        (datetime(1970, 1, 1, 0, 1), b"T" + struct.pack(">Q", 60)),  # naive = UTC
        (datetime(1970, 1, 1, 2, 1, tzinfo=timezone(timedelta(hours=2))), b"T" + struct.pack(">Q", 60)),
        (2**63, b"T" + struct.pack(">Q", 2**63)),  # only a timestamp holds it
        (2**64 - 1, b"T" + struct.pack(">Q", 2**64 - 1)),
        ({"a": None}, b"F\x00\x00\x00\x03\x01aV"),
        (None, b"V"),
    ],
)
def test_encode_choices(value, expected):
    assert encode_value(value) == expected


def test_table_keeps_insertion_order():
    assert encode_table({"b": None, "a": None}) == b"\x00\x00\x00\x06\x01bV\x01aV"


@pytest.mark.parametrize(
    "table",
    [
        {"k": 2**64},
        {"k": -(2**63) - 1},
        {"k": object()},
        {"k": {1, 2}},
        {"k": Decimal("NaN")},
        {"k": Decimal("Infinity")},
        {"k": Decimal(2**31)},  # mantissa too large
        {"k": Decimal("1E-256")},  # scale too large
        {"k": datetime(1969, 12, 31, tzinfo=UTC)},
        {"k": "\ud800"},  # lone surrogate: not UTF-8 encodable
        {"x" * 256: 1},
        {"é" * 128: 1},  # 256 UTF-8 bytes
        {1: "int key"},
        {"k": [object()]},
        {"k": {"nested": object()}},
    ],
)
def test_encode_rejects(table):
    with pytest.raises(FieldTableError):
        encode_table(table)


def test_encode_rejects_non_dict_table():
    with pytest.raises(FieldTableError):
        encode_table([("a", 1)])


# --- nesting ------------------------------------------------------------------------
# Tables and arrays nest up to MAX_DEPTH (the outermost counting as 1), walked
# with an explicit stack: issue 56.6 found a 541 and a 3,000-line traceback for
# client properties 2,000 deep, and refusals from 300 deep, under RabbitMQ's 500+.


def _nest(kinds: str, leaf: bytes) -> bytes:
    body = leaf
    for depth in range(len(kinds) - 1, 0, -1):
        value = kinds[depth].encode() + struct.pack(">I", len(body)) + body
        body = (b"\x01k" + value) if kinds[depth - 1] == "F" else value
    return struct.pack(">I", len(body)) + body


def nested_value(kinds: str, leaf) -> object:
    value = leaf
    for depth in range(len(kinds) - 1, 0, -1):
        value = {"k": value} if kinds[depth - 1] == "F" else [value]
    return value


def test_max_depth_is_more_than_rabbitmq_users_nest():
    assert MAX_DEPTH >= 500  # the figure for what RabbitMQ accepts


@pytest.mark.parametrize("kinds", ["F" * MAX_DEPTH, "A" * MAX_DEPTH, "FA" * (MAX_DEPTH // 2)])
def test_nesting_to_the_bound_decodes_and_encodes(kinds):
    raw = _nest(kinds, b"\x01kI\x00\x00\x00\x07" if kinds[-1] == "F" else b"I\x00\x00\x00\x07")
    expected = nested_value(kinds, {"k": 7} if kinds[-1] == "F" else [7])
    decode = decode_table if kinds[0] == "F" else decode_array
    encode = encode_table if kinds[0] == "F" else encode_array
    assert decode(raw) == (expected, len(raw))
    assert encode(expected) == raw
    assert decode_value(kinds[0].encode() + raw) == (expected, len(raw) + 1)


@pytest.mark.parametrize("kinds", ["F" * (MAX_DEPTH + 1), "A" * (MAX_DEPTH + 1),
                                   "F" * 20_000, "AF" * 10_000])
def test_nesting_past_the_bound_is_a_field_table_error(kinds):
    raw = _nest(kinds, b"")
    decode = decode_table if kinds[0] == "F" else decode_array
    with pytest.raises(FieldTableError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode(raw)
    with pytest.raises(FieldTableError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode_value(kinds[0].encode() + raw)
    value = nested_value(kinds, {} if kinds[-1] == "F" else [])
    encode = encode_table if kinds[0] == "F" else encode_array
    with pytest.raises(FieldTableError, match=f"nested deeper than {MAX_DEPTH} levels"):
        encode(value)


@given(st.text("FA", min_size=1, max_size=MAX_DEPTH + 40), st.sampled_from([b"", b"V"]))
@settings(max_examples=40, deadline=None)
def test_any_nesting_decodes_within_the_bound_or_is_refused(kinds, leaf):
    leaf = (b"\x01k" + leaf if kinds[-1] == "F" else leaf) if leaf else b""
    raw = _nest(kinds, leaf)
    decode = decode_table if kinds[0] == "F" else decode_array
    if len(kinds) > MAX_DEPTH:
        with pytest.raises(FieldTableError):
            decode(raw)
        return
    value, offset = decode(raw)
    assert offset == len(raw)
    assert (encode_table if kinds[0] == "F" else encode_array)(value) == raw


def test_longest_key():
    table = {"k" * 255: 1}
    assert decode_table(encode_table(table))[0] == table


# --- malformed input --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x00\x00",
        b"\x00\x00\x00\x05\x01a",  # length past the end
        table_with(b"Z"),  # unknown tag
        table_with(b"\x00"),  # pamqp accepts this as void; RabbitMQ does not
        table_with(b"V", key=b"\xff"),  # key not UTF-8
        b"\x00\x00\x00\x01\x05",  # key length past the table's end
        b"\x00\x00\x00\x02\x01a" + b"V",  # value lies outside the declared table length
        table_with(b"F\x00\x00\x00\x09\x01aV"),  # nested table longer than its parent
        table_with(b"A\x00\x00\x00\x01"),  # array longer than its parent
        table_with(b"S\xff\xff\xff\xff"),
    ],
)
def test_decode_rejects(raw):
    with pytest.raises(FieldTableError):
        decode_table(raw)


@given(field_tables)
@FUZZ
def test_truncation_raises_field_table_error(table):
    encoded = encode_table(table)
    for cut in range(len(encoded)):
        with pytest.raises(FieldTableError):
            decode_table(encoded[:cut])
    # Cut the body and fix up the outer length, so the cut lands inside a
    # value (-> FieldTableError) or exactly between entries (-> a prefix of the table).
    body = encoded[4:]
    for cut in range(len(body)):
        raw = struct.pack(">I", cut) + body[:cut]
        try:
            decoded, offset = decode_table(raw)
        except FieldTableError:
            continue
        assert offset == len(raw)
        assert list(decoded) == list(table)[: len(decoded)]


@given(st.binary(max_size=64))
@FUZZ
def test_random_bytes_decode_or_raise_field_table_error(raw):
    for candidate in (raw, struct.pack(">I", len(raw)) + raw):
        try:
            decode_table(candidate)
        except FieldTableError:
            pass


@given(field_tables.filter(bool), st.data())
@FUZZ
def test_corrupted_bytes_decode_or_raise_field_table_error(table, data):
    encoded = bytearray(encode_table(table))
    for _ in range(3):
        position = data.draw(st.integers(0, len(encoded) - 1))
        encoded[position] = data.draw(st.integers(0, 255))
        try:
            decode_table(encoded)
        except FieldTableError:
            pass


# --- round trips ------------------------------------------------------------------


@given(field_tables)
@FUZZ
def test_round_trip(table):
    encoded = encode_table(table)
    decoded, offset = decode_table(encoded)
    assert decoded == table
    assert offset == len(encoded)
    assert decode_table(memoryview(encoded))[0] == table


@given(st.lists(field_values, max_size=8))
@FUZZ
def test_array_round_trip(array):
    assert decode_array(encode_array(array)) == (array, len(encode_array(array)))


def test_round_trip_everything_nested():
    table = {
        "bool": True,
        "int": -5,
        "big": 2**40,
        "float": 0.1,
        "decimal": Decimal("3.14159"),
        "str": "héllo",
        "bytes": b"\x00\xff",
        "void": None,
        "time": datetime(2024, 2, 29, 12, 0, tzinfo=UTC),
        "array": [1, "two", [3.0, None], {"four": Decimal(4)}],
        "table": {"inner": {"deeper": [b"", {}, []]}},
    }
    assert decode_table(encode_table(table))[0] == table


# --- against pamqp ----------------------------------------------------------------

# Values whose encoding pamqp chooses the same way (pamqp picks the smallest
# integer type, float32 for floats, and sorts keys -- so avoid those here).
agreeing_leaves = st.one_of(
    st.booleans(),
    decimals,
    st.text(max_size=30),
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=0)),
    st.none(),
)
agreeing_values = st.recursive(
    agreeing_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4).map(lambda d: dict(sorted(d.items()))),
    ),
    max_leaves=12,
)
agreeing_tables = st.dictionaries(keys, agreeing_values, max_size=6).map(lambda d: dict(sorted(d.items())))


@given(agreeing_tables)
@FUZZ
def test_encoding_matches_pamqp(table):
    ours = encode_table(table)
    assert ours == pamqp_encode.field_table(table)
    assert pamqp_decode.field_table(ours) == (len(ours), table)


pamqp_leaves = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0.5, -2.0, 1e10]),  # exactly representable as float32
    decimals,
    st.text(max_size=30),
    st.binary(max_size=30).map(bytearray),
    st.none(),
)
pamqp_values = st.recursive(
    pamqp_leaves,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
    max_leaves=12,
)


@given(st.dictionaries(keys, pamqp_values, max_size=6))
@FUZZ
def test_decodes_pamqp_encoding(table):
    # pamqp uses b/s/u/I/i/l for integers, 'f' for floats and 'x' for bytearrays.
    encoded = pamqp_encode.field_table(table)
    assert decode_table(encoded) == (table, len(encoded))
