"""The asyncio shell around a client connection's sans-IO core
(session/connection.py), as uvicorn wraps h11: the transport reads the socket
into the core and is the core's output; the loop is its clock.

The transport's per-read calls go to the core's own bound methods (get_buffer,
buffer_updated), set on the protocol when it is made, before the transport binds
them (uvloop takes them when the protocol is set): no call through the shell per
read.
"""

from __future__ import annotations

import asyncio

from ..session.connection import Connection
from ..session.ports import Hub


class AMQPProtocol(asyncio.BufferedProtocol):
    def __init__(self, gateway: Hub):
        self.connection = connection = Connection(gateway)
        # The core's bound methods stand in for the protocol's own (deliberately:
        # the type checker objects to assigning a method).
        self.get_buffer = connection.get_buffer  # type: ignore[method-assign,assignment]
        self.buffer_updated = connection.buffer_updated  # type: ignore[method-assign]
        # Bytes handed over rather than read into the buffer (a TLS handshake's
        # early bytes, io/tlshandshake.py) are copied in.
        self.data_received = connection.receive
        self.pause_writing = connection.pause_writing  # type: ignore[method-assign]
        self.resume_writing = connection.resume_writing  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.connection.start(
            transport, asyncio.get_running_loop(), peer=transport.get_extra_info("peername"),
            local=transport.get_extra_info("sockname"),
            tls=transport.get_extra_info("sslcontext") is not None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.connection.connection_lost(exc)
