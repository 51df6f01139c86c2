"""A stream's append-only log: a directory of segment files named by the offset
of their first record (`00000000000000000000.seg`), each with an index (`.idx`).
Its records (storage/segmentrecord.py) are checksummed, and chunked by flush:
`reader("last")` starts at the last chunk. Timestamps never go back (a clock
stepping back stores the previous one), so segments and index entries are in
time order too.

The index has an entry every INDEX_RECORDS records or INDEX_BYTES bytes: offset,
timestamp, position, its chunk's first offset, the synced length then, and their
checksum. A seek reads one step of records; on disk rather than rebuilt at open,
so that opening a long stream reads one step per segment, not the stream. The
newest segment's index is written with each flush, not synced; a full segment is
synced with its index before the next one exists, so all but the newest are whole.

Opening checks the newest segment from the last position its index or its chunks
say was synced: a record before that which fails its checksum is damage, as is
an intact record out of sequence or an older segment cut short; the first broken
record after it is a torn tail (a flush the crash cut short, never confirmed),
cut off. A flipped bit in the last synced chunk with nothing written after it
reads as a torn tail: telling them apart would cost a second sync per commit.
Other records are checked as they are read, from the files (pread, through a
small buffer per reader), never from a copy in memory.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from array import array
from collections.abc import Iterable
from typing import NamedTuple

import xxhash

from .segmentrecord import CHUNK, HEAD_SIZE, SYNCED_SIZE, Record, encode, parse, scan, synced_beyond

_ENTRY = struct.Struct("<QqQQQ")  # offset, timestamp, position, chunk, synced
ENTRY_SIZE = _ENTRY.size + 8  # and its xxh3-64
INDEX_RECORDS = 512
INDEX_BYTES = 64 << 10
READ_AHEAD = 64 << 10  # a reader's buffer
# Older segments' descriptors kept open for readers, the least recently used closed
# first: a long stream of small segments would otherwise hold thousands.
OPEN_SEGMENTS = 16
# The newest records read, shared by the readers near the head: ten consumers of a
# stream parse and check each record once between them, not ten times.
RECENT_RECORDS = 4096
RECENT_BYTES = 4 << 20
_NAME_DIGITS = 20


class SegmentLogDamaged(Exception):
    """The log on disk is not what was written, beyond what a crash explains."""


class SegmentInfo(NamedTuple):
    first_offset: int
    last_offset: int
    bytes: int


class Stats(NamedTuple):
    segments: int
    bytes: int  # the segment files (their indexes add under a per mille)
    first_offset: int
    last_offset: int  # first_offset - 1 when the log keeps nothing
    durable_offset: int
    messages: int


class _Index:
    """A segment's sparse index, in memory."""

    def __init__(self) -> None:
        self.columns = tuple(array("q") for _ in range(5))
        self.offsets, self.timestamps, self.positions, self.chunks, self.synced = self.columns

    def __len__(self) -> int:
        return len(self.offsets)

    def due(self, offset: int, position: int, every: int, step: int) -> bool:
        return not self.offsets or offset - self.offsets[-1] >= every \
            or position - self.positions[-1] >= step

    def add(self, *entry: int) -> None:
        """Take (offset, timestamp, position, chunk, synced)."""
        for column, value in zip(self.columns, entry):
            column.append(value)

    def cut(self, count: int) -> None:
        for column in self.columns:
            del column[count:]

    def packed(self, row: int) -> bytes:
        packed = _ENTRY.pack(*(column[row] for column in self.columns))
        return packed + xxhash.xxh3_64_digest(packed)

    @classmethod
    def load(cls, data: bytes, base: int, size: int) -> _Index:
        """The entries of an index file while they are intact and in order (the
        newest segment's is not synced: a crash may leave a torn end)."""
        index = cls()
        for at in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
            packed = data[at:at + _ENTRY.size]
            if xxhash.xxh3_64_digest(packed) != data[at + _ENTRY.size:at + ENTRY_SIZE]:
                break
            offset, timestamp, position, chunk, synced = _ENTRY.unpack(packed)
            if index:
                in_order = offset > index.offsets[-1] and position > index.positions[-1] \
                    and timestamp >= index.timestamps[-1]
            else:
                in_order = offset == base and position == 0
            if not in_order or position >= size or chunk > offset:
                break
            index.add(offset, timestamp, position, chunk, synced)
        return index


