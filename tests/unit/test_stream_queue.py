"""A stream's consumers (shards/stream.py), pure: credit, prefetch, offsets,
settles, timeouts, cancel and deletion, with a hypothesis run of any sequence of
consumes, grants, settles, syncs and cancels against a model of readers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards.stream import Attach, Detach, Drop, Feed, StreamQueue, parse_max_age

QID = 7


def consume(holder: int, prefetch: int = 3, credit: int = 2000, start: str = "first",
            at: int = 0, timeout_ms: int = 0, exclusive: bool = False) -> r.Consume:
    return r.Consume(holder, QID, holder, 1, f"c{holder}", False, exclusive, prefetch, credit,
                     0, timeout_ms, start, at)


class Shell:
    """What shards/streams.py does with the effects, over a list of offsets: each
    consumer's reader reads from its start up to the durable offset."""

    def __init__(self, durable: int = -1):
        self.core = StreamQueue(QID, durable)
        self.durable = durable
        self.positions: dict[int, int] = {}
        self.delivered: dict[int, list[int]] = {}
        self.out: list = []
        self.now = 0.0

    def run(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is Attach:
                self.positions[effect.holder] = effect.at if effect.start == "offset" else 0
                self.delivered.setdefault(effect.holder, [])
                self.run(self.core.attached(effect.holder))
            elif type(effect) is Feed:
                start = self.positions[effect.holder]
                offsets = list(range(start, min(start + effect.wanted, self.durable + 1)))
                self.positions[effect.holder] = start + len(offsets)
                self.delivered[effect.holder] += offsets
                self.core.fed(effect.holder, offsets, self.now)
            elif type(effect) is Detach:
                self.positions.pop(effect.holder)
            else:
                self.out.append(effect)

    def apply(self, cmd) -> None:
        self.run(self.core.apply(cmd, self.now))

    def sync(self, durable: int) -> None:
        self.durable = durable
        self.run(self.core.synced(durable))


def test_a_consumer_gets_its_prefetch_then_one_per_ack():
    shell = Shell(durable=9)
    shell.apply(consume(1, prefetch=3))
    assert shell.delivered[1] == [0, 1, 2]
    assert r.Reply(1, consumer_count=1) in shell.out
    shell.apply(r.Settle(QID, 1, [0], r.SETTLE_ACK))
    assert shell.delivered[1] == [0, 1, 2, 3]
    shell.apply(r.Settle(QID, 1, [1, 2, 3], r.SETTLE_ACK))
    assert shell.delivered[1] == list(range(7))


def test_two_consumers_read_the_same_records_and_only_what_is_durable():
    shell = Shell()
    shell.apply(consume(1, prefetch=10))
    shell.apply(consume(2, prefetch=10))
    assert shell.delivered == {1: [], 2: []}
    shell.sync(4)
    assert shell.delivered == {1: [0, 1, 2, 3, 4], 2: [0, 1, 2, 3, 4]}


def test_link_credit_bounds_deliveries_too():
    shell = Shell(durable=9)
    shell.apply(consume(1, prefetch=10, credit=2))
    assert shell.delivered[1] == [0, 1]
    shell.apply(r.Grant(QID, 1, 3))
    assert shell.delivered[1] == [0, 1, 2, 3, 4]
    shell.apply(r.Grant(QID, 1, 0, reset=True))
    shell.apply(r.Settle(QID, 1, [0, 1, 2, 3, 4], r.SETTLE_ACK))
    assert len(shell.delivered[1]) == 5


def test_an_exclusive_consumer_holds_the_stream():
    shell = Shell()
    shell.apply(consume(1, exclusive=True))
    shell.apply(consume(2))
    assert shell.out[-1] == r.Reply(2, r.Refusal.EXCLUSIVE_USE)
    assert list(shell.core.consumers) == [1]


def test_cancel_release_and_delete():
    shell = Shell(durable=2)
    for holder in (1, 2, 3):
        shell.apply(consume(holder))
    shell.apply(r.Cancel(9, QID, 1))
    assert r.Reply(9) in shell.out and 1 not in shell.positions
    shell.apply(r.ReleaseHolders([2]))
    assert list(shell.core.consumers) == [3]
    shell.apply(r.DeleteQueue(10, QID, True, False))
    assert shell.out[-1] == r.Reply(10, r.Refusal.IN_USE)
    shell.apply(r.DeleteQueue(11, QID, False, False))
    assert shell.out[-3:] == [r.Reply(11), r.ConsumerCancelled(3, QID), Drop(QID)]
    assert shell.core.deleted and not shell.core.consumers


def test_a_consumer_that_keeps_records_past_its_timeout_times_out_once():
    shell = Shell(durable=5)
    shell.apply(consume(1, prefetch=2, timeout_ms=1000))
    assert shell.core.next_deadline() == 1.0
    assert shell.core.tick(0.5) == []
    assert shell.core.tick(1.0) == [r.ConsumerTimedOut(1, QID, [0, 1], 1000)]
    assert shell.core.tick(2.0) == [] and shell.core.next_deadline() is None
    shell.apply(r.Settle(QID, 1, [0, 1], r.SETTLE_ACK))
    assert shell.delivered[1] == [0, 1]  # nothing new for a consumer that timed out


def test_max_age():
    assert parse_max_age("7D") == 7 * 86_400_000
    assert parse_max_age("0s") is None and parse_max_age("1d") is None


operations = st.lists(st.one_of(
    st.tuples(st.just("consume"), st.integers(1, 4), st.integers(1, 5), st.integers(0, 6)),
    st.tuples(st.just("sync"), st.integers(0, 5)),
    st.tuples(st.just("settle"), st.integers(1, 4), st.integers(0, 3)),
    st.tuples(st.just("grant"), st.integers(1, 4), st.integers(0, 5)),
    st.tuples(st.just("cancel"), st.integers(1, 4)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_every_consumer_reads_its_offsets_in_order_within_its_credit(ops):
    shell = Shell()
    credit: dict[int, int] = {}
    prefetch: dict[int, int] = {}
    for op in ops:
        kind, holder = op[0], op[1]
        consumer = shell.core.consumers.get(holder)
        if kind == "consume" and consumer is None:
            shell.delivered[holder] = []
            shell.apply(consume(holder, prefetch=op[2], credit=op[3], start="offset", at=0))
            credit[holder], prefetch[holder] = op[3], op[2]
        elif kind == "sync":
            shell.sync(shell.durable + holder)
        elif kind == "settle" and consumer is not None:
            shell.apply(r.Settle(QID, holder, list(consumer.unacked)[:op[2]], r.SETTLE_ACK))
        elif kind == "grant" and consumer is not None:
            credit[holder] += op[2]
            shell.apply(r.Grant(QID, holder, op[2]))
        elif kind == "cancel" and consumer is not None:
            shell.apply(r.Cancel(1, QID, holder))
        for h, consumer in shell.core.consumers.items():
            got = shell.delivered[h]
            assert got == list(range(len(got)))  # in order, none skipped or repeated
            assert len(got) <= shell.durable + 1  # only what is durable
            assert list(consumer.unacked) == got[len(got) - len(consumer.unacked):]
            assert len(consumer.unacked) <= prefetch[h]
            assert consumer.credit == credit[h] - len(got) >= 0
            if consumer.room():  # live: a consumer with room has read all that is durable
                assert len(got) == shell.durable + 1


@pytest.mark.parametrize("start", ["first", "last", "next", "timestamp"])
def test_attach_names_where_the_reader_starts(start):
    core = StreamQueue(QID)
    effects = core.apply(consume(1, start=start, at=5), 0.0)
    assert effects == [r.Reply(1, consumer_count=1), Attach(1, start, 5)]
