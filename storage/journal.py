"""A store's journal: each commit's writes made durable with one synchronous
write, ahead of LMDB.

LMDB's durable commit costs two: its data pages (fdatasync), then its meta page
(a write through an O_DSYNC descriptor). A publisher waiting for a confirm
waits for both. The journal appends the commit as one record and syncs once;
the store applies the journal to LMDB now and then, many commits in one
transaction (a checkpoint), and then writes the journal over from its start.

The file is zero-filled ahead of the writes, so a sync writes data blocks only,
not the file's size or extents. It never shrinks. Each record carries its
number and a checksum: reading stops at the first record that is torn, damaged,
zero, or not the next number, which is where the last cycle's writes ended (a
record left from an earlier cycle has a lower number).

A record: payload length (4 bytes), number (8), xxh3-64 of both and the payload
(8), payload.
"""

from __future__ import annotations

import errno
import os
import struct

import xxhash

_HEAD = struct.Struct("<IQ")
_DIGEST = 8
HEADER_SIZE = _HEAD.size + _DIGEST
GROW_BY = 4 << 20  # bytes zero-filled ahead at a time


class Journal:
    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        self.offset = 0  # where the next record goes

    def records(self) -> list[tuple[int, bytes]]:
        """(number, payload) of the records written since the journal was last
        started over, in order."""
        return records_in(os.pread(self._fd, self._size, 0) if self._size else b"")

    def append(self, number: int, payload: bytes) -> int:
        """Write record `number` (> 0) and make it durable; the bytes it took.
        OSError (a full disk) leaves the journal as it was: the next append
        writes over what this one may have left."""
        head = _HEAD.pack(len(payload), number)
        record = b"".join((head, xxhash.xxh3_64_digest(head + payload), payload))
        end = self.offset + len(record)
        if end > self._size:
            self._grow(end)
        if os.pwrite(self._fd, record, self.offset) != len(record):
            raise OSError(errno.EIO, f"a short write to {self.path}")
        os.fdatasync(self._fd)
        self.offset = end
        return len(record)

    def start_over(self) -> None:
        """Everything written is applied elsewhere, durably: write from the start.
        The first record is wiped (not synced: a record that survives a crash has
        a number the store has applied), so a closed journal reads empty."""
        if self.offset:
            os.pwrite(self._fd, bytes(HEADER_SIZE), 0)
        self.offset = 0

    def _grow(self, end: int) -> None:
        size = self._size
        target = max(end, size + GROW_BY)
        zeros = bytes(min(target - size, GROW_BY))
        while size < target:
            size += os.pwrite(self._fd, zeros[:target - size], size)
        os.fsync(self._fd)  # the new size, once, rather than with every record
        self._size = size

    def close(self) -> None:
        os.close(self._fd)


def records_in(data: bytes) -> list[tuple[int, bytes]]:
    """The records a journal's bytes hold: from the start, while they are whole,
    intact and numbered one after another."""
    found: list[tuple[int, bytes]] = []
    at = 0
    while at + HEADER_SIZE <= len(data):
        length, number = _HEAD.unpack_from(data, at)
        end = at + HEADER_SIZE + length
        if number == 0 or end > len(data) or (found and number != found[-1][0] + 1):
            break
        digest = xxhash.xxh3_64_digest(data[at:at + _HEAD.size] + data[at + HEADER_SIZE:end])
        if digest != data[at + _HEAD.size:at + HEADER_SIZE]:
            break
        found.append((number, data[at + HEADER_SIZE:end]))
        at = end
    return found


def read(path: str) -> list[tuple[int, bytes]]:
    """The records of the journal at `path`, read without writing (none if absent)."""
    try:
        with open(path, "rb") as f:
            return records_in(f.read())
    except FileNotFoundError:
        return []
