"""The gateway's CPU time per message, measured in-process.

`python -m warren.loadtest.probes.gatewaycost` runs a Gateway with one real shard
process in this process's loop and drives one real Connection over an in-memory
transport with pipelined publishes (100-byte bodies, one queue) and consumers.
It reports this process's CPU time (time.process_time) per message for each
path: the shard's work is in its own process and not counted, and the client's
bytes are built before the clock starts. CPU time, not wall time, so the numbers
hold on a loaded machine. `--profile` prints cProfile's top functions by self time.

Paths: publish (transient / persistent, with and without confirms; socket bytes
to ring records) and deliver (autoack, manual ack; ring events to socket bytes),
each with every read and event batch as full as it gets; and the round trip
(autoack, manual ack), one message at a time: one publish per read, its delivery
waited for before the next, as at a steady rate a broker's loop turns (a read,
a shard's answer) carry a message or two each. The first set shows the cost of a
message, the round trip the cost of the loop turns it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging
import pstats
import tempfile
import time

import uvloop

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.properties import BasicProperties, encode_properties
from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.io.tlshandshake import feed
from warren.gateway.session.connection import Connection
from warren.gateway.session.lifecycle import OPEN

QUEUE = "gatewaycost"
BODY = b"x" * 100
CHUNK = 65536  # bytes read into the connection at once, as uvloop's socket read would
TIMEOUT = 120.0


class Transport(asyncio.Transport):
    """What Connection uses of a socket transport. Output is counted, not kept;
    while reading is not paused, `feed` hands the connection the next chunk of
    pipelined input each loop turn, as a socket with a busy client would."""

    def __init__(self, conn: Connection):
        super().__init__()
        self.conn = conn
        self.written = 0
        self.paused = False
        self.closed = False
        self.input = b""
        self.offset = 0
        self.feeding = False
        self.loop = asyncio.get_running_loop()
        self.waiter: asyncio.Future | None = None  # the next write resolves it

    def write(self, data) -> None:
        self.written += len(data)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def give(self, data: bytes) -> None:
        """Queue `data` as input; it is read as reading allows."""
        self.input = self.input[self.offset:] + data
        self.offset = 0
        self._schedule()

    def _schedule(self) -> None:
        if not self.feeding and not self.paused and self.offset < len(self.input):
            self.feeding = True
            self.loop.call_soon(self._feed)

    def _feed(self) -> None:
        self.feeding = False
        if self.paused or self.offset >= len(self.input):
            return
        chunk = memoryview(self.input)[self.offset:self.offset + CHUNK]
        self.offset += len(chunk)
        feed(self.conn, chunk)
        self._schedule()

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        self._schedule()

    def is_reading(self) -> bool:
        return not self.paused

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.conn.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 5999)}.get(
            name, default)


def method(channel: int, meth) -> bytes:
    return frames.method_frame(channel, meth)


def publishes(count: int, persistent: bool) -> bytes:
    props = encode_properties(BasicProperties(delivery_mode=2 if persistent else 1))
    one = frames.content_frames(1, m.encode_method(m.BasicPublish(exchange="", routing_key=QUEUE)),
                                60, props, BODY, 131072)
    return one * count


class Bench:
    def __init__(self, loop: asyncio.AbstractEventLoop, gateway: Gateway):
        self.loop = loop
        self.gateway = gateway
        self.profiler: cProfile.Profile | None = None  # enabled around measured work only

    def measure(self, conn: Connection, transport: Transport, data: bytes, done) -> float:
        """CPU seconds this process spent from giving `data` to the connection until
        `done()`; then the connection, checked to have stayed open, is hung up."""
        if self.profiler is not None:
            self.profiler.enable()
        start = time.process_time()
        transport.give(data)
        self.run(done)
        spent = time.process_time() - start
        if self.profiler is not None:
            self.profiler.disable()
        if conn.state != OPEN or conn.channels[1].closing:
            raise RuntimeError("the broker closed the connection or channel during the run")
        transport.close()
        self.run(lambda: conn not in self.gateway.registry.connections)
        return spent

    def run(self, condition, timeout: float = TIMEOUT) -> None:
        async def wait() -> None:
            deadline = self.loop.time() + timeout
            while not condition():
                if self.loop.time() > deadline:
                    raise TimeoutError("the gateway did not finish in time")
                await asyncio.sleep(0.002)  # a poll, not a spin: CPU stays the gateway's
        self.loop.run_until_complete(wait())

    def connect(self) -> tuple[Connection, Transport]:
        async def made() -> tuple[Connection, Transport]:
            conn = Connection(self.gateway)
            transport = Transport(conn)
            conn.start(transport, self.loop, ("127.0.0.1", 40000), ("127.0.0.1", 5999))
            return conn, transport
        conn, transport = self.loop.run_until_complete(made())
        transport.give(frames.PROTOCOL_HEADER + b"".join((
            method(0, m.ConnectionStartOk(
                client_properties={"capabilities": {"publisher_confirms": True}},
                mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US")),
            method(0, m.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
            method(0, m.ConnectionOpen(virtual_host="/")),
            method(1, m.ChannelOpen()))))
        self.run(lambda: 1 in conn.channels)
        return conn, transport

    def handled(self, conn: Connection, transport: Transport) -> bool:
        """Every byte given was read and handled, and no shard work is in flight."""
        return (transport.offset >= len(transport.input) and not conn.reader.buffered
                and self.quiet())

    def quiet(self) -> bool:
        return not any(link._unreturned or link._batch or link._waiters
                       for link in self.gateway.shards)

    def declare(self, conn, transport, durable: bool) -> None:
        transport.give(method(1, m.QueueDelete(queue=QUEUE)) + method(1, m.QueueDeclare(
            queue=QUEUE, durable=durable)))
        self.run(lambda: QUEUE in conn.vhost.queues and self.quiet()
                 and not conn.channels[1]._waiting)

    def publish(self, count: int, persistent: bool, confirm: bool) -> float:
        """CPU seconds the gateway spent taking `count` publishes to the shard."""
        conn, transport = self.connect()
        self.declare(conn, transport, durable=persistent)
        channel = conn.channels[1]
        if confirm:
            transport.give(method(1, m.ConfirmSelect()))
            self.run(lambda: channel.confirms is not None)
        data = publishes(count, persistent)

        def done() -> bool:  # and every confirm resolved and sent
            return self.handled(conn, transport) and (not confirm or not (
                channel.confirms.outstanding or channel.confirms._resolved))
        return self.measure(conn, transport, data, done)

    def deliver(self, count: int, no_ack: bool) -> float:
        """CPU seconds the gateway spent delivering `count` queued messages."""
        conn, transport = self.connect()
        self.declare(conn, transport, durable=False)
        transport.give(publishes(count, False))
        self.run(lambda: self.handled(conn, transport))
        channel = conn.channels[1]
        acked = 0
        # The client's acks, built before the clock starts: one per delivery.
        acks = [method(1, m.BasicAck(delivery_tag=tag)) for tag in range(1, count + 1)]

        def done() -> bool:
            nonlocal acked
            delivered = channel.next_tag - 1
            if not no_ack and delivered > acked:
                transport.give(b"".join(acks[acked:delivered]))
                acked = delivered
            if no_ack:
                return delivered >= count
            return acked >= count and not len(channel.unacked) and self.quiet()
        return self.measure(conn, transport,
                            method(1, m.BasicQos(prefetch_count=0 if no_ack else 1000))
                            + method(1, m.BasicConsume(queue=QUEUE, no_ack=no_ack)), done)

    def round_trip(self, count: int, no_ack: bool) -> float:
        """CPU seconds the gateway spent on `count` messages published one at a time,
        each delivered (and, with manual acks, acked with the next publish) before
        the next goes."""
        conn, transport = self.connect()
        self.declare(conn, transport, durable=False)
        channel = conn.channels[1]
        transport.give(method(1, m.BasicQos(prefetch_count=0 if no_ack else 1000))
                       + method(1, m.BasicConsume(queue=QUEUE, no_ack=no_ack)))
        self.run(lambda: channel.consumers and not channel._waiting and self.quiet())
        one = publishes(1, False)
        # The client's input, built before the clock starts: a publish, after the
        # first one with the ack of the message before it.
        inputs = [one] + [one if no_ack else method(1, m.BasicAck(delivery_tag=tag)) + one
                          for tag in range(1, count)]

        async def ping_pong() -> None:
            for sent, data in enumerate(inputs, 1):
                transport.give(data)
                while channel.next_tag <= sent:  # not delivered yet: wait for a write
                    transport.waiter = self.loop.create_future()
                    await transport.waiter
        if self.profiler is not None:
            self.profiler.enable()
        start = time.process_time()
        self.loop.run_until_complete(asyncio.wait_for(ping_pong(), TIMEOUT))
        spent = time.process_time() - start
        if self.profiler is not None:
            self.profiler.disable()
        if conn.state != OPEN or channel.next_tag != count + 1:
            raise RuntimeError("the broker closed the connection or missed a delivery")
        transport.close()
        self.run(lambda: conn not in self.gateway.registry.connections)
        return spent


# name -> CPU seconds per message for n messages (a round trip, one at a time,
# runs a tenth of them: each waits for a shard's answer)
SCENARIOS = {
    "publish-transient": lambda b, n: b.publish(n, persistent=False, confirm=False) / n,
    "publish-transient-confirm": lambda b, n: b.publish(n, persistent=False, confirm=True) / n,
    "publish-persistent": lambda b, n: b.publish(n, persistent=True, confirm=False) / n,
    "publish-persistent-confirm": lambda b, n: b.publish(n, persistent=True, confirm=True) / n,
    "deliver-autoack": lambda b, n: b.deliver(n, no_ack=True) / n,
    "deliver-manual-ack": lambda b, n: b.deliver(n, no_ack=False) / n,
    "round-trip-autoack": lambda b, n: b.round_trip(n // 10, no_ack=True) / (n // 10),
    "round-trip-manual-ack": lambda b, n: b.round_trip(n // 10, no_ack=False) / (n // 10),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.gatewaycost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario; the best counts")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--profile", action="store_true",
                        help="also print cProfile's top functions by self time per scenario")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    logging.getLogger("warren").setLevel(logging.ERROR)  # hang-ups are not news here
    loop = uvloop.new_event_loop()  # as `warren serve` runs
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory(prefix="warren-gatewaycost-") as data_dir:
        gateway = Gateway(Config(data_dir=data_dir, shards=1, disk_free_limit=0,
                                 stats_interval=60.0, store_map_size=1 << 31, memory_limit=0))
        loop.run_until_complete(gateway.start())
        bench = Bench(loop, gateway)
        try:
            for name in args.only or SCENARIOS:
                runs = [SCENARIOS[name](bench, args.messages) for _ in range(args.repeat)]
                best = min(runs)
                print(f"{name:28} {best * 1e6:7.2f} µs/msg gateway CPU "
                      f"(best of {args.repeat}: " +
                      ", ".join(f"{r * 1e6:.2f}" for r in runs) + ")",
                      flush=True)
                if args.profile:
                    # CPU time, not wall time: a loaded machine's waits are not costs.
                    profiler = bench.profiler = cProfile.Profile(time.process_time)
                    SCENARIOS[name](bench, args.messages)
                    bench.profiler = None
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
                    print(_trim(out.getvalue()), flush=True)
        finally:
            loop.run_until_complete(gateway.stop())
            loop.close()


def _trim(report: str) -> str:
    """pstats' table without its preamble."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(line for line in lines[start:] if line.strip())


if __name__ == "__main__":
    main()
