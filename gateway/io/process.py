"""The gateway process's state: vhosts, exchanges, bindings and queue placement
(the catalogue every connection shares), the connections and consumers, and the
routing of shard events back to their channels. Alarms (alarms.py) and the shard
processes (shardpool.py) are parts of it.

Queues live in shards; the gateway keeps their metadata (id, shard, flags) so it
can route a publish to the right shards without asking anyone.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from typing import TYPE_CHECKING

from warren.gateway.amqp.properties import PropertiesError, decode_properties, encode_properties
from warren.gateway.broker import changes, deadletter, patterns, policies
from warren.gateway.broker.access import AccessControl
from warren.gateway.broker.exchange import EXCHANGE, QUEUE, RENEW_EXCHANGE, Exchange, arguments_key
from warren.gateway.broker.peermessages import Reply, ReplyOutcome
from warren.gateway.config import Config
from warren.gateway.session import replyto
from warren.gateway.snapshots import Totals
from warren.gateway.values import (
    TRANSIENT_QIDS,
    QueueMeta,
    RemoteOwner,
    by_shard,
    placement,
)
from warren.shards import records as r
from warren.storage import recovery
from warren.storage.metastore import (
    MetaStore,
    PolicyDef,
    QueueDef,
    VHostDef,
)
from warren.storage.queuespec import QueueSpec

from .alarms import Alarms
from .shardlink import ShardLink
from .shardpool import ShardPool

if TYPE_CHECKING:
    from warren.gateway.session.channel import Channel

log = logging.getLogger("warren")

# The exchanges every vhost has (RabbitMQ's predeclared set).
PREDECLARED = (("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
               ("amq.topic", "topic"), ("amq.headers", "headers"), ("amq.match", "headers"))


class VHost:
    def __init__(self, name: str):
        self.name = name
        self.queues: dict[str, QueueMeta] = {}
        self.exchanges: dict[str, Exchange] = {
            x: Exchange(name, x, kind) for x, kind in PREDECLARED}
        self.exchanges["amq.rabbitmq.trace"] = Exchange(name, "amq.rabbitmq.trace", "topic",
                                                        internal=True)
        self.exchanges[RENEW_EXCHANGE] = Exchange(name, RENEW_EXCHANGE, "direct")
        # destination -> {(source exchange, routing key, arguments key)}: what to
        # unbind when a queue or exchange goes away, without scanning every exchange
        self.inbound: dict[tuple, set[tuple]] = {}


class Gateway:
    def __init__(self, config: Config, index: int = 0):
        self.config = config
        # Gateway 0 is the metadata authority: it alone changes the catalogue, writes
        # DATA/meta/ and tells the shards about queues (docs/architecture.md).
        self.index = index
        self.authority = index == 0
        self.followers = None  # gateway 0 with others: where its changes go (followers.py)
        self.leader = None  # any other gateway: its link to gateway 0 (follower.py)
        self.remote_owners: dict[int, RemoteOwner] = {}
        if not self.authority:  # gateway 0 writes DATA/meta/
            self.meta = changes.NoStore()
        self.data_dir = os.path.abspath(config.data_dir)
        self.epoch = 0  # counts the catalogue's changes (see _changed)
        self.access = AccessControl(None, config.loopback_users, self._changed)
        self.vhosts: dict[str, VHost] = {}
        self.vhost_defs: dict[str, VHostDef] = {}
        self.policies: dict[str, dict[str, PolicyDef]] = {}  # vhost -> name -> policy
        self.shards = ShardPool(config, self._on_events, self._redeclare_queues,
                                self._shard_lost, config.ring_pairs())
        self.alarms = Alarms(self._alarm_changed, logs=self.authority)
        self._dirty: list = []  # connections with output to write this turn
        self._flush_pending = False
        # Connections' input turns so far: [publishes only, anything else (acks,
        # say)]. Input of the other kind meanwhile shortens a Connection's turn.
        self.turns_by_kind = [0, 0]
        self.connections: set = set()
        self.holders: dict[int, "Channel"] = {}  # consumer id -> its channel
        self.reply_channels: dict[str, "Channel"] = {}  # direct reply-to key -> channel
        self.queues_by_qid: dict[int, QueueMeta] = {}
        self._next_id = 0
        self._next_qid = 0
        self.stopping = False
        self.totals = Totals()

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
        self.meta = MetaStore(os.path.join(self.data_dir, "meta"))
        self.access.meta = self.meta
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
            for conn in self.connections:
                conn.unblock()

    def _load_definitions(self, rebuilt: bool = False) -> None:
        """Durable vhosts, exchanges, queues (with their placement) and bindings."""
        defs = self.meta.load()
        fresh = (not defs.vhosts and not defs.users) or rebuilt
        for v in defs.vhosts:
            self.vhosts.setdefault(v.name, VHost(v.name))
            self.vhost_defs[v.name] = v
        self.access.load(defs.users, defs.permissions)
        if fresh:  # a new (or rebuilt) data directory: RabbitMQ's default vhost and user
            self.add_vhost(self.config.default_vhost)
            self.access.ensure_default(self.config.default_user, self.config.default_pass,
                                       self.config.default_vhost)
        for e in defs.exchanges:
            vhost = self.vhosts.setdefault(e.vhost, VHost(e.vhost))
            vhost.exchanges[e.name] = Exchange(e.vhost, e.name, e.type, e.durable,
                                               e.auto_delete, e.internal, e.arguments)
        for q in defs.queues:
            vhost = self.vhosts.setdefault(q.spec.vhost, VHost(q.spec.vhost))
            # A queue recorded on a shard that no longer exists lives on in its old
            # store, which shard (K mod N) adopts.
            meta = QueueMeta(q.qid, q.shard % self.shards.count, q.spec)
            vhost.queues[q.spec.name] = self.queues_by_qid[q.qid] = meta
        for p in defs.policies:
            self.policies.setdefault(p.vhost, {})[p.name] = p
        if self.authority:
            self._warn_unmatchable(defs)
        for vhost in self.vhosts.values():
            self._apply_policies(vhost, send=False)
        for b in defs.bindings:
            vhost = self.vhosts.get(b.vhost)
            exchange = vhost.exchanges.get(b.source) if vhost else None
            if exchange is not None:
                self.add_binding(vhost, exchange, (b.destination_type, b.destination),
                                  b.routing_key, b.arguments)

    def _redeclare_queues(self, link: ShardLink) -> None:
        """A shard (re)started: declare its durable queues again. One whose declaration
        it had not committed when it died (or the broker stopped) would otherwise be
        missing from its store; queues it recovered ignore this. The other
        gateways are handed its new rings."""
        if self.followers is not None:
            self.followers.shard_started(link)
        for meta in self.queues_by_qid.values():
            if meta.shard == link.index and meta.spec.stored:
                link.send(r.CreateQueue(0, meta.qid, meta.spec, meta.effective))
                link.send(r.ConfigureQueue(meta.qid, meta.effective))

    async def stop(self) -> None:
        self.stopping = True
        self.alarms.stop()
        await self.shards.stop()
        self.meta.close()

    # -- vhosts ------------------------------------------------------------------

    def _changed(self, change) -> None:
        """A change of the catalogue, for the other gateways to replay. The routes
        channels remember (publishing.Route) are stale from now on."""
        self.epoch += 1
        if self.followers is not None:
            self.followers.add(change)

    def add_vhost(self, name: str, description: str = "", limits: dict | None = None) -> VHost:
        definition = VHostDef(name, description, limits or {})
        self.vhost_defs[name] = definition
        self.meta.put_vhost(definition)
        self._changed(changes.VHostPut(definition))
        return self.vhosts.setdefault(name, VHost(name))

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost with its queues, exchanges, bindings, permissions and
        policies; its connections are closed (320 CONNECTION_FORCED)."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        for conn in [c for c in self.connections if c.vhost is vhost]:
            conn.close_forced(f"vhost '{name}' is deleted")
        for meta in list(vhost.queues.values()):
            if self.authority:
                self.shards[meta.shard].send(r.DeleteQueue(0, meta.qid, False, False))
            self.queues_by_qid.pop(meta.qid, None)
        self.vhost_defs.pop(name, None)
        self.policies.pop(name, None)
        self.access.forget_vhost(name)
        self.meta.delete_vhost(name)
        self._changed(changes.VHostDeleted(name))
        return True

    # -- policies ----------------------------------------------------------------

    def put_policy(self, policy: PolicyDef) -> None:
        """Set (or replace) a policy and apply it to existing queues and exchanges.
        Raises ValueError when the policy is not valid."""
        problem = policies.problems(policy)
        if problem:
            raise ValueError(problem)
        if policy.vhost not in self.vhosts:
            raise ValueError(f"no vhost '{policy.vhost}'")
        self.policies.setdefault(policy.vhost, {})[policy.name] = policy
        self.meta.put_policy(policy)
        self._changed(changes.PolicyPut(policy))
        self._apply_policies(self.vhosts[policy.vhost])

    def delete_policy(self, vhost: str, name: str) -> bool:
        if self.policies.get(vhost, {}).pop(name, None) is None:
            return False
        self.meta.delete_policy(vhost, name)
        self._changed(changes.PolicyDeleted(vhost, name))
        if vhost in self.vhosts:
            self._apply_policies(self.vhosts[vhost])
        return True

    @staticmethod
    def _warn_unmatchable(defs) -> None:
        """Patterns stored before they were matched by RE2 (patterns.py) and that
        it cannot run match nothing: say so, once, rather than drop them unseen."""
        for p in defs.policies:
            if problem := patterns.problem(p.pattern):
                log.warning("policy '%s' in vhost '%s' applies to nothing: its pattern '%s' "
                            "cannot be matched in linear time (%s); set it again", p.name,
                            p.vhost, p.pattern, problem)
        for p in defs.permissions:
            for access in ("configure", "write", "read"):
                if problem := patterns.problem(getattr(p, access)):
                    log.warning("the %s permission of user '%s' in vhost '%s' grants nothing: "
                                "its pattern '%s' cannot be matched in linear time (%s); set "
                                "it again", access, p.user, p.vhost, getattr(p, access), problem)

    def _apply_policies(self, vhost: VHost, send: bool = True) -> None:
        for meta in vhost.queues.values():
            before = meta.effective
            self._set_queue_policy(meta)
            if send and self.authority and meta.effective != before:
                self.shards[meta.shard].send(r.ConfigureQueue(meta.qid, meta.effective))
        for exchange in vhost.exchanges.values():
            self._set_exchange_policy(exchange)

    def _set_queue_policy(self, meta: QueueMeta) -> None:
        spec = meta.spec
        meta.policy = (None if spec.name.startswith("amq.") else policies.select(
            self.policies.get(spec.vhost, {}).values(), spec.name, "queue", spec.queue_type))
        meta.effective = policies.queue_arguments(spec.arguments, meta.policy)

    def _set_exchange_policy(self, exchange: Exchange) -> None:
        exchange.policy = (None if exchange.name == "" or exchange.name.startswith("amq.")
                           else policies.select(self.policies.get(exchange.vhost, {}).values(),
                                                exchange.name, "exchange"))
        exchange.alternate = policies.exchange_alternate(exchange.arguments, exchange.policy)

    def vhost_limit(self, vhost: str, limit: str) -> int:
        definition = self.vhost_defs.get(vhost)
        value = definition.limits.get(limit, -1) if definition else -1
        return value if isinstance(value, int) else -1

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
        in_vhost = self.vhost_limit(vhost, "max-connections")
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
        opened = [(c.user, c.vhost.name, len(c.channels)) for c in self.connections
                  if c.vhost is not None and c.is_open]
        if self.followers is not None:
            opened += self.followers.tally.values()
        return opened

    def reply_channel(self, address: str):
        """The channel behind a direct reply-to address, if it still consumes."""
        key = replyto.key_of(address)
        return self.reply_channels.get(key) if key else None

    def reply_elsewhere(self, exchange: str, routing_key: str, properties: bytes,
                        body: bytes, origin: int = 0, ask: int = 0) -> bool:
        """Send a reply to a direct reply-to address of another gateway process
        there (through gateway 0); False if the address is not another's, or that
        gateway is not running. With `origin` (the publishing channel's id), the
        channel hears back whether it was delivered (`reply_outcome`)."""
        index = replyto.gateway_of(routing_key)
        if index is None or index == self.index:
            return False
        reply = Reply(index, exchange, routing_key, properties, body, origin, ask)
        if self.leader is not None:
            self.leader.link.send(reply)
            return True
        return self.followers is not None and self.followers.pass_reply(reply)

    def deliver_reply(self, reply: Reply) -> None:
        """A reply from another gateway to a reply-to address of this one."""
        channel = self.reply_channel(reply.routing_key)
        if channel is not None:
            channel.deliver_reply(reply.exchange, reply.routing_key, reply.properties,
                                  reply.body)
        if reply.origin:
            self.reply_outcome(ReplyOutcome(reply.origin, reply.ask, channel is None))

    def reply_outcome(self, outcome: ReplyOutcome) -> None:
        """What became of a mandatory reply: to its publisher's channel, whichever
        gateway has it (through gateway 0)."""
        if r.gateway_of(outcome.origin) == self.index:
            channel = self.holders.get(outcome.origin)
            if channel is not None:
                channel.reply_outcome(outcome.ask, outcome.returned)
        elif self.leader is not None:
            self.leader.link.send(outcome)
        elif self.followers is not None:
            self.followers.pass_outcome(outcome)

    def owner_of(self, id: int):
        """The connection an exclusive queue's owner id names (0: none)."""
        if not id:
            return None
        if r.gateway_of(id) == self.index:
            return next((c for c in self.connections if c.id == id), None)
        owner = self.remote_owners.get(id)
        if owner is None:
            owner = self.remote_owners[id] = RemoteOwner(id)
        return owner

    def new_id(self) -> int:
        """A broker-wide id for a connection, channel or consumer (shard 'holders'):
        it names this gateway (records.gateway_of), so shards know where to answer."""
        self._next_id += 1
        return self._next_id * r.MAX_GATEWAYS + self.index

    # -- the session's port (session/ports.Broker) ------------------------------

    def add_holder(self, holder: int, channel: "Channel") -> None:
        self.holders[holder] = channel

    def forget_holder(self, holder: int) -> None:
        self.holders.pop(holder, None)

    def release_holders(self, holders) -> None:
        """A channel went: every shard requeues what its holders kept."""
        holders = list(holders)
        for link in self.shards:
            link.send(r.ReleaseHolders(holders))
        for holder in holders:
            self.holders.pop(holder, None)

    def link(self, shard: int) -> ShardLink:
        return self.shards[shard]

    def add_reply_channel(self, key: str, channel: "Channel") -> None:
        self.reply_channels[key] = channel

    def drop_reply_channel(self, key: str) -> None:
        self.reply_channels.pop(key, None)

    def declare_exchange(self, exchange: Exchange, allow) -> tuple[Exchange, bool]:
        from warren.gateway.broker import rules  # (rules imports this module)
        return rules.declare_exchange(self, exchange, allow)

    def declare_queue(self, queue: QueueSpec, owner, server_named: bool,
                      allow) -> tuple[QueueMeta, bool]:
        from warren.gateway.broker import rules
        return rules.declare_queue(self, queue, owner, server_named, allow)

    def binding_ends(self, vhost: str, source: str, destination: tuple) -> tuple:
        from warren.gateway.broker import rules
        return rules.binding_ends(self, vhost, source, destination)

    # -- queues ----------------------------------------------------------------

    def create_queue(self, spec: QueueSpec, owner=None) -> QueueMeta:
        """Create a queue (validated already: gateway/declare.py); `owner` is the
        connection of an exclusive one."""
        if spec.stored:
            qid = self.meta.allocate_qid()
        else:
            # Transient queues die with the broker: ids from a range of their own.
            self._next_qid += 1
            qid = TRANSIENT_QIDS + self._next_qid
        definition = QueueDef(spec, qid, placement(spec.vhost, spec.name, self.shards.count))
        if spec.stored:
            self.meta.put_queue(definition)
        meta = self.add_queue(definition, owner)
        self.shards[meta.shard].send(r.CreateQueue(0, qid, spec, meta.effective))
        return meta

    def add_queue(self, definition: QueueDef, owner=None) -> QueueMeta:
        """A new queue in the catalogue (created here, or by gateway 0)."""
        spec = definition.spec
        meta = QueueMeta(definition.qid, definition.shard, spec, owner)
        self._set_queue_policy(meta)
        self.vhosts[spec.vhost].queues[spec.name] = self.queues_by_qid[meta.qid] = meta
        if owner is not None:
            owner.exclusive_queues.add(meta)
        if self.authority:  # not again where the change is replayed
            self.totals.queues_created += 1
        self._changed(changes.QueuePut(definition, owner.id if owner is not None else 0))
        return meta

    def forget_queue(self, meta: QueueMeta) -> None:
        spec = meta.spec
        vhost = self.vhosts.get(spec.vhost)
        if vhost is None or vhost.queues.get(spec.name) is not meta:
            return
        self._unbind_destination(vhost, (QUEUE, spec.name))  # while the queue is known
        del vhost.queues[spec.name]
        del self.queues_by_qid[meta.qid]
        if self.authority:  # not again where the change is replayed
            self.totals.queues_deleted += 1
        if meta.owner is not None:
            meta.owner.exclusive_queues.discard(meta)
        if spec.stored:
            self.meta.delete_queue(spec.vhost, spec.name)
        self._changed(changes.QueueForgotten(meta.qid))

    # -- exchanges and bindings ------------------------------------------------

    def add_exchange(self, exchange: Exchange) -> None:
        self.vhosts[exchange.vhost].exchanges[exchange.name] = exchange
        self._set_exchange_policy(exchange)
        if exchange.durable:
            self.meta.put_exchange(changes.exchange_def(exchange))
        self._changed(changes.ExchangePut(changes.exchange_def(exchange)))

    def delete_exchange(self, exchange: Exchange) -> None:
        vhost = self.vhosts[exchange.vhost]
        if vhost.exchanges.get(exchange.name) is not exchange:
            return
        for (destination, routing_key, _), arguments in list(exchange.bindings.items()):
            self.unbind(exchange, destination, routing_key, arguments, auto_delete=False)
        self._unbind_destination(vhost, (EXCHANGE, exchange.name))
        del vhost.exchanges[exchange.name]
        if exchange.durable:
            self.meta.delete_exchange(exchange.vhost, exchange.name)
        self._changed(changes.ExchangeDeleted(exchange.vhost, exchange.name))

    def bind(self, exchange: Exchange, destination: tuple, routing_key: str,
             arguments: dict) -> None:
        vhost = self.vhosts[exchange.vhost]
        if self.add_binding(vhost, exchange, destination, routing_key, arguments) \
                and self._durable_binding(vhost, exchange, destination):
            self.meta.put_binding(changes.binding_def(exchange, destination, routing_key,
                                                          arguments))

    def unbind(self, exchange: Exchange, destination: tuple, routing_key: str, arguments: dict,
               auto_delete: bool = True) -> None:
        """Remove a binding; an auto-delete exchange goes with its last one."""
        vhost = self.vhosts[exchange.vhost]
        if not exchange.unbind(destination, routing_key, arguments):
            return
        inbound = vhost.inbound.get(destination)
        if inbound is not None:
            inbound.discard((exchange.name, routing_key, arguments_key(arguments)))
            if not inbound:
                del vhost.inbound[destination]
        if self._durable_binding(vhost, exchange, destination):
            self.meta.delete_binding(changes.binding_def(exchange, destination, routing_key,
                                                             arguments))
        self._changed(changes.BindingDeleted(changes.binding_def(
            exchange, destination, routing_key, arguments)))
        if auto_delete and exchange.auto_delete and not exchange.bindings:
            self.delete_exchange(exchange)

    def add_binding(self, vhost: VHost, exchange: Exchange, destination: tuple,
                    routing_key: str, arguments: dict) -> bool:
        if not exchange.bind(destination, routing_key, arguments):
            return False
        vhost.inbound.setdefault(destination, set()).add(
            (exchange.name, routing_key, arguments_key(arguments)))
        self._changed(changes.BindingPut(changes.binding_def(
            exchange, destination, routing_key, arguments)))
        return True

    def _unbind_destination(self, vhost: VHost, destination: tuple) -> None:
        for source, routing_key, args_key in list(vhost.inbound.get(destination, ())):
            exchange = vhost.exchanges.get(source)
            if exchange is None:
                continue
            arguments = exchange.bindings.get((destination, routing_key, args_key))
            if arguments is not None:
                self.unbind(exchange, destination, routing_key, arguments)
        vhost.inbound.pop(destination, None)

    def _durable_binding(self, vhost: VHost, exchange: Exchange, destination: tuple) -> bool:
        """Stored when both ends survive a restart."""
        if not exchange.durable:
            return False
        kind, name = destination
        if kind == QUEUE:
            meta = vhost.queues.get(name)
            return meta is not None and meta.spec.stored
        target = vhost.exchanges.get(name)
        return target is not None and target.durable

    def delete_exclusive_queues(self, owner) -> None:
        if not self.authority:  # gateway 0 deletes them, told the owner closed
            self.leader.connection_closed(owner)
            return
        for meta in list(owner.exclusive_queues):
            self.forget_queue(meta)
            self.shards[meta.shard].send(r.DeleteQueue(0, meta.qid, False, False))

    # -- routing ---------------------------------------------------------------

    def route(self, vhost: VHost, exchange: Exchange, routing_key: str,
              headers) -> list[QueueMeta]:
        """Every queue a message reaches from `exchange`: through exchange-to-exchange
        bindings (each exchange visited once) and alternate exchanges of exchanges
        that route it nowhere. `headers()` decodes the message headers on demand."""
        if exchange.name == "":
            meta = vhost.queues.get(routing_key)
            return [meta] if meta is not None else []
        queues: dict[str, QueueMeta] = {}
        seen = {exchange.name}
        pending = [exchange]
        while pending:
            current = pending.pop()
            destinations = current.route(routing_key, headers)
            if not destinations:
                alternate = vhost.exchanges.get(current.alternate or "")
                if alternate is not None and alternate.name not in seen and alternate.name:
                    seen.add(alternate.name)
                    pending.append(alternate)
                continue
            for kind, name in destinations:
                if kind == QUEUE:
                    meta = vhost.queues.get(name)
                    if meta is not None:
                        queues[name] = meta
                elif name not in seen:
                    target = vhost.exchanges.get(name)
                    if target is not None:
                        seen.add(name)
                        pending.append(target)
        return list(queues.values())

    # -- events from shards ----------------------------------------------------

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
        """Hand a shard's events to their channels. A failure while handling one
        closes the connection it concerns (or is logged, if it concerns none) and
        the rest of the batch goes on: one client's trouble never stops a shard's
        events for everyone. What they produce is written at the end, not in a loop
        callback of its own (unless one is due anyway)."""
        writes_here = not self._flush_pending
        self._flush_pending = True
        holders = self.holders
        for event in events:
            kind = type(event)
            channel = None
            try:
                if kind is r.Deliver:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.deliver(link, event)
                elif kind is r.Confirmed or kind is r.Rejected:
                    accepted = kind is r.Confirmed
                    channels, seqs = event.channels, event.seqs
                    start, count = 0, len(channels)
                    while start < count:  # a run of one channel's seqs at a time
                        channel_id = channels[start]
                        end = start + 1
                        while end < count and channels[end] == channel_id:
                            end += 1
                        channel = holders.get(channel_id)
                        if channel is not None:
                            try:
                                if accepted:
                                    channel.confirmed(seqs[start:end], link.index)
                                else:
                                    channel.rejected(seqs[start:end], link.index)
                            except Exception as error:
                                channel.conn.fail(error)
                        start = end
                    channel = None
                elif kind is r.ConsumerCancelled:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.consumer_cancelled_by_broker(event.holder)
                elif kind is r.Alarm:
                    self.alarms.set((link.index, event.resource), event.active)
                elif kind is r.QueueDeleted:
                    self._queue_deleted_by_shard(link.index, event.qid)
                elif kind is r.DeadLettered:
                    self._dead_letter(event)
                elif kind is r.ConsumerTimedOut:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.consumer_timed_out(event)
            except Exception as error:
                if channel is not None:
                    channel.conn.fail(error)
                else:
                    log.error("shard %d event %s failed", link.index, kind.__name__,
                              exc_info=error)
        if writes_here:
            self.flush_output()

    def _dead_letter(self, event: r.DeadLettered) -> None:
        """Republish a dead-lettered message to its queue's dead-letter exchange,
        with its x-death history; queues that would close a cycle are skipped.
        At most once, as in RabbitMQ: no confirm is waited for."""
        meta = self.queues_by_qid.get(event.qid)
        if meta is None:
            return
        vhost = self.vhosts[meta.spec.vhost]
        exchange = vhost.exchanges.get(meta.effective.get("x-dead-letter-exchange"))
        if exchange is None:
            return  # RabbitMQ drops it too when the exchange is missing
        try:
            props = decode_properties(event.properties)
        except PropertiesError:
            return
        routing_key = meta.effective.get("x-dead-letter-routing-key", event.routing_key)
        deaths = deadletter.record_death(props, meta.spec.name, event.reason, event.exchange,
                                         event.routing_key,
                                         datetime.datetime.now(datetime.timezone.utc))
        targets = [q for q in self.route(vhost, exchange, routing_key, lambda: props.headers)
                   if not deadletter.is_cycle(q.spec.name, deaths)]
        properties = encode_properties(props)
        self.publish(targets, exchange.name, routing_key, properties, event.body,
                     props.delivery_mode == 2, -1, props.priority or 0)

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

    def _queue_deleted_by_shard(self, shard: int, qid: int) -> None:
        meta = self.queues_by_qid.get(qid)
        if meta is not None and meta.shard == shard and self.authority:
            self.forget_queue(meta)

    def _shard_lost(self, link: ShardLink) -> None:
        """A shard died. Its transient queues died with it (durable ones come back
        from its store), its alarms are off, its consumers are cancelled and its
        unconfirmed publishes nacked."""
        for vhost in self.vhosts.values() if self.authority else ():
            for meta in [m for m in vhost.queues.values()
                         if m.shard == link.index and not m.spec.stored]:
                self.forget_queue(meta)
        self.alarms.clear_source(link.index)
        for channel in set(self.holders.values()):
            channel.shard_lost(link)
        if self.followers is not None:
            self.followers.shard_down(link.index)
