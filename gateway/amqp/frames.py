"""AMQP 0-9-1 framing, sans-IO.

`FrameReader` holds the bytes received. A socket is read straight into its
buffer: `get_buffer()` offers writable room at the end and `buffer_updated(n)`
says n bytes were written there (asyncio's BufferedProtocol, so no bytes
object is made per read); `receive_data(bytes)` copies bytes in instead. The
transport keeps the room exported until buffer_updated and everything it calls
have returned, so the bytearray is resized (compacted, grown) only in
get_buffer and receive_data: it is allocated ahead and `_end` marks where its
data ends. A buffer grown large, or idle (`release`), is dropped for a new one.

`next_frame()` returns the next complete frame as (type, channel, payload) or
None when more data is needed; `next_publish()` a whole basic.publish at once.
Payloads are copied out as `bytes` once per frame: keeping many memoryview
slices of the receive buffer alive costs more in garbage collection than the
copy (measured: 0.2 M parsed publishes/s with slices kept, 0.5-0.7 M with
copies). Builders return ready-to-send bytes.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from warren.shards import build

from . import spec
from .methods import Method, encode_method

PROTOCOL_HEADER = b"AMQP\x00" + bytes(
    (spec.SPEC["major-version"], spec.SPEC["minor-version"], spec.SPEC["revision"]))

FRAME_METHOD = spec.FRAME_METHOD
FRAME_HEADER = spec.FRAME_HEADER
FRAME_BODY = spec.FRAME_BODY
FRAME_HEARTBEAT = spec.FRAME_HEARTBEAT
FRAME_END = spec.FRAME_END
FRAME_END_BYTE = bytes((FRAME_END,))
FRAME_OVERHEAD = 8  # type(1) + channel(2) + size(4) + frame-end(1)

_frame_prefix = struct.Struct(">BHI")
_header_prefix = struct.Struct(">HHQ")  # class-id, weight, body-size
_method_ids = struct.Struct(">HH")
# A content header frame's prefix and fixed fields: type, channel, size, class-id,
# weight, body-size.
_header_frame = struct.Struct(">BHIHHQ")
_PUBLISH_IDS = struct.pack(">HH", *spec.method_id("basic.publish"))
_BASIC_CLASS = spec.CLASS_IDS["basic"]

# Room offered to a socket read at least (a read of 64 KiB is what libuv asks
# for); a buffer grown past SHRINK_ABOVE for a large frame is let go once empty.
READ_SIZE = 65536
SHRINK_ABOVE = 1 << 20

# Payloads this large are copied out of the receive buffer through a view: once,
# where slicing the bytearray and then making bytes of it copies twice.
_VIEW_COPY_MIN = 2048

HEARTBEAT_FRAME = _frame_prefix.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE


class FrameError(Exception):
    """A connection-level framing error: 501 FRAME_ERROR."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class FrameReader:
    def __init__(self, frame_max: int):
        self.frame_max = frame_max
        self._buffer = bytearray()
        self._offset = 0  # where unread data starts
        self._end = 0  # where it ends: the bytes after it are room, not data

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet."""
        return self._end - self._offset

    def get_buffer(self, size_hint: int = -1) -> memoryview:
        """Writable room after the data, of at least READ_SIZE bytes (or the hint)."""
        self._reserve(max(size_hint, READ_SIZE))
        return memoryview(self._buffer)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were written at the start of the room get_buffer gave."""
        self._end += nbytes

    def receive_data(self, data) -> None:
        size = len(data)
        self._reserve(size)
        self._buffer[self._end:self._end + size] = data  # same length: no resize
        self._end += size

    def release(self) -> None:
        """Give the buffer's memory back if it holds no data (an idle connection)."""
        if self._offset == self._end:
            self._buffer = bytearray()
            self._offset = self._end = 0

    def _reserve(self, room: int) -> None:
        """Make `room` bytes free after the data: move the unread data to the front,
        grow the buffer if that is not enough. The only place it is resized."""
        offset, end = self._offset, self._end
        if offset == end:
            self._offset = self._end = end = 0
            if len(self._buffer) > SHRINK_ABOVE:  # done with a large frame
                self._buffer = bytearray()
        elif len(self._buffer) - end < room and offset:
            end -= offset
            with memoryview(self._buffer) as view:
                view[:end] = view[offset:self._end]
            self._offset, self._end = 0, end
        missing = end + room - len(self._buffer)
        if missing > 0:  # grown by at least the data held: a large frame arrives in few steps
            self._buffer += bytes(max(missing, end))

    def read_protocol_header(self) -> bytes | None:
        """The 8-byte protocol header that opens a connection, once it has arrived."""
        if self._end - self._offset < len(PROTOCOL_HEADER):
            return None
        start = self._offset
        self._offset += len(PROTOCOL_HEADER)
        return bytes(self._buffer[start:self._offset])

    def next_publish(self) -> tuple[int, bytes, bytes, bytes] | None:
        """A whole basic.publish at the front of the buffer, taken in one pass:
        (channel, method payload, raw properties, body); see scan_publish."""
        found = scan_publish(self._buffer, self._offset, self._end, self.frame_max)
        if found is None:
            return None
        channel, payload, properties, body, self._offset = found
        return channel, payload, properties, body

    def next_frame(self) -> tuple[int, int, bytes] | None:
        buf = self._buffer
        offset = self._offset
        limit = self._end
        if limit - offset < 7:
            return None
        frame_type, channel, size = _frame_prefix.unpack_from(buf, offset)
        if size > self.frame_max:
            # RabbitMQ's limit and text: a payload of frame_max bytes is accepted
            # (clients that cut bodies at frame_max rely on it), one more is not.
            raise FrameError(f"type {frame_type}, all octets = <<>>: "
                             f"{{frame_too_large,{size},{self.frame_max - FRAME_OVERHEAD}}}")
        end = offset + 7 + size
        if limit <= end:
            return None
        if size < _VIEW_COPY_MIN:
            payload = bytes(buf[offset + 7:end])  # two copies, cheaper than a view when small
        else:
            with memoryview(buf) as view:  # released at once: get_buffer may resize
                payload = bytes(view[offset + 7:end])
        if buf[end] != FRAME_END:
            raise FrameError(f"type {frame_type}, {payload_snippet(payload)}: "
                             f"{{invalid_frame_end_marker,{buf[end]}}}")
        if frame_type == FRAME_METHOD and size < 4:  # not even class-id and method-id
            raise FrameError(f"type {frame_type}, {payload_snippet(payload)}: unknown_frame")
        self._offset = end + 1
        return frame_type, channel, payload


