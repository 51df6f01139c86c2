"""Hand-written codec for the three methods on the message hot path.

basic.publish is parsed and basic.deliver / basic.get-ok built with `struct`
directly instead of through the generic method classes: profiles of the gateway
showed generic decoding as the largest single cost per published message. Ids
still come from the spec, and the tests check these against the generic codec.
"""

from __future__ import annotations

import struct

from . import methods as m
from .spec import method_id

PUBLISH_IDS = struct.pack(">HH", *method_id("basic.publish"))
DELIVER_IDS = struct.pack(">HH", *method_id("basic.deliver"))
_u64 = struct.Struct(">Q")


class Publish:
    """What the broker needs of a basic.publish (the generic class's field names)."""

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate")
    CLASS_ID, METHOD_ID = method_id("basic.publish")
    HAS_CONTENT = True
    NAME = "basic.publish"

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool):
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate


def parse_publish(payload: bytes) -> Publish:
    """Arguments: ticket (short), exchange (shortstr), routing-key (shortstr), then
    mandatory and immediate packed in one octet. Raises m.MalformedMethod."""
    try:
        end = 7 + payload[6]
        exchange = payload[7:end].decode()
        key_end = end + 1 + payload[end]
        routing_key = payload[end + 1:key_end].decode()
        bits = payload[key_end]
    except (IndexError, UnicodeDecodeError) as error:
        raise m.MalformedMethod(f"basic.publish: {error}") from None
    if len(payload) != key_end + 1:
        raise m.MalformedMethod("basic.publish: trailing bytes")
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))


def shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


_route_cache: dict[tuple[str, str], bytes] = {}


def _route_shortstrs(exchange: str, routing_key: str) -> bytes:
    """exchange and routing key as two shortstrs; a queue's deliveries mostly share
    them, so they are encoded once (a bounded cache)."""
    key = (exchange, routing_key)
    encoded = _route_cache.get(key)
    if encoded is None:
        if len(_route_cache) >= 4096:
            _route_cache.clear()
        encoded = _route_cache[key] = shortstr(exchange) + shortstr(routing_key)
    return encoded


def deliver_payload(consumer_tag: bytes, delivery_tag: int, redelivered: bool,
                    exchange: str, routing_key: str) -> bytes:
    """basic.deliver arguments; `consumer_tag` is already a shortstr (cached per consumer)."""
    return b"".join((DELIVER_IDS, consumer_tag, _u64.pack(delivery_tag),
                     b"\x01" if redelivered else b"\x00",
                     _route_shortstrs(exchange, routing_key)))
