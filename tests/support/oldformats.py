"""Data directories as earlier Warrens left them, made from one written today:
format 2 (sealed values, a manifest; a queue's fields written one by one, and two
always-zero counts after a message's body) and format 1 (format 2's values
without checksums, meta/'s counters as decimal text, no manifests). The queue
layouts are those storage/upgrade.py reads."""

from __future__ import annotations

import lmdb
import msgspec

from warren.storage.sealed import seal, unseal
from warren.storage.upgrade import MetaQueue2, ShardQueue2


class Message2(msgspec.Struct, array_like=True):
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    delivery_count: int = 0
    acquired_count: int = 0


def _decoded(value) -> object:
    return msgspec.msgpack.decode(bytes(unseal(value)))


def _format_2_value(store: str, db: bytes, key: bytes, value) -> bytes | None:
    """A value as format 2 wrote it (None: unchanged)."""
    if db == b"queues" and store == "meta":
        now = _decoded(value)  # {spec: [vhost, name, durable, exclusive, auto_delete, args], ...}
        vhost, name, durable, _, auto_delete, arguments = now["spec"]
        old = MetaQueue2(vhost, name, now["qid"], now["shard"], durable, auto_delete, arguments)
    elif db == b"queues":
        (vhost, name, durable, exclusive, auto_delete, _), in_force = _decoded(value)
        old = ShardQueue2(int.from_bytes(key, "big"), vhost, name, durable, exclusive,
                          auto_delete, in_force)
    elif db == b"messages":
        old = Message2(*_decoded(value))
    elif db == b"manifest":
        old = [2]
    else:
        return None
    return seal(msgspec.msgpack.encode(old))


def as_format_2(data, stores: list[str]) -> None:
    for store in stores:
        env = lmdb.open(str(data / store), subdir=True, max_dbs=16, create=False)
        with env.begin(write=True) as txn:
            for name in [bytes(name) for name, _ in txn.cursor()]:
                db = env.open_db(name, txn=txn, create=False)
                for key, value in list(txn.cursor(db=db)):
                    old = _format_2_value(store, name, key, value)
                    if old is not None:
                        txn.put(key, old, db=db)
        env.close()


def as_format_1(data, stores: list[str]) -> None:
    as_format_2(data, stores)
    for store in stores:
        env = lmdb.open(str(data / store), subdir=True, max_dbs=16, create=False)
        with env.begin(write=True) as txn:
            for name in [bytes(name) for name, _ in txn.cursor()]:
                db = env.open_db(name, txn=txn, create=False)
                if name == b"manifest":
                    txn.drop(db, delete=True)
                    continue
                for key, value in list(txn.cursor(db=db)):
                    plain = bytes(unseal(value))
                    if name == b"counters":
                        if key != b"next_qid":  # what format 1 did not have
                            txn.delete(key, db=db)
                            continue
                        plain = str(msgspec.msgpack.decode(plain)).encode()
                    txn.put(key, plain, db=db)
        env.close()