def next_frame_type(reader) -> int | None:
    """The type of the frame at the front of a reader's data (either twin), None
    while none of it has arrived; the frame stays where it is."""
    offset = reader._offset
    return reader._buffer[offset] if reader._end > offset else None


def scan_publish(buf: bytearray, offset: int, limit: int, frame_max: int
                 ) -> tuple[int, bytes, bytes, bytes, int] | None:
    """A whole basic.publish in buf[offset:limit]: (channel, method payload, raw
    properties, body, where it ends). Only the plain shape qualifies (method,
    content header and at most one body frame on one channel, each well formed and
    the body as long as announced); anything else is None and left for next_frame,
    which reports its errors."""
    if limit - offset < 11 or buf[offset + 7:offset + 11] != _PUBLISH_IDS \
            or buf[offset] != FRAME_METHOD:
        return None
    _type, channel, size = _frame_prefix.unpack_from(buf, offset)
    header = offset + 8 + size
    if limit < header + 22 or size > frame_max or buf[header - 1] != FRAME_END:
        return None
    kind, header_channel, header_size, class_id, weight, body_size = \
        _header_frame.unpack_from(buf, header)
    body = header + 8 + header_size
    if (kind != FRAME_HEADER or header_channel != channel or class_id != _BASIC_CLASS
            or weight or header_size < 14 or header_size > frame_max
            or limit < body or buf[body - 1] != FRAME_END):
        return None
    if body_size:
        end = body + 8 + body_size
        if limit < end or body_size > frame_max or buf[end - 1] != FRAME_END \
                or _frame_prefix.unpack_from(buf, body) != (FRAME_BODY, channel, body_size):
            return None
        if body_size < _VIEW_COPY_MIN:
            content = bytes(buf[body + 7:end - 1])
        else:  # copied once; the view is released at once (get_buffer may resize)
            with memoryview(buf) as view:
                content = bytes(view[body + 7:end - 1])
    else:
        end, content = body, b""
    return (channel, bytes(buf[offset + 7:header - 1]), bytes(buf[header + 19:body - 1]),
            content, end)


