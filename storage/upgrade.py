"""Stores written by an earlier Warren, brought to today's format before a start.

Format 1 (Warren before checksums) kept plain msgpack values and no manifest.
Format 2 seals every value with its checksum (storage.sealed) and records its
format in a `manifest` database, written when a store is created. A store with
data and no manifest is format 1: it is upgraded in place, in one write
transaction (all or nothing), so an upgrade is never mistaken for damage.
"""

from __future__ import annotations

import os

import lmdb
import msgspec

from .sealed import seal

FORMAT = 2
MANIFEST_DB = b"manifest"
MANIFEST_KEY = b"manifest"


class Manifest(msgspec.Struct, array_like=True):
    format: int


# Values format 1 wrote other than as msgpack: meta/'s counters were decimal text.
_FORMAT_1_VALUES = {b"counters": lambda value: msgspec.msgpack.encode(int(value))}


def manifest_value() -> bytes:
    return seal(msgspec.msgpack.encode(Manifest(FORMAT)))


def upgrade(path: str) -> int | None:
    """Bring the store at `path` to FORMAT: the number of values sealed, or None
    when it needed nothing (already current, empty, or no store at all)."""
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        return None
    # Sealing adds 8 bytes a value: leave the map room to grow.
    env = lmdb.open(path, subdir=True, max_dbs=16, create=False,
                    map_size=2 * os.path.getsize(data) + (64 << 20))
    try:
        with env.begin(write=True) as txn:
            names = [name for name, _ in txn.cursor()]  # the main database names the others
            if MANIFEST_DB in names:
                return None
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
            if not sealed:
                return None  # a store that never held anything: it is stamped when opened
            txn.put(MANIFEST_KEY, manifest_value(), db=env.open_db(MANIFEST_DB, txn=txn))
        return sealed
    finally:
        env.close()
