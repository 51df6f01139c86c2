"""The catalogue alone (broker/catalogue.py): no gateway, no shard, no loop. What
it sends to shards and the changes it hands on are recorded and checked."""

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.broker import changes
from warren.gateway.broker.access import AccessControl
from warren.gateway.broker.catalogue import Catalogue
from warren.gateway.broker.exchange import EXCHANGE, QUEUE, Exchange
from warren.gateway.values import TRANSIENT_QIDS, RemoteOwner, placement
from warren.shards import records as r
from warren.storage.metastore import MetaStore, PolicyDef
from warren.storage.queuespec import QueueSpec

SHARDS = 4


class Recorder:
    """A catalogue with what it sends to shards, hands on and closes, recorded."""

    def __init__(self, authority: bool = True):
        self.sent: list[tuple[int, object]] = []
        self.changes: list = []
        self.closed: list[str] = []
        self.catalogue = Catalogue(SHARDS, authority, None, self._to_shard, self.changes.append,
                                   lambda vhost: self.closed.append(vhost.name))
        self.vhost = self.catalogue.add_vhost("/")

    def _to_shard(self, shard: int, record) -> None:
        self.sent.append((shard, record))

    def queue(self, name: str, arguments: dict | None = None, owner=None):
        return self.catalogue.create_queue(
            QueueSpec("/", name, False, owner is not None, False, arguments or {}), owner)

    def exchange(self, name: str, kind: str, **options) -> Exchange:
        exchange = Exchange("/", name, kind, durable=False, **options)
        self.catalogue.add_exchange(exchange)
        return exchange

    def route(self, exchange: Exchange, key: str, headers: dict | None = None) -> list[str]:
        return sorted(m.spec.name for m in self.catalogue.route(
            self.vhost, exchange, key, lambda: headers or {}))


def test_a_new_vhost_has_the_predeclared_exchanges_and_is_handed_on():
    c = Recorder()
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers"} <= set(c.vhost.exchanges)
    assert type(c.changes[0]) is changes.VHostPut


def test_declaring_a_queue_places_it_and_tells_its_shard():
    c = Recorder()
    meta = c.queue("orders", {"x-max-length": 3})
    assert meta.qid == TRANSIENT_QIDS + 1
    assert meta.shard == placement("/", "orders", SHARDS)
    assert c.catalogue.queues_by_qid[meta.qid] is meta is c.vhost.queues["orders"]
    [(shard, record)] = c.sent
    assert shard == meta.shard and type(record) is r.CreateQueue
    assert record.qid == meta.qid and record.arguments == {"x-max-length": 3}
    assert type(c.changes[-1]) is changes.QueuePut
    assert c.catalogue.totals.queues_created == 1


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=20, unique=True))
@settings(max_examples=50, deadline=None)
def test_placement_is_stable_and_spread_over_the_shards(names):
    first, second = Recorder(), Recorder()
    for name in names:
        meta = first.queue(name)
        assert 0 <= meta.shard < SHARDS
        assert second.queue(name).shard == meta.shard == placement("/", name, SHARDS)


def test_the_default_exchange_routes_by_queue_name():
    c = Recorder()
    c.queue("a")
    assert c.route(c.vhost.exchanges[""], "a") == ["a"]
    assert c.route(c.vhost.exchanges[""], "b") == []


