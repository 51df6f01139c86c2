"""Hand-written codec for the methods on the message hot path.

basic.publish and basic.ack are parsed, and basic.deliver / basic.get-ok and a
publisher confirm's basic.ack built, with `struct` directly instead of through
the generic method classes: profiles of the gateway
showed generic decoding as the largest single cost per published message. Ids
still come from the spec, and the tests check these against the generic codec.
"""

from __future__ import annotations

import struct

from warren.shards import build

from . import methods as m
from .frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    content_frames,
)
from .spec import CLASS_IDS, method_id

PUBLISH_IDS = struct.pack(">HH", *method_id("basic.publish"))
ACK_IDS = struct.pack(">HH", *method_id("basic.ack"))
ACK_SIZE = 13  # ids, delivery-tag (longlong), multiple (a bit in one octet)
_ack_arguments = struct.Struct(">QB")
_ack_frame = struct.Struct(">BHI4sQBB")  # frame type, channel, size, ACK_IDS, tag, bits, end
DELIVER_IDS = struct.pack(">HH", *method_id("basic.deliver"))
_u64 = struct.Struct(">Q")
_BASIC_CLASS = CLASS_IDS["basic"]
_FRAME_END_BYTE = bytes((FRAME_END,))
# The fixed pieces of a delivery's three frames, each after a variable part:
_method_prefix = struct.Struct(">BHI")  # frame type, channel, size
_tag_redelivered = struct.Struct(">QB")
_header_frame = struct.Struct(">BBHIHHQ")  # method frame end, header frame prefix, fields
_body_prefix = struct.Struct(">BBHI")  # header frame end, body frame prefix


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


_publish_cache: dict[bytes, Publish] = {}


def parse_publish(payload: bytes) -> Publish:
    """A publisher mostly repeats one exchange and routing key, so parsed publishes
    are kept by payload (a bounded cache; a Publish is never changed)."""
    method = _publish_cache.get(payload)
    if method is None:
        method = _parse_publish(payload)
        if len(_publish_cache) >= 4096:
            _publish_cache.clear()
        _publish_cache[payload] = method
    return method


def _parse_publish(payload: bytes) -> Publish:
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


# basic.ack's arguments, from a payload checked as parse_ack's: (delivery tag, bits).
ack_arguments = _ack_arguments.unpack_from  # (payload, 4)


def parse_ack(payload: bytes) -> m.BasicAck:
    """basic.ack from a payload of exactly ACK_SIZE bytes with ACK_IDS (the caller
    checks); the generic class, as every other method handler expects."""
    ack = _new(m.BasicAck)
    ack.delivery_tag, bits = _ack_arguments.unpack_from(payload, 4)
    ack.multiple = bool(bits & 1)
    return ack


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A whole basic.ack method frame: a publisher confirm, on every commit."""
    return _ack_frame.pack(FRAME_METHOD, channel, ACK_SIZE, ACK_IDS, delivery_tag, multiple,
                           FRAME_END)


_new = object.__new__


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


def deliver_frames(channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool,
                   exchange: str, routing_key: str, properties: bytes, body: bytes,
                   frame_max: int) -> bytes:
    """basic.deliver with its content header and body, ready to send: what
    frames.content_frames(deliver_payload(...)) builds, in one join of a few packed
    pieces when the body fits one frame (`consumer_tag` a shortstr, as above)."""
    size = len(body)
    if not size or size > frame_max - FRAME_OVERHEAD:
        return content_frames(channel, deliver_payload(consumer_tag, delivery_tag, redelivered,
                                                       exchange, routing_key),
                              _BASIC_CLASS, properties, body, frame_max)
    route = _route_shortstrs(exchange, routing_key)
    return b"".join((
        _method_prefix.pack(FRAME_METHOD, channel, 13 + len(consumer_tag) + len(route)),
        DELIVER_IDS, consumer_tag, _tag_redelivered.pack(delivery_tag, redelivered), route,
        _header_frame.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(properties), _BASIC_CLASS,
                           0, size),
        properties, _body_prefix.pack(FRAME_END, FRAME_BODY, channel, size), body,
        _FRAME_END_BYTE))


pure_deliver_frames = deliver_frames
deliver_frames = build.twin(deliver_frames, "warren.gateway.amqp._hotpath", "deliver_frames")
