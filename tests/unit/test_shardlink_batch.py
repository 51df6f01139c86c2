"""What a shard link gathers for its next ring record: a run of acks is one Settle;
an ack that may wait rides with the next record to the shard, or goes alone after
SETTLE_DELAY. And what it does with the shard's events: credit back, replies to
their requests, the rest to the gateway in the shard's order. Each test runs
both twins (shardlink.py, and its compiled build where there is one)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.io.shardlink import SETTLE_DELAY
from warren.shards import records as r
from warren.shards.codec import decode_commands, encode_batch
from warren.shards.ring import Ring

from ..support.twins import LINKS

pytestmark = pytest.mark.parametrize("link_class", LINKS)


def batch_of(link_class, records: list) -> list:
    async def gather() -> list:
        link = link_class(0, "", [], 0, 60.0, 1 << 20, on_events=None, on_exit=None)
        link.alive = True  # no process: only the batch is looked at
        link.flush_scheduled = True  # and never flushed
        for record in records:
            link.send(record)
        return link._batch
    return asyncio.run(gather())


def test_consecutive_settles_of_one_holder_and_outcome_are_one_record(link_class):
    got = batch_of(link_class, [r.Settle(1, 7, [1], r.SETTLE_ACK), r.Settle(1, 7, [2, 3], r.SETTLE_ACK),
                    r.Settle(1, 7, [4], r.SETTLE_ACK)])
    assert got == [r.Settle(1, 7, [1, 2, 3, 4], r.SETTLE_ACK)]


settles = st.builds(lambda holder, qid, outcome, seqs: r.Settle(qid, holder, seqs, outcome),
                    st.integers(1, 2), st.integers(1, 2), st.sampled_from([0, 1, 2]),
                    st.lists(st.integers(1, 50), min_size=1, max_size=3))
others = st.builds(lambda holder: r.Grant(1, holder, 1), st.integers(1, 2))


def flattened(records: list) -> list:
    out = []
    for record in records:
        if type(record) is r.Settle:
            out += [(record.holder, record.qid, record.outcome, seq) for seq in record.seqs]
        else:
            out.append(record)
    return out


@given(st.lists(st.one_of(settles, others), max_size=30))
def test_merged_settles_settle_the_same_messages_in_the_same_order(link_class, records):
    """The shard applies a batch's records as they come: the link's merging is the
    only one, and it keeps every message and the order."""
    expected = flattened(copy.deepcopy(records))
    merged = batch_of(link_class, records)
    assert flattened(merged) == expected
    for first, second in zip(merged, merged[1:]):  # every run of one kind is one Settle
        if type(first) is r.Settle and type(second) is r.Settle:
            assert (first.holder, first.qid, first.outcome) != (
                second.holder, second.qid, second.outcome)


def test_settles_stay_apart_across_holders_outcomes_and_other_records(link_class):
    records = [r.Settle(1, 7, [1], r.SETTLE_ACK), r.Settle(1, 8, [1], r.SETTLE_ACK),
               r.Settle(1, 8, [2], r.SETTLE_REQUEUE), r.Grant(1, 8, 5),
               r.Settle(1, 8, [3], r.SETTLE_REQUEUE), r.Settle(2, 8, [4], r.SETTLE_REQUEUE)]
    assert batch_of(link_class, [*records]) == records


@contextlib.contextmanager
def link_over_a_ring(link_class):
    """A link whose records go into a real command ring (no shard process)."""
    link = link_class(0, "", [], 0, 60.0, 1 << 20, on_events=None, on_exit=None)
    link.commands = ring = Ring.create(1 << 16)
    link.alive = True
    try:
        yield link, ring
    finally:
        ring.close()
        ring.unlink()


@contextlib.contextmanager
def link_between_rings(link_class):
    """link_over_a_ring, and an event ring the shard's events come back on."""
    with link_over_a_ring(link_class) as (link, ring):
        link.events = events = Ring.create(1 << 16)
        try:
            yield link, ring, events
        finally:
            events.close()
            events.unlink()


