"""The disk alarm and a full disk, end to end against `warren serve` with its data
on a small tmpfs (skipped where mounting is not allowed): publishers are held
back before their first publish reaches a queue, the alarm clears once consumed
data is gone, a shard whose disk is full nacks, raises the alarm and keeps
running, and a broker stopped on a full disk starts on it and serves what it had."""

from __future__ import annotations

import os
import shutil
import signal
import struct

import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.storage import journal

from ..support.broker import RunningBroker, mounted_tmpfs, wait_until
from ..support.confirmpublisher import ConfirmPublisher
from ..support.rawclient import RawClient
from .test_e2e_basic import shard_pids, shard_processes

# started first (slow); the alarms are the root's, followed by every gateway
pytestmark = [pytest.mark.slow, pytest.mark.most_gateways]

MB = 1 << 20


@pytest.fixture
def tmpfs(tmp_path):
    """A mounted tmpfs of 48 MB."""
    with mounted_tmpfs(tmp_path / "disk", "48m") as mount:
        yield mount


def connect(broker, events: list) -> pika.BlockingConnection:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    conn.add_on_connection_blocked_callback(lambda c, f: events.append(f.method.reason))
    conn.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
    return conn


def message_count(broker, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    count = conn.channel().queue_declare(queue, passive=True).method.message_count
    conn.close()
    return count


def test_first_publish_under_the_disk_alarm_is_not_confirmed(tmp_path):
    """Issue 51's finding, as found: a fresh connection's first publish with
    confirms under the disk alarm was confirmed at once. RabbitMQ 3.10 confirmed
    nothing within 8 s: it blocks the connection at the publish's content header."""
    # A free-disk limit larger than any disk: the alarm is on from the start.
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--disk-free-limit", str(10**18)]).start()
    try:
        pub = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, blocked_connection_timeout=2))
        ch = pub.channel()
        ch.queue_declare("held")
        ch.confirm_delivery()
        # pika waits for the confirm, and gives up 2 s after connection.blocked came
        with pytest.raises(pika.exceptions.ConnectionBlockedTimeout):
            ch.basic_publish("", "held", b"x")
        assert message_count(broker, "held") == 0
    finally:
        broker.stop()


def test_publishes_and_what_follows_them_in_one_write_wait_under_the_disk_alarm(tmp_path):
    """Raw frames in one TCP write: two publishes, a declare and a heartbeat. As
    RabbitMQ, the broker answers connection.blocked and reads nothing after the
    first publish's method, while other connections are served."""
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--disk-free-limit", str(10**18)]).start()
    client = RawClient(broker.port)
    try:
        client.handshake(capabilities={"connection.blocked": True})
        client.open_channel(1)
        client.call(1, m.QueueDeclare(queue="held"), m.QueueDeclareOk)
        publish = frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key="held")),
                                        60, b"\x00\x00", b"x", 131072)
        client.send(publish * 2 + frames.method_frame(1, m.QueueDeclare(queue="held",
                                                                         passive=True))
                    + frames.HEARTBEAT_FRAME)
        assert client.expect(0, m.ConnectionBlocked).reason == "low on disk"
        assert message_count(broker, "held") == 0
        with pytest.raises(TimeoutError):  # no declare-ok: held behind the publish
            client.next_frame(timeout=1.0)
        assert message_count(broker, "held") == 0
    finally:
        client.close()
        broker.stop()


