"""Multi-megabyte messages go through whole, held by flow control when a shard's
ring fills, never blocked: connection.blocked is for resource alarms only."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import aio_pika

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

from .rawclient import RawClient

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
