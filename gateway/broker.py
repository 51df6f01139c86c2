"""The gateway's view of the broker: vhosts, exchanges, bindings, queue placement,
the shard links, and the routing of shard events back to channels.

Queues live in shards; the gateway keeps their metadata (id, shard, flags) so it
can route a publish to the right shards without asking anyone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from typing import TYPE_CHECKING

import xxhash

from shards import records as r

from .shardlink import ShardLink

if TYPE_CHECKING:
    from .channel import Channel

log = logging.getLogger("warren")

EXCHANGE_TYPES = ("direct", "fanout")


class QueueMeta:
    __slots__ = ("qid", "vhost", "name", "shard", "durable", "exclusive", "owner",
                 "auto_delete", "arguments")

    def __init__(self, qid: int, vhost: str, name: str, shard: int, durable: bool,
                 owner, auto_delete: bool, arguments: dict):
        self.qid = qid
        self.vhost = vhost
        self.name = name
        self.shard = shard
        self.durable = durable
        self.exclusive = owner is not None
        self.owner = owner  # the owning connection of an exclusive queue
        self.auto_delete = auto_delete
        self.arguments = arguments


class Exchange:
    __slots__ = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments",
                 "bindings")

    def __init__(self, vhost: str, name: str, type: str, durable: bool = True,
                 auto_delete: bool = False, internal: bool = False, arguments: dict | None = None):
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[str, set[str]] = {}  # routing key -> queue names

    def bind(self, routing_key: str, queue: str) -> None:
        self.bindings.setdefault(routing_key, set()).add(queue)

    def unbind(self, routing_key: str, queue: str) -> None:
        queues = self.bindings.get(routing_key)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self.bindings[routing_key]

    def unbind_queue(self, queue: str) -> None:
        for key in [k for k, qs in self.bindings.items() if queue in qs]:
            self.unbind(key, queue)

    def route(self, routing_key: str) -> set[str]:
        if self.type == "fanout":
            return set().union(*self.bindings.values()) if self.bindings else set()
        return self.bindings.get(routing_key, set())


class VHost:
    def __init__(self, name: str):
        self.name = name
        self.queues: dict[str, QueueMeta] = {}
        self.exchanges: dict[str, Exchange] = {"": Exchange(name, "", "direct")}
        for kind in EXCHANGE_TYPES:
            self.exchanges[f"amq.{kind}"] = Exchange(name, f"amq.{kind}", kind)


def placement(vhost: str, name: str, shards: int) -> int:
    """A queue's shard, chosen once at declaration (DESIGN.md, placement)."""
    return xxhash.xxh64_intdigest(f"{vhost}\0{name}".encode()) % shards


def server_generated_name(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(16)


class Broker:
    def __init__(self, data_dir: str, shard_count: int, users: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.shard_count = shard_count
        self.users = users if users is not None else {"guest": "guest"}
        self.vhosts: dict[str, VHost] = {"/": VHost("/")}
        self.links: list[ShardLink] = []
        self.connections: set = set()
        self.holders: dict[int, "Channel"] = {}  # consumer id -> its channel
        self._next_id = 0
        self._next_qid = 0
        self.stopping = False
        self._restarts: dict[int, float] = {}  # shard -> delay before its next restart

    async def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        for index in range(self.shard_count):
            self.links.append(self._start_shard(index))

    def _start_shard(self, index: int) -> ShardLink:
        link = ShardLink(index, self.data_dir, self._on_events, self._on_shard_exit)
        link.start()
        return link

    async def stop(self) -> None:
        self.stopping = True
        for link in self.links:
            await link.stop()

    def new_id(self) -> int:
        """A broker-wide id for a channel or consumer (shard 'holders')."""
        self._next_id += 1
        return self._next_id

    # -- queues ----------------------------------------------------------------

    def create_queue(self, vhost: VHost, name: str, durable: bool, owner, auto_delete: bool,
                     arguments: dict) -> QueueMeta:
        self._next_qid += 1
        meta = QueueMeta(self._next_qid, vhost.name, name,
                         placement(vhost.name, name, self.shard_count), durable, owner,
                         auto_delete, arguments)
        vhost.queues[name] = meta
        self.links[meta.shard].send(r.CreateQueue(0, meta.qid, vhost.name, name, durable,
                                                  owner is not None, auto_delete, arguments))
        return meta

    def forget_queue(self, meta: QueueMeta) -> None:
        vhost = self.vhosts.get(meta.vhost)
        if vhost is None or vhost.queues.get(meta.name) is not meta:
            return
        del vhost.queues[meta.name]
        for exchange in vhost.exchanges.values():
            exchange.unbind_queue(meta.name)

    def delete_exclusive_queues(self, owner) -> None:
        for vhost in self.vhosts.values():
            for meta in [m for m in vhost.queues.values() if m.owner is owner]:
                self.forget_queue(meta)
                self.links[meta.shard].send(r.DeleteQueue(0, meta.qid, False, False))

    # -- routing ---------------------------------------------------------------

    def route(self, vhost: VHost, exchange: Exchange, routing_key: str) -> list[QueueMeta]:
        if exchange.name == "":
            meta = vhost.queues.get(routing_key)
            return [meta] if meta is not None else []
        return [vhost.queues[name] for name in exchange.route(routing_key)
                if name in vhost.queues]

    # -- events from shards ----------------------------------------------------

    def _on_events(self, link: ShardLink, events: list) -> None:
        for event in events:
            kind = type(event)
            if kind is r.Deliver:
                channel = self.holders.get(event.holder)
                if channel is not None:
                    channel.deliver(link, event)
            elif kind is r.Confirmed:
                for channel_id, seq in zip(event.channels, event.seqs):
                    channel = self.holders.get(channel_id)
                    if channel is not None:
                        channel.confirmed(seq, link.index)
            elif kind is r.ConsumerCancelled:
                channel = self.holders.get(event.holder)
                if channel is not None:
                    channel.consumer_cancelled_by_broker(event.holder)
            elif kind is r.QueueDeleted:
                self._queue_deleted_by_shard(link.index, event.qid)

    def _queue_deleted_by_shard(self, shard: int, qid: int) -> None:
        for vhost in self.vhosts.values():
            for meta in vhost.queues.values():
                if meta.qid == qid and meta.shard == shard:
                    self.forget_queue(meta)
                    return

    def _on_shard_exit(self, link: ShardLink, returncode: int) -> None:
        if self.stopping:
            return
        log.error("shard %d exited with code %s; restarting it", link.index, returncode)
        # Its transient queues died with it; durable ones come back from its store.
        for vhost in self.vhosts.values():
            for meta in [m for m in vhost.queues.values()
                         if m.shard == link.index and not m.durable]:
                self.forget_queue(meta)
        # Its consumers are cancelled and its unconfirmed publishes nacked.
        for channel in set(self.holders.values()):
            channel.shard_lost(link)
        # A shard that keeps dying is restarted less and less often.
        delay = self._restarts.get(link.index, 0.0)
        self._restarts[link.index] = min(max(delay * 2, 0.1), 5.0)
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._restart_shard, link.index)
        loop.call_later(30.0, self._restarts.pop, link.index, None)

    def _restart_shard(self, index: int) -> None:
        if not self.stopping:
            self.links[index] = self._start_shard(index)
