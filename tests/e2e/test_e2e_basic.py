"""End to end: real `warren serve`, real clients over TCP (pika, aio-pika, py-amqp)."""

from __future__ import annotations

import asyncio
import decimal
import os
import signal
import subprocess
import sys
import textwrap
import time

import aio_pika
import amqp
import pika
import pytest

from warren.gateway.values import placement

from ..support.broker import ROOT, wait_until


def connect(broker, **params) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=broker.port, **params))


def names_on_every_shard(shards: int, per_shard: int = 2, prefix: str = "q") -> list[str]:
    """Queue names that land on every shard `per_shard` times, by the broker's placement."""
    chosen: dict[int, list[str]] = {i: [] for i in range(shards)}
    n = 0
    while any(len(v) < per_shard for v in chosen.values()):
        name = f"{prefix}-{n}"
        bucket = chosen[placement("/", name, shards)]
        if len(bucket) < per_shard:
            bucket.append(name)
        n += 1
    return [name for names in chosen.values() for name in names]


def test_pika_eight_queues_on_all_shards_ordered_with_acks(broker):
    queues = names_on_every_shard(broker.shards, per_shard=2, prefix="order")
    assert len(queues) == 8
    conn = connect(broker)
    ch = conn.channel()
    for q in queues:
        ch.queue_declare(q)
    for i in range(10_000):
        q = queues[i % 8]
        ch.basic_publish("", q, f"{q}:{i}".encode(),
                         pika.BasicProperties(message_id=str(i), content_type="text/plain"))
    received: dict[str, list[int]] = {q: [] for q in queues}
    ch.basic_qos(prefetch_count=200)

    def on_message(channel, method, props, body):
        q, i = body.decode().split(":")
        assert props.message_id == i and props.content_type == "text/plain"
        assert method.redelivered is False
        received[q].append(int(i))
        channel.basic_ack(method.delivery_tag)

    for q in queues:
        ch.basic_consume(q, on_message)
    deadline_checks = 0
    while sum(map(len, received.values())) < 10_000 and deadline_checks < 600:
        conn.process_data_events(time_limit=0.1)
        deadline_checks += 1
    for k, q in enumerate(queues):
        assert received[q] == list(range(k, 10_000, 8)), q
    for q in queues:
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        ch.queue_delete(q)
    conn.close()


def test_aio_pika_publish_consume_in_order(broker):
    async def scenario():
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
        async with conn:
            ch = await conn.channel()
            queues = names_on_every_shard(broker.shards, per_shard=2, prefix="aio")
            declared = [await ch.declare_queue(q, auto_delete=False) for q in queues]
            for i in range(2000):
                await ch.default_exchange.publish(
                    aio_pika.Message(str(i).encode(), headers={"n": i}),
                    routing_key=queues[i % len(queues)])
            for k, queue in enumerate(declared):
                got = []
                async with queue.iterator() as it:
                    async for message in it:
                        async with message.process():
                            assert message.headers["n"] == int(message.body)
                            got.append(int(message.body))
                        if len(got) == 2000 // len(queues):
                            break
                assert got == list(range(k, 2000, len(queues)))
                await queue.delete()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_basic_get_and_counts(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-")
    assert ch.basic_get(q) == (None, None, None)
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 3)
    method, props, body = ch.basic_get(q)
    assert body == b"m0" and method.message_count == 2 and not method.redelivered
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, props, body = ch.basic_get(q)
    assert body == b"m0" and method.redelivered
    ch.basic_ack(method.delivery_tag)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"m1"
    assert ch.queue_purge(q).method.message_count == 1
    assert ch.basic_get(q) == (None, None, None)
    conn.close()


