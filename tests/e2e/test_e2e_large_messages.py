"""Multi-megabyte messages go through whole, held by flow control when a shard's
ring fills, never blocked: connection.blocked is for resource alarms only."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

import aio_pika
import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.values import placement

from ..support.rawclient import RawClient

MB = 1 << 20


def body(size: int, seed: int) -> bytes:
    """`size` bytes that differ from message to message and along each message."""
    block = hashlib.sha256(str(seed).encode()).digest() * (MB // 32)
    return (block * (size // MB + 1))[:size - 8] + seed.to_bytes(8, "big")


def test_aio_pika_22mb_then_30_1mb_with_confirms_arrive_intact_never_blocked(broker, caplog):
    bodies = [body(22 * MB, 0)] + [body(MB, n) for n in range(1, 31)]
    expected = [hashlib.sha256(b).hexdigest() for b in bodies]

    async def run() -> list[str]:
        connection = await aio_pika.connect(broker.url, timeout=30)
        async with connection:
            publisher = await connection.channel(publisher_confirms=True)
            consumer = await connection.channel()
            queue = await consumer.declare_queue("large.aio", auto_delete=True)
            received: list[str] = []
            done = asyncio.Event()

            async def on_message(message):
                received.append(hashlib.sha256(message.body).hexdigest())
                if len(received) == len(bodies):
                    done.set()

            await queue.consume(on_message, no_ack=True)
            exchange = publisher.default_exchange
            await exchange.publish(aio_pika.Message(bodies[0]), routing_key="large.aio",
                                   timeout=60)
            await asyncio.gather(*(exchange.publish(aio_pika.Message(b), routing_key="large.aio",
                                                    timeout=60) for b in bodies[1:]))
            await asyncio.wait_for(done.wait(), 60)
            return received

    with caplog.at_level(logging.WARNING, logger="aiormq"):
        assert asyncio.run(run()) == expected
    assert not [r for r in caplog.records if "blocked" in r.getMessage()]


def test_a_22mb_publish_sends_no_connection_blocked(broker):
    client = RawClient(broker.port, timeout=60)
    client.handshake(capabilities={"connection.blocked": True, "publisher_confirms": True})
    client.open_channel(1)
    client.send_method(1, m.ConfirmSelect())
    assert client.next_method() == (1, m.ConfirmSelectOk())
    client.send_method(1, m.QueueDeclare(queue="", exclusive=True))
    _, declared = client.next_method()
    client.send(frames.content_frames(1, m.encode_method(m.BasicPublish(
        routing_key=declared.queue)), 60, b"\x00\x00", body(22 * MB, 0), 131072))
    while True:  # everything the broker sends until the confirm
        channel, method = client.next_method()
        assert not isinstance(method, m.ConnectionBlocked), method
        if isinstance(method, m.BasicAck):
            break
    client.close()


def small_round_trip(channel, queue: str, n: int, seed: int) -> None:
    """n small messages published and got back, in order (a deadline, not a timing)."""
    sent = [f"{seed}-{i}".encode() for i in range(n)]
    for data in sent:
        channel.basic_publish("", queue, data)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        _, _, data = channel.basic_get(queue, auto_ack=True)
        if data is not None:
            got.append(data)
    assert got == sent


@pytest.mark.parametrize("persistent", [False, True])
def test_a_10mb_message_round_trips_while_small_ones_keep_flowing(broker, persistent):
    """Other connections' messages keep moving while a 10 MB message is half
    received and while its delivery sits unread in a slow consumer's socket."""
    queue = f"large.10mb.{persistent}"
    big = body(10 * MB, 7)
    properties = b"\x10\x00\x02" if persistent else b"\x00\x00"  # delivery-mode 2
    publisher, consumer = RawClient(broker.port, timeout=60), RawClient(broker.port, timeout=60)
    for client in (publisher, consumer):
        client.handshake()
        client.open_channel(1)
    publisher.call(1, m.QueueDeclare(queue=queue, durable=persistent), m.QueueDeclareOk)
    publisher.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    consumer.call(1, m.BasicConsume(queue=queue, consumer_tag="big", no_ack=True),
                  m.BasicConsumeOk)
    # The small messages go through the big one's shard: its rings carry both.
    shard = placement("/", queue, broker.shards)
    small_queue = next(name for name in (f"large.small.{n}" for n in range(1000))
                       if placement("/", name, broker.shards) == shard)
    small = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    small_channel = small.channel()
    small_channel.queue_declare(small_queue, auto_delete=True)

    frames_out = frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key=queue)),
                                       60, properties, big, 131072)
    half = len(frames_out) // 2
    publisher.send(frames_out[:half])  # the broker is assembling it
    small_round_trip(small_channel, small_queue, 50, 1)
    publisher.send(frames_out[half:])
    assert publisher.expect(1, m.BasicAck).delivery_tag == 1
    # The consumer has not read anything yet: its delivery waits in the broker's
    # output and the socket, and other traffic still goes through.
    small_round_trip(small_channel, small_queue, 50, 2)
    channel, deliver = consumer.next_method()
    assert channel == 1 and isinstance(deliver, m.BasicDeliver) and deliver.routing_key == queue
    assert consumer.content() == (properties, big)
    # and one over several frames, taken with basic.get
    medium = body(300_000, 8)
    small_channel.basic_publish("", small_queue, medium)
    deadline = time.monotonic() + 30
    got = None
    while got is None and time.monotonic() < deadline:
        _, _, got = small_channel.basic_get(small_queue, auto_ack=True)
    assert got == medium
    small.close()
    publisher.call(1, m.QueueDelete(queue=queue), m.QueueDeleteOk)
    for client in (publisher, consumer):
        client.close()
