"""The gateway process: the catalogue (broker/catalogue.py), the registry of
connections and holders (session/registry.py) and the dispatcher of shard events
(io/dispatch.py) composed with the shard processes (shardpool.py), the output
written at the end of a turn, alarms (alarms.py) and the loading of what is
stored. The Gateway is the session's port to the broker (session/ports.Broker).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from warren.shards import records as r
from warren.storage import recovery
from warren.storage.metastore import MetaStore
from warren.storage.queuespec import QueueSpec

from ..broker import rules
from ..broker.access import AccessControl
from ..broker.catalogue import Catalogue
from ..broker.exchange import Exchange
from ..broker.peermessages import Reply, ReplyOutcome
from ..config import Config
from ..session import replyto
from ..session.registry import Registry
from ..snapshots import Totals
from ..values import QueueMeta, by_shard
from .alarms import Alarms
from .dispatch import Dispatcher
from .shardlink import ShardLink
from .shardpool import ShardPool

log = logging.getLogger("warren")


class Gateway:
    def __init__(self, config: Config, index: int = 0):
        self.config = config
        # Gateway 0 is the metadata authority: it alone changes the catalogue, writes
        # DATA/meta/ and tells the shards about queues (docs/architecture.md).
        self.index = index
        self.authority = index == 0
        # (typed Any: their classes live above this floor, in node/)
        self.followers: Any = None  # gateway 0 with others: node/gateways.Gateways
        self.leader: Any = None  # any other gateway: its link to gateway 0 (node/worker.py)
        self.cluster: Any = None  # gateway 0 of a node in a cluster: cluster/node.py
        self.down_shards: set[int] = set()  # shards of other nodes out of reach
        self.node_number = 0  # this node's number in a cluster
        self.peers: Any = None  # in a cluster: the links to other nodes (cluster/peers.py)
        self.data_dir = os.path.abspath(config.data_dir)
        # Counts the changes of the catalogue, users and permissions: a route a
        # channel remembers (publishing.Route) holds while it stays.
        self.epoch = 0
        self.totals = Totals()
        self.shards = ShardPool(config, self._on_events, self._redeclare_queues,
                                self._shard_lost, config.ring_pairs())
        self.registry = registry = Registry(index)
        self.catalogue = catalogue = Catalogue(
            self.shards.count, self.authority, self.totals, self._to_shard, self._changed,
            self._vhost_deleted)
        self.access = AccessControl(None, config.loopback_users, self._changed)
        self.alarms = Alarms(self._alarm_changed, logs=self.authority)
        self.dispatcher = Dispatcher(registry.holders, catalogue, self.alarms, self.publish)
        self._dirty: list = []  # connections with output to write this turn
        self._flush_pending = False
        # Connections' input turns so far: [publishes only, anything else (acks,
        # say)]. Input of the other kind meanwhile shortens a Connection's turn.
        self.turns_by_kind = [0, 0]
        # The session's port (session/ports.Broker): the registry's and the
        # catalogue's methods it calls, bound once (route is called per publish).
        self.new_id = registry.new_id
        self.add_holder = registry.add_holder
        self.forget_holder = registry.forget_holder
        self.add_reply_channel = registry.add_reply_channel
        self.drop_reply_channel = registry.drop_reply_channel
        self.reply_channel = registry.reply_channel
        self.route = catalogue.route
        self.delete_exchange = catalogue.delete_exchange
        self.forget_queue = catalogue.forget_queue
        self.bind = catalogue.bind
        self.unbind = catalogue.unbind

    async def start(self, rings: list | None = None) -> None:
        """Check the data directory (recovery.Refused if it is damaged), open the
        metastore and start the shards; if that fails, what had started is stopped
        again. Another gateway than gateway 0 only attaches to the shards' `rings`
        it was given."""
        # Kept: asyncio.get_running_loop() costs a getpid() system call each time.
        self._loop = asyncio.get_running_loop()
        if not self.authority:
            self.shards.attach(rings)
            self.alarms.watch_disk(self.data_dir, self.config.disk_free_limit)
            return
        ready = recovery.prepare(self.data_dir, self.shards.count,
                                 self.config.quarantine_damaged, self.config.rebuild_definitions)
        for line in ready.upgraded:
            log.warning("%s", line)
        for line in ready.report:
            log.error("recovery: %s", line)
        meta = MetaStore(os.path.join(self.data_dir, "meta"))
        self.catalogue.meta = self.access.meta = meta
        try:
            self._load_definitions(ready.rebuilt)
            self.shards.start()
        except BaseException:
            await self.stop()
            raise
        self.alarms.watch_disk(self.data_dir, self.config.disk_free_limit)

    def _alarm_changed(self, reason: str) -> None:
        """Connections block at their next publish while an alarm is on
        (Connection._block); once none is, the blocked ones read on."""
        if not reason:
            for conn in self.registry.connections:
                conn.unblock()

    def _load_definitions(self, rebuilt: bool = False) -> None:
        """Durable vhosts, users and permissions, exchanges, queues (with their
        placement), policies and bindings, from the metastore start opened."""
        catalogue = self.catalogue
        assert isinstance(catalogue.meta, MetaStore)
        defs = catalogue.meta.load()
        # (a node of a cluster takes them from etcd, where the first node made them)
        fresh = ((not defs.vhosts and not defs.users) or rebuilt) and not self.config.cluster
        catalogue.load_vhosts(defs)
        self.access.load(defs.users, defs.permissions)
        if fresh:  # a new (or rebuilt) data directory: RabbitMQ's default vhost and user
            catalogue.add_vhost(self.config.default_vhost)
            self.access.ensure_default(self.config.default_user, self.config.default_pass,
                                       self.config.default_vhost)
        catalogue.load(defs)

    def _redeclare_queues(self, link: ShardLink) -> None:
        """A shard (re)started: declare its durable queues again. One whose declaration
        it had not committed when it died (or the broker stopped) would otherwise be
        missing from its store; queues it recovered ignore this. The other
        gateways are handed its new rings."""
        if self.followers is not None:
            self.followers.shard_started(link)
        if self.cluster is not None:
            self.cluster.shard_started(link)
        for meta in self.catalogue.queues_by_qid.values():
            if meta.shard == link.index and meta.spec.stored:
                link.send(r.CreateQueue(0, meta.qid, meta.spec, meta.effective))
                link.send(r.ConfigureQueue(meta.qid, meta.effective))

    async def stop(self) -> None:
        self.alarms.stop()
        await self.shards.stop()
        self.catalogue.meta.close()

    # -- the catalogue's hooks -----------------------------------------------------

    def _changed(self, change) -> None:
        """A change of the catalogue, users or permissions, for the other gateways
        to replay. The routes channels remember are stale from now on."""
        self.epoch += 1
        if self.followers is not None:
            self.followers.add(change)
        if self.cluster is not None and not self.cluster.applying:
            self.cluster.record(change)

    def _to_shard(self, shard: int, record) -> None:
        # A change replayed from etcd was told to its shards by the node that made it,
        # except a policy's effect on a queue declared here meanwhile, which that node
        # did not know yet: this node configures its own queues again.
        if self.cluster is None or not self.cluster.applying or (
                type(record) is r.ConfigureQueue and shard < self.shards.count):
            self.shards[shard].send(record)

    def _vhost_deleted(self, vhost) -> None:
        self.registry.close_vhost(vhost)
        self.access.forget_vhost(vhost.name)

    # -- limits and totals ---------------------------------------------------------

    def broker_totals(self) -> dict[str, int]:
        """The broker's counters since start: this gateway's and the others'."""
        totals = self.totals.as_dict()
        return totals if self.followers is None else self.followers.add_totals(totals)

    def limit_refusal(self, user: str, vhost: str, channel: bool = False) -> str | None:
        """Why a connection of `user` to `vhost` (or, with `channel`, another channel
        of it) may not open: a limit reached, counting every gateway's connections
        (gateway 0 decides for all)."""
        if channel:
            channels = self.access.user_limit(user, "max-channels")
            if channels < 0:
                return None
            if channels <= sum(n for u, _, n in self._opened() if u == user):
                return (f"number of channels opened for user '{user}' has reached the "
                        f"maximum allowed user limit of ({channels})")
            return None
        in_vhost = self.catalogue.vhost_limit(vhost, "max-connections")
        of_user = self.access.user_limit(user, "max-connections")
        if in_vhost < 0 and of_user < 0:
            return None
        opened = self._opened()
        if 0 <= in_vhost <= sum(1 for _, v, _ in opened if v == vhost):
            return (f"access to vhost '{vhost}' refused for user '{user}': "
                    f"connection limit ({in_vhost}) is reached")
        if 0 <= of_user <= sum(1 for u, _, _ in opened if u == user):
            return (f"Connection refused for user '{user}': user connection limit "
                    f"({of_user}) is reached")
        return None

    def _opened(self) -> list[tuple[str, str, int]]:
        """(user, vhost, channels) of every open connection, of every gateway."""
        opened = self.registry.opened()
        if self.followers is not None:
            opened += self.followers.tally.values()
        return opened

    # -- direct reply-to across gateways -------------------------------------------

    def reply_elsewhere(self, exchange: str, routing_key: str, properties: bytes,
                        body: bytes, origin: int = 0, ask: int = 0) -> bool:
        """Send a reply to a direct reply-to address of another gateway process
        there (through gateway 0); False if the address is not another's, or that
        gateway is not running. With `origin` (the publishing channel's id), the
        channel hears back whether it was delivered (`reply_outcome`)."""
        index = replyto.gateway_of(routing_key)
        node = replyto.node_of(routing_key)
        if node and node != self.node_number and index is not None and self.peers is not None:
            # Another node's: there over the link, taken for delivered (what became
            # of it does not come back across nodes).
            sent = self.peers.send_reply(node, Reply(index, exchange, routing_key, properties,
                                                     body))
            if sent and origin:
                self._loop.call_soon(self.reply_outcome, ReplyOutcome(origin, ask, False))
            return sent
        if index is None or index == self.index:
            return False
        reply = Reply(index, exchange, routing_key, properties, body, origin, ask)
        if self.leader is not None:
            self.leader.link.send(reply)
            return True
        return self.followers is not None and self.followers.pass_reply(reply)

    def deliver_reply(self, reply: Reply) -> None:
        """A reply from another gateway to a reply-to address of this one."""
        channel = self.registry.reply_channel(reply.routing_key)
        if channel is not None:
            channel.deliver_reply(reply.exchange, reply.routing_key, reply.properties,
                                  reply.body)
        if reply.origin:
            self.reply_outcome(ReplyOutcome(reply.origin, reply.ask, channel is None))

    def reply_outcome(self, outcome: ReplyOutcome) -> None:
        """What became of a mandatory reply: to its publisher's channel, whichever
        gateway has it (through gateway 0)."""
        if r.gateway_of(outcome.origin) == self.index:
            channel = self.registry.holders.get(outcome.origin)
            if channel is not None:
                channel.reply_outcome(outcome.ask, outcome.returned)
        elif self.leader is not None:
            self.leader.link.send(outcome)
        elif self.followers is not None:
            self.followers.pass_outcome(outcome)

    # -- the session's port (session/ports.Broker), beside what __init__ binds -------

    def release_holders(self, holders) -> None:
        """A channel went: every shard requeues what its holders kept."""
        holders = list(holders)
        for link in self.shards:
            link.send(r.ReleaseHolders(holders))
        forget = self.registry.forget_holder
        for holder in holders:
            forget(holder)

    def link(self, shard: int) -> ShardLink:
        return self.shards[shard]

    def declare_exchange(self, exchange: Exchange, allow) -> tuple[Exchange, bool]:
        return rules.declare_exchange(self.catalogue, exchange, allow)

    def declare_queue(self, queue: QueueSpec, owner, server_named: bool,
                      allow) -> tuple[QueueMeta, bool]:
        return rules.declare_queue(self.catalogue, queue, owner, server_named, allow)

    def binding_ends(self, vhost: str, source: str, destination: tuple) -> tuple:
        return rules.binding_ends(self.catalogue, vhost, source, destination)

    def delete_exclusive_queues(self, owner) -> None:
        if not self.authority:  # gateway 0 deletes them, told the owner closed
            self.leader.connection_closed(owner)
            return
        for meta in list(owner.exclusive_queues):
            self.catalogue.delete_queue(meta)

    # -- events from shards, and output --------------------------------------------

    def take_shard_events(self) -> None:
        """Before a connection's input: take in the shards' waiting events
        (deliveries, confirms, credit) and write out what they produced, now. What
        is sent to the shards from here goes at the end of the input (shards.send()),
        without a loop callback of its own."""
        links = self.shards.links  # (no ShardPool method: one frame less a read)
        for link in links:
            link.flush_scheduled = True
            link.poll()
        if self._dirty:
            self.flush_output()
        # Awake till take_answers: a shard that answers meanwhile need not ring.
        for link in links:
            if link.alive:
                link.events.awake()

    def take_answers(self) -> None:
        """After a connection's input went to the shards: what they answered
        meanwhile, written out now, and their doorbells armed again. With load
        compaction a shard shares this CPU, runs the moment its doorbell rings and
        has answered by the time this process runs again, so its answers go out in
        this turn, without a doorbell, a wake-up and a loop turn of their own."""
        for link in self.shards.links:
            link.take_answers()
        if self._dirty:
            self.flush_output()

    def flush_soon(self, conn) -> None:
        """Write `conn`'s output at the end of this loop turn (or at the next poll)."""
        self._dirty.append(conn)
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self.flush_output)

    def flush_output(self) -> None:
        self._flush_pending = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    def _on_events(self, link: ShardLink, events: list) -> None:
        """A shard's events, to the dispatcher. What they produce is written at the
        end, not in a loop callback of its own (unless one is due anyway)."""
        writes_here = not self._flush_pending
        self._flush_pending = True
        self.dispatcher.dispatch(link, events)
        if writes_here:
            self.flush_output()

    def _shard_lost(self, link: ShardLink) -> None:
        local = link.index < self.shards.count
        self.dispatcher.shard_lost(link, local)
        if not local:  # publishes to its queues are unroutable until it is back
            self.down_shards.add(link.index)
            self.epoch += 1
            return
        if self.cluster is not None:
            self.cluster.shard_lost(link)
        if self.followers is not None:
            self.followers.shard_down(link.index)

    def remote_up(self, link) -> None:
        """A shard of another node is in reach again."""
        self.down_shards.discard(link.index)
        self.epoch += 1

    # -- to the shards -------------------------------------------------------------

    def publish(self, targets: list[QueueMeta], exchange: str, routing_key: str,
                properties: bytes, body: bytes, persistent: bool, expiration: int,
                priority: int, confirm_channel: int = 0, seq: int = 0, tracker=None,
                feeder=None) -> None:
        """Send a message to the shards of its queues, one record per shard."""
        self.publish_to(by_shard(targets), exchange, routing_key, properties, body, persistent,
                        expiration, priority, confirm_channel, seq, tracker, feeder)

    def publish_to(self, sends: tuple, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, persistent: bool, expiration: int, priority: int,
                   confirm_channel: int = 0, seq: int = 0, tracker=None,
                   feeder=None) -> None:
        """publish, with its queues already grouped (by_shard)."""
        links = self.shards.links
        for shard, qids in sends:
            link = links[shard]
            if link.alive:
                link.send(r.Publish(qids, exchange, routing_key, properties, body, persistent,
                                    confirm_channel, seq, expiration, priority), feeder)
            elif tracker is not None:  # between a shard's death and its restart
                tracker.reject(seq, shard)
