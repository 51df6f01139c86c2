"""Stream queues (issue 53) end to end with pika and aio-pika: the declaration
rules and refusals, x-stream-offset, the header on every delivery, reads that
never remove, retention by size and by age, and a kill -9 under confirmed load.
Every text and answer here was first taken from RabbitMQ 3.10.8 with the same
client."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import pika
import pika.exceptions
import pytest

from ..support.broker import RunningBroker, wait_until
from .test_e2e_basic import connect, shard_pids
from .test_e2e_durability import wait_until_gone
from .test_e2e_routing import unique
from .test_management_api import call

pytestmark = pytest.mark.slow  # started first, so the workers finish together

STREAM = {"x-queue-type": "stream"}


def stream(ch, name: str | None = None, **arguments) -> str:
    name = name or unique("s")
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    return name


def publish(ch, queue: str, bodies) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body)


def read(conn, queue: str, count: int, offset="first", prefetch: int = 10,
         timeout: float = 10.0) -> list[tuple[object, bytes]]:
    """The first `count` deliveries of a consumer from `offset`, acked, as
    (x-stream-offset, body)."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got = []

    def take(channel, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, take, arguments={"x-stream-offset": offset})
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.close()
    return got


def refused(action) -> tuple[int, str]:
    with pytest.raises((pika.exceptions.ChannelClosedByBroker,
                        pika.exceptions.ConnectionClosedByBroker)) as raised:
        action()
    return raised.value.args[:2]


# -- declaring ------------------------------------------------------------------------


@pytest.mark.parametrize("flags, name", [
    (dict(durable=False), "non-durable"), (dict(durable=True, exclusive=True), "exclusive-owner"),
    (dict(durable=True, auto_delete=True), "auto-delete"),
    (dict(durable=False, exclusive=True, auto_delete=True), "auto-delete")])
def test_a_stream_is_durable_only(broker, flags, name):
    ch = connect(broker).channel()
    queue = unique("s")
    assert refused(lambda: ch.queue_declare(queue, arguments=STREAM, **flags)) == (
        406, f"PRECONDITION_FAILED - invalid property '{name}' for queue '{queue}' in vhost '/'")


@pytest.mark.parametrize("arguments, text", [
    ({"x-max-age": "1X"}, "invalid arg 'x-max-age' for {q}: invalid_max_age"),
    ({"x-max-age": 5}, "invalid arg 'x-max-age' for {q}: {{unacceptable_type,signedint}}"),
    ({"x-stream-max-segment-size-bytes": -5},
     "invalid arg 'x-stream-max-segment-size-bytes' for {q}: {{value_negative,-5}}"),
    ({"x-message-ttl": 1000},
     "invalid arg 'x-message-ttl' for {q} of queue type rabbit_stream_queue"),
    ({"x-queue-mode": "lazy", "x-max-priority": 5},
     "invalid arg 'x-queue-mode' for {q} of queue type rabbit_stream_queue")])
def test_a_streams_arguments_are_checked(broker, arguments, text):
    ch = connect(broker).channel()
    queue = unique("s")
    what = f"queue '{queue}' in vhost '/'"
    assert refused(lambda: stream(ch, queue, **arguments)) == (
        406, "PRECONDITION_FAILED - " + text.format(q=what))


def test_a_stream_is_redeclared_as_itself_only(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"a", b"b"])
    assert ch.queue_declare(queue, passive=True).method.message_count == 2
    stream(ch, queue)
    assert refused(lambda: ch.queue_declare(queue, durable=True)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{queue}' in "
             "vhost '/': received none but current is the value 'stream' of type 'longstr'")


# -- what a stream refuses --------------------------------------------------------------


