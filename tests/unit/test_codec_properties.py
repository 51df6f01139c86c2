"""gateway.amqp.properties: basic content properties, and peeking into raw ones."""

import struct
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as pamqp_commands
from pamqp import header as pamqp_header

from warren.gateway.amqp.properties import (
    EMPTY_PROPERTIES,
    BasicProperties,
    PropertiesError,
    decode_properties,
    encode_properties,
    peek_delivery_mode,
    peek_expiration,
    peek_priority,
)
from warren.gateway.amqp.spec import BASIC_PROPERTIES

UTC = timezone.utc
PEEKS = {"delivery_mode": peek_delivery_mode, "priority": peek_priority, "expiration": peek_expiration}

# --- strategies ------------------------------------------------------------------

keys = st.text(max_size=12)
header_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.builds(lambda m, s: Decimal(m).scaleb(-s), st.integers(-(2**31), 2**31 - 1), st.integers(0, 255)),
        st.text(max_size=20),
        st.binary(max_size=20),
        st.datetimes(min_value=datetime(1970, 1, 1), timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=0)),
        st.none(),
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=3)),
    max_leaves=8,
)
PROPERTY_VALUES = {
    "shortstr": st.text(max_size=63),
    "octet": st.integers(0, 255),
    "timestamp": st.integers(0, 2**64 - 1),
    "table": st.dictionaries(keys, header_values, max_size=4),
}
properties = st.builds(
    BasicProperties,
    **{p.py_name: st.none() | PROPERTY_VALUES[p.type] for p in BASIC_PROPERTIES},
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shortstr(text):
    raw = text.encode()
    return bytes([len(raw)]) + raw


# --- the class --------------------------------------------------------------------


def test_fields_come_from_the_spec():
    assert BasicProperties.__slots__ == tuple(p.py_name for p in BASIC_PROPERTIES)
    assert len(BasicProperties.__slots__) == 14
    assert tuple(BasicProperties.__annotations__) == BasicProperties.FIELDS  # as typed


def test_defaults_eq_repr():
    props = BasicProperties()
    assert all(getattr(props, name) is None for name in BasicProperties.__slots__)
    assert props == BasicProperties()
    assert BasicProperties(delivery_mode=2) != BasicProperties(delivery_mode=1)
    assert BasicProperties() != object()
    assert repr(BasicProperties(content_type="text/plain", delivery_mode=2)) == (
        "BasicProperties(content_type='text/plain', delivery_mode=2)"
    )
    with pytest.raises(TypeError):
        BasicProperties(deliverymode=2)


# --- encoding, byte by byte -------------------------------------------------------


@pytest.mark.parametrize(
    "props, raw",
    [
        (BasicProperties(), b"\x00\x00"),
        (BasicProperties(delivery_mode=2), b"\x10\x00\x02"),
        (BasicProperties(content_type="", priority=9), b"\x88\x00\x00\x09"),  # '' is present, unlike None
        (
            BasicProperties(content_type="application/json", headers={"a": "b"}, delivery_mode=1, expiration="60000"),
            b"\xb1\x00"
            + shortstr("application/json")
            + b"\x00\x00\x00\x08\x01aS\x00\x00\x00\x01b"
            + b"\x01"
            + shortstr("60000"),
        ),
        (BasicProperties(timestamp=1_700_000_000, type="t"), b"\x00\x60" + struct.pack(">Q", 1_700_000_000) + b"\x01t"),
        (BasicProperties(cluster_id="c"), b"\x00\x04\x01c"),
    ],
)
def test_encode_bytes(props, raw):
    assert encode_properties(props) == raw
    assert decode_properties(raw) == props


def test_empty_properties_constant():
    assert EMPTY_PROPERTIES == encode_properties(BasicProperties())


@pytest.mark.parametrize(
    "props",
    [
        BasicProperties(delivery_mode=256),
        BasicProperties(priority=-1),
        BasicProperties(timestamp=datetime(2024, 1, 1)),  # timestamps are integer seconds
        BasicProperties(content_type="x" * 256),
        BasicProperties(message_id=5),
        BasicProperties(headers={"bad": object()}),
        BasicProperties(headers=["not", "a", "table"]),
    ],
)
def test_encode_rejects(props):
    with pytest.raises(PropertiesError):
        encode_properties(props)


# --- decoding ---------------------------------------------------------------------


def test_continuation_flag_words():
    # A first word with the continuation bit, then an empty second word.
    raw = b"\x10\x01\x00\x00\x02"
    assert decode_properties(raw) == BasicProperties(delivery_mode=2)
    assert peek_delivery_mode(raw) == 2
    assert peek_priority(raw) is None
    assert decode_properties(b"\x00\x01\x00\x01\x00\x00") == BasicProperties()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x10",
        b"\x10\x00",  # delivery-mode flagged but missing
        b"\x10\x01",  # continuation word missing
        b"\x00\x02",  # flag bit 1: no 15th property
        b"\x00\x01\x80\x00\x00",  # a second word flags properties the spec lacks
        b"\x80\x00\x05ab",  # shortstr past the end
        b"\x80\x00\x02\xff\xfe",  # shortstr not UTF-8
        b"\x20\x00\x00\x00\x00\x03\x01aZ",  # headers table with an unknown tag
        b"\x20\x00\x00\x00\x00\x09\x01aV",  # headers table past the end
        b"\x10\x00\x02\x00",  # trailing byte
    ],
)
def test_decode_rejects(raw):
    with pytest.raises(PropertiesError):
        decode_properties(raw)
    with pytest.raises(PropertiesError):
        decode_properties(memoryview(raw))


