"""Quorum queues, consumer timeouts (RabbitMQ 4.3's rules), lock renewal and
consumer cancel notifications, end to end. The broker's global consumer_timeout
is lowered to 300 ms so that the timeouts happen within the tests."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pika
import pika.exceptions
import pytest

from warren.gateway.amqp import methods as m

from ..support.broker import RunningBroker, wait_until
from ..support.rawclient import RawClient
from .test_e2e_basic import connect, shard_pids
from .test_e2e_routing import get_one, unique

GLOBAL_TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gateway_count):
    running = RunningBroker(tmp_path_factory.mktemp("qt") / "data", shards=2,
                            extra_args=["--consumer-timeout", str(GLOBAL_TIMEOUT_MS)]).start()
    yield running
    running.stop()


def quorum(ch, name: str | None = None, **arguments) -> str:
    name = name or unique("qq")
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", **arguments})
    return name


def get_manual(ch, queue: str, timeout: float = 5.0):
    return get_one(ch, queue, timeout, auto_ack=False)


def pump(conn, seconds: float) -> None:
    """Let pika process what arrives for `seconds` (time is the subject here)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.02)


# -- delivery counting --------------------------------------------------------------


def test_delivery_count_counts_rejects_not_nacks(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = quorum(ch)
    ch.basic_publish("", queue, b"m", pika.BasicProperties(delivery_mode=2))
    counts = []
    for settle in ("first", "reject", "nack", "reject", "final"):
        method, props, _ = get_manual(ch, queue)
        counts.append((props.headers or {}).get("x-delivery-count"))
        if settle in ("first", "reject"):
            ch.basic_reject(method.delivery_tag, requeue=True)
        elif settle == "nack":
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
    # none at first; a reject counts; a nack with requeue does not
    assert counts == [None, 1, 2, 2, 3]
    conn.close()


def test_delivery_limit_dead_letters(broker):
    conn = connect(broker)
    ch = conn.channel()
    dead = ch.queue_declare(unique("dead")).method.queue
    queue = quorum(ch, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                          "x-dead-letter-routing-key": dead})
    ch.basic_publish("", queue, b"poison")
    for _ in range(2):
        method, _props, _body = get_manual(ch, queue)
        ch.basic_reject(method.delivery_tag, requeue=True)
    _method, props, body = get_manual(ch, dead)
    assert body == b"poison"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert ch.basic_get(queue)[0] is None
    conn.close()


def test_delivery_count_and_transient_messages_survive_restart(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=2).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        quorum(ch, "kept")
        ch.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
        # A quorum queue keeps every message, whatever its delivery mode (RabbitMQ).
        ch.basic_publish("", "kept", b"transient", pika.BasicProperties(delivery_mode=1))
        method, _props, _ = get_manual(ch, "kept")
        ch.basic_reject(method.delivery_tag, requeue=True)
        method, props, _ = get_manual(ch, "kept")
        assert props.headers["x-delivery-count"] == 1
        conn.close()  # consumer lost: a failed delivery too
        broker.stop()
        broker.start()
        conn = connect(broker)
        ch = conn.channel()
        _method, props, body = get_manual(ch, "kept")
        assert body == b"m" and props.headers["x-delivery-count"] == 2
        assert get_manual(ch, "kept")[2] == b"transient"
        conn.close()
    finally:
        broker.stop()


# -- consumer timeouts ----------------------------------------------------------------


def raw_timeout_text(broker, queue: str, consume_arguments: dict | None = None) -> tuple:
    """Consume one message with a client that does not advertise
    consumer_cancel_notify, hold it, and return the channel.close it gets and how
    long that took."""
    client = RawClient(broker.port, timeout=10)
    try:
        client.handshake(capabilities={})
        client.open_channel(1)
        client.send_method(1, m.BasicConsume(queue=queue, consumer_tag="raw",
                                             arguments=consume_arguments or {}))
        started = time.monotonic()
        while True:
            frame = client.next_method(timeout=10)
            assert frame is not None, "no channel.close came"
            if isinstance(frame[1], m.ChannelClose):
                return frame[1], time.monotonic() - started
    finally:
        client.close()