def _topic_matches(pattern: list[str], words: list[str]) -> bool:
    """A reference for topic matching: * is one word, # zero or more."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_topic_matches(rest, words[i:]) for i in range(len(words) + 1))
    return bool(words) and head in ("*", words[0]) and _topic_matches(rest, words[1:])


WORDS = st.sampled_from(["a", "b", "c"])
KEYS = st.lists(WORDS, min_size=1, max_size=4).map(".".join)
PATTERNS = st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=4).map(".".join)


@given(st.lists(st.tuples(st.integers(0, 4), KEYS), max_size=12), KEYS)
@settings(max_examples=100, deadline=None)
def test_direct_routes_to_the_queues_bound_with_the_key(bindings, key):
    c = Recorder()
    x = c.exchange("x", "direct")
    for i in range(5):
        c.queue(f"q{i}")
    for i, bound in bindings:
        c.catalogue.bind(x, (QUEUE, f"q{i}"), bound, {})
    assert c.route(x, key) == sorted({f"q{i}" for i, bound in bindings if bound == key})


@given(st.lists(st.tuples(st.integers(0, 4), PATTERNS), max_size=12), KEYS)
@settings(max_examples=100, deadline=None)
def test_topic_routes_as_the_patterns_say(bindings, key):
    c = Recorder()
    x = c.exchange("x", "topic")
    for i in range(5):
        c.queue(f"q{i}")
    for i, pattern in bindings:
        c.catalogue.bind(x, (QUEUE, f"q{i}"), pattern, {})
    expected = {f"q{i}" for i, pattern in bindings
                if _topic_matches(pattern.split("."), key.split("."))}
    assert c.route(x, key) == sorted(expected)


@given(st.lists(st.integers(0, 4), max_size=8), KEYS)
def test_fanout_routes_to_every_bound_queue(bound, key):
    c = Recorder()
    x = c.exchange("x", "fanout")
    for i in range(5):
        c.queue(f"q{i}")
    for i in bound:
        c.catalogue.bind(x, (QUEUE, f"q{i}"), "ignored", {})
    assert c.route(x, key) == sorted({f"q{i}" for i in bound})


def test_headers_routes_by_all_or_any():
    c = Recorder()
    x = c.exchange("x", "headers")
    c.queue("all")
    c.queue("any")
    c.catalogue.bind(x, (QUEUE, "all"), "", {"x-match": "all", "a": 1, "b": 2})
    c.catalogue.bind(x, (QUEUE, "any"), "", {"x-match": "any", "a": 1, "b": 2})
    assert c.route(x, "", {"a": 1, "b": 2}) == ["all", "any"]
    assert c.route(x, "", {"a": 1}) == ["any"]
    assert c.route(x, "", {"c": 3}) == []


def test_exchange_bindings_and_alternates():
    c = Recorder()
    front = c.exchange("front", "topic", arguments={"alternate-exchange": "ae"})
    back = c.exchange("back", "direct")
    ae = c.exchange("ae", "fanout")
    c.queue("orders")
    c.queue("lost")
    c.catalogue.bind(front, (EXCHANGE, "back"), "orders.#", {})
    c.catalogue.bind(back, (QUEUE, "orders"), "orders.new", {})
    c.catalogue.bind(ae, (QUEUE, "lost"), "", {})
    c.catalogue.bind(back, (EXCHANGE, "front"), "orders.new", {})  # a cycle: visited once
    assert c.route(front, "orders.new") == ["orders"]
    assert c.route(front, "stock.new") == ["lost"]
    assert c.route(front, "orders.old") == []


def _policy(name: str, pattern: str, priority: int, definition: dict) -> PolicyDef:
    return PolicyDef("/", name, pattern, "all", priority, definition)


def test_policies_apply_by_priority_and_tell_the_shards():
    c = Recorder()
    meta = c.queue("jobs.a", {"x-max-length": 9})
    x = c.exchange("jobs.x", "fanout")
    c.sent.clear()
    c.catalogue.put_policy(_policy("low", "^jobs", 1, {"max-length": 5,
                                                       "alternate-exchange": "ae1"}))
    c.catalogue.put_policy(_policy("high", "^jobs\\.", 2, {"message-ttl": 100,
                                                          "alternate-exchange": "ae2"}))
    assert meta.policy.name == "high" and x.policy.name == "high"
    assert meta.effective == {"x-max-length": 9, "x-message-ttl": 100}
    assert x.alternate == "ae2"
    assert c.sent[-1] == (meta.shard, r.ConfigureQueue(meta.qid, meta.effective))
    assert c.catalogue.delete_policy("/", "high")
    assert meta.policy.name == "low" and x.alternate == "ae1"
    assert meta.effective == {"x-max-length": 5}  # of a declared and a policy's, the lower
    assert not c.catalogue.delete_policy("/", "high")


def test_a_later_queue_gets_the_policy_and_amq_names_none():
    c = Recorder()
    c.catalogue.put_policy(_policy("all", ".*", 0, {"max-length": 1}))
    assert c.queue("q").effective == {"x-max-length": 1}
    assert c.queue("amq.gen-x").effective == {}


def test_deleting_a_queue_unbinds_it_and_auto_deletes_its_exchange():
    c = Recorder()
    x = c.exchange("ad", "direct", auto_delete=True)
    meta = c.queue("q")
    c.catalogue.bind(x, (QUEUE, "q"), "k", {})
    c.catalogue.forget_queue(meta)
    assert "ad" not in c.vhost.exchanges and not c.vhost.inbound
    assert meta.qid not in c.catalogue.queues_by_qid
    assert [type(ch) for ch in c.changes[-3:]] == [changes.BindingDeleted,
                                                  changes.ExchangeDeleted,
                                                  changes.QueueForgotten]


def test_deleting_an_exchange_unbinds_both_ways():
    c = Recorder()
    up, mid, down = (c.exchange(n, "fanout") for n in ("up", "mid", "down"))
    c.queue("q")
    c.catalogue.bind(up, (EXCHANGE, "mid"), "", {})
    c.catalogue.bind(mid, (EXCHANGE, "down"), "", {})
    c.catalogue.bind(mid, (QUEUE, "q"), "", {})
    c.catalogue.delete_exchange(mid)
    assert not up.bindings and "mid" not in c.vhost.exchanges
    assert not c.vhost.inbound


def test_deleting_a_vhost_deletes_its_queues_on_their_shards():
    c = Recorder()
    metas = [c.queue(f"q{i}") for i in range(3)]
    c.catalogue.put_policy(_policy("p", ".*", 0, {"max-length": 1}))
    c.sent.clear()
    assert c.catalogue.delete_vhost("/")
    assert c.closed == ["/"]
    assert sorted(c.sent, key=lambda s: s[1].qid) == [
        (m.shard, r.DeleteQueue(0, m.qid, False, False)) for m in metas]
    assert not c.catalogue.queues_by_qid and "/" not in c.catalogue.policies
    assert type(c.changes[-1]) is changes.VHostDeleted
    assert not c.catalogue.delete_vhost("/")


def test_an_exclusive_queue_belongs_to_its_owner_till_deleted():
    c = Recorder()
    owner = RemoteOwner(7)
    meta = c.queue("mine", owner=owner)
    assert owner.exclusive_queues == {meta}
    c.catalogue.delete_queue(meta)
    assert not owner.exclusive_queues
    assert c.sent[-1] == (meta.shard, r.DeleteQueue(0, meta.qid, False, False))


def test_another_gateway_replaying_the_changes_routes_the_same():
    authority = Recorder()
    x = authority.exchange("x", "topic")
    authority.queue("q1")
    authority.queue("q2", owner=RemoteOwner(5))
    authority.catalogue.bind(x, (QUEUE, "q1"), "a.*", {})
    authority.catalogue.bind(x, (QUEUE, "q2"), "#", {})
    replica = Catalogue(SHARDS, authority=False)
    access = AccessControl(None, [], lambda change: None)
    owners: dict = {}
    for change in changes.snapshot(authority.catalogue, AccessControl(None, [], lambda change: None)):
        changes.apply(replica, access, lambda id: owners.setdefault(id, RemoteOwner(id)), change)
    vhost = replica.vhosts["/"]
    routed = sorted(m.spec.name for m in replica.route(vhost, vhost.exchanges["x"], "a.b", dict))
    assert routed == ["q1", "q2"]
    assert {m.qid: m.shard for m in replica.queues_by_qid.values()} == \
        {m.qid: m.shard for m in authority.catalogue.queues_by_qid.values()}
    assert vhost.queues["q2"].owner is owners[5]
    assert replica.totals.queues_created == 0  # counted where the queue was made


def test_what_is_stored_loads_back_the_same(tmp_path):
    c = Recorder()
    meta_store = c.catalogue.meta = MetaStore(str(tmp_path / "meta"))
    c.catalogue.add_vhost("/")  # stored now
    x = Exchange("/", "x", "direct")
    c.catalogue.add_exchange(x)
    meta = c.catalogue.create_queue(QueueSpec("/", "kept", True, False, False, {}))
    c.queue("transient")  # not stored
    c.catalogue.bind(x, (QUEUE, "kept"), "k", {})
    c.catalogue.bind(x, (QUEUE, "transient"), "k", {})  # one end dies with the broker
    assert meta.qid < TRANSIENT_QIDS
    defs = meta_store.load()
    meta_store.close()
    loaded = Catalogue(SHARDS)
    loaded.load_vhosts(defs)
    loaded.load(defs)
    vhost = loaded.vhosts["/"]
    assert set(vhost.queues) == {"kept"}
    assert (vhost.queues["kept"].qid, vhost.queues["kept"].shard) == (meta.qid, meta.shard)
    routed = loaded.route(vhost, vhost.exchanges["x"], "k", dict)
    assert [m.spec.name for m in routed] == ["kept"]


def test_the_next_queue_id_is_raised_never_lowered(tmp_path):
    meta = MetaStore(str(tmp_path / "meta"))
    assert meta.allocate_qid() == 1
    meta.raise_next_qid(10)  # ids up to 9 are taken elsewhere (etcd, the shard stores)
    meta.raise_next_qid(5)
    assert meta.allocate_qid() == 10
    assert meta.load().next_qid == 11