def test_disk_alarm_clears_once_consumed_data_is_gone(tmpfs):
    # The limit leaves room for about 16 MB of messages on the 48 MB disk.
    limit = os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize - 16 * MB
    broker = RunningBroker(tmpfs / "data", shards=1,
                           extra_args=["--disk-free-limit", str(limit)]).start()
    try:
        events = []
        pub = connect(broker, events)
        ch = pub.channel()
        ch.queue_declare("fill", durable=True)
        sent = 0
        while not events:
            assert sent < 36, "the disk alarm never went on"
            # No confirms: a publish the alarm holds unread must not stop this loop.
            ch.basic_publish("", "fill", os.urandom(MB), pika.BasicProperties(delivery_mode=2))
            sent += 1
            # 4 MB/s: the broker checks the disk every second, so it sees the limit
            # crossed with at most a few MB more on their way, well short of full.
            pub.process_data_events(time_limit=0.25)
        assert events == ["low on disk"]
        size = os.path.getsize(tmpfs / "data" / "shard-0" / "data.mdb")
        other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        other.channel().queue_purge("fill")
        wait_until(lambda: (pub.process_data_events(time_limit=0.05), len(events) == 2)[1],
                   timeout=20)
        assert events == ["low on disk", "unblocked"]
        # The file did not shrink: its free pages counted as free disk.
        assert os.path.getsize(tmpfs / "data" / "shard-0" / "data.mdb") >= size
        other.close()
        pub.close()
    finally:
        broker.stop()


@pytest.fixture
def roomy_tmpfs(tmp_path):
    """A mounted tmpfs of 96 MB: half of it ballast, more than a checkpoint needs
    (a journal of up to 16 MiB and as much again in LMDB). With less, the freed room
    may not take the checkpoint the full disk refused, and the alarm stays on."""
    with mounted_tmpfs(tmp_path / "disk", "96m") as mount:
        yield mount


def test_full_disk_nacks_raises_the_alarm_and_the_shard_goes_on(roomy_tmpfs):
    tmpfs = roomy_tmpfs
    ballast = tmpfs / "ballast"
    ballast.write_bytes(b"\0" * (48 * MB))  # removed later: the disk gets room again
    broker = RunningBroker(tmpfs / "data", shards=1, extra_args=["--disk-free-limit", "0"])
    broker.log_path = tmpfs.parent / "broker.log"  # not on the full disk
    broker.start()
    publisher = ConfirmPublisher(broker.port, "full")
    try:
        pids = shard_pids(broker)
        body = b"f" * (256 << 10)
        # A refused checkpoint in a commit with no publishes raises the alarm without
        # a nack; the alarm then holds the next publishes unread, as RabbitMQ does.
        alarm_on = lambda: "resource alarm disk on" in broker.log_text()  # noqa: E731
        while not publisher.nacked and not alarm_on():
            assert publisher.sent < 400, "a full disk must nack what it cannot store"
            publisher.publish(4, body=body)
            wait_until(lambda: len(publisher.acked | publisher.nacked) == publisher.sent
                       or publisher.nacked or alarm_on(), timeout=20)
        assert not (publisher.acked & publisher.nacked)
        wait_until(alarm_on, timeout=10)
        log = broker.log_text()  # the journal's append, or the checkpoint into LMDB
        assert "refused a commit" in log or "refused a checkpoint" in log
        assert shard_pids(broker) == pids  # the shard did not die
        assert "exited with code" not in broker.log_text()

        ballast.unlink()
        wait_until(lambda: "resource alarm disk off" in broker.log_text(), timeout=20)
        more = publisher.sent
        publisher.publish(4, body=b"after")
        wait_until(lambda: {more + 1, more + 2, more + 3, more + 4} <= publisher.acked,
                   timeout=20)
        # Everything sent was answered: held publishes too, once the alarm cleared.
        assert len(publisher.acked | publisher.nacked) == publisher.sent
        assert shard_pids(broker) == pids
    finally:
        publisher.close()
        broker.stop()
    # What was acked is there after a restart.
    broker = RunningBroker(tmpfs / "data", shards=1).start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        ch = conn.channel()
        stored = set()
        while True:
            method, _, content = ch.basic_get("full", auto_ack=True)
            if method is None:
                break
            stored.add(struct.unpack(">Q", content[:8])[0])
        assert publisher.acked <= stored
        conn.close()
    finally:
        broker.stop()


