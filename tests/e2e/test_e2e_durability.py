"""Durability end to end: restarts, shard-count changes, SIGKILL of any process.
Whatever a publisher was told is stored stays stored."""

from __future__ import annotations

import os
import random
import signal
import struct
import time

import pika
import pytest

from ..support.broker import RunningBroker, wait_until
from ..support.confirmpublisher import ConfirmPublisher
from .test_e2e_basic import names_on_every_shard, shard_pids

pytestmark = pytest.mark.slow  # started first: the two workers then finish together

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))


def drain(ch, queue: str, timeout: float = 20.0) -> list[tuple[bytes, bool]]:
    """Every message now in `queue`, in order, as (body, redelivered)."""
    expected = ch.queue_declare(queue, passive=True).method.message_count
    out = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: out.append((b, m.redelivered)),
                           auto_ack=True)
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        assert time.monotonic() < deadline, "queue did not drain in time"
        ch.connection.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return out


def test_durable_definitions_and_persistent_messages_survive_restart(tmp_path):
    data = tmp_path / "data"
    broker = RunningBroker(data, shards=2).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.exchange_declare("durable-x", "direct", durable=True)
        ch.exchange_declare("transient-x", "direct", durable=False)
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("transient-q", durable=False)
        ch.queue_bind("durable-q", "durable-x", "rk")
        ch.confirm_delivery()
        for i in range(100):
            props = PERSISTENT if i % 2 == 0 else pika.BasicProperties(delivery_mode=1)
            ch.basic_publish("durable-x", "rk", b"%d" % i, props)
        ch.basic_publish("", "transient-q", b"gone", PERSISTENT)
        conn.close()
    finally:
        broker.stop()
    assert broker.process.returncode == 0

    broker = RunningBroker(data, shards=2).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        # Persistent messages came back in order; transient ones did not.
        assert [b for b, _ in drain(ch, "durable-q")] == [b"%d" % i for i in range(0, 100, 2)]
        ch.basic_publish("durable-x", "rk", b"binding survived")
        assert wait_until(lambda: drain(ch, "durable-q"))[0][0] == b"binding survived"
        for kind, name in (("queue", "transient-q"), ("exchange", "transient-x")):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                if kind == "queue":
                    ch.queue_declare(name, passive=True)
                else:
                    ch.exchange_declare(name, passive=True)
            assert info.value.reply_code == 404
            ch = conn.channel()
        conn.close()
    finally:
        broker.stop()


def test_restart_with_other_shard_counts_finds_every_queue(tmp_path):
    data = tmp_path / "data"
    queues = names_on_every_shard(4, per_shard=1, prefix="moving")
    broker = RunningBroker(data, shards=4).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        ch.confirm_delivery()
        for q in queues:
            ch.queue_declare(q, durable=True)
            for i in range(5):
                ch.basic_publish("", q, f"{q}/{i}".encode(), PERSISTENT)
        conn.close()
    finally:
        broker.stop()
    for shards in (2, 3, 1, 4):
        broker = RunningBroker(data, shards=shards).start()
        try:
            conn = connect(broker)
            ch = conn.channel()
            ch.confirm_delivery()
            for q in queues:
                got = [b.decode() for b, _ in drain(ch, q)]
                assert got == [f"{q}/{i}" for i in range(5)], (shards, q, got)
                for i in range(5):  # put them back for the next round
                    ch.basic_publish("", q, f"{q}/{i}".encode(), PERSISTENT)
            conn.close()
        finally:
            broker.stop()


