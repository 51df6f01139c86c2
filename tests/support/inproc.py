"""The broker in-process, for protocol tests that run in milliseconds.

A Gateway with one real shard process runs in an asyncio loop of the test
process; each Client is a real gateway.connection.Connection over a FakeTransport,
driven through the project's codec. Client mirrors tests/rawclient.py's RawClient
(send_method, next_method, handshake, open_channel, ...), so a protocol test reads
the same in-process as over TCP; its waits run the loop until the answer is there
or a deadline passes, so they feel synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import traceback

from warren.gateway.amqp import methods as m
from warren.gateway.amqp import spec
from warren.gateway.amqp.frames import FrameReader
from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.io.tlshandshake import feed
from warren.gateway.session.connection import Connection
from warren.gateway.session.lifecycle import CLOSE_OK_TIMEOUT, OPEN

from .memtransport import MemoryTransport
from .rawclient import Conversation

TIMEOUT = 10.0  # a shard round trip takes far less; longer means a wedge


class FakeTransport(MemoryTransport):
    """What Connection uses of an asyncio transport; closing calls connection_lost
    on the next loop turn, as a socket transport does."""

    def __init__(self, protocol: Connection, peer: tuple = ("127.0.0.1", 40000)):
        super().__init__(peer)
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.writes_after_close = 0

    def write(self, data) -> None:
        if self.closed:
            self.writes_after_close += 1
            return
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def is_closing(self) -> bool:
        return self.closed


async def until(condition, timeout: float) -> bool:
    """Run the loop until `condition()` holds (True) or the deadline passes (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    spins = 0
    while not condition():
        if loop.time() > deadline:
            return False
        spins += 1
        await asyncio.sleep(0 if spins < 200 else 0.001)
    return True


class InProcessGateway:
    """A Gateway with one shard process in an asyncio loop of its own, and a record
    of what should never happen: an exception reaching the loop's handler, an
    ERROR logged (the broker's safety nets turn a bug into a logged 541 close)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gateway: Gateway):
        self.loop = loop
        self.gateway = gateway
        # The loop's clock runs with time.monotonic() but can be moved on (advance),
        # so a test need not wait out the broker's timers in real time.
        self._ahead = 0.0
        loop.time = lambda: time.monotonic() + self._ahead
        self.errors: list[str] = []
        self.current = "setup"  # what ran when an error came, for its report
        self._clients: list[Client] = []
        self._errors_before = 0
        loop.set_exception_handler(self._loop_error)

    def _log_error(self, record: logging.LogRecord) -> None:
        # Not the errors a client made, which RabbitMQ logs at error level too: a
        # connection's lines without a traceback and not about a 541.
        if (record.name == "warren.connection" and not record.exc_info
                and getattr(record, "reply_code", None) != spec.INTERNAL_ERROR):
            return
        text = f"during {self.current}: logged {record.getMessage()}"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.errors.append(text)

    def _loop_error(self, loop, context: dict) -> None:
        error = context.get("exception")
        text = "".join(traceback.format_exception(error)) if error else ""
        self.errors.append(f"during {self.current}: {context.get('message')}\n{text}")

    def run(self, condition, timeout: float = TIMEOUT) -> bool:
        """Run the loop until `condition()` holds (True) or the deadline passes."""
        return self.loop.run_until_complete(until(condition, timeout))

    def advance(self, seconds: float) -> None:
        """Move the loop's clock on: timers due by then (close-ok timeouts, the
        login throttle's delays) run now."""
        self._ahead += seconds
        self.loop.run_until_complete(asyncio.sleep(0))

    def quiet(self, connections=None) -> bool:
        """No shard request or batch in flight, and none of `connections` (all by
        default) has a channel waiting for a shard or output to flush."""
        return (not any(conn._flush_scheduled or any(
                    ch._waiting and not ch.closed for ch in conn.channels.values())
                    for conn in (self.gateway.registry.connections if connections is None else connections))
                and not any(link._waiters or link._batch for link in self.gateway.shards))

    def settle(self, timeout: float = TIMEOUT) -> None:
        """Run the loop until the broker is quiet."""
        assert self.run(self.quiet, timeout), f"the broker did not settle within {timeout}s"

    def client(self) -> "Client":
        """A new client connection, hung up by end_test."""
        client = Client(self)
        self._clients.append(client)
        return client

    def end_test(self) -> list[str]:
        """Hang up the test's clients; the errors recorded since begin_test."""
        clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        return self.errors[self._errors_before:]

    def begin_test(self, name: str) -> None:
        self.current = name
        self._errors_before = len(self.errors)


@contextlib.contextmanager
def running_gateway(data_dir, quiet: bool = False):
    """An InProcessGateway over `data_dir`, stopped at the end of the block. `quiet`
    silences the broker's logs below ERROR (a fuzzer's refused logins by the thousand)."""
    logger = logging.getLogger("warren")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    loop = asyncio.new_event_loop()
    os.makedirs(data_dir, exist_ok=True)  # the caller's to create, as gateway/server.py does
    gateway = Gateway(Config(data_dir=str(data_dir), shards=1, disk_free_limit=0,
                             stats_interval=60.0, store_map_size=1 << 30, memory_limit=0))
    loop.run_until_complete(gateway.start())
    server = InProcessGateway(loop, gateway)
    recorder = logging.Handler(logging.ERROR)
    recorder.emit = server._log_error
    logger.addHandler(recorder)
    try:
        yield server
    finally:
        logger.removeHandler(recorder)
        loop.run_until_complete(gateway.stop())
        loop.close()
        logger.setLevel(level)


_peers = itertools.count(1)


class Client(Conversation):
    """A Conversation (tests/rawclient.py) with an InProcessGateway: a real
    Connection over a FakeTransport."""

    def __init__(self, server: InProcessGateway, peer: tuple | None = None):
        self.server = server
        self.conn = Connection(server.gateway)
        # A loopback address of its own: the broker throttles refused logins per address.
        n = next(_peers)
        self.transport = FakeTransport(
            self.conn, peer or (f"127.1.{n >> 8 & 255}.{n & 255}", 40000 + n % 20000))
        self.reader = FrameReader(1 << 30)
        self._seen = 0

        async def connect() -> None:
            self.conn.start(self.transport, asyncio.get_running_loop(), self.transport.peer,
                            self.transport.get_extra_info("sockname"))
        server.loop.run_until_complete(connect())

    # -- input to the broker ---------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Hand bytes to the connection as its socket would: in the loop, read into
        the room it offers, which stays exported while the connection handles them
        (as uvloop holds it: a resize there fails). Input buffered while the broker
        holds reading is read when it resumes."""
        async def received() -> None:
            feed(self.conn, data)
        if not self.transport.closed:
            self.server.loop.run_until_complete(received())

    # -- output of the broker ----------------------------------------------------------

    def _frame_ready(self):
        if len(self.transport.written) > self._seen:
            self.reader.receive_data(bytes(self.transport.written[self._seen:]))
            self._seen = len(self.transport.written)
        frame = self.reader.next_frame()
        if frame is not None:
            self._frame = frame
            return True
        if self.transport.closed:  # and everything it wrote is read
            self._frame = None
            return True
        return False

    def next_frame(self, timeout: float | None = None):
        """The next frame, or None once the broker closed the connection."""
        timeout = timeout or TIMEOUT
        if not self.server.run(self._frame_ready, timeout):
            raise TimeoutError(f"no frame from the broker within {timeout}s")
        return self._frame

    def pending(self) -> list:
        """Once the broker has settled (nothing in flight): the frames it wrote that
        were not read yet. For asserting that nothing came."""
        self.server.settle()
        taken = []
        while self._frame_ready() and self._frame is not None:
            taken.append(self._frame)
        return taken

    def expect_connection_close(self, code: int) -> m.ConnectionClose:
        """The broker's connection.close with `code`; answered with close-ok, after
        which the broker hangs up. Returns the close for its text."""
        close = self.expect(0, m.ConnectionClose)
        assert close.reply_code == code, close
        self.answer_close()
        return close

    def answer_close(self) -> None:
        """Answer the broker's connection.close; it must hang up (at once, or once
        its close-ok timeout has passed where it can no longer read frames)."""
        self.send_method(0, m.ConnectionCloseOk())
        self.server.settle()
        if not self.transport.closed:
            self.server.advance(CLOSE_OK_TIMEOUT)
        assert self.next_frame(timeout=1.0) is None

    def close(self) -> None:
        """Close the connection (politely if it is open), hang up as a client closing
        its socket, and let the broker clean up."""
        if self.conn.state == OPEN and not self.transport.closed:
            self.send_method(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
            while (got := self.next_method()) is not None and got != (0, m.ConnectionCloseOk()):
                pass  # what the broker sent before its close-ok
        if not self.transport.closed:
            async def hang_up() -> None:
                self.transport.close()
            self.server.loop.run_until_complete(hang_up())
        self.server.run(lambda: self.conn not in self.server.gateway.registry.connections)


__all__ = ["Client", "FakeTransport", "InProcessGateway", "running_gateway", "until"]
