"""Replica groups' elections as one node sees them (pure): what it knows of each
group's keys in etcd, the transactions it sends, and the role each change of
those keys gives it. election.py is the I/O around it.

A group's `leader` key holds its leader's name under that node's lease; the
transaction that creates it compares the key's absence and the in-sync key's
mod_revision with the one the candidate read, so only a node in the in-sync
set as it stands can win, and its create_revision is the leader's epoch: a
fencing token that only grows. The `isr` key is written by the leader alone,
by a transaction that compares the leader key's create_revision with its
epoch, so a deposed leader's write fails.

Every change a view takes carries the revision etcd made it at, and a view
ignores a change older than what it has of that key: the node learns a key
from its own transactions and from reads as well as from its watch, which
lags them."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from . import layout as lay
from .etcd import Compare, KeyValue, Op, Wire

RANK_DELAY = 0.5  # seconds a candidate waits per in-sync member preferred before it


@dataclass(frozen=True)
class Leading:
    """This node leads the group in `epoch`."""

    epoch: int


@dataclass(frozen=True)
class Following:
    leader: str
    epoch: int


@dataclass(frozen=True)
class NoLeader:
    """No leader this node may follow: none elected, or its own stale key."""


@dataclass(frozen=True)
class Deposed:
    """This node led in `epoch` and no longer does: stop confirming at once.
    The role it has now follows in the same change."""

    epoch: int


Role = Leading | Following | NoLeader | Deposed


@dataclass(frozen=True)
class GroupView:
    """What this node knows of one group. `leader_revision` and `isr_revision`
    are the revisions it has each key at: the key's mod_revision while it
    exists, the revision its deletion (or a read finding it absent) was at."""

    leader_key: bytes
    isr_key: bytes
    members: tuple[str, ...] = ()  # empty: this node is no member (not joined)
    leader: str = ""  # "" none
    epoch: int = 0  # the newest leader's, kept once its key is gone
    leader_revision: int = 0
    in_sync: tuple[str, ...] | None = None  # None: no isr key
    isr_revision: int = 0
    isr_epoch: int = 0  # the epoch of the leader that wrote the in-sync set
    role: Role = NoLeader()
    resigned: int = 0  # an epoch this node led in until its lease was lost


@dataclass(frozen=True)
class Campaign:
    """Campaign after `delay` seconds with this transaction (if the view still
    says so then)."""

    delay: float
    compares: list[Wire]
    success: list[Wire]
    failure: list[Wire]


Change = tuple[GroupView, list[Role]]


def role_of(view: GroupView, me: str) -> Role:
    if not view.leader or (view.leader == me and view.epoch == view.resigned):
        return NoLeader()
    if view.leader == me:
        return Leading(view.epoch)
    return Following(view.leader, view.epoch)


def _retold(view: GroupView, me: str) -> Change:
    """The view with its role brought up to date, and the roles this node is told."""
    if not view.members:
        return view, []
    new = role_of(view, me)
    old = view.role
    if new == old:
        return view, []
    told: list[Role] = [Deposed(old.epoch), new] if isinstance(old, Leading) else [new]
    return replace(view, role=new), told


def leader_put(view: GroupView, me: str, node: str, epoch: int, revision: int) -> Change:
    """The leader key written (at `revision`, created at `epoch`)."""
    if revision <= view.leader_revision or epoch < view.epoch:
        return view, []
    return _retold(replace(view, leader=node, epoch=epoch, leader_revision=revision), me)


def leader_deleted(view: GroupView, me: str, revision: int) -> Change:
    if revision <= view.leader_revision:
        return view, []
    return _retold(replace(view, leader="", leader_revision=revision), me)


def isr_put(view: GroupView, me: str, in_sync: lay.InSync, revision: int) -> Change:
    if revision <= view.isr_revision:
        return view, []
    return _retold(replace(view, in_sync=tuple(in_sync.nodes), isr_epoch=in_sync.epoch,
                           isr_revision=revision), me)


def isr_deleted(view: GroupView, me: str, revision: int) -> Change:
    if revision <= view.isr_revision:
        return view, []
    return _retold(replace(view, in_sync=None, isr_epoch=0, isr_revision=revision), me)


def stale(kv: KeyValue, me: str, lease: int) -> bool:
    """A leader key of this node's name under another lease: an earlier run of this
    node (killed before its lease ran out) led, and this run must not take that
    epoch for its own: its log may lack what that run had sent."""
    return bool(lease) and kv.lease != lease and lay.decode_leader(kv.value).node == me


def applied(view: GroupView, me: str, field: str, kv: KeyValue, deleted: bool,
            lease: int = 0) -> Change:
    """A watch event on the group's `field` ("leader" or "isr") key; `lease`, this
    node's."""
    if field == "leader":
        if deleted:
            return leader_deleted(view, me, kv.mod_revision)
        node = "" if stale(kv, me, lease) else lay.decode_leader(kv.value).node
        return leader_put(view, me, node, kv.create_revision, kv.mod_revision)
    if deleted:
        return isr_deleted(view, me, kv.mod_revision)
    return isr_put(view, me, lay.decode_in_sync(kv.value), kv.mod_revision)