def test_peek_skips_headers_and_shortstrs():
    props = BasicProperties(
        content_type="text/plain",
        content_encoding="gzip",
        headers={"x-death": [{"count": 1, "queue": "q"}], "blob": b"\x10\x00\x02"},
        delivery_mode=2,
        priority=7,
        correlation_id="c",
        reply_to="r",
        expiration="1000",
    )
    raw = encode_properties(props)
    assert peek_delivery_mode(raw) == 2
    assert peek_priority(raw) == 7
    assert peek_expiration(raw) == "1000"
    assert peek_expiration(memoryview(raw)) == "1000"
    assert peek_delivery_mode(EMPTY_PROPERTIES) is None
    assert peek_expiration(encode_properties(BasicProperties(delivery_mode=1))) is None


@pytest.mark.parametrize("raw", [b"", b"\x10", b"\x10\x00", b"\x90\x00\x05ab", b"\x30\x00\x00\x00\x00\x09"])
def test_peek_rejects_truncation(raw):
    with pytest.raises(PropertiesError):
        peek_delivery_mode(raw)


# --- property-based ---------------------------------------------------------------


@given(properties)
@FUZZ
def test_round_trip_and_peeks_agree(props):
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(raw)) == props
    for name, peek in PEEKS.items():
        assert peek(raw) == getattr(props, name)


@given(properties)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_truncations_raise_properties_error(props):
    raw = encode_properties(props)
    for cut in range(len(raw)):
        with pytest.raises(PropertiesError):
            decode_properties(raw[:cut])
        for name, peek in PEEKS.items():
            # A peek only reads up to its property: it returns the right value or raises.
            try:
                value = peek(raw[:cut])
            except PropertiesError:
                continue
            assert value == getattr(props, name)


@given(st.binary(max_size=48))
@FUZZ
def test_random_bytes_decode_or_raise_properties_error(raw):
    for attempt in (decode_properties, *PEEKS.values()):
        try:
            attempt(raw)
        except PropertiesError:
            pass


# --- against pamqp ----------------------------------------------------------------


def pamqp_properties(props):
    """The pamqp equivalent of ours: pamqp names 'type' message_type, wants a
    datetime timestamp and an empty-string cluster-id (it leaves '' out)."""
    values = {p.py_name: getattr(props, p.py_name) for p in BASIC_PROPERTIES}
    values["message_type"] = values.pop("type")
    if values["timestamp"] is not None:
        values["timestamp"] = datetime.fromtimestamp(values["timestamp"], UTC)
    assert values["cluster_id"] is None
    values["cluster_id"] = ""
    return pamqp_commands.Basic.Properties(**values)


def pamqp_decode(raw):
    """Our properties decoded by pamqp, in the shape pamqp_properties() builds."""
    content_header = pamqp_header.ContentHeader()
    content_header.unmarshal(struct.pack(">HHQ", 60, 0, 0) + raw)
    decoded = content_header.properties
    if decoded.cluster_id is None:
        decoded.cluster_id = ""
    return decoded


def test_against_pamqp_with_headers():
    props = BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        # pamqp sorts header keys; keep them sorted so the bytes can match.
        headers={"nested": {"flag": True, "list": ["a", None]}, "price": Decimal("9.99"), "x-retry": "yes"},
        delivery_mode=2,
        priority=5,
        correlation_id="corr-1",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id="m-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="guest",
        app_id="shop",
    )
    theirs = pamqp_properties(props)
    assert encode_properties(props) == theirs.marshal()
    assert decode_properties(theirs.marshal()) == props
    assert pamqp_decode(encode_properties(props)) == theirs


def test_decodes_pamqp_integer_headers():
    # pamqp picks the smallest integer type for each header value.
    headers = {"a": -1, "b": 300, "c": 40000, "d": -(2**31), "e": 2**32 - 1, "f": 2**40}
    theirs = pamqp_commands.Basic.Properties(headers=headers, delivery_mode=1)
    assert decode_properties(theirs.marshal()) == BasicProperties(headers=headers, delivery_mode=1)
    assert peek_delivery_mode(theirs.marshal()) == 1


# pamqp leaves out empty strings and requires an empty cluster-id and delivery-mode 1 or 2.
pamqp_agreeing = st.builds(
    BasicProperties,
    **{
        p.py_name: st.none()
        | {
            "shortstr": st.text(min_size=1, max_size=40),
            "octet": st.integers(0, 255),
            "timestamp": st.integers(0, 2**32 - 1),
            "table": st.dictionaries(keys, st.text(max_size=10) | st.booleans() | st.none(), max_size=4).map(
                lambda d: dict(sorted(d.items()))
            ),
        }[p.type]
        for p in BASIC_PROPERTIES
        if p.py_name not in ("cluster_id", "delivery_mode")
    },
    delivery_mode=st.none() | st.sampled_from([1, 2]),
)


@given(pamqp_agreeing)
@FUZZ
def test_matches_pamqp(props):
    theirs = pamqp_properties(props)
    ours = encode_properties(props)
    assert ours == theirs.marshal()
    assert pamqp_decode(ours) == theirs
