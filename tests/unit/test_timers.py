"""The shard's timer heap (shards/timers.py) against a plain dict of deadlines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.shards.timers import TimerHeap

keys = st.sampled_from([1, 2, 3, 7, "retry"])
deadlines = st.none() | st.integers(0, 50).map(float)
operations = st.lists(st.one_of(
    st.tuples(st.just("schedule"), keys, deadlines),
    st.tuples(st.just("cancel"), keys, st.none()),
    st.tuples(st.just("advance"), st.none(), st.integers(0, 10).map(float)),
), max_size=200)


@given(operations)
def test_the_heap_fires_what_a_dict_of_deadlines_says(ops):
    timers, model, now = TimerHeap(), {}, 0.0
    for op, key, value in ops:
        if op == "schedule":
            timers.schedule(key, value)
            if value is None:
                model.pop(key, None)
            elif key not in model or value < model[key]:  # a deadline is a lower bound
                model[key] = value
        elif op == "cancel":
            timers.cancel(key)
            model.pop(key, None)
        else:
            now += value
            fired = timers.due(now)
            expected = [k for k, d in model.items() if d <= now]
            assert sorted(fired, key=str) == sorted(expected, key=str)
            assert [model[k] for k in fired] == sorted(model[k] for k in fired)
            for k in fired:
                del model[k]
        assert timers.next_deadline() == min(model.values(), default=None)
        assert len(timers) == len(model)


def test_a_later_deadline_keeps_the_earlier_wake_up():
    timers = TimerHeap()
    timers.schedule(5, 10.0)
    timers.schedule(5, 20.0)  # e.g. the queue's head message was consumed
    assert timers.next_deadline() == 10.0
    assert timers.due(10.0) == [5]
    timers.schedule(5, 20.0)  # the owner schedules the real deadline
    assert timers.due(19.0) == [] and timers.due(20.0) == [5]
    assert timers.next_deadline() is None


def test_stale_entries_do_not_pile_up():
    timers = TimerHeap()
    for n in range(10_000):  # queues declared and deleted, each leaving an entry
        timers.schedule(n, 1000.0 + n)
        timers.cancel(n)
    assert len(timers.heap) < 200 and timers.next_deadline() is None
