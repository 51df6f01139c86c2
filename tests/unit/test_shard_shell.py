"""The shard's shell driven in-process: a command that fails is answered, and the
shard goes on serving the other commands (issue 17.1's class of bug); confirms
leave only with the commit that covers them, nacks when it fails; due timers
expire messages and queues."""

from __future__ import annotations

import copy
import random
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from warren.shards import persister as persister_module
from warren.shards import records as r
from warren.shards import shard as shard_module
from warren.shards.effects import Remove
from warren.shards.main import before_commit
from warren.shards.persister import Persister
from warren.shards.queue import Queue
from warren.shards.stats import StatsLog
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import ShardStore, StoreFull

from ..support.twins import SHARDS
from . import test_queue_straight as straight


def create_queue(req: int, qid: int, name: str, durable: bool = False,
                 arguments: dict | None = None) -> r.CreateQueue:
    spec = QueueSpec("/", name, durable, False, False, arguments or {})
    return r.CreateQueue(req, qid, spec, spec.arguments)


@pytest.fixture(params=SHARDS)  # pure, and compiled
def shard_class(request):
    return request.param


@pytest.fixture
def shard(tmp_path, shard_class):
    store = ShardStore(str(tmp_path / "shard-0"), 1 << 26)
    shard = shard_class(0, Persister({0: store}, 0), StatsLog(str(tmp_path / "logs"), 0))
    shard.run(create_queue(1, 7, "q"), 0.0)
    yield shard
    store.close()


def publish(seq: int) -> r.Publish:
    return r.Publish([7], "", "q", b"\x00\x00", b"body", False, confirm_channel=3,
                     confirm_seq=seq)


def test_failing_commands_are_answered_and_the_next_ones_served(shard, monkeypatch):
    shard.take_events()[0]

    def broken(queue, cmd, effects):
        raise RuntimeError("a bug in the queue")

    # every command's handler (the compiled shard calls the queue's apply as C)
    queue = shard.queues[7]
    monkeypatch.setattr(queue, "_handlers", dict.fromkeys(type(queue)._handlers, broken))
    shard.run(r.Get(2, 7, 9, True), 0.0)
    shard.run(publish(1), 0.0)
    assert shard.take_events()[0] == [r.GetReply(2, 7, refused=r.Refusal.FAILED)]
    assert shard.start_commit(None, 0.0) == [r.Rejected([3], [1])]  # nacked, not forgotten

    monkeypatch.undo()
    shard.run(publish(2), 0.0)
    shard.run(r.Get(4, 7, 9, True), 0.0)
    (reply,) = shard.take_events()[0]
    assert type(reply) is r.GetReply and reply.req == 4 and not reply.refused and reply.seq
    assert shard.commit_now(0.0) == [r.Confirmed([3], [2])]


def test_due_timers_expire_messages_and_then_the_unused_queue(shard):
    shard.run(create_queue(2, 8, "ttl", arguments={"x-message-ttl": 1000, "x-expires": 5000}),
              0.0)
    shard.run(r.Publish([8], "", "ttl", b"\x00\x00", b"body", False), 0.0)
    shard.take_events()[0]
    assert shard.timers.next_deadline() == 1.0
    shard.run_timers(0.5)
    assert shard.queues[8].ready_count == 1
    shard.run_timers(1.0)
    assert shard.queues[8].ready_count == 0  # the message's time to live ran out
    assert shard.timers.next_deadline() == 5.0  # x-expires: unused since 0.0
    shard.run_timers(5.0)
    assert 8 not in shard.queues and shard.take_events()[0] == [r.QueueDeleted(8)]
    assert shard.timers.next_deadline() is None


def test_a_refused_publish_is_nacked_with_the_commit(shard):
    shard.run(create_queue(2, 9, "small",
                           arguments={"x-max-length": 1, "x-overflow": "reject-publish"}), 0.0)
    for seq in (1, 2):
        shard.run(r.Publish([7, 9], "", "", b"\x00\x00", b"body", False, confirm_channel=3,
                            confirm_seq=seq), 0.0)
    # the second publish reached q but not the full queue: the publisher gets a nack
    assert shard.start_commit(None, 0.0) == [r.Confirmed([3], [1]), r.Rejected([3], [2])]
    assert shard.queues[7].ready_count == 2 and shard.queues[9].ready_count == 1


