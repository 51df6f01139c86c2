"""The CPU floor of Warren's process split: a broker skeleton that does only what
the split itself costs, to run an external client against.

    python -m warren.loadtest.probes.floor [--port 5688]

It serves just enough AMQP 0-9-1 for amqp-perf's transient scenarios, autoack or
manual acks (handshake, channel, queue.declare, basic.qos, basic.consume,
basic.ack; anything else is answered with its -ok where one exists, or ignored).
The hot path keeps the broker's shape and drops its work: a uvloop gateway reads
publishes with the codec's FrameReader (compiled where built, as the gateway's)
and sends each read's publishes and acks as one record over a shared-memory ring
(shards/ring.py) to a second process, which echoes the record back over another ring; the gateway then writes one
basic.deliver per message (hotpath.deliver_frames) to the queue's consumer.
No routing, no queue, no prefetch, no credit, no records beyond a list of
(routing key, properties, body) and acks: two processes, two rings, two doorbells.

What amqp-perf reports as broker_cores_avg against this process (`--pid`) at a
steady `--rate` is about the least CPU a broker built this way (a uvloop gateway
and a shard process, in this Python) uses for that load on this machine; Warren's
own figure minus it is what its routes, channels, queues and records cost. It has
no flow control: a flood overruns its rings, and what does not fit is dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import subprocess
import sys

import msgspec
import uvloop

from warren.gateway.amqp import frames, hotpath
from warren.gateway.amqp import methods as m
from warren.shards.ring import Ring, RingSpec

FRAME_MAX = 131072
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode

# Replies to what amqp-perf sends besides the hot path (none with nowait set).
_REPLIES = {
    m.ChannelOpen: lambda method: m.ChannelOpenOk(),
    m.ChannelClose: lambda method: m.ChannelCloseOk(),
    m.BasicQos: lambda method: m.BasicQosOk(),
    m.ConfirmSelect: lambda method: m.ConfirmSelectOk(),
    m.ExchangeDeclare: lambda method: m.ExchangeDeclareOk(),
    m.QueueBind: lambda method: m.QueueBindOk(),
    m.QueuePurge: lambda method: m.QueuePurgeOk(message_count=0),
    m.QueueDelete: lambda method: m.QueueDeleteOk(message_count=0),
    m.QueueDeclare: lambda method: m.QueueDeclareOk(queue=method.queue or "floor.q",
                                                    message_count=0, consumer_count=0),
}


class Gateway:
    def __init__(self, commands: Ring, events: Ring):
        self.commands, self.events = commands, events
        self.consumers: dict[str, tuple] = {}  # queue -> (connection, channel, tag shortstr)
        self.batch: list = []

    def send(self) -> None:
        """One record for this read's publishes, and the doorbell if the shard sleeps."""
        if self.batch:
            self.commands.write(_encode(self.batch))
            self.batch = []
            self.commands.flush()

    def read_events(self) -> None:
        self.events.clear_data_doorbell()
        while True:
            for record in self.events.read_many(_decode):
                touched = set()
                for key, properties, body in record:
                    if key is None:  # an ack, carried to the shard and back
                        continue
                    target = self.consumers.get(key)
                    if target is not None:
                        conn, channel, tag = target
                        conn.tag += 1
                        conn.out.append(hotpath.deliver_frames(channel, tag, conn.tag, False, "", key,
                                                       properties, body, FRAME_MAX))
                        touched.add(conn)
                for conn in touched:
                    conn.flush()
            if self.events.sleep():
                return