def from_shard(events: Ring, *records) -> None:
    events.write_many([encode_batch(list(records))])


def records_in(ring: Ring) -> list[list]:
    return ring.read_many(decode_commands)


def test_a_lone_ack_waits_for_the_next_record_to_its_shard_and_goes_with_it(link_class):
    async def run():
        with link_over_a_ring(link_class) as (link, ring):
            link.send(r.Settle(1, 7, [1], r.SETTLE_ACK), lazy=True)
            link.flush()  # the connection's turn ends without it
            await asyncio.sleep(0)
            assert records_in(ring) == []
            publish = r.Publish([1], "", "q", b"\x00\x00", b"body", False)
            link.send(publish)
            await asyncio.sleep(0)  # the end of the turn
            assert records_in(ring) == [[r.Settle(1, 7, [1], r.SETTLE_ACK), publish]]
            await asyncio.sleep(SETTLE_DELAY * 2)  # and no second record for it
            assert records_in(ring) == []
    asyncio.run(run())


def test_lone_acks_go_alone_once_they_waited_settle_delay(link_class):
    async def run():
        with link_over_a_ring(link_class) as (link, ring):
            link.send(r.Settle(1, 7, [1], r.SETTLE_ACK), lazy=True)
            link.send(r.Settle(1, 7, [2], r.SETTLE_ACK), lazy=True)
            assert link.lazy_acks == 2
            deadline = asyncio.get_running_loop().time() + 5
            got: list = []
            while not got and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(SETTLE_DELAY / 2)
                got = records_in(ring)
            assert got == [[r.Settle(1, 7, [1, 2], r.SETTLE_ACK)]]
            assert link.lazy_acks == 0
    asyncio.run(run())


def test_an_ack_that_is_not_lazy_goes_at_the_end_of_the_turn_with_the_lazy_ones(link_class):
    async def run():
        with link_over_a_ring(link_class) as (link, ring):
            link.send(r.Settle(1, 7, [1], r.SETTLE_ACK), lazy=True)
            link.send(r.Settle(1, 7, [2], r.SETTLE_REQUEUE))
            await asyncio.sleep(0)
            assert records_in(ring) == [[r.Settle(1, 7, [1], r.SETTLE_ACK),
                                         r.Settle(1, 7, [2], r.SETTLE_REQUEUE)]]
    asyncio.run(run())


class Feeder:
    """A publishing connection, as a link sees it: held when out of credit, released."""

    def __init__(self):
        self.calls: list[str] = []

    def hold(self, link) -> None:
        self.calls.append("hold")

    def release(self, link) -> None:
        self.calls.append("release")


def test_publishes_spend_credit_until_their_connection_is_held_and_progress_returns_it(
        link_class):
    async def run():
        with link_between_rings(link_class) as (link, ring, events):
            conn = Feeder()
            transient = r.Publish([1], "", "q", b"\x00\x00", b"x", False)
            persistent = r.Publish([1], "", "q", b"\x00\x00", b"x", True)
            for _ in range(r.PUBLISH_CREDIT - r.PERSISTENT_COST):
                link.send(transient, conn)
            link.flush()  # ring record 1
            assert link.credit[conn] == r.PERSISTENT_COST and conn.calls == []
            link.send(persistent, conn)
            link.flush()  # record 2 spends the rest
            assert link.credit[conn] == 0 and conn.calls == ["hold"]
            assert len(records_in(ring)) == 2
            from_shard(events, r.Progress(1))  # the shard did record 1
            assert link.poll()
            assert link.credit[conn] == r.PUBLISH_CREDIT - r.PERSISTENT_COST
            assert conn.calls == ["hold", "release"]
            from_shard(events, r.Progress(2))
            assert link.poll()
            assert link.credit[conn] == r.PUBLISH_CREDIT
            assert not link.poll()  # nothing more to hand over
            link.forget(conn)
            assert conn not in link.credit
    asyncio.run(run())