class InlineCommitter:
    """The committer thread's job, run when the test says."""

    def __init__(self):
        self.submitted = []

    def submit(self, pending) -> None:
        self.submitted.append(pending)

    def run(self) -> None:
        Persister.run_commit(self.submitted.pop())


def durable_publish(seq: int) -> r.Publish:
    return r.Publish([5], "", "d", b"\x00\x00", b"body", True, confirm_channel=3,
                     confirm_seq=seq)


def test_confirms_wait_for_the_commit_that_covers_them(shard):
    shard.run(create_queue(2, 5, "d", durable=True), 0.0)
    shard.run(durable_publish(1), 0.0)
    committer = InlineCommitter()
    assert shard.start_commit(committer, 0.0) == []  # nothing before the fsync
    shard.run(durable_publish(2), 0.0)  # arrives while the commit runs
    committer.run()
    assert shard.finish_commit() == [r.Confirmed([3], [1])]
    assert shard.commits.fsyncs == 1
    assert shard.commit_now(0.0) == [r.Confirmed([3], [2])]
    assert shard.commits.fsyncs == 2 and shard.commits.messages == 2


def test_a_full_store_nacks_and_wakes_the_shard_to_write_again(shard, monkeypatch):
    shard.run(create_queue(2, 5, "d", durable=True), 0.0)
    shard.commit_now(0.0)
    store = shard.persister.home
    real_append = store.append

    def full(batch):
        raise StoreFull("No space left on device")

    monkeypatch.setattr(store, "append", full)
    clock = [100.0]
    monkeypatch.setattr(persister_module.time, "monotonic", lambda: clock[0])
    shard.run(durable_publish(1), 100.0)
    assert shard.commit_now(100.0) == [r.Rejected([3], [1])]
    assert not shard.stored_ok
    retry_at = shard.persister.retry_at
    assert retry_at > 100.0 and shard.timers.next_deadline() == retry_at
    monkeypatch.setattr(store, "append", real_append)
    clock[0] = retry_at
    shard.run_timers(retry_at)
    assert shard.has_commit_work(retry_at)
    shard.commit_now(retry_at)  # the kept writes go to the store this time
    assert shard.stored_ok and shard.timers.next_deadline() is None
    assert [seq for seq, *_ in store.recover(5)] == [1]


def test_confirmed_messages_leave_ram_at_the_checkpoint_the_timer_asks_for(shard, monkeypatch):
    """A commit is durable in the journal; the messages' content stays in RAM until
    a checkpoint has written them to LMDB, which an idle shard's timer brings."""
    clock = [100.0]
    monkeypatch.setattr(persister_module.time, "monotonic", lambda: clock[0])
    shard.run(create_queue(2, 5, "d", durable=True), 100.0)
    shard.commit_now(100.0)  # a new queue is checkpointed at once
    store = shard.persister.home
    assert store.queues().keys() == {5}
    shard.run(durable_publish(1), 100.0)
    assert shard.commit_now(100.0) == [r.Confirmed([3], [1])]
    assert shard.ram_bytes > 0 and list(store.recover(5)) == []  # journaled only
    due = 100.0 + persister_module.CHECKPOINT_AFTER
    assert shard.timers.next_deadline() == due and not shard.has_commit_work(100.0)
    clock[0] = due
    shard.run_timers(due)
    assert shard.has_commit_work(due)
    assert shard.commit_now(due) == []
    assert shard.ram_bytes == 0 and [seq for seq, *_ in store.recover(5)] == [1]
    assert shard.timers.next_deadline() is None
    shard.take_events()
    shard.run(r.Get(6, 5, 9, True), due)  # read back from LMDB
    (reply,) = shard.take_events()[0]
    assert reply.seq == 1 and reply.body == b"body"


def consume(shard, qid: int = 5, holder: int = 10, prefetch: int = 100) -> None:
    shard.run(r.Consume(4, qid, holder, 1, "c", False, False, prefetch, 1000), 0.0)


