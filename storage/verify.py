"""Damage checks of one store (DATA/meta or DATA/shard-K).

LMDB checks the shape of the pages it reads, not the bytes of the values, and
maps a file shorter than its tree without a word (reading past its end kills
the reader with SIGBUS). So a store is checked here for: every page its
committed trees reach being in the file (walked with pread, storage.lmdbfile:
LMDB leaves pages freed before they were ever written past the file's end, so
the file may legitimately end before its last page number), every record
readable and matching its checksum, as many records in each database as LMDB
counts, and a shard store's manifest and journal. Callers run this in
a child process per store (`check_stores`): all stores at once, and a page that
crashes the reader is reported instead of crashing the caller.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import lmdb
import msgspec

from . import journal
from .lmdbfile import LmdbFile, Unreadable
from .metastore import _KINDS
from .salvage import readable_messages
from .sealed import Damaged, unseal
from .shardstore import Position, StoredMessage, StoredQueue, _Mark, journal_path, manifest_of
from .upgrade import FORMAT, Manifest, found_format

SHARD_DBS = {b"manifest": Manifest, b"queues": StoredQueue, b"messages": StoredMessage,
             b"marks": _Mark, b"delivered": int, b"replicas": Position}
# Created when a shard first opens a store written before them.
OPTIONAL_DBS = {"delivered", "replicas"}
META_DBS = {b"manifest": Manifest, **{kind.encode(): struct for kind, struct in _KINDS.items()},
            b"counters": None}


class StoreReport(msgspec.Struct):
    path: str
    problems: list[str] = []
    queues: dict[int, StoredQueue] = {}  # qid -> its queue record (shard stores)
    messages: dict[int, int] = {}  # qid -> readable messages
    outdated: int = 0  # the format an earlier Warren wrote it in: upgraded at start


def check_store(path: str) -> StoreReport:
    report = StoreReport(path)
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        report.problems.append("data.mdb is missing")
        return report
    try:
        env = lmdb.open(path, readonly=True, lock=True, subdir=True, max_dbs=16, create=False)
    except lmdb.Error as error:
        report.problems.append(f"not a readable LMDB environment: {error}")
        return report
    try:
        pages = _pages_problem(path)
        if pages:
            report.problems.append(pages)
            report.messages = readable_messages(path)  # what a salvage would keep
            return report
        dbs = META_DBS if os.path.basename(path) == "meta" else SHARD_DBS
        with env.begin(buffers=True) as txn:
            names = [bytes(name) for name, _ in txn.cursor()]
            try:
                found = found_format(env, txn, names) if names else FORMAT
            except (Damaged, msgspec.DecodeError):
                found = FORMAT  # the manifest's own check reports it
            if found < FORMAT:
                report.outdated = found  # its values are not in the shape checked below
                return report
            for name, struct in dbs.items():
                _check_db(env, txn, name.decode(), struct, report)
            homeless = set(report.messages) - set(report.queues)
            if dbs is SHARD_DBS and homeless:  # a damaged key moved them, or their queue
                report.problems.append(f"{sum(report.messages[q] for q in homeless)} messages "
                                       "belong to no queue")
            if dbs is SHARD_DBS and not report.problems:
                _check_journal(env, path, report)
    except lmdb.Error as error:
        report.problems.append(f"unreadable: {error}")
    finally:
        env.close()
    return report


def _pages_problem(path: str) -> str | None:
    """Why the committed trees cannot all be read (a page they reach is past the
    file's end, or is not the page they say), or None. The walk holds no LMDB
    reader: beside a running shard, a walk during which two transactions were
    committed (the second may reuse the pages the first freed) is done again."""
    for _ in range(10):
        try:
            file = LmdbFile(path)
        except (Unreadable, OSError) as error:
            return f"not a readable LMDB file: {error}"
        try:
            file.reach_everything()
            if _txnid(path) <= file.txnid + 1:
                break
        finally:
            file.close()
    if file.missing:
        return (f"data.mdb is truncated: {file.size} bytes, its trees reach "
                f"{file.reached * file.psize} (page {min(file.missing)} is missing)")
    if file.broken:
        return f"{len(file.broken)} of its pages are damaged (page {min(file.broken)} first)"
    return None


def _txnid(path: str) -> int:
    try:
        file = LmdbFile(path)
    except (Unreadable, OSError):
        return 0
    file.close()
    return file.txnid


def _check_db(env, txn, name: str, struct, report: StoreReport) -> None:
    try:
        db = env.open_db(name.encode(), txn=txn, create=False)
    except lmdb.NotFoundError:
        if name not in OPTIONAL_DBS:
            report.problems.append(f"its {name} database is missing")
        return
    decode = (msgspec.msgpack.Decoder(struct) if struct else msgspec.msgpack.Decoder()).decode
    expected = txn.stat(db)["entries"]
    count = bad = 0
    for key, value in txn.cursor(db=db):
        count += 1
        try:
            record = decode(unseal(value))
        except (Damaged, msgspec.DecodeError):
            bad += 1
            continue
        if struct is StoredQueue:
            report.queues[int.from_bytes(key[:8], "big")] = record
        elif struct is StoredMessage:
            qid = int.from_bytes(key[:8], "big")
            report.messages[qid] = report.messages.get(qid, 0) + 1
        elif struct is Manifest and record.format != FORMAT:
            report.problems.append(f"its format is {record.format}, this Warren reads {FORMAT}")
    if bad:
        report.problems.append(f"{bad} of {count} {name} records fail their checksum")
    if count != expected:
        report.problems.append(f"{count} {name} records readable of the {expected} it counts")
    if name == "manifest" and count == 0:
        report.problems.append("it has no manifest")


def _check_journal(env, path: str, report: StoreReport) -> None:
    """A store not closed since it was opened (a crash) needs what its journal
    holds beyond the checkpoint: the journal must be there, and end where its
    writes ended (storage.journal). Beside a running shard a checkpoint may come
    between reading the manifest and the journal: then it is read again."""
    for _ in range(10):
        manifest = _manifest(env)
        if not manifest.running:
            return  # closed: LMDB holds everything
        found = journal.read_scan(journal_path(path), manifest.journal)
        if _manifest(env).journal == manifest.journal:
            break
    if found is None:
        report.problems.append("its journal is missing, though the store was not closed "
                               f"(its checkpoint holds journal records up to {manifest.journal})")
        return
    if found.damage:
        report.problems.append(found.damage)


def _manifest(env) -> Manifest:
    with env.begin() as txn:
        return manifest_of(txn, env.open_db(b"manifest", txn=txn, create=False))


def check_stores(paths: list[str]) -> list[StoreReport]:
    children = [(path, subprocess.Popen([sys.executable, "-m", "warren.storage.verify", path],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
                for path in paths]
    reports = []
    for path, child in children:
        out, _ = child.communicate()
        if child.returncode == 0:
            reports.append(msgspec.msgpack.decode(out, type=StoreReport))
        else:
            how = (signal.Signals(-child.returncode).name if child.returncode < 0
                   else f"exit code {child.returncode}")
            reports.append(StoreReport(path, [f"reading it crashed the checker ({how})"]))
    return reports


if __name__ == "__main__":
    sys.stdout.buffer.write(msgspec.msgpack.encode(check_store(sys.argv[1])))
