"""The cluster's pure parts: the catalogue's keys in etcd (layout), its
transactions and watch events (sync) and the members' view (placement, shard
indexes)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.broker import changes as c
from warren.gateway.cluster import layout as lay
from warren.gateway.cluster.members import Members
from warren.gateway.cluster.sync import CatalogueSync
from warren.storage.metastore import (
    BindingDef,
    ExchangeDef,
    PermissionDef,
    PolicyDef,
    QueueDef,
    UserDef,
    VHostDef,
)
from warren.storage.queuespec import QueueSpec

LAYOUT = lay.Layout("/t")


def info(name: str, number: int, shards: int = 2) -> lay.NodeInfo:
    return lay.NodeInfo(name, number, f"127.0.0.1:{2000 + number}", "", "", shards, 0.0)


def sync_of(me: str = "n1") -> tuple[CatalogueSync, Members]:
    members = Members(me, 2)
    for number, name in enumerate(("n1", "n2", "n3"), 1):
        members.joined(info(name, number))
    return CatalogueSync(LAYOUT, me, members.locate, members.shard_of), members


def queue_put(name: str, shard: int, qid: int = 7, owner: int = 0) -> c.QueuePut:
    return c.QueuePut(QueueDef(QueueSpec("/", name, True, False, False, {}), qid, shard), owner)


def test_a_name_with_a_slash_cannot_reach_another_key():
    one = LAYOUT.key("queue", "a/b", "c")
    other = LAYOUT.key("queue", "a", "b/c")
    assert one != other
    assert LAYOUT.kind_of(one) == "queue"


def test_every_record_round_trips_through_its_value_at_its_own_key():
    records = [c.VHostPut(VHostDef("v", "d", {"max-queues": 3})),
               c.UserPut(UserDef("u", "hash", ["administrator"])),
               c.PermissionPut(PermissionDef("u", "v", ".*", ".*", "^x")),
               c.PolicyPut(PolicyDef("v", "p", "^q", "queues", 1, {"max-length": 5})),
               c.ExchangePut(ExchangeDef("v", "e", "topic", True, False, False, {})),
               c.BindingPut(BindingDef("v", "e", "q", "queue", "k.#", {"x": 1})),
               lay.QueueRecord(queue_put("q", 1).definition, "n2", 65, "n1")]
    keys = {LAYOUT.key_of(record) for record in records}
    assert len(keys) == len(records)
    for record in records:
        assert lay.decode(lay.encode(record)) == record


def test_bindings_differing_only_in_arguments_have_their_own_keys():
    one = c.BindingPut(BindingDef("/", "e", "q", "queue", "k", {"x-match": "all"}))
    other = c.BindingPut(BindingDef("/", "e", "q", "queue", "k", {"x-match": "any"}))
    assert LAYOUT.key_of(one) != LAYOUT.key_of(other)
    assert LAYOUT.key_of(c.BindingDeleted(one.definition)) == LAYOUT.key_of(one)


def test_a_turn_of_changes_is_one_transaction_compared_with_what_this_node_saw():
    sync, members = sync_of()
    vhost = c.VHostPut(VHostDef("/"))
    sync.observe(LAYOUT.key_of(vhost), lay.encode(vhost), 5, lay.decode)
    sync.record(c.ExchangePut(ExchangeDef("/", "e", "direct", True, False, False, {})))
    sync.record(queue_put("q", members.shard_of("n3", 1)))
    sync.record(c.VHostDeleted("/"))
    txn = sync.take_txn()
    compares = dict(txn.compares)
    assert compares[LAYOUT.key("vhost", "/")] == 5  # seen at revision 5
    assert compares[LAYOUT.key("exchange", "/", "e")] == 0  # new: must not exist
    queue = txn.puts[LAYOUT.queue_key("/", "q")]
    assert (queue.node, queue.definition.shard) == ("n3", 1)  # etcd names the node
    assert txn.deletes == [LAYOUT.key("vhost", "/")]
    assert not sync.pending()


def test_a_queue_made_and_forgotten_in_one_turn_writes_nothing():
    sync, _ = sync_of()
    sync.record(queue_put("q", 0))
    sync.record(c.QueueForgotten(7))
    assert sync.take_txn().compares == []


def test_this_nodes_own_write_coming_back_from_the_watch_is_not_replayed():
    sync, _ = sync_of()
    sync.record(queue_put("q", 0))
    txn = sync.take_txn()
    sync.committed(txn, 11)
    key, record = next(iter(txn.puts.items()))
    assert sync.observe(key, lay.encode(record), 11, lay.decode) is None


def test_another_nodes_queue_arrives_with_this_nodes_index_for_its_shard():
    here, members = sync_of("n1")
    there, _ = sync_of("n2")
    there.record(queue_put("q", 1))  # n2's own shard 1
    txn = there.take_txn()
    key, record = next(iter(txn.puts.items()))
    change = here.observe(key, lay.encode(record), 3, lay.decode)
    assert type(change) is c.QueuePut
    assert members.locate(change.definition.shard) == ("n2", 1)
    removal = here.observe(key, None, 4, lay.decode)
    assert removal == c.QueueForgotten(7)


def test_an_exclusive_owner_of_another_node_gets_an_id_no_connection_here_has():
    here, _ = sync_of("n1")
    there, _ = sync_of("n2")
    there.record(queue_put("x", 0, qid=9, owner=129))
    key, record = next(iter(there.take_txn().puts.items()))
    change = here.observe(key, lay.encode(record), 3, lay.decode)
    assert change.owner < 0
    assert here.owners_of_node("n2") == {change.owner}
    assert here.owner_in_cluster(change.owner) == (129, "n2")


kinds = st.sampled_from(["vhost", "exchange", "queue"])
names = st.sampled_from(["a", "b", "c", "d"])


@given(st.dictionaries(st.tuples(kinds, names), st.booleans()),
       st.dictionaries(st.tuples(kinds, names), st.booleans()))
def test_a_reload_makes_the_catalogue_etcds(etcd_objects, local_objects):
    """Whatever the node has and etcd has, the reload's changes turn the first
    into the second: puts for what etcd has differently, removals for the rest."""
    sync, _ = sync_of()

    def record(kind, name, flag):
        if kind == "vhost":
            return c.VHostPut(VHostDef(name, "x" if flag else ""))
        if kind == "exchange":
            return c.ExchangePut(ExchangeDef("/", name, "direct", flag, False, False, {}))
        return lay.QueueRecord(QueueDef(QueueSpec("/", name, flag, False, False, {}),
                                        ord(name), 0), "n1")

    etcd = {LAYOUT.key_of(r): r for r in (record(k, n, f) for (k, n), f in etcd_objects.items())}
    local = {LAYOUT.key_of(r): r for r in (record(k, n, f) for (k, n), f in local_objects.items())}
    todo = sync.reload([(key, lay.encode(r), 1) for key, r in etcd.items()], 9, lay.decode, local)
    state = dict(local)
    for change in todo:
        if type(change) is c.QueuePut:
            state[LAYOUT.queue_key(change.definition.spec.vhost, change.definition.spec.name)] = \
                lay.QueueRecord(change.definition, "n1")
        elif type(change) is c.QueueForgotten:
            state = {k: v for k, v in state.items()
                     if not (type(v) is lay.QueueRecord and v.definition.qid == change.qid)}
        elif type(change) in (c.VHostDeleted, c.ExchangeDeleted):
            state.pop(LAYOUT.key_of(change))
        else:
            state[LAYOUT.key_of(change)] = change
    assert state == etcd
    kinds_in_order = [LAYOUT.kind_of(LAYOUT.key_of(x)) for x in todo
                      if type(x) in (c.VHostPut, c.ExchangePut)]
    assert kinds_in_order == sorted(kinds_in_order, key=lay.KINDS.index)  # a vhost first


def test_balanced_placement_picks_the_node_with_fewest_queues():
    members = Members("n1", 2)
    for number, name in enumerate(("n1", "n2", "n3"), 1):
        members.joined(info(name, number))
    assert members.place("/", "q", "balanced", {"n1": 3, "n2": 1, "n3": 2}) == "n2"
    assert members.place("/", "q", "client-local", {"n1": 3}) == "n1"
    spread = {members.place("/", f"q{i}", "balanced", {}) for i in range(30)}
    assert spread == {"n1", "n2", "n3"}  # ties are broken by name, not always the same node
    members.left("n2")
    assert members.place("/", "q", "balanced", {"n1": 3, "n3": 2}) == "n3"


def test_shard_indexes_of_other_nodes_follow_this_nodes_shards_densely():
    members = Members("n1", 2)
    members.joined(info("n2", 2, shards=3))
    assert [members.shard_of("n2", s) for s in range(3)] == [2, 3, 4]
    assert members.shard_of("n1", 1) == 1
    assert members.shard_of("n9", 0) == 5  # a node not met yet: the next index
    assert members.locate(5) == ("n9", 0)
    assert not members.is_up(5) and members.is_up(3)


def test_a_reply_to_address_names_its_node_in_a_cluster_and_its_gateway_always():
    from warren.gateway.session import replyto

    key, address = replyto.new_address(3)
    assert (replyto.gateway_of(address), replyto.node_of(address)) == (3, 0)
    key, address = replyto.new_address(2, node=17)
    assert (replyto.gateway_of(address), replyto.node_of(address)) == (2, 17)
    assert replyto.key_of(address) == key
    assert replyto.node_of("amq.rabbitmq.reply-to") == 0


def test_another_gateway_process_takes_the_roots_indexes_as_they_are():
    root = Members("n1", 2)
    root.joined(info("n3", 3, shards=1))
    root.shard_of("n9", 4)  # a node met through a queue before it registered
    root.joined(info("n2", 2, shards=2))
    view = ([(n, i.link, i.shards, i.number) for n, i in root.known.items()],
            list(root.running), list(root.remote))
    worker = Members("n1", 2)
    assert worker.adopt_view(*view) == []
    assert worker.remote == root.remote
    assert [worker.locate(i) for i in range(2, 2 + len(root.remote))] == root.remote
    assert worker.name_of_number(2) == "n2"
    root.left("n3")
    stopped = worker.adopt_view([(n, i.link, i.shards, i.number) for n, i in root.known.items()],
                                list(root.running), list(root.remote))
    assert stopped == ["n3"] and "n3" not in worker.running


def test_another_nodes_write_seen_between_a_change_and_its_transaction_fails_the_compare():
    """The race two nodes declaring one queue at once run: this node made its
    queue, then saw the other's before its own transaction went out. The compare
    is with what this node knew when it changed the key, so etcd refuses it."""
    here, _ = sync_of("n1")
    there, _ = sync_of("n2")
    here.record(queue_put("q", 0, qid=1))
    there.record(queue_put("q", 0, qid=2))
    key, theirs = next(iter(there.take_txn().puts.items()))
    here.observe(key, lay.encode(theirs), 7, lay.decode)
    assert dict(here.take_txn().compares)[key] == 0
