"""Replica groups' elections (gateway/cluster/groups.py), pure: against a small
model of etcd's keys, revisions, transactions and leases, with each node's
watch lagging as far as hypothesis likes, campaigns racing, leases lost,
in-sync sets rewritten, nodes crashing and views reloaded."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.cluster import groups as g
from warren.gateway.cluster import layout as lay
from warren.gateway.cluster.etcd import KeyValue, WatchEvent

LAYOUT = lay.Layout("/t")
NODES = ("a", "b", "c")
VHOST, NAME = "/", "q/1"
LEADER, ISR = LAYOUT.group_leader(VHOST, NAME), LAYOUT.group_isr(VHOST, NAME)


def fresh() -> g.GroupView:
    return g.GroupView(LEADER, ISR)


def test_group_keys_are_percent_encoded_and_parse_back():
    assert LAYOUT.group_key("/", "a/b") == b"/t/groups/%2F/a%2Fb/"
    assert LEADER == b"/t/groups/%2F/q%2F1/leader"
    assert LAYOUT.group_of(LEADER) == (VHOST, NAME, "leader")
    assert LAYOUT.group_of(ISR) == (VHOST, NAME, "isr")
    assert LAYOUT.group_of(b"/t/groups/%2F/q/1/leader") is None
    assert LAYOUT.group_of(LAYOUT.queue_key("/", "x")) is None
    assert lay.decode_in_sync(lay.encode_group(lay.InSync(["a", "b"], 9))) == \
        lay.InSync(["a", "b"], 9)
    assert lay.decode_leader(lay.encode_group(lay.Leader("a"))) == lay.Leader("a")


def in_sync(view: g.GroupView, nodes, revision: int, epoch: int = 0) -> g.GroupView:
    return g.isr_put(view, "a", lay.InSync(list(nodes), epoch), revision)[0]


def test_the_preferred_member_campaigns_first_and_the_others_later_by_rank():
    view = in_sync(fresh(), NODES, 5)
    for me, delay in (("a", 0.0), ("b", 0.5), ("c", 1.0)):
        view_of_me = g.joined(view, me, NODES)[0]
        decision = g.campaign(view_of_me, me, NODES, lease=7)
        assert decision is not None and decision.delay == delay
        assert decision.compares == [
            {"key": LEADER, "target": "CREATE", "result": "EQUAL", "create_revision": 0},
            {"key": ISR, "target": "MOD", "result": "EQUAL", "mod_revision": 5}]
        assert decision.success == [{"request_put": {
            "key": LEADER, "value": lay.encode_group(lay.Leader(me)), "lease": 7}}]
    # "a" is not running: "b" is preferred
    decision = g.campaign(g.joined(view, "b", NODES)[0], "b", ("b", "c"), lease=7)
    assert decision is not None and decision.delay == 0.0


def test_no_campaign_out_of_sync_without_lease_or_membership_or_with_a_leader():
    view = g.joined(in_sync(fresh(), ("a", "b"), 5), "c", NODES)[0]
    assert g.campaign(view, "c", NODES, lease=7) is None  # not in sync
    view = g.joined(in_sync(fresh(), NODES, 5), "c", NODES)[0]
    assert g.campaign(view, "c", NODES, lease=0) is None
    assert g.campaign(view, "c", ("a", "b"), lease=7) is None  # not running
    assert g.campaign(g.left(view), "c", NODES, lease=7) is None
    assert g.campaign(g.joined(fresh(), "c", NODES)[0], "c", NODES, lease=7) is None  # no isr
    led = g.leader_put(view, "c", "a", 6, 6)[0]
    assert g.campaign(led, "c", NODES, lease=7) is None


def test_roles_told_and_the_fenced_in_sync_write():
    view, told = g.joined(in_sync(fresh(), NODES, 5), "a", NODES)
    assert told == [] and view.role == g.NoLeader()
    assert g.in_sync_write(view, NODES) is None
    view, told = g.won(view, "a", 8)
    assert told == [g.Leading(8)]
    write = g.in_sync_write(view, ("a", "b"))
    assert write is not None
    compares, success, _ = write
    assert compares == [{"key": LEADER, "target": "CREATE", "result": "EQUAL",
                         "create_revision": 8}]
    assert success == [{"request_put": {"key": ISR,
                                        "value": lay.encode_group(lay.InSync(["a", "b"], 8))}}]
    view, told = g.in_sync_written(view, "a", ("a", "b"), 9)
    assert told == [] and view.in_sync == ("a", "b") and view.isr_epoch == 8
    assert g.leader_put(view, "a", "a", 8, 8) == (view, [])  # its own key, seen late
    view, told = g.leader_deleted(view, "a", 12)
    assert told == [g.Deposed(8), g.NoLeader()]
    assert g.leader_deleted(view, "a", 11) == (view, [])  # older than what it has
    view, told = g.leader_put(view, "a", "b", 14, 14)
    assert told == [g.Following("b", 14)]
    view, told = g.leader_put(view, "a", "c", 10, 15)  # an older epoch: never
    assert told == []


def test_a_lost_lease_deposes_at_once_and_the_stale_key_is_no_leader():
    view = g.won(g.joined(in_sync(fresh(), NODES, 5), "a", NODES)[0], "a", 8)[0]
    view, told = g.resigned(view, "a")
    assert told == [g.Deposed(8), g.NoLeader()]
    assert g.in_sync_write(view, NODES) is None
    assert g.campaign(view, "a", NODES, lease=9) is None  # its old key is still there
    view, told = g.leader_deleted(view, "a", 20)
    assert told == []
    assert g.campaign(view, "a", NODES, lease=9) is not None


def test_a_leader_replaced_without_its_deletion_seen_is_deposed():
    view = g.won(g.joined(in_sync(fresh(), NODES, 5), "a", NODES)[0], "a", 8)[0]
    view, told = g.reloaded(view, "a", KeyValue(LEADER, lay.encode_group(lay.Leader("b")), 30,
                                                30), None, 40)
    assert told == [g.Deposed(8), g.Following("b", 30)]
    assert view.in_sync is None and view.isr_revision == 40


# -- the model ---------------------------------------------------------------------

class Etcd:
    """etcd's keys as a transaction and the watch see them, one revision a
    write; a put on a lease etcd no longer has fails as etcd's does."""

    def __init__(self) -> None:
        self.keys: dict[bytes, KeyValue] = {}
        self.revision = 1
        self.live: set[int] = set()
        self.watchers: list[Node] = []
        self.created: dict[int, str] = {}  # epoch -> who created the leader key then

    def _compare(self, compare: dict) -> bool:
        kv = self.keys.get(compare["key"])
        assert compare["result"] == "EQUAL"
        if compare["target"] == "CREATE":
            return (kv.create_revision if kv else 0) == compare["create_revision"]
        return (kv.mod_revision if kv else 0) == compare["mod_revision"]

    def txn(self, compares, success, failure=()) -> tuple[bool, int, list]:
        ok = all(self._compare(c) for c in compares)
        ops = success if ok else failure
        writes = [op for op in ops if "request_range" not in op]
        for op in writes:
            lease = op["request_put"].get("lease", 0)
            if lease and lease not in self.live:
                raise LookupError("requested lease not found")
        if writes:
            self.revision += 1
        events = []
        responses = []
        for op in ops:
            if "request_put" in op:
                put = op["request_put"]
                old = self.keys.get(put["key"])
                kv = KeyValue(put["key"], put["value"], old.create_revision if old else
                              self.revision, self.revision, (old.version if old else 0) + 1,
                              put.get("lease", 0))
                self.keys[put["key"]] = kv
                if put["key"] == LEADER and old is None:
                    self.created[self.revision] = lay.decode_leader(put["value"]).node
                events.append(WatchEvent(kv))
                responses.append([])
            else:
                kv = self.keys.get(op["request_range"]["key"])
                responses.append([kv] if kv else [])
        self._tell(events)
        return ok, self.revision, responses

    def expire(self, lease: int) -> None:
        self.live.discard(lease)
        gone = [key for key, kv in self.keys.items() if kv.lease == lease]
        if gone:
            self.revision += 1
            for key in gone:
                del self.keys[key]
            self._tell([WatchEvent(KeyValue(key, mod_revision=self.revision), "DELETE")
                        for key in gone])

    def _tell(self, events: list[WatchEvent]) -> None:
        for node in self.watchers:
            if node.alive:
                node.pending.extend(events)


