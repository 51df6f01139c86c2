"""The hand-written hot-path codec agrees with the generic, spec-built one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.amqp import frames, hotpath
from warren.gateway.amqp import methods as m

from ..support.twins import DELIVER_FRAMES

short = st.text(max_size=60).filter(lambda t: len(t.encode()) <= 255)


@given(short, short, st.booleans(), st.booleans())
def test_parse_publish_matches_generic_decoding(exchange, routing_key, mandatory, immediate):
    payload = m.encode_method(m.BasicPublish(exchange=exchange, routing_key=routing_key,
                                             mandatory=mandatory, immediate=immediate))
    parsed = hotpath.parse_publish(payload)
    assert (parsed.exchange, parsed.routing_key, parsed.mandatory, parsed.immediate) == \
        (exchange, routing_key, mandatory, immediate)
    assert hotpath.parse_publish(bytes(payload)) is parsed  # kept, for the next like it
    for cut in range(4, len(payload)):
        with pytest.raises(m.MalformedMethod):
            hotpath.parse_publish(payload[:cut])


@given(short, st.integers(1, 2**64 - 1), st.booleans(), short, short)
def test_deliver_payload_matches_generic_encoding(tag, delivery_tag, redelivered, exchange,
                                                  routing_key):
    expected = m.encode_method(m.BasicDeliver(consumer_tag=tag, delivery_tag=delivery_tag,
                                              redelivered=redelivered, exchange=exchange,
                                              routing_key=routing_key))
    assert hotpath.deliver_payload(hotpath.shortstr(tag), delivery_tag, redelivered, exchange,
                                   routing_key) == expected


@pytest.mark.parametrize("deliver_frames", DELIVER_FRAMES)
@given(st.integers(0, 65535), short, st.integers(1, 2**64 - 1), st.booleans(), short, short,
       st.binary(max_size=30), st.binary(max_size=600), st.sampled_from([64, 128, 4096]))
def test_deliver_frames_match_the_generic_content_frames(deliver_frames, channel, tag,
                                                         delivery_tag, redelivered, exchange,
                                                         routing_key, properties, body,
                                                         frame_max):
    expected = frames.content_frames(
        channel, m.encode_method(m.BasicDeliver(consumer_tag=tag, delivery_tag=delivery_tag,
                                                redelivered=redelivered, exchange=exchange,
                                                routing_key=routing_key)),
        60, properties, body, frame_max)
    assert deliver_frames(channel, hotpath.shortstr(tag), delivery_tag, redelivered,
                          exchange, routing_key, properties, body, frame_max) == expected


@given(st.integers(0, 2**64 - 1), st.booleans())
def test_parse_ack_matches_generic_decoding(delivery_tag, multiple):
    payload = m.encode_method(m.BasicAck(delivery_tag=delivery_tag, multiple=multiple))
    assert payload[:4] == hotpath.ACK_IDS and len(payload) == hotpath.ACK_SIZE
    assert hotpath.parse_ack(payload) == m.decode_method(payload)



@given(st.integers(0, 65535), st.integers(0, 2**64 - 1), st.booleans())
def test_ack_frame_matches_the_generic_method_frame(channel, delivery_tag, multiple):
    assert hotpath.ack_frame(channel, delivery_tag, multiple) == frames.method_frame(
        channel, m.BasicAck(delivery_tag=delivery_tag, multiple=multiple))