def method_frame(channel: int, method: Method) -> bytes:
    payload = encode_method(method)
    return _frame_prefix.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def content_parts(channel: int, method_payload: bytes, class_id: int, properties: bytes,
                  body, frame_max: int) -> list[bytes | memoryview]:
    """A method frame and its content header (one piece), then the body split to
    fit frame_max, as pieces to write back to back: the body's pieces are views of
    it, not copies."""
    parts: list[bytes | memoryview] = [b"".join((
        _frame_prefix.pack(FRAME_METHOD, channel, len(method_payload)), method_payload,
        FRAME_END_BYTE, _frame_prefix.pack(FRAME_HEADER, channel, 12 + len(properties)),
        _header_prefix.pack(class_id, 0, len(body)), properties, FRAME_END_BYTE))]
    chunk = frame_max - FRAME_OVERHEAD
    size = len(body)
    if size <= chunk:
        if size:
            parts += (_frame_prefix.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE)
        return parts
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start:start + chunk]
        parts += (_frame_prefix.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return parts


def content_frames(channel: int, method_payload: bytes, class_id: int, properties: bytes,
                   body, frame_max: int) -> bytes:
    """content_parts as one bytes."""
    return b"".join(content_parts(channel, method_payload, class_id, properties, body,
                                  frame_max))


def parse_content_header(payload: bytes) -> tuple[int, int, int, bytes]:
    """(class-id, weight, body-size, raw property bytes) of a content header payload."""
    if len(payload) < 14:
        raise FrameError("content header too short")
    class_id, weight, body_size = _header_prefix.unpack_from(payload, 0)
    return class_id, weight, body_size, payload[12:]


def content_header(body_size: int, properties: bytes) -> bytes:
    """A basic content header payload (class-id, weight, body-size, properties)."""
    return _header_prefix.pack(_BASIC_CLASS, 0, body_size) + properties


def method_ids(payload: bytes) -> tuple[int, int]:
    """(class-id, method-id) of a method frame payload (the reader checked its length)."""
    return _method_ids.unpack_from(payload, 0)


def erlang_binary(data: bytes, limit: int = 64) -> str:
    """Bytes as RabbitMQ prints them in error texts: <<0,50,...>>."""
    shown = ",".join(map(str, data[:limit]))
    return f"<<{shown},...>>" if len(data) > limit else f"<<{shown}>>"


# How Erlang's ~p writes a byte of a binary it prints as text.
_PRINTED = {**{byte: chr(byte) for byte in range(32, 127)}, ord('"'): '\\"',
            ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
            11: "\\v", 8: "\\b", 12: "\\f", 27: "\\e"}


def payload_snippet(payload: bytes) -> str:
    """A frame's payload as RabbitMQ's frame errors show it: 'all octets = <<...>>',
    or 'first 16 octets = <<...>>' of a longer one; <<"text">> when every byte is
    printable (Erlang also prints Latin-1 letters so: here those stay numbers, as
    a reply text is UTF-8)."""
    shown = payload[:16]
    if shown and all(byte in _PRINTED for byte in shown):
        octets = '<<"' + "".join(_PRINTED[byte] for byte in shown) + '">>'
    else:
        octets = erlang_binary(shown)
    return f"{'all' if len(payload) <= 16 else 'first 16'} octets = {octets}"


# The compiled twin (_hotpath.FrameReader, with its own scan_publish) serves where it
# was built; bound last, as it imports this module's constants.
PureFrameReader = FrameReader
if not TYPE_CHECKING:  # a type checker reads the pure one, of the same interface
    FrameReader = build.twin(FrameReader, "warren.gateway.amqp._hotpath", "FrameReader")
