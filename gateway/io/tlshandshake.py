"""The AMQPS listener's protocol until a client's TLS handshake is done.

asyncio's own TLS servers (asyncio's and uvloop's) drop a failed handshake
without a word outside debug mode; RabbitMQ logs each one. So the listener
accepts plain TCP and runs the handshake here through loop.start_tls, where its
failure is seen; a client that completes it is handed to an AMQPProtocol.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from ..logthrottle import log_client_error

log = logging.getLogger("warren.connection")

HANDSHAKE_TIMEOUT = 5.0  # seconds, RabbitMQ's ssl_handshake_timeout


class TLSHandshake(asyncio.Protocol):
    def __init__(self, make_connection, context: ssl.SSLContext):
        self.make_connection = make_connection  # () -> an AMQPProtocol for the client
        self.context = context
        self._early = bytearray()  # what arrived before start_tls took the transport
        self._upgrading = False
        self._lost = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername") or ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.name = f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"
        # uvloop starts reading after connection_made whatever it is told here, so
        # the client's first bytes may still reach data_received: kept for start_tls.
        transport.pause_reading()
        self.transport = transport
        self.task = asyncio.get_running_loop().create_task(self._handshake())

    def data_received(self, data: bytes) -> None:
        # Before start_tls: the client's hello, held back. After it (the handshake is
        # done, the AMQPProtocol not yet in place): the client's first AMQP bytes.
        self._early += data
        if not self._upgrading:
            self.transport.pause_reading()

    def connection_lost(self, exc) -> None:
        self._lost = True

    async def _handshake(self) -> None:
        loop = asyncio.get_running_loop()
        upgrade = loop.create_task(loop.start_tls(
            self.transport, self, self.context, server_side=True,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT))
        # One turn: start_tls has put its TLS protocol on the transport and scheduled
        # its start; the bytes read before go to it right after, before it reads more.
        await asyncio.sleep(0)
        self._upgrading = True
        if self._early:
            loop.call_soon(feed, self.transport.get_protocol(), bytes(self._early))
            self._early.clear()
        try:
            tls = await upgrade
        except (OSError, asyncio.TimeoutError) as error:
            self._log_failure(error)
            self.transport.abort()
            return
        if self._lost:
            return
        connection = self.make_connection()
        tls.set_protocol(connection)
        connection.connection_made(tls)
        if self._early:
            connection.data_received(bytes(self._early))

    def _log_failure(self, error: BaseException) -> None:
        if isinstance(error, ssl.SSLError):  # OpenSSL's words without its source position
            reason = (error.reason or str(error)).lower().replace("_", " ")
        elif isinstance(error, (asyncio.TimeoutError, ConnectionAbortedError)):
            reason = f"no handshake within {HANDSHAKE_TIMEOUT:g}s"
        else:
            reason = str(error) or type(error).__name__
        # A client gone without a word is a health check to RabbitMQ: logged at debug.
        quiet = isinstance(error, (ConnectionResetError, BrokenPipeError)) or (
            isinstance(error, ssl.SSLError) and "EOF" in str(error))
        if quiet:
            log.debug("Error on AMQP connection (%s):\nTLS handshake failed: %s", self.name,
                      reason, extra={"connection": self.name})
        else:
            log_client_error(asyncio.get_running_loop(), "TLS handshake", logging.ERROR,
                             "Error on AMQP connection (%s):\nTLS handshake failed: %s",
                             self.name, reason, extra={"connection": self.name})


def feed(protocol: asyncio.BaseProtocol, data) -> None:
    """Give `data` to `protocol` as its transport would: a buffered protocol (TLS
    protocols, AMQPProtocol) gets it read into the room it offers, which stays
    exported until buffer_updated returns and is let go before more is asked for."""
    if isinstance(protocol, asyncio.BufferedProtocol) or hasattr(protocol, "get_buffer"):
        rest = memoryview(data)
        while rest:
            room = protocol.get_buffer(len(rest))
            size = min(len(room), len(rest))
            room[:size] = rest[:size]
            protocol.buffer_updated(size)
            del room
            rest = rest[size:]
    else:
        protocol.data_received(data)
