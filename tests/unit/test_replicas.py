"""A shard's replicated quorum queues (shards/replicas.py), in-process: three
shards, each over its own temp store, play one replica group's leader and
followers, the test carrying their ReplicaFrame events to one another (as the
root and the inter-node link will). Confirms wait for a follower's durable ack,
acks and delivery counts reach the followers' rows, a follower promoted after the
leader's loss serves every confirmed message, a deposed leader is refused and
nacks what it held, a wiped follower is caught up by a snapshot; and random
publish/settle sequences leave the same rows on every member."""

from __future__ import annotations

import itertools
import tempfile

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.shards import records as r
from warren.shards import replicas
from warren.shards.persister import Persister
from warren.shards.replication import Limits
from warren.shards.stats import StatsLog
from warren.storage.queuespec import QueueSpec
from warren.storage.shardstore import Position, ShardStore, StoredQueue, WriteBatch, _Logged

from ..support.twins import SHARDS

QID = 5
MEMBERS = ["a", "b", "c"]
SPEC = QueueSpec("/", "q", True, False, False, {"x-queue-type": "quorum"})
CHANNEL = 3


@pytest.fixture(params=SHARDS)  # pure, and compiled
def shard_class(request):
    return request.param


class Node:
    """One node's shard over its own store, and what it sent."""

    def __init__(self, name: str, path: str, shard_class):
        self.name = name
        self.path = path
        self.store = ShardStore(path, 1 << 26)
        self.shard = shard_class(0, Persister({0: self.store}, 0), StatsLog(path + "-logs", 0))
        self.confirmed: list[int] = []
        self.rejected: list[int] = []
        self.events: list = []  # everything else it sent to its gateway

    def run(self, cmd, now: float = 0.0) -> None:
        self.shard.run(cmd, now)

    def take(self) -> list[r.ReplicaFrame]:
        """What it sent, then its commit's (as the shard's loop orders them): frames
        returned, the rest kept."""
        out = self.shard.take_events()[0]
        out += self.shard.commit_now(0.0)
        frames = []
        for event in out:
            if type(event) is r.ReplicaFrame:
                frames.append(event)
            elif type(event) is r.Confirmed:
                self.confirmed += event.seqs
            elif type(event) is r.Rejected:
                self.rejected += event.seqs
            else:
                self.events.append(event)
        return frames

    def close(self) -> None:
        self.store.close()


