"""Value types every part of the gateway may import: a queue as the gateway holds
it (QueueMeta), its placement on a shard, a publish's targets grouped by shard,
server-generated names, and the owner that stands for another gateway's
connection."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import xxhash

from warren.storage.queuespec import QueueSpec

if TYPE_CHECKING:
    from warren.storage.metastore import PolicyDef

TRANSIENT_QIDS = 1 << 62  # transient queue ids start here; durable ones come from the metastore


class QueueMeta:
    """A queue as the gateway holds it: its spec, and where it lives and what
    applies to it now."""

    __slots__ = ("qid", "shard", "spec", "owner", "policy", "effective")

    def __init__(self, qid: int, shard: int, spec: QueueSpec, owner=None):
        self.qid = qid
        self.shard = shard
        self.spec = spec
        self.owner = owner  # the owning connection of an exclusive queue
        self.policy: PolicyDef | None = None  # the policy that applies to it
        self.effective = spec.arguments  # declared arguments combined with the policy's


def placement(vhost: str, name: str, shards: int) -> int:
    """A queue's shard, chosen once at declaration (docs/architecture.md, placement)."""
    return xxhash.xxh64_intdigest(f"{vhost}\0{name}".encode()) % shards


def by_shard(targets: list[QueueMeta]) -> tuple[tuple[int, list[int]], ...]:
    """Queues grouped by their shard, in the order first met: (shard, qids), one
    publish record each."""
    if len(targets) == 1:  # the common case: nothing to group
        meta = targets[0]
        return ((meta.shard, [meta.qid]),)
    grouped: dict[int, list[int]] = {}
    for meta in targets:
        grouped.setdefault(meta.shard, []).append(meta.qid)
    return tuple(grouped.items())


def server_generated_name(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(16)


class RemoteOwner:
    """The owner of an exclusive queue, a connection of another gateway process:
    no connection here is it, so every one of them gets 405 RESOURCE_LOCKED."""

    __slots__ = ("id", "exclusive_queues")

    def __init__(self, id: int):
        self.id = id
        self.exclusive_queues: set = set()
