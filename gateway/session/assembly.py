"""A channel's frames assembled into commands, sans-IO.

A command is a method, or a basic.publish with its content (header and body).
Frames are decoded and checked as they arrive, as RabbitMQ's command assembler
does: a frame out of order or one that does not decode is an AMQPError at once,
whatever the channel is busy with.
"""

from __future__ import annotations

from ..amqp import frames, hotpath, spec
from ..amqp import methods as m
from ..errors import AMQPError

BASIC_CLASS = spec.CLASS_IDS["basic"]


def decode_method(payload: bytes):
    """The method of a method frame, with RabbitMQ's errors when it is not one."""
    try:
        return m.decode_method(payload)
    except m.UnknownMethod as error:
        raise AMQPError(spec.COMMAND_INVALID,
                        f"unknown method class {error.class_id} method {error.method_id}",
                        error.class_id, error.method_id) from None
    except m.CodecError:
        class_id, method_id = frames.method_ids(payload)
        raise AMQPError(spec.FRAME_ERROR, f"cannot decode {frames.erlang_binary(payload[4:])}",
                        class_id, method_id) from None


class Assembler:
    """Feed it a channel's frames; it hands back each command they complete as
    (method, properties, body), properties None for a method without content.
    A publish over `max_size` comes back with an AMQPError as its method, to be
    raised in its turn: its body is counted, never kept."""

    __slots__ = ("max_size", "method", "_properties", "_size", "_content", "_received",
                 "_awaiting_header")

    def __init__(self, max_size: int):
        self.max_size = max_size
        # the publish whose content is arriving, or the error it is to raise (None:
        # idle, the next frame must be a method)
        self.method: hotpath.Publish | m.Method | AMQPError | None = None
        self._properties = b""
        self._size = 0
        # A body in one frame is that frame's payload; one in several frames is
        # written into a bytearray of the announced size as they come (no list of
        # parts to join: the body is never held twice).
        self._content: bytes | bytearray = b""
        self._received = 0
        self._awaiting_header = False

    def whole_publish(self, payload: bytes, properties: bytes, body: bytes) -> tuple:
        """A basic.publish whose frames came whole and in order (FrameReader.next_publish),
        assembled without feeding them one by one; only while idle (method is None)."""
        try:
            method = hotpath.parse_publish(payload)
        except m.MalformedMethod:
            method = decode_method(payload)  # raises the full error
        if len(body) > self.max_size:
            return (AMQPError(spec.PRECONDITION_FAILED, f"message size {len(body)} is larger "
                              f"than configured max size {self.max_size}", BASIC_CLASS,
                              m.BasicPublish.METHOD_ID), properties, b"")
        return method, properties, body

    def feed(self, frame_type: int, payload: bytes) -> tuple | None:
        if frame_type == frames.FRAME_METHOD:
            return self._method_frame(payload)
        if frame_type == frames.FRAME_HEADER:
            return self._header(payload)
        if frame_type == frames.FRAME_BODY:
            return self._body(payload)
        raise AMQPError(spec.FRAME_ERROR, f"unexpected frame type {frame_type}")

    def _method_frame(self, payload: bytes) -> tuple | None:
        if self.method is not None:
            raise self._out_of_turn()
        ids = payload[:4]
        if ids == hotpath.ACK_IDS and len(payload) == hotpath.ACK_SIZE:
            return hotpath.parse_ack(payload), None, b""
        if ids == hotpath.PUBLISH_IDS:
            try:
                method = hotpath.parse_publish(payload)
            except m.MalformedMethod:
                method = decode_method(payload)  # raises the full error
        else:
            method = decode_method(payload)
        if not method.HAS_CONTENT:
            return method, None, b""
        if type(method) is not hotpath.Publish and type(method) is not m.BasicPublish:
            raise AMQPError(spec.COMMAND_INVALID, f"unexpected method {method.NAME}",
                            method.CLASS_ID, method.METHOD_ID)
        self.method = method
        self._awaiting_header = True
        return None

    def _header(self, payload: bytes) -> tuple | None:
        if not self._awaiting_header:
            raise self._out_of_turn()
        class_id, weight, size, properties = frames.parse_content_header(payload)
        if weight:  # must be 0: RabbitMQ takes such a frame for no content header
            raise self._out_of_turn()
        if class_id != BASIC_CLASS:
            raise AMQPError(spec.UNEXPECTED_FRAME,
                            f"expected content header for class {BASIC_CLASS}, got one for "
                            f"class {class_id} instead", BASIC_CLASS, m.BasicPublish.METHOD_ID)
        self._awaiting_header = False
        if size > self.max_size:
            self.method = AMQPError(
                spec.PRECONDITION_FAILED, f"message size {size} is larger than configured "
                f"max size {self.max_size}", BASIC_CLASS, m.BasicPublish.METHOD_ID)
        self._properties = properties
        self._size = size
        self._content = b""
        self._received = 0
        return self._complete() if size == 0 else None

    def _body(self, payload: bytes) -> tuple | None:
        if self.method is None or self._awaiting_header:
            raise self._out_of_turn()
        start = self._received
        self._received = end = start + len(payload)
        if end > self._size:
            raise AMQPError(spec.FRAME_ERROR, "content body larger than its header announced")
        if type(self.method) is not AMQPError:
            if end == self._size and not start:
                self._content = payload
            else:
                if not start:
                    self._content = bytearray(self._size)
                self._content[start:end] = payload  # type: ignore[index]  # the bytearray
        return self._complete() if end == self._size else None

    def _out_of_turn(self) -> AMQPError:
        """A frame of the wrong type for the state, in RabbitMQ's words
        (rabbit_command_assembler); inside a publish's content, naming the publish."""
        if self.method is None:
            return AMQPError(spec.UNEXPECTED_FRAME,
                             "expected method frame, got non method frame instead")
        if self._awaiting_header:
            text = (f"expected content header for class {BASIC_CLASS}, got non content header "
                    "frame instead")
        else:
            text = "expected content body, got non content body frame instead"
        return AMQPError(spec.UNEXPECTED_FRAME, text, BASIC_CLASS, m.BasicPublish.METHOD_ID)

    def _complete(self) -> tuple:
        command = (self.method, self._properties, self._content)
        self.method = None
        self._content = b""
        return command
