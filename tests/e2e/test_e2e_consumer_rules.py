"""Consumer acknowledgements and prefetch, rule by rule from the seeds
(acks-and-confirms.txt, consumer-prefetch.txt), with real clients
(tests/session/test_consumer_rules.py: those a raw client shows in-process)."""

from __future__ import annotations

import time

import pika
import pytest

from ..support.broker import wait_until


def connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))


def fill(ch, queue: str, count: int) -> None:
    ch.queue_declare(queue, exclusive=True)
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode())


def collect(conn, ch, queue: str, **consume) -> list:
    got = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append((m.delivery_tag, int(b), m.redelivered)),
                     **consume)
    return got


def settle_for(conn, seconds: float) -> None:
    """Let the broker act for a bounded time (used only to show that nothing more comes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.02)


def pump_until(conn, condition, timeout: float = 10.0):
    return wait_until(lambda: (conn.process_data_events(time_limit=0.02), condition())[1],
                      timeout=timeout)


def redelivered_after_close(broker, queue_messages: int, ack) -> list[int]:
    """Consume `queue_messages` messages on one channel, apply `ack(channel, tags)`, close
    the channel, and return which messages come back (marked redelivered)."""
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(queue_messages):
        ch.basic_publish("", q, str(i).encode())
    worker = conn.channel()
    got = collect(conn, worker, q)
    pump_until(conn, lambda: len(got) == queue_messages)
    ack(worker, [tag for tag, _, _ in got])
    worker.close()
    again = collect(conn, ch, q)
    settle_for(conn, 0.3)
    assert all(redelivered for _, _, redelivered in again)
    conn.close()
    return sorted(n for _, n, _ in again)


def test_seeds_example_multiple_ack_settles_5_to_8(broker):
    # Tags 1..8 delivered; 1..4 acked; then ack 8 with multiple: 5, 6, 7, 8 all settle.
    def ack(ch, tags):
        for tag in tags[:4]:
            ch.basic_ack(tag)
        ch.basic_ack(8, multiple=True)

    assert redelivered_after_close(broker, 8, ack) == []


def test_seeds_example_single_ack_settles_only_8(broker):
    def ack(ch, tags):
        for tag in tags[:4]:
            ch.basic_ack(tag)
        ch.basic_ack(8)

    assert redelivered_after_close(broker, 8, ack) == [4, 5, 6]


def test_tag_zero_multiple_settles_everything_and_nack_requeues(broker):
    assert redelivered_after_close(broker, 5, lambda ch, tags: ch.basic_ack(0, multiple=True)) == []
    assert redelivered_after_close(
        broker, 5, lambda ch, tags: ch.basic_nack(3, multiple=True, requeue=False)) == [3, 4]


def test_requeue_returns_to_original_position_with_redelivered(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "requeue-order", 6)
    ch.basic_qos(prefetch_count=3)
    got = []
    tag = ch.basic_consume("requeue-order",
                           lambda c, m, p, b: got.append((m.delivery_tag, int(b), m.redelivered)))
    pump_until(conn, lambda: len(got) == 3)
    assert [(n, red) for _, n, red in got] == [(0, False), (1, False), (2, False)]
    ch.basic_cancel(tag)  # its deliveries stay unacked on the channel
    ch.basic_nack(got[2][0], requeue=True)  # returned out of order: 2, then 0
    ch.basic_reject(got[0][0], requeue=True)
    ch.basic_ack(got[1][0])
    again = collect(conn, ch, "requeue-order")
    pump_until(conn, lambda: len(again) == 3)  # prefetch 3 again
    assert [(n, red) for _, n, red in again] == [(0, True), (2, True), (3, False)]
    conn.close()


def test_reject_without_requeue_discards(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "discard2", 1)
    method = pump_until(conn, lambda: ch.basic_get("discard2")[0])
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.queue_declare("discard2", passive=True).method.message_count == 0
    assert ch.basic_get("discard2") == (None, None, None)
    conn.close()


def test_unacked_requeued_on_channel_error_and_on_connection_close(broker):
    conn = connect(broker)
    holder = conn.channel()
    q = holder.queue_declare("requeue-on-error").method.queue
    holder.queue_purge(q)
    for i in range(3):
        holder.basic_publish("", q, str(i).encode())
    got = collect(conn, holder, q)
    pump_until(conn, lambda: len(got) == 3)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        holder.queue_declare("no-such-queue", passive=True)  # a channel exception
    other = connect(broker)
    again = collect(other, other.channel(), q)
    pump_until(other, lambda: len(again) == 3)
    assert [(n, red) for _, n, red in again] == [(0, True), (1, True), (2, True)]
    other.close()  # connection close: its unacked deliveries go back too
    last = connect(broker)
    ch = last.channel()
    assert pump_until(last, lambda: ch.queue_declare(q, passive=True).method.message_count == 3)
    ch.queue_delete(q)
    conn.close()
    last.close()


def test_basic_recover_redelivers_everything_unacked(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "recover", 3)
    got = collect(conn, ch, "recover")
    pump_until(conn, lambda: len(got) == 3)
    ch.basic_recover(requeue=True)
    pump_until(conn, lambda: len(got) == 6)
    assert [(n, red) for _, n, red in got[3:]] == [(0, True), (1, True), (2, True)]
    assert [tag for tag, _, _ in got] == [1, 2, 3, 4, 5, 6]  # new tags, monotonic
    conn.close()


def test_per_consumer_prefetch_holds_delivery_until_ack(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "prefetch-3", 10)
    ch.basic_qos(prefetch_count=3)
    got = collect(conn, ch, "prefetch-3")
    pump_until(conn, lambda: len(got) == 3)
    settle_for(conn, 0.3)
    assert len(got) == 3
    ch.basic_ack(got[0][0])
    pump_until(conn, lambda: len(got) == 4)
    settle_for(conn, 0.2)
    assert len(got) == 4
    conn.close()


def test_seeds_example_10_per_consumer_15_per_channel(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "limit-a", 40)
    fill(ch, "limit-b", 40)
    ch.basic_qos(prefetch_count=10, global_qos=False)
    ch.basic_qos(prefetch_count=15, global_qos=True)
    a = collect(conn, ch, "limit-a")
    b = collect(conn, ch, "limit-b")
    pump_until(conn, lambda: len(a) + len(b) == 15)
    settle_for(conn, 0.3)
    assert len(a) <= 10 and len(b) <= 10 and len(a) + len(b) == 15
    ch.basic_ack(0, multiple=True)
    pump_until(conn, lambda: len(a) + len(b) == 30)
    settle_for(conn, 0.3)
    assert len(a) + len(b) == 30  # again 15 unacked at most
    conn.close()


def test_prefetch_zero_is_unlimited_and_get_ignores_prefetch(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "unlimited", 50)
    ch.basic_qos(prefetch_count=1)
    first = pump_until(conn, lambda: ch.basic_get("unlimited")[0])
    second = pump_until(conn, lambda: ch.basic_get("unlimited")[0])
    assert (first.delivery_tag, second.delivery_tag) == (1, 2)  # get ignores prefetch 1
    ch.basic_qos(prefetch_count=0)
    got = collect(conn, ch, "unlimited")
    pump_until(conn, lambda: len(got) == 48)
    conn.close()


def test_consumer_priority(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("prio", exclusive=True)
    low = collect(conn, ch, "prio")
    high = collect(conn, ch, "prio", arguments={"x-priority": 10})
    for i in range(5):
        ch.basic_publish("", "prio", str(i).encode())
    pump_until(conn, lambda: len(high) == 5)
    assert low == []  # an exclusive consumer's 403: test_channel_errors.py
    conn.close()


def test_slow_auto_ack_consumer_is_held_back_not_buffered(fresh_broker):
    from warren.gateway.amqp import frames
    from warren.gateway.amqp import methods as m

    from ..support.rawclient import RawClient
    from .test_e2e_memory import pss_bytes

    fresh_broker.start()
    reader = RawClient(fresh_broker.port, timeout=30)
    reader.handshake()
    reader.open_channel(1)
    reader.send_method(1, m.QueueDeclare(queue="slow-reader"))
    reader.next_method()
    reader.send_method(1, m.BasicConsume(queue="slow-reader", no_ack=True))
    reader.next_method()
    gateway_before = pss_bytes(fresh_broker.process.pid)
    conn = connect(fresh_broker)
    ch = conn.channel()
    body = b"s" * 2500
    for i in range(20_000):  # 50 MB the reader does not read yet
        ch.basic_publish("", "slow-reader", i.to_bytes(4, "big") + body)
    conn.process_data_events(time_limit=1.0)
    growth = pss_bytes(fresh_broker.process.pid) - gateway_before
    assert growth < 30 * 2**20, f"gateway grew by {growth / 2**20:.0f} MiB"
    # Once the reader reads, everything arrives, in order.
    expected = 0
    while expected < 20_000:
        frame_type, _, payload = reader.next_frame(timeout=30)
        if frame_type == frames.FRAME_BODY:
            assert int.from_bytes(payload[:4], "big") == expected
            expected += 1
    reader.close()
    conn.close()


def test_channel_qos_change_applies_to_new_deliveries(broker):
    conn = connect(broker)
    ch = conn.channel()
    fill(ch, "qos-change", 20)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    got = collect(conn, ch, "qos-change")
    pump_until(conn, lambda: len(got) == 5)
    ch.basic_qos(prefetch_count=2, global_qos=True)  # 5 in flight stay; new limit is 2
    ch.basic_ack(0, multiple=True)
    pump_until(conn, lambda: len(got) == 7)
    settle_for(conn, 0.3)
    assert len(got) == 7
    conn.close()


def test_aio_pika_nack_requeue_and_prefetch(broker):
    import asyncio

    import aio_pika

    async def scenario():
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=2)
            queue = await ch.declare_queue("", exclusive=True)
            for i in range(4):
                await ch.default_exchange.publish(aio_pika.Message(str(i).encode()),
                                                  routing_key=queue.name)
            seen = []
            async with queue.iterator() as it:
                async for message in it:
                    seen.append((int(message.body), message.redelivered))
                    if len(seen) == 1:
                        await message.nack(requeue=True)
                    else:
                        await message.ack()
                    if len(seen) == 5:
                        break
            return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert seen[0] == (0, False)
    assert (0, True) in seen[1:3]  # back at the head of the queue, marked redelivered
    assert sorted(n for n, _ in seen[1:]) == [0, 1, 2, 3]
