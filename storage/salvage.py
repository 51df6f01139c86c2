"""A damaged shard store's readable records, copied into a fresh store.

The damaged store is read page by page (storage.lmdbfile: no page past the
file's end is mapped, so a truncated store is read as far as it goes), every
record whose checksum and shape pass is kept, and the journal's intact records
beyond the checkpoint (storage.journal: those after a damaged one too) are
applied on top, in order. What could not be read is counted, not guessed.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import lmdb
import msgspec

from . import journal
from .lmdbfile import BIGDATA, LmdbFile, Unreadable
from .sealed import Damaged, unseal
from .shardstore import (
    Position,
    ShardStore,
    StoredMessage,
    StoredQueue,
    WriteBatch,
    _Logged,
    _Mark,
    journal_path,
)
from .upgrade import MANIFEST_KEY, Manifest, manifest_value

_RECORDS = {b"queues": StoredQueue, b"messages": StoredMessage, b"marks": _Mark, b"delivered": int,
            b"replicas": Position}  # a replica salvaged without it would be served as a queue


class Salvaged(msgspec.Struct):
    kept: dict[str, int] = {}  # database -> records kept
    lost: dict[str, int] = {}  # database -> records it counted that could not be read
    messages: dict[int, int] = {}  # qid -> messages the new store holds
    replayed: int = 0  # journal records applied
    journal_lost: int = 0  # journal records beyond the checkpoint damaged or gone (-1: unknown)
    applied: int = 0  # the last journal record the old store's manifest says it holds
    uncounted: bool = False  # pages that counted the records are gone: the loss is unknown

    def describe(self) -> str:
        lost = sum(self.lost.values())
        return (f"kept {sum(self.messages.values())} messages and {self.kept.get('queues', 0)} "
                "queues, lost "
                + ("an unknown number of records (the pages that counted them are gone)"
                   if self.uncounted else f"{lost} unreadable records"
                   + (f" ({self.lost.get('messages', 0)} of them messages)" if lost else ""))
                + f"; replayed {self.replayed} journal records, lost "
                + ("those past where the journal was cut short or gone (how many is unknown)"
                   if self.journal_lost < 0 else str(self.journal_lost)))


def salvage(source: str, target: str) -> Salvaged:
    """Copy what reads of the shard store at `source` into a new store at `target`."""
    done = Salvaged()
    applied = 0
    os.makedirs(target)
    env = lmdb.open(target, subdir=True, max_dbs=len(_RECORDS) + 1,
                    map_size=2 * _size(os.path.join(source, "data.mdb")) + (64 << 20))
    try:
        with env.begin(write=True) as txn:
            try:
                file = LmdbFile(source)
            except (Unreadable, OSError):
                file = None
            if file is not None:
                try:
                    applied = _copy_all(file, env, txn, done)
                finally:
                    file.close()
            txn.put(MANIFEST_KEY, manifest_value(applied), db=env.open_db(b"manifest", txn=txn))
    finally:
        env.close()
    found = journal.read_scan(journal_path(source), applied)
    records = found.salvage(applied) if found is not None else []
    if found is None or (found.damage and found.cut):
        done.journal_lost = -1  # cut short or gone: what it held past that is unknown
    elif found.damage:  # the numbers missing among those kept, and a damaged last one
        done.journal_lost = ((records[-1][0] - applied - len(records)) if records
                             else 0) + (not found.after)
    store = ShardStore(target, 2 * _size(os.path.join(source, "data.mdb")) + (64 << 20))
    try:
        decode = msgspec.msgpack.Decoder(_Logged).decode
        for _, payload in records:
            store.append(WriteBatch.from_logged(decode(payload)))
            done.replayed += 1
    finally:
        store.close()
    done.messages = _messages(target)  # with what the journal added and removed
    return done


def _messages(path: str) -> dict[int, int]:
    env = lmdb.open(path, readonly=True, subdir=True, max_dbs=len(_RECORDS) + 1)
    try:
        found: dict[int, int] = {}
        with env.begin() as txn:
            for key in txn.cursor(db=env.open_db(b"messages", txn=txn)).iternext(values=False):
                qid = int.from_bytes(key[:8], "big")
                found[qid] = found.get(qid, 0) + 1
        return found
    finally:
        env.close()


def _copy_all(file: LmdbFile, env, txn, done: Salvaged) -> int:
    """Copy every record that reads into the new store; the journal record the
    old store's manifest says it holds (0 if that is unreadable)."""
    dbs = {name: env.open_db(name, txn=txn) for name in _RECORDS}
    for name, key, value in readable(file, done):
        if txn.put(key, value, db=dbs[name], overwrite=False):
            done.kept[name.decode()] = done.kept.get(name.decode(), 0) + 1
    for name, tree in file.databases().items():
        if name in _RECORDS:
            done.lost[name.decode()] = max(0, tree.entries - done.kept.get(name.decode(), 0))
    return done.applied


def readable(file: LmdbFile, done: Salvaged) -> Iterator[tuple[bytes, bytes, bytes]]:
    """(database, key, value) of every record of the store that reads and passes
    its checksum: those its trees reach, then, where the trees lost pages, those
    of leaf pages no walk reached (a record going to the database its shape
    says; the first found of a key stands). Sets done.applied and done.uncounted."""
    decoders: dict[bytes, Callable[[bytes], Any]] = {
        name: msgspec.msgpack.Decoder(struct).decode for name, struct in _RECORDS.items()}
    trees = file.databases()
    for name in _RECORDS:
        tree = trees.get(name)
        for key, value, _ in file.walk(tree) if tree else ():
            if value is not None and _reads(decoders[name], value):
                yield name, key, value
    manifest = trees.get(b"manifest")
    for key, value, _ in file.walk(manifest) if manifest else ():
        if key == MANIFEST_KEY and value is not None:
            try:
                done.applied = msgspec.msgpack.decode(unseal(value), type=Manifest).journal
            except (Damaged, msgspec.DecodeError):
                pass
    if file.missing or file.broken or set(_RECORDS) - set(trees):
        done.uncounted = not trees or any(p in file.missing | file.broken for p in
                                          [file.main.root] + [t.root for t in trees.values()])
        for key, value, flags in file.orphan_leaves():
            if value is None or flags & ~BIGDATA:
                continue
            for name in (b"messages", b"marks") if len(key) == 16 else (
                    (b"queues", b"delivered", b"replicas") if len(key) == 8 else ()):
                if _reads(decoders[name], value):
                    yield name, key, value
                    break


def readable_messages(path: str) -> dict[int, int]:
    """qid -> the messages of the (damaged) store at `path` that a salvage keeps
    from LMDB."""
    done = Salvaged()
    try:
        file = LmdbFile(path)
    except (Unreadable, OSError):
        return {}
    try:
        keys = {key for name, key, _ in readable(file, done) if name == b"messages"}
    finally:
        file.close()
    found: dict[int, int] = {}
    for key in keys:
        qid = int.from_bytes(key[:8], "big")
        found[qid] = found.get(qid, 0) + 1
    return found


def _reads(decode, value: bytes) -> bool:
    try:
        decode(unseal(value))
        return True
    except (Damaged, msgspec.DecodeError):
        return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