class _Segment:
    def __init__(self, directory: str, base: int, flags: int) -> None:
        self.base = base
        self.path = os.path.join(directory, f"{base:0{_NAME_DIGITS}d}.seg")
        self.index_path = self.path[:-4] + ".idx"
        self.fd = os.open(self.path, os.O_CLOEXEC | flags, 0o600)  # -1: closed (_fd opens it)
        self.size = 0  # bytes flushed
        self.synced = 0  # bytes made durable
        self.last = base - 1  # the last record's offset
        self.last_timestamp = 0
        self.last_chunk = base  # the offset of the last chunk's first record
        self.index: _Index | None = None  # in memory for the newest segment only
        self.index_fd: int | None = None


class SegmentLog:
    """One stream's log (see the module's docstring). Offsets run 0, 1, 2 ...;
    `append` buffers, `flush` writes, `sync` makes durable; readers see what
    is durable."""

    def __init__(self, path: str, max_segment_bytes: int, index_records: int,
                 index_bytes: int, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self.max_segment_bytes = max_segment_bytes
        self._index_records = index_records
        self._index_bytes = index_bytes
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._pending: list[tuple[bytes, int]] = []
        self._next = 0
        self._flushed = 0  # the offset the next flush starts at
        self._durable = -1
        self._durable_chunk: int | None = None
        self._flushed_chunk: int | None = None
        self._timestamp = 0  # the last timestamp given out
        self._directory_dirty = False
        self._opened: dict[int, _Segment] = {}  # older segments with a descriptor, by use
        self._recent = _Recent()

    @classmethod
    def open(cls, path: str, max_segment_bytes: int = 500_000_000,
             index_records: int = INDEX_RECORDS, index_bytes: int = INDEX_BYTES,
             readonly: bool = False) -> SegmentLog:
        """Open (and recover) the log at `path`; `readonly` writes nothing, not
        even the cut of a torn tail (`warren inspect` beside a running broker)."""
        if not readonly:
            os.makedirs(path, exist_ok=True)
        log = cls(path, max_segment_bytes, index_records, index_bytes, readonly)
        names = set(os.listdir(path))
        bases = sorted(int(name[:-4]) for name in names if name.endswith(".seg")
                       and len(name) == _NAME_DIGITS + 4 and name[:-4].isdigit())
        for name in names:  # an index whose segment retention removed first
            if name.endswith(".idx") and f"{name[:-4]}.seg" not in names and not readonly:
                os.unlink(os.path.join(path, name))
        try:
            for number, base in enumerate(bases):
                segment = _Segment(path, base, os.O_RDONLY if readonly else os.O_RDWR)
                log._segments.append(segment)
                log._bases.append(base)
                log._recover(segment, newest=number == len(bases) - 1)
                if number and base != log._segments[-2].last + 1:
                    raise SegmentLogDamaged(
                        f"stream log {path}: segment {segment.path} starts at offset {base}, "
                        f"the one before it ends at {log._segments[-2].last}")
        except BaseException:
            log._close_files()
            raise
        if log._segments:
            log._durable = log._segments[-1].last
            log._next = log._flushed = log._durable + 1
            kept = [s for s in log._segments if s.last >= s.base]
            if kept:
                log._durable_chunk = log._flushed_chunk = kept[-1].last_chunk
                log._timestamp = kept[-1].last_timestamp
        return log

    def _recover(self, segment: _Segment, newest: bool) -> None:
        size = os.fstat(segment.fd).st_size
        index_fd = None
        if self.readonly:
            stored = _read_file(segment.index_path)
        else:
            index_fd = segment.index_fd = os.open(
                segment.index_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            stored = os.pread(index_fd, os.fstat(index_fd).st_size, 0)
        index = _Index.load(stored, segment.base, size)
        positions, old_synced = index.positions[:], index.synced[:]
        # Records before the last length known synced were written whole: check from
        # the last entry before it, which must be intact (an older segment was synced
        # whole: check its last index step).
        synced = max(index.synced, default=0)
        keep = max(1, bisect.bisect_left(index.positions, synced) if newest else len(index))
        keep = min(keep, len(index)) if index else 1
        start, expected, chunk = (index.positions[keep - 1], index.offsets[keep - 1],
                                  index.chunks[keep - 1]) if index else (0, segment.base,
                                                                         segment.base)
        index.cut(keep - 1)
        end, timestamp = start, index.timestamps[-1] if index else 0
        for position, record, end in scan(segment.fd, start, size):
            if record.offset != expected or record.timestamp < timestamp:
                raise SegmentLogDamaged(
                    f"stream segment {segment.path} is damaged: the record at byte {position} "
                    f"has offset {record.offset} and timestamp {record.timestamp}, after offset "
                    f"{expected - 1} and timestamp {timestamp}")
            if record.flags & CHUNK:
                chunk = record.offset
                synced = max(synced, record.synced)
            if index.due(record.offset, position, self._index_records, self._index_bytes):
                row = len(index)  # (an entry rebuilt as it was keeps its synced length)
                same = row < len(positions) and positions[row] == position
                index.add(record.offset, record.timestamp, position, chunk,
                          old_synced[row] if same else -1)
            expected, timestamp = record.offset + 1, record.timestamp
        if end < size:
            synced = max(synced, synced_beyond(segment.fd, end, size)) if newest else size
            if end < synced:
                raise SegmentLogDamaged(
                    f"stream segment {segment.path} is damaged at byte {end} (offset {expected})"
                    ": the record there fails its checksum or is cut short, and " + (
                        f"the segment was synced to byte {synced}" if newest
                        else "only the newest segment may end in a torn write"))
            if not self.readonly:
                os.ftruncate(segment.fd, end)  # a torn tail: never synced, never confirmed
        if newest and not self.readonly:
            os.fdatasync(segment.fd)  # what a killed process left in the page cache
        for row in range(keep - 1, len(index)):
            if index.synced[row] < 0:
                index.synced[row] = end  # an entry rebuilt: synced from now on
        rebuilt = b"".join(index.packed(row) for row in range(len(index)))
        if rebuilt != stored and index_fd is not None:
            os.ftruncate(index_fd, 0)
            os.pwrite(index_fd, rebuilt, 0)
            os.fdatasync(index_fd)
        segment.size = segment.synced = end
        segment.last, segment.last_timestamp, segment.last_chunk = expected - 1, timestamp, chunk
        if newest:
            segment.index = index
            return
        if index_fd is not None:
            os.close(index_fd)
            segment.index_fd = None  # (an older segment's index is read when a seek needs it)
        os.close(segment.fd)
        segment.fd = -1

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def first_offset(self) -> int:
        return self._segments[0].base if self._segments else self._flushed

    @property
    def durable_offset(self) -> int:
        """The last offset synced (-1 before any): confirms go out up to it."""
        return self._durable

    def append(self, payload: bytes, timestamp_ms: int) -> int:
        """Buffer a record; its offset."""
        self._timestamp = max(self._timestamp, timestamp_ms)
        self._pending.append((payload, self._timestamp))
        self._next += 1
        return self._next - 1

    def append_many(self, payloads: Iterable[bytes], timestamp_ms: int) -> range:
        """Buffer records that arrived together; their offsets."""
        first = self._next
        self._timestamp = timestamp = max(self._timestamp, timestamp_ms)
        self._pending.extend((payload, timestamp) for payload in payloads)
        self._next = self._flushed + len(self._pending)
        return range(first, self._next)

    def flush(self) -> None:
        """Write what is buffered: one write per segment it reaches. After an
        OSError (a full disk) what was not written stays buffered."""
        if self.readonly and self._pending:
            raise PermissionError(f"stream log {self.path} is open read-only")
        while self._pending:
            segment = self._segments[-1] if self._segments else None
            if segment is None or segment.size and segment.size + HEAD_SIZE + SYNCED_SIZE \
                    + len(self._pending[0][0]) > self.max_segment_bytes:
                if segment is not None:
                    self._seal(segment)
                segment = self._create(self._flushed)
            del self._pending[:self._write(segment)]

    def _write(self, segment: _Segment) -> int:
        """Write, as one chunk, the buffered records that fit in `segment` (at
        least one); how many."""
        index, index_fd = segment.index, segment.index_fd
        assert index is not None and index_fd is not None  # the newest segment's
        data = bytearray()
        entries = len(index)
        offset = self._flushed
        for payload, timestamp in self._pending:
            position = segment.size + len(data)
            if data and position + HEAD_SIZE + len(payload) > self.max_segment_bytes:
                break
            encode(data, payload, offset, timestamp, None if data else segment.synced)
            if index.due(offset, position, self._index_records, self._index_bytes):
                index.add(offset, timestamp, position, self._flushed, segment.synced)
            offset += 1
        try:
            if os.pwrite(segment.fd, data, segment.size) != len(data):
                raise OSError(f"a short write to {segment.path}")
            os.pwrite(index_fd, b"".join(index.packed(row) for row in range(
                entries, len(index))), entries * ENTRY_SIZE)
        except BaseException:
            index.cut(entries)
            raise
        segment.size += len(data)
        segment.last_chunk = self._flushed_chunk = self._flushed
        written, self._flushed = offset - self._flushed, offset
        segment.last, segment.last_timestamp = offset - 1, self._pending[written - 1][1]
        return written

    def _seal(self, segment: _Segment) -> None:
        """A segment is full: make it and its index durable before the next one
        exists (every segment but the newest is whole)."""
        assert segment.index_fd is not None
        os.fdatasync(segment.fd)
        os.fdatasync(segment.index_fd)
        os.close(segment.index_fd)
        segment.index_fd, segment.index, segment.synced = None, None, segment.size
        self._sync_directory()
        self._durable, self._durable_chunk = segment.last, segment.last_chunk

    def _create(self, base: int) -> _Segment:
        segment = _Segment(self.path, base, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        segment.index_fd = os.open(segment.index_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC
                                   | os.O_CLOEXEC, 0o600)
        segment.index, self._directory_dirty = _Index(), True
        self._segments.append(segment)
        self._bases.append(base)
        if len(self._segments) > 1:
            self._fd(self._segments[-2])  # among the older segments' descriptors now
        return segment

    def sync(self) -> None:
        """Flush, and make everything written durable."""
        point = self.sync_point()
        point.run()
        self.synced(point)

    def sync_point(self) -> SyncPoint:
        """Flush, and what makes it durable: the shard's group commit runs it in
        its committer thread, then hands it back to `synced`."""
        self.flush()
        newest = self._segments[-1] if self._segments else None
        due = newest is not None and newest.synced < newest.size
        point = SyncPoint(os.dup(newest.fd) if newest and due else None,
                          self.path if self._directory_dirty else None, newest,
                          newest.size if newest else 0, self._flushed - 1, self._flushed_chunk)
        self._directory_dirty = False
        return point

    def synced(self, point: SyncPoint) -> None:
        """`point` has run: what it covers is durable (confirms may go out)."""
        if point.segment is not None:
            point.segment.synced = max(point.segment.synced, point.size)
        if point.offset > self._durable:
            self._durable, self._durable_chunk = point.offset, point.chunk

    def _sync_directory(self) -> None:
        if self._directory_dirty:
            _fsync_directory(self.path)
            self._directory_dirty = False

    def apply_retention(self, max_bytes: int | None = None, max_age_ms: int | None = None,
                        now_ms: int | None = None) -> list[SegmentInfo]:
        """Delete the oldest segments while the log holds more than `max_bytes`
        or their newest record is older than `max_age_ms`; never the newest
        segment. What was deleted, oldest first."""
        if self.readonly:
            raise PermissionError(f"stream log {self.path} is open read-only")
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        total = sum(segment.size for segment in self._segments)
        dropped: list[SegmentInfo] = []
        while len(self._segments) > 1:
            oldest = self._segments[0]
            if not ((max_bytes is not None and total > max_bytes) or (
                    max_age_ms is not None and oldest.last_timestamp < now_ms - max_age_ms)):
                break
            os.unlink(oldest.path)
            os.unlink(oldest.index_path)
            if oldest.fd >= 0:
                os.close(oldest.fd)
            self._opened.pop(oldest.base, None)
            del self._segments[0], self._bases[0]
            self._recent.forget_before(oldest.last + 1)
            total -= oldest.size
            dropped.append(SegmentInfo(oldest.base, oldest.last, oldest.size))
        if dropped:  # durable at once: a crash that brought back some would leave a gap
            self._directory_dirty = True
            self._sync_directory()
        return dropped

    def stats(self) -> Stats:
        return Stats(len(self._segments), sum(segment.size for segment in self._segments),
                     self.first_offset, self._next - 1, self._durable,
                     self._next - self.first_offset)

    def segments(self) -> list[SegmentInfo]:
        return [SegmentInfo(s.base, s.last, s.size) for s in self._segments]

    def reader(self, start: str | int | tuple[str, int] = "next") -> Reader:
        """A reader from `start`: "first", "last" (the last durable chunk),
        "next", an offset (clamped to what the log keeps), or ("timestamp", ms):
        the first record stamped at or after ms."""
        if start == "first":
            offset = self.first_offset
        elif start == "last":
            offset = max(self._durable_chunk or 0, self.first_offset)
        elif start == "next":
            offset = self._next
        elif isinstance(start, int) and not isinstance(start, bool):
            offset = min(max(start, self.first_offset), self._next)
        elif isinstance(start, tuple) and len(start) == 2 and start[0] == "timestamp" \
                and isinstance(start[1], int):
            offset = self._offset_at(start[1])
        else:
            raise ValueError(f"a stream reader cannot start at {start!r}")
        return Reader(self, offset)

    def _offset_at(self, timestamp: int) -> int:
        """The first flushed record stamped at or after `timestamp`, else the
        offset the next flush starts at."""
        kept = [s for s in self._segments if s.last >= s.base]
        number = bisect.bisect_left([s.last_timestamp for s in kept], timestamp)
        if number == len(kept):
            return self._flushed
        segment = kept[number]
        index = self._index(segment)
        row = max(0, bisect.bisect_left(index.timestamps, timestamp) - 1)
        for _, record, _ in scan(self._fd(segment), index.positions[row], segment.size):
            if record.timestamp >= timestamp:
                return record.offset
        raise SegmentLogDamaged(f"stream segment {segment.path} is damaged after offset "
                                f"{index.offsets[row]}: a record fails its checksum")

    def _index(self, segment: _Segment) -> _Index:
        """A segment's index: the newest's is in memory, an older one is read (a
        few hundred kB for a full segment, once per seek into it)."""
        if segment.index is not None:
            return segment.index
        return _Index.load(_read_file(segment.index_path), segment.base, segment.size)

    def _locate(self, offset: int) -> tuple[_Segment, int, int]:
        """The segment holding `offset`, and the position and offset of the index
        entry at or before it."""
        segment = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        index = self._index(segment)
        if not index:
            return segment, 0, segment.base
        row = max(0, bisect.bisect_right(index.offsets, offset) - 1)
        return segment, index.positions[row], index.offsets[row]

    def close(self) -> None:
        """Sync and close (the files are closed even if the sync fails)."""
        try:
            if not self.readonly:
                self.sync()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        for segment in self._segments:
            if segment.fd >= 0:
                os.close(segment.fd)
            if segment.index_fd is not None:
                os.close(segment.index_fd)
        self._segments.clear()
        self._bases.clear()
        self._opened.clear()
        self._recent = _Recent()

    def _fd(self, segment: _Segment) -> int:
        """A segment's descriptor: the newest's stays open, an older one is
        opened when read (and joins the most recently used)."""
        if segment is self._segments[-1]:
            return segment.fd
        if segment.fd < 0:
            segment.fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
        self._opened.pop(segment.base, None)
        self._opened[segment.base] = segment
        if len(self._opened) > OPEN_SEGMENTS:
            unused = self._opened.pop(next(iter(self._opened)))
            os.close(unused.fd)
            unused.fd = -1
        return segment.fd


def _read_file(path: str) -> bytes:
    """A file's bytes; none if it is missing (an index a read-only open rebuilds
    in memory)."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return b""


class SyncPoint(NamedTuple):
    """A sync to run once, in any thread: it touches only its own descriptor."""
    fd: int | None  # a duplicate of the newest segment's, if it has bytes to sync
    directory: str | None  # to sync: segments were created
    segment: _Segment | None
    size: int
    offset: int
    chunk: int | None

    def run(self) -> None:
        if self.fd is not None:
            try:
                os.fdatasync(self.fd)
            finally:
                os.close(self.fd)
        if self.directory is not None:
            _fsync_directory(self.directory)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)  # the segments created or deleted
    finally:
        os.close(fd)


class _Recent:
    """The newest records readers took from the files, at consecutive offsets from
    `first`: (offset, timestamp, payload), and beside each the segment and the
    position after it. A read that starts past its end starts it again there (the
    head moved on); one behind it leaves it alone, so a reader far back does not
    push out what the others share."""

    __slots__ = ("first", "records", "ends", "bytes")

    def __init__(self) -> None:
        self.first = 0
        self.records: list[tuple[int, int, bytes]] = []
        self.ends: list[tuple[_Segment, int]] = []
        self.bytes = 0

    def add(self, record: tuple[int, int, bytes], segment: _Segment, end: int) -> None:
        records = self.records
        if record[0] != self.first + len(records):
            if record[0] < self.first + len(records):
                return
            self._drop(len(records))
            self.first = record[0]
        records.append(record)
        self.ends.append((segment, end))
        self.bytes += len(record[2])
        if len(records) > 2 * RECENT_RECORDS or self.bytes > RECENT_BYTES:
            self._drop(len(records) // 2)  # in halves: a list's front is dear to cut

    def _drop(self, count: int) -> None:
        self.bytes -= sum(len(record[2]) for record in self.records[:count])
        del self.records[:count], self.ends[:count]
        self.first += count

    def forget_before(self, offset: int) -> None:
        """Retention deleted the records before `offset`."""
        self._drop(max(0, min(offset - self.first, len(self.records))))
        if not self.records:
            self.first = max(self.first, offset)


class Reader:
    """Reads the log from an offset on, through a small buffer (pread from the
    segment files), up to the durable offset. Segments retention deletes under
    it move it to the first offset kept."""

    def __init__(self, log: SegmentLog, offset: int) -> None:
        self._log = log
        self.offset = offset  # the next record to return
        self._segment: _Segment | None = None
        self._position = 0
        self._at = 0  # the offset of the record at _position
        self._data = b""
        self._data_at = 0  # the file position of _data[0]

    def read(self, max_records: int = 256, max_bytes: int = 1 << 20) -> list[
            tuple[int, int, bytes]]:
        """Up to `max_records` (offset, timestamp, payload), their payloads at most
        `max_bytes` together (at least one record, whatever its size)."""
        log = self._log
        found: list[tuple[int, int, bytes]] = []
        taken = 0
        recent = log._recent
        while len(found) < max_records:
            self.offset = max(self.offset, log.first_offset)
            if self.offset > log.durable_offset:
                break
            at = self.offset - recent.first
            if 0 <= at < len(recent.records):
                shared = recent.records[at:at + max_records - len(found)]
                size = sum(len(record[2]) for record in shared)
                while len(shared) > 1 and taken + size > max_bytes:
                    size -= len(shared.pop()[2])
                if found and taken + size > max_bytes:
                    break
                found += shared
                taken += size
                self.offset = self._at = shared[-1][0] + 1
                self._segment, self._position = recent.ends[at + len(shared) - 1]
                self._data, self._data_at = b"", self._position
                continue
            segment = self._segment
            if segment is None or segment.base < log.first_offset \
                    or self._position >= segment.size:  # a start, a segment deleted, one read
                segment, self._position, self._at = log._locate(
                    self.offset if segment is None or segment.base < log.first_offset
                    else self._at)
                self._segment, self._data, self._data_at = segment, b"", self._position
            record, data = self._record(segment)
            length = record.end - record.start
            if record.offset >= self.offset:
                if found and taken + length > max_bytes:
                    break
                read = (record.offset, record.timestamp, data[record.start:record.end])
                found.append(read)
                taken += length
                self.offset = record.offset + 1
                recent.add(read, segment, self._data_at + record.end)
            self._position = self._data_at + record.end
            self._at += 1
        return found

    def _record(self, segment: _Segment) -> tuple[Record, bytes]:
        """The record at the reader's position, and the bytes it was parsed in:
        read at most twice, once for its head (the buffer may end before it) and
        once for all of it (a record larger than the buffer)."""
        for _ in range(3):
            found = parse(self._data, self._position - self._data_at)
            if isinstance(found, Record) and found.offset == self._at:
                return found, self._data
            if not isinstance(found, int) or self._position + found > segment.size:
                break
            self._data, self._data_at = os.pread(self._log._fd(segment), max(READ_AHEAD, found),
                                                 self._position), self._position
        raise SegmentLogDamaged(
            f"stream segment {segment.path} is damaged at byte {self._position} (offset "
            f"{self._at}): the record there fails its checksum or is out of sequence")
