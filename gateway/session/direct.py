"""A connection without a socket, as RabbitMQ's management plugin uses a direct
(in-node) AMQP connection to publish and get messages: one real Channel runs
the methods (permissions, routing, confirms, the shards), and the frames it
writes are read back into replies. It is not listed among the connections."""

from __future__ import annotations

import asyncio
import logging

from ..amqp import frames, spec
from ..amqp import methods as m
from ..errors import AMQPError
from .assembly import BASIC_CLASS, decode_method
from .channel import Channel

log = logging.getLogger("warren.connection")


class InternalConnection:
    def __init__(self, gateway, user: str, vhost):
        self.gateway = gateway
        self.id = gateway.new_id()
        self.user = user
        self.vhost = vhost
        self.name = f"internal ({user})"
        self.capabilities = {"publisher_confirms": True, "basic.nack": True}
        self.frame_max = gateway.config.frame_max
        self.routes: dict = {}  # a channel's publishing.Route memory (Connection.routes)
        self.owed_confirms: set = set()
        self.owed_grants: set = set()
        self.exclusive_queues: set = set()
        self.replies: list[tuple] = []  # (method, properties, body) the channel answered
        self.error: AMQPError | None = None  # what closed the channel
        self._reader = frames.FrameReader(self.frame_max)
        self._content: list = []  # [method, properties, size, parts] arriving, if any
        self._changed = asyncio.Event()
        self.channel = Channel(self, 1)

    # -- driving the channel --------------------------------------------------

    def run(self, method, properties: bytes | None = None, body: bytes = b"") -> None:
        """Hand the channel a command in frames, as a client would send it."""
        if self.error is not None:
            return
        if properties is None:
            data = frames.method_frame(1, method)
        else:
            data = frames.content_frames(1, m.encode_method(method), BASIC_CLASS, properties,
                                         body, self.frame_max)
        reader = frames.FrameReader(self.frame_max)
        reader.receive_data(data)
        while (frame := reader.next_frame()) is not None:
            self.run_guarded(self.channel, lambda f=frame: self.channel.handle_frame(f[0], f[2]))
        self.gateway.shards.send()

    async def wait_for(self, condition, timeout: float = 10.0):
        """The first reply `condition` accepts; AMQPError if the channel closed first."""
        async with asyncio.timeout(timeout):
            while True:
                for reply in self.replies:
                    if condition(reply[0]):
                        self.replies.remove(reply)
                        return reply
                if self.error is not None:
                    raise self.error
                self._changed.clear()
                await self._changed.wait()

    def close(self) -> None:
        self.channel.release()
        for link in self.gateway.shards:
            link.forget(self)
        self.gateway.shards.send()

    # -- what a Channel calls on its connection ----------------------------------

    def send(self, data: bytes) -> None:
        self._reader.receive_data(data)
        while (frame := self._reader.next_frame()) is not None:
            self._frame(*frame)
        self._changed.set()

    def send_uncopied(self, parts: list) -> None:
        self.send(b"".join(parts))

    def _frame(self, frame_type: int, _channel: int, payload: bytes) -> None:
        if frame_type == frames.FRAME_METHOD:
            method = decode_method(payload)
            if method.HAS_CONTENT:
                self._content = [method, b"", 0, []]
            else:
                self.replies.append((method, None, b""))
        elif frame_type == frames.FRAME_HEADER:
            _, _, size, properties = frames.parse_content_header(payload)
            self._content[1:3] = properties, size
            self._complete()
        else:
            self._content[3].append(payload)
            self._complete()

    def _complete(self) -> None:
        method, properties, size, parts = self._content
        if sum(map(len, parts)) >= size:
            self.replies.append((method, properties, b"".join(parts)))
            self._content = []

    def method(self, channel: int, method) -> None:
        self.send(frames.method_frame(channel, method))

    def schedule_flush(self) -> None:
        self.gateway.flush_soon(self)

    def flush(self) -> None:
        owed, self.owed_confirms = self.owed_confirms, set()
        for channel in owed:
            channel.send_confirms()

    def run_guarded(self, ch: Channel, action) -> None:
        try:
            action()
        except AMQPError as error:
            self.close_channel_with_error(ch, error)

    def fail(self, error: BaseException) -> None:
        log.error("internal connection of %s failed", self.user, exc_info=error)
        self.close_channel_with_error(self.channel,
                                      AMQPError(spec.INTERNAL_ERROR, "internal error"))

    def close_channel_with_error(self, ch: Channel, error: AMQPError) -> None:
        ch.release()
        self.error = error
        self._changed.set()

    def close_forced(self, reason: str) -> None:
        self.close_channel_with_error(self.channel, AMQPError(spec.CONNECTION_FORCED, reason))

    def forget_channel(self, ch: Channel) -> None:
        ch.release()

    def hold(self, cause) -> None:
        pass  # nothing to stop reading: the API publishes one message at a time

    def release(self, cause) -> None:
        pass

