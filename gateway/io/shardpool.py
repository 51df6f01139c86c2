"""The shard processes, seen from the gateway: their links, supervision (a shard
that dies is restarted, less and less often while it keeps dying) and the rings'
traffic of each loop turn."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from warren.shards import build

from ..config import Config
from .shardlink import ShardLink as PureShardLink

ShardLink = build.twin(PureShardLink, "warren.gateway.io._shardlink", "ShardLink")

log = logging.getLogger("warren")

SHARD_STABLE = 10.0  # seconds a restarted shard must stay up to count as recovered


class ShardPool:
    def __init__(self, config: Config, on_events: Callable, on_started: Callable,
                 on_lost: Callable, gateways: int = 1):
        self.config = config
        self.gateways = gateways  # gateway processes: each shard gets a pair of rings per one
        self.data_dir = os.path.abspath(config.data_dir)
        self.count = config.shard_count()
        self.links: list[ShardLink] = []
        # shard -> {"restarts", "exit_code"} while it keeps dying: health checks report it
        self.failing: dict[int, dict] = {}
        self.stopping = False
        self._on_events = on_events  # (link, events) -> None
        self._on_started = on_started  # (link) -> None: declare its durable queues again
        self._on_lost = on_lost  # (link) -> None: forget what died with it

    def __getitem__(self, index: int) -> ShardLink:
        return self.links[index]

    def __iter__(self):
        return iter(self.links)

    def local(self) -> list:
        """This node's shards' links (in a cluster, other nodes' follow them)."""
        return self.links[:self.count]

    def start(self) -> None:
        for index in range(self.count):
            self.links.append(self._start(index))

    def pids(self) -> list[int]:
        """The shard processes running now (the root's; another gateway starts none)."""
        return [link.process.pid for link in self.links
                if link.alive and link.process is not None]

    def attach(self, rings: list) -> None:
        """Another gateway's shards (not the root's): links over the rings the root
        made for this gateway, `rings[shard]`; a shard without (None) is down until
        its rings come (restarted)."""
        self.count = len(rings)
        for index, pair in enumerate(rings):
            self.links.append(self._attached(index, pair))

    def _attached(self, index: int, rings, handed: bool = False) -> ShardLink:
        link = ShardLink(index, self.data_dir, [], 0, 0, 0, self._on_events, self._exited)
        if rings is not None:
            link.attach(rings, handed)
        return link

    def lost(self, index: int) -> None:
        """Another gateway: the root says shard `index` died."""
        link = self.links[index]
        if link.alive:
            link.detach()
            self._on_lost(link)

    def restarted(self, index: int, rings) -> None:
        """Another gateway: shard `index` runs again, on these new rings."""
        self.lost(index)
        self.links[index] = self._attached(index, rings, handed=True)

    async def stop(self) -> None:
        self.stopping = True
        # All at once: each shard commits what it holds, then exits.
        await asyncio.gather(*(link.stop() for link in self.links))

    def send(self) -> None:
        """Hand the records gathered so far to the shards now, not at the turn's end."""
        for link in self.links:
            link.flush()

    def _stores_of(self, index: int) -> list[int]:
        """Store directories shard `index` opens: its own, and any left by a larger
        shard count before (shard-K with K >= N goes to shard K mod N)."""
        adopted = []
        for entry in os.listdir(self.data_dir):
            if entry.startswith("shard-") and entry[6:].isdigit():
                k = int(entry[6:])
                if k >= self.count and k % self.count == index:
                    adopted.append(k)
        return [index, *sorted(adopted)]

    def _start(self, index: int) -> ShardLink:
        config = self.config
        link = ShardLink(index, self.data_dir, self._stores_of(index),
                         config.memory_limit_bytes() // self.count, config.stats_interval,
                         config.store_map_size, self._on_events, self._exited,
                         os.path.abspath(config.logs_dir()), config.log_settings(),
                         self.gateways)
        link.start()
        asyncio.get_running_loop().call_later(SHARD_STABLE, self._stable, index, link)
        self._on_started(link)
        return link

    def _exited(self, link: ShardLink, returncode: int) -> None:
        if self.stopping:
            return
        failure = self.failing.setdefault(link.index, {"restarts": 0})
        failure["restarts"] += 1
        failure["exit_code"] = returncode
        delay = 0.0 if failure["restarts"] == 1 else min(0.1 * 2 ** failure["restarts"], 60.0)
        log.error("shard %d exited with code %s (failure %d in a row); restarting it in "
                  "%.1f s", link.index, returncode, failure["restarts"], delay)
        self._on_lost(link)
        asyncio.get_running_loop().call_later(delay, self._restart, link.index)

    def _restart(self, index: int) -> None:
        if not self.stopping:
            self.links[index] = self._start(index)

    def _stable(self, index: int, link: ShardLink) -> None:
        if self.links[index] is link and link.alive and self.failing.pop(index, None):
            log.warning("shard %d is up again", index)
