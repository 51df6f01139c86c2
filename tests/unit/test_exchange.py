"""Exchanges as pure data: bindings, headers matching, routing through exchange
bindings and alternates, and the one-record-per-shard fan-out."""

from __future__ import annotations

import pytest

from warren.gateway.broker.catalogue import VHost
from warren.gateway.broker.exchange import EXCHANGE, QUEUE, Exchange, headers_match
from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.values import QueueMeta
from warren.shards import records as r
from warren.storage.queuespec import QueueSpec

HEADER_CASES = [
    ({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": 2}, {"a": 1}, False),
    ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
    ({"x-match": "any", "a": 1}, {"a": 2}, False),
    ({"a": 1}, {"a": 1}, True),  # all is the default
    ({"x-match": "all"}, {}, True),
    ({"x-match": "any"}, {"a": 1}, False),
    ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # void: presence only
    ({"x-match": "all", "a": None}, {}, False),
    ({"x-match": "all", "x-k": 1}, {}, True),  # x- arguments ignored by all/any
    ({"x-match": "all-with-x", "x-k": 1}, {}, False),
    ({"x-match": "all-with-x", "x-k": 1}, {"x-k": 1}, True),
    ({"x-match": "any", "k": 1}, {"x-k": 1}, False),
    ({"x-match": "any-with-x", "x-k": 1, "k": 2}, {"x-k": 1}, True),
    ({"x-match": "all", "flag": True}, {"flag": 1}, False),  # booleans are not numbers
    ({"x-match": "all", "s": "v"}, {"s": "v"}, True),
]


@pytest.mark.parametrize("binding,headers,expected", HEADER_CASES)
def test_headers_match(binding, headers, expected):
    assert headers_match(binding, headers) is expected


def test_bindings_differ_by_arguments_and_unbind_exactly():
    x = Exchange("/", "h", "headers")
    q = (QUEUE, "q")
    assert x.bind(q, "", {"k": 1})
    assert x.bind(q, "", {"k": 2})
    assert not x.bind(q, "", {"k": 1})  # the same binding again
    assert x.route("", lambda: {"k": 2}) == {q}
    assert x.unbind(q, "", {"k": 2})
    assert not x.unbind(q, "", {"k": 2})
    assert x.route("", lambda: {"k": 2}) == set()
    assert x.route("", lambda: {"k": 1}) == {q}


def test_topic_binding_stays_while_another_with_other_arguments_remains():
    x = Exchange("/", "t", "topic")
    q = (QUEUE, "q")
    x.bind(q, "a.*", {})
    x.bind(q, "a.*", {"note": "second"})
    x.unbind(q, "a.*", {})
    assert x.route("a.b", dict) == {q}
    x.unbind(q, "a.*", {"note": "second"})
    assert x.route("a.b", dict) == set()


def test_headers_are_decoded_only_for_headers_exchanges():
    def explode() -> dict:
        raise AssertionError("headers decoded for a direct exchange")

    x = Exchange("/", "d", "direct")
    x.bind((QUEUE, "q"), "k", {})
    assert x.route("k", explode) == {(QUEUE, "q")}


class RecordingLink:
    """Stands in for a shard link: remembers the records sent to it."""

    def __init__(self, index: int):
        self.index = index
        self.alive = True
        self.records = []

    def send(self, record, feeder=None) -> None:
        self.records.append(record)


def make_gateway(shards: int) -> tuple[Gateway, VHost]:
    gateway = Gateway(Config(data_dir="/nonexistent", shards=shards))
    gateway.catalogue.vhosts["/"] = VHost("/")
    gateway.shards.links = [RecordingLink(i) for i in range(shards)]
    return gateway, gateway.catalogue.vhosts["/"]


def add_queue(gateway: Gateway, vhost: VHost, name: str, shard: int) -> QueueMeta:
    meta = QueueMeta(len(gateway.catalogue.queues_by_qid) + 1, shard,
                     QueueSpec("/", name, False, False, False, {}))
    vhost.queues[name] = gateway.catalogue.queues_by_qid[meta.qid] = meta
    return meta


def test_fanout_to_a_hundred_queues_is_one_record_per_shard():
    gateway, vhost = make_gateway(4)
    fan = Exchange("/", "fan", "fanout", durable=False)
    vhost.exchanges["fan"] = fan
    for i in range(100):
        meta = add_queue(gateway, vhost, f"q{i}", i % 4)
        gateway.bind(fan, (QUEUE, meta.spec.name), "", {})
    targets = gateway.route(vhost, fan, "", dict)
    assert len(targets) == 100
    gateway.publish(targets, "fan", "", b"\x00\x00", b"body", False, -1, 0)
    for link in gateway.shards:
        [record] = link.records
        assert isinstance(record, r.Publish)
        assert len(record.qids) == 25


def test_routing_through_exchange_bindings_and_alternates():
    gateway, vhost = make_gateway(1)
    for name, kind, args in [("front", "topic", {"alternate-exchange": "ae"}),
                             ("back", "direct", {}), ("ae", "fanout", {})]:
        vhost.exchanges[name] = Exchange("/", name, kind, durable=False, arguments=args)
    add_queue(gateway, vhost, "orders", 0)
    add_queue(gateway, vhost, "lost", 0)
    gateway.bind(vhost.exchanges["front"], (EXCHANGE, "back"), "orders.#", {})
    gateway.bind(vhost.exchanges["back"], (QUEUE, "orders"), "orders.new", {})
    gateway.bind(vhost.exchanges["ae"], (QUEUE, "lost"), "", {})
    route = lambda key: sorted(m.spec.name for m in gateway.route(  # noqa: E731
        vhost, vhost.exchanges["front"], key, dict))
    assert route("orders.new") == ["orders"]
    assert route("stock.new") == ["lost"]  # front routes nowhere: its alternate takes it
    assert route("orders.old") == []  # front routed it (to back), so no alternate


def test_deleting_a_queue_removes_its_bindings_and_auto_deletes_the_exchange():
    gateway, vhost = make_gateway(1)
    x = Exchange("/", "ad", "direct", durable=False, auto_delete=True)
    vhost.exchanges["ad"] = x
    meta = add_queue(gateway, vhost, "q", 0)
    gateway.bind(x, (QUEUE, "q"), "k", {})
    gateway.forget_queue(meta)
    assert "ad" not in vhost.exchanges
    assert not vhost.inbound
