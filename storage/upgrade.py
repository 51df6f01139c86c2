"""Stores written by an earlier Warren, brought to today's format before a start.

Format 1 (Warren before checksums) kept plain msgpack values and no manifest.
Format 2 seals every value with its checksum (storage.sealed) and records its
format in a `manifest` database, written when a store is created.
Format 3 writes a queue's definition as one QueueSpec (storage.queuespec) in
both stores: a shard store's queue record is [spec, arguments in force], meta/'s
is {spec, qid, shard}. Messages are unchanged (the two always-zero counts format
2 wrote after a message's body are ignored when read).

A store with data and no manifest is format 1. An outdated store is upgraded in
place, in one write transaction (all or nothing), so an upgrade is never
mistaken for damage.
"""

from __future__ import annotations

import os

import lmdb
import msgspec

from .queuespec import QueueSpec
from .sealed import seal, unseal

FORMAT = 3
MANIFEST_DB = b"manifest"
MANIFEST_KEY = b"manifest"


class Manifest(msgspec.Struct, array_like=True):
    format: int
    # A shard store's last journal record applied (storage.journal); a store
    # written before the journal has none (0), and an older Warren ignores it.
    journal: int = 0
    # Opened for writing and not closed since: its journal may hold confirmed
    # commits beyond `journal`, so a missing journal is damage. Absent (False)
    # in a store an older Warren wrote, which is then not held to it.
    running: bool = False


class Upgraded(msgspec.Struct):
    """What an upgrade did: the format it found, values it sealed (format 1) and
    queue records it rewrote."""

    found: int
    sealed: int = 0
    queues: int = 0

    def describe(self, path: str) -> str:
        done = ([f"sealed {self.sealed} records with their checksums"] if self.found == 1
                else []) + [f"rewrote {self.queues} queue records"]
        return f"upgraded {path} from format {self.found} to {FORMAT}: " + ", ".join(done)


# Values format 1 wrote other than as msgpack: meta/'s counters were decimal text.
_FORMAT_1_VALUES = {b"counters": lambda value: msgspec.msgpack.encode(int(value))}


class ShardQueue2(msgspec.Struct, array_like=True):
    """A shard store's queue record in formats 1 and 2."""

    qid: int
    vhost: str
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict  # those in force when it was created
    queue_type: str = "classic"  # never written other than so: x-queue-type says it


class MetaQueue2(msgspec.Struct):
    """meta/'s queue record in formats 1 and 2."""

    vhost: str
    name: str
    qid: int
    shard: int
    durable: bool
    auto_delete: bool
    arguments: dict
    queue_type: str = "classic"


def _shard_queue_3(value: bytes) -> bytes:
    old = msgspec.msgpack.decode(value, type=ShardQueue2)
    # The store never knew the declared arguments apart from those in force.
    spec = QueueSpec(old.vhost, old.name, old.durable, old.exclusive, old.auto_delete,
                     old.arguments)
    return msgspec.msgpack.encode([spec, old.arguments])


def _meta_queue_3(value: bytes) -> bytes:
    old = msgspec.msgpack.decode(value, type=MetaQueue2)
    spec = QueueSpec(old.vhost, old.name, old.durable, False, old.auto_delete, old.arguments)
    return msgspec.msgpack.encode({"spec": spec, "qid": old.qid, "shard": old.shard})


def manifest_value(journal: int = 0, running: bool = False) -> bytes:
    return seal(msgspec.msgpack.encode(Manifest(FORMAT, journal, running)))


def found_format(env, txn, names: list[bytes]) -> int:
    """The format of a store with data: 1 without a manifest. Raises Damaged
    (storage.sealed) or msgspec.DecodeError for a manifest that cannot be read."""
    if MANIFEST_DB not in names:
        return 1
    raw = txn.get(MANIFEST_KEY, db=env.open_db(MANIFEST_DB, txn=txn, create=False))
    if raw is None:
        return FORMAT  # the checks report the missing manifest
    return msgspec.msgpack.decode(unseal(raw), type=Manifest).format


def upgrade(path: str) -> Upgraded | None:
    """Bring the store at `path` to FORMAT: what was done, or None when it needed
    nothing (already current, empty, or no store at all)."""
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        return None
    # Sealing adds 8 bytes a value: leave the map room to grow.
    env = lmdb.open(path, subdir=True, max_dbs=16, create=False,
                    map_size=2 * os.path.getsize(data) + (64 << 20))
    try:
        with env.begin(write=True) as txn:
            names = [bytes(name) for name, _ in txn.cursor()]  # the main database names the others
            if not names:
                return None
            done = Upgraded(found_format(env, txn, names))
            if done.found >= FORMAT:
                return None
            if done.found == 1:
                done.sealed = _seal_all(env, txn, names)
                if not done.sealed:
                    return None  # a store that never held anything: it is stamped when opened
            if b"queues" in names:
                convert = _shard_queue_3 if b"messages" in names else _meta_queue_3
                queues = env.open_db(b"queues", txn=txn, create=False)
                for key, value in list(txn.cursor(db=queues)):
                    txn.put(key, seal(convert(bytes(unseal(value)))), db=queues)
                    done.queues += 1
            manifest = env.open_db(MANIFEST_DB, txn=txn)
            txn.put(MANIFEST_KEY, manifest_value(_journal_of(txn.get(MANIFEST_KEY, db=manifest))),
                    db=manifest)
        return done
    finally:
        env.close()


def _journal_of(raw) -> int:
    """The last journal record a format 2 manifest says the store holds (kept: the
    journal's records up to it are applied), 0 without one."""
    return 0 if raw is None else msgspec.msgpack.decode(unseal(raw), type=Manifest).journal


def _seal_all(env, txn, names: list[bytes]) -> int:
    """Format 1 to 2: seal every value (converting those format 1 wrote as text)."""
    sealed = 0
    for name in names:
        convert = _FORMAT_1_VALUES.get(name, bytes)
        cursor = txn.cursor(db=env.open_db(name, txn=txn, create=False))
        more = cursor.first()
        while more:
            # put() leaves the cursor on this record
            cursor.put(cursor.key(), seal(convert(cursor.value())))
            sealed += 1
            more = cursor.next()
    return sealed