def delivered_seqs(events: list) -> list[int]:
    return [e.seq for e in events if type(e) is r.Deliver]


def test_a_waiting_consumer_gets_a_persistent_message_before_its_commit(shard):
    """RabbitMQ delivers before the fsync; only the publisher's confirm waits for it."""
    shard.run(create_queue(2, 5, "d", True), 0.0)
    consume(shard)
    shard.commit_now(0.0)
    shard.take_events()[0]
    shard.run(durable_publish(1), 0.0)
    committer = InlineCommitter()
    assert shard.start_commit(committer, 0.0) == []  # the confirm waits for the fsync...
    (delivery,) = shard.take_events()[0]  # ...the delivery does not
    assert type(delivery) is r.Deliver and delivery.body == b"body"
    shard.run(r.Settle(5, 10, [1], r.SETTLE_ACK), 0.0)  # acked while its commit runs
    committer.run()
    assert shard.finish_commit() == [r.Confirmed([3], [1])]
    assert shard.ram_bytes == 0 and shard.queues[5].ram_bytes == 0  # not evicted twice
    shard.commit_now(0.0)  # the ack's delete
    assert list(shard.persister.home.recover(5)) == []


def test_a_message_acked_before_its_commit_is_never_written(shard):
    shard.run(create_queue(2, 5, "d", True), 0.0)
    consume(shard)
    shard.commit_now(0.0)
    written = shard.commits.messages
    shard.run(durable_publish(1), 0.0)
    assert delivered_seqs(shard.take_events()[0]) == [1]
    shard.run(r.Settle(5, 10, [1], r.SETTLE_ACK), 0.0)
    (batch,) = shard.persister.open_batches.values()
    assert not batch.puts and not batch.deletes and not batch.marks  # nothing of it to write
    assert shard.commit_now(0.0) == [r.Confirmed([3], [1])]
    assert shard.ram_bytes == 0 and list(shard.persister.home.recover(5)) == []
    assert shard.commits.messages == written + 1  # the queue's delivered number alone


def test_what_arrives_while_a_commit_runs_goes_into_the_next_one(shard):
    shard.run(create_queue(2, 5, "d", True), 0.0)
    shard.commit_now(0.0)
    fsyncs, written = shard.commits.fsyncs, shard.commits.messages
    committer = InlineCommitter()
    shard.run(durable_publish(1), 0.0)
    shard.start_commit(committer, 0.0)
    for seq in range(2, 42):  # forty turns of a steady stream while the fsync runs
        shard.run(durable_publish(seq), 0.0)
        shard.take_events()[0]
        assert shard.commits.inflight is not None  # no second commit meanwhile
    committer.run()
    assert shard.finish_commit() == [r.Confirmed([3], [1])]
    assert shard.start_commit(committer, 0.0) == []
    committer.run()
    assert shard.finish_commit() == [r.Confirmed([3] * 40, list(range(2, 42)))]
    assert shard.commits.fsyncs - fsyncs == 2  # 1 + 40 messages in two fsyncs
    assert shard.commits.messages - written == 41


def test_a_no_ack_get_carries_the_content_it_settles(shard):
    shard.run(create_queue(2, 5, "d", True), 0.0)
    shard.commit_now(0.0)
    shard.run(durable_publish(1), 0.0)
    shard.take_events()[0]
    shard.run(r.Get(6, 5, 9, True), 0.0)
    (reply,) = shard.take_events()[0]
    assert reply.seq == 1 and reply.body == b"body"
    assert shard.ram_bytes == 0 and not shard.persister.has_writes()


