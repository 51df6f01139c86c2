"""A publish that goes straight to a waiting consumer (Queue.publish_straight)
must leave the queue exactly as the long way (ready deque, dispatch, hand-out)
does: the same effects, counters, RAM figures and holdings, for any script of
commands, on plain, durable, length-limited and single-active queues."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards.queue import Queue
from warren.storage.queuespec import QueueSpec

from ..support.twins import each_queue_build

queue_build = each_queue_build(globals(), ("Queue",))

HOLDERS = (11, 12, 13)

ARGUMENTS = st.sampled_from([{}, {"x-max-length": 2}, {"x-single-active-consumer": True},
                             {"x-message-ttl": 60_000}])

publishes = st.builds(lambda persistent, expiration, body: ("publish", persistent, expiration,
                                                           body),
                      st.booleans(), st.sampled_from([-1, -1, -1, 0, 5_000]),
                      st.binary(max_size=8))
consumes = st.builds(lambda holder, no_ack, prefetch, credit, priority:
                     ("consume", holder, no_ack, prefetch, credit, priority),
                     st.sampled_from(HOLDERS), st.booleans(), st.integers(0, 3),
                     st.integers(0, 4), st.integers(0, 1))
others = st.one_of(
    st.tuples(st.just("grant"), st.sampled_from(HOLDERS), st.integers(1, 3)),
    st.tuples(st.just("settle"), st.sampled_from(HOLDERS),
              st.sampled_from([r.SETTLE_ACK, r.SETTLE_RETURN, r.SETTLE_DISCARD])),
    st.tuples(st.just("cancel"), st.sampled_from(HOLDERS)),
    st.tuples(st.just("release"), st.sampled_from(HOLDERS)),
    st.tuples(st.just("get"), st.booleans()),
    st.tuples(st.just("tick")),
)
scripts = st.lists(st.one_of(publishes, publishes, consumes, others), max_size=40)


def command(step: tuple, queue: Queue, used: set[int]):
    kind = step[0]
    if kind == "publish":
        _, persistent, expiration, body = step
        return r.Publish([1], "ex", "key", b"\x00\x00", body, persistent, 0, 0, expiration)
    if kind == "consume":
        _, holder, no_ack, prefetch, credit, priority = step
        if holder in used:  # the gateway never gives a holder id twice
            return None
        used.add(holder)
        return r.Consume(holder, 1, holder, 100, f"c{holder}", no_ack, False, prefetch, credit,
                         priority)
    if kind == "grant":
        return r.Grant(1, step[1], step[2])
    if kind == "settle":  # the oldest message the holder has
        held = sorted(queue.holdings.get(step[1], {}))
        return r.Settle(1, step[1], held[:1], step[2]) if held else None
    if kind == "cancel":
        return r.Cancel(1, 1, step[1])
    if kind == "release":
        return r.ReleaseHolders([step[1]])
    if kind == "get":
        return r.Get(1, 1, 99, step[1])
    return None


def shape(effect) -> tuple:
    """An effect as comparable data (messages compare by identity: their seq and content)."""
    return (type(effect).__name__, *(
        [(m.seq, m.content) for m in value] if name == "messages" else value
        for name in effect.__struct_fields__ for value in [getattr(effect, name)]))


def state(queue: Queue) -> tuple:
    c = queue.counters
    return (queue.next_seq, queue.ready_count, queue.unacked_count, queue.ram_bytes,
            queue.ready_bytes, queue.last_used, queue.may_expire, [m.seq for m in queue.ready],
            {h: {seq: (type(m), m.content, m.stored, m.redelivered, getattr(m, "expires", None))
                 for seq, m in held.items()}
             for h, held in queue.holdings.items()},
            {h: consumer.credit for h, consumer in queue.consumers.items()},
            [getattr(c, name) for name in type(c).__slots__])


@settings(max_examples=300, deadline=None)
@given(script=scripts, durable=st.booleans(), arguments=ARGUMENTS)
def test_a_publish_straight_to_a_consumer_leaves_the_queue_as_the_long_way_does(
        script, durable, arguments):
    spec = QueueSpec("/", "q", durable, False, False, arguments)
    short, long = (Queue(r.CreateQueue(0, 1, spec, arguments)) for _ in range(2))
    long.straight = False
    used: set[int] = set()
    for now, step in enumerate(script):
        cmd = command(step, short, used)
        if step[0] == "tick":
            effects = [(short.tick(float(now)), long.tick(float(now)))]
        elif cmd is None:
            continue
        else:
            effects = [(short.apply(cmd, float(now)), long.apply(cmd, float(now)))]
        for got, expected in effects:
            assert [shape(e) for e in got] == [shape(e) for e in expected]
        assert state(short) == state(long)


def test_the_straight_way_is_taken_by_a_transient_publish_for_a_waiting_consumer():
    spec = QueueSpec("/", "q", True, False, False, {})
    queue = Queue(r.CreateQueue(0, 1, spec, {}))
    queue.apply(r.Consume(7, 1, 7, 100, "c7", False, False, 0, 10), 0.0)
    ready_before = queue.ready
    queue.ready = None  # the long way would append to it

    effects = queue.apply(r.Publish([1], "ex", "key", b"\x00\x00", b"body", False), 1.0)

    assert [shape(e) for e in effects] == [
        ("Deliver", 7, 1, 1, False, "ex", "key", b"\x00\x00", b"body", 0)]
    queue.ready = ready_before
    assert queue.unacked_count == 1 and queue.counters.delivered == 1
