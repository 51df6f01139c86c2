"""A connection of another gateway process, as gateway 0 runs its declarations.

Gateway 0 alone changes the catalogue, so another gateway forwards its
clients' exchange.* and queue.* methods (controllink.Forward). Here each runs on
a real Channel of a stand-in for the client's connection, with its user, vhost
and id: permissions, equivalence checks, exclusive queues (owned by the
stand-in, so by the client's connection) and the shards' answers are exactly
as for a client of gateway 0. The frames the channel writes are the client's
answer; an error that closes the channel goes back as its code and text.
"""

from __future__ import annotations

import logging

from warren.shards import records as r

from ..amqp import spec
from ..broker.peermessages import Answer, Forward
from ..errors import AMQPError
from ..session.assembly import decode_method
from ..session.channel import Channel

log = logging.getLogger("warren")


class Mirror:
    def __init__(self, gateway, forward: Forward, answer):
        self.gateway = gateway
        self.id = forward.connection
        self.user = forward.user
        self.vhost = gateway.catalogue.vhosts.get(forward.vhost)
        self.name = f"gateway {r.gateway_of(self.id)} connection {self.id}"
        self.capabilities: dict = {}
        self.frame_max = gateway.config.frame_max
        self.routes: dict = {}  # a channel's publishing.Route memory (Connection.routes)
        self.owed_confirms: set = set()
        self.owed_grants: set = set()
        self.exclusive_queues: set = set()
        self.channels: dict[int, Channel] = {}
        self._asking: dict[int, int] = {}  # channel number -> the forward it runs
        self._out: dict[int, list] = {}  # channel number -> frames written for it
        self._answer = answer  # (Answer) -> None, to the client's gateway

    def run(self, forward: Forward) -> None:
        if self.vhost is None or self.vhost.name != forward.vhost:  # deleted meanwhile
            self.vhost = self.gateway.catalogue.vhosts.get(forward.vhost)
            if self.vhost is None:
                return self._answer(Answer(forward.req, code=spec.CONNECTION_FORCED,
                                           detail=f"vhost '{forward.vhost}' is deleted"))
        channel = self.channels.get(forward.channel)
        if channel is None:
            channel = self.channels[forward.channel] = Channel(self, forward.channel)
        channel.last_queue = forward.last_queue
        self._asking[forward.channel] = forward.req
        self._out[forward.channel] = []
        self.run_guarded(channel, lambda: channel.handle_method(decode_method(forward.method)))
        self.gateway.shards.send()

    def close(self) -> None:
        """The client's connection closed: its channels go, and its exclusive queues."""
        for channel in self.channels.values():
            channel.release()
        self.channels.clear()
        self.gateway.delete_exclusive_queues(self)

    # -- what a Channel calls on its connection ----------------------------------

    def send(self, data: bytes) -> None:
        number = int.from_bytes(data[1:3], "big")  # each write is one whole frame
        self._out.setdefault(number, []).append(data)

    def run_guarded(self, channel: Channel, action) -> None:
        try:
            action()
        except AMQPError as error:
            self._done(channel, error)
            channel.release()
            self.channels.pop(channel.number, None)
            return
        except Exception as error:
            log.error("%s: %s failed", self.name, channel._running, exc_info=error)
            self._done(channel, AMQPError(spec.INTERNAL_ERROR, "internal error"))
            channel.release()
            self.channels.pop(channel.number, None)
            return
        if not channel._waiting:
            self._done(channel, None)

    def _done(self, channel: Channel, error: AMQPError | None) -> None:
        req = self._asking.pop(channel.number, None)
        frames = b"".join(self._out.pop(channel.number, ()))
        if req is None:
            return
        if error is None:
            self._answer(Answer(req, frames, channel.last_queue))
        else:
            self._answer(Answer(req, b"", channel.last_queue, error.code, error.detail,
                                error.class_id, error.method_id))

    def fail(self, error: BaseException) -> None:
        log.error("%s failed", self.name, exc_info=error)

    def close_forced(self, reason: str) -> None:
        pass  # the client's own gateway closes it (its vhost went: the change says so)

    def forget_channel(self, channel: Channel) -> None:
        channel.release()
        self.channels.pop(channel.number, None)

    def schedule_flush(self) -> None:
        pass  # no confirms: a stand-in never publishes

    def hold(self, cause) -> None:
        pass

    def release(self, cause) -> None:
        pass
