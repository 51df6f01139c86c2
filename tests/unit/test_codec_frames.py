"""The sans-IO frame reader: frames whole or a byte at a time, and RabbitMQ's framing errors."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.frames import FrameError, FrameReader

from ..support.twins import READERS, SCAN_PUBLISH


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
@pytest.mark.parametrize("Reader", READERS)
def test_frames_come_out_the_same_whole_or_in_pieces(Reader, sent, piece):
    data = b"".join(frame(*f) for f in sent)
    whole = Reader(131072)
    whole.receive_data(data)
    pieces = Reader(131072)
    got = []
    for start in range(0, len(data), piece):
        pieces.receive_data(data[start:start + piece])
        got += read_all(pieces)
    assert read_all(whole) == got == [tuple(f) for f in sent]


@pytest.mark.parametrize("Reader", READERS)
def test_a_payload_of_frame_max_is_accepted_one_more_byte_is_not(Reader):
    reader = Reader(4096)
    reader.receive_data(frame(frames.FRAME_BODY, 1, b"x" * 4096))
    assert reader.next_frame() == (frames.FRAME_BODY, 1, b"x" * 4096)
    reader.receive_data(frame(frames.FRAME_BODY, 1, b"x" * 4097))
    with pytest.raises(FrameError) as error:
        reader.next_frame()
    assert error.value.text == "type 3, all octets = <<>>: {frame_too_large,4097,4088}"


@pytest.mark.parametrize("payload, shown", [(b"", "<<>>"), (b"\x00", "<<0>>"),
                                            (b"\x00\x32\x00", "<<0,50,0>>")])
@pytest.mark.parametrize("Reader", READERS)
def test_a_method_frame_without_its_ids_is_a_framing_error_on_arrival(Reader, payload, shown):
    reader = Reader(4096)
    reader.receive_data(frame(frames.FRAME_METHOD, 1, payload))
    with pytest.raises(FrameError) as error:
        reader.next_frame()
    assert error.value.text == f"type 1, all octets = {shown}: unknown_frame"


@pytest.mark.parametrize("Reader", READERS)
def test_bad_frame_end(Reader):
    reader = Reader(4096)
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


def frames_of(Reader, data: bytes, frame_max: int) -> list | FrameError:
    reader = Reader(frame_max)
    reader.receive_data(data)
    try:
        return read_all(reader)
    except FrameError as error:
        return error


@given(st.integers(0, 3), st.binary(max_size=300), st.sampled_from([64, 128, 4096]),
       st.integers(0, 3), st.sampled_from([60, 50]), st.integers(0, 400), st.integers(0, 255),
       st.booleans())
@example(0, b"", 64, 0, 60, 28, 1, True)  # a header's weight not 0: left to next_frame
@pytest.mark.parametrize("Reader", READERS)
def test_a_whole_publish_is_taken_in_one_pass_only_as_its_frames_would_read(
        Reader, channel, body, frame_max, header_channel, class_id, position, byte, corrupt):
    """next_publish takes exactly what next_frame would read as method, header and
    one body frame on one channel; anything else is left untouched for next_frame."""
    data = bytearray(publish_bytes(channel, body, frame_max, header_channel, class_id) + b"tail")
    if corrupt and position < len(data):
        data[position] = byte
    data = bytes(data)
    reader = Reader(frame_max)
    reader.receive_data(data)
    taken = reader.next_publish()
    if taken is None:
        assert reader.buffered == len(data)  # nothing consumed
        return
    got_channel, payload, properties, content = taken
    expected = [(1, got_channel, payload),
                (2, got_channel, frames.content_header(len(content), properties))]
    if content:
        expected.append((3, got_channel, content))
    generic = frames_of(Reader, data[:len(data) - reader.buffered], frame_max)
    assert generic == expected
    assert payload[:4] == struct.pack(">HH", 60, 40)


@pytest.mark.parametrize("Reader", READERS)
def test_a_publish_whose_body_spans_frames_goes_frame_by_frame(Reader):
    reader = Reader(64)
    reader.receive_data(publish_bytes(1, b"b" * 100, 64))
    assert reader.next_publish() is None
    assert [kind for kind, _, _ in read_all(reader)] == [1, 2, 3, 3]


@pytest.mark.parametrize("Reader", READERS)
def test_a_plain_publish_is_taken_whole(Reader):
    reader = Reader(4096)
    reader.receive_data(publish_bytes(5, b"hello", 4096) + publish_bytes(5, b"", 4096))
    channel, payload, properties, body = reader.next_publish()
    assert (channel, properties, body) == (5, b"\x10\x00\x02", b"hello")
    assert m.decode_method(payload) == m.BasicPublish(exchange="x", routing_key="k")
    channel, _payload, properties, body = reader.next_publish()
    assert (channel, properties, body) == (5, b"\x10\x00\x02", b"")
    assert reader.next_publish() is None and reader.next_frame() is None


# -- reading into the reader's buffer (get_buffer / buffer_updated) -----------------

BUFFERED_FRAME_MAX = 200_000  # above the room offered: large frames make the buffer grow


def publish_or_frame():
    """A valid publish (its body in one frame or several), a frame of any kind, or
    something broken: a frame too large, a bad frame end, a short method frame."""
    body = st.builds(lambda size, byte: bytes((byte,)) * size,
                     st.one_of(st.integers(0, 300), st.integers(60_000, 150_000)),
                     st.integers(0, 255))
    return st.one_of(
        st.builds(publish_bytes, st.integers(0, 3), body, st.sampled_from([4096, 131072])),
        st.builds(frame, st.sampled_from([1, 2, 3, 8]), st.integers(0, 3), body),
        st.builds(lambda size: struct.pack(">BHI", 3, 1, size) + b"x",
                  st.integers(BUFFERED_FRAME_MAX + 1, 2**32 - 1)),
        st.builds(frame, st.just(3), st.integers(0, 3), st.binary(max_size=20),
                  st.integers(0, 205)),
        st.builds(frame, st.just(1), st.integers(0, 3), st.binary(max_size=3)),
        st.binary(max_size=12))


def drain(reader: FrameReader, out: list, publishes: bool) -> bool:
    """What the connection does with the buffer: publishes in one pass where they
    are whole (if `publishes`), frames otherwise, until more input is needed.
    False once a framing error ends the connection."""
    try:
        while True:
            got = reader.next_publish() if publishes else None
            if got is None:
                got = reader.next_frame()
                if got is None:
                    return True
            out.append(got)
    except FrameError as error:
        out.append(("error", error.text))
        return False


# How each piece of the stream arrives: copied in by receive_data, or read into
# the room get_buffer offers, filling it or writing fewer bytes than offered.
deliveries = st.lists(st.tuples(st.sampled_from(["copied", "read"]), st.integers(1, 70_000)),
                      min_size=1, max_size=40)


def read_in(reader: FrameReader, data: bytes, ways, publishes: bool) -> tuple[list, list]:
    """`data` given to `reader` piece by piece as `ways` says, parsed after each
    piece while the room is still exported (as uvloop holds it), so any resize
    there would raise BufferError. The output and the pieces as they arrived."""
    out, pieces, start, turn = [], [], 0, 0
    while start < len(data):
        how, size = ways[turn % len(ways)]
        turn += 1
        if how == "copied":
            piece = data[start:start + size]
            reader.receive_data(piece)
            going = drain(reader, out, publishes)
        else:
            room = reader.get_buffer(size)
            assert len(room) >= max(size, frames.READ_SIZE)
            piece = data[start:start + min(size, len(room))]
            room[:len(piece)] = piece
            reader.buffer_updated(len(piece))
            going = drain(reader, out, publishes)
            room.release()
        pieces.append(piece)
        start += len(piece)
        if not going:
            break
    return out, pieces


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(publish_or_frame(), max_size=12), deliveries)
@pytest.mark.parametrize("Reader", READERS)
def test_frames_read_into_the_buffer_come_out_as_bytes_copied_in_would(Reader, sent, ways):
    read_into_the_buffer_as_copied_in(Reader, b"".join(sent), ways)


def read_into_the_buffer_as_copied_in(Reader, data: bytes, ways) -> None:
    # Frame by frame, the output does not depend on how the bytes arrived at all.
    whole = []
    copied = Reader(BUFFERED_FRAME_MAX)
    copied.receive_data(data)
    drain(copied, whole, publishes=False)
    assert read_in(Reader(BUFFERED_FRAME_MAX), data, ways, publishes=False)[0] == whole
    # A publish is taken whole only once all of it is in, so the same pieces copied
    # in are what the reading is compared with.
    got, pieces = read_in(Reader(BUFFERED_FRAME_MAX), data, ways, publishes=True)
    expected = []
    reference = Reader(BUFFERED_FRAME_MAX)
    for piece in pieces:
        reference.receive_data(piece)
        if not drain(reference, expected, publishes=True):
            break
    assert got == expected


@pytest.mark.parametrize("Reader", READERS)
def test_the_buffer_is_not_resized_while_the_transport_holds_it(Reader):
    """uvloop keeps the room exported until buffer_updated returns: reading the
    frames then must not resize the buffer (CPython raises BufferError if it does)."""
    reader = Reader(BUFFERED_FRAME_MAX)
    data = (publish_bytes(1, b"a" * 70_000, 131072) + publish_bytes(1, b"b" * 10, 131072)
            + frame(3, 1, b"c" * 100_000) + frame(8, 0, b""))
    got, expected, copied = [], [], Reader(BUFFERED_FRAME_MAX)
    for start in range(0, len(data), 50_000):
        piece = data[start:start + 50_000]
        room = reader.get_buffer(65536)
        room[:len(piece)] = piece
        reader.buffer_updated(len(piece))
        drain(reader, got, publishes=True)
        with pytest.raises(BufferError):  # the export is real: a resize would fail
            reader._buffer.append(0)
        room.release()
        copied.receive_data(piece)
        drain(copied, expected, publishes=True)
    assert got == expected
    assert (3, 1, b"c" * 100_000) in got and got[-1] == (8, 0, b"")
    assert got[-3][2:] == (b"\x10\x00\x02", b"b" * 10)  # a publish taken whole


@pytest.mark.parametrize("Reader", READERS)
def test_the_protocol_header_can_arrive_in_the_buffer_a_byte_at_a_time(Reader):
    reader = Reader(4096)
    for byte in frames.PROTOCOL_HEADER:
        assert reader.read_protocol_header() is None
        room = reader.get_buffer(1)
        room[0] = byte
        reader.buffer_updated(1)
        room.release()
    assert reader.read_protocol_header() == frames.PROTOCOL_HEADER
    assert reader.next_frame() is None


def allocated(action) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = action()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("Reader", READERS)
def test_a_large_frame_does_not_leave_the_buffer_large(Reader):
    reader = Reader(8 << 20)
    reader.receive_data(frame(3, 1, bytes(4 << 20)))
    assert reader.next_frame() == (3, 1, bytes(4 << 20))
    # The next read is given a buffer of the usual size, not the 4 MiB one.
    assert len(reader.get_buffer(65536)) == frames.READ_SIZE


@pytest.mark.parametrize("Reader", READERS)
def test_an_idle_reader_gives_its_memory_back(Reader):
    def read_a_frame_and_rest():
        reader = Reader(4096)
        room = reader.get_buffer(65536)
        room[:8] = frame(8, 0, b"")
        reader.buffer_updated(8)
        room.release()
        assert reader.next_frame() == (8, 0, b"")
        reader.release()
        return reader

    grown, reader = allocated(read_a_frame_and_rest)
    assert grown < 4096
    # Nor does release drop data not yet read.
    reader.receive_data(frame(8, 0, b"")[:5])
    reader.release()
    reader.receive_data(frame(8, 0, b"")[5:])
    assert reader.next_frame() == (8, 0, b"")


@pytest.mark.skipif(len(SCAN_PUBLISH) < 2, reason="the compiled twin is not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(publish_or_frame(), max_size=6), st.lists(st.tuples(st.integers(0, 10**6),
                                                                   st.integers(0, 255)),
                                                         max_size=4),
       st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from([64, 4096, 131072]))
def test_the_twins_scan_any_bytes_alike(sent, damage, start, cut, frame_max):
    """Whatever the bytes (whole, cut short, damaged) and wherever the scan starts
    and stops, the compiled scan finds what the pure one finds."""
    data = bytearray(b"".join(sent))
    for position, byte in damage:
        if data:
            data[position % len(data)] = byte
    limit = len(data) - cut % (len(data) + 1)
    offset = start % (limit + 1)
    pure, compiled = (p.values[0] for p in SCAN_PUBLISH)
    assert compiled(data, offset, limit, frame_max) == pure(data, offset, limit, frame_max)


@pytest.mark.skipif(len(READERS) < 2, reason="the compiled twin is not built")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(publish_or_frame(), max_size=8), st.lists(st.tuples(st.integers(0, 10**6),
                                                                   st.integers(0, 255)),
                                                         max_size=3), deliveries)
def test_the_twin_readers_read_any_bytes_alike(sent, damage, ways):
    """Whatever the bytes (whole, damaged) and however they arrive, the compiled
    reader gives the frames, publishes and framing errors (texts included) the pure
    one gives."""
    data = bytearray(b"".join(sent))
    for position, byte in damage:
        if data:
            data[position % len(data)] = byte
    pure, compiled = (p.values[0] for p in READERS)
    for publishes in (False, True):
        assert (read_in(compiled(BUFFERED_FRAME_MAX), bytes(data), ways, publishes)
                == read_in(pure(BUFFERED_FRAME_MAX), bytes(data), ways, publishes))
