"""A hypothesis state machine drives the queue with random publishes, consumes,
credit, gets, acks, requeues, discards, cancels and channel closes, and checks
its invariants against a small reference model after every step."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from warren.shards import queue
from warren.shards import records as r
from warren.storage.queuespec import QueueSpec

from ..support.twins import COMPILED_QUEUE

CHANNEL = 900  # the holder id of basic.get deliveries


class QueueModel(RuleBasedStateMachine):
    build = queue  # which build of queue.py: the pure one here, the compiled one below

    def __init__(self):
        super().__init__()
        self.queue = self.build.Queue(
            r.CreateQueue(0, 1, QueueSpec("/", "q", False, False, False, {}), {}))
        self.next_body = 0
        self.ready: set[int] = set()  # model: seqs ready
        self.held: dict[int, set[int]] = {}  # holder -> seqs
        self.settled: set[int] = set()
        self.returned: set[int] = set()  # seqs returned at least once
        self.consumers: dict[int, dict] = {}  # holder -> prefetch, credit, no_ack
        self.next_holder = 1

    # -- applying commands and checking their effects --------------------------

    def apply(self, cmd) -> None:
        for effect in self.queue.apply(cmd, 0.0):
            if type(effect) is r.Deliver:
                self.delivered(effect.holder, effect.seq, effect.redelivered)

    def delivered(self, holder: int, seq: int, redelivered: bool) -> None:
        assert holder in self.consumers, "delivery to a consumer that is gone"
        consumer = self.consumers[holder]
        assert consumer["credit"] > 0, "delivery beyond the granted credit"
        consumer["credit"] -= 1
        assert seq in self.ready
        assert seq == min(self.ready), "not the oldest ready message (order broken)"
        assert redelivered == (seq in self.returned)
        self.ready.discard(seq)
        if consumer["no_ack"]:
            self.settled.add(seq)
        else:
            self.held.setdefault(holder, set()).add(seq)
            if consumer["prefetch"]:
                assert len(self.held[holder]) <= consumer["prefetch"], "prefetch exceeded"

    # -- rules -----------------------------------------------------------------

    @rule(count=st.integers(1, 4))
    def publish(self, count):
        for _ in range(count):
            seq = self.queue.next_seq
            self.ready.add(seq)
            self.apply(r.Publish([1], "", "q", b"", b"%d" % seq, False))

    @rule(prefetch=st.integers(0, 3), credit=st.integers(0, 5), no_ack=st.booleans())
    def consume(self, prefetch, credit, no_ack):
        holder = self.next_holder
        self.next_holder += 1
        self.consumers[holder] = {"prefetch": prefetch, "credit": credit, "no_ack": no_ack}
        self.apply(r.Consume(1, 1, holder, 100, f"c{holder}", no_ack, False, prefetch, credit))

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), credit=st.integers(1, 4))
    def grant(self, data, credit):
        holder = data.draw(st.sampled_from(sorted(self.consumers)))
        self.consumers[holder]["credit"] += credit
        self.apply(r.Grant(1, holder, credit))

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def cancel(self, data):
        holder = data.draw(st.sampled_from(sorted(self.consumers)))
        del self.consumers[holder]
        self.apply(r.Cancel(1, 1, holder))  # what it holds stays held

    @rule(no_ack=st.booleans())
    def get(self, no_ack):
        effects = self.queue.apply(r.Get(1, 1, CHANNEL, no_ack), 0.0)
        reply = effects[0]
        if not self.ready:
            assert reply.seq == 0
            return
        assert reply.seq == min(self.ready)
        assert reply.redelivered == (reply.seq in self.returned)
        self.ready.discard(reply.seq)
        (self.settled.add(reply.seq) if no_ack
         else self.held.setdefault(CHANNEL, set()).add(reply.seq))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), outcome=st.sampled_from([r.SETTLE_ACK, r.SETTLE_REQUEUE,
                                                    r.SETTLE_DISCARD]))
    def settle(self, data, outcome):
        holder = data.draw(st.sampled_from(sorted(h for h, s in self.held.items() if s)))
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.held[holder])), min_size=1,
                                  unique=True))
        for seq in seqs:
            self.held[holder].discard(seq)
            if outcome == r.SETTLE_REQUEUE:
                self.ready.add(seq)
                self.returned.add(seq)
            else:
                self.settled.add(seq)
        self.apply(r.Settle(1, holder, seqs, outcome))

    @rule(data=st.data())
    def close_channel(self, data):
        # A channel closes: all its holders' messages return, its consumers go.
        holders = data.draw(st.lists(st.sampled_from(sorted(set(self.consumers) | {CHANNEL})),
                                     unique=True))
        for holder in holders:
            self.consumers.pop(holder, None)
            for seq in self.held.pop(holder, set()):
                self.ready.add(seq)
                self.returned.add(seq)
        self.apply(r.ReleaseHolders(holders))

    # -- invariants ------------------------------------------------------------

    @invariant()
    def every_message_in_exactly_one_place(self):
        held = [seq for seqs in self.held.values() for seq in seqs]
        assert len(held) == len(set(held))
        places = [self.ready, set(held), self.settled]
        total = self.queue.next_seq - 1
        assert sum(len(p) for p in places) == total
        assert set().union(*places) == set(range(1, total + 1))

    @invariant()
    def queue_agrees_with_model(self):
        assert self.queue.ready_count == len(self.ready)
        assert self.queue.unacked_count == sum(len(s) for s in self.held.values())
        for holder, seqs in self.held.items():
            assert set(self.queue.holdings.get(holder, {})) == seqs


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

if COMPILED_QUEUE is not None:
    class CompiledQueueModel(QueueModel):
        build = COMPILED_QUEUE

    TestCompiledQueueModel = CompiledQueueModel.TestCase
    TestCompiledQueueModel.settings = TestQueueModel.settings
