"""`warren inspect DATA_DIR`: what a data directory holds, read without touching it.
`warren inspect --verify DATA_DIR` checks every store for damage (exit 1 if any).

Environments are opened read-only as ordinary LMDB readers, so this works on a
stopped broker and beside a running one without blocking its writers. A shard
store's journal is read too: what it holds beyond LMDB's last checkpoint (the
last fraction of a second of a running shard's commits, or a crashed shard's)
is shown as the shard will apply it. A stream's log is opened read-only (no cut
of a torn tail) and shown as its segments.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import struct
import sys

import lmdb
import msgspec

from . import journal
from .metastore import QueueDef
from .recovery import Survey
from .sealed import unseal
from .segmentlog import SegmentLog
from .shardstore import DELIVERED, StoredMessage, _Mark, applied_of, beyond, journal_path

_key = struct.Struct(">QQ")


def _open(path: str):
    return lmdb.open(path, readonly=True, lock=True, subdir=True, max_dbs=8,
                     create=False)


class _ShardView:
    """One shard store, read-only: one LMDB snapshot and the journal beyond it."""

    def __init__(self, path: str):
        self.env = _open(path)
        self.queues = self.env.open_db(b"queues", create=False)
        self.messages = self.env.open_db(b"messages", create=False)
        self.marks = self.env.open_db(b"marks", create=False)
        self.manifest = self.env.open_db(b"manifest", create=False)
        try:
            self.delivered = self.env.open_db(b"delivered", create=False)
        except lmdb.NotFoundError:  # written before it existed, not opened since
            self.delivered = None
        # A running shard may checkpoint between the snapshot and the journal's
        # read: then the journal no longer starts right after the snapshot. Again,
        # a few times (a checkpoint comes at most every half second); the last try
        # stands, at worst one checkpoint off.
        for attempt in range(20):
            self.txn = self.env.begin(buffers=True)
            applied = applied_of(self.txn, self.manifest)
            self.unapplied, numbers = beyond(journal.read(journal_path(path)), applied)
            if attempt == 19 or self._follows(applied, numbers):
                break
            self.txn.abort()

    def _follows(self, applied: int, numbers: list[int]) -> bool:
        """The journal records read (their numbers) start right after the snapshot,
        which has `applied`: none if no checkpoint has come since."""
        if numbers:
            return numbers[0] == applied + 1
        with self.env.begin() as now:
            return applied_of(now, self.manifest) == applied

    def _stored(self, qid: int) -> dict[int, bytes | tuple]:
        """seq -> the stored value (sealed) or, from the journal, the content tuple."""
        prefix = qid.to_bytes(8, "big")
        found: dict[int, bytes | tuple] = {}
        if qid not in self.unapplied.queue_deletes:
            cursor = self.txn.cursor(db=self.messages)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if bytes(key[:8]) != prefix:
                        break
                    found[_key.unpack(key)[1]] = value
        for key in self.unapplied.deletes:
            if key[:8] == prefix:
                found.pop(_key.unpack(key)[1], None)
        for key, content in self.unapplied.puts.items():
            if key[:8] == prefix:
                found[_key.unpack(key)[1]] = content
        return found

    def counts(self, qid: int) -> tuple[int, int]:
        """(messages, bytes of stored values) of a queue."""
        stored = self._stored(qid)
        size = sum(len(msgspec.msgpack.encode(v)) if type(v) is tuple else len(v) - 8  # checksum
                   for v in stored.values())
        return len(stored), size

    def first(self, qid: int, limit: int) -> list[tuple[int, StoredMessage, _Mark]]:
        """A queue's first messages, each with its mark (how often it went out)."""
        decoder = msgspec.msgpack.Decoder(StoredMessage)
        marks = msgspec.msgpack.Decoder(_Mark)
        prefix = qid.to_bytes(8, "big")
        txn = self.txn
        upto = None if self.delivered is None else txn.get(prefix, db=self.delivered)
        upto = 0 if upto is None else msgspec.msgpack.decode(unseal(upto), type=int)
        upto = max(upto, self.unapplied.delivered.get(qid, 0))
        out = []
        stored = self._stored(qid)
        for seq in sorted(stored)[:limit]:
            key = _key.pack(qid, seq)
            value = stored[seq]
            message = StoredMessage(*value) if type(value) is tuple else decoder.decode(unseal(value))
            mark = self.unapplied.marks.get(key)
            if mark is None:
                mark = txn.get(key, db=self.marks)
                mark = _Mark(False) if mark is None else marks.decode(unseal(mark))
            elif mark is DELIVERED:
                mark = _Mark()
            mark.delivered = mark.delivered or seq <= upto  # in order: no mark of its own
            out.append((seq, message, mark))
        return out

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


