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
from typing import Callable

from warren.shards import records as r

from ..broker.peermessages import (
    Handed,
    ShardRings,
    decode_handed,
    decode_message,
    encode,
)

log = logging.getLogger("warren")

_length = struct.Struct("<I")


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
            message = decode_message(buffer[start + 4:start + 4 + size])
            start += 4 + size
            self._on_message(message)
        del buffer[:start]

    def send(self, message) -> None:
        if self.transport is not None:
            data = encode(message)
            self.transport.write(_length.pack(len(data)) + data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


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
            socket.send_fds(self.sock, [encode(message)], list(fds))
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
        message = decode_handed(data)
        if type(message) is ShardRings:
            commands, events = message.rings.commands, message.rings.events
            commands.data_fd, commands.space_fd, events.data_fd, events.space_fd = fds
        return message, fds

    def close(self) -> None:
        self.sock.close()