def _kill_round(tmp_path, seed: int, victim: str) -> None:
    rng = random.Random(seed)
    data = tmp_path / f"data-{victim}-{seed}"
    broker = RunningBroker(data, shards=2).start()
    publisher = ConfirmPublisher(broker.port, "kill-q")
    try:
        deadline = time.monotonic() + rng.uniform(0.3, 1.2)
        while time.monotonic() < deadline:
            publisher.publish(rng.randint(1, 200))
            time.sleep(0.001)
        if victim == "shard":
            os.kill(rng.choice(shard_pids(broker)), signal.SIGKILL)
            # The gateway restarts the shard; the connection lives on.
            publisher.publish(50)
            wait_until(lambda: len(publisher.acked | publisher.nacked) >= publisher.sent - 50,
                       timeout=20)
        elif victim == "gateway":
            broker.process.send_signal(signal.SIGKILL)
        else:  # the whole broker at once
            pids = [broker.process.pid, *shard_pids(broker)]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        if victim != "shard":
            broker.process.wait(10)
            wait_until(lambda: publisher.closed.is_set(), timeout=10)
    finally:
        publisher.close()
        broker.stop()
    assert not publisher.answered_twice
    assert not (publisher.acked & publisher.nacked)
    confirmed = publisher.acked

    # After a restart every confirmed message is there (perhaps marked redelivered).
    wait_until_gone(data)
    broker = RunningBroker(data, shards=2).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        stored = [struct.unpack(">Q", body)[0] for body, _ in drain(ch, "kill-q", timeout=60)]
        conn.close()
    finally:
        broker.stop()
    missing = confirmed - set(stored)
    assert not missing, f"{len(missing)} confirmed messages lost ({victim}, seed {seed})"
    assert len(stored) == len(set(stored)), "a message was stored twice"
    assert stored == sorted(stored), "queue order changed"


def wait_until_gone(data, timeout: float = 10.0) -> None:
    """Wait until no process of the broker on `data` is left: the root names it on
    its command line, a shard (given its spec on stdin) maps its store."""
    wait_until(lambda: not any(_of_broker(pid, f"{data}") for pid in _all_pids()),
               timeout=timeout, message=f"(processes of {data} still running)")


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _of_broker(pid: int, data: str) -> bool:
    for name in ("cmdline", "maps"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if data in f.read().decode(errors="replace"):
                    return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize("victim", ["shard", "gateway", "everything"])
def test_kill_loses_no_confirmed_message(tmp_path, victim, gateway_count):
    _kill_round(tmp_path, gateway_count, victim)  # a seed per gateway count: 1, 2


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(100, 130))
@pytest.mark.parametrize("victim", ["shard", "gateway", "everything"])
def test_kill_soak(tmp_path, victim, seed):
    _kill_round(tmp_path, seed, victim)


