"""The catalogue's traffic with etcd, as a pure state machine.

The node's root changes its catalogue as it always has (broker/catalogue.py),
which reports each change as a record; here those records become a
transaction: one put or delete per key touched in a turn, each compared with
the revision this node last saw of that key, so a node that did not know of
another's change at that key loses the race (a queue declared twice at once
with different arguments is one queue, and one 406). The other way, etcd's
watch events become the records to replay on the catalogue, and a reload (at
start, after a lost race, after etcd compacted what the watch had not read)
becomes the difference between etcd's keys and the catalogue's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warren.storage.metastore import QueueDef

from ..broker import changes as c
from .layout import KINDS, Layout, QueueRecord, removal


@dataclass
class Txn:
    """One turn's changes as a transaction: `compares` (key, mod revision it must
    still have; 0: absent), `puts` (key -> record) and `deletes` (keys)."""

    compares: list[tuple[bytes, int]] = field(default_factory=list)
    puts: dict[bytes, object] = field(default_factory=dict)
    deletes: list[bytes] = field(default_factory=list)

    def keys(self) -> list[bytes]:
        return [key for key, _ in self.compares]


class CatalogueSync:
    """`node`: this node's name. `locate(shard)` -> (node, shard there) of a
    local shard index (a shard of this node or a link to another's);
    `shard_of(node, shard)` the other way."""

    def __init__(self, layout: Layout, node: str, locate, shard_of,
                 on_group=lambda record, present: None):
        self.layout = layout
        self.node = node
        self.locate = locate
        self.shard_of = shard_of
        self.revisions: dict[bytes, int] = {}  # key -> mod revision last seen
        self.values: dict[bytes, object] = {}  # key -> record last seen (etcd's view)
        self.queue_keys: dict[int, bytes] = {}  # qid -> its key, for QueueForgotten
        # Replicated quorum queues: qid -> their record (etcd's, or this node's new
        # one); on_group(record, present) hears each one come and go.
        self.groups: dict[int, QueueRecord] = {}
        self.placed: dict[tuple[str, str], list[str]] = {}  # a new queue's members, by name
        self.on_group = on_group
        self.revision = 0  # etcd's revision this view is at
        # Connections of other nodes owning exclusive queues: id here -> (id there, node)
        self.foreign: dict[int, tuple[int, str]] = {}
        self._foreign_ids: dict[tuple[int, str], int] = {}
        # key -> (record to put, None: delete; the key's revision when this node
        # changed it: another node's change seen meanwhile must fail the compare)
        self._pending: dict[bytes, tuple[object | None, int]] = {}

    # -- this node's changes ------------------------------------------------------

    def record(self, change) -> None:
        """A change the catalogue made here, for the next transaction."""
        kind = type(change)
        if kind is c.QueuePut:
            record = self._queue_record(change)
            key = self.layout.key_of(record)
            self.queue_keys[change.definition.qid] = key
            self._write(key, record)
        elif kind is c.QueueForgotten:
            forgotten = self.queue_keys.pop(change.qid, None)
            if forgotten is not None:
                self._write(forgotten, None)
        elif kind in _PUTS:
            self._write(self.layout.key_of(change), change)
        else:
            self._write(self.layout.key_of(change), None)

    def _write(self, key: bytes, record) -> None:
        earlier = self._pending.get(key)
        base = earlier[1] if earlier is not None else self.revisions.get(key, 0)
        self._pending[key] = (record, base)

    def pending(self) -> bool:
        return bool(self._pending)

    def take_txn(self) -> Txn:
        pending, self._pending = self._pending, {}
        txn = Txn()
        for key, (record, base) in pending.items():
            if record is None and not base:
                continue  # made and removed in one turn, or never stored: nothing to do
            txn.compares.append((key, base))
            if record is None:
                txn.deletes.append(key)
            else:
                txn.puts[key] = record
        return txn

    def committed(self, txn: Txn, revision: int) -> None:
        """The transaction succeeded at `revision`."""
        for key, record in txn.puts.items():
            self._saw(key, record, revision)
        for key in txn.deletes:
            self._gone(key)

    def _queue_record(self, put: c.QueuePut) -> QueueRecord:
        d = put.definition
        group = self.groups.get(d.qid)
        if group is not None:  # its home stays where placement put it, wherever it leads
            return group
        node, shard = self.locate(d.shard)
        owner, owner_node = (0, "") if not put.owner else self.owner_in_cluster(put.owner)
        members = self.placed.pop((d.spec.vhost, d.spec.name), [])
        record = QueueRecord(QueueDef(d.spec, d.qid, shard), node, owner, owner_node, members)
        if members:
            self.groups[d.qid] = record
        return record

    def groups_at(self, keys: list[bytes]) -> list[QueueRecord]:
        """The replicated queues' records among these keys'."""
        records = (self.values.get(key) for key in keys)
        return [record for record in records
                if type(record) is QueueRecord and record.definition.qid in self.groups]

    def owner_in_cluster(self, owner: int) -> tuple[int, str]:
        """An exclusive queue's owner id here, as etcd names it: (id on its node,
        node). Owners of other nodes have negative ids here (foreign_owner)."""
        if owner < 0:
            return self.foreign.get(owner, (0, ""))
        return owner, self.node

    # -- etcd's changes -----------------------------------------------------------

    def observe(self, key: bytes, value: bytes | None, revision: int, decode) -> object | None:
        """A watch event (or a key read by a reload): the change to replay here, or
        None if the catalogue has it already (this node's own write coming back)."""
        if revision <= self.revisions.get(key, -1):
            return None
        if value is None:
            previous = self.values.get(key)
            self._gone(key)
            return None if previous is None else self._removal(key, previous)
        record = decode(value)
        previous = self.values.get(key)
        self._saw(key, record, revision)
        if previous == record:
            return None
        return self._local(record)

    def _saw(self, key: bytes, record, revision: int) -> None:
        self.values[key] = record
        self.revisions[key] = revision
        if type(record) is QueueRecord:
            self.queue_keys[record.definition.qid] = key
            if record.members:
                self.groups[record.definition.qid] = record
                self.on_group(record, True)

    def _gone(self, key: bytes) -> None:
        record = self.values.pop(key, None)
        self.revisions.pop(key, None)
        if type(record) is QueueRecord:
            self.queue_keys.pop(record.definition.qid, None)
            if self.groups.pop(record.definition.qid, None) is not None:
                self.on_group(record, False)

    def _removal(self, key: bytes, previous):
        if type(previous) is QueueRecord:
            return c.QueueForgotten(previous.definition.qid)
        return removal(self.layout, key, previous)

    def _local(self, record):
        """An etcd record as the change that makes it here."""
        if type(record) is not QueueRecord:
            return record
        d = record.definition
        shard = self.shard_of(record.node, d.shard)
        owner = 0
        if record.owner:
            owner = record.owner if record.owner_node == self.node else \
                self.foreign_owner(record.owner, record.owner_node)
        return c.QueuePut(QueueDef(d.spec, d.qid, shard), owner)

    def foreign_owner(self, owner: int, node: str) -> int:
        """An id for a connection of another node that owns an exclusive queue: no
        connection here has it (registry.owner_of makes it a RemoteOwner)."""
        ident = self._foreign_ids.get((owner, node))
        if ident is None:
            ident = self._foreign_ids[(owner, node)] = -(len(self._foreign_ids) + 1)
            self.foreign[ident] = (owner, node)
        return ident

    def owners_of_node(self, node: str) -> set[int]:
        """The ids here of another node's connections that own exclusive queues."""
        return {ident for ident, (_, owner_node) in self.foreign.items() if owner_node == node}

    # -- reloads --------------------------------------------------------------------

    def reload(self, kvs: list[tuple[bytes, bytes, int]], revision: int, decode,
               local: dict[bytes, object]) -> list:
        """etcd's whole catalogue (key, value, mod revision) at `revision` against
        the catalogue's own records by key (`local`, as record() would key them):
        the changes that make the catalogue etcd's, puts in building order, then
        removals in the reverse order."""
        self.values.clear()
        self.revisions.clear()
        self.queue_keys.clear()
        groups, self.groups = self.groups, {}
        self.revision = revision
        seen: dict[bytes, object] = {}
        for key, value, mod_revision in kvs:
            record = decode(value)
            self._saw(key, record, mod_revision)
            seen[key] = record
        for qid, record in groups.items():
            if qid not in self.groups:
                self.on_group(record, False)
        puts, removals = [], []
        for key, record in seen.items():
            if local.get(key) != record:
                puts.append((KINDS.index(self.layout.kind_of(key)), self._local(record)))
        for key, record in local.items():
            if key not in seen:
                removals.append((KINDS.index(self.layout.kind_of(key)),
                                 self._removal(key, record)))
        puts.sort(key=lambda p: p[0])
        removals.sort(key=lambda p: -p[0])
        return [change for _, change in puts] + [change for _, change in removals]

    def local_records(self, snapshot: list) -> dict[bytes, object]:
        """The catalogue's records by key (`snapshot`: changes.snapshot of it), in
        etcd's form."""
        records: dict[bytes, object] = {}
        for change in snapshot:
            record = self._queue_record(change) if type(change) is c.QueuePut else change
            if type(change) is c.ExchangePut and _predeclared(change.definition.name):
                continue
            records[self.layout.key_of(record)] = record
        return records


_PUTS = (c.VHostPut, c.UserPut, c.PermissionPut, c.PolicyPut, c.ExchangePut, c.BindingPut)


def _predeclared(name: str) -> bool:
    """Every vhost has these; they are not stored apart from it."""
    return name == "" or name.startswith("amq.")
