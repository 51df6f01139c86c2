"""Queue arguments in the pure state machine: TTL, x-expires, length limits,
dead-letter effects, priorities. Time is whatever `now` the test passes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards.effects import Refused
from warren.shards.queue import Queue
from warren.storage.queuespec import QueueSpec

from ..support.twins import each_queue_build

queue_build = each_queue_build(globals(), ("Queue",))


def make_queue(**arguments) -> Queue:
    spec = QueueSpec("/", "q", False, False, False, arguments)
    return Queue(r.CreateQueue(0, 1, spec, arguments))


def publish(q: Queue, body: bytes, now: float = 0.0, expiration: int = -1,
            priority: int = 0) -> list:
    return q.apply(r.Publish([1], "ex", "rk", b"", body, False, 0, 0, expiration, priority), now)


def get(q: Queue, now: float = 0.0) -> bytes | None:
    [reply] = [e for e in q.apply(r.Get(9, 1, 500, True), now) if isinstance(e, r.GetReply)]
    return reply.body if reply.seq else None


def dead_letters(effects) -> list[tuple[str, bytes]]:
    return [(e.reason, e.body) for e in effects if isinstance(e, r.DeadLettered)]


def test_message_ttl_expires_at_the_head_and_dead_letters():
    q = make_queue(**{"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"})
    publish(q, b"a", now=0.0)
    publish(q, b"b", now=0.5)
    assert q.next_deadline() == 1.0
    assert dead_letters(q.tick(1.2)) == [("expired", b"a")]
    assert q.next_deadline() == 1.5
    assert get(q, now=1.4) == b"b"
    assert q.counters.expired == 1 and q.counters.dead_lettered == 1


def test_per_message_expiration_only_at_the_head():
    q = make_queue()
    publish(q, b"long", expiration=10_000)
    publish(q, b"short", expiration=10)
    # the short one waits behind the long one, as in RabbitMQ
    assert q.next_deadline() == 10.0
    assert get(q, now=1.0) == b"long"
    assert get(q, now=1.0) is None  # the short one was expired when it reached the head


def test_ttl_zero_reaches_a_waiting_consumer():
    q = make_queue(**{"x-message-ttl": 0})
    q.apply(r.Consume(1, 1, 7, 100, "c", True, False, 0, 10), 0.0)
    effects = publish(q, b"now", now=5.0)
    assert [e.body for e in effects if isinstance(e, r.Deliver)] == [b"now"]
    q.apply(r.Cancel(2, 1, 7), 5.0)
    publish(q, b"nobody", now=6.0)
    assert q.ready_count == 0


def test_unused_queue_expires_and_use_restarts_the_clock():
    q = make_queue(**{"x-expires": 1000})
    q.apply(r.QueueStatus(1, 1), 0.0)
    assert q.next_deadline() == 1.0
    q.apply(r.QueueStatus(2, 1), 0.8)  # a redeclare counts as use
    assert q.tick(1.5) == []
    effects = q.tick(1.9)
    assert r.QueueDeleted(1) in effects and q.deleted


def test_consumer_keeps_the_queue_alive():
    q = make_queue(**{"x-expires": 1000})
    q.apply(r.Consume(1, 1, 7, 100, "c", True, False, 0, 10), 0.0)
    assert q.next_deadline() is None
    q.apply(r.Cancel(2, 1, 7), 5.0)
    assert q.next_deadline() == 6.0


def test_drop_head_and_reject_publish():
    q = make_queue(**{"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    effects = [publish(q, b"%d" % i) for i in range(4)]
    assert dead_letters(effects[2] + effects[3]) == [("maxlen", b"0"), ("maxlen", b"1")]
    rejecting = make_queue(**{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert publish(rejecting, b"in") == []
    assert [type(e) for e in publish(rejecting, b"out")] == [Refused]
    assert get(rejecting) == b"in"


def test_max_length_bytes_counts_ready_bodies():
    q = make_queue(**{"x-max-length-bytes": 5})
    publish(q, b"aaa")
    publish(q, b"bbb")  # 6 bytes: the head goes
    assert q.ready_count == 1 and q.ready_bytes == 3
    assert get(q) == b"bbb"
    assert q.ready_bytes == 0


def test_reject_without_requeue_dead_letters():
    q = make_queue(**{"x-dead-letter-exchange": "dlx"})
    publish(q, b"m")
    q.apply(r.Get(1, 1, 500, False), 0.0)
    effects = q.apply(r.Settle(1, 500, [1], r.SETTLE_DISCARD), 0.0)
    assert dead_letters(effects) == [("rejected", b"m")]
    plain = make_queue()
    publish(plain, b"m")
    plain.apply(r.Get(1, 1, 500, False), 0.0)
    assert dead_letters(plain.apply(r.Settle(1, 500, [1], r.SETTLE_DISCARD), 0.0)) == []


@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=40))
def test_priority_order_matches_a_stable_sort(messages):
    """Whatever the mix of publishes and requeues, a priority queue hands out the
    highest priority first (capped at x-max-priority), oldest first within one."""
    q = make_queue(**{"x-max-priority": 9})
    for i, (priority, _) in enumerate(messages):
        publish(q, b"%d" % i, priority=priority)
    # take everything, requeue some, then drain
    taken = q.apply(r.Get(1, 1, 500, False), 0.0)
    requeue = [e.seq for e in taken if isinstance(e, r.GetReply) and e.seq]
    q.apply(r.Settle(1, 500, requeue, r.SETTLE_REQUEUE), 0.0)
    out = []
    while (body := get(q)) is not None:
        out.append(int(body))
    expected = sorted(range(len(messages)), key=lambda i: (-min(messages[i][0], 9), i))
    assert out == expected


# -- quorum queues: counting and consumer timeouts ------------------------------------


def quorum_queue(**arguments) -> Queue:
    arguments = {"x-queue-type": "quorum", **arguments}
    return Queue(r.CreateQueue(0, 1, QueueSpec("/", "q", True, False, False, arguments),
                               arguments))


def consume_with_timeout(q: Queue, holder: int, timeout_ms: int, now: float = 0.0) -> list:
    return q.apply(r.Consume(holder, 1, holder, 100, f"c{holder}", False, False, 0, 100, 0,
                             timeout_ms), now)


def test_no_timer_while_nothing_is_held():
    q = quorum_queue()
    consume_with_timeout(q, 7, 1000)
    assert q.next_deadline() is None and not q.lock_heap


def test_partial_timeout_then_recovery_after_settling():
    q = quorum_queue()
    consume_with_timeout(q, 7, 1000)
    first = publish(q, b"a", now=0.0)
    second = publish(q, b"b", now=0.5)
    [a] = [e for e in first if isinstance(e, r.Deliver)]
    [b] = [e for e in second if isinstance(e, r.Deliver)]
    assert q.next_deadline() == 1.0
    effects = q.tick(1.0)
    [timed_out] = [e for e in effects if isinstance(e, r.ConsumerTimedOut)]
    assert timed_out.seqs == [a.seq] and timed_out.timeout_ms == 1000
    assert q.ready_count == 1 and q.unacked_count == 1  # only the expired one went back
    # in timeout status: nothing new for it
    assert not [e for e in publish(q, b"c", now=1.1) if isinstance(e, r.Deliver)]
    q.apply(r.Settle(1, 7, [b.seq], r.SETTLE_ACK), 1.2)  # settling another: still timed out
    assert q.consumers[7].timed_out == {a.seq}
    effects = q.apply(r.Settle(1, 7, [a.seq], r.SETTLE_ACK), 1.3)
    delivered = [(e.body, e.redelivered, e.delivery_count) for e in effects
                 if isinstance(e, r.Deliver)]
    assert delivered == [(b"a", True, 0), (b"c", False, 0)]  # a timeout is no failed delivery


def test_renewal_moves_the_deadline():
    q = quorum_queue()
    consume_with_timeout(q, 7, 1000)
    [d] = [e for e in publish(q, b"a", now=0.0) if isinstance(e, r.Deliver)]
    q.apply(r.Renew(1, 7, [d.seq]), 0.8)
    assert q.next_deadline() == 1.8
    assert q.tick(1.5) == []
    q.apply(r.Renew(1, 7, []), 1.6)  # every message of the holder
    assert q.next_deadline() == 2.6


def test_classic_queue_ignores_consumer_timeouts():
    q = make_queue()
    consume_with_timeout(q, 7, 1000)
    publish(q, b"a")
    assert q.next_deadline() is None


def test_delivery_limit_and_counts():
    q = quorum_queue(**{"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"})
    publish(q, b"a")
    counts = []
    for _ in range(2):
        [reply] = [e for e in q.apply(r.Get(1, 1, 500, False), 0.0)
                   if isinstance(e, r.GetReply)]
        counts.append(reply.delivery_count)
        effects = q.apply(r.Settle(1, 500, [reply.seq], r.SETTLE_REQUEUE), 0.0)
    assert counts == [0, 1]
    assert dead_letters(effects) == [("delivery_limit", b"a")]
    assert q.ready_count == 0


def test_single_active_consumer_hands_over_when_it_goes():
    q = make_queue(**{"x-single-active-consumer": True})
    consume_with_timeout(q, 7, 0)
    consume_with_timeout(q, 8, 0)
    effects = publish(q, b"a") + publish(q, b"b")
    assert {e.holder for e in effects if isinstance(e, r.Deliver)} == {7}
    effects = q.apply(r.ReleaseHolders([7]), 0.0)  # its channel closed: 8 takes over
    assert [(e.holder, e.body) for e in effects if isinstance(e, r.Deliver)] == [(8, b"a"),
                                                                               (8, b"b")]
