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
