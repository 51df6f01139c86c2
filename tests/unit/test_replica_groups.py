"""Replicated quorum queues' pure parts in the cluster: a new group's members
(members.group_members) and its record in etcd (layout, sync)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.broker import changes as c
from warren.gateway.cluster import layout as lay
from warren.gateway.cluster.members import Members, group_members
from warren.gateway.cluster.sync import CatalogueSync
from warren.storage.metastore import QueueDef
from warren.storage.queuespec import QueueSpec

LAYOUT = lay.Layout("/t")
NAMES = st.sampled_from([f"n{i}" for i in range(1, 8)])


@given(st.sets(NAMES, min_size=1), st.data(), st.integers(1, 9),
       st.dictionaries(NAMES, st.integers(0, 5)))
def test_members_first_then_the_least_loaded_running_nodes(running, data, size, replicas):
    known = running | data.draw(st.sets(NAMES))
    first = data.draw(st.sampled_from(sorted(running)))
    chosen = group_members(first, size, running, known, replicas)
    assert chosen[0] == first
    assert len(chosen) == len(set(chosen)) == min(size, len(known), len(running))
    assert set(chosen) <= set(running)
    rest = [(replicas.get(n, 0), n) for n in chosen[1:]]
    assert rest == sorted(rest)
    left_out = [(replicas.get(n, 0), n) for n in running if n not in chosen]
    assert not rest or not left_out or max(rest) < min(left_out)


def sync_of(groups: list) -> CatalogueSync:
    members = Members("n1", 2)
    for number, name in enumerate(("n1", "n2", "n3"), 1):
        members.joined(lay.NodeInfo(name, number, f"127.0.0.1:{2000 + number}", "", "", 2,
                                    0.0))
    return CatalogueSync(LAYOUT, "n1", members.locate, members.shard_of,
                         lambda record, present: groups.append((record.members, present)))


def put(qid: int, shard: int) -> c.QueuePut:
    spec = QueueSpec("/", f"q{qid}", True, False, False, {"x-queue-type": "quorum"})
    return c.QueuePut(QueueDef(spec, qid, shard), 0)


def test_a_groups_record_keeps_its_members_and_home_wherever_it_leads():
    told: list = []
    sync = sync_of(told)
    sync.placed[("/", "q7")] = ["n2", "n1", "n3"]
    sync.record(put(7, 3))  # n2's second shard
    txn = sync.take_txn()
    (record,) = txn.puts.values()
    assert (record.node, record.definition.shard, record.members) == ("n2", 1, ["n2", "n1", "n3"])
    sync.committed(txn, 10)
    assert told == [(["n2", "n1", "n3"], True)]
    # routed to its leader's shard (n1's 0) since, its record is still the one in etcd
    local = sync.local_records([put(7, 0)])
    assert local == {LAYOUT.key_of(record): record}
    sync.observe(LAYOUT.key_of(record), None, 11, lay.decode)
    assert told[-1] == (["n2", "n1", "n3"], False) and not sync.groups


def test_a_queue_record_written_before_members_decodes_without_any():
    spec = QueueSpec("/", "q", True, False, False, {})
    record = lay.QueueRecord(QueueDef(spec, 7, 0), "n1")
    fields = msgspec.msgpack.decode(lay.encode(record))
    assert fields[-1] == []  # the tag first, the new field last
    assert lay.decode(msgspec.msgpack.encode(fields[:-1])) == record
