"""A stream segment's records (storage/segmentlog.py keeps the log they make up).

A record: a mark (3 bytes), flags (1), payload length (4), offset (8), timestamp
in ms (8), the xxh3-64 of all the rest (8), then on a chunk's first record the
segment's synced length when it was written (8), then the payload. A chunk is
what one flush wrote to one segment (RabbitMQ's osiris chunk).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

import xxhash

MARK = b"\xa7WS"
CHUNK = 1  # flag: a chunk's first record, followed by the synced length
_HEAD = struct.Struct("<3sBIQq")  # mark, flags, payload length, offset, timestamp
HEAD_SIZE = _HEAD.size + 8  # and the checksum
_SYNCED = struct.Struct("<Q")
SYNCED_SIZE = _SYNCED.size
SCAN_READ = 1 << 20  # what a scan reads at a time


class Record(NamedTuple):
    flags: int
    offset: int
    timestamp: int
    synced: int
    start: int  # the payload's, in the bytes parsed
    end: int


def parse(data: bytes | memoryview, at: int) -> Record | int | None:
    """The intact record at `at`; None if it is not one; or, if `data` ends
    within it, how many bytes from `at` it needs."""
    if len(data) - at < HEAD_SIZE:
        return HEAD_SIZE
    mark, flags, length, offset, timestamp = _HEAD.unpack_from(data, at)
    if mark != MARK or flags & ~CHUNK:
        return None
    start = at + HEAD_SIZE + (_SYNCED.size if flags & CHUNK else 0)
    end = start + length
    if end > len(data):
        return end - at
    view = memoryview(data)
    hasher = xxhash.xxh3_64(view[at:at + _HEAD.size])
    hasher.update(view[at + HEAD_SIZE:end])
    if hasher.digest() != view[at + _HEAD.size:at + HEAD_SIZE]:
        return None
    synced = _SYNCED.unpack_from(data, at + HEAD_SIZE)[0] if flags & CHUNK else 0
    return Record(flags, offset, timestamp, synced, start, end)


def encode(into: bytearray, payload: bytes, offset: int, timestamp: int,
            synced: int | None) -> None:
    """Append a record to `into`; `synced` given makes it a chunk's first."""
    head = _HEAD.pack(MARK, 0 if synced is None else CHUNK, len(payload), offset, timestamp)
    extra = b"" if synced is None else _SYNCED.pack(synced)
    hasher = xxhash.xxh3_64(head)
    hasher.update(extra)
    hasher.update(payload)
    into += b"".join((head, hasher.digest(), extra, payload))


def scan(fd: int, start: int, end: int) -> Iterator[tuple[int, Record, int]]:
    """(position, record, its end) of the intact records from `start`, up to
    `end` or the first that is not."""
    data, at, position = b"", start, start  # at: the file position of data[0]
    fresh = False  # data was read from position: a record it cannot hold is cut short
    while position < end:
        found = parse(data, position - at)
        if isinstance(found, int):
            if fresh or position + found > end:
                return
            data = os.pread(fd, min(max(SCAN_READ, found), end - position), position)
            at, fresh = position, True
            continue
        if found is None:
            return
        yield position, found, at + found.end
        position, fresh = at + found.end, False


def synced_beyond(fd: int, start: int, end: int) -> int:
    """The largest synced length an intact chunk between `start` and `end` claims
    (0 if none): the bytes before it were durable, so a broken record there is
    damage, not a torn tail."""
    found = 0
    at = start
    while at < end:
        data = os.pread(fd, min(SCAN_READ, end - at), at)
        if len(data) < len(MARK):
            break
        hit = data.find(MARK)
        while hit >= 0:
            record = parse(data, hit)
            if isinstance(record, int) and at + hit + record <= end:
                record = parse(os.pread(fd, record, at + hit), 0)
            if isinstance(record, Record) and record.flags & CHUNK:
                found = max(found, record.synced)
            hit = data.find(MARK, hit + 1)
        at += len(data) - len(MARK) + 1  # a mark across the edge is found in the next read
    return found