@dataclass
class Node:
    name: str
    lease: int
    view: g.GroupView = field(default_factory=fresh)
    alive: bool = True
    pending: list[WatchEvent] = field(default_factory=list)
    told: list[g.Role] = field(default_factory=list)


class World:
    def __init__(self, members: tuple[str, ...]) -> None:
        self.etcd = Etcd()
        self.members = members
        self.next_lease = 100
        self.leaders: dict[int, set[str]] = {}
        self.nodes = {name: Node(name, self.grant()) for name in NODES}
        self.etcd.watchers = list(self.nodes.values())
        self.etcd.txn([], [{"request_put": {"key": ISR, "value": lay.encode_group(
            lay.InSync(list(members), 0))}}])
        for node in self.nodes.values():
            self.reload(node)
            self.take(node, g.joined(node.view, node.name, members))

    def grant(self) -> int:
        self.next_lease += 1
        self.etcd.live.add(self.next_lease)
        return self.next_lease

    def running(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.alive]

    def take(self, node: Node, change: g.Change) -> list[g.Role]:
        before = node.view
        view, told = change
        last = next((r for r in reversed(node.told) if not isinstance(r, g.Deposed)), None)
        newest = max((r.epoch for r in node.told if isinstance(r, (g.Leading, g.Following))),
                     default=0)
        for role in told:
            if isinstance(role, g.Deposed):
                assert last == g.Leading(role.epoch), (node.name, last, role)
            if isinstance(role, g.Leading):
                self.leaders.setdefault(role.epoch, set()).add(node.name)
                assert self.leaders[role.epoch] == {node.name}, "two leaders in one epoch"
                assert self.etcd.created[role.epoch] == node.name
            if isinstance(role, g.Following):
                assert self.etcd.created[role.epoch] == role.leader
            if isinstance(role, (g.Leading, g.Following)):
                assert role.epoch > newest, "an epoch went back, came back or changed leader"
                newest = role.epoch
            if not isinstance(role, g.Deposed):
                last = role
        assert view.epoch >= before.epoch
        node.view = view
        node.told += told
        return told

    def reload(self, node: Node) -> list[g.Role]:
        node.pending.clear()  # the watch goes on from the read's revision
        keys = self.etcd.keys
        return self.take(node, g.reloaded(node.view, node.name, keys.get(LEADER), keys.get(ISR),
                                          self.etcd.revision))

    def deliver(self, node: Node) -> None:
        if not node.pending:
            return
        event = node.pending.pop(0)
        where = LAYOUT.group_of(event.kv.key)
        assert where is not None
        was = node.view.role
        shows_deposition = where[2] == "leader" and isinstance(was, g.Leading) and \
            event.kv.mod_revision > node.view.leader_revision and \
            (event.type == "DELETE" or event.kv.create_revision != was.epoch)
        told = self.take(node, g.applied(node.view, node.name, where[2], event.kv,
                                         event.type == "DELETE"))
        if shows_deposition:
            assert told[:1] == [g.Deposed(was.epoch)], (told, was)

    def campaign(self, node: Node) -> None:
        decision = g.campaign(node.view, node.name, self.running(), node.lease)
        if decision is None:
            return
        assert node.view.in_sync is not None and node.name in node.view.in_sync
        try:
            ok, revision, responses = self.etcd.txn(decision.compares, decision.success,
                                                    decision.failure)
        except LookupError:
            return  # its lease expired: the shell retries until it has a new one
        if ok:
            isr = lay.decode_in_sync(self.etcd.keys[ISR].value)
            assert node.name in isr.nodes, "a node out of sync won"
            self.take(node, g.won(node.view, node.name, revision))
        else:
            self.read_back(node, revision, responses)

    def read_back(self, node: Node, revision: int, responses: list) -> None:
        leader, isr = (kvs[0] if kvs else None for kvs in responses)
        self.take(node, g.reloaded(node.view, node.name, leader, isr, revision))

    def set_in_sync(self, node: Node, others: frozenset[str]) -> None:
        nodes = [m for m in self.members if m in others or m == node.name]
        write = g.in_sync_write(node.view, nodes)
        if write is None:
            return
        epoch = node.view.epoch
        ok, revision, responses = self.etcd.txn(*write)
        if ok:
            assert self.etcd.keys[LEADER].create_revision == epoch
            assert self.etcd.created[epoch] == node.name
            self.take(node, g.in_sync_written(node.view, node.name, nodes, revision))
        else:
            assert LEADER not in self.etcd.keys or \
                self.etcd.keys[LEADER].create_revision != epoch
            self.read_back(node, revision, responses)
            assert not isinstance(node.view.role, g.Leading)

    def act(self, action: str, node: Node, others: frozenset[str]) -> None:
        if action == "revive":
            if not node.alive:
                node.alive, node.lease, node.view = True, self.grant(), fresh()
                node.told = []  # a new process: it remembers nothing
                self.reload(node)
                self.take(node, g.joined(node.view, node.name, self.members))
            return
        if not node.alive:
            return
        if action == "deliver":
            for _ in range(len(others) + 1):
                self.deliver(node)
        elif action == "campaign":
            self.campaign(node)
        elif action == "in_sync":
            self.set_in_sync(node, others)
        elif action == "expire":  # etcd's side: the node may not know yet
            self.etcd.expire(node.lease)
        elif action == "lose":  # the node's side: its lease ran out, it takes another
            self.etcd.expire(node.lease)
            self.take(node, g.resigned(node.view, node.name))
            node.lease = self.grant()
        elif action == "crash":
            self.etcd.expire(node.lease)
            node.alive = False
            node.pending.clear()
        elif action == "reload":
            self.reload(node)


