"""The nodes of the cluster as one node sees them (pure): which run, where each
shard of another node is reached from here, and on which node a new queue goes.

Shard indexes: a queue's `shard` in this node's catalogue indexes the links of
each of its gateway processes. This node's own shards are 0..N-1, as on a node
alone; a shard of another node gets the next free index the first time this
node meets it (a queue placed there, or a node registering), so the links stay
a dense list that the hot path walks with no gaps.
"""

from __future__ import annotations

import random

import xxhash

from .layout import NodeInfo


class Members:
    def __init__(self, me: str, local_shards: int):
        self.me = me
        self.local_shards = local_shards
        self.running: dict[str, NodeInfo] = {}  # name -> info, while its lease holds
        self.known: dict[str, NodeInfo] = {}  # every node met, running or not
        self._index: dict[tuple[str, int], int] = {}  # (other node, shard) -> index here
        self.remote: list[tuple[str, int]] = []  # index - local_shards -> (node, shard)

    # -- shards -------------------------------------------------------------------

    def shard_of(self, node: str, shard: int) -> int:
        """The index here of shard `shard` of `node` (a new one the first time)."""
        if node == self.me:
            return shard
        index = self._index.get((node, shard))
        if index is None:
            index = self._index[(node, shard)] = self.local_shards + len(self.remote)
            self.remote.append((node, shard))
        return index

    def locate(self, index: int) -> tuple[str, int]:
        """(node, shard there) of an index here."""
        if index < self.local_shards:
            return self.me, index
        return self.remote[index - self.local_shards]

    def is_up(self, index: int) -> bool:
        return index < self.local_shards or self.remote[index - self.local_shards][0] in \
            self.running

    # -- membership ---------------------------------------------------------------

    def joined(self, info: NodeInfo) -> bool:
        """A node's registration seen; True if it was not running before."""
        new = info.name not in self.running
        self.running[info.name] = self.known[info.name] = info
        if info.name != self.me:
            for shard in range(info.shards):
                self.shard_of(info.name, shard)
        return new

    def left(self, name: str) -> bool:
        """A node's registration gone (its lease lapsed, or it stopped); True if it ran."""
        return self.running.pop(name, None) is not None

    def number_of(self, name: str) -> int:
        info = self.known.get(name)
        return info.number if info is not None else 0

    def name_of_number(self, number: int) -> str | None:
        return next((n for n, info in self.known.items() if info.number == number), None)

    def adopt_view(self, nodes: list[tuple[str, str, int, int]], running: list[str],
                   remote: list[tuple[str, int]]) -> list[str]:
        """Another gateway process of this node: the root's view, as is (the
        indexes must be the root's). The nodes that stopped running, returned."""
        for name, link, shards, number in nodes:
            known = self.known.get(name)
            if known is None or (known.link, known.shards, known.number) != (link, shards, number):
                self.known[name] = NodeInfo(name, number, link, "", "", shards, 0.0)
        stopped = [name for name in self.running if name not in running]
        self.running = {name: self.known[name] for name in running if name in self.known}
        for node, shard in remote[len(self.remote):]:
            self.shard_of(node, shard)
        return stopped

    # -- placement ----------------------------------------------------------------

    def place(self, vhost: str, name: str, locator: str, homes: dict[str, int]) -> str:
        """The node a new queue goes to. `client-local`: this node (its declaring
        client's); `random`: any running node; `balanced` (or RabbitMQ's older
        `min-masters`): the running node with the fewest queues (`homes`: node ->
        queues it has), ties broken by the queue's name so that queues declared at
        once through several nodes spread as well."""
        if locator == "client-local" or len(self.running) <= 1:
            return self.me
        if locator == "random":
            return random.choice(sorted(self.running))
        fewest = min(homes.get(n, 0) for n in self.running)
        tied = sorted(n for n in self.running if homes.get(n, 0) == fewest)
        return tied[xxhash.xxh64_intdigest(f"{vhost}\0{name}".encode()) % len(tied)]

    def shards_on(self, node: str) -> int:
        info = self.known.get(node)
        return info.shards if info is not None else self.local_shards


def group_members(first: str, size: int, running, known, replicas: dict[str, int]) -> list[str]:
    """A new replicated queue's members: `first` (placed as any queue's home),
    then the running nodes with the fewest replicas (`replicas`: node -> the
    groups it is a member of), ties by name; `size` capped at the nodes known."""
    others = sorted((n for n in running if n != first), key=lambda n: (replicas.get(n, 0), n))
    return [first, *others][:max(1, min(size, len(known)))]

