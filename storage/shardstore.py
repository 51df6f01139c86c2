"""A shard's LMDB environment: its durable queues and their persistent messages.

Keys are the queue id and the sequence number, each 8 bytes big-endian, so a
cursor walks a queue in order. The databases:

    queues     qid            -> StoredQueue (its spec and the arguments in force)
    messages   qid + seq      -> StoredMessage (content; read back on delivery; written
                                 from the content tuple, which encodes the same)
    marks      qid + seq      -> (delivered, delivery_count, acquired_count, rich)
    delivered  qid            -> the highest seq of the queue delivered at least once
    replicas   qid            -> Position: where a replicated queue's log stands (its
                                 rows are a replica group's, served only by its leader)
    manifest   b"manifest"    -> Manifest (the store's format, written when it is
                                 created, and the last journal record applied)

A queue without priorities hands its messages out for the first time in
sequence order, so one number per queue (`delivered`) says which of its messages
went out at least once: a message costs one record, not a message and a mark.
`marks` exists only for messages that carry more: a first delivery out of order
(priority queues), return counts (quorum queues), or their own expiration
(`rich`: recovery reads their properties). Recovery reads the keys of `messages`
and the small `marks` and `delivered` values, and no other bodies. Stores
written before `delivered` existed lack it: it is created when the store is
opened for writing, and read as empty until then. Every
value is sealed with its checksum (storage.sealed); storage.verify checks them
all before the broker starts.

A commit is appended to the store's journal (storage.journal), which costs one
synchronous write where an LMDB commit costs two, and reaches LMDB at the next
checkpoint: many commits, merged, in one transaction. Reading (`recover`,
`read_many`, `queues`, and other processes: inspect, verify) sees the store as
of its last checkpoint; opening it applies what the journal holds beyond that
(after a crash), and closing it checkpoints.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Iterator

import lmdb
import msgspec

from .journal import Journal
from .lmdbfile import LmdbFile, Unreadable
from .queuespec import QueueSpec
from .sealed import seal, unseal
from .upgrade import MANIFEST_KEY, Manifest, manifest_value

_key = struct.Struct(">QQ")
_qid = struct.Struct(">Q")


class StoredQueue(msgspec.Struct, array_like=True):
    """A queue in its shard's store (keyed by its id): its spec, and the arguments
    in force when the shard created it (the spec's with its policy's), which
    recovery configures it with until the gateway sends today's."""

    spec: QueueSpec
    arguments: dict


class StoredMessage(msgspec.Struct, array_like=True):
    """A message's content. Its delivery counts live in `marks`: format 2 wrote two
    more fields here, always 0, which decoding ignores (trailing array items)."""

    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


class _Mark(msgspec.Struct, array_like=True):
    delivered: bool = True
    delivery_count: int = 0
    acquired_count: int = 0
    rich: bool = False  # recovery must read its properties (it expires by itself)


DELIVERED = _Mark()  # the common mark, shared: its sealed value is encoded once
_DELIVERED_VALUE = seal(msgspec.msgpack.encode(DELIVERED))


class Position(msgspec.Struct, array_like=True):
    """Where a replicated queue's log stands in this store (shards/replication.py):
    where each epoch's entries start, (epoch, first index), and its last index.
    Empty while a snapshot loads: a crash then recovers no half as a log."""

    starts: list[tuple[int, int]]
    last_index: int


class _Logged(msgspec.Struct, array_like=True):
    """A WriteBatch as the journal holds it."""

    queue_puts: list[tuple[int, StoredQueue]]
    queue_deletes: list[int]
    puts: list[tuple[bytes, tuple[str, str, bytes, bytes]]]
    deletes: list[bytes]
    marks: list[tuple[bytes, _Mark]]
    delivered: list[tuple[int, int]]
    positions: list[tuple[int, Position]] = []  # absent from journals written before it


class JournalDamaged(Exception):
    """The journal holds damage before its end: confirmed commits beyond it."""


class StoreFull(Exception):
    """A commit failed, for a full map or disk (or another write error): nothing of
    the batch was written, and a later try may succeed."""


