"""The sans-IO frame reader: frames whole or a byte at a time, and RabbitMQ's framing errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.frames import FrameError, FrameReader


def frame(frame_type: int, channel: int, payload: bytes, end: int = frames.FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))


def read_all(reader: FrameReader) -> list:
    out = []
    while (got := reader.next_frame()) is not None:
        out.append(got)
    return out


frames_st = st.lists(st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 65535),
                               st.binary(min_size=4, max_size=300)), max_size=8)


@given(frames_st, st.integers(1, 50))
def test_frames_come_out_the_same_whole_or_in_pieces(sent, piece):
    data = b"".join(frame(*f) for f in sent)
    whole = FrameReader(131072)
    whole.receive_data(data)
    pieces = FrameReader(131072)
    got = []
    for start in range(0, len(data), piece):
        pieces.receive_data(data[start:start + piece])
        got += read_all(pieces)
    assert read_all(whole) == got == [tuple(f) for f in sent]


def test_a_payload_of_frame_max_is_accepted_one_more_byte_is_not():
    reader = FrameReader(4096)
    reader.receive_data(frame(frames.FRAME_BODY, 1, b"x" * 4096))
    assert reader.next_frame() == (frames.FRAME_BODY, 1, b"x" * 4096)
    reader.receive_data(frame(frames.FRAME_BODY, 1, b"x" * 4097))
    with pytest.raises(FrameError) as error:
        reader.next_frame()
    assert error.value.text == "type 3, all octets = <<>>: {frame_too_large,4097,4088}"


@pytest.mark.parametrize("payload, shown", [(b"", "<<>>"), (b"\x00", "<<0>>"),
                                            (b"\x00\x32\x00", "<<0,50,0>>")])
def test_a_method_frame_without_its_ids_is_a_framing_error_on_arrival(payload, shown):
    reader = FrameReader(4096)
    reader.receive_data(frame(frames.FRAME_METHOD, 1, payload))
    with pytest.raises(FrameError) as error:
        reader.next_frame()
    assert error.value.text == f"type 1, all octets = {shown}: unknown_frame"


def test_bad_frame_end():
    reader = FrameReader(4096)
    reader.receive_data(frame(frames.FRAME_METHOD, 0, m.encode_method(m.ChannelOpen()), end=0))
    with pytest.raises(FrameError):
        reader.next_frame()


def test_erlang_binary_is_shortened():
    assert frames.erlang_binary(bytes(range(3))) == "<<0,1,2>>"
    assert frames.erlang_binary(bytes(100), limit=2) == "<<0,0,...>>"


def publish_bytes(channel: int, body: bytes, frame_max: int, header_channel: int | None = None,
                  class_id: int = 60) -> bytes:
    props = b"\x10\x00\x02"  # delivery_mode 2
    out = frame(1, channel, m.encode_method(m.BasicPublish(exchange="x", routing_key="k")))
    header_channel = channel if header_channel is None else header_channel
    out += frame(2, header_channel, struct.pack(">HHQ", class_id, 0, len(body)) + props)
    chunk = frame_max - frames.FRAME_OVERHEAD
    for start in range(0, len(body), chunk):
        out += frame(3, channel, body[start:start + chunk])
    return out


def frames_of(data: bytes, frame_max: int) -> list | FrameError:
    reader = FrameReader(frame_max)
    reader.receive_data(data)
    try:
        return read_all(reader)
    except FrameError as error:
        return error


@given(st.integers(0, 3), st.binary(max_size=300), st.sampled_from([64, 128, 4096]),
       st.integers(0, 3), st.sampled_from([60, 50]), st.integers(0, 400), st.integers(0, 255),
       st.booleans())
def test_a_whole_publish_is_taken_in_one_pass_only_as_its_frames_would_read(
        channel, body, frame_max, header_channel, class_id, position, byte, corrupt):
    """next_publish takes exactly what next_frame would read as method, header and
    one body frame on one channel; anything else is left untouched for next_frame."""
    data = bytearray(publish_bytes(channel, body, frame_max, header_channel, class_id) + b"tail")
    if corrupt and position < len(data):
        data[position] = byte
    data = bytes(data)
    reader = FrameReader(frame_max)
    reader.receive_data(data)
    taken = reader.next_publish()
    if taken is None:
        assert reader._offset == 0  # nothing consumed
        return
    got_channel, payload, properties, content = taken
    expected = [(1, got_channel, payload),
                (2, got_channel, frames.content_header(len(content), properties))]
    if content:
        expected.append((3, got_channel, content))
    generic = frames_of(data[:reader._offset], frame_max)
    assert generic == expected
    assert payload[:4] == struct.pack(">HH", 60, 40)


def test_a_publish_whose_body_spans_frames_goes_frame_by_frame():
    reader = FrameReader(64)
    reader.receive_data(publish_bytes(1, b"b" * 100, 64))
    assert reader.next_publish() is None
    assert [kind for kind, _, _ in read_all(reader)] == [1, 2, 3, 3]


def test_a_plain_publish_is_taken_whole():
    reader = FrameReader(4096)
    reader.receive_data(publish_bytes(5, b"hello", 4096) + publish_bytes(5, b"", 4096))
    channel, payload, properties, body = reader.next_publish()
    assert (channel, properties, body) == (5, b"\x10\x00\x02", b"hello")
    assert m.decode_method(payload) == m.BasicPublish(exchange="x", routing_key="k")
    channel, _payload, properties, body = reader.next_publish()
    assert (channel, properties, body) == (5, b"\x10\x00\x02", b"")
    assert reader.next_publish() is None and reader.next_frame() is None