@pytest.mark.parametrize("level", ["global", "queue", "consumer", "consumer-over-queue"])
def test_timeout_precedence(broker, level):
    conn = connect(broker)
    ch = conn.channel()
    queue_args, consume_args, expected = {}, {}, GLOBAL_TIMEOUT_MS
    if level == "queue":
        queue_args, expected = {"x-consumer-timeout": 200}, 200
    elif level == "consumer":
        consume_args, expected = {"x-consumer-timeout": 400}, 400
    elif level == "consumer-over-queue":
        queue_args, consume_args, expected = ({"x-consumer-timeout": 200},
                                              {"x-consumer-timeout": 500}, 500)
    queue = quorum(ch, **queue_args)
    ch.basic_publish("", queue, b"held")
    conn.close()
    close, waited = raw_timeout_text(broker, queue, consume_args)
    assert close.reply_code == 406
    assert close.reply_text == (
        "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
        f"used: {expected} ms. This timeout value can be configured, see consumers doc guide "
        "to learn more")
    assert waited >= expected / 1000 * 0.9
    # the message went back to the queue, marked redelivered, and was not counted as failed
    conn = connect(broker)
    ch = conn.channel()
    method, props, body = get_manual(ch, queue)
    assert (body, method.redelivered) == (b"held", True)
    assert "x-delivery-count" not in (props.headers or {})
    conn.close()


def test_capable_client_gets_cancel_and_keeps_its_channel(broker):
    """pika advertises consumer_cancel_notify: only the timed-out consumer goes."""
    conn = connect(broker)
    ch = conn.channel()
    slow, other = quorum(ch), ch.queue_declare(unique("classic")).method.queue
    cancelled, got = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(slow, lambda c, method, p, body: got.append(method.delivery_tag),
                     consumer_tag="slow")
    ch.basic_consume(other, lambda c, method, p, body: got.append(body), consumer_tag="other",
                     auto_ack=True)
    ch.basic_publish("", slow, b"held")
    wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=5)
    assert cancelled == ["slow"]
    # acking the timed-out delivery is no error; the channel and its other consumer live on
    ch.basic_ack(got[0])
    ch.basic_publish("", other, b"still here")
    wait_until(lambda: (conn.process_data_events(0.02), b"still here" in got)[1], timeout=5)
    assert ch.is_open
    conn.close()


def test_partial_timeout_returns_only_the_expired_messages(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = quorum(ch)
    tags = {}
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(queue, lambda c, method, p, body: tags.setdefault(body, method.delivery_tag),
                     arguments={"x-consumer-timeout": 600})
    ch.basic_publish("", queue, b"early")
    wait_until(lambda: (conn.process_data_events(0.02), "early" and b"early" in tags)[1])
    pump(conn, 0.35)
    ch.basic_publish("", queue, b"late")  # its lock starts ~350 ms after early's
    wait_until(lambda: (conn.process_data_events(0.02), b"late" in tags)[1])
    wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=5)
    ch.basic_ack(tags[b"late"])  # still within its own lock: acked for good
    second = connect(broker)
    sch = second.channel()
    method, _props, body = get_manual(sch, queue)
    assert (body, method.redelivered) == (b"early", True)
    sch.basic_ack(method.delivery_tag)
    pump(conn, 0.5)  # past late's lock: had it not been acked, it would come back now
    assert sch.basic_get(queue)[0] is None
    second.close()
    conn.close()


