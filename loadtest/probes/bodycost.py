"""CPU time per MB of large bodies through the gateway and one real shard.

    python -m warren.loadtest.probes.bodycost [--size 65536] [--count 3000] [--persistent]
                                       [--profile gateway.prof]

A Gateway runs in this process's event loop with one shard process. One client
connection publishes `count` messages of `size` bytes to a queue, another consumes
them with manual acks (multiple=true every ACK_EVERY), both over in-memory
transports: input is read into the connection's buffer as its socket would (up to
READ_SIZE at a time, in reads the size of the room it offers), output is counted
and dropped. The driver's own
work is a slice and a length per chunk, so this process's CPU time is the
gateway's; the shard's comes from /proc. CPU time, not wall time, so a loaded
machine gives the same answer, only slower.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import pstats
import tempfile
import time

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.io.tlshandshake import feed
from warren.gateway.session.connection import Connection
from warren.shards.malloc import keep_freed_memory

from ..procs import tree_cpu
from .memtransport import MemoryTransport

FRAME_MAX = 131072  # what RabbitMQ's clients ask for
READ_SIZE = 256 * 1024  # input made ready at once, as a socket's receive buffer holds
ACK_EVERY = 50
WINDOW = 200  # messages published ahead of those consumed


class _Sink(MemoryTransport):
    """Keeps output only while `keep` is set (the handshake), otherwise counts it."""

    def __init__(self):
        super().__init__()
        self.kept = bytearray()
        self.keep = True
        self.written = 0

    def write(self, data) -> None:
        self.written += len(data)
        if self.keep:
            self.kept += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    abort = close


class _Client:
    def __init__(self, gateway: Gateway):
        self.conn = Connection(gateway)
        self.sink = _Sink()
        self.conn.start(self.sink, asyncio.get_running_loop(), self.sink.peer,
                        self.sink.get_extra_info("sockname"))
        self.reader = frames.FrameReader(1 << 30)
        self._seen = 0

    def send(self, data) -> None:
        feed(self.conn, data)

    async def expect(self, kind):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if len(self.sink.kept) > self._seen:
                self.reader.receive_data(bytes(self.sink.kept[self._seen:]))
                self._seen = len(self.sink.kept)
            frame = self.reader.next_frame()
            if frame is None:
                await asyncio.sleep(0.001)
                continue
            if frame[0] == frames.FRAME_METHOD:
                method = m.decode_method(frame[2])
                if isinstance(method, kind):
                    return method
        raise TimeoutError(f"no {kind.__name__}")

    async def call(self, channel: int, method, reply):
        self.send(frames.method_frame(channel, method))
        return await self.expect(reply)

    async def open(self) -> None:
        self.send(frames.PROTOCOL_HEADER)
        await self.expect(m.ConnectionStart)
        self.send(frames.method_frame(0, m.ConnectionStartOk(
            client_properties={"product": "bodycost"}, mechanism="PLAIN",
            response=b"\0guest\0guest", locale="en_US")))
        tune = await self.expect(m.ConnectionTune)
        self.send(frames.method_frame(0, m.ConnectionTuneOk(
            channel_max=tune.channel_max, frame_max=FRAME_MAX, heartbeat=0)))
        await self.call(0, m.ConnectionOpen(virtual_host="/"), m.ConnectionOpenOk)
        await self.call(1, m.ChannelOpen(), m.ChannelOpenOk)


async def _run(gateway: Gateway, size: int, count: int, persistent: bool,
               profile: cProfile.Profile | None) -> dict:
    publisher, consumer = _Client(gateway), _Client(gateway)
    await publisher.open()
    await consumer.open()
    await publisher.call(1, m.QueueDeclare(queue="bodycost", durable=persistent),
                         m.QueueDeclareOk)
    await consumer.call(1, m.BasicQos(prefetch_count=WINDOW), m.BasicQosOk)
    await consumer.call(1, m.BasicConsume(queue="bodycost", consumer_tag="c"),
                        m.BasicConsumeOk)
    publisher.sink.keep = consumer.sink.keep = False
    properties = b"\x10\x00\x02" if persistent else b"\x00\x00"  # delivery-mode
    one = frames.content_frames(1, frames.method_frame(1, m.BasicPublish(
        exchange="", routing_key="bodycost"))[7:-1], 60, properties, os.urandom(size), FRAME_MAX)
    channel = consumer.conn.channels[1]
    shard_pid = gateway.shards[0].process.pid
    shard_before, gateway_before, wall_before = tree_cpu([shard_pid]), os.times(), \
        time.monotonic()
    if profile is not None:
        profile.enable()
    published = acked = 0
    pending = memoryview(b"")
    while acked < count:
        delivered = channel.next_tag - 1
        if delivered - acked >= ACK_EVERY or (delivered == count and acked < count):
            consumer.send(frames.method_frame(1, m.BasicAck(delivery_tag=delivered,
                                                            multiple=True)))
            acked = delivered
        if not publisher.sink.paused and published - delivered < WINDOW:
            if not pending and published < count:
                batch = min(count - published, max(1, READ_SIZE // len(one)), WINDOW)
                pending = memoryview(one * batch)
                published += batch
            if pending:
                publisher.send(pending[:READ_SIZE])
                pending = pending[READ_SIZE:]
        await asyncio.sleep(0)
    if profile is not None:
        profile.disable()
    gateway_after = os.times()
    gateway_user = gateway_after.user - gateway_before.user
    gateway_cpu = gateway_user + gateway_after.system - gateway_before.system
    wall = time.monotonic() - wall_before
    await asyncio.sleep(0.2)  # the shard's last Progress and acks
    shard_cpu = tree_cpu([shard_pid]) - shard_before
    mb = size * count / 1e6
    return {"size": size, "count": count, "persistent": persistent, "MB": round(mb, 1),
            "gateway_cpu_ms_per_MB": round(1000 * gateway_cpu / mb, 2),
            "gateway_user_share": round(gateway_user / gateway_cpu, 2),
            "shard_cpu_ms_per_MB": round(1000 * shard_cpu / mb, 2),
            "MB_per_cpu_s": round(mb / (gateway_cpu + shard_cpu), 1),
            "wall_MB_s": round(mb / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave the allocator's settings alone (the shard keeps them)")
    parser.add_argument("--profile", help="write the gateway's cProfile stats here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not args.glibc_defaults:
        keep_freed_memory()  # as `warren serve` does
    with tempfile.TemporaryDirectory() as data_dir:
        loop = asyncio.new_event_loop()
        gateway = Gateway(Config(data_dir=data_dir, shards=1, disk_free_limit=0,
                                 stats_interval=60.0, store_map_size=1 << 32, memory_limit=0))
        loop.run_until_complete(gateway.start())
        profile = cProfile.Profile(time.process_time) if args.profile else None
        try:
            result = loop.run_until_complete(
                _run(gateway, args.size, args.count, args.persistent, profile))
        finally:
            loop.run_until_complete(gateway.stop())
            loop.close()
    print(result)
    if profile is not None:
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
