"""What a node takes from etcd once, as it joins: its number and the
inter-node link's secret."""

from __future__ import annotations

import secrets

from . import layout as lay
from .etcd import Compare, Etcd, Op


class ClusterError(Exception):
    """Why this node cannot join its cluster, in one line."""


async def take_number(etcd: Etcd, layout: lay.Layout, name: str) -> int:
    """Node `name`'s number (1..63), kept in etcd for ever: ids of its clients'
    channels carry it over the inter-node link."""
    key = layout.number(name)
    while True:
        kv = await etcd.get(key)
        if kv is not None:
            return int(kv.value)
        counter = await etcd.get(layout.next_number)
        number = int(counter.value) if counter is not None else 1
        if number >= 64:
            raise ClusterError("a cluster has at most 63 nodes")
        result = await etcd.txn(
            [Compare.create_revision(key, "=", 0),
             Compare.mod_revision(layout.next_number, "=",
                                  counter.mod_revision if counter else 0)],
            [Op.put(key, str(number).encode()),
             Op.put(layout.next_number, str(number + 1).encode())])
        if result.succeeded:
            return number


async def shared_secret(etcd: Etcd, layout: lay.Layout) -> bytes:
    """The inter-node link's secret, made by the first node (never logged)."""
    made = secrets.token_hex(32).encode()
    await etcd.txn([Compare.create_revision(layout.secret, "=", 0)],
                   [Op.put(layout.secret, made)])
    kv = await etcd.get(layout.secret)
    return kv.value


def never_reuse_ids(catalogue, number: int) -> None:
    """A wiped data directory counts queue ids afresh: past every id etcd knows of
    node `number`, so a new queue never takes an old one's id (a replicated
    queue's id names its group on every member)."""
    taken = [qid - catalogue.qid_base for qid in catalogue.queues_by_qid if qid >> 52 == number]
    if taken:
        catalogue.meta.raise_next_qid(max(taken) + 1)
