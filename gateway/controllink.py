"""The link between gateway 0 and another gateway process: msgpack messages,
each behind its 4-byte length, over a Unix socket pair, in order both ways.

Gateway 0 sends the catalogue's changes (`Changes`, answered with `Applied`)
and the answers to declarations; the other gateway forwards its clients'
declarations (`Forward`, answered with `Answer`), says when a connection
that declared through it has closed (its exclusive queues go with it), shows
its connections to the management API (`Connections`, `CloseConnection`) and
asks the broker's login throttle about failed logins (`LoginFailed`, `LoginTurn`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Callable, Union

import msgspec

from warren.shards import records as r

from .replication import Change
from .snapshots import ConnectionInfo

log = logging.getLogger("warren")

_length = struct.Struct("<I")


class _Message(msgspec.Struct, array_like=True, tag=True):
    pass


class Serving(_Message, tag=1):
    """A gateway accepts connections now (sent once it has the catalogue)."""

    gateway: int


class Changes(_Message, tag=2):
    seq: int  # the last change's number: changes are numbered from 1, broker-wide
    changes: list[Change]


class Applied(_Message, tag=3):
    seq: int


class Forward(_Message, tag=4):
    """A client's declaration (exchange.*, queue.* but purge), for gateway 0 to run
    as if its connection were there."""

    req: int
    connection: int  # the connection's id (exclusive queues' owner)
    user: str
    vhost: str
    channel: int  # the channel's number
    method: bytes  # the method frame's payload
    last_queue: str  # the channel's last declared queue ("" in queue.bind means it)


class Answer(_Message, tag=5):
    req: int
    frames: bytes = b""  # the reply frames to send the client (none for nowait)
    last_queue: str = ""
    code: int = 0  # an error's reply code (0: no error) ...
    detail: str = ""  # ... its text (after the code's name) and the method it names
    class_id: int = 0
    method_id: int = 0


class ConnectionClosed(_Message, tag=6):
    connection: int


class ListConnections(_Message, tag=10):
    """Gateway 0 asks for another gateway's connections (a management request)."""


class Connections(_Message, tag=7):
    """Another gateway's connections as they are now, for the management API and
    the metrics."""

    ids: list[int]
    infos: list[ConnectionInfo]
    totals: dict[str, int]  # its Totals since it started


class CloseConnection(_Message, tag=8):
    """Close a connection (the management API's DELETE), 320 with `reason`."""

    connection: int
    reason: str


class Reply(_Message, tag=9):
    """A reply published on one gateway to a direct reply-to address of another
    (`gateway`): gateway 0 passes it on, the other delivers it. A mandatory one
    names its publisher's channel (`origin`, with its number for it, `ask`),
    which hears back whether it was delivered (`ReplyOutcome`)."""

    gateway: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    origin: int = 0
    ask: int = 0


class ReplyOutcome(_Message, tag=16):
    """Was a mandatory Reply delivered? `returned`: its requester had gone."""

    origin: int
    ask: int
    returned: bool


class Admit(_Message, tag=11):
    """May a connection open (channels 0), or open its `channels`th channel? Gateway 0
    counts it against the vhost's and user's limits over every gateway, and holds
    the count until ConnectionClosed; answered with `Admitted`."""

    req: int
    connection: int
    user: str
    vhost: str
    channels: int


class Admitted(_Message, tag=12):
    req: int
    refusal: str = ""  # why not ("": admitted)


class ChannelCount(_Message, tag=13):
    """A connection's channels now (for the limits gateway 0 counts)."""

    connection: int
    channels: int


class AskReplyConsumer(_Message, tag=14):
    """Gateway 0 asks the gateway a direct reply-to address names whether its
    channel still consumes (a passive queue.declare of the address); answered
    with `ReplyConsumer`."""

    req: int
    address: str


class ReplyConsumer(_Message, tag=15):
    req: int
    consuming: bool


class LoginTurn(_Message, tag=20):
    """A login from an address the root throttles: when may its password be
    checked? Answered with `LoginWait`."""

    req: int
    address: str


class LoginFailed(_Message, tag=21):
    """A refused login, for the root's throttle to count; answered with `LoginWait`
    (how long to delay the refusal). `at_turn`: it waited its turn."""

    req: int
    address: str
    at_turn: bool


class LoginWait(_Message, tag=22):
    req: int
    wait: float  # seconds; -1: refuse the login unchecked
    throttled: bool  # the root throttles the address (now)


Message = Union[Admit, Admitted, ChannelCount, Serving, Changes, Applied, Forward, Answer,
                ConnectionClosed, ListConnections, Connections, CloseConnection, Reply,
                AskReplyConsumer, ReplyConsumer, ReplyOutcome, LoginTurn, LoginFailed,
                LoginWait]
_decode = msgspec.msgpack.Decoder(Message).decode
_encode = msgspec.msgpack.Encoder().encode


class ControlLink(asyncio.Protocol):
    def __init__(self, on_message: Callable, on_lost: Callable):
        self._on_message = on_message  # (message) -> None
        self._on_lost = on_lost  # () -> None
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._on_lost()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _length.unpack_from(buffer, start)
            if len(buffer) - start - 4 < size:
                break
            message = _decode(buffer[start + 4:start + 4 + size])
            start += 4 + size
            self._on_message(message)
        del buffer[:start]

    def send(self, message) -> None:
        if self.transport is not None:
            data = _encode(message)
            self.transport.write(_length.pack(len(data)) + data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ShardDown(_Message, tag=17):
    """A shard died: the gateway drops what it had there (as the root does for
    its own clients) until the restarted shard's rings come."""

    shard: int


class ShardRings(_Message, tag=18):
    """A restarted shard's rings for the gateway; their four doorbells come with
    the message (SCM_RIGHTS), in the order `ring_fds` lists them."""

    shard: int
    rings: r.RingPair


class Client(_Message, tag=19):
    """A client's TCP connection, accepted by the root: its socket comes with the
    message; `tls`: it came to the AMQPS port."""

    tls: bool


Handed = Union[ShardDown, ShardRings, Client]
_decode_handed = msgspec.msgpack.Decoder(Handed).decode


def ring_fds(rings: r.RingPair) -> list[int]:
    return [rings.commands.data_fd, rings.commands.space_fd, rings.events.data_fd,
            rings.events.space_fd]


class Handover:
    """What the root hands a gateway with descriptors in it: a client's socket, a
    restarted shard's rings (and before them the news that it died). Over a socket
    pair of its own (SOCK_SEQPACKET: each message arrives whole, with the
    descriptors it carries, in order)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)  # a gateway that cannot take a message is not waited for
        self.sock = sock

    @staticmethod
    def pair() -> tuple[socket.socket, socket.socket]:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def send(self, message: Handed, fds: list[int] = ()) -> bool:
        """False if the gateway cannot take it now (it is stuck or gone)."""
        if type(message) is ShardRings:
            fds = ring_fds(message.rings)
        try:
            socket.send_fds(self.sock, [_encode(message)], list(fds))
        except OSError:
            return False
        return True

    def receive(self) -> tuple[Handed, list[int]] | None:
        """The next message and the descriptors it brought (a ShardRings's are put
        in its specs); None if none waits (EOFError: the root is gone)."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 4)
        except BlockingIOError:
            return None
        if not data:
            raise EOFError
        message = _decode_handed(data)
        if type(message) is ShardRings:
            commands, events = message.rings.commands, message.rings.events
            commands.data_fd, commands.space_fd, events.data_fd, events.space_fd = fds
        return message, fds

    def close(self) -> None:
        self.sock.close()