def test_transactions_commit_rollback_with_pika(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed")
    assert ch.queue_declare(q, passive=True).method.message_count == 0  # not before commit
    ch.tx_commit()
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    method, _, body = ch.basic_get(q)
    assert body == b"committed"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()  # the ack is undone: the message is still unacked on this channel
    ch.basic_ack(method.delivery_tag)  # and can be acked again, then committed
    ch.tx_commit()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.confirm_delivery()  # the modes exclude each other (test_channel_protocol.py)
    assert info.value.reply_code == 406
    conn.close()


def test_memory_watermark_blocks_publishers_and_drops_nothing(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--memory-limit", "2000000"]).start()
    try:
        blocked, unblocked = [], []
        pub = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        pub.add_on_connection_blocked_callback(lambda c, f: blocked.append(f.method.reason))
        pub.add_on_connection_unblocked_callback(lambda c, f: unblocked.append(True))
        ch = pub.channel()
        ch.queue_declare("watermark")
        body = b"m" * 100_000
        for _ in range(40):  # 4 MB of transient bodies, twice the limit
            ch.basic_publish("", "watermark", body)
        wait_until(lambda: "resource alarm memory on" in broker.log_text(), timeout=10)
        ch.basic_publish("", "watermark", body)  # as RabbitMQ, blocked at its next publish
        wait_until(lambda: (pub.process_data_events(time_limit=0.05), blocked)[1], timeout=10)
        assert blocked == ["low on memory"]
        # A consumer on its own connection drains the queue: the alarm clears.
        con = connect(broker)
        got = []
        con.channel().basic_consume("watermark", lambda c, m, p, b: got.append(len(b)),
                                    auto_ack=True)
        wait_until(lambda: (con.process_data_events(time_limit=0.05),
                            pub.process_data_events(time_limit=0.01), unblocked)[2], timeout=20)
        wait_until(lambda: (con.process_data_events(time_limit=0.05), len(got) == 41)[1],
                   timeout=20)
        assert got == [100_000] * 41  # nothing was dropped
        pub.close()
        con.close()
    finally:
        broker.stop()


def test_group_commit_shares_fsyncs_between_publishers(tmp_path):
    """10,000 confirmed persistent publishes from 8 concurrent publishers take far
    fewer fsyncs than messages: one commit covers a whole loop turn's writes."""
    import json
    import threading

    data = tmp_path / "data"
    broker = RunningBroker(data, shards=1).start()
    publishers = [ConfirmPublisher(broker.port, f"group-{i}") for i in range(8)]
    try:
        def run(publisher: ConfirmPublisher) -> None:
            while publisher.sent < 1250:
                publisher.publish(25)  # then wait for the confirms, as a careful publisher does
                wait_until(lambda: len(publisher.acked) == publisher.sent, timeout=30)

        threads = [threading.Thread(target=run, args=(p,)) for p in publishers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sum(len(p.acked) for p in publishers) == 10_000
    finally:
        for publisher in publishers:
            publisher.close()
        broker.stop()
    records = [json.loads(line) for line in (data / "logs" / "shard-0.jsonl").open()]
    last = [r for r in records if r["type"] == "shard_stats"][-1]
    print(f"group commit: {last['fsyncs']} fsyncs for {last['messages']} durable writes; "
          f"batch histogram {last['fsync_batch']}")
    assert last["messages"] >= 10_000
    assert last["fsyncs"] * 10 < last["messages"]


def test_disk_alarm_blocks_publishers_but_not_consumers(tmp_path):
    # A free-disk limit larger than any disk: the alarm is on from the start.
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--disk-free-limit", str(10**18)]).start()
    try:
        pub = connect(broker)
        blocked = []
        pub.add_on_connection_blocked_callback(lambda c, f: blocked.append(f.method.reason))
        ch = pub.channel()
        ch.queue_declare("disk-q")
        ch.basic_publish("", "disk-q", b"first")  # the connection is blocked at it
        wait_until(lambda: (pub.process_data_events(time_limit=0.05), blocked)[1], timeout=10)
        assert blocked == ["low on disk"]
        con = connect(broker)  # a consumer is still served (and nothing came)
        consumer = con.channel()
        assert consumer.basic_get("disk-q", auto_ack=True) == (None, None, None)
        assert consumer.basic_consume("disk-q", lambda *args: None)
        con.close()
    finally:
        broker.stop()


def test_full_store_blocks_publishers_and_keeps_what_it_confirmed(tmp_path):
    # The journal takes a commit before LMDB does: LMDB's map fills at a checkpoint,
    # which turns the disk alarm on (publishers are blocked) and nacks what rides
    # on it. The map is then over its size by at most what the journal held.
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--store-map-size", str(2 << 20)]).start()
    publisher = ConfirmPublisher(broker.port, "full")

    def alarm() -> bool:
        return "resource alarm disk on" in broker.log_text()

    try:
        body = b"f" * 20_000
        while not alarm() and publisher.sent < 1000:
            publisher.publish(10, body=body)
            wait_until(lambda: len(publisher.acked | publisher.nacked) == publisher.sent
                       or alarm(), timeout=10)
        assert alarm(), "a full store must block publishers"
        assert not (publisher.acked & publisher.nacked)
        assert len(publisher.acked) * len(body) < (2 << 20) + (16 << 20)
    finally:
        publisher.close()
        broker.stop()
    # What was acked is still there after a restart.
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--store-map-size", str(2 << 20)]).start()
    try:
        conn = connect(broker)
        ch = conn.channel()
        stored = {struct.unpack(">Q", b[:8])[0] for b, _ in drain(ch, "full")}
        assert publisher.acked <= stored
        conn.close()
    finally:
        broker.stop()


def test_each_shard_writes_its_journal_past_the_page_cache(tmp_path):
    """A confirm waits for one synchronous write: every shard's journal is open
    with O_DIRECT | O_DSYNC wherever the data directory's filesystem takes it."""
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    broker = RunningBroker(tmp_path / "data", shards=2).start()
    try:
        wait_until(lambda: len(shard_pids(broker)) == 2, message="two shards")
        direct = os.O_DIRECT | os.O_DSYNC
        for pid in shard_pids(broker):
            # (a shard opens its store once it runs: the flags of its journal's
            # descriptors, when they are there)
            wait_until(lambda: any(f & direct == direct for f in _journal_flags(pid)),
                       message=f"shard {pid}: a journal descriptor with O_DIRECT | O_DSYNC")
    finally:
        broker.stop()


def _journal_flags(pid: int) -> list[int]:
    """The open flags of each descriptor process `pid` holds on a journal."""
    flags = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/journal"):
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags += [int(line.split()[1], 8) for line in f if line.startswith("flags:")]
        except FileNotFoundError:  # closed meanwhile
            continue
    return flags