class WriteBatch:
    """Everything one shard loop turn wants durable. Building it does no I/O."""

    def __init__(self) -> None:
        self.queue_puts: dict[int, StoredQueue] = {}
        self.queue_deletes: set[int] = set()
        self.puts: dict[bytes, tuple] = {}  # (exchange, routing key, properties, body)
        self.deletes: set[bytes] = set()
        self.marks: dict[bytes, _Mark] = {}
        self.delivered: dict[int, int] = {}  # qid -> highest seq delivered in order
        self.positions: dict[int, Position] = {}

    def put_queue(self, qid: int, queue: StoredQueue) -> None:
        """Write a queue's record. After its delete in the same batch (a replica's
        rows cleared), the delete still drops the rows it had: the record comes back."""
        self.queue_puts[qid] = queue

    def delete_queue(self, qid: int) -> None:
        self.queue_puts.pop(qid, None)
        self.queue_deletes.add(qid)
        self.delivered.pop(qid, None)
        self.positions.pop(qid, None)
        prefix = _qid.pack(qid)
        for pending in (self.puts, self.marks):
            for key in [k for k in pending if k.startswith(prefix)]:
                del pending[key]

    def put_message(self, qid: int, seq: int, content: tuple) -> None:
        """Write a message: its content (exchange, routing key, properties, body),
        which encodes as a StoredMessage."""
        key = _key.pack(qid, seq)
        self.deletes.discard(key)
        self.puts[key] = content

    def delete_message(self, qid: int, seq: int) -> None:
        key = _key.pack(qid, seq)
        self.marks.pop(key, None)
        # Written and deleted in one turn: nothing to do, as nothing before this
        # batch wrote the key (a queue never reuses a sequence number).
        if self.puts.pop(key, None) is None:
            self.deletes.add(key)

    def mark_delivered(self, qid: int, seq: int, rich: bool = False) -> None:
        key = _key.pack(qid, seq)
        mark = self.marks.get(key)
        if mark is None:
            self.marks[key] = _Mark(rich=True) if rich else DELIVERED
        elif not mark.delivered:
            mark.delivered = True

    def delivered_upto(self, qid: int, seq: int) -> None:
        """Every message of the queue up to `seq` went out at least once (it hands
        its messages out for the first time in sequence order)."""
        if seq > self.delivered.get(qid, 0):
            self.delivered[qid] = seq

    def set_position(self, qid: int, position: Position) -> None:
        self.positions[qid] = position

    def mark_rich(self, qid: int, seq: int) -> None:
        self.marks[_key.pack(qid, seq)] = _Mark(delivered=False, rich=True)

    def update_counts(self, qid: int, seq: int, delivery_count: int, acquired_count: int) -> None:
        self.marks[_key.pack(qid, seq)] = _Mark(True, delivery_count, acquired_count)

    def merge(self, later: "WriteBatch") -> None:
        """Apply a later batch's writes on top of this one's, as two commits in a row
        would (a refused batch is kept, and what gathered since joins it)."""
        for qid in later.queue_deletes:
            self.delete_queue(qid)
        for qid, queue in later.queue_puts.items():
            self.put_queue(qid, queue)
        for key, message in later.puts.items():
            self.deletes.discard(key)
            self.puts[key] = message
        for key in later.deletes:
            self.marks.pop(key, None)
            if self.puts.pop(key, None) is None:
                self.deletes.add(key)
        self.marks.update(later.marks)
        for qid, seq in later.delivered.items():
            self.delivered_upto(qid, seq)
        self.positions.update(later.positions)

    def logged(self) -> _Logged:
        return _Logged(list(self.queue_puts.items()), list(self.queue_deletes),
                       list(self.puts.items()), list(self.deletes), list(self.marks.items()),
                       list(self.delivered.items()), list(self.positions.items()))

    @classmethod
    def from_logged(cls, logged: _Logged) -> "WriteBatch":
        batch = cls()
        batch.queue_puts = dict(logged.queue_puts)
        batch.queue_deletes = set(logged.queue_deletes)
        batch.puts = dict(logged.puts)
        batch.deletes = set(logged.deletes)
        batch.marks = {key: DELIVERED if mark == DELIVERED else mark
                       for key, mark in logged.marks}
        batch.delivered = dict(logged.delivered)
        batch.positions = dict(logged.positions)
        return batch

    def __len__(self) -> int:
        return (len(self.puts) + len(self.deletes) + len(self.marks) + len(self.delivered)
                + len(self.positions))

    def is_empty(self) -> bool:
        return not (self.queue_puts or self.queue_deletes or self.puts or self.deletes
                    or self.marks or self.delivered or self.positions)


