"""The catalogue every connection of a gateway process shares: vhosts, exchanges
and their bindings, queues (their metadata and placement on a shard) and the
policies that apply to them, and the routing of a message through it.

Queues live in shards; the catalogue keeps their metadata (id, shard, flags) so
a publish is routed to the right shards without asking anyone. It touches no
process, socket or loop: what a shard must hear goes out through `to_shard`, and
each change, as a changes.py record, through `forward` (to the other gateway
processes, which replay it: changes.apply).
"""

from __future__ import annotations

import logging
from typing import Callable

from warren.shards import records as r
from warren.storage.metastore import MetaStore, PolicyDef, QueueDef, VHostDef
from warren.storage.queuespec import QueueSpec

from ..snapshots import Totals
from ..values import TRANSIENT_QIDS, QueueMeta, placement
from . import changes, patterns, policies
from .exchange import EXCHANGE, QUEUE, RENEW_EXCHANGE, Exchange, arguments_key

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


def _ignore(*_) -> None:
    pass


class Catalogue:
    """`authority`: gateway 0, which alone changes the catalogue of its own accord
    (the others replay its changes), counts queues and tells shards about them.
    `to_shard(shard, record)` sends a record to a shard; `forward(change)` is
    told every change, to hand on to the other gateways (and to tell channels
    their remembered routes are stale: Gateway.epoch); `vhost_deleted(vhost)`
    closes a deleted vhost's connections and forgets its permissions. `meta` is
    the metadata store (changes.NoStore() until gateway 0 opens DATA/meta/, and
    on the other gateways)."""

    def __init__(self, shard_count: int, authority: bool = True, totals: Totals | None = None,
                 to_shard: Callable = _ignore, forward: Callable = _ignore,
                 vhost_deleted: Callable = _ignore):
        self.shard_count = shard_count
        self.authority = authority
        self.totals = totals if totals is not None else Totals()
        self.to_shard = to_shard
        self.forward = forward
        self.vhost_deleted = vhost_deleted
        self.meta: MetaStore | changes.NoStore = changes.NoStore()
        self.vhosts: dict[str, VHost] = {}
        self.vhost_defs: dict[str, VHostDef] = {}
        self.policies: dict[str, dict[str, PolicyDef]] = {}  # vhost -> name -> policy
        self.queues_by_qid: dict[int, QueueMeta] = {}
        self._next_qid = 0
        # In a cluster: this node's number in the high bits of the ids of the queues
        # it creates, and where a new queue goes (cluster/node.py, place).
        self.qid_base = 0
        self.place: Callable[[QueueSpec], int] | None = None

    # -- loading -----------------------------------------------------------------

    def load_vhosts(self, defs) -> None:
        """The stored vhosts (`defs`: a metastore's load())."""
        for v in defs.vhosts:
            self.vhosts.setdefault(v.name, VHost(v.name))
            self.vhost_defs[v.name] = v

    def load(self, defs) -> None:
        """The stored exchanges, queues (with their placement), policies and bindings;
        after load_vhosts."""
        for e in defs.exchanges:
            vhost = self.vhosts.setdefault(e.vhost, VHost(e.vhost))
            vhost.exchanges[e.name] = Exchange(e.vhost, e.name, e.type, e.durable,
                                               e.auto_delete, e.internal, e.arguments)
        for q in defs.queues:
            vhost = self.vhosts.setdefault(q.spec.vhost, VHost(q.spec.vhost))
            # A queue recorded on a shard that no longer exists lives on in its old
            # store, which shard (K mod N) adopts.
            meta = QueueMeta(q.qid, q.shard % self.shard_count, q.spec)
            vhost.queues[q.spec.name] = self.queues_by_qid[q.qid] = meta
        for p in defs.policies:
            self.policies.setdefault(p.vhost, {})[p.name] = p
        if self.authority:
            _warn_unmatchable(defs)
        for vhost in self.vhosts.values():
            self._apply_policies(vhost, send=False)
        for b in defs.bindings:
            bound = self.vhosts.get(b.vhost)
            exchange = bound.exchanges.get(b.source) if bound else None
            if bound is not None and exchange is not None:
                self.add_binding(bound, exchange, (b.destination_type, b.destination),
                                 b.routing_key, b.arguments)

    # -- vhosts ------------------------------------------------------------------

    def add_vhost(self, name: str, description: str = "", limits: dict | None = None) -> VHost:
        definition = VHostDef(name, description, limits or {})
        self.vhost_defs[name] = definition
        self.meta.put_vhost(definition)
        self.forward(changes.VHostPut(definition))
        return self.vhosts.setdefault(name, VHost(name))

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost with its queues, exchanges, bindings and policies;
        vhost_deleted closes its connections and forgets its permissions."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        self.vhost_deleted(vhost)
        for meta in list(vhost.queues.values()):
            if self.authority:
                self.to_shard(meta.shard, r.DeleteQueue(0, meta.qid, False, False))
            self.queues_by_qid.pop(meta.qid, None)
        self.vhost_defs.pop(name, None)
        self.policies.pop(name, None)
        self.meta.delete_vhost(name)
        self.forward(changes.VHostDeleted(name))
        return True

    def vhost_limit(self, vhost: str, limit: str) -> int:
        definition = self.vhost_defs.get(vhost)
        value = definition.limits.get(limit, -1) if definition else -1
        return value if isinstance(value, int) else -1

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
        self.forward(changes.PolicyPut(policy))
        self._apply_policies(self.vhosts[policy.vhost])

    def delete_policy(self, vhost: str, name: str) -> bool:
        if self.policies.get(vhost, {}).pop(name, None) is None:
            return False
        self.meta.delete_policy(vhost, name)
        self.forward(changes.PolicyDeleted(vhost, name))
        if vhost in self.vhosts:
            self._apply_policies(self.vhosts[vhost])
        return True

    def _apply_policies(self, vhost: VHost, send: bool = True) -> None:
        for meta in vhost.queues.values():
            before = meta.effective
            self._set_queue_policy(meta)
            if send and self.authority and meta.effective != before:
                self.to_shard(meta.shard, r.ConfigureQueue(meta.qid, meta.effective))
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

    # -- queues ------------------------------------------------------------------

    def create_queue(self, spec: QueueSpec, owner=None) -> QueueMeta:
        """Create a queue (validated already: broker/rules.py) and tell its shard;
        `owner` is the connection of an exclusive one."""
        if spec.stored:
            assert isinstance(self.meta, MetaStore)  # gateway 0's, which alone creates
            qid = self.qid_base + self.meta.allocate_qid()
        else:
            # Transient queues die with the broker: ids from a range of their own.
            self._next_qid += 1
            qid = TRANSIENT_QIDS + self.qid_base + self._next_qid
        shard = self.place(spec) if self.place is not None else \
            placement(spec.vhost, spec.name, self.shard_count)
        definition = QueueDef(spec, qid, shard)
        if spec.stored and shard < self.shard_count:  # (a cluster: another node's stores it)
            self.meta.put_queue(definition)
        meta = self.add_queue(definition, owner)
        self.to_shard(meta.shard, r.CreateQueue(0, qid, spec, meta.effective))
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
        self.forward(changes.QueuePut(definition, owner.id if owner is not None else 0))
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
        self.forward(changes.QueueForgotten(meta.qid))

    def delete_queue(self, meta: QueueMeta) -> None:
        """Forget a queue and have its shard delete it (an exclusive queue whose
        owner closed)."""
        self.forget_queue(meta)
        self.to_shard(meta.shard, r.DeleteQueue(0, meta.qid, False, False))

    def queue_deleted_by_shard(self, shard: int, qid: int) -> None:
        meta = self.queues_by_qid.get(qid)
        if meta is not None and meta.shard == shard and self.authority:
            self.forget_queue(meta)

    def forget_transient(self, shard: int) -> None:
        """A shard died: its transient queues died with it (durable ones come back
        from its store). Gateway 0 forgets them, the others replay that."""
        for vhost in self.vhosts.values() if self.authority else ():
            for meta in [m for m in vhost.queues.values()
                         if m.shard == shard and not m.spec.stored]:
                self.forget_queue(meta)

    # -- exchanges and bindings ----------------------------------------------------

    def add_exchange(self, exchange: Exchange) -> None:
        self.vhosts[exchange.vhost].exchanges[exchange.name] = exchange
        self._set_exchange_policy(exchange)
        if exchange.durable:
            self.meta.put_exchange(changes.exchange_def(exchange))
        self.forward(changes.ExchangePut(changes.exchange_def(exchange)))

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
        self.forward(changes.ExchangeDeleted(exchange.vhost, exchange.name))

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
        self.forward(changes.BindingDeleted(changes.binding_def(
            exchange, destination, routing_key, arguments)))
        if auto_delete and exchange.auto_delete and not exchange.bindings:
            self.delete_exchange(exchange)

    def add_binding(self, vhost: VHost, exchange: Exchange, destination: tuple,
                    routing_key: str, arguments: dict) -> bool:
        if not exchange.bind(destination, routing_key, arguments):
            return False
        vhost.inbound.setdefault(destination, set()).add(
            (exchange.name, routing_key, arguments_key(arguments)))
        self.forward(changes.BindingPut(changes.binding_def(
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

    # -- routing -----------------------------------------------------------------

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
