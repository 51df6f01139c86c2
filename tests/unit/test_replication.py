"""The replication core (shards/replication.py): a hypothesis state machine runs a
leader and two followers over a lossy, reordering, duplicating network, with
follower crashes, in-sync changes written to a model of etcd, and leader changes,
and checks after every step that nothing committed is lost or reordered at an
in-sync member, that the commit index stays within what the in-sync set holds,
and that memory stays within the bounds. A few plain tests pin single paths."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from warren.shards.replication import (
    Ack,
    Apply,
    Clear,
    Entry,
    Follower,
    Hello,
    Leader,
    Limits,
    Refused,
    Resend,
    Reset,
    Send,
    Snapshot,
)

NODES = ("a", "b", "c")
LIMITS = Limits(keep_entries=6, keep_bytes=40, in_flight=12, silence=3.0, max_lag=4, retry=2.0)
SIZES = st.integers(1, 9)


def starts(store: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where each epoch starts in a store of (epoch, record) entries."""
    out: list[tuple[int, int]] = []
    for index, (epoch, _) in enumerate(store, 1):
        if not out or out[-1][0] != epoch:
            out.append((epoch, index))
    return out


class Group(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.now = 0.0
        self.epoch = 1
        self.etcd_isr = frozenset(NODES)
        self.leader_node = "a"
        # by address: a follower's is its node, a leader's "L<epoch>"
        self.stores: dict[str, list[tuple[int, int]]] = {n: [] for n in ("L1", "b", "c")}
        self.durable: dict[str, list[tuple[int, int]]] = {n: [] for n in ("L1", "b", "c")}
        self.leader = Leader("g", 1, NODES, NODES, "a", 0, now=0.0, limits=LIMITS)
        self.deposed: list[tuple[str, Leader]] = []  # a cut-off leader still runs
        self.followers = {n: Follower("g", n, 0, 0, limits=LIMITS) for n in NODES if n != "a"}
        self.net: list[tuple[str, str, object]] = []  # (to, from, message)
        self.committed: list[tuple[int, int]] = []
        self.commit_in_epoch = 0
        self.next_record = 1
        self.pending: frozenset[str] | None = None
        for node in self.followers:
            self.connect(node)

    # -- the shell's part --------------------------------------------------------

    def connect(self, node: str) -> None:
        self.net.append((self.address, node, self.followers[node].hello(self.epoch)))

    @property
    def address(self) -> str:
        return f"L{self.epoch}"

    def leaders(self):
        return [(self.address, self.leader)] + self.deposed

    def held(self, node: str) -> list[tuple[int, int]]:
        return self.durable[self.address if node == self.leader_node else node]

    def to_follower(self, node: str, sender: str, message: object) -> None:
        follower = self.followers[node]
        if isinstance(message, Send):
            before = follower.epoch
            effects: list = follower.entries(message.epoch, message.first_index, message.prev_epoch,
                                            message.entries)
            if any(type(e) is Apply for e in effects):
                assert message.epoch >= before, "applied an entry of an old epoch"
        else:
            epoch, index, last_epoch, chunks = message  # a snapshot: its chunks, then its end
            if chunks:
                first = len(chunks) == 2
                effects = follower.snapshot_chunk(epoch, index, first, chunks[0])
                self.net.append((node, sender, (epoch, index, last_epoch, chunks[1:])))
            else:
                effects = follower.snapshot_end(epoch, index, last_epoch)
        for effect in effects:
            if type(effect) is Clear:
                self.stores[node] = []
            elif type(effect) is Apply:
                if isinstance(effect.records, list):
                    self.stores[node].extend(effect.records)
                else:
                    self.stores[node].append(effect.records)
            else:
                self.net.append((sender, node, effect))
        if follower.loading is None:
            assert len(self.stores[node]) == follower.log.last_index

    def to_leader(self, leader: Leader, node: str, message: object) -> None:
        if isinstance(message, Hello):
            leader.hello(node, *message)
        elif isinstance(message, Ack):
            leader.acked(node, message.epoch, message.upto)
        elif isinstance(message, Resend):
            leader.resend(node, message.epoch, message.from_index)
        elif isinstance(message, Reset):
            leader.reset(node, message.epoch)
        elif isinstance(message, Refused):
            leader.refused(node, message.epoch)

    def take_committed(self) -> None:
        moved = self.leader.take_committed()
        if moved is not None:
            store = self.stores[self.address]
            assert moved >= self.commit_in_epoch, "the commit index went back"
            assert 2 * len(self.leader.isr) > len(NODES), "a commit without a majority"
            self.commit_in_epoch = moved
            if moved > len(self.committed):
                assert store[:len(self.committed)] == self.committed, "a commit was replaced"
                self.committed = store[:moved]

    # -- rules -------------------------------------------------------------------

    @rule(sizes=st.lists(SIZES, min_size=1, max_size=4))
    def publish(self, sizes):
        for size in sizes:
            record = (self.epoch, self.next_record)
            self.next_record += 1
            assert self.leader.append(record, size) == len(self.stores[self.address]) + 1
            self.stores[self.address].append(record)

    @rule()
    def leader_commit(self):
        store = self.stores[self.address]
        self.durable[self.address] = list(store)
        self.leader.durable_here(len(store))
        self.take_committed()

    @rule(which=st.integers(0, 2))
    def pump(self, which):
        node, leader = self.leaders()[which % len(self.leaders())]
        for out in leader.take_sends():
            if type(out) is Snapshot:
                index = len(self.stores[node])
                last_epoch = leader.snapshot_started(out.node, index)
                if last_epoch is not None:
                    items = self.stores[node][:index]
                    chunks = [items[:index // 2], items[index // 2:]]
                    self.net.append((out.node, node, (out.epoch, index, last_epoch, chunks)))
                    leader.snapshot_sent(out.node)  # its chunks all went, in order
            else:
                self.net.append((out.node, node, out))
        self.check_in_flight(leader)

    @rule()
    def healthy_round(self):
        """Everything goes through in order, and every store commits."""
        self.leader_commit()
        self.pump(0)
        while self.net:
            self.deliver(*self.net.pop(0))
        for node in sorted(self.followers):
            self.commit_follower(node)
        while self.net:
            self.deliver(*self.net.pop(0))
        self.leader_commit()

    def deliver(self, to: str, sender: str, message: object) -> None:
        if to in self.followers:
            self.to_follower(to, sender, message)
        else:
            for address, leader in self.leaders():
                if address == to:
                    self.to_leader(leader, sender, message)
            self.take_committed()

    @precondition(lambda self: self.net)
    @rule(data=st.data(), fate=st.sampled_from(["deliver"] * 6 + ["drop", "duplicate"]))
    def network(self, data, fate):
        to, sender, message = self.net.pop(data.draw(st.integers(0, len(self.net) - 1)))
        if fate == "drop" and not isinstance(message, (Hello, tuple)):
            return  # hellos and snapshots go over a link that, if it broke, says so
        if fate == "duplicate" and not isinstance(message, tuple):
            self.net.append((to, sender, message))
        self.deliver(to, sender, message)

    @precondition(lambda self: self.followers)
    @rule(data=st.data())
    def follower_commit(self, data):
        self.commit_follower(data.draw(st.sampled_from(sorted(self.followers))))

    def commit_follower(self, node: str) -> None:
        follower = self.followers[node]
        if follower.loading is None:
            self.durable[node] = list(self.stores[node])
        else:
            self.durable[node] = []  # Clear's mark: a half snapshot is no log
        for ack in follower.durable(follower.log.last_index):
            self.net.append((f"L{follower.epoch}", node, ack))

    @precondition(lambda self: self.followers)
    @rule(data=st.data(), crash=st.booleans())
    def link_lost(self, data, crash):
        """The link to a follower breaks (its process crashed, or the network):
        what was on it is gone, and it says hello again."""
        node = data.draw(st.sampled_from(sorted(self.followers)))
        self.net = [m for m in self.net if node not in (m[0], m[1])]
        for _, leader in self.leaders():
            leader.follower_lost(node)
        if crash:
            store = self.stores[node] = list(self.durable[node])
            self.followers[node] = Follower("g", node, store[-1][0] if store else 0, len(store),
                                            history=starts(store), limits=LIMITS)
        self.connect(node)

    @rule(dt=st.floats(0.1, 4.0))
    def tick(self, dt):
        self.now += dt
        for _, leader in self.leaders():
            leader.tick(self.now)

    @precondition(lambda self: self.pending is None)
    @rule()
    def propose_isr(self):
        self.pending = self.leader.isr_proposal(self.now)
        for node in (self.pending or self.etcd_isr) - self.etcd_isr:
            assert self.held(node) == self.stores[self.address], f"{node} added behind"

    @precondition(lambda self: self.pending is not None)
    @rule(fails=st.booleans())
    def write_isr(self, fails):
        if not fails:
            self.etcd_isr = self.pending
        self.pending = None
        self.leader.isr_written(self.etcd_isr)
        self.take_committed()

    @precondition(lambda self: self.pending is None and len(self.etcd_isr) > 1)
    @rule(data=st.data(), now=st.integers(0, 2))
    def failover(self, data, now):
        """The leader is cut off; an in-sync follower wins epoch + 1 from what it
        holds durably; the old leader comes back as a follower. (A third of the
        draws: most runs need time between failovers to commit anything.)"""
        if now:
            return
        node = data.draw(st.sampled_from(sorted(self.etcd_isr - {self.leader_node})))
        old_node, old_address = self.leader_node, self.address
        self.deposed = [(old_address, self.leader)]
        self.epoch += 1
        store = self.stores[self.address] = list(self.durable[node])
        self.durable[self.address] = list(store)
        candidate = Follower("g", node, store[-1][0] if store else 0, len(store),
                             history=starts(store), limits=LIMITS)
        self.leader = candidate.lead(self.epoch, NODES, self.etcd_isr, self.now, LIMITS)
        self.leader_node = node
        self.commit_in_epoch = 0
        del self.followers[node]
        self.net = [m for m in self.net if node not in (m[0], m[1])]
        kept = self.stores[old_node] = list(self.durable[old_address])
        self.durable[old_node] = list(kept)
        self.followers[old_node] = Follower("g", old_node, kept[-1][0] if kept else 0,
                                            len(kept), history=starts(kept), limits=LIMITS)
        for follower in self.followers:
            self.connect(follower)

    @rule(now=st.integers(0, 3))
    def heal(self, now):
        """The network turns good and every link is made again: within a few
        rounds every follower is back in sync (by a snapshot if it is behind the
        kept entries or holds a tail the leader does not have), and everything
        is committed. (A quarter of the draws: it undoes the chaos.)"""
        if now:
            return
        self.net.clear()
        for node in self.followers:
            self.leader.follower_lost(node)
            self.connect(node)
        if self.pending is not None:
            self.write_isr(False)
        for _ in range(12):
            self.healthy_round()
            self.propose_isr()
            if self.pending is not None:
                self.write_isr(False)
        assert self.etcd_isr == set(NODES), "a follower did not come back in sync"
        for node in self.followers:
            assert self.durable[node] == self.stores[self.address], f"{node} is behind"
        assert self.leader.commit_index == len(self.stores[self.address])

    # -- invariants --------------------------------------------------------------

    @invariant()
    def committed_held_in_sync(self):
        for node in self.etcd_isr:
            held = self.held(node)
            assert held[:len(self.committed)] == self.committed, f"{node} lost a commit"
            if node in self.followers:  # and it never clears its store for a snapshot
                store = self.stores[node]
                assert store[:len(self.committed)] == self.committed, f"{node} cleared"

    @invariant()
    def commit_within_isr(self):
        leader = self.leader
        if leader.commit_index:
            for node in leader.isr:
                assert len(self.held(node)) >= leader.commit_index

    @invariant()
    def memory_bounded(self):
        for _, leader in self.leaders():
            assert len(leader.log.kept) <= LIMITS.keep_entries
            assert leader.log.kept_bytes <= LIMITS.keep_bytes
        for follower in self.followers.values():
            assert len(follower.log.kept) <= LIMITS.keep_entries

    def check_in_flight(self, leader: Leader) -> None:
        for peer in leader.peers.values():
            assert peer.in_flight_bytes <= max(LIMITS.in_flight, 9)
            assert peer.in_flight_bytes == sum(size for _, size in peer.in_flight)

    @invariant()
    def deposed_commits_only_what_the_in_sync_set_holds(self):
        for address, old in self.deposed:
            mine = self.stores[address][:old.commit_index]
            for node in self.etcd_isr:
                assert self.held(node)[:len(mine)] == mine


Group.TestCase.settings = settings(max_examples=300, stateful_step_count=80, deadline=None)
TestGroup = Group.TestCase


def settle(leader: Leader, followers: dict[str, Follower], rounds: int = 20) -> None:
    """Deliver everything, in order and without loss, until quiet."""
    for _ in range(rounds):
        for out in leader.take_sends():
            assert type(out) is Send
            follower = followers[out.node]
            for effect in follower.entries(out.epoch, out.first_index, out.prev_epoch, out.entries):
                if type(effect) is Ack:
                    leader.acked(out.node, effect.epoch, effect.upto)
            for ack in follower.durable(follower.log.last_index):
                leader.acked(out.node, ack.epoch, ack.upto)


def test_commit_waits_for_the_in_sync_set_and_moves_once_a_laggard_is_dropped():
    leader = Leader("g", 1, NODES, NODES, "a", 0, limits=LIMITS)
    followers = {"b": Follower("g", "b", 0, 0, limits=LIMITS)}
    leader.hello("b", *followers["b"].hello(1))
    assert leader.append("r1", 1) == 1
    leader.durable_here(1)
    settle(leader, followers)
    assert leader.take_committed() is None  # c holds nothing yet
    assert leader.isr_proposal(1.0) is None  # not silent long enough
    assert leader.isr_proposal(5.0) == {"a", "b"}
    assert leader.take_committed() is None  # not before it is written
    leader.isr_written({"a", "b"})
    assert leader.take_committed() == 1


def test_no_commit_without_a_majority():
    leader = Leader("g", 1, NODES, {"a"}, "a", 0, limits=LIMITS)
    leader.append("r1", 1)
    leader.durable_here(1)
    assert leader.take_committed() is None


def test_a_follower_refuses_an_old_epoch_and_asks_for_a_gap():
    follower = Follower("g", "b", 0, 0)
    follower.hello(3)
    assert follower.entries(2, 1, 0, [Entry(2, "x", 1)]) == [Refused(3)]
    assert follower.entries(3, 2, 3, [Entry(3, "y", 1)]) == [Resend(3, 1)]
    assert follower.entries(3, 1, 0, [Entry(3, "x", 1)]) == [Apply("x")]
    assert follower.durable(1) == [Ack(3, 1)]


def test_a_divergent_follower_is_dropped_then_snapshot():
    # b holds entry 2 of epoch 1 that the new leader (epoch 2) never had
    leader = Leader("g", 2, NODES, NODES, "a", 1, history=[(1, 1)],
                    kept=[Entry(1, "x", 1)], limits=LIMITS)
    leader.hello("b", 2, 1, 2, 2)
    assert leader.take_sends() == []  # not while it is in sync
    assert leader.isr_proposal(0.0) == {"a", "c"}
    leader.isr_written({"a", "c"})
    assert leader.take_sends() == [Snapshot("b", 2)]
    assert leader.snapshot_started("b", 1) == 1
    assert leader.snapshotting("b") and leader.take_sends() == []  # behind its chunks
    leader.snapshot_sent("b")
    assert not leader.snapshotting("b")
    assert [(s.node, s.first_index, s.entries) for s in leader.take_sends()] == [("b", 2, [])]
    follower = Follower("g", "b", 1, 2)
    follower.hello(2)
    assert follower.snapshot_chunk(2, 1, True, ["x"]) == [Clear(), Apply(["x"])]
    assert follower.snapshot_end(2, 1, 1) == []
    assert follower.durable(1) == [Ack(2, 1)]
    leader.acked("b", 2, 1)
    assert leader.isr_proposal(1.0) == {"a", "b", "c"}


def test_a_slow_follower_gets_at_most_the_budget_in_flight():
    leader = Leader("g", 1, NODES, NODES, "a", 0, limits=LIMITS)
    leader.hello("b", 1, 0, 0, 0)
    for n in range(5):
        leader.append(n, 5)
    sends = [s for s in leader.take_sends() if type(s) is Send and s.node == "b"]
    assert [len(s.entries) for s in sends] == [2]
    assert leader.take_sends() == []
    leader.acked("b", 1, 2)
    assert [s.first_index for s in leader.take_sends()] == [3]


def test_a_follower_behind_the_kept_entries_is_snapshot_and_rejoins():
    leader = Leader("g", 1, NODES, {"a", "b"}, "a", 0, limits=LIMITS)
    for n in range(10):
        leader.append(n, 1)
    leader.durable_here(10)
    leader.hello("c", 1, 0, 0, 0)  # entry 1 is no longer kept
    assert leader.take_sends() == [Snapshot("c", 1)]
    assert leader.snapshot_started("c", 10) == 1
    leader.snapshot_sent("c")
    follower = Follower("g", "c", 0, 0, limits=LIMITS)
    follower.hello(1)
    follower.snapshot_chunk(1, 10, True, list(range(10)))
    follower.snapshot_end(1, 10, 1)
    leader.append(10, 1)
    followers = {"c": follower}
    settle(leader, followers)
    assert follower.log.last_index == 11
    assert leader.isr_proposal(0.0) == {"a", "b", "c"}


def test_a_send_continues_only_the_entry_it_follows():
    follower = Follower("g", "b", 1, 2, history=[(1, 1)])
    follower.hello(2)
    # the leader of epoch 2 holds entry 2 of epoch 2, not ours of epoch 1
    assert follower.entries(2, 3, 2, [Entry(2, "z", 1)]) == [Reset(2)]
    assert follower.entries(2, 2, 1, [Entry(2, "y", 1)]) == [Reset(2)]
    assert follower.entries(2, 3, 1, [Entry(2, "z", 1)]) == [Apply("z")]
    assert follower.durable(3) == [Ack(2, 3)]


def test_a_follower_acks_a_new_leader_only_once_it_matched_our_log():
    # b holds 1..3 of epoch 1, 3 not durable, and the leader of epoch 2 has only 1..2:
    # an ack of 3 in epoch 2 would be taken for the leader's entry 3
    follower = Follower("g", "b", 0, 0)
    follower.entries(1, 1, 0, [Entry(1, n, 1) for n in range(3)])
    follower.durable(2)
    assert follower.hello(2) == Hello(2, 1, 3, 2)
    assert follower.durable(3) == []
    assert follower.snapshot_chunk(2, 2, True, [0, 1]) == [Clear(), Apply([0, 1])]
    follower.snapshot_end(2, 2, 1)
    assert follower.durable(2) == [Ack(2, 2)]


def test_a_chunk_of_a_snapshot_given_up_is_dropped():
    follower = Follower("g", "b", 0, 0)
    assert follower.snapshot_chunk(1, 7, True, [1]) == [Clear(), Apply([1])]
    assert follower.snapshot_chunk(1, 9, True, [1, 2]) == [Clear(), Apply([1, 2])]
    assert follower.snapshot_chunk(1, 7, False, [3]) == []
    assert follower.snapshot_end(1, 7, 1) == []
    assert follower.loading == 9
