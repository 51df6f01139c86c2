"""This node in the cluster: the I/O shell around the catalogue's sync
(sync.py) and the members' view (members.py), in the root process.

It registers the node under a lease, keeps the catalogue and the list of
running nodes in step with etcd through two watches, and turns the
catalogue's changes made here into one transaction per loop turn. A client's
declaration is answered once its transaction is in etcd (session/declaring.py
asks `request`), so whichever node the client asks next has it or, watching
etcd, is about to: a node applies what it watches in revision order, and a
command that reads the catalogue reads it as of the last revision applied.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Callable

from warren.shards import records as r
from warren.storage.metastore import MetaStore

from ..amqp import spec
from ..broker import changes as c
from ..errors import AMQPError
from ..values import QueueMeta, placement
from . import layout as lay
from .etcd import Compare, Etcd, EtcdError, EtcdUnavailable, KeyValue, Lease, Op
from .joining import ClusterError, never_reuse_ids, shared_secret, take_number
from .members import Members
from .peers import Peers, view_of
from .quorum import Replicas
from .relay import Relay
from .sync import CatalogueSync
from .wire import Identity

log = logging.getLogger("warren")

START_WAIT = 60.0  # seconds a starting node waits for etcd before giving up
SEEN_WAIT = 2.0  # seconds a change waits for the other nodes to apply it, at most
CONFLICT = "conflict"  # a transaction lost to another node's change: run the command again


class ClusterNode:
    def __init__(self, gateway, config):
        self.gateway = gateway
        self.config = config
        self.name = config.node_name or f"warren@{socket.gethostname()}"
        self.layout = lay.Layout(config.cluster_prefix)
        self.members = Members(self.name, gateway.shards.count)
        self.replicas = Replicas(self)
        self.sync = CatalogueSync(self.layout, self.name, self.members.locate,
                                  self.members.shard_of, self.replicas.on_group)
        self.etcd = Etcd(config.cluster)
        self.number = 0
        self.secret = b""
        self.applying = False  # replaying etcd's changes: not recorded back
        self.available = False  # etcd answers (watch up, lease held)
        self._loop = asyncio.get_running_loop()
        self._commit_soon = False
        self._committing = False
        self._recovering = False
        self._told = None  # the view the other gateway processes have
        self._seen_waiters: list[tuple[int, Callable[[], None]]] = []  # when_seen's
        self._waiters: list[Callable] = []  # answer once the next transaction is in
        self._lease: Lease | None = None
        self._watches: list = []
        self._tasks: set[asyncio.Task] = set()

    # -- start and stop ------------------------------------------------------------

    async def start(self, amqp_address: str, management: str,
                    server_tls: ssl.SSLContext | None = None,
                    client_tls: ssl.SSLContext | None = None) -> None:
        """Join: wait for etcd, take a number, open the inter-node link, register,
        load the catalogue."""
        deadline = self._loop.time() + START_WAIT
        while True:
            try:
                self.number = await take_number(self.etcd, self.layout, self.name)
                break
            except (EtcdUnavailable, EtcdError) as error:
                if self._loop.time() > deadline:
                    raise ClusterError(f"cannot reach etcd at {','.join(self.config.cluster)} "
                                       f"({error}): start etcd or fix --cluster") from None
                log.warning("waiting for etcd at %s (%s)", ",".join(self.config.cluster), error)
                await asyncio.sleep(1.0)
        self.secret = self.config.cluster_secret.encode() or await shared_secret(self.etcd, self.layout)
        g = self.gateway
        g.catalogue.qid_base = self.number << 52
        slot = self.config.ring_pairs() - 1
        self.relay = Relay(self.secret, slot, [link.rings_for(slot) if link.alive else None
                                               for link in g.shards.links], ssl=server_tls)
        try:
            await self.relay.start(self.config.bind, self.config.link_port())
        except OSError as error:
            raise ClusterError(f"cannot listen on {self.config.bind}:"
                               f"{self.config.link_port()} for the other nodes "
                               f"({error.strerror}): pick another port with "
                               f"--cluster-port") from None
        self.relay.when_seen = self.when_seen
        self.relay.on_reply = self._reply_here
        link_address = self.config.advertise or f"{self.config.bind}:{self.relay.port}"
        self.peers = Peers(self.members, g.shards.links, Identity(self.name, self.number, g.index),
                           self.secret, g._on_events, g._shard_lost, self._remote_up,
                           g.down_shards.add, ssl=client_tls)
        g.node_number, g.peers = self.number, self.peers
        nodes, revision = await self.etcd.range(self.layout.nodes)
        for kv in nodes:
            self.members.joined(lay.decode_node(kv.value))
        self.info = lay.NodeInfo(self.name, self.number, link_address, amqp_address,
                                 management, self.members.local_shards, time.time())
        await self._register()
        await self._reload()
        never_reuse_ids(self.gateway.catalogue, self.number)
        self._declare_own_queues()
        self._adopt_links()
        await self._forget_own_transient()
        if not any(self.layout.kind_of(k) == "vhost" for k in self.sync.values):
            self._defaults()
            await self._flush()
        g.dispatcher.replication = self.replicas.from_shard
        await self.replicas.start(self._lease.id)
        self._watches.append(self.etcd.watch(self.layout.nodes, revision + 1,
                                             self._nodes_changed, self._watch_failed,
                                             self._nodes_compacted))
        self._watches.append(self.etcd.watch(
            self.layout.catalogue, self.sync.revision + 1, self._catalogue_changed,
            self._watch_failed, self._compacted))
        self.available = True
        log.info("node %s (number %d) joined the cluster at %s: %d nodes running", self.name,
                 self.number, ",".join(self.config.cluster), len(self.members.running))

    async def stop(self) -> None:
        await self.replicas.stop()
        for watch in self._watches:
            await watch.cancel()
        if self._committing or self.sync.pending():
            await self._wait_committed(5.0)
        if self._lease is not None:
            await self._lease.stop()  # revoked: the others see this node leave at once
        await self.peers.stop()
        await self.relay.stop()
        await self.etcd.close()

    def _reply_here(self, reply) -> None:
        """A direct reply from another node to a reply-to address of this one's:
        to the gateway process whose channel it names."""
        g = self.gateway
        if reply.gateway == g.index:
            g.deliver_reply(reply)
        elif g.followers is not None:
            g.followers.pass_reply(reply)

    # -- this node's shards, for the relay -----------------------------------------

    def shard_started(self, link) -> None:
        slot = self.config.ring_pairs() - 1
        self.relay.shard_restarted(link.index, link.rings_for(slot))
        self.replicas.shard_started(link)

    def shard_lost(self, link) -> None:
        self.relay.shard_lost(link.index)

    async def _register(self) -> None:
        self._lease = await Lease.grant(self.etcd, self.config.cluster_lease_ttl,
                                        self._lease_lost)
        await self.etcd.put(self.layout.node(self.name), lay.encode_node(self.info),
                            lease=self._lease.id)
        self.members.joined(self.info)

    def _lease_lost(self) -> None:
        """etcd has (or may have) dropped this node: register again when it answers."""
        log.error("lost this node's registration in etcd; registering again")
        self._lease = None
        self.replicas.lease_lost()
        self._unavailable()
        self._spawn(self._register_again())

    async def _register_again(self) -> None:
        while True:
            try:
                await self._register()
                self.replicas.lease_granted(self._lease.id)
                return
            except (EtcdUnavailable, EtcdError):
                await asyncio.sleep(1.0)

    # -- the catalogue -------------------------------------------------------------

    def record(self, change) -> None:
        """A change made here (Gateway._changed), for this turn's transaction."""
        self.sync.record(change)
        if not self._commit_soon:
            self._commit_soon = True
            self._loop.call_soon(self._start_commit)

    def refusal(self, doing: str = "change the catalogue") -> AMQPError | None:
        """Why the catalogue cannot change now (etcd unreachable), else None: as
        RabbitMQ's nodes answer when their metadata store has no quorum."""
        if self.available:
            return None
        return AMQPError(spec.INTERNAL_ERROR, f"Could not {doing} on node '{self.name}' "
                         "because the metadata store operation timed out")

    def caught_up(self) -> bool:
        return not self._committing and not self.sync.pending() and not self._commit_soon

    def request(self, make, callback: Callable) -> None:
        """Call `callback(outcome)` once the changes made so far are in etcd: None,
        CONFLICT (another node's change won: the catalogue is etcd's again), or the
        AMQPError to answer with."""
        self._waiters.append(callback)
        if not self._commit_soon and not self._committing:
            self._commit_soon = True
            self._loop.call_soon(self._start_commit)

    def _start_commit(self) -> None:
        self._commit_soon = False
        if self._committing:
            return  # the next one starts when this one ends
        txn = self.sync.take_txn()
        waiters, self._waiters = self._waiters, []
        if not txn.compares:
            for callback in waiters:
                callback(None)
            return
        self._committing = True
        self._spawn(self._commit(txn, waiters))

    async def _commit(self, txn, waiters: list) -> None:
        outcome: object = None
        # (read first: the watch may bring this very deletion back before the answer)
        gone = self.sync.groups_at(txn.deletes)
        try:
            result = await self.etcd.txn(
                [Compare.mod_revision(key, "=", revision) for key, revision in txn.compares],
                [Op.put(key, lay.encode(record)) for key, record in txn.puts.items()]
                + [Op.delete(key) for key in txn.deletes])
            if result.succeeded:
                self.sync.committed(txn, result.revision)
                await self._created_in_shards(txn)
                self.replicas.deleted(gone)
                await self.replicas.created([record for record in txn.puts.values()
                                             if type(record) is lay.QueueRecord
                                             and record.members])
                await self._seen_everywhere(result.revision)
            else:
                outcome = CONFLICT
                self._undo_created(txn)
                await self._reload()
        except (EtcdUnavailable, EtcdError) as error:
            log.error("cannot write the catalogue to etcd (%s)", error)
            self._unavailable()
            outcome = self.refusal()
            self._undo_created(txn)
        finally:
            self._committing = False
        for callback in waiters:
            try:
                callback(outcome)
            except Exception:  # a channel's own error closes that channel, there
                log.exception("a declaration's answer failed")
        if self.sync.pending() or self._waiters:
            self._start_commit()

    async def _created_in_shards(self, txn) -> None:
        """Until the shards of the queues this turn created have them: a command
        through another node reaches the shard by another path (its own link, or
        its own ring), which nothing orders behind this node's CreateQueue."""
        waits = []
        for record in txn.puts.values():
            if type(record) is lay.QueueRecord:
                link = self.gateway.shards[self.members.shard_of(record.node,
                                                                 record.definition.shard)]
                done = self._loop.create_future()
                link.request(r.Sync, lambda _reply, done=done: done.done() or done.set_result(None))
                waits.append(done)
        if waits:
            await asyncio.wait(waits, timeout=SEEN_WAIT)

    async def _seen_everywhere(self, revision: int) -> None:
        """Until every other running node's catalogue has applied `revision` (asked
        over the link: a node out of reach is not waited for), so a client told
        -ok here finds the change through any node next. Bounded: a node that
        cannot keep up is a slow node, not a stopped cluster."""
        asked = []
        for name in self.members.running:
            peer = self.peers.connections.get(name)
            if peer is None or name == self.name:
                continue
            done = self._loop.create_future()
            if peer.ask_seen(revision, lambda done=done: done.done() or done.set_result(None)):
                asked.append(done)
        if asked:
            await asyncio.wait(asked, timeout=SEEN_WAIT)

    def when_seen(self, revision: int, then: Callable[[], None]) -> None:
        """Another node asks: `then()` once the catalogue here is at `revision`."""
        if self.sync.revision >= revision:
            then()
        else:
            self._seen_waiters.append((revision, then))

    def _undo_created(self, txn) -> None:
        """Queues this turn created that etcd did not take: out of their shards."""
        catalogue = self.gateway.catalogue
        for key, record in txn.puts.items():
            if type(record) is lay.QueueRecord and key not in self.sync.values:
                meta = catalogue.queues_by_qid.get(record.definition.qid)
                if meta is not None:
                    self.gateway.shards[meta.shard].send(r.DeleteQueue(0, meta.qid, False, False))

    async def _wait_committed(self, timeout: float) -> None:
        deadline = self._loop.time() + timeout
        while not self.caught_up() and self._loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def _reload(self) -> None:
        """Make the catalogue etcd's: what differs is replayed (puts, then removals)."""
        kvs, revision = await self.etcd.range(self.layout.catalogue)
        g = self.gateway
        local = self.sync.local_records(c.snapshot(g.catalogue, g.access))
        todo = self.sync.reload([(kv.key, kv.value, kv.mod_revision) for kv in kvs], revision,
                                lay.decode, local)
        self._replay(todo)
        self._release_seen()

    def _unavailable(self) -> None:
        """etcd does not answer: serve what this node has, refuse changes to the
        catalogue, and catch up once it answers again."""
        self.available = False
        if not self._recovering:
            self._recovering = True
            self._spawn(self._reload_when_back())

    async def _reload_when_back(self) -> None:
        try:
            while True:
                await asyncio.sleep(1.0)
                try:
                    await self._reload()
                except (EtcdUnavailable, EtcdError):
                    continue
                if self._lease is not None:
                    self.available = True
                    log.warning("etcd is back: the catalogue is in step again")
                    return
        finally:
            self._recovering = False

    async def _compacted(self, revision: int) -> int:
        await self._reload()
        return self.sync.revision

    async def _nodes_compacted(self, revision: int) -> int:
        """The watch on the nodes missed what etcd compacted: read them again."""
        nodes, now = await self.etcd.range(self.layout.nodes)
        running = {info.name: info for info in map(lay.decode_node, (kv.value for kv in nodes))}
        for name in [n for n in self.members.running if n not in running]:
            self._nodes_changed([_Gone(self.layout.node(name))], now)
        for info in running.values():
            if self.members.joined(info) and info.name != self.name:
                self._adopt_links()
        return now

    def _catalogue_changed(self, events, revision: int) -> None:
        todo = []
        for event in events:
            kv = event.kv
            change = self.sync.observe(kv.key, None if event.type == "DELETE" else kv.value,
                                       kv.mod_revision, lay.decode)
            if change is not None:
                todo.append(change)
        # Applied up to the last event's revision: a response's header may be ahead
        # of events still to come; only an empty one (a progress notification)
        # says that nothing up to its revision is left.
        at = events[-1].kv.mod_revision if events else revision
        self.sync.revision = max(self.sync.revision, at)
        self._replay(todo)
        self._release_seen()

    def _release_seen(self) -> None:
        """Answer the other nodes waiting for a revision the catalogue is at now."""
        if self._seen_waiters:
            at = self.sync.revision
            ready = [then for wanted, then in self._seen_waiters if wanted <= at]
            self._seen_waiters = [w for w in self._seen_waiters if w[0] > at]
            for then in ready:
                then()

    def _replay(self, todo: list) -> None:
        self._adopt_links()  # indexes the changes name, made by observe()
        self.applying = True
        try:
            for change in todo:
                try:
                    self._apply(change)
                except Exception:
                    log.exception("could not apply a catalogue change from etcd: %r", change)
        finally:
            self.applying = False

    def _apply(self, change) -> None:
        g = self.gateway
        catalogue = g.catalogue
        kind = type(change)
        if kind is c.QueuePut:
            d = change.definition
            vhost = catalogue.vhosts.get(d.spec.vhost)
            if vhost is None:
                return
            existing = vhost.queues.get(d.spec.name)
            if existing is not None:
                # (a replicated queue's route is its leader's, not its home's)
                if existing.qid == d.qid and (existing.shard == d.shard
                                              or d.qid in self.sync.groups):
                    return
                catalogue.forget_queue(existing)
            c.apply(catalogue, g.access, g.registry.owner_of, change)
            # This node's store keeps its own queues; etcd the others'.
            if d.spec.stored and d.shard < self.members.local_shards:
                catalogue.meta.put_queue(d)
            self._adopt_links()
            self.replicas.route(d.qid)
            return
        if kind is c.QueueForgotten:
            meta = catalogue.queues_by_qid.get(change.qid)
            if meta is not None and meta.shard < self.members.local_shards:
                # Gone from the cluster (deleted through another node, which told
                # the shard too, or removed while this node was cut off): out of
                # the shard as well, so nothing is left behind there.
                g.shards[meta.shard].send(r.DeleteQueue(0, meta.qid, False, False))
        c.apply(catalogue, g.access, g.registry.owner_of, change)
        if kind is c.BindingPut and isinstance(catalogue.meta, MetaStore):
            vhost = catalogue.vhosts.get(change.definition.vhost)
            exchange = vhost.exchanges.get(change.definition.source) if vhost else None
            if exchange is not None and catalogue._durable_binding(
                    vhost, exchange, (change.definition.destination_type,
                                      change.definition.destination)):
                catalogue.meta.put_binding(change.definition)

    def _declare_own_queues(self) -> None:
        """The durable queues etcd homes on this node, declared to their shards
        again: one this node's store lacks (its data directory was wiped, or it
        stopped before the shard committed the queue) starts empty, where
        commands to it would otherwise find no queue; the others ignore it."""
        g = self.gateway
        for meta in g.catalogue.queues_by_qid.values():
            if meta.shard < self.members.local_shards and meta.spec.stored:
                link = g.shards[meta.shard]
                link.send(r.CreateQueue(0, meta.qid, meta.spec, meta.effective))
                link.send(r.ConfigureQueue(meta.qid, meta.effective))

    def _defaults(self) -> None:
        """A new cluster: RabbitMQ's default vhost and user, made by the first node."""
        g = self.gateway
        g.catalogue.add_vhost(self.config.default_vhost)
        g.access.ensure_default(self.config.default_user, self.config.default_pass,
                                self.config.default_vhost)

    async def _forget_own_transient(self) -> None:
        """Queues that died with this node's last run: transient ones homed here."""
        catalogue = self.gateway.catalogue
        for meta in [m for m in catalogue.queues_by_qid.values()
                     if not m.spec.stored and m.shard < self.members.local_shards]:
            catalogue.forget_queue(meta)
        if self.sync.pending():
            await self._flush()

    async def committed(self) -> object:
        """Once the changes made so far are in etcd: `request`'s outcome."""
        done = self._loop.create_future()
        self.request(None, lambda outcome: done.done() or done.set_result(outcome))
        return await done

    async def _flush(self) -> None:
        await self.committed()

    # -- members -----------------------------------------------------------------

    def _nodes_changed(self, events, revision: int) -> None:
        for event in events:
            name = lay.unq(event.kv.key[len(self.layout.nodes):])
            if event.type == "DELETE":
                if name == self.name:
                    continue  # our lease lapsed: _lease_lost registers again
                if self.members.left(name):
                    log.warning("node %s is down", name)
                    self.peers.lost(name)
                    self._tell_gateways()  # (told it is up again, they retry at once)
                    # What died with it is removed only if it stays gone and out of
                    # reach: an etcd that paused past every lease drops them all.
                    self._loop.call_later(self.config.cluster_lease_ttl, self._still_down,
                                          name)
            else:
                info = lay.decode_node(event.kv.value)
                if self.members.joined(info) and info.name != self.name:
                    log.info("node %s is up", info.name)
                    self._adopt_links()
        self.replicas.nodes_changed()

    def _still_down(self, name: str) -> None:
        peer = self.peers.connections.get(name)
        if name in self.members.running or (peer is not None and any(
                link.alive for link in peer.links)):
            return
        self._node_down(name)

    def _node_down(self, name: str) -> None:
        """What dies with a node: the exclusive queues its connections owned (each
        home node deletes its own), and its transient queues (the first running
        node removes them from the catalogue)."""
        catalogue = self.gateway.catalogue
        owners = self.sync.owners_of_node(name)
        for meta in list(catalogue.queues_by_qid.values()):
            owner = meta.owner
            if owner is not None and owner.id in owners \
                    and meta.shard < self.members.local_shards:
                catalogue.delete_queue(meta)
        running = self.members.running
        first = min(running, key=lambda n: running[n].number) if running else None
        if first == self.name:  # (none while this node's own lease is being renewed)
            for meta in list(catalogue.queues_by_qid.values()):
                if not meta.spec.stored and self.members.locate(meta.shard)[0] == name:
                    catalogue.forget_queue(meta)

    def _adopt_links(self) -> None:
        """Links for shards of other nodes met since the last call, here and in the
        node's other gateway processes."""
        self.peers.adopt()
        self._tell_gateways()

    def view(self):
        return view_of(self.members, self.number, self.secret)

    def _tell_gateways(self) -> None:
        """The other gateway processes hear of shard indexes and nodes before any
        change that names them (the control link keeps the order)."""
        followers = self.gateway.followers
        if followers is None:
            return
        view = self.view()
        if view != self._told:
            self._told = view
            followers.broadcast(view)

    def homes(self) -> dict[str, int]:
        """Queues per node, for placement."""
        counts: dict[str, int] = {}
        for meta in self.gateway.catalogue.queues_by_qid.values():
            node = self.members.locate(meta.shard)[0]
            counts[node] = counts.get(node, 0) + 1
        return counts

    def place(self, spec_) -> int:
        """The shard index here of a new queue: its node by the locator, its shard
        there by the queue's name (values.placement)."""
        arguments = spec_.arguments
        # An exclusive queue lives and dies with its connection: on its node, as
        # RabbitMQ places it whatever the locator.
        locator = "client-local" if spec_.exclusive else arguments.get(
            "x-queue-leader-locator") or arguments.get(
            "x-queue-master-locator") or self.config.queue_leader_locator
        node = self.members.place(spec_.vhost, spec_.name, locator, self.homes())
        if spec_.queue_type == "quorum":
            self.replicas.place(spec_, node)
        shard = placement(spec_.vhost, spec_.name, self.members.shards_on(node))
        index = self.members.shard_of(node, shard)
        self._adopt_links()
        return index

    def _remote_up(self, link) -> None:
        self.gateway.remote_up(link)
        self.replicas.link_up(link)

    def node_of(self, meta: QueueMeta) -> str:
        return self.members.locate(meta.shard)[0]

    def _watch_failed(self, error: Exception) -> None:
        if self.available:
            log.error("lost the watch on etcd (%s); serving what this node has", error)
        self._unavailable()

    def _spawn(self, coroutine) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Gone:
    """A node's registration found missing by a reload, as its watch event."""

    type = "DELETE"

    def __init__(self, key: bytes):
        self.kv = KeyValue(key)
