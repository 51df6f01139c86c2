"""Replicated quorum queues in the root: the shell between the elections
(election.py), the catalogue's queue records and this node's shards.

A quorum queue declared in a cluster is a replica group (of one member or more,
as RabbitMQ's Raft groups). Every member node's root declares it to its own
shard (the same qid, on the shard its name places it on there), joins its
election and tells that shard each role the election gives it (ReplicaRole).
The shards' frames for one another go over the inter-node link as commands to
the other node's shard (in order: one connection per node pair carries them),
and a leader's wish for its in-sync set is written to etcd fenced by its epoch,
one write at a time per group. Clients follow the leader: the queue's route
here (QueueMeta.shard) is its leader's shard.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from warren.shards import records as r
from warren.storage.metastore import QueueDef

from ..broker import changes as c
from ..values import placement
from . import groups as g
from .election import Elections
from .etcd import Compare, EtcdError, EtcdUnavailable, Op
from .layout import QueueRecord, encode
from .members import group_members

log = logging.getLogger("warren")

DEFAULT_SIZE = 3  # members of a quorum queue without x-quorum-initial-group-size
LEADER_WAIT = 5.0  # seconds a declaration waits for its new group's first leader, at most


class Replicas:
    """The replica groups as node `node` (a ClusterNode) takes part in them."""

    def __init__(self, node):
        self.node = node
        self.elections: Elections | None = None
        self.names: dict[tuple[str, str], int] = {}  # (vhost, name) -> qid
        self.members: dict[int, tuple[str, ...]] = {}  # qid -> its members as handled here
        self.roles: dict[int, tuple[int, int]] = {}  # qid -> (ROLE_*, epoch) told our shard
        self._locks: dict[int, asyncio.Lock] = {}  # one in-sync write at a time per group
        self._led: dict[int, list[asyncio.Future]] = {}  # qid -> who waits for a leader
        self._leaving: dict[int, QueueRecord] = {}  # removed while leading: until replaced
        self._tasks: set[asyncio.Task] = set()

    @property
    def groups(self) -> dict[int, QueueRecord]:
        return self.node.sync.groups

    # -- start and stop ------------------------------------------------------------

    async def start(self, lease: int) -> None:
        """Once registered and the catalogue loaded: join the groups naming this node."""
        node = self.node
        self.elections = Elections(node.etcd, node.layout, node.name, lease,
                                   lambda: node.members.running, self._role, self._leader_changed)
        await self.elections.start()
        for record in list(self.groups.values()):
            if node.name in record.members:
                self.elections.join(*_group(record), record.members)
        for link in node.gateway.shards.local():
            self._sweep(link)

    async def stop(self) -> None:
        if self.elections is not None:
            await self.elections.stop()
        for task in list(self._tasks):
            task.cancel()

    # -- placement -----------------------------------------------------------------

    def place(self, spec, first: str) -> None:
        """A new quorum queue homed on `first`: its members, for its record."""
        members = self.node.members
        replicas: dict[str, int] = {}
        for record in self.groups.values():
            for name in record.members:
                replicas[name] = replicas.get(name, 0) + 1
        size = spec.arguments.get("x-quorum-initial-group-size", DEFAULT_SIZE)
        chosen = group_members(first, size, members.running, members.known, replicas)
        if chosen:
            self.node.sync.placed[(spec.vhost, spec.name)] = chosen

    def index_on(self, record: QueueRecord, node: str) -> int:
        """The index here of the queue's shard on member `node`."""
        spec = record.definition.spec
        members = self.node.members
        # (a member is a node met: its shards have their indexes and links here)
        return members.shard_of(node, placement(spec.vhost, spec.name, members.shards_on(node)))

    # -- the groups' records --------------------------------------------------------

    def on_group(self, record: QueueRecord, present: bool) -> None:
        """A replicated queue's record came (present) or went (deleted)."""
        qid = record.definition.qid
        group = _group(record)
        mine = self.node.name in record.members
        if not present:
            self.names.pop(group, None)
            self.members.pop(qid, None)
            self._locks.pop(qid, None)
            if mine or self._leaving.pop(qid, None) is not None:
                self._drop(record)
            return
        members = tuple(record.members)
        before = self.members.get(qid)
        if self.names.get(group) == qid and before == members:
            return
        self.names[group] = qid
        self.members[qid] = members
        was = before is not None and self.node.name in before
        if mine and not was:
            self._declare(record)
        elif was and not mine:  # removed from the group: its rows go
            self._drop(record, removed=True)
        if mine and self.elections is not None:
            self.elections.join(*group, record.members)
            if was and qid in self.roles:  # the members changed: our shard hears of it
                self._spawn(self._regroup(record))
        self.route(qid)

    def _drop(self, record: QueueRecord, removed: bool = False) -> None:
        """No longer a member (the queue deleted, or this node removed)."""
        qid = record.definition.qid
        told = self.roles.pop(qid, None)
        if self.elections is not None:
            self.elections.leave(*_group(record))
        if removed and told is not None and told[0] == r.ROLE_LEADER:
            # Publishes reach our shard until another member leads: as a follower
            # it nacks them (a deleted queue would take them as unroutable).
            self._tell(record, r.ROLE_FOLLOWER, told[1])
            self._leaving[qid] = record
            return
        self._local_link(record).send(r.DeleteQueue(0, qid, False, False))

    async def _regroup(self, record: QueueRecord) -> None:
        """Tell our shard the group's new members; as its leader, first write the
        in-sync set without the members removed, so that the commit index never
        rests on one (a deposed leader's write fails: its successor does it)."""
        qid = record.definition.qid
        group = _group(record)
        async with self._locks.setdefault(qid, asyncio.Lock()):
            view = self.elections.views.get(group)
            told = self.roles.get(qid)
            if view is None or told is None:
                return
            if told[0] == r.ROLE_LEADER:
                in_sync = [name for name in view.in_sync or () if name in record.members]
                if view.role != g.Leading(told[1]) or (
                        len(in_sync) != len(view.in_sync or ())
                        and not await self.elections.set_in_sync(*group, in_sync)):
                    return
            if self.groups.get(qid) is record:  # (a later change tells its own)
                self._tell(record, *told)

    async def change_members(self, vhost: str, name: str, node: str, add: bool) -> str:
        """Add `node` to a replicated queue's members, or remove it: its record
        changed in etcd (compared with the revision seen here), each member's root
        acting on it as the watch brings it. "" when done (or nothing to do), else
        RabbitMQ's error: node_not_running, last_node."""
        qid = self.names.get((vhost, name))
        for _ in range(10):  # another change won the compare: again, on what it wrote
            record = self.groups.get(qid) if qid is not None else None
            if record is None:
                return "not_found"
            if add and node not in self.node.members.running:
                return "node_not_running"
            if (node in record.members) == add:
                return ""
            if not add and len(record.members) == 1:
                return "last_node"
            members = [*record.members, node] if add else \
                [member for member in record.members if member != node]
            sync = self.node.sync
            key = sync.queue_keys[qid]
            changed = msgspec.structs.replace(record, members=members)
            try:
                result = await self.node.etcd.txn(
                    [Compare.mod_revision(key, "=", sync.revisions.get(key, 0))],
                    [Op.put(key, encode(changed))])
            except (EtcdUnavailable, EtcdError) as error:
                log.error("cannot change the members of %s in %s (%s)", name, vhost, error)
                return "etcd_unavailable"
            if result.succeeded:
                return ""
            await asyncio.sleep(0.1)  # the watch brings the change that won
        return "conflict"

    def _declare(self, record: QueueRecord) -> None:
        d = record.definition
        self._local_link(record).send(r.CreateQueue(0, d.qid, d.spec, self._arguments(d.qid,
                                                                                      d.spec)))

    def _arguments(self, qid: int, spec) -> dict:
        """The queue's arguments with its policy's, as its leader applies them."""
        meta = self.node.gateway.catalogue.queues_by_qid.get(qid)
        return meta.effective if meta is not None else spec.arguments

    def _local_link(self, record: QueueRecord):
        return self.node.gateway.shards[self.index_on(record, self.node.name)]

    async def created(self, records: list[QueueRecord]) -> None:
        """This node declared these groups (their records are in etcd): their
        keys made, and (bounded) until each has a leader, as RabbitMQ answers a
        declaration once the queue runs."""
        if self.elections is None:
            return
        waits = []
        for record in records:
            await self.elections.create_group(*_group(record), record.members)
            qid = record.definition.qid
            # (a node that is no member hears of no role, nor of the leader)
            if self.node.name in record.members and not self._leader(record):
                done = asyncio.get_running_loop().create_future()
                self._led.setdefault(qid, []).append(done)
                waits.append(done)
        if waits:
            await asyncio.wait(waits, timeout=LEADER_WAIT)

    def deleted(self, records: list[QueueRecord]) -> None:
        """This node deleted these groups' queues: their keys go."""
        if self.elections is not None:
            for record in records:
                self._spawn(self.elections.delete_group(*_group(record)))

    # -- roles and routes -------------------------------------------------------------

    def _leader(self, record: QueueRecord) -> str:
        view = self.elections.views.get(_group(record)) if self.elections else None
        return view.leader if view is not None else ""

    def route(self, qid: int) -> None:
        """The queue's route here: its leader's shard (kept while it has none: the
        old leader's node, if down, refuses what is sent to it)."""
        record = self.groups.get(qid)
        meta = self.node.gateway.catalogue.queues_by_qid.get(qid)
        if record is None or meta is None:
            return
        leader = self._leader(record)
        if leader:
            shard = self.index_on(record, leader)
            if shard != meta.shard:
                meta.shard = shard
                gateway = self.node.gateway
                gateway.epoch += 1  # the routes channels remember are stale
                if gateway.followers is not None:  # the other gateway processes' too
                    gateway.followers.add(c.QueuePut(QueueDef(meta.spec, qid, shard), 0))
            for done in self._led.pop(qid, ()):
                if not done.done():
                    done.set_result(None)

    def shown(self, qid: int) -> dict | None:
        """For the management API, as RabbitMQ shows a quorum queue (None for any
        other queue): its leader (None while it has none), its members and those
        whose node runs; and Warren's in_sync, the in-sync set as etcd holds it."""
        record = self.groups.get(qid)
        if record is None:
            return None
        running = self.node.members.running
        view = self.elections.views.get(_group(record)) if self.elections else None
        return {"leader": self._leader(record) or None, "members": list(record.members),
                "online": [name for name in record.members if name in running],
                "in_sync": [name for name in record.members
                            if view is not None and name in (view.in_sync or ())]}

    def _leader_changed(self, vhost: str, name: str) -> None:
        """Any group's leader changed: clients here go to the new one (a node that
        is no member hears no role, only this)."""
        qid = self.names.get((vhost, name))
        if qid is None:
            return
        leaving = self._leaving.get(qid)
        if leaving is not None and self._leader(leaving) not in ("", self.node.name):
            del self._leaving[qid]  # replaced: our rows go
            self._local_link(leaving).send(r.DeleteQueue(0, qid, False, False))
        self.route(qid)

    def _role(self, vhost: str, name: str, role: g.Role) -> None:
        """The elections: this node's role in a group changed."""
        qid = self.names.get((vhost, name))
        record = self.groups.get(qid) if qid is not None else None
        if record is None:
            return
        kind = type(role)
        if kind is g.Leading:
            told = (r.ROLE_LEADER, role.epoch)
        elif kind is g.Following or kind is g.Deposed:
            # (deposed: a follower of its own epoch until it hears of the next)
            told = (r.ROLE_FOLLOWER, role.epoch)
        else:
            told = None
        if told is not None:
            self.roles[qid] = told
            self._tell(record, *told)
            if kind is g.Leading:  # a policy changed since its record was declared here
                self._local_link(record).send(r.ConfigureQueue(
                    qid, self._arguments(qid, record.definition.spec)))
        self.route(qid)

    def _tell(self, record: QueueRecord, role: int, epoch: int) -> None:
        view = self.elections.views.get(_group(record)) if self.elections else None
        in_sync = list(view.in_sync or ()) if view is not None else []
        self._local_link(record).send(r.ReplicaRole(record.definition.qid, role, epoch,
                                                    list(record.members), in_sync,
                                                    self.node.name))

    def link_up(self, link) -> None:
        """A link to another node's shard is back: the followers of its groups
        there say hello again."""
        node = getattr(link, "node", None)
        for qid, (role, epoch) in list(self.roles.items()):
            record = self.groups.get(qid)
            if role == r.ROLE_FOLLOWER and record is not None and self._leader(record) == node \
                    and self.index_on(record, node) == link.index:
                self._tell(record, role, epoch)

    def shard_started(self, link) -> None:
        """One of this node's shards runs again: its groups declared and told again."""
        for qid, record in list(self.groups.items()):
            if self.node.name in record.members and \
                    self.index_on(record, self.node.name) == link.index:
                self._declare(record)
                if qid in self.roles:
                    self._tell(record, *self.roles[qid])
        if self.elections is not None:  # (at the node's start: once the catalogue is in)
            self._sweep(link)

    def _sweep(self, link) -> None:
        """A shard's rows of queues the cluster no longer has there, deleted: a group
        this node was removed from, or a queue deleted, while it was down (the member
        removed or the queue deleted while it runs deletes them at once). Every
        queue a shard holds is in the catalogue before the shard has it, and out of
        it before the shard deletes it, so the rest are left behind."""
        catalogue = self.node.gateway.catalogue

        def swept(reply) -> None:
            if type(reply) is not r.QueueInfoReply:
                return  # the shard is down: swept when it starts again
            for qid in [row[0] for row in reply.queues] + reply.followed:
                record = self.groups.get(qid)
                if record is None:
                    kept = qid in catalogue.queues_by_qid
                else:
                    kept = self.node.name in record.members or qid in self._leaving
                if kept:
                    continue
                log.info("queue %d's rows in shard %d deleted: its queue is gone or has no "
                         "member here", qid, link.index)
                link.send(r.DeleteQueue(0, qid, False, False))

        link.request(lambda req: r.QueueInfo(req, []), swept)

    # -- what the shards send ------------------------------------------------------------

    def from_shard(self, link, event) -> None:
        """A ReplicaFrame (to another member's shard) or an InSyncProposal."""
        record = self.groups.get(event.qid)
        if record is None:
            return
        if type(event) is r.ReplicaFrame:
            if event.node in record.members and event.node != self.node.name:
                self.node.gateway.shards[self.index_on(record, event.node)].send(
                    r.ReplicaFrame(event.qid, self.node.name, event.payload))
        elif type(event) is r.InSyncProposal:
            self._spawn(self._write_in_sync(link, record, event))

    async def _write_in_sync(self, link, record: QueueRecord, event) -> None:
        group = _group(record)
        async with self._locks.setdefault(event.qid, asyncio.Lock()):
            view = self.elections.views.get(group) if self.elections else None
            ok = view is not None and view.role == g.Leading(event.epoch) and \
                await self.elections.set_in_sync(*group, event.nodes)
            view = self.elections.views.get(group) if self.elections else None
            nodes = list(view.in_sync or ()) if view is not None else []
        link.send(r.InSyncWritten(event.qid, event.epoch, nodes, ok))

    # -- the node's news ------------------------------------------------------------------

    def nodes_changed(self) -> None:
        if self.elections is not None:
            self.elections.nodes_changed()

    def lease_lost(self) -> None:
        if self.elections is not None:
            self.elections.lease_lost()

    def lease_granted(self, lease: int) -> None:
        if self.elections is not None:
            self.elections.lease_granted(lease)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _group(record: QueueRecord) -> tuple[str, str]:
    spec = record.definition.spec
    return spec.vhost, spec.name
