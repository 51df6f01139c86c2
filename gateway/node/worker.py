"""A gateway process: `python -m warren.gateway.node.worker`, its FollowerSpec on
stdin, started (and restarted) by the root when there are several gateways
(followers.py).

It serves the clients the root accepts and hands it (controllink.Handover) and
talks to every shard over rings of its own, so publishing, consuming and acks
never pass through another process. The catalogue it routes with is the root's,
replayed from the control link (changes.py); declarations are forwarded
there (declaring.Declaring.forward). It is handed clients only once it holds the
whole catalogue, and stops when the root closes the control link (or is gone):
the stop signals of the broker's process group are the root's (children.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket

import msgspec

from warren.shards import logsetup
from warren.shards.malloc import keep_freed_memory

from ..broker import changes
from ..broker.peermessages import (
    Admit,
    Admitted,
    Answer,
    Applied,
    AskReplyConsumer,
    Changes,
    ChannelCount,
    Client,
    CloseConnection,
    ClusterView,
    ConnectionClosed,
    Connections,
    ListConnections,
    LoginWait,
    Reply,
    ReplyConsumer,
    ReplyOutcome,
    Serving,
    ShardDown,
)
from ..config import Config
from ..io.children import read_spec
from ..io.process import Gateway
from ..io.protocol import AMQPProtocol
from ..io.tlshandshake import TLSHandshake
from .controllink import ControlLink, Handover
from .gateways import FollowerSpec
from .root import close_connections, own_listener, tls_context

log = logging.getLogger("warren")


class Leader:
    """This gateway's end of the control link to gateway 0."""

    def __init__(self, gateway: Gateway, lost: asyncio.Event):
        self.gateway = gateway
        self.ready = asyncio.Event()  # the whole catalogue is here
        self._lost = lost
        self._waiters: dict = {}
        self._next_req = 0
        self.peers = None  # in a cluster: the links to other nodes' shards
        self.view: ClusterView | None = None  # the last one the root sent
        self.started = False  # the shards' links are here: other nodes' go after them
        self.link = ControlLink(self._message, lost.set)

    def request(self, make, answered) -> None:
        """Send `make(req)` to gateway 0; `answered(answer)` runs when it answers."""
        if self.link.transport is None:
            return
        self._next_req += 1
        self._waiters[self._next_req] = answered
        self.link.send(make(self._next_req))

    def take_view(self) -> None:
        """(Imported here: a lone node's gateways never need the cluster.)"""
        from ..cluster.peers import take_view
        if self.view is not None:
            self.peers = take_view(self.gateway, self.peers, self.view)

    def connection_closed(self, conn) -> None:
        """A client's connection closed: gateway 0 stops counting it and deletes its
        exclusive queues (told once)."""
        if conn.admitted:
            conn.admitted = False
            self.link.send(ConnectionClosed(conn.id))

    def admit(self, conn, vhost: str, channels: int, answered) -> None:
        """Have gateway 0 count a connection (channels 0) or its new channel against
        the limits; `answered(refusal)` ("" if admitted)."""
        conn.admitted = True
        self.request(lambda req: Admit(req, conn.id, conn.user, vhost, channels),
                     lambda reply: answered(reply.refusal))

    def channels_changed(self, conn) -> None:
        if conn.admitted:
            self.link.send(ChannelCount(conn.id, len(conn.channels)))

    def _message(self, message) -> None:
        kind = type(message)
        if kind is Changes:
            gateway = self.gateway
            for change in message.changes:
                try:
                    changes.apply(gateway.catalogue, gateway.access, gateway.registry.owner_of,
                                  change)
                except Exception:  # a bug: log it, keep the rest of the catalogue right
                    log.exception("gateway %d: applying %s failed", self.gateway.index, change)
            self.link.send(Applied(message.seq))
            self.ready.set()
        elif kind is Answer or kind is Admitted or kind is LoginWait:
            answered = self._waiters.pop(message.req, None)
            if answered is not None:
                answered(message)
        elif kind is ClusterView:
            self.view = message
            if self.started:
                self.take_view()
        elif kind is Reply:
            self.gateway.deliver_reply(message)
        elif kind is ReplyOutcome:
            self.gateway.reply_outcome(message)
        elif kind is CloseConnection:
            conn = next((c for c in self.gateway.registry.connections
                         if c.id == message.connection), None)
            if conn is not None:
                conn.close_forced(message.reason)
        elif kind is AskReplyConsumer:
            consuming = self.gateway.reply_channel(message.address) is not None
            self.link.send(ReplyConsumer(message.req, consuming))
        elif kind is ListConnections:
            opened = [c for c in self.gateway.registry.connections if c.vhost is not None]
            self.link.send(Connections([c.id for c in opened], [c.snapshot() for c in opened],
                                       self.gateway.totals.as_dict()))


_taking: set[asyncio.Task] = set()  # handed clients whose transports are being made


def take_handed(gateway: Gateway, handover: Handover, tls) -> None:
    """What the root hands over: a client's socket, accepted there; or news of a
    shard that died (its consumers here are cancelled, what waited for it fails)
    or runs again on new rings, the clients staying connected either way."""
    loop = asyncio.get_running_loop()
    try:
        while (handed := handover.receive()) is not None:
            message, fds = handed
            kind = type(message)
            if kind is Client:
                client = socket.socket(fileno=fds[0])
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                make = (lambda: TLSHandshake(lambda: AMQPProtocol(gateway), tls)) \
                    if message.tls else (lambda: AMQPProtocol(gateway))
                # Held until done: the loop keeps only a weak reference to a task.
                task = loop.create_task(loop.connect_accepted_socket(make, sock=client))
                _taking.add(task)
                task.add_done_callback(_taking.discard)
            elif kind is ShardDown:
                gateway.shards.lost(message.shard)
            else:
                gateway.shards.restarted(message.shard, message.rings)
    except EOFError:  # the root is gone; the control link's loss stops this gateway
        loop.remove_reader(handover.sock.fileno())


async def serve(spec: FollowerSpec) -> None:
    keep_freed_memory()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()  # the control link closed
    settings = msgspec.convert(spec.config, Config)
    gateway = Gateway(settings, spec.index)
    leader = gateway.leader = gateway.access.root = Leader(gateway, stop)
    await loop.connect_accepted_socket(lambda: leader.link,
                                       sock=socket.socket(fileno=spec.control_fd))
    await gateway.start(spec.rings)
    leader.started = True
    leader.take_view()
    tls = tls_context(settings) if settings.tls_enabled else None
    handover = Handover(socket.socket(fileno=spec.handover_fd))
    loop.add_reader(spec.handover_fd, take_handed, gateway, handover, tls)
    await _either(leader.ready, stop)
    if stop.is_set():  # the root stops before this one got going
        await gateway.stop()
        return
    servers = await own_listener(gateway, settings)
    for server in servers:
        await server.start_serving()
    leader.link.send(Serving(spec.index))
    log.info("gateway %d started (pid %d)", spec.index, os.getpid())
    await stop.wait()
    await close_connections(gateway, servers)
    await gateway.stop()


async def _either(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()


def main() -> None:
    spec = msgspec.json.decode(read_spec(), type=FollowerSpec)
    settings = msgspec.convert(spec.config, Config)
    logsetup.configure(settings.log_settings(), f"gateway-{spec.index}")
    import uvloop
    uvloop.run(serve(spec))
    # Stopped: its clients are closed and its log written. Tearing the interpreter
    # down (freeing every object) would add a tenth of a second to the broker's stop.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