def test_classic_queues_never_time_out(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = ch.queue_declare(unique("classic"),
                             arguments={"x-consumer-timeout": 100}).method.queue
    cancelled, tags = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(queue, lambda c, method, p, body: tags.append(method.delivery_tag))
    ch.basic_publish("", queue, b"kept long")
    pump(conn, 1.0)  # more than three times the global timeout
    assert len(tags) == 1 and cancelled == []
    ch.basic_ack(tags[0])
    conn.close()


def renew(ch, consumer_tag: str, delivery_tag: int | None = None) -> None:
    headers = {"x-renew-all": True} if delivery_tag is None else {"x-delivery-tag": delivery_tag}
    ch.basic_publish("amq.warren.renew", consumer_tag, b"",
                     pika.BasicProperties(headers=headers))


@pytest.mark.parametrize("renew_all", [False, True])
def test_lock_renewal_keeps_a_message_past_its_timeout(broker, renew_all):
    conn = connect(broker)
    ch = conn.channel()
    queue = quorum(ch)
    tags, cancelled = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(queue, lambda c, method, p, body: tags.append(method.delivery_tag),
                     consumer_tag="worker", arguments={"x-consumer-timeout": 1500})
    ch.basic_publish("", queue, b"long task")
    wait_until(lambda: (conn.process_data_events(0.02), tags)[1])
    deadline = time.monotonic() + 3.0
    # A three-second task renewing every 200 ms: a lock of 1.5 s leaves a loaded
    # machine's scheduling room (500 ms did not, under the whole suite's load).
    while time.monotonic() < deadline:
        renew(ch, "worker", None if renew_all else tags[0])
        pump(conn, 0.2)
    assert cancelled == []
    ch.basic_ack(tags[0])
    # and one that stops renewing times out
    ch.basic_publish("", queue, b"abandoned")
    wait_until(lambda: (conn.process_data_events(0.02), len(tags) == 2)[1])
    renew(ch, "worker", tags[1])
    wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=5)
    conn.close()


def test_aio_pika_consumer_is_cancelled_on_timeout(broker):
    import aio_pika

    async def scenario() -> None:
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(unique("qq"), durable=True,
                                           arguments={"x-queue-type": "quorum"})
            received = asyncio.Event()

            async def hold(message) -> None:  # never settles it
                received.set()

            tag = await queue.consume(hold)
            await ch.default_exchange.publish(aio_pika.Message(b"x"), queue.name)
            await asyncio.wait_for(received.wait(), 5)
            channel = await ch.get_underlay_channel()
            for _ in range(200):  # aio-pika drops a consumer the broker cancelled
                if tag not in channel.consumers:
                    break
                await asyncio.sleep(0.02)
            assert tag not in channel.consumers
            assert not ch.is_closed

    asyncio.run(scenario())


# -- cancel notifications -----------------------------------------------------------


def test_queue_deletion_cancels_consumers_of_capable_clients_only(broker):
    conn = connect(broker)
    ch = conn.channel()
    queue = ch.queue_declare(unique("doomed")).method.queue
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(queue, lambda *a: None, consumer_tag="capable")
    raw = RawClient(broker.port)
    raw.handshake(capabilities={})
    raw.open_channel(1)
    raw.send_method(1, m.BasicConsume(queue=queue, consumer_tag="incapable"))
    assert isinstance(raw.next_method()[1], m.BasicConsumeOk)
    other = connect(broker)
    other.channel().queue_delete(queue)  # deleted by someone else
    wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=5)
    assert cancelled == ["capable"]
    raw.send_method(1, m.ChannelClose(reply_code=200, reply_text="bye"))
    assert isinstance(raw.next_method()[1], m.ChannelCloseOk)  # no basic.cancel came first
    raw.close()
    # a client's own cancel racing the broker's gets cancel-ok, not an error
    ch.basic_cancel("capable")
    assert ch.is_open
    other.close()
    conn.close()


def test_shard_kill_cancels_consumers_and_durable_messages_come_back(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        queue = quorum(ch, "survivor")
        for i in range(3):
            ch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        cancelled = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        ch.basic_consume(queue, lambda *a: None, consumer_tag="c",
                         arguments={"x-cancel-on-ha-failover": True})
        os.kill(shard_pids(broker)[0], signal.SIGKILL)
        wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=10)
        assert cancelled == ["c"]
        conn.close()
        bodies = []

        getter = connect(broker)

        def taken() -> bool:
            # Until the shard is back a get is refused as RabbitMQ refuses one on a
            # crashed queue: the channel closes with 404, the connection stays.
            ch = getter.channel()
            try:
                while (body := ch.basic_get(queue, auto_ack=True)[2]) is not None:
                    bodies.append(body)
            except pika.exceptions.ChannelClosedByBroker as closed:
                assert closed.reply_code == 404, closed
                assert closed.reply_text == (f"NOT_FOUND - queue '{queue}' in vhost '/' "
                                             "has crashed and failed to restart"), closed
            return len(bodies) == 3
        wait_until(taken, timeout=10)
        assert bodies == [b"0", b"1", b"2"]
        getter.close()
    finally:
        broker.stop()