def test_a_publish_into_a_queue_with_a_backlog_spends_what_the_shard_says_it_costs(
        link_class):
    async def run():
        with link_between_rings(link_class) as (link, _ring, events):
            conn = Feeder()
            into = {qids: r.Publish(list(qids), "", "q", b"\x00\x00", b"x", False)
                    for qids in [(1,), (2,), (1, 2)]}
            from_shard(events, r.PublishCost(1, 3))
            assert link.poll()
            for qids in [(1,), (2,), (1, 2)]:
                link.send(into[qids], conn)
            link.send(r.Publish([1], "", "q", b"\x00\x00", b"x", True), conn)
            link.flush()
            spent = 3 + 1 + 3 + 3 * r.PERSISTENT_COST  # fanned out: the dearest queue's
            assert link.credit[conn] == r.PUBLISH_CREDIT - spent
            from_shard(events, r.Progress(1), r.PublishCost(1, 1))
            assert link.poll()
            link.send(into[(1,)], conn)
            link.flush()
            assert link.credit[conn] == r.PUBLISH_CREDIT - 1  # caught up: back to 1
    asyncio.run(run())


def test_events_reach_the_gateway_in_the_shard_s_order_and_replies_their_requests(
        link_class):
    async def run():
        handed: list = []
        link = link_class(0, "", [], 0, 60.0, 1 << 20,
                          on_events=lambda _link, events: handed.append(list(events)),
                          on_exit=None)
        link.commands, link.events = Ring.create(1 << 16), Ring.create(1 << 16)
        link.alive = link.flush_scheduled = True  # no process; records stay in the batch
        try:
            def failing(reply):
                raise RuntimeError("a broken callback")

            link.request(lambda req: r.QueueInfo(req, []), lambda reply: handed.append(reply))
            link.request(lambda req: r.QueueInfo(req, []), failing)
            before, between, after = (r.Alarm("memory", True), r.Alarm("disk", True),
                                      r.Alarm("memory", False))
            link.events.write_many([encode_batch(
                [before, r.Reply(1), between, r.Reply(2), r.Reply(99), after, r.Progress(0)])])
            assert link.poll()
            # a reply never overtakes what the shard emitted before it; the broken
            # callback is logged and the rest go on; a reply nobody waits for is dropped
            assert handed == [[before], r.Reply(1), [between], [after]]
        finally:
            for ring in (link.commands, link.events):
                ring.close()
                ring.unlink()
    asyncio.run(run())


def test_answers_to_a_turn_s_input_are_taken_without_a_doorbell_and_it_is_armed_again(
        link_class):
    """While a connection's input is handled the gateway is awake (its event ring
    says so, Gateway.take_shard_events): a shard answering meanwhile does not ring.
    take_answers hands the answers over and arms the doorbell again, so an answer
    after the turn rings it. Called from inside the link's own dispatch (a
    connection resumed by it), it leaves that to the outer take."""
    async def run():
        handed: list = []
        with link_between_rings(link_class) as (link, _ring, events):
            def on_events(_link, got):
                handed.append(list(got))
                link.take_answers()  # nested: returns at once

            link._on_events = on_events
            doorbell = events.spec().data_fd
            assert events.sleep()  # armed, as after the gateway's last read
            events.awake()  # the turn begins
            from_shard(events, r.Alarm("memory", True))
            events.flush()  # the shard's doorbell: the gateway is awake, so silence
            with pytest.raises(BlockingIOError):
                os.eventfd_read(doorbell)
            link.take_answers()
            assert handed == [[r.Alarm("memory", True)]]
            from_shard(events, r.Alarm("memory", False))
            events.flush()  # after the turn: armed again, it rings
            assert os.eventfd_read(doorbell) == 1
    asyncio.run(run())