class Group:
    """The nodes, and the frames between them: `blocked` nodes' frames wait."""

    def __init__(self, nodes: list[Node]):
        self.nodes = {node.name: node for node in nodes}
        self.waiting: list[tuple[str, r.ReplicaFrame]] = []  # (from, frame)
        self.blocked: set[str] = set()

    def pump(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            for node in list(self.nodes.values()):
                self.waiting += [(node.name, frame) for frame in node.take()]
            moving = [(src, f) for src, f in self.waiting
                      if f.node not in self.blocked and src not in self.blocked]
            self.waiting = [(src, f) for src, f in self.waiting
                            if f.node in self.blocked or src in self.blocked]
            if not moving:
                return
            for src, frame in moving:
                node = self.nodes.get(frame.node)
                if node is not None:  # else a node gone: lost
                    node.run(r.ReplicaFrame(frame.qid, src, frame.payload))
        raise AssertionError("the frames never settle")

    def proposals(self, name: str) -> list[r.InSyncProposal]:
        node = self.nodes[name]
        found = [e for e in node.events if type(e) is r.InSyncProposal]
        node.events = [e for e in node.events if type(e) is not r.InSyncProposal]
        return found


def role(role: int, epoch: int, me: str, in_sync=MEMBERS) -> r.ReplicaRole:
    return r.ReplicaRole(QID, role, epoch, MEMBERS, list(in_sync), me)


def publish(seq: int, body: bytes = b"body") -> r.Publish:
    return r.Publish([QID], "", "q", b"\x00\x00", body, True, confirm_channel=CHANNEL,
                     confirm_seq=seq)


def rows(node: Node) -> list[tuple]:
    """The queue's rows as its store holds them: (seq, delivered, delivery_count,
    acquired, rich) and content."""
    node.store.checkpoint()
    found = list(node.store.recover(QID))
    contents = node.store.read_many([(QID, entry[0]) for entry in found])
    return [(entry, (c.exchange, c.routing_key, bytes(c.properties), bytes(c.body)))
            for entry, c in zip(found, contents)]


def make_group(tmp, shard_class, limits: Limits | None = None) -> Group:
    """a leads at epoch 10; b is told its role before the queue's record, c after."""
    nodes = [Node(name, f"{tmp}/{name}", shard_class) for name in MEMBERS]
    a, b, c = nodes
    if limits is not None:
        for node in nodes:
            node.shard.replicas.limits = limits
    a.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    a.run(role(r.ROLE_LEADER, 10, "a"))
    b.run(role(r.ROLE_FOLLOWER, 10, "b"))
    b.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    c.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    c.run(role(r.ROLE_FOLLOWER, 10, "c"))
    group = Group(nodes)
    group.pump()
    assert QID in a.shard.queues and QID not in b.shard.queues and QID not in c.shard.queues
    return group


@pytest.fixture
def group(tmp_path, shard_class):
    group = make_group(str(tmp_path), shard_class)
    yield group
    for node in group.nodes.values():
        node.close()


def shrink(group: Group, leader: str, now: float) -> None:
    """The leader's in-sync proposal after `now`, written as etcd would."""
    node = group.nodes[leader]
    node.shard.run_timers(now)
    group.waiting += [(leader, frame) for frame in node.take()]
    (proposal,) = group.proposals(leader)
    node.run(r.InSyncWritten(QID, proposal.epoch, proposal.nodes, True), now)
    group.pump()


def test_a_queue_replicated_once_it_holds_messages_ships_them_first(tmp_path, shard_class):
    nodes = [Node(name, f"{tmp_path}/{name}", shard_class) for name in MEMBERS]
    a = nodes[0]
    a.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    for seq in range(1, 4):
        a.run(publish(seq, b"m%d" % seq))
    a.run(r.Get(2, QID, 60, False))
    a.take()
    assert a.confirmed == [1, 2, 3]  # not replicated yet: durable here is enough
    a.run(role(r.ROLE_LEADER, 10, "a"))
    for node in nodes[1:]:
        node.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
        node.run(role(r.ROLE_FOLLOWER, 10, node.name))
    group = Group(nodes)
    group.pump()
    assert len(rows(a)) == 3 and rows(a)[0][0][1]  # the one taken is marked delivered
    assert rows(nodes[1]) == rows(a) == rows(nodes[2])
    a.run(publish(4))
    group.pump()
    assert a.confirmed == [1, 2, 3, 4]
    for node in nodes:
        node.close()


def test_nothing_is_gathered_for_queues_that_are_not_replicated(tmp_path, shard_class):
    node = Node("a", f"{tmp_path}/a", shard_class)
    node.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    node.run(publish(1))
    node.run(r.Get(2, QID, 60, False))
    node.take()
    node.run(r.Settle(QID, 60, [1], r.SETTLE_REQUEUE))
    assert node.shard.persister.entries == {} and not node.shard.replicas.active()
    assert node.take() == [] and node.confirmed == [1] and len(rows(node)) == 1
    node.close()


def test_a_confirm_waits_for_a_follower_and_the_in_sync_set(group):
    a = group.nodes["a"]
    group.blocked = {"b", "c"}
    a.run(publish(1))
    group.pump()
    assert a.confirmed == [] and a.rejected == []  # durable here only
    group.blocked = {"c"}
    group.pump()
    assert a.confirmed == []  # c is in sync: the commit index waits for it
    shrink(group, "a", 20.0)  # c lags and is silent past the limit: out
    assert a.confirmed == [1]
    a.run(publish(2))
    group.pump()
    assert a.confirmed == [1, 2]  # a and b: a majority
    group.blocked = set()
    group.pump()
    shrink(group, "a", 21.0)  # c caught up: back in
    assert a.shard.replicas.leaders[QID].isr == frozenset(MEMBERS)
    assert rows(group.nodes["c"]) == rows(a)
    group.blocked = {"b"}
    a.run(publish(3))
    group.pump()
    assert a.confirmed == [1, 2]  # b is in sync now
    shrink(group, "a", 40.0)
    assert a.confirmed == [1, 2, 3]  # a and c


def test_a_publish_that_reaches_a_follower_is_nacked_not_taken_for_unroutable(group):
    b = group.nodes["b"]  # routed to b's shard before the gateway heard b no longer leads
    b.run(publish(7))
    group.pump()
    assert (b.confirmed, b.rejected) == ([], [7])
    assert rows(b) == rows(group.nodes["a"])  # nothing of it written


def test_a_channels_confirms_stay_in_order_behind_a_held_one(group):
    a = group.nodes["a"]
    classic = QueueSpec("/", "classic", True, False, False, {})
    a.run(r.CreateQueue(2, 6, classic, {}))
    group.blocked = {"b", "c"}
    a.run(publish(1))
    a.run(r.Publish([6], "", "classic", b"\x00\x00", b"x", True, confirm_channel=CHANNEL,
                    confirm_seq=2))
    a.run(r.Publish([6], "", "classic", b"\x00\x00", b"y", True, confirm_channel=CHANNEL + 64,
                    confirm_seq=50))  # another channel's: not held
    group.pump()
    assert a.confirmed == [50]
    group.blocked = set()
    group.pump()
    assert a.confirmed == [50, 1, 2]


def test_acks_and_counts_reach_the_followers(group):
    a = group.nodes["a"]
    for seq in range(1, 6):
        a.run(publish(seq, b"m%d" % seq))
    a.run(r.Consume(2, QID, 40, 41, "t", False, False, 10, 100))
    group.pump()
    delivered = [e.seq for e in a.events if type(e) is r.Deliver]
    assert len(delivered) == 5
    a.run(r.Settle(QID, 40, delivered[:2], r.SETTLE_ACK))
    a.run(r.Settle(QID, 40, [delivered[2]], r.SETTLE_REQUEUE))  # failed: counted
    group.pump()
    assert a.confirmed == [1, 2, 3, 4, 5]
    leader_rows = rows(a)
    assert [row[0][0] for row in leader_rows] == delivered[2:]
    assert leader_rows[0][0][2] == 1  # its delivery count
    assert rows(group.nodes["b"]) == leader_rows == rows(group.nodes["c"])


def test_a_promoted_follower_serves_every_confirmed_message(tmp_path, shard_class):
    group = make_group(str(tmp_path), shard_class)
    a, b, c = (group.nodes[n] for n in MEMBERS)
    for seq in range(1, 5):
        a.run(publish(seq, b"m%d" % seq))
    a.run(r.Consume(2, QID, 40, 41, "t", False, False, 10, 100))
    group.pump()
    first = [e.seq for e in a.events if type(e) is r.Deliver]
    a.run(r.Settle(QID, 40, [first[0]], r.SETTLE_ACK))
    a.run(r.Settle(QID, 40, [first[1]], r.SETTLE_REQUEUE))  # back, counted, and taken again
    group.pump()
    assert a.confirmed == [1, 2, 3, 4]
    del group.nodes["a"]  # the leader's node is lost
    a.shard = None
    a.close()
    b.run(role(r.ROLE_LEADER, 20, "b"))
    c.run(role(r.ROLE_FOLLOWER, 20, "c"))
    group.pump()
    queue = b.shard.queues[QID]
    assert queue.ready_count == 3 and queue.unacked_count == 0
    b.run(r.Consume(3, QID, 50, 51, "t", False, False, 10, 100))
    group.pump()
    got = [(e.seq, e.body, e.redelivered, e.delivery_count) for e in b.events
           if type(e) is r.Deliver]
    # unacked ones come back redelivered, their failures counted as they were
    assert sorted(got) == [(first[1], b"m%d" % first[1], True, 1),
                           (first[2], b"m%d" % first[2], True, 0),
                           (first[3], b"m%d" % first[3], True, 0)]
    b.run(publish(9))
    group.pump()
    assert b.confirmed == []  # a, dead, is still in sync
    shrink(group, "b", 30.0)
    assert b.confirmed == [9]
    assert rows(c) == rows(b)
    for node in (b, c):
        node.close()


class Committer:
    """The committer thread's place: the test runs the commit itself."""

    def submit(self, pending) -> None:
        self.pending = pending


def test_a_promotion_waits_for_the_commit_in_flight(group):
    a, b = group.nodes["a"], group.nodes["b"]
    a.run(publish(1, b"in flight"))
    for frame in a.take():
        if frame.node == "b":
            b.run(r.ReplicaFrame(frame.qid, "a", frame.payload))
    committer = Committer()
    assert b.shard.start_commit(committer, 0.0) == []
    b.run(role(r.ROLE_LEADER, 20, "b"))
    assert QID not in b.shard.queues  # its rows are being written
    Persister.run_commit(committer.pending)
    b.shard.finish_commit()
    queue = b.shard.queues[QID]
    assert queue.ready_count == 1 and b.shard.replicas.leaders[QID].epoch == 20


def test_a_deposed_leader_is_refused_and_nacks_what_it_held(group):
    a, b, c = (group.nodes[n] for n in MEMBERS)
    a.run(r.Consume(2, QID, 40, 41, "t", False, False, 10, 100))
    group.pump()
    # etcd elected b (a's lease lapsed); a has not heard yet
    b.run(role(r.ROLE_LEADER, 20, "b"))
    c.run(role(r.ROLE_FOLLOWER, 20, "c"))
    group.pump()
    a.run(publish(1))
    group.pump()
    assert a.confirmed == [] and a.rejected == []
    assert a.shard.replicas.leaders[QID].deposed  # c refused its entry: epoch 20 is newer
    assert rows(c) == []
    a.run(role(r.ROLE_FOLLOWER, 20, "a"))
    group.pump()
    assert a.rejected == [1]
    assert QID not in a.shard.queues
    assert r.ConsumerCancelled(40, QID) in a.events
    b.run(publish(7, b"new"))
    group.pump()
    assert b.confirmed == []  # a's log is not a prefix of b's, and a is in sync
    shrink(group, "b", 30.0)
    assert b.confirmed == [7]
    # a's tail (its epoch-10 entry) was not b's: a snapshot replaced it
    assert rows(a) == rows(b) == rows(c) != []
    assert [row[1][3] for row in rows(a)] == [b"new"]


def test_a_deleted_queue_leaves_its_group_and_a_stale_role_is_ignored(group):
    a, b, c = (group.nodes[n] for n in MEMBERS)
    a.run(role(r.ROLE_FOLLOWER, 5, "a"))  # of an election before a's
    assert QID in a.shard.queues
    group.blocked = {"b", "c"}
    a.run(publish(1))
    group.pump()
    assert a.confirmed == []
    a.run(r.DeleteQueue(2, QID, False, False))
    group.pump()
    assert a.confirmed == [1]  # as a classic queue's: taken, then deleted
    assert QID not in a.shard.replicas.leaders
    for node in (b, c):
        node.run(r.DeleteQueue(3, QID, False, False))
    group.blocked = set()
    group.pump()  # a's entry reaches nobody now
    for node in (b, c):
        assert r.Reply(3) in node.events
        assert QID not in node.shard.replicas.followers
    for node in (a, b, c):
        assert rows(node) == [] and QID not in node.store.queues()


def test_a_leader_deposed_mid_turn_keeps_that_turn_in_its_log(group):
    a = group.nodes["a"]
    a.run(publish(1))
    a.run(role(r.ROLE_FOLLOWER, 20, "a"))  # before the turn's commit began
    a.take()
    follower = a.shard.replicas.followers[QID]
    assert follower.log.last_index == follower.durable_index == 1
    assert a.rejected == [1]
    a.store.checkpoint()
    assert a.store.positions() == {QID: Position([(10, 1)], 1)}


def wiped(group: Group, name: str, tmp: str, shard_class) -> Node:
    """Member `name` again on an empty store, told its role."""
    group.nodes[name].close()
    fresh = group.nodes[name] = Node(name, f"{tmp}/{name}-new", shard_class)
    fresh.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
    fresh.run(role(r.ROLE_FOLLOWER, 10, name))
    group.pump()
    return fresh


def test_a_wiped_follower_is_caught_up_by_a_snapshot(tmp_path, shard_class):
    tmp = str(tmp_path)
    group = make_group(tmp, shard_class, Limits(keep_entries=2))
    a = group.nodes["a"]
    a.run(r.Get(2, QID, 60, False))
    for seq in range(1, 6):
        a.run(publish(seq, b"m%d" % seq))
        group.pump()
    a.run(r.Get(3, QID, 60, False))
    a.run(r.Settle(QID, 60, [1], r.SETTLE_REQUEUE))
    group.pump()
    assert a.confirmed == [1, 2, 3, 4, 5]
    fresh = wiped(group, "c", tmp, shard_class)
    assert rows(fresh) == []  # too far behind: a snapshot, once out of the in-sync set
    shrink(group, "a", 20.0)
    assert rows(fresh) == rows(a) != []
    shrink(group, "a", 21.0)  # acked: back in
    assert a.shard.replicas.leaders[QID].isr == frozenset(MEMBERS)
    group.blocked = {"b"}
    a.run(publish(6))
    group.pump()
    assert a.confirmed[-1] == 5
    shrink(group, "a", 40.0)  # b out
    assert a.confirmed[-1] == 6  # the snapshot's follower counts
    for node in group.nodes.values():
        node.close()


def test_a_large_snapshot_goes_a_window_of_chunks_at_a_time(tmp_path, shard_class):
    """However large the queue, at most SNAPSHOT_WINDOW chunks are on their way
    before the follower takes one; meanwhile the queue changes, and the follower
    ends with the leader's rows all the same."""
    tmp = str(tmp_path)
    group = make_group(tmp, shard_class, Limits(keep_entries=2))
    a = group.nodes["a"]
    body = b"s" * (600 << 10)  # two to a chunk
    for seq in range(1, 17):
        a.run(publish(seq, body + b"%d" % seq))
        group.pump()
    fresh = wiped(group, "c", tmp, shard_class)
    a.shard.run_timers(20.0)  # out of the in-sync set: its snapshot starts
    group.waiting += [("a", frame) for frame in a.take()]
    (proposal,) = group.proposals("a")
    a.run(r.InSyncWritten(QID, proposal.epoch, proposal.nodes, True), 20.0)
    frames = a.take()
    group.waiting += [("a", frame) for frame in frames]
    chunks = [frame for frame in frames if frame.node == "c"
              and msgspec.msgpack.decode(frame.payload)[0] == replicas.CHUNK]
    assert len(chunks) == replicas.SNAPSHOT_WINDOW  # then it waits for the follower
    a.run(r.Get(3, QID, 60, False))  # the queue changes under the snapshot: one acked
    a.run(r.Settle(QID, 60, [1], r.SETTLE_ACK))
    group.pump()
    assert [row[0][0] for row in rows(fresh)] == list(range(2, 17))
    assert rows(fresh) == rows(a)
    assert not a.shard.replicas.sending
    for node in group.nodes.values():
        node.close()


def test_restarted_members_find_their_logs_and_serve_only_when_told(tmp_path, shard_class):
    tmp = str(tmp_path)
    group = make_group(tmp, shard_class)
    a, b = group.nodes["a"], group.nodes["b"]
    for seq in range(1, 4):
        a.run(publish(seq, b"m%d" % seq))
    group.pump()
    b.close()
    del group.nodes["b"]
    for seq in range(4, 6):
        a.run(publish(seq, b"m%d" % seq))
    group.pump()
    b = group.nodes["b"] = Node("b", tmp + "/b", shard_class)
    assert QID not in b.shard.queues  # a replica's rows: no queue to serve
    assert b.shard.replicas.followers[QID].log.last_index > 0
    b.run(role(r.ROLE_FOLLOWER, 10, "b"))
    group.pump()
    assert rows(b) == rows(a) and len(rows(b)) == 5
    assert a.confirmed == [1, 2, 3, 4, 5]
    a.close()
    a = group.nodes["a"] = Node("a", tmp + "/a", shard_class)
    assert QID not in a.shard.queues
    a.run(role(r.ROLE_LEADER, 20, "a"))
    for name in ("b", "c"):
        group.nodes[name].run(role(r.ROLE_FOLLOWER, 20, name))
    group.pump()
    assert a.shard.queues[QID].ready_count == 5
    a.run(publish(6))
    group.pump()
    assert a.confirmed == [6]  # its log went on from where its store stood
    assert rows(b) == rows(a) == rows(group.nodes["c"])
    for node in group.nodes.values():
        node.close()


def test_a_journal_written_before_positions_reads_as_none(tmp_path):
    store = ShardStore(str(tmp_path / "s"), 1 << 26)
    batch = WriteBatch()
    batch.put_queue(QID, StoredQueue(SPEC, SPEC.arguments))
    logged = batch.logged()
    old = msgspec.msgpack.encode(list(msgspec.structs.astuple(logged))[:-1])
    assert WriteBatch.from_logged(msgspec.msgpack.decode(old, type=_Logged)).positions == {}
    store.close()


def test_a_cleared_replica_keeps_its_record_through_a_merge(tmp_path):
    store = ShardStore(str(tmp_path / "s"), 1 << 26)
    first = WriteBatch()
    first.put_queue(QID, StoredQueue(SPEC, SPEC.arguments))
    first.put_message(QID, 1, ("", "q", b"", b"x"))
    first.set_position(QID, Position([(1, 1)], 1))
    store.append(first)
    clear = WriteBatch()
    clear.delete_queue(QID)
    clear.put_queue(QID, StoredQueue(SPEC, SPEC.arguments))
    clear.set_position(QID, Position([], 0))
    clear.put_message(QID, 2, ("", "q", b"", b"y"))
    store.append(clear)  # merged into what the journal holds beyond LMDB
    store.checkpoint()
    assert list(store.queues()) == [QID]
    assert [entry[0] for entry in store.recover(QID)] == [2]
    assert store.positions() == {QID: Position([], 0)}
    store.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.binary(max_size=20)),
    st.tuples(st.just("get"), st.just(0)),
    st.tuples(st.sampled_from(["ack", "requeue", "return"]), st.integers(0, 10)),
    st.tuples(st.just("pump"), st.just(0)),
    st.tuples(st.just("block"), st.sampled_from(["b", "c", ""]))), max_size=30)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_random_sequences_leave_the_same_rows_everywhere(ops):
    outcomes = {"ack": r.SETTLE_ACK, "requeue": r.SETTLE_REQUEUE, "return": r.SETTLE_RETURN}
    with tempfile.TemporaryDirectory() as tmp:
        group = make_group(tmp, SHARDS[0].values[0])
        a = group.nodes["a"]
        seqs = itertools.count(1)
        held: list[int] = []
        try:
            for op, arg in ops:
                if op == "publish":
                    a.run(publish(next(seqs), arg))
                elif op == "get":
                    a.run(r.Get(9, QID, 60, False))
                    taken = [e for e in a.shard.take_events()[0] if type(e) is r.GetReply]
                    held += [e.seq for e in taken if e.seq]
                elif op == "pump":
                    group.pump()
                elif op == "block":
                    group.blocked = {arg} if arg else set()
                elif held:
                    seq = held.pop(arg % len(held))
                    a.run(r.Settle(QID, 60, [seq], outcomes[op]))
            group.blocked = set()
            group.pump()
            expected = rows(a)
            assert rows(group.nodes["b"]) == expected == rows(group.nodes["c"])
        finally:
            for node in group.nodes.values():
                node.close()


