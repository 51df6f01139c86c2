"""The replica groups' elections on etcd: the I/O shell around groups.py.

`Elections` keeps a view of every group's keys (one range, then a watch on
`PREFIX/groups/`), campaigns for the groups this node joined as groups.py
decides, writes the in-sync sets of the groups it leads, and tells the node
every change of its role in a group through `on_role(vhost, name, role)`.
While etcd is unreachable it keeps the last view and retries with back-off:
nothing it runs raises into its caller, and whatever it has not written is
decided by etcd's compares once it is back, so a stale view costs time, never
a second leader."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from . import groups as g
from . import layout as lay
from .etcd import (
    Compare,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    Op,
    TxnResult,
    Watch,
    WatchEvent,
)

log = logging.getLogger("warren")

RETRY_MIN = 0.1  # seconds before a failed call to etcd is tried again, doubling up to the max
RETRY_MAX = 2.0

Group = tuple[str, str]  # (vhost, name)
T = TypeVar("T")


class Elections:
    """This node's (`me`) elections. `lease` is its lease's id, `running()`
    the names of the nodes running now."""

    def __init__(self, etcd: Etcd, layout: lay.Layout, me: str, lease: int,
                 running: Callable[[], Collection[str]],
                 on_role: Callable[[str, str, g.Role], None],
                 on_leader: Callable[[str, str], None] = lambda vhost, name: None):
        self.etcd = etcd
        self.layout = layout
        self.me = me
        self.lease = lease
        self.running = running
        self.on_role = on_role
        # every group's leader change, a member's or not (where clients go now)
        self.on_leader = on_leader
        self.views: dict[Group, g.GroupView] = {}
        self._campaigns: dict[Group, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._watch: Watch | None = None
        self._watch_down = False  # told once, until events flow again

    # -- start and stop ------------------------------------------------------------

    async def start(self) -> None:
        """Loads every group (retrying until etcd answers), then watches them."""
        revision = await _retrying(self._load)
        self._watch = self.etcd.watch(self.layout.groups, revision + 1, self._changed,
                                      self._watch_failed, self._compacted)

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.cancel()
        for task in [*self._campaigns.values(), *self._tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _load(self) -> int:
        """Every group's keys as they are now; the revision read at."""
        kvs, revision = await self.etcd.range(self.layout.groups)
        found: dict[Group, dict[str, KeyValue]] = {}
        for kv in kvs:
            where = self.layout.group_of(kv.key)
            if where is not None:
                found.setdefault(where[:2], {})[where[2]] = kv
        for group in set(self.views) | set(found):
            keys = found.get(group, {})
            self._forget_stale(keys.get("leader"))
            self._update(group, g.reloaded, keys.get("leader"), keys.get("isr"), revision,
                         self.lease)
        return revision

    async def _compacted(self, revision: int) -> int:
        return await self._load()

    def _watch_failed(self, error: Exception) -> None:
        if not self._watch_down:
            log.warning("lost the watch on the replica groups (%s); keeping the last view",
                        error)
        self._watch_down = True

    def _changed(self, events: list[WatchEvent], revision: int) -> None:
        self._watch_down = False
        for event in events:
            where = self.layout.group_of(event.kv.key)
            if where is None:
                continue
            deleted = event.type == "DELETE"
            if where[2] == "leader" and not deleted:
                self._forget_stale(event.kv)
            self._update(where[:2], g.applied, where[2], event.kv, deleted, self.lease)

    # -- membership ----------------------------------------------------------------

    def join(self, vhost: str, name: str, members: Collection[str]) -> None:
        """This node is a member of the group: it follows it and may lead it."""
        self._update((vhost, name), g.joined, tuple(members))

    def leave(self, vhost: str, name: str) -> None:
        """No longer a member: no more roles told, no campaigns; if it leads, it
        steps down (its leader key deleted, fenced by its epoch)."""
        group = (vhost, name)
        view = self.views.get(group)
        if view is None:
            return
        task = self._campaigns.pop(group, None)
        if task is not None:
            task.cancel()
        if isinstance(view.role, g.Leading):
            self._spawn(self._step_down(view.leader_key, view.role.epoch))
        self._keep(group, g.left(view))

    async def _step_down(self, key: bytes, epoch: int) -> None:
        await _retrying(lambda: self.etcd.txn([Compare.create_revision(key, "=", epoch)],
                                              [Op.delete(key)]))

    def nodes_changed(self) -> None:
        """The running nodes changed: who should campaign may have too."""
        for group in list(self.views):
            self._consider(group)

    def lease_lost(self) -> None:
        """This node's lease is gone (or may be): it leads nowhere now."""
        self.lease = 0
        for group in list(self.views):
            self._update(group, g.resigned)

    def lease_granted(self, lease: int) -> None:
        """Its new lease, to campaign with."""
        self.lease = lease
        self.nodes_changed()

    # -- writes --------------------------------------------------------------------

    async def create_group(self, vhost: str, name: str, members: Collection[str]) -> bool:
        """Writes a new group's first in-sync set (every member, epoch 0); False
        if the group exists (as after a retry of a write etcd had applied before
        its answer was lost: either way, the group is there). Retries until etcd
        answers."""
        view = self._view((vhost, name))
        compares, success = g.creation(view, members)
        result = await _retrying(lambda: self.etcd.txn(compares, success))
        if result.succeeded:
            self._update((vhost, name), g.isr_put, lay.InSync(list(members), 0),
                         result.revision)
        return result.succeeded

    async def delete_group(self, vhost: str, name: str) -> None:
        """Deletes both keys: its leader is told it is deposed. Retries until
        etcd answers."""
        view = self._view((vhost, name))
        await _retrying(lambda: self.etcd.txn([], [Op.delete(view.leader_key),
                                                   Op.delete(view.isr_key)]))

    async def set_in_sync(self, vhost: str, name: str, nodes: Collection[str]) -> bool:
        """Writes the group's in-sync set as its leader; False once this node is
        not (or no longer) its leader. Retries until one or the other is known."""
        group = (vhost, name)
        delay = RETRY_MIN
        while True:
            write = g.in_sync_write(self._view(group), nodes)
            if write is None:
                return False
            try:
                result = await self.etcd.txn(*write)
            except (EtcdUnavailable, EtcdError) as error:
                if delay == RETRY_MIN:
                    log.warning("cannot write the in-sync set of %s in %s (%s); trying again",
                                name, vhost, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if result.succeeded:
                self._update(group, g.in_sync_written, tuple(nodes), result.revision)
                return True
            self._read_back(group, result)
            return False

    # -- campaigns -----------------------------------------------------------------

    def _consider(self, group: Group) -> None:
        going = self._campaigns.get(group)
        if going is not None and not going.done():
            return
        view = self.views.get(group)
        if view is not None and g.campaign(view, self.me, self.running(), self.lease):
            task = asyncio.get_running_loop().create_task(self._campaign(group))
            self._campaigns[group] = task
            task.add_done_callback(lambda done: self._campaigns.get(group) is done
                                   and self._campaigns.pop(group))

    async def _campaign(self, group: Group) -> None:
        """Campaigns for as long as groups.py says: after the candidate's delay,
        once, then again at once after a lost race that left no leader."""
        waited = False
        delay = RETRY_MIN
        while True:
            view = self.views.get(group)
            decision = None if view is None else g.campaign(view, self.me, self.running(),
                                                            self.lease)
            if decision is None:
                return
            if decision.delay and not waited:
                waited = True
                await asyncio.sleep(decision.delay)
                continue
            try:
                result = await self.etcd.txn(decision.compares, decision.success,
                                             decision.failure)
            except (EtcdUnavailable, EtcdError) as error:
                if delay == RETRY_MIN:
                    log.warning("cannot campaign for %s in %s (%s); trying again", group[1],
                                group[0], error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            if result.succeeded:
                self._update(group, g.won, result.revision)
            else:
                self._read_back(group, result)

    def _read_back(self, group: Group, result: TxnResult) -> None:
        """A failed transaction's reads of the group's two keys, into its view."""
        leader, isr = (kvs[0] if kvs else None for kvs in result.responses)
        self._forget_stale(leader)
        self._update(group, g.reloaded, leader, isr, result.revision, self.lease)

    # -- the views -----------------------------------------------------------------

    def _view(self, group: Group) -> g.GroupView:
        view = self.views.get(group)
        if view is None:
            view = self.views[group] = g.GroupView(self.layout.group_leader(*group),
                                                   self.layout.group_isr(*group))
        return view

    def _forget_stale(self, kv: KeyValue | None) -> None:
        """An earlier run of this node's leader key: its lease goes now (with it
        every key that run left), so the group elects at once, not a TTL later."""
        if kv is not None and g.stale(kv, self.me, self.lease):
            self._spawn(self._revoke(kv.lease))

    async def _revoke(self, lease: int) -> None:
        try:
            await self.etcd.revoke(lease)
        except (EtcdUnavailable, EtcdError):
            pass  # it runs out by itself within its TTL

    def _update(self, group: Group, change: Callable[..., g.Change], *args: Any) -> None:
        """Applies a change of groups.py (`change(view, me, *args)`) to a group's
        view, tells the roles it gives, and campaigns if it should now."""
        before = self._view(group)
        view, roles = change(before, self.me, *args)
        self._keep(group, view)
        if view.leader != before.leader:
            try:
                self.on_leader(*group)
            except Exception:
                log.exception("a replica group's leader change failed")
        for role in roles:
            try:
                self.on_role(group[0], group[1], role)
            except Exception:  # the caller's bug: its group, not every group's elections
                log.exception("a replica group's role change failed")
        if view.members:
            self._consider(group)

    def _keep(self, group: Group, view: g.GroupView) -> None:
        if view.members or view.leader or view.in_sync is not None:
            self.views[group] = view
        else:  # a deleted group this node is no member of: forgotten
            del self.views[group]

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`'s result, tried again with back-off while etcd cannot answer."""
    delay = RETRY_MIN
    while True:
        try:
            return await call()
        except (EtcdUnavailable, EtcdError) as error:
            if delay == RETRY_MIN:
                log.warning("etcd did not answer about the replica groups (%s); trying again",
                            error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
