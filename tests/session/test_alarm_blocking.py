"""Resource alarms and publishers, in-process (tests/support/session.py), as RabbitMQ 3.10's
reader has them (checked with raw frames against it): a connection is blocked when
a publish's content header comes while an alarm is on, its first publish too, and
reads nothing more, neither that publish nor the frames after it in the same
write, until every alarm clears; connections that do not publish meanwhile go on
as before. The alarm is raised here as a shard's memory alarm comes in (the
disk watch of the in-process broker, with no limit, would clear a disk alarm at
its next check)."""

from __future__ import annotations

import struct

import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.session.connection import FRAMES_PER_TURN

MEMORY = (0, "memory")  # shard 0 low on memory
HEARTBEAT = struct.pack(">BHI", frames.FRAME_HEARTBEAT, 0, 0) + b"\xce"


@pytest.fixture
def alarm(inline):
    """Raise shard 0's memory alarm with alarm(True), clear it with alarm(False); cleared
    after the test whatever it did."""
    alarms = inline.gateway.alarms

    def switch(on: bool) -> None:
        alarms.set(MEMORY, on)
        inline.settle()

    yield switch
    if alarms.active:
        switch(False)


def publish(queue: str, body: bytes = b"x") -> bytes:
    return frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key=queue)), 60,
                                 b"\x00\x00", body, 131072)


def declare(queue: str) -> bytes:
    return frames.method_frame(1, m.QueueDeclare(queue=queue, passive=True))


def methods(client) -> list:
    """What the broker sent and the client has not read, as (channel, method name),
    heartbeats as "heartbeat"."""
    return [(channel, type(m.decode_method(payload)).__name__)
            if kind == frames.FRAME_METHOD else "heartbeat"
            for kind, channel, payload in client.pending() if kind != frames.FRAME_BODY]


def count(inline, queue: str) -> int:
    other = inline.client()
    other.handshake()
    other.open_channel()
    return other.call(1, m.QueueDeclare(queue=queue, passive=True),
                      m.QueueDeclareOk).message_count


def publisher(inline, queue: str, capabilities=None):
    client = inline.client()
    client.handshake(capabilities={"connection.blocked": True} if capabilities is None
                     else capabilities)
    client.open_channel()
    client.call(1, m.QueueDeclare(queue=queue), m.QueueDeclareOk)
    client.call(1, m.QueuePurge(queue=queue), m.QueuePurgeOk)
    return client


def test_a_first_publish_and_what_follows_it_wait_for_the_alarm_to_clear(inline, alarm):
    """The finding: with the disk alarm on, a fresh connection's first publish with
    confirms was routed and confirmed at once (a memory alarm the same). Here it, a second publish and a
    declare sent behind it in one write are held; RabbitMQ answered the same write
    with connection.blocked alone, then, once the alarm cleared, connection.unblocked,
    the declare-ok and the confirms."""
    client = publisher(inline, "alarm.first")
    alarm(True)
    assert client.conn.snapshot().state == "blocking"
    # Methods flow while it publishes nothing: RabbitMQ answered these too.
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    client.send(publish("alarm.first") + publish("alarm.first") + declare("alarm.first")
                + HEARTBEAT)
    assert methods(client) == [(0, "ConnectionBlocked")]
    assert count(inline, "alarm.first") == 0
    assert client.conn.snapshot().state == "blocked"
    alarm(False)
    got = methods(client)
    assert got[0] == (0, "ConnectionUnblocked")
    assert sorted(set(got[1:])) == [(1, "BasicAck"), (1, "QueueDeclareOk")], got
    assert count(inline, "alarm.first") == 2


def test_the_blocked_notice_is_sent_once_and_the_reason_named(inline, alarm):
    client = publisher(inline, "alarm.notice")
    alarm(True)
    client.send(publish("alarm.notice"))
    blocked = client.expect(0, m.ConnectionBlocked)
    assert blocked.reason == "low on memory"
    inline.gateway.alarms.set((1, "memory"), True)  # a second alarm: no second notice
    client.send(publish("alarm.notice"))
    assert methods(client) == []
    inline.gateway.alarms.set((1, "memory"), False)
    alarm(False)
    client.expect(0, m.ConnectionUnblocked)
    assert count(inline, "alarm.notice") == 2