def test_two_consumers_share_round_robin(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("rr").method.queue
    ch.queue_purge(q)
    got: dict[str, list[int]] = {"a": [], "b": []}
    for tag in got:
        ch.basic_consume(q, lambda c, m, p, b, tag=tag: (got[tag].append(int(b)),
                                                         c.basic_ack(m.delivery_tag)),
                         consumer_tag=tag)
    for i in range(100):
        ch.basic_publish("", q, str(i).encode())
    while sum(map(len, got.values())) < 100:
        conn.process_data_events(time_limit=0.1)
    assert got["a"] == list(range(0, 100, 2)) or got["a"] == list(range(1, 100, 2))
    assert sorted(got["a"] + got["b"]) == list(range(100))
    ch.queue_delete(q)
    conn.close()


def test_message_properties_and_large_body_byte_for_byte(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = os.urandom(1_000_000)  # split into many frames by frame-max
    props = pika.BasicProperties(
        content_type="application/octet-stream", content_encoding="identity",
        headers={"a": 1, "nested": {"b": [1, "two", decimal.Decimal("3.5")]}, "s": "str"}, delivery_mode=2,
        priority=5, correlation_id="corr", reply_to="reply", expiration="60000",
        message_id="mid", timestamp=1_700_000_000, type="kind", user_id="guest",
        app_id="tests", cluster_id="c")
    ch.basic_publish("", q, body, props)
    ch.basic_publish("", q, b"")  # empty bodies have no body frame at all
    method, got_props, got_body = wait_until(lambda: _get(ch, q))
    assert got_body == body
    for field in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                  "type", "user_id", "app_id", "cluster_id"):
        assert getattr(got_props, field) == getattr(props, field), field
    assert _get(ch, q)[2] == b""
    conn.close()


def _get(ch, q):
    method, props, body = ch.basic_get(q, auto_ack=True)
    return (method, props, body) if method is not None else None


def test_py_amqp_client(broker):
    with amqp.Connection(f"127.0.0.1:{broker.port}") as conn:
        ch = conn.channel()
        q, _, _ = ch.queue_declare("", exclusive=True)
        ch.exchange_declare("pyamqp-x", "direct", auto_delete=False)
        ch.queue_bind(q, "pyamqp-x", "k")
        ch.basic_publish(amqp.Message("hello", application_headers={"h": "v"}), "pyamqp-x", "k")
        msg = wait_until(lambda: ch.basic_get(q, no_ack=True))
        # py-amqp encodes str bodies as UTF-8 and decodes them back by content_encoding
        assert msg.body == "hello" and msg.headers == {"h": "v"}
        assert msg.properties["content_encoding"] == "utf-8"
        ch.exchange_delete("pyamqp-x")


def test_client_killed_mid_stream_does_not_disturb_others(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("killed").method.queue
    ch.queue_purge(q)
    for i in range(200):
        ch.basic_publish("", q, str(i).encode())
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pika, sys
        conn = pika.BlockingConnection(pika.ConnectionParameters('127.0.0.1', {broker.port}))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        def on(c, m, p, b):
            print(b.decode(), flush=True)   # hold everything unacked
        ch.basic_consume('{q}', on)
        ch.start_consuming()
        """)], stdout=subprocess.PIPE, cwd=ROOT)
    assert worker.stdout.readline().strip() == b"0"
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    worker.stdout.close()
    # Once the broker has seen the hang-up, the killed worker's 50 are ready again.
    deadline = time.monotonic() + 10
    while ch.queue_declare(q, passive=True).method.message_count < 200:
        assert time.monotonic() < deadline, "the killed worker's messages were not requeued"
        conn.process_data_events(time_limit=0.05)
    # The survivor gets everything, the killed worker's 50 first and marked redelivered.
    got = []

    def on_message(c, m, p, b):
        got.append((int(b), m.redelivered))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on_message)
    while len(got) < 200:
        conn.process_data_events(time_limit=0.1)
    assert [n for n, _ in got] == list(range(200))
    assert all(red for n, red in got if n < 50)
    assert not any(red for n, red in got if n >= 50)
    ch.queue_delete(q)
    conn.close()


def test_pika_tutorials_hello_world_and_work_queues(broker):
    """RabbitMQ's tutorials 1 and 2, unchanged but for the port."""
    hello_send = f"""
import pika
connection = pika.BlockingConnection(pika.ConnectionParameters('localhost', {broker.port}))
channel = connection.channel()
channel.queue_declare(queue='hello')
channel.basic_publish(exchange='', routing_key='hello', body='Hello World!')
print(" [x] Sent 'Hello World!'")
connection.close()
"""
    hello_receive = f"""
import pika
connection = pika.BlockingConnection(pika.ConnectionParameters('localhost', {broker.port}))
channel = connection.channel()
channel.queue_declare(queue='hello')
def callback(ch, method, properties, body):
    print(f" [x] Received {{body}}", flush=True)
    ch.stop_consuming()
channel.basic_consume(queue='hello', on_message_callback=callback, auto_ack=True)
channel.start_consuming()
"""
    new_task = f"""
import sys, pika
connection = pika.BlockingConnection(pika.ConnectionParameters('localhost', {broker.port}))
channel = connection.channel()
channel.queue_declare(queue='task_queue', durable=True)
message = ' '.join(sys.argv[1:]) or "Hello World!"
channel.basic_publish(exchange='', routing_key='task_queue', body=message,
    properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
print(f" [x] Sent {{message}}")
connection.close()
"""
    worker = f"""
import pika, time
connection = pika.BlockingConnection(pika.ConnectionParameters('localhost', {broker.port}))
channel = connection.channel()
channel.queue_declare(queue='task_queue', durable=True)
seen = 0
def callback(ch, method, properties, body):
    global seen
    print(f" [x] Received {{body.decode()}}", flush=True)
    time.sleep(body.count(b'.') / 100)
    ch.basic_ack(delivery_tag=method.delivery_tag)
    seen += 1
    if seen == 3:
        ch.stop_consuming()
channel.basic_qos(prefetch_count=1)
channel.basic_consume(queue='task_queue', on_message_callback=callback)
channel.start_consuming()
"""

    def run(code: str, *args: str) -> str:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              timeout=60, check=True, cwd=ROOT).stdout.decode()

    assert "Sent 'Hello World!'" in run(hello_send)
    assert "Received b'Hello World!'" in run(hello_receive)
    for task in ("First message.", "Second message..", "Third message..."):
        run(new_task, task)
    out = run(worker)
    assert out.splitlines() == [" [x] Received First message.", " [x] Received Second message..",
                                " [x] Received Third message..."]


def test_sigterm_closes_connections_with_320_and_exits_zero(fresh_broker):
    fresh_broker.start()
    conn = connect(fresh_broker)
    fresh_broker.signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(200):
            conn.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert "CONNECTION_FORCED" in info.value.reply_text
    assert fresh_broker.wait(20) == 0


def shard_pids(broker) -> list[int]:
    """The broker's shard processes: the gateway's children running shards.main."""
    return list(shard_processes(broker).values())


def shard_processes(broker) -> dict[int, int]:
    """Shard index -> pid, for the broker's children running shards.main."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == broker.process.pid and b"warren.shards.main" in args:
            found[int(args[args.index(b"warren.shards.main") + 1])] = int(entry)
    return found


def test_killed_shard_is_restarted_and_others_keep_working(fresh_broker):
    fresh_broker.start()
    conn = connect(fresh_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    queues = names_on_every_shard(2, per_shard=1, prefix="crash")
    for q in queues:
        ch.queue_declare(q)
        ch.basic_publish("", q, b"before")
    cancelled = []
    ch.basic_consume(queues[0], lambda *a: None, consumer_tag="on-shard-0")
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    victims = shard_pids(fresh_broker)
    assert len(victims) == 2
    shard0 = sorted(victims)[0]  # started first: shard 0
    os.kill(shard0, signal.SIGKILL)
    wait_until(lambda: (conn.process_data_events(time_limit=0.05), cancelled)[1], timeout=10)
    assert cancelled == ["on-shard-0"]
    # The other shard's queue kept its message; the dead shard's transient queue is gone.
    method, _, body = ch.basic_get(queues[1], auto_ack=True)
    assert body == b"before"
    wait_until(lambda: len(shard_pids(fresh_broker)) == 2 and shard0 not in
               shard_pids(fresh_broker), timeout=10)
    ch.queue_declare(queues[0])
    ch.basic_publish("", queues[0], b"after", mandatory=True)  # confirmed by the new shard
    assert wait_until(lambda: _get(ch, queues[0]))[2] == b"after"
    conn.close()


def test_queue_delete_conditions_counts_and_auto_delete(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("del-q")
    ch.queue_purge("del-q")
    for i in range(3):
        ch.basic_publish("", "del-q", b"x")
    wait_until(lambda: ch.queue_declare("del-q", passive=True).method.message_count == 3)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_delete("del-q", if_empty=True)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - queue 'del-q' in vhost '/' not empty"
    ch = conn.channel()
    tag = ch.basic_consume("del-q", lambda *a: None, consumer_tag="busy")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_delete("del-q", if_unused=True)
    assert info.value.reply_text == "PRECONDITION_FAILED - queue 'del-q' in vhost '/' in use"
    ch.basic_cancel(tag)
    ch.basic_recover(requeue=True)
    assert ch.queue_delete("del-q").method.message_count == 3
    # An auto-delete queue goes when its last consumer does.
    q = ch.queue_declare("auto-q", auto_delete=True).method.queue
    tag = ch.basic_consume(q, lambda *a: None)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    ch.basic_cancel(tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        wait_until(lambda: ch.queue_declare(q, passive=True) and False, timeout=5)
    assert info.value.reply_code == 404
    conn.close()


def test_fanout_and_topic_exchanges_route_like_the_tutorials(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("logs", "fanout")
    ch.exchange_declare("topic_logs", "topic")
    fan = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for q in fan:
        ch.queue_bind(q, "logs")
    kern = ch.queue_declare("", exclusive=True).method.queue
    crit = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(kern, "topic_logs", "kern.*")
    ch.queue_bind(crit, "topic_logs", "#.critical")
    ch.basic_publish("logs", "ignored", b"to all")
    for key in ("kern.critical", "kern.info", "app.critical", "app.info", "kern.disk.full"):
        ch.basic_publish("topic_logs", key, key.encode())
    for q in fan:
        assert wait_until(lambda: _get(ch, q))[2] == b"to all"

    def bodies(q):
        out = []
        while (got := _get(ch, q)) is not None:
            out.append(got[2].decode())
        return out

    wait_until(lambda: ch.queue_declare(crit, passive=True).method.message_count == 2)
    assert bodies(kern) == ["kern.critical", "kern.info"]
    assert bodies(crit) == ["kern.critical", "app.critical"]
    ch.exchange_delete("logs")
    ch.exchange_delete("topic_logs")
    conn.close()
