"""A channel's command assembly driven in-process: commands come out whole however
the body is cut, and frames out of order get RabbitMQ's errors at once."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.amqp import frames, hotpath, spec
from warren.gateway.amqp import methods as m
from warren.gateway.errors import AMQPError
from warren.gateway.session.assembly import Assembler

PUBLISH = m.encode_method(m.BasicPublish(exchange="x", routing_key="k"))


def header(size: int, properties: bytes = b"\x00\x00", class_id: int = 60,
           weight: int = 0) -> bytes:
    return struct.pack(">HHQ", class_id, weight, size) + properties


@given(st.binary(max_size=2000), st.lists(st.integers(1, 300), max_size=20),
       st.binary(max_size=20))
def test_a_publish_comes_out_whole_however_its_body_is_cut(body, cuts, properties):
    assembler = Assembler(max_size=1 << 20)
    properties = b"\x00\x00" + properties
    assert assembler.feed(frames.FRAME_METHOD, PUBLISH) is None
    pieces, start = [], 0
    for cut in cuts:
        if start < len(body):
            pieces.append(body[start:start + cut])
            start += cut
    if start < len(body):
        pieces.append(body[start:])
    got = assembler.feed(frames.FRAME_HEADER, header(len(body), properties))
    for piece in pieces:
        assert got is None
        got = assembler.feed(frames.FRAME_BODY, piece)
    method, props, content = got
    assert type(method) is hotpath.Publish and method.routing_key == "k"
    assert (props, content) == (properties, body)
    # and the next command starts afresh
    assert assembler.feed(frames.FRAME_METHOD, m.encode_method(m.BasicQos()))[1] is None


def test_a_method_without_content_is_a_command_at_once():
    method, properties, body = Assembler(100).feed(
        frames.FRAME_METHOD, m.encode_method(m.QueueDeclare(queue="q")))
    assert method == m.QueueDeclare(queue="q") and properties is None


def error_of(*feeds) -> AMQPError:
    assembler = Assembler(max_size=100)
    with pytest.raises(AMQPError) as raised:
        for frame_type, payload in feeds:
            assembler.feed(frame_type, payload)
    return raised.value


@pytest.mark.parametrize("feeds, code, text", [
    ([(frames.FRAME_BODY, b"x")], spec.UNEXPECTED_FRAME,
     "expected method frame, got non method frame instead"),
    ([(frames.FRAME_HEADER, header(1))], spec.UNEXPECTED_FRAME,
     "expected method frame, got non method frame instead"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_METHOD, PUBLISH)], spec.UNEXPECTED_FRAME,
     "expected content header for class 60, got non content header frame instead"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_BODY, b"x")], spec.UNEXPECTED_FRAME,
     "expected content header for class 60, got non content header frame instead"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_HEADER, header(5)),
      (frames.FRAME_METHOD, PUBLISH)], spec.UNEXPECTED_FRAME,
     "expected content body, got non content body frame instead"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_HEADER, header(5)),
      (frames.FRAME_HEADER, header(5))], spec.UNEXPECTED_FRAME,
     "expected content body, got non content body frame instead"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_HEADER, header(2)),
      (frames.FRAME_BODY, b"abc")], spec.FRAME_ERROR,
     "content body larger than its header announced"),
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_HEADER, header(1, class_id=50))],
     spec.UNEXPECTED_FRAME, "expected content header for class 60, got one for class 50 instead"),
    # the weight must be 0: RabbitMQ (rabbit_command_assembler) takes it for no header
    ([(frames.FRAME_METHOD, PUBLISH), (frames.FRAME_HEADER, header(1, weight=256))],
     spec.UNEXPECTED_FRAME,
     "expected content header for class 60, got non content header frame instead"),
    ([(frames.FRAME_METHOD, b"\x00\x32\x00\x0a\x00")], spec.FRAME_ERROR, "cannot decode <<0>>"),
    ([(frames.FRAME_METHOD, b"\x03\xe7\x00\x01")], spec.COMMAND_INVALID,
     "unknown method class 999 method 1"),
    ([(frames.FRAME_METHOD, m.encode_method(m.BasicReturn()))], spec.COMMAND_INVALID,
     "unexpected method basic.return"),
])
def test_frames_out_of_order_are_errors_on_arrival(feeds, code, text):
    error = error_of(*feeds)
    assert error.code == code and error.text.endswith(text), error.text


def test_a_publish_over_the_size_limit_is_refused_in_its_turn_and_its_body_dropped():
    assembler = Assembler(max_size=4)
    assembler.feed(frames.FRAME_METHOD, PUBLISH)
    assert assembler.feed(frames.FRAME_HEADER, header(6)) is None
    assert assembler.feed(frames.FRAME_BODY, b"abc") is None
    assert assembler._content == b""  # counted, never kept
    refusal, _, _ = assembler.feed(frames.FRAME_BODY, b"def")
    assert type(refusal) is AMQPError and refusal.code == spec.PRECONDITION_FAILED
    assert refusal.text.endswith("message size 6 is larger than configured max size 4")


@given(st.binary(max_size=40), st.binary(max_size=10), st.integers(0, 40))
def test_a_publish_taken_whole_is_the_command_its_frames_make(body, properties, max_size):
    """Assembler.whole_publish (a publish read in one pass) agrees with feeding its
    frames one by one, the size limit's refusal included."""
    properties = b"\x00\x00" + properties
    fed = Assembler(max_size)
    fed.feed(frames.FRAME_METHOD, PUBLISH)
    command = fed.feed(frames.FRAME_HEADER, header(len(body), properties))
    if body:
        command = fed.feed(frames.FRAME_BODY, body)
    whole = Assembler(max_size)
    assert whole.method is None
    taken = whole.whole_publish(PUBLISH, properties, body)
    assert whole.method is None and fed.method is None
    assert taken[1:] == command[1:]
    if type(command[0]) is AMQPError:
        assert (taken[0].code, taken[0].text) == (command[0].code, command[0].text)
    else:
        assert (taken[0].exchange, taken[0].routing_key) == ("x", "k")


def test_a_malformed_publish_taken_whole_is_the_same_error():
    payload = PUBLISH + b"\x00"  # a trailing byte
    with pytest.raises(AMQPError) as fed:
        Assembler(100).feed(frames.FRAME_METHOD, payload)
    with pytest.raises(AMQPError) as whole:
        Assembler(100).whole_publish(payload, b"\x00\x00", b"")
    assert (whole.value.code, whole.value.text) == (fed.value.code, fed.value.text)
