"""Group commit's bookkeeping (shards/groupcommit.py): every confirm leaves with
exactly one commit, as an ack only if the commit is durable and the queues took
the publish; fsyncs are counted once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards.groupcommit import GroupCommit

confirms = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 10_000), st.booleans()),
                    max_size=40)


def answers(records: list) -> list[tuple[int, int, bool]]:
    """(channel, seq, acked) for each confirm in these records."""
    out = []
    for record in records:
        acked = type(record) is r.Confirmed
        assert acked or type(record) is r.Rejected
        assert len(record.channels) == len(record.seqs)
        out += [(c, s, acked) for c, s in zip(record.channels, record.seqs)]
    return out


@given(st.lists(st.tuples(confirms, st.booleans()), max_size=8))
def test_each_confirm_is_answered_once_with_its_commit(commits):
    group = GroupCommit()
    for gathered, stored in commits:
        for channel, seq, accepted in gathered:
            group.confirm(channel, seq, accepted)
        assert bool(group.gathering) == bool(gathered)
        records = group.finished(group.take(0.0), stored, [], 0.0)
        assert sorted(answers(records)) == sorted(
            (c, s, accepted and stored) for c, s, accepted in gathered)
        assert not bool(group.gathering)


def test_a_refused_publish_is_nacked_even_when_the_commit_is_durable():
    group = GroupCommit()
    group.confirm(1, 1)
    group.confirm(1, 2, accepted=False)
    group.confirm(2, 1)
    assert group.finished(group.take(0.0), True, [3], 0.0) == [
        r.Confirmed([1, 2], [1, 1]), r.Rejected([1], [2])]


def test_confirms_gathered_during_a_commit_wait_for_the_next():
    group = GroupCommit()
    group.confirm(1, 1)
    group.begin(5.0, None)
    group.confirm(1, 2)
    assert group.inflight is not None
    assert group.finished(group.end(), True, [1], 5.5) == [r.Confirmed([1], [1])]
    assert group.inflight is None
    assert group.finished(group.take(6.0), False, [], 6.0) == [r.Rejected([1], [2])]


def test_fsyncs_are_counted_once_and_the_interval_is_taken():
    group = GroupCommit()
    group.confirm(1, 1)
    group.confirm(1, 2)
    group.finished(group.take(1.0), True, [2, 1], 1.25)
    group.finished(group.take(2.0), True, [5], 2.0)
    assert (group.fsyncs, group.messages) == (3, 8)
    batches, latencies = group.take_interval()
    assert batches == {1: 1, 2: 1, 8: 1}  # messages per fsync, by power-of-two bound
    assert latencies == [0.25, 0.25]
    assert group.take_interval() == ({}, [])
    assert (group.fsyncs, group.messages) == (3, 8)  # cumulative