FAULTS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.just("")),
    st.tuples(st.just("get"), st.just("")),
    st.tuples(st.sampled_from(["ack", "requeue", "return"]), st.integers(0, 10)),
    st.tuples(st.sampled_from(["pump", "tick"]), st.just("")),
    st.tuples(st.sampled_from(["block", "failover", "wipe", "restart"]),
              st.sampled_from(MEMBERS))),
    max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=FAULTS)
def test_failovers_and_wiped_followers_lose_no_confirmed_message(ops):
    """Random publishes, settlements, blocked nodes, failovers to an in-sync member,
    restarted and wiped followers: every confirmed message not acked is on the last
    leader, and once the frames flow every member holds the same rows."""
    outcomes = {"ack": r.SETTLE_ACK, "requeue": r.SETTLE_REQUEUE, "return": r.SETTLE_RETURN}
    with tempfile.TemporaryDirectory() as tmp:
        group = make_group(tmp, SHARDS[0].values[0])
        leader, epoch, now = "a", 10, 0.0
        bodies = itertools.count(1)
        held: list[int] = []
        acked: set[bytes] = set()
        seq_bodies: dict[int, bytes] = {}
        wiped = itertools.count(1)

        def tick() -> None:
            nonlocal now
            now += 11.0
            node = group.nodes[leader]
            node.shard.run_timers(now)
            group.waiting += [(leader, frame) for frame in node.take()]
            for proposal in group.proposals(leader):
                node.run(r.InSyncWritten(QID, proposal.epoch, proposal.nodes, True), now)
            group.pump()

        try:
            for op, arg in ops:
                node = group.nodes[leader]
                if op == "publish":
                    body = b"m%d" % next(bodies)
                    node.run(publish(int(body[1:]), body))
                elif op == "get":
                    node.run(r.Get(9, QID, 60, False))
                    for e in node.shard.take_events()[0]:
                        if type(e) is r.GetReply and e.seq:
                            held.append(e.seq)
                            seq_bodies[e.seq] = e.body
                        elif type(e) is not r.GetReply:
                            node.events.append(e)
                elif op in outcomes:
                    if held:
                        seq = held.pop(arg % len(held))
                        node.run(r.Settle(QID, 60, [seq], outcomes[op]))
                        if op == "ack":
                            acked.add(seq_bodies[seq])
                elif op == "pump":
                    group.pump()
                elif op == "tick":
                    tick()
                elif op == "block":
                    group.blocked = {arg} if arg != leader else set()
                elif op == "failover":
                    isr = node.shard.replicas.leaders[QID].isr
                    if arg == leader or arg not in isr:
                        continue  # only an in-sync member may win
                    epoch += 10
                    leader, held = arg, []
                    group.nodes[leader].run(role(r.ROLE_LEADER, epoch, leader, sorted(isr)))
                    for name in MEMBERS:
                        if name != leader:
                            group.nodes[name].run(role(r.ROLE_FOLLOWER, epoch, name))
                    group.pump()
                elif arg != leader:  # restart a follower, or wipe its store
                    path = group.nodes[arg].path
                    group.nodes[arg].close()
                    if op == "wipe":
                        path = f"{tmp}/{arg}-{next(wiped)}"
                    fresh = Node(arg, path, SHARDS[0].values[0])
                    group.nodes[arg] = fresh
                    fresh.run(r.CreateQueue(1, QID, SPEC, SPEC.arguments))
                    fresh.run(role(r.ROLE_FOLLOWER, epoch, arg))
            group.blocked = set()
            group.pump()
            tick()
            tick()
            confirmed = {b"m%d" % seq for node in group.nodes.values() for seq in node.confirmed}
            kept = {row[1][3] for row in rows(group.nodes[leader])}
            assert confirmed - acked <= kept
            assert all(rows(node) == rows(group.nodes[leader]) for node in group.nodes.values())
        finally:
            for node in group.nodes.values():
                node.close()