def test_get_purge_auto_ack_and_no_prefetch_are_refused(broker):
    conn = connect(broker)
    queue = stream(conn.channel())
    what = f"queue '{queue}' in vhost '/'"
    assert refused(lambda: connect(broker).channel().basic_get(queue)) == (
        540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {what}")
    assert refused(lambda: connect(broker).channel().queue_purge(queue)) == (
        540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {what}")

    def auto_ack():
        ch = connect(broker).channel()
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(queue, lambda *a: None, auto_ack=True)
    assert refused(auto_ack) == (
        540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues {what}")
    for qos in ({}, {"prefetch_count": 10, "global_qos": True}):
        def no_prefetch():
            ch = connect(broker).channel()
            if qos:
                ch.basic_qos(**qos)
            ch.basic_consume(queue, lambda *a: None)
        assert refused(no_prefetch) == (
            406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'")


@pytest.mark.parametrize("settle", ["nack", "nack-requeue", "reject", "reject-requeue"])
def test_nack_and_reject_are_refused(broker, settle):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"a"])
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)

    def take(channel, method, properties, body):
        if settle.startswith("nack"):
            channel.basic_nack(method.delivery_tag, requeue=settle.endswith("requeue"))
        else:
            channel.basic_reject(method.delivery_tag, requeue=settle.endswith("requeue"))

    ch.basic_consume(queue, take, arguments={"x-stream-offset": "first"})
    assert refused(lambda: [conn.process_data_events(0.1) for _ in range(100)]) == (
        540, "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues "
             f"queue '{queue}' in vhost '/'")


@pytest.mark.parametrize("offset", ["bogus", True, {"a": 1}, [1]])
def test_an_offset_of_another_kind_is_an_internal_error(broker, offset):
    conn = connect(broker)
    queue = stream(conn.channel())
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    assert refused(lambda: ch.basic_consume(queue, lambda *a: None,
                                            arguments={"x-stream-offset": offset})) == (
        541, "INTERNAL_ERROR")


# -- reading --------------------------------------------------------------------------


def test_offsets_run_from_zero_and_reads_never_remove(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"m%d" % i for i in range(20)])
    expected = [(i, b"m%d" % i) for i in range(20)]
    first = read(conn, queue, 20, prefetch=3)
    assert first == expected
    assert all(type(offset).__name__ == "long" for offset, _ in first)  # pika's 'l'
    assert read(conn, queue, 20, offset=b"first") == expected  # a second reader: all again
    assert read(conn, queue, 5, offset=15) == expected[15:]
    assert read(conn, queue, 20, offset=-1) == expected
    assert ch.queue_declare(queue, passive=True).method.message_count == 20


def test_two_consumers_from_first_each_get_everything(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"%d" % i for i in range(50)])
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=7)
    got: dict[str, list[int]] = {"a": [], "b": []}
    for tag in got:
        def take(channel, method, properties, body, tag=tag):
            got[tag].append(properties.headers["x-stream-offset"])
            channel.basic_ack(method.delivery_tag)
        consumer.basic_consume(queue, take, consumer_tag=tag,
                               arguments={"x-stream-offset": "first"})
    publish(ch, queue, [b"%d" % i for i in range(50, 60)])
    wait_until(lambda: conn.process_data_events(0.02) or all(
        len(offsets) == 60 for offsets in got.values()), timeout=20)
    assert got == {"a": list(range(60)), "b": list(range(60))}


def test_next_last_and_a_timestamp(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"old"])
    time.sleep(1.1)  # the timestamp argument counts whole seconds
    since = datetime.datetime.now(datetime.timezone.utc)
    publish(ch, queue, [b"new"])
    assert read(conn, queue, 2, offset=since.replace(microsecond=0),
                timeout=1.0) == [(1, b"new")]
    assert read(conn, queue, 1, offset="last") == [(1, b"new")]

    nexts = conn.channel()
    nexts.basic_qos(prefetch_count=5)
    got = []
    nexts.basic_consume(queue, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]))
    conn.process_data_events(0.3)
    publish(ch, queue, [b"later"])
    wait_until(lambda: conn.process_data_events(0.02) or got, timeout=10)
    assert got == [2]


def test_a_consumer_takes_its_prefetch_and_more_as_it_acks(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"x"] * 10)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=3)
    tags = []
    consumer.basic_consume(queue, lambda c, m, p, b: tags.append(m.delivery_tag),
                           arguments={"x-stream-offset": "first"})
    wait_until(lambda: conn.process_data_events(0.02) or len(tags) == 3)
    conn.process_data_events(0.3)
    assert len(tags) == 3
    consumer.basic_ack(tags[-1], multiple=True)
    wait_until(lambda: conn.process_data_events(0.02) or len(tags) == 6)


