"""A store's journal: each commit's writes made durable with one synchronous
write, ahead of LMDB.

LMDB's durable commit costs two: its data pages (fdatasync), then its meta page
(a write through an O_DSYNC descriptor). A publisher waiting for a confirm
waits for both. The journal appends the commit as one record and syncs once;
the store applies the journal to LMDB now and then, many commits in one
transaction (a checkpoint), and then writes the journal over from its start.

The file is zero-filled ahead of the writes, so a sync writes data blocks only,
not the file's size or extents. A flood grows it (a checkpoint's worth, 20 MiB);
a start-over after a small cycle cuts it back to its first stretch.

A record: a mark (4 bytes), payload length (4), number (8), xxh3-64 of those and
the payload (8), the payload, and the checksum again (8). Reading (`scan`) takes
the records from the start while they are whole, intact and numbered one after
another; where they stop, it tells the journal's end from damage:

* the end: zeros, a record left from an earlier cycle (its number is one the
  store has applied), or a torn record: the append a crash cut short, which was
  never confirmed. A torn record lacks its trailing checksum (its last bytes
  were never written), so neither copy of the checksum matches its bytes. (One
  whose header and payload match their checksum is read, trailer or not.)
* damage: an intact record numbered beyond the break (the broken one was
  written whole before it, so it was confirmed); a record that is whole (its
  two checksums agree, or the trailing one matches its bytes) but fails its
  check; a record that runs past the file's end (an append grows the file
  first, in whole blocks), or a file that is not whole blocks long.

A flipped bit in a torn-looking place (the length of the very last record)
reads as a torn tail: the journal cannot tell them apart without a second
synchronous write per commit. Journals an earlier Warren wrote (records without
the mark) are read as it read them.

Where the filesystem allows it, appends bypass the page cache: one write of
whole blocks through an O_DIRECT | O_DSYNC descriptor, from an aligned buffer
that holds the tail block's bytes, then the record, then zeros to the block's
end. That is one system call, not a write and an fdatasync, and the kernel
skips copying the record into the page cache and writing it back from there:
measured here, a 178-byte append took 48 us at the median and 76 us at the
99th percentile, against 51-67 us and 113-225 us. Rewriting the tail block's
earlier bytes is harmless if a crash tears it: they are rewritten unchanged.
Reads (the replay at start, `read` for the tools) bypass the page cache too: a
buffered read racing a direct write can leave the kernel a page it fails to
invalidate, older than the disk. Where the filesystem refuses O_DIRECT (at
open, or at the first write or read), it is a write and an fdatasync, and
buffered reads.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct

import xxhash

_HEAD = struct.Struct("<4sIQ")
MARK = b"\xa7WJ2"  # a record of this format (the mark is in the checksum)
_DIGEST = 8
HEADER_SIZE = _HEAD.size + _DIGEST
TRAILER_SIZE = _DIGEST
_OLD_HEAD = struct.Struct("<IQ")  # an earlier Warren's records: no mark, no trailer
_OLD_HEADER_SIZE = _OLD_HEAD.size + _DIGEST
GROW_BY = 4 << 20  # bytes zero-filled ahead at a time (a multiple of BLOCK)
BLOCK = 4096  # direct writes cover whole blocks of this size, from an aligned buffer
KEEP_BUFFER = 1 << 20  # a direct-write buffer grown past this shrinks after small writes
SHRINK_BELOW = 1 << 20  # a start-over after fewer bytes than this shrinks a grown journal
_ZEROS = bytes(BLOCK)
DIRECT = True  # write through O_DIRECT where the filesystem allows it (tests switch it)


class Journal:
    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        self.offset = 0  # where the next record goes
        if not self._size:  # never empty once created: an empty journal was truncated
            self._grow(0, BLOCK)
        # The direct descriptor, and its buffer: the tail block's bytes up to offset.
        self._direct = _open_direct(path) if DIRECT else None
        self._buffer = mmap.mmap(-1, BLOCK) if self._direct is not None else None

    @property
    def direct(self) -> bool:
        """Do appends bypass the page cache (O_DIRECT | O_DSYNC)?"""
        return self._direct is not None

    def records(self, applied: int = 0) -> list[tuple[int, bytes]]:
        """(number, payload) of the records written since the journal was last
        started over, in order. Written directly, they are read directly too: a
        page the kernel failed to invalidate after a direct write (a buffered
        reader, say `warren inspect`, racing it) may hold older bytes than
        the disk, and the replay must see what the disk holds."""
        return scan(_read_whole(self._fd, self._direct, self._size), applied).records

    def scan(self, applied: int) -> "Scan":
        """What the journal holds beyond record `applied` (see `scan`)."""
        return scan(_read_whole(self._fd, self._direct, self._size), applied)

    def append(self, number: int, payload: bytes) -> int:
        """Write record `number` (> 0) and make it durable; the bytes it took.
        OSError (a full disk) leaves the journal as it was: the next append
        writes over what this one may have left."""
        head = _HEAD.pack(MARK, len(payload), number)
        hasher = xxhash.xxh3_64()  # fed in two parts: no joined copy of a large payload
        hasher.update(head)
        hasher.update(payload)
        digest = hasher.digest()
        end = self.offset + HEADER_SIZE + len(payload) + TRAILER_SIZE
        if _round_up(end) > self._size:
            self._grow(end)
        if self._direct is not None:
            try:
                self._write_direct(head, digest, payload, end)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                self._stop_direct()  # the filesystem took the descriptor, not the write
        if self._direct is None:
            record = b"".join((head, digest, payload, digest))
            if os.pwrite(self._fd, record, self.offset) != len(record):
                raise OSError(errno.EIO, f"a short write to {self.path}")
            os.fdatasync(self._fd)
        written = end - self.offset
        self.offset = end
        return written

    def _write_direct(self, head: bytes, digest: bytes, payload: bytes, end: int) -> None:
        """Write the blocks from the tail block's start to the record's end, the
        record placed behind the tail's bytes and followed by zeros; then keep the
        new tail block's bytes at the buffer's start."""
        assert self._direct is not None and self._buffer is not None  # direct writes only
        start = self.offset - self.offset % BLOCK
        keep = self.offset - start
        length = _round_up(end) - start
        if len(self._buffer) < length:
            self._resize(length, keep)
        buffer = self._buffer
        at = keep + _HEAD.size
        buffer[keep:at] = head
        buffer[at:at + _DIGEST] = digest
        at += _DIGEST
        buffer[at:at + len(payload)] = payload
        at += len(payload)
        buffer[at:at + _DIGEST] = digest
        at += _DIGEST
        buffer[at:length] = _ZEROS[:length - at]
        with memoryview(buffer) as view:
            if os.pwritev(self._direct, [view[:length]], start) != length:
                raise OSError(errno.EIO, f"a short write to {self.path}")
        tail = end - end % BLOCK
        if tail > start:
            buffer[:end - tail] = buffer[tail - start:end - start]
        if len(buffer) > KEEP_BUFFER and 4 * length < len(buffer):
            self._resize(BLOCK, end - tail)  # large commits stopped: do not hold their size

    def _resize(self, length: int, keep: int) -> None:
        """A buffer of at least `length` bytes (whole blocks, at least twice the
        old size if it grows) that starts with the `keep` bytes the tail block
        holds so far."""
        assert self._buffer is not None  # direct writes only
        if length > len(self._buffer):
            length = max(length, 2 * len(self._buffer))
        buffer = mmap.mmap(-1, _round_up(length))
        buffer[:keep] = self._buffer[:keep]
        self._buffer.close()
        self._buffer = buffer

    def _stop_direct(self) -> None:
        assert self._direct is not None
        os.close(self._direct)
        self._direct = None
        self._buffer = None  # unmapped once unused (a failed write's traceback may hold it)

    def start_over(self) -> None:
        """Everything written is applied elsewhere, durably: write from the start.
        The first record is wiped (it need not be synced: a record that survives a
        crash has a number the store has applied), so a closed journal reads empty."""
        if self.offset:
            if self._direct is not None:  # through the same path as the appends
                assert self._buffer is not None  # the direct writes' buffer
                self._buffer[:BLOCK] = _ZEROS
                with memoryview(self._buffer) as view:
                    os.pwritev(self._direct, [view[:BLOCK]], 0)
            else:
                os.pwrite(self._fd, bytes(HEADER_SIZE), 0)
        if self.offset < SHRINK_BELOW and self._size > GROW_BY:
            # A flood grew it and has passed (a purge, the drain after it, a start):
            # give the disk back (a disk alarm waits for it), keeping the first
            # stretch. Not synced: a crash that undoes it leaves applied records.
            os.ftruncate(self._fd, GROW_BY)
            self._size = GROW_BY
        self.offset = 0

    def append_after(self, records: list[tuple[int, bytes]]) -> None:
        """Append behind `records` (this journal's first, as `records` read them),
        not over them: the store could not apply them (a full disk), so they are
        all that holds those commits. The direct buffer takes the tail block's
        bytes, read past the page cache as the records were."""
        self.offset = sum(HEADER_SIZE + len(payload) + TRAILER_SIZE for _, payload in records)
        if self._direct is not None:
            assert self._buffer is not None  # the direct writes' buffer
            tail = self.offset - self.offset % BLOCK
            self._buffer[:self.offset - tail] = \
                _read_whole(self._fd, self._direct, self.offset)[tail:]

    def _grow(self, end: int, by: int = GROW_BY) -> None:
        size = self._size
        target = _round_up(max(end, size + by))
        zeros = bytes(min(target - size, GROW_BY))
        try:
            while size < target:
                size += os.pwrite(self._fd, zeros[:target - size], size)
            os.fsync(self._fd)  # the new size, once, rather than with every record
        except OSError:
            # A full disk: give back what it took, and leave whole blocks (a journal
            # that is not would read as truncated after a crash).
            os.ftruncate(self._fd, self._size)
            raise
        self._size = size

    def close(self) -> None:
        if self._direct is not None:
            self._stop_direct()
        os.close(self._fd)


def _round_up(offset: int) -> int:
    return -(-offset // BLOCK) * BLOCK


def _open_direct(path: str, flags: int = os.O_RDWR | os.O_DSYNC) -> int | None:
    """A descriptor that bypasses the page cache (its writes durable when they
    return, with O_DSYNC); None where the filesystem refuses O_DIRECT."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, flags | flag | os.O_CLOEXEC)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return None


def _read_whole(fd: int, direct: int | None, size: int) -> bytes:
    """The file's first `size` bytes, through `direct` (O_DIRECT) if given and
    the filesystem takes the read, else through `fd`."""
    if direct is not None and size:
        try:
            # Unmapped once unused (not closed here: a failed read's traceback holds it).
            view = memoryview(mmap.mmap(-1, _round_up(size)))
            got = 0
            while got < size:
                count = os.preadv(direct, [view[got:]], got)
                if not count:
                    break
                got += count
            return bytes(view[:min(got, size)])
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
    return os.pread(fd, size, 0) if size else b""


class Scan:
    """A journal's bytes read: `records` from the start while they are intact and
    numbered one after another (what a shard replays); where they stop, `damage`
    says why that is not the journal's end, and `after` holds the intact records
    beyond the break numbered above `applied` (what a salvage keeps)."""

    def __init__(self, records: list[tuple[int, bytes]], damage: str | None = None,
                 after: list[tuple[int, bytes]] | None = None, cut: bool = False):
        self.records = records
        self.damage = damage
        self.after = after or []
        self.cut = cut  # the damage is the journal cut short: what it lost is unknown

    def salvage(self, applied: int) -> list[tuple[int, bytes]]:
        """Every intact record beyond `applied`, in order."""
        return [r for r in self.records if r[0] > applied] + self.after


def scan(data: bytes, applied: int = 0) -> Scan:
    """The journal's records, and whether they end in damage rather than at the
    end of what was written (`applied`: the last record the store holds)."""
    if data[:4] != MARK:
        old = _old_records(data)
        if old:
            return Scan(old)
    found, at = _run(data)
    floor = max(found[-1][0] if found else 0, applied)
    after = [r for r in _intact_from(data, at + 1) if r[0] > floor]
    if after:
        first = after[0][0]
        return Scan(found, f"its journal is damaged at record {floor + 1} (offset {at}); "
                    f"{len(after)} intact records follow, from record {first}", after)
    if not data or len(data) % BLOCK:  # it is created with a block, and grows by blocks
        return Scan(found, f"its journal is truncated ({len(data)} bytes, not whole blocks)",
                    cut=True)
    if at + HEADER_SIZE <= len(data):
        mark, length, number = _HEAD.unpack_from(data, at)
        end = at + HEADER_SIZE + length + TRAILER_SIZE
        if number > floor and mark == MARK and end > len(data):
            return Scan(found, f"its journal is truncated: record {number} runs past its "
                        f"end ({len(data)} bytes)", cut=True)
        # (A record whose mark is damaged still has its two checksums agreeing.)
        if number > floor and end <= len(data) and _whole(data, at, length, mark == MARK):
            return Scan(found, f"its journal is damaged: record {number} (offset {at}) fails "
                        "its checksum")
    return Scan(found)


def _run(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """The intact records from the start, numbered one after another, and where
    they stop."""
    found: list[tuple[int, bytes]] = []
    at = 0
    while True:
        record = _record_at(data, at)
        if record is None or (found and record[0] != found[-1][0] + 1):
            return found, at
        found.append(record)
        at += HEADER_SIZE + len(record[1]) + TRAILER_SIZE


def _record_at(data: bytes, at: int) -> tuple[int, bytes] | None:
    """The intact record at `at`, or None."""
    if at + HEADER_SIZE > len(data) or data[at:at + 4] != MARK:
        return None
    _, length, number = _HEAD.unpack_from(data, at)
    start = at + HEADER_SIZE
    end = start + length
    if number == 0 or end + TRAILER_SIZE > len(data):
        return None
    # (Its trailer is not needed: it tells a torn record from a damaged one.)
    if _digest_of(data, at, length) != data[at + _HEAD.size:start]:
        return None
    return number, data[start:end]


def _digest_of(data: bytes, at: int, length: int) -> bytes:
    hasher = xxhash.xxh3_64()
    hasher.update(memoryview(data)[at:at + _HEAD.size])
    hasher.update(memoryview(data)[at + HEADER_SIZE:at + HEADER_SIZE + length])
    return hasher.digest()


def _whole(data: bytes, at: int, length: int, marked: bool) -> bool:
    """Was the (broken) record at `at` written to its end? Its two checksums
    agree, or (`marked`) the trailing one matches its bytes: a torn write leaves
    neither."""
    head = data[at + _HEAD.size:at + HEADER_SIZE]
    end = at + HEADER_SIZE + length
    trailer = data[end:end + TRAILER_SIZE]
    # (Zeros agree with zeros: a tear can leave both unwritten.)
    return (trailer == head and any(head)) or (marked and trailer == _digest_of(data, at, length))


def _intact_from(data: bytes, at: int) -> list[tuple[int, bytes]]:
    """Intact records that start at or after `at` (wherever a mark begins one), in
    number order, without repeats."""
    found: dict[int, bytes] = {}
    at = data.find(MARK, at)
    while at >= 0:
        record = _record_at(data, at)
        if record is not None:
            found.setdefault(*record)
            at += HEADER_SIZE + len(record[1]) + TRAILER_SIZE
        else:
            at += 1
        at = data.find(MARK, at)
    return sorted(found.items())


def _old_records(data: bytes) -> list[tuple[int, bytes]]:
    """The records of a journal an earlier Warren wrote (no mark, no trailer)."""
    found: list[tuple[int, bytes]] = []
    at = 0
    while at + _OLD_HEADER_SIZE <= len(data):
        length, number = _OLD_HEAD.unpack_from(data, at)
        end = at + _OLD_HEADER_SIZE + length
        if number == 0 or end > len(data) or (found and number != found[-1][0] + 1):
            break
        digest = xxhash.xxh3_64_digest(data[at:at + _OLD_HEAD.size]
                                       + data[at + _OLD_HEADER_SIZE:end])
        if digest != data[at + _OLD_HEAD.size:at + _OLD_HEADER_SIZE]:
            break
        found.append((number, data[at + _OLD_HEADER_SIZE:end]))
        at = end
    return found


def read(path: str) -> list[tuple[int, bytes]]:
    """The records of the journal at `path` (see `read_scan`)."""
    found = read_scan(path)
    return [] if found is None else found.records


def read_scan(path: str, applied: int = 0) -> Scan | None:
    """The journal at `path` scanned, read without writing (None if absent); past
    the page cache where the filesystem allows it, so that reading a running
    broker's journal never races its direct writes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    direct = _open_direct(path, os.O_RDONLY) if DIRECT else None
    try:
        return scan(_read_whole(fd, direct, os.fstat(fd).st_size), applied)
    finally:
        os.close(fd)
        if direct is not None:
            os.close(direct)