ACTIONS = ("deliver", "deliver", "campaign", "campaign", "campaign", "in_sync", "in_sync",
           "expire", "expire", "lose", "crash", "revive", "reload")
steps = st.lists(st.tuples(st.sampled_from(ACTIONS), st.sampled_from(NODES),
                           st.frozensets(st.sampled_from(NODES))), min_size=10, max_size=100)


@settings(max_examples=400, deadline=None)
@given(st.permutations(NODES), steps)
def test_elections_keep_one_leader_per_epoch_and_depose_at_once(members, actions):
    world = World(tuple(members))
    for action, name, others in actions:
        world.act(action, world.nodes[name], others)
    # once every watch has caught up, every live node agrees on the leader
    for node in world.nodes.values():
        while node.alive and node.pending:
            world.deliver(node)
    kv = world.etcd.keys.get(LEADER)
    for node in world.nodes.values():
        if node.alive and kv is not None and kv.create_revision != node.view.resigned:
            expected = g.Leading(kv.create_revision) if world.etcd.created[
                kv.create_revision] == node.name else g.Following(
                world.etcd.created[kv.create_revision], kv.create_revision)
            assert node.view.role == expected


@settings(max_examples=200, deadline=None)
@given(st.permutations(NODES), steps)
def test_with_no_leader_a_running_in_sync_member_campaigns_and_wins(members, actions):
    world = World(tuple(members))
    for action, name, others in actions:
        world.act(action, world.nodes[name], others)
    for node in world.nodes.values():
        world.act("revive", node, frozenset())
        world.act("lose", node, frozenset())  # fresh leases all round
    for node in world.nodes.values():
        world.reload(node)
    isr = lay.decode_in_sync(world.etcd.keys[ISR].value).nodes
    for name in members:
        world.campaign(world.nodes[name])
    kv = world.etcd.keys[LEADER]
    assert world.etcd.created[kv.create_revision] == next(m for m in members if m in isr)