class Connection(asyncio.BufferedProtocol):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.reader = frames.FrameReader(FRAME_MAX)
        self.out: list = []
        self.tag = 0
        self.started = False
        self.partial: list | None = None  # a publish arriving frame by frame

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, size_hint: int):
        return self.reader.get_buffer(size_hint)

    def buffer_updated(self, nbytes: int) -> None:
        reader = self.reader
        reader.buffer_updated(nbytes)
        if not self.started:
            if reader.read_protocol_header() is None:
                return
            self.started = True
            self.method(0, m.ConnectionStart(
                version_major=0, version_minor=9, server_properties={"product": "floor"},
                mechanisms=b"PLAIN", locales=b"en_US"))
        batch = self.gateway.batch
        while True:
            publish = reader.next_publish()
            if publish is not None:
                _, payload, properties, body = publish
                batch.append((hotpath.parse_publish(payload).routing_key, properties, body))
                continue
            frame = reader.next_frame()
            if frame is None:
                break
            frame_type, channel, payload = frame
            if frame_type != frames.FRAME_METHOD:
                self.content(frame_type, payload)
            elif payload[:4] == hotpath.PUBLISH_IDS:  # its content arrives in frames of its own
                self.partial = [hotpath.parse_publish(payload).routing_key, None, 0, []]
            elif payload[:4] == hotpath.ACK_IDS and len(payload) == hotpath.ACK_SIZE:
                ack = hotpath.parse_ack(payload)
                batch.append((None, ack.delivery_tag, ack.multiple))
            else:
                self.handle(channel, m.decode_method(payload))
        self.gateway.send()
        self.flush()

    def content(self, frame_type: int, payload: bytes) -> None:
        """A header or body frame of a publish the reader could not take whole."""
        partial = self.partial
        if partial is None:
            return
        if frame_type == frames.FRAME_HEADER:
            _, _, partial[2], partial[1] = frames.parse_content_header(payload)
        elif frame_type == frames.FRAME_BODY:
            partial[3].append(payload)
            partial[2] -= len(payload)
        if partial[1] is not None and partial[2] <= 0:
            self.gateway.batch.append((partial[0], partial[1], b"".join(partial[3])))
            self.partial = None

    def handle(self, channel: int, method) -> None:
        kind = type(method)
        if kind is m.ConnectionStartOk:
            self.method(0, m.ConnectionTune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0))
        elif kind is m.ConnectionOpen:
            self.method(0, m.ConnectionOpenOk())
        elif kind is m.ConnectionClose:
            self.method(0, m.ConnectionCloseOk())
            self.flush()
            self.transport.close()
        elif kind is m.BasicCancel:
            self.forget_consumers(channel)
            if not method.nowait:
                self.method(channel, m.BasicCancelOk(consumer_tag=method.consumer_tag))
        elif kind is m.BasicConsume:
            tag = method.consumer_tag or f"floor-{id(self)}-{channel}"
            self.gateway.consumers[method.queue] = (self, channel, hotpath.shortstr(tag))
            if not method.nowait:
                self.method(channel, m.BasicConsumeOk(consumer_tag=tag))
        elif kind in _REPLIES and not getattr(method, "nowait", False):
            self.method(channel, _REPLIES[kind](method))

    def method(self, channel: int, method) -> None:
        self.out.append(frames.method_frame(channel, method))

    def flush(self) -> None:
        if self.out:
            data = b"".join(self.out)
            self.out = []
            self.transport.write(data)

    def connection_lost(self, exc) -> None:
        self.forget_consumers()

    def forget_consumers(self, channel: int | None = None) -> None:
        consumers = self.gateway.consumers
        for queue, (conn, on, _) in list(consumers.items()):
            if conn is self and channel in (None, on):
                del consumers[queue]


def shard(commands: Ring, events: Ring, lifeline: int) -> None:
    """Echo each command record back as an event record; sleep on the doorbell.
    Exits when the gateway does (its end of the lifeline pipe closes)."""
    poller = select.poll()
    poller.register(commands.spec().data_fd, select.POLLIN)
    poller.register(lifeline, select.POLLIN)
    while True:
        records = commands.read_many()
        if records:
            events.write_many(records)
            events.flush()
        elif commands.sleep():
            if any(fd == lifeline for fd, _ in poller.poll()):
                return
            commands.clear_data_doorbell()


async def serve(port: int) -> None:
    commands, events = Ring.create(4 << 20), Ring.create(4 << 20)
    specs = [list(msgspec.to_builtins(r.spec())) for r in (commands, events)]
    lifeline, held = os.pipe()
    fds = [fd for r in (commands, events) for fd in (r.spec().data_fd, r.spec().space_fd)]
    child = subprocess.Popen([sys.executable, "-m", "warren.loadtest.probes.floor", "--shard",
                              json.dumps([specs, lifeline])], pass_fds=[*fds, lifeline])
    os.close(lifeline)
    gateway = Gateway(commands, events)
    loop = asyncio.get_running_loop()
    events.sleep()
    loop.add_reader(events.spec().data_fd, gateway.read_events)
    server = await loop.create_server(lambda: Connection(gateway), "127.0.0.1", port)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"floor broker on amqp://guest:guest@127.0.0.1:{port}/", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        loop.remove_reader(events.spec().data_fd)
        os.close(held)
        child.wait()
        for ring in (commands, events):
            ring.close()
            ring.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.loadtest.probes.floor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=5688)
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # the child: its rings' specs
    options = parser.parse_args(argv)
    if options.shard:
        specs, lifeline = json.loads(options.shard)
        commands, events = (Ring.attach(msgspec.convert(s, RingSpec)) for s in specs)
        shard(commands, events, lifeline)
        return
    uvloop.run(serve(options.port))


if __name__ == "__main__":
    main()