def reloaded(view: GroupView, me: str, leader: KeyValue | None, isr: KeyValue | None,
             revision: int, lease: int = 0) -> Change:
    """Both keys as read at `revision` (None: absent then)."""
    told: list[Role] = []
    if leader is None:
        view, roles = leader_deleted(view, me, revision)
    else:
        view, roles = applied(view, me, "leader", leader, False, lease)
    told += roles
    if isr is None:
        view, roles = isr_deleted(view, me, revision)
    else:
        view, roles = applied(view, me, "isr", isr, False)
    return view, told + roles


def joined(view: GroupView, me: str, members: Collection[str]) -> Change:
    """This node is a member of the group (in the catalogue's order)."""
    return _retold(replace(view, members=tuple(members)), me)


def left(view: GroupView) -> GroupView:
    return replace(view, members=(), role=NoLeader())


def resigned(view: GroupView, me: str) -> Change:
    """This node's lease is lost: whatever its leader key still says, it leads
    no more (the key goes with the lease, at the latest at its TTL)."""
    if not isinstance(view.role, Leading):
        return view, []
    return _retold(replace(view, resigned=view.role.epoch), me)


def preferred(view: GroupView, running: Collection[str]) -> list[str]:
    """The running in-sync members in the members' order: the first should lead."""
    in_sync = view.in_sync or ()
    return [node for node in view.members if node in in_sync and node in running]


def campaign(view: GroupView, me: str, running: Collection[str], lease: int) -> Campaign | None:
    """Whether this node should campaign now (None: not), and how."""
    if view.leader or not view.members or not lease or me not in running:
        return None
    if view.in_sync is None or me not in view.in_sync:
        return None
    candidates = preferred(view, running)
    if me not in candidates:
        return None
    return Campaign(
        candidates.index(me) * RANK_DELAY,
        [Compare.create_revision(view.leader_key, "=", 0),
         Compare.mod_revision(view.isr_key, "=", view.isr_revision)],
        [Op.put(view.leader_key, lay.encode_group(lay.Leader(me)), lease)],
        [Op.get(view.leader_key), Op.get(view.isr_key)])


def won(view: GroupView, me: str, revision: int) -> Change:
    """This node's campaign succeeded at `revision`: its epoch."""
    return leader_put(view, me, me, revision, revision)


def in_sync_write(view: GroupView, nodes: Collection[str]) -> tuple[list[Wire], list[Wire],
                                                                     list[Wire]] | None:
    """The fenced write of the in-sync set (compares, success, failure), None
    unless this node leads."""
    if not isinstance(view.role, Leading):
        return None
    epoch = view.role.epoch
    return ([Compare.create_revision(view.leader_key, "=", epoch)],
            [Op.put(view.isr_key, lay.encode_group(lay.InSync(list(nodes), epoch)))],
            [Op.get(view.leader_key), Op.get(view.isr_key)])


def in_sync_written(view: GroupView, me: str, nodes: Collection[str], revision: int) -> Change:
    epoch = view.role.epoch if isinstance(view.role, Leading) else view.epoch
    return isr_put(view, me, lay.InSync(list(nodes), epoch), revision)


def creation(view: GroupView, members: Collection[str]) -> tuple[list[Wire], list[Wire]]:
    """A new group's first in-sync set, every member, unless the group exists."""
    return ([Compare.create_revision(view.isr_key, "=", 0)],
            [Op.put(view.isr_key, lay.encode_group(lay.InSync(list(members), 0)))])