class ShardStore:
    def __init__(self, path: str, map_size: int = 32 << 30):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(path, map_size=map_size, subdir=True, max_dbs=6, sync=True,
                             metasync=True, readahead=False, meminit=False, max_readers=126)
        self._queues = self.env.open_db(b"queues")
        self._messages = self.env.open_db(b"messages")
        self._marks = self.env.open_db(b"marks")
        self._delivered = self.env.open_db(b"delivered")
        self._replicas = self.env.open_db(b"replicas")
        self._manifest = self.env.open_db(b"manifest")
        self._encode = msgspec.msgpack.Encoder().encode
        self._queue_decoder = msgspec.msgpack.Decoder(StoredQueue)
        self._message_decoder = msgspec.msgpack.Decoder(StoredMessage)
        self._mark_decoder = msgspec.msgpack.Decoder(_Mark)
        self._seq_decoder = msgspec.msgpack.Decoder(int)
        self._position_decoder = msgspec.msgpack.Decoder(Position)
        # (address, length) of LMDB's map, () if none
        self._mapping: tuple[int, int] | tuple[()] | None = None
        # The journal exists before the manifest says the store is running: from
        # then on a missing journal is damage (storage.verify).
        self._journal = Journal(journal_path(path))
        with self.env.begin(write=True) as txn:
            manifest = manifest_of(txn, self._manifest)
            self._applied = manifest.journal  # the last journal record in LMDB
            txn.put(MANIFEST_KEY, manifest_value(self._applied, True), db=self._manifest)
        self._logged = self._applied  # the last journal record written
        self._unapplied = WriteBatch()  # what the journal holds beyond LMDB, merged
        self._replay(manifest.running)

    def _replay(self, crashed: bool) -> None:
        """Apply the commits the journal holds beyond the last checkpoint (the store
        was not closed), then start the journal over."""
        found = self._journal.scan(self._applied)
        # Damage matters only after a crash (closed, LMDB holds everything; an older
        # Warren's store does not say, and is read as it read it: the intact run).
        if found.damage and crashed:  # storage.recovery refuses to start on it first
            raise JournalDamaged(f"{self.path}: {found.damage}")
        records = found.records
        self._unapplied, numbers = beyond(records, self._applied)
        self._logged = numbers[-1] if numbers else self._applied
        try:
            self.checkpoint()
        except StoreFull:
            # Confirmed commits a full map cannot take (a checkpoint refused before
            # the stop): grow the map for them, at most a checkpoint's worth.
            size = self.env.info()["map_size"]
            self.env.set_mapsize(size + 2 * sum(len(p) for _, p in records) + (1 << 20))
            try:
                self.checkpoint()
            except StoreFull:
                # A full disk: the journal keeps them (`unapplied` shows them), and
                # the next commits go behind them until a checkpoint succeeds.
                self._journal.append_after(records)
        else:
            self._journal.start_over()  # all applied: a journal a flood grew shrinks

    @property
    def unapplied(self) -> "WriteBatch":
        """The journal's commits beyond LMDB, merged: after opening, empty unless the
        disk was too full to apply them (the shard then serves them from RAM and
        checkpoints once there is room, shards.persister)."""
        return self._unapplied

    def _sealed(self, record) -> bytes:
        return seal(self._encode(record))

    def __repr__(self) -> str:
        return f"ShardStore({self.path!r})"

    def append(self, batch: WriteBatch) -> int:
        """Make the batch durable in the journal (one synchronous write); it reaches
        LMDB at the next checkpoint. The bytes it took in the journal."""
        try:
            written = self._journal.append(self._logged + 1, self._encode(batch.logged()))
        except OSError as error:  # a full disk: nothing of the batch counts as written
            raise StoreFull(str(error)) from error
        self._logged += 1
        self._unapplied.merge(batch)
        return written

    def checkpoint(self, refused: WriteBatch | None = None) -> None:
        """Write what the journal holds to LMDB, durably, in one transaction; then
        start the journal over. StoreFull keeps both as they were. `refused`: a
        commit the journal had no room for (a full disk), written on top of them:
        else the acks that would let a checkpoint free space could not reach it."""
        batch = self._unapplied
        if refused is not None and not refused.is_empty():
            batch = WriteBatch()
            batch.merge(self._unapplied)
            batch.merge(refused)
        elif self._logged == self._applied:
            self._journal.start_over()  # nothing to apply: only shrinks a grown journal
            return
        self._write(batch, self._logged)
        self._applied = self._logged
        self._unapplied = WriteBatch()
        self._journal.start_over()

    def commit(self, batch: WriteBatch) -> None:
        """Append the batch and checkpoint: durable, and read back at once."""
        self.append(batch)
        self.checkpoint()

    def _write(self, batch: WriteBatch, applied: int) -> None:
        """One LMDB transaction with its two synchronous writes (data, then meta)."""
        sealed = self._sealed
        try:
            with self.env.begin(write=True) as txn:
                for qid in batch.queue_deletes:
                    txn.delete(_qid.pack(qid), db=self._queues)
                    self._delete_prefix(txn, self._messages, qid)
                    self._delete_prefix(txn, self._marks, qid)
                    txn.delete(_qid.pack(qid), db=self._delivered)
                    txn.delete(_qid.pack(qid), db=self._replicas)
                for qid, queue in batch.queue_puts.items():
                    txn.put(_qid.pack(qid), sealed(queue), db=self._queues)
                for key, message in batch.puts.items():
                    txn.put(key, sealed(message), db=self._messages)
                for key in batch.deletes:
                    txn.delete(key, db=self._messages)
                    txn.delete(key, db=self._marks)
                for key, mark in batch.marks.items():
                    txn.put(key, _DELIVERED_VALUE if mark is DELIVERED else sealed(mark),
                            db=self._marks)
                for qid, seq in batch.delivered.items():
                    txn.put(_qid.pack(qid), sealed(seq), db=self._delivered)
                for qid, position in batch.positions.items():
                    txn.put(_qid.pack(qid), sealed(position), db=self._replicas)
                txn.put(MANIFEST_KEY, manifest_value(applied, True), db=self._manifest)
        except lmdb.PanicError:  # the environment is unusable: the shard must start over
            raise
        except lmdb.Error as error:  # a full map or disk (ENOSPC, or EIO: a short write)
            raise StoreFull(str(error)) from error

    @staticmethod
    def _delete_prefix(txn, db, qid: int) -> None:
        prefix = _qid.pack(qid)
        cursor = txn.cursor(db=db)
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                if not cursor.delete():
                    break

    def queues(self) -> dict[int, StoredQueue]:
        with self.env.begin() as txn:
            return {_qid.unpack(k)[0]: self._queue_decoder.decode(unseal(v))
                    for k, v in txn.cursor(db=self._queues)}

    def positions(self) -> dict[int, Position]:
        """The replicated queues' log positions, the journal's unapplied ones on top."""
        with self.env.begin() as txn:
            found = {_qid.unpack(k)[0]: self._position_decoder.decode(unseal(v))
                     for k, v in txn.cursor(db=self._replicas)}
        for qid in self._unapplied.queue_deletes:
            found.pop(qid, None)
        found.update(self._unapplied.positions)
        return found

    def recover(self, qid: int) -> Iterator[tuple[int, bool, int, int, bool]]:
        """(seq, delivered, delivery_count, acquired_count, rich) of a queue, in
        order, without decoding bodies."""
        prefix = _qid.pack(qid)
        with self.env.begin() as txn:
            value = txn.get(prefix, db=self._delivered)
            upto = 0 if value is None else self._seq_decoder.decode(unseal(value))
            marks = {}
            cursor = txn.cursor(db=self._marks)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if key[:8] != prefix:
                        break
                    marks[key] = self._mark_decoder.decode(unseal(value))
            cursor = txn.cursor(db=self._messages)
            if not cursor.set_range(prefix):
                return
            for key in cursor.iternext(keys=True, values=False):
                if key[:8] != prefix:
                    break
                mark = marks.get(key)
                seq = _key.unpack(key)[1]
                if mark is None:
                    yield seq, seq <= upto, 0, 0, False
                else:
                    yield (seq, mark.delivered or seq <= upto, mark.delivery_count,
                           mark.acquired_count, mark.rich)

    def recover_over(self, qid: int, pending: WriteBatch) -> list[tuple]:
        """recover(qid) with the journal's unapplied commits (`pending`) on top, in
        sequence order; a message only the journal holds comes with its content."""
        prefix = _qid.pack(qid)
        upto = pending.delivered.get(qid, 0)
        found = []
        if qid not in pending.queue_deletes:  # else what LMDB holds of it is gone
            for seq, delivered, delivery_count, acquired, rich in self.recover(qid):
                key = _key.pack(qid, seq)
                if key not in pending.deletes:
                    found.append(_marked(pending.marks.get(key), seq, delivered or seq <= upto,
                                         delivery_count, acquired, rich))
        for key, content in pending.puts.items():
            if key[:8] == prefix:
                seq = _key.unpack(key)[1]
                found.append(_marked(pending.marks.get(key), seq, seq <= upto, 0, 0, False)
                             + (tuple(content),))
        found.sort(key=lambda entry: entry[0])
        return found

    def read(self, qid: int, seq: int) -> StoredMessage | None:
        return self.read_many([(qid, seq)])[0]

    def read_many(self, keys: list[tuple[int, int]]) -> list[StoredMessage | None]:
        decode = self._message_decoder.decode
        with self.env.begin(buffers=True) as txn:
            out = []
            for qid, seq in keys:
                value = txn.get(_key.pack(qid, seq), db=self._messages)
                out.append(None if value is None else decode(unseal(value)))
            return out

    def drop_mapped_pages(self) -> None:
        """Let go of the store's pages this process has mapped. LMDB reads the file
        through a shared, read-only map, and each page it touches, with the kernel's
        fault-around (16 pages at a time), stays in the process's resident set: small
        commits or a long drain would map the whole file. Dropping the map's pages
        keeps the data in the page cache; LMDB faults back in what it reads next."""
        if self._mapping is None:
            self._mapping = _mapping_of(os.path.join(self.path, "data.mdb"))
        if self._mapping:
            _madvise(*self._mapping, _MADV_DONTNEED)

    def close(self) -> None:
        """Checkpoint and close. A checkpoint a full store refuses leaves the journal
        to be applied when the store is next opened."""
        try:
            self.checkpoint()
            with self.env.begin(write=True) as txn:  # nothing beyond LMDB: no journal needed
                txn.put(MANIFEST_KEY, manifest_value(self._applied), db=self._manifest)
        except (StoreFull, lmdb.Error):
            pass
        self.env.close()
        self._journal.close()