def test_a_connection_that_published_before_the_alarm_blocks_at_its_next_publish(
        inline, alarm):
    """RabbitMQ 3.10 told a connection that had published before the alarm nothing
    when it went up, answered its other methods, and blocked it at its next publish."""
    client = publisher(inline, "alarm.before")
    client.send(publish("alarm.before"))
    alarm(True)
    assert methods(client) == []
    client.call(1, m.QueueDeclare(queue="alarm.before", passive=True), m.QueueDeclareOk)
    client.send(publish("alarm.before", b"held"))
    assert methods(client) == [(0, "ConnectionBlocked")]
    assert count(inline, "alarm.before") == 1
    alarm(False)
    assert methods(client) == [(0, "ConnectionUnblocked")]
    assert count(inline, "alarm.before") == 2


def test_a_client_without_the_capability_is_held_untold(inline, alarm):
    client = publisher(inline, "alarm.untold", capabilities={})
    alarm(True)
    client.send(publish("alarm.untold") + declare("alarm.untold"))
    assert methods(client) == []
    assert count(inline, "alarm.untold") == 0
    alarm(False)
    assert methods(client) == [(1, "QueueDeclareOk")]
    assert count(inline, "alarm.untold") == 1


def test_a_publish_whose_method_came_before_the_alarm_stops_at_its_header(inline, alarm):
    """Frame by frame, as RabbitMQ: the method is taken, the content header that
    comes once the alarm is on is not."""
    client = publisher(inline, "alarm.split")
    whole = publish("alarm.split", b"split")
    method_end = 7 + struct.unpack_from(">I", whole, 3)[0] + 1
    client.send(whole[:method_end])
    alarm(True)
    client.send(whole[method_end:])
    assert methods(client) == [(0, "ConnectionBlocked")]
    assert count(inline, "alarm.split") == 0
    alarm(False)
    assert methods(client) == [(0, "ConnectionUnblocked")]
    assert count(inline, "alarm.split") == 1


def test_input_read_before_the_alarm_and_not_yet_handled_is_held(inline, alarm):
    """A flood handled a share a loop turn: what is still in the read buffer when
    the alarm goes up is held, not routed in the turns after."""
    client = publisher(inline, "alarm.backlog")
    total = 300

    client.conn.receive(publish("alarm.backlog") * total)  # its first share, here
    inline.gateway.alarms.set(MEMORY, True)  # before the turn that would take the next
    inline.settle()
    assert count(inline, "alarm.backlog") == FRAMES_PER_TURN // 3  # the first share alone
    assert client.conn.reader.buffered > 0
    alarm(False)
    assert inline.run(lambda: client.conn.reader.buffered == 0)
    inline.settle()
    assert count(inline, "alarm.backlog") == total


def test_a_blocked_connection_gets_heartbeats_and_is_not_timed_out(inline, alarm):
    """RabbitMQ sends its heartbeats to a blocked connection and pauses its
    heartbeat monitor: the client's own wait unread."""
    client = inline.client()
    client.handshake(capabilities={"connection.blocked": True}, heartbeat=2)
    client.open_channel()
    client.call(1, m.QueueDeclare(queue="alarm.beat"), m.QueueDeclareOk)
    alarm(True)
    client.send(publish("alarm.beat"))
    assert methods(client) == [(0, "ConnectionBlocked")]
    for _ in range(6):  # three intervals, more than the two a missing client is given
        inline.advance(1.0)
    assert "heartbeat" in methods(client)
    assert not client.wire.aborted
    alarm(False)
    assert methods(client) == [(0, "ConnectionUnblocked")]
    assert count(inline, "alarm.beat") == 1