def _queues(data_dir: str) -> tuple[list[str], list[dict], dict[int, _ShardView]]:
    """The vhosts, one row per durable queue, and the open shard stores."""
    meta_env = _open(os.path.join(data_dir, "meta"))
    try:
        db = meta_env.open_db(b"queues", create=False)
        decoder = msgspec.msgpack.Decoder(QueueDef)
        with meta_env.begin() as txn:
            defs = [decoder.decode(unseal(v)) for _, v in txn.cursor(db=db)]
        vhosts_db = meta_env.open_db(b"vhosts", create=False)
        with meta_env.begin() as txn:
            vhosts = sorted(bytes(k).decode() for k, _ in txn.cursor(db=vhosts_db))
    finally:
        meta_env.close()
    shards = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "shard-*"))):
        suffix = path.rsplit("-", 1)[1]
        if suffix.isdigit():
            shards[int(suffix)] = _ShardView(path)
    rows = []
    for d in sorted(defs, key=lambda d: (d.spec.vhost, d.spec.name)):
        row = {"vhost": d.spec.vhost, "name": d.spec.name, "shard": d.shard, "qid": d.qid,
               "durable": d.spec.durable, "auto_delete": d.spec.auto_delete,
               "arguments": d.spec.arguments}
        if d.spec.arguments.get("x-queue-type") == "stream":
            row.update(_stream(data_dir, d.qid))
        else:
            view = shards.get(d.shard)
            row["messages"], row["bytes"] = view.counts(d.qid) if view else (0, 0)
        rows.append(row)
    return vhosts, rows, shards


def _stream(data_dir: str, qid: int) -> dict:
    """A stream's figures and segments, from its log in whichever store holds it."""
    for path in glob.glob(os.path.join(data_dir, "shard-*", "streams", str(qid))):
        log = SegmentLog.open(path, readonly=True)
        try:
            stats = log.stats()
            return {"messages": stats.messages, "bytes": stats.bytes,
                    "first_offset": stats.first_offset, "last_offset": stats.last_offset,
                    "segments": [info._asdict() for info in log.segments()]}
        finally:
            log.close()
    return {"messages": 0, "bytes": 0, "segments": []}


def _properties(raw: bytes) -> dict:
    from warren.gateway.amqp.properties import decode_properties

    try:
        props = decode_properties(raw)
    except ValueError as error:
        return {"undecodable": str(error)}
    fields = {}
    for name in props.__slots__:
        value = getattr(props, name)
        if value is not None:
            fields[name] = value
    return json.loads(json.dumps(fields, default=str))


def _preview(body: bytes, size: int = 64) -> str:
    head = body[:size]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return repr(head) + ("…" if len(body) > size else "")
    return text + ("…" if len(body) > size else "")


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warren inspect",
                                     description="list what a Warren data directory holds")
    parser.add_argument("data_dir")
    parser.add_argument("--queue", help="show the first messages of this queue")
    parser.add_argument("--vhost", default="/")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="JSON output for scripts")
    parser.add_argument("--verify", action="store_true",
                        help="check every store for damage; exit 1 if any is damaged")
    args = parser.parse_args(argv)
    if args.verify and os.path.isdir(args.data_dir):
        survey = Survey(args.data_dir)
        print("\n".join(survey.lines()))
        return 0 if survey.ok() else 1
    if not os.path.isdir(os.path.join(args.data_dir, "meta")):
        print(f"warren inspect: no Warren data directory at {args.data_dir} "
              "(no meta/ environment)", file=sys.stderr)
        return 2
    vhosts, rows, shards = _queues(args.data_dir)
    try:
        if args.queue is None:
            if args.json:
                print(json.dumps({"vhosts": vhosts, "queues": rows}))
            else:
                print("vhosts: " + ", ".join(vhosts))
                print(_table(rows, ["vhost", "name", "shard", "durable", "messages", "bytes",
                                    "arguments"]))
            return 0
        row = next((r for r in rows if r["vhost"] == args.vhost and r["name"] == args.queue),
                   None)
        if row is None:
            print(f"warren inspect: no durable queue '{args.queue}' in vhost '{args.vhost}'",
                  file=sys.stderr)
            return 1
        if "segments" in row:  # a stream: its segments
            if args.json:
                print(json.dumps({"queue": row}))
            else:
                print(_table([row], ["vhost", "name", "shard", "messages", "bytes",
                                     "first_offset", "last_offset"]))
                print()
                print(_table(row["segments"], ["first_offset", "last_offset", "bytes"]))
            return 0
        view = shards.get(row["shard"])
        messages = []
        for seq, stored, mark in (view.first(row["qid"], args.limit) if view else []):
            messages.append({"seq": seq, "exchange": stored.exchange,
                             "routing_key": stored.routing_key,
                             "properties": _properties(stored.properties),
                             "body_size": len(stored.body), "body": _preview(stored.body),
                             "delivered": mark.delivered,
                             "delivery_count": mark.delivery_count})
        if args.json:
            print(json.dumps({"queue": row, "messages": messages}))
        else:
            print(_table([row], ["vhost", "name", "shard", "messages", "bytes"]))
            print()
            print(_table(messages, ["seq", "exchange", "routing_key", "body_size", "delivered",
                                    "properties", "body"]))
        return 0
    finally:
        for view in shards.values():
            view.close()
