"""The per-channel publisher-confirm tracker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.session.confirms import ACK, NACK, ConfirmTracker


def test_unroutable_is_confirmed_at_once_and_runs_coalesce():
    t = ConfirmTracker()
    assert [t.publish([]) for _ in range(3)] == [1, 2, 3]
    assert t.take_replies() == [(ACK, 3, True)]
    assert t.take_replies() == []


def test_pending_message_splits_multiple_from_singles():
    t = ConfirmTracker()
    for _ in range(5):
        t.publish([0])
    for seq in (1, 2, 4, 5):
        t.accept(seq, 0)
    assert t.take_replies() == [(ACK, 2, True), (ACK, 4, False), (ACK, 5, False)]
    t.accept(3, 0)
    assert t.take_replies() == [(ACK, 3, True)]


def test_message_on_two_shards_needs_both_and_a_refusal_nacks():
    t = ConfirmTracker()
    t.publish([0, 1])
    t.publish([0, 1])
    t.accept(1, 0)
    assert t.take_replies() == []
    t.accept(1, 1)
    t.reject(2, 0)
    t.accept(2, 1)
    assert t.take_replies() == [(ACK, 1, True), (NACK, 2, True)]


def test_lost_shard_nacks_only_what_it_held():
    t = ConfirmTracker()
    t.publish([0])
    t.publish([1])
    t.publish([0, 1])
    t.accept(3, 0)
    t.fail_shard(1)
    t.accept(1, 0)
    assert t.take_replies() == [(ACK, 1, True), (NACK, 3, True)]


@given(st.lists(st.tuples(st.integers(0, 3), st.randoms()), min_size=1, max_size=40))
def test_each_message_answered_exactly_once(plan):
    t = ConfirmTracker()
    parts = {}
    for n, _ in plan:
        parts[t.publish(range(n))] = n
    answered: dict[int, bool] = {}
    confirmed_upto = 0

    def collect():
        nonlocal confirmed_upto
        for ack, tag, multiple in t.take_replies():
            tags = [s for s in parts if confirmed_upto < s <= tag and s not in answered] \
                if multiple else [tag]
            for s in tags:
                assert s not in answered
                answered[s] = ack
            if multiple:
                confirmed_upto = max(confirmed_upto, tag)

    rng = plan[0][1]
    work = [(seq, shard) for seq, n in parts.items() for shard in range(n)]
    rng.shuffle(work)
    for seq, shard in work:
        t.accept(seq, shard)
        if rng.random() < 0.3:
            collect()
    collect()
    assert sorted(answered) == sorted(parts)
    assert all(answered.values())