def test_disk_alarm_clears_after_a_flood_grew_the_journal_and_a_purge(tmp_path):
    """A flood grows the shard's journal (up to a checkpoint's worth); a ballast then
    takes the disk below the limit by half what the journal grew, so the alarm goes
    on; after a purge, a checkpoint shrinks the journal back and the alarm clears.
    A journal that never shrank kept it on for good on a disk this small."""
    with mounted_tmpfs(tmp_path / "disk", "80m") as disk:
        limit = 20 * MB  # above half the most a journal grows
        broker = RunningBroker(disk / "data", shards=1, extra_args=["--disk-free-limit", str(limit)])
        broker.log_path = tmp_path / "broker.log"
        broker.start()
        journal_file = disk / "data" / "shard-0" / "journal"
        publisher = ConfirmPublisher(broker.port, "flood")
        try:
            publisher.publish(20, body=b"j" * MB)  # at once: up to a checkpoint's worth
            wait_until(lambda: len(publisher.acked) == 20, timeout=30)
            # the checkpoint after it has applied the journal (and grown LMDB)
            wait_until(lambda: not journal.read(str(journal_file)), timeout=20)
            grown = os.path.getsize(journal_file) - journal.GROW_BY
            assert grown >= journal.GROW_BY, "the flood did not grow the journal: no point"
            ballast = shutil.disk_usage(disk).free - limit + grown // 2
            with open(disk / "ballast", "wb") as f:
                f.write(bytes(ballast))
            wait_until(lambda: "resource alarm disk on: ('gateway'" in broker.log_text(),
                       timeout=20)
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
            assert conn.channel().queue_purge("flood").method.message_count == 20
            conn.close()
            wait_until(lambda: "resource alarm disk off: ('gateway'" in broker.log_text(),
                       timeout=20)
            assert os.path.getsize(journal_file) == journal.GROW_BY
        finally:
            publisher.close()
            broker.stop()


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_restart_on_a_full_disk_serves_every_confirmed_message(tmp_path, stop):
    """Filled until the disk refuses, stopped with commits in the journal that LMDB
    had no room for, started again on the still full disk: no crash loop (the
    shard applied its journal at start or exited), every confirmed message is
    served, and consuming them frees the shard to write again."""
    with mounted_tmpfs(tmp_path / "disk", "40m") as disk:
        data = disk / "data"
        broker = RunningBroker(data, shards=1, extra_args=["--disk-free-limit", "0"])
        broker.log_path = tmp_path / "broker.log"  # not on the full disk
        broker.start()
        publisher = ConfirmPublisher(broker.port, "full")
        try:
            body = b"f" * (256 << 10)
            refused = "resource alarm disk on: (0, 'disk')"  # then its publishes are held
            while refused not in broker.log_text():
                assert publisher.sent < 400, "a full disk must refuse what it cannot store"
                publisher.publish(8, body=body)
                wait_until(lambda: len(publisher.acked | publisher.nacked) == publisher.sent
                           or refused in broker.log_text(), timeout=20)
        finally:
            publisher.close()
            if stop == "sigkill":
                for pid in [broker.process.pid, *shard_pids(broker)]:
                    os.kill(pid, signal.SIGKILL)
            broker.stop()
        assert journal.read(str(data / "shard-0" / "journal")), \
            "the journal holds no commits beyond LMDB: this test does not test the point"
        assert shutil.disk_usage(disk).free < 1 * MB

        broker.log_path = tmp_path / "restart.log"
        broker.start()
        try:
            pid = shard_processes(broker)[0]
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
            ch = conn.channel()
            stored = set()
            while (got := ch.basic_get("full"))[0] is not None:
                stored.add(struct.unpack(">Q", got[2][:8])[0])
                ch.basic_ack(got[0].delivery_tag)
            assert publisher.acked <= stored
            # Its commits gone with the messages they held, the checkpoint succeeds.
            wait_until(lambda: "take writes again" in broker.log_text(), timeout=20)
            log = broker.log_text()
            assert shard_processes(broker)[0] == pid, "the shard restarted"
            assert "exited with code" not in log and "Traceback" not in log
            assert log.count("refused a checkpoint") <= 1  # said once, not every second
            conn.close()
        finally:
            broker.stop()
        broker.log_path = tmp_path / "again.log"
        broker.start()  # what was consumed stays consumed
        try:
            assert message_count(broker, "full") == 0
        finally:
            broker.stop()


