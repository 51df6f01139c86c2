"""The shard's outbox (shards/outbox.py): events leave in the order they were
put, in ring records of bounded size, and wait while the ring is full."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards.codec import decode_events
from warren.shards.outbox import EVENTS_PER_RECORD

from ..support.twins import OUTBOXES

pytestmark = pytest.mark.parametrize("outbox_class", OUTBOXES)  # pure, and compiled


def decoded(records: list[bytes]) -> list:
    return [event for record in records for event in decode_events(record)]


@given(st.lists(st.integers(0, 3 * EVENTS_PER_RECORD), max_size=4),
       st.lists(st.integers(0, 3), max_size=10))
def test_events_leave_in_order_whatever_the_ring_takes(outbox_class, puts, ring_room):
    outbox, ring, n = outbox_class(), [], 0
    expected = []
    for size in puts:
        events = [r.Progress(n + i) for i in range(size)]
        n += size
        expected += events
        outbox.put(0, events)
        assert all(0 < len(decode_events(rec)) <= EVENTS_PER_RECORD
                   for rec in outbox.records[0])  # no empty records
        room = ring_room.pop() if ring_room else len(outbox.records[0])
        taken = outbox.records[0][:room]
        ring += taken
        outbox.sent(0, len(taken))
    ring += outbox.records[0]
    outbox.sent(0, len(outbox.records[0]))
    assert decoded(ring) == expected and not outbox.waiting()


def test_a_turn_events_are_taken_once_and_confirms_join_when_put(outbox_class):
    outbox = outbox_class()
    assert outbox.take() == [[]]
    outbox.add(r.Reply(1))
    outbox.add(r.Progress(1))
    (events,) = outbox.take()
    assert events == [r.Reply(1), r.Progress(1)]
    assert outbox.take() == [[]]
    outbox.put(0, events)
    outbox.put_routed([r.Confirmed([3], [9])])  # its commit became durable
    assert decoded(outbox.records[0]) == [r.Reply(1), r.Progress(1), r.Confirmed([3], [9])]