@given(st.integers(1, 60), st.integers(1, 10), st.integers(0, 2**32))
def test_a_queue_settles_a_merged_run_as_it_would_one_ack_at_a_time(count, prefetch, seed):
    """One consumer: the same messages delivered, in the same order, and removed."""

    def drive(merge: bool) -> tuple[list, list, int]:
        queue = Queue(create_queue(0, 5, "d", True))
        effects = queue.apply(r.Consume(1, 5, 10, 1, "c", False, False, prefetch, 1000), 0.0)
        for seq in range(1, count + 1):
            effects += queue.apply(r.Publish([5], "", "d", b"", b"b", True), 0.0)
        order = random.Random(seed)  # the consumer acks in its own order
        delivered, removed = [], []
        while True:
            held = [e.seq for e in effects if type(e) is r.Deliver]
            delivered += held
            removed += [s for e in effects if type(e) is Remove for s in e.seqs]
            if not held:
                return delivered, removed, queue.ready_count
            order.shuffle(held)
            # merged: the one Settle a shard link makes of a run of acks (ShardLink.send)
            acks = ([r.Settle(5, 10, held, r.SETTLE_ACK)] if merge
                    else [r.Settle(5, 10, [seq], r.SETTLE_ACK) for seq in held])
            effects = []
            for cmd in acks:
                effects += queue.apply(cmd, 0.0)

    one_by_one = drive(False)
    assert drive(True) == one_by_one
    assert sorted(one_by_one[0]) == sorted(one_by_one[1]) == list(range(1, count + 1))


@pytest.mark.parametrize("arguments, marks", [({}, 0), ({"x-max-priority": 5}, 2)])
def test_delivered_messages_come_back_redelivered_after_a_restart(tmp_path, arguments, marks,
                                                                 shard_class):
    """In order (no priorities): one number per queue; a priority queue: a mark each."""
    store = ShardStore(str(tmp_path / "shard-0"), 1 << 26)
    shard = shard_class(0, Persister({0: store}, 0), StatsLog(str(tmp_path / "logs"), 0))
    shard.run(create_queue(2, 5, "d", True, arguments), 0.0)
    consume(shard, prefetch=2)
    for seq in range(1, 5):
        shard.run(durable_publish(seq), 0.0)
    assert delivered_seqs(shard.take_events()[0]) == [1, 2]
    shard.commit_now(0.0)
    with store.env.begin() as txn:
        assert txn.stat(store._marks)["entries"] == marks
    store.close()
    store = ShardStore(str(tmp_path / "shard-0"), 1 << 26)
    again = shard_class(0, Persister({0: store}, 0), StatsLog(str(tmp_path / "logs2"), 0))
    assert [m.redelivered for m in again.queues[5].ready] == [True, True, False, False]
    store.close()


def test_credit_alone_waits_for_the_confirms_of_an_in_loop_commit():
    progress = r.Progress(4)
    assert before_commit([progress], r.PERSISTENT_COST) == ([], [progress])
    reply = r.Reply(2)
    assert before_commit([progress, reply], 1) == ([progress, reply], [])
    assert before_commit([], 0) == ([], [])
    # Unless the turn's publishes spent so much that a publisher may wait for it.
    assert before_commit([progress], r.PUBLISH_CREDIT) == ([progress], [])


@settings(max_examples=100, deadline=None)
@given(script=straight.scripts, durable=st.booleans(),
       arguments=st.one_of(straight.ARGUMENTS, st.just({"x-expires": 10_000})))
@example(script=[("consume", 11, False, 0, 3, 0), ("publish", False, -1, b"x")], durable=False,
         arguments={})  # a message held for its consumer: the shard's RAM figure grows
@pytest.mark.parametrize("build", SHARDS)
def test_a_shard_handles_a_straight_publish_as_the_long_way_does(build, script, durable,
                                                                 arguments):
    """Shard.handle takes a queue's short way itself: the same events, RAM figures,
    queue state and timers as the long way through the queue's apply."""
    with tempfile.TemporaryDirectory() as folder:
        shards, stores = [], []
        for name in ("short", "long"):
            store = ShardStore(f"{folder}/{name}/shard-0", 1 << 24)
            shard = build(0, Persister({0: store}, 0), StatsLog(f"{folder}/{name}/logs", 0))
            shard.run(create_queue(1, 1, "q", durable, arguments), 0.0)
            shard.take_events()
            shards.append(shard)
            stores.append(store)
        short, long = shards
        long.queues[1].straight = False
        used: set[int] = set()
        try:
            for now, step in enumerate(script):
                if step[0] == "tick":
                    for shard in shards:
                        shard.run_timers(float(now))
                else:
                    cmd = straight.command(step, short.queues[1], used)
                    if cmd is None:
                        continue
                    for shard in shards:
                        shard.run(copy.deepcopy(cmd), float(now))
                got, expected = (shard.take_events() for shard in shards)
                assert [[straight.shape(e) for e in events] for events in got] == \
                    [[straight.shape(e) for e in events] for events in expected]
                assert short.ram_bytes == long.ram_bytes
                assert short.timers.next_deadline() == long.timers.next_deadline()
                if 1 not in short.queues:  # expired unused (x-expires)
                    assert 1 not in long.queues
                    break
                assert straight.state(short.queues[1]) == straight.state(long.queues[1])
        finally:
            for shard, store in zip(shards, stores):
                shard.stats.close()
                store.close()