def applied_of(txn, manifest_db) -> int:
    """The last journal record a store's LMDB holds, as a read transaction sees it."""
    return manifest_of(txn, manifest_db).journal


def manifest_of(txn, manifest_db) -> Manifest:
    value = txn.get(MANIFEST_KEY, db=manifest_db)
    return Manifest(0) if value is None else msgspec.msgpack.decode(unseal(value), type=Manifest)


def beyond(records: list[tuple[int, bytes]], applied: int) -> tuple[WriteBatch, list[int]]:
    """The journal records after `applied`, merged into one batch, and their numbers."""
    batch, numbers = WriteBatch(), []
    for number, payload in records:
        if number > applied:
            batch.merge(WriteBatch.from_logged(msgspec.msgpack.decode(payload, type=_Logged)))
            numbers.append(number)
    return batch, numbers


def journal_path(path: str) -> str:
    return os.path.join(path, "journal")


def reusable_bytes(path: str) -> int:
    """Bytes of a store's file that LMDB will fill again before it grows it: its
    free pages within the file (LMDB may leave pages it freed before ever writing
    them past the file's end: those take no disk). LMDB files never shrink, so
    after a purge this is the disk space that was freed. Read with pread
    (storage.lmdbfile), not mapped: a store damaged while the broker runs cannot
    kill the reader with SIGBUS; 0 if it cannot be read."""
    try:
        file = LmdbFile(path)
    except (Unreadable, OSError):
        return 0
    try:
        used = 2 + sum(tree.branch + tree.leaf + tree.overflow  # 2 metas
                       for tree in [file.main, *file.databases().values()])
        pages = min(file.last_pgno + 1, file.size // file.psize)
        return max(0, pages - used) * file.psize
    except OSError:
        return 0
    finally:
        file.close()


_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _madvise(address: int, length: int, advice: int) -> None:
    _libc.madvise(address, length, advice)


def _mapping_of(path: str) -> tuple[int, int] | tuple[()]:
    """(address, length) of this process's map of the file at `path`, () if none."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == real:
                low, high = (int(part, 16) for part in fields[0].split("-"))
                return low, high - low
    return ()


def _marked(mark, seq: int, delivered: bool, delivery_count: int, acquired: int,
            rich: bool) -> tuple:
    """A recovered message's state with the journal's mark for it, if any, on top."""
    if mark is None:
        return seq, delivered, delivery_count, acquired, rich
    return (seq, delivered or mark.delivered, mark.delivery_count, mark.acquired_count,
            mark.rich)