def test_a_consumer_past_its_timeout_is_cancelled(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"x"])
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=3)
    cancelled = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume(queue, lambda *a: None, arguments={
        "x-stream-offset": "first", "x-consumer-timeout": 300})
    wait_until(lambda: conn.process_data_events(0.05) or cancelled, timeout=10)
    assert cancelled == [tag]


def test_aio_pika_reads_a_stream_from_an_offset(broker):
    import aio_pika

    async def scenario():
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            queue = await ch.declare_queue(unique("s"), durable=True, arguments=STREAM)
            for i in range(6):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i),
                                                  routing_key=queue.name)
            await ch.set_qos(prefetch_count=2)
            seen = []
            async with queue.iterator(arguments={"x-stream-offset": 2}) as it:
                async for message in it:
                    seen.append((message.headers["x-stream-offset"], message.body))
                    await message.ack()
                    if len(seen) == 4:
                        break
            return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert seen == [(i, b"%d" % i) for i in range(2, 6)]


def test_large_records_are_read_whole(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    bodies = [bytes([i]) * size for i, size in enumerate((200 << 10, 10, 1_500_000, 70_000))]
    publish(ch, queue, bodies)
    assert read(conn, queue, 4, prefetch=2) == list(enumerate(bodies))


# -- retention ------------------------------------------------------------------------


def first_offset(conn, queue: str):
    got = read(conn, queue, 1, timeout=5)
    return got[0][0] if got else None


def test_retention_by_size_drops_whole_old_segments(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch, **{"x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 5000})
    publish(ch, queue, [b"%03d" % i + b"." * 96 for i in range(200)])
    # each segment holds about 15 records of 100 bytes: a few segments are kept
    wait_until(lambda: (first_offset(conn, queue) or 0) > 100, timeout=10)
    start = first_offset(conn, queue)
    got = read(conn, queue, 200 - start)
    assert [offset for offset, _ in got] == list(range(start, 200))  # the newest are kept
    assert ch.queue_declare(queue, passive=True).method.message_count == 200 - start


def test_retention_by_age(broker):
    conn = connect(broker)
    ch = conn.channel()
    # a record to a segment: the newest, which is never dropped, holds "late" alone
    queue = stream(ch, **{"x-stream-max-segment-size-bytes": 500, "x-max-age": "2s"})
    publish(ch, queue, [b"." * 600] * 20)
    publish(ch, queue, [b"late"])
    wait_until(lambda: first_offset(conn, queue) == 20, timeout=15)
    assert read(conn, queue, 1) == [(20, b"late")]


def test_a_deleted_stream_declared_again_starts_empty(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = stream(ch)
    publish(ch, queue, [b"a", b"b"])
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=5)
    cancelled = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume(queue, lambda *a: None, arguments={"x-stream-offset": "first"})
    ch.queue_delete(queue)
    wait_until(lambda: conn.process_data_events(0.02) or cancelled)
    assert cancelled == [tag]
    stream(ch, queue)
    publish(ch, queue, [b"c"])
    assert read(conn, queue, 2, timeout=1.0) == [(0, b"c")]  # and nothing before it


def test_a_restarted_shard_serves_its_streams_again(fresh_broker):
    broker = fresh_broker.start()
    conn = connect(broker)
    ch = conn.channel()
    queues = [stream(ch) for _ in range(4)]  # on both shards
    for queue in queues:
        publish(ch, queue, [b"before"])
    for pid in shard_pids(broker):
        os.kill(pid, signal.SIGKILL)
    for queue in queues:  # each once its shard is back (until then: 404, crashed)
        wait_until(lambda queue=queue: _published(broker, queue, b"after"), timeout=30)
    for queue in queues:
        assert read(connect(broker), queue, 2) == [(0, b"before"), (1, b"after")]


def _published(broker, queue: str, body: bytes) -> bool:
    try:
        publish(connect(broker).channel(), queue, [body])
    except pika.exceptions.AMQPError:
        return False
    return True


# -- management and warren inspect -------------------------------------------------------


def test_management_and_inspect_show_a_streams_segments(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=2, management=True).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        queue = stream(ch, **{"x-stream-max-segment-size-bytes": 1000})
        publish(ch, queue, [b"." * 300] * 10)
        shown = wait_until(lambda: (lambda q: q.get("messages") == 10 and q)(
            call(broker, "GET", f"/api/queues/%2F/{queue}")[1]))
        assert shown["type"] == "stream" and shown["messages_ready"] == 10
        assert shown["segments"] >= 3 and shown["disk_bytes"] > 3000
        consumer = conn.channel()
        consumer.basic_qos(prefetch_count=3)  # no acks: it reads 3, offset 3 next
        consumer.basic_consume(queue, lambda *a: None, consumer_tag="reader",
                               arguments={"x-stream-offset": "first"})
        listed = wait_until(lambda: conn.process_data_events(0.02) or (lambda cs: [
            c for c in cs if c["consumer_tag"] == "reader" and c.get("stream_offset") == 3])(
            call(broker, "GET", "/api/consumers")[1]))
        assert listed[0]["queue"]["name"] == queue
        inspected = subprocess.run(
            [sys.executable, "-m", "warren.gateway.cli.main", "inspect", "--json", "--queue",
             queue, str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
        row = json.loads(inspected.stdout)["queue"]
        assert (row["messages"], row["first_offset"], row["last_offset"]) == (10, 0, 9)
        assert len(row["segments"]) == shown["segments"]
        assert sum(segment["bytes"] for segment in row["segments"]) == shown["disk_bytes"]
        verified = subprocess.run(
            [sys.executable, "-m", "warren.gateway.cli.main", "inspect", "--verify",
             str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
        assert verified.returncode == 0, verified.stdout
    finally:
        broker.stop()


def test_a_policy_sets_a_streams_retention(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=2, management=True).start()
    try:
        ch = connect(broker).channel()
        queue = stream(ch, **{"x-stream-max-segment-size-bytes": 1000})
        assert call(broker, "PUT", "/api/policies/%2F/retention", {
            "pattern": f"^{queue}$", "apply-to": "streams",
            "definition": {"max-length-bytes": 2500}})[0] == 201
        publish(ch, queue, [b"." * 300] * 30)
        shown = wait_until(lambda: (lambda q: 0 < q.get("messages", 0) < 30 and q)(
            call(broker, "GET", f"/api/queues/%2F/{queue}")[1]))
        assert shown["policy"] == "retention" and shown["disk_bytes"] <= 2500 + 1000
    finally:
        broker.stop()


# -- kill -9 --------------------------------------------------------------------------


@pytest.mark.run_once
def test_kill_under_confirmed_load_keeps_every_confirmed_record_in_order(tmp_path):
    data = tmp_path / "data"
    broker = RunningBroker(data, shards=2).start()
    confirmed: list[int] = []
    stop = threading.Event()

    def publisher():
        try:
            conn = connect(broker)
            ch = conn.channel()
            ch.confirm_delivery()
            for n in range(1_000_000):
                if stop.is_set():
                    return
                ch.basic_publish("", "ks", struct.pack(">Q", n))
                confirmed.append(n)
        except pika.exceptions.AMQPError:
            return  # the broker died under it

    try:
        stream(connect(broker).channel(), "ks", **{"x-stream-max-segment-size-bytes": 20_000})
        thread = threading.Thread(target=publisher)
        thread.start()
        wait_until(lambda: len(confirmed) > 300, timeout=30)
        for pid in [broker.process.pid, *shard_pids(broker)]:
            os.kill(pid, signal.SIGKILL)
        broker.process.wait(10)
        stop.set()
        thread.join(20)
    finally:
        broker.stop()
    wait_until_gone(data)
    broker = RunningBroker(data, shards=2).start()
    try:
        conn = connect(broker)
        stored = conn.channel().queue_declare("ks", passive=True).method.message_count
        assert stored >= len(confirmed)
        got = read(conn, "ks", stored, prefetch=200, timeout=60)
        assert [offset for offset, _ in got] == list(range(stored))
        assert [struct.unpack(">Q", body)[0] for _, body in got] == list(range(stored))
    finally:
        broker.stop()