def test_alarms_go_on_and_off_once_each_as_the_resources_change(shard):
    """An Alarm event and a log record only when one changes: memory over the limit
    (or not), the last commit failed (or not)."""
    shard.run(r.Consume(2, 7, 10, 1, "c", False, False, 0, 0), 0.0)  # no credit: held
    shard.run(publish(1), 0.0)
    shard.take_events()
    limit = shard.ram_bytes - 1
    for memory_limit, stored, expected in [
            (limit, True, [r.Alarm("memory", True)]),
            (limit, True, []),
            (limit, False, [r.Alarm("disk", True)]),
            (shard.ram_bytes, False, [r.Alarm("memory", False)]),
            (0, True, [r.Alarm("disk", False)]),
            (0, True, [])]:
        shard.check_resources(memory_limit, stored)
        assert shard.take_events() == [expected]
    assert shard.alarms == set()


def test_a_backlog_under_consumers_makes_publishing_into_it_dearer_until_they_catch_up(shard):
    """One unit more per BACKLOG_STEP ready messages while the queue has consumers,
    told to the gateways once per change, and 1 again as the backlog goes: the
    publishers slow towards the consumers' pace, never to a stop."""
    step = shard_module.BACKLOG_STEP
    consume(shard, qid=7, prefetch=10)
    shard.take_events()

    def told() -> list[int]:
        if shard.costs:
            shard.reprice()  # as the shell does after each turn
        return [e.cost for e in shard.take_events()[0] if type(e) is r.PublishCost]

    costs = []
    for seq in range(1, 10 + 2 * step + 1):  # 10 delivered, 2 steps ready
        shard.run(publish(seq), 0.0)
        costs += told()
    assert costs == [2, 3] and shard.costs == {7: 3}
    shard.run(r.Settle(7, 10, list(range(1, 11)), r.SETTLE_ACK), 0.0)  # 10 more go out
    assert told() == [2]
    for seq in range(1, shard_module.MAX_PUBLISH_COST * step):
        shard.run(publish(seq), 0.0)
    assert told()[-1] == shard_module.MAX_PUBLISH_COST  # the most it ever costs
    shard.run(r.Cancel(0, 7, 10), 0.0)  # no consumers: a buffer, which the alarm bounds
    assert told() == [1] and shard.costs == {}
    for seq in range(1, 2 * step):
        shard.run(publish(seq), 0.0)
    assert told() == []
    # A consumer without a prefetch window (no-ack here) takes as fast as its
    # gateway writes: its backlog is no publisher's to pay for.
    shard.run(r.Consume(4, 7, 11, 1, "c2", True, False, 0, 10), 0.0)
    for seq in range(1, 2 * step):
        shard.run(publish(seq), 0.0)
    assert told() == [] and shard.costs == {}


def test_a_publish_cost_ends_with_its_queue(shard):
    step = shard_module.BACKLOG_STEP
    consume(shard, qid=7, prefetch=1)
    for seq in range(1, step + 2):
        shard.run(publish(seq), 0.0)
    assert shard.costs == {7: 2}
    shard.take_events()
    shard.run(r.DeleteQueue(9, 7, False, False), 0.0)
    shard.reprice()
    assert r.PublishCost(7, 1) in shard.take_events()[0] and shard.costs == {}
