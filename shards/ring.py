"""A single-producer/single-consumer byte ring in shared memory, with eventfd doorbells.

Layout: a header of four 64-byte-separated words (so producer and consumer
never write the same cache line), then the data area:

    head            bytes ever written (producer only)
    tail            bytes ever consumed (consumer only)
    reader_sleeping consumer found the ring empty and waits on data_fd
    writer_waiting  producer found the ring full and waits on space_fd

Records are a 4-byte length word and the bytes, padded to 4 bytes so a length
word never straddles the end. A record that does not fit before the end is
preceded by a wrap marker. Records larger than an eighth of the ring go in
fragments (a flag in the length word says more follow) that the reader joins,
so any size works even through a small ring; fragments not yet written wait
inside the Ring and are pushed out by later writes (`backlogged()` tells).

A record may be written from several pieces (a list: a batch's encoding and the
large bodies behind it), each copied once, straight into the ring; fragments are
views of those pieces, never copies. The reader hands each record to a decode
function as a view of the ring itself and frees the space after, so what it
decodes is copied out once (a joined fragmented record once more).

Doorbells never lose a wake-up: a sleeper sets its flag, then re-checks; the
other side publishes its counter, then reads the flag and rings. Rings with one reader
may share a data doorbell (a shard reads every gateway's command ring): the
reader sets the flag of each, re-checks each, then waits on the one eventfd.
Plain stores
are enough for that ordering on x86-64 (TSO); a weaker memory model would need
fences around the counter updates.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from collections import deque

import msgspec

from . import build

_HEAD, _TAIL, _READER_SLEEPING, _WRITER_WAITING = 0, 64, 128, 192
HEADER_SIZE = 256
_u64 = struct.Struct("<Q")
_u32 = struct.Struct("<I")
WRAP = 0xFFFFFFFF
MORE = 0x80000000  # length-word flag: another fragment of this record follows
_LENGTH_MASK = 0x7FFFFFFF


class RingSpec(msgspec.Struct, array_like=True):
    shm_name: str
    capacity: int  # bytes of the data area
    data_fd: int  # producer -> consumer: records available
    space_fd: int  # consumer -> producer: space available


SEGMENTS = "/dev/shm"  # where POSIX shared memory lives on Linux


def remove_orphans(folder: str = SEGMENTS) -> list[str]:
    """Unlink the rings of processes that are gone (a gateway killed with -9 cannot
    unlink its own): warren_<pid>_* whose creator no longer runs. Their names."""
    removed = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        parts = name.split("_")
        if len(parts) != 3 or parts[0] != "warren" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its creator runs (or a process that reuses its pid does)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # someone else's process
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _padded(n: int) -> int:
    return (n + 3) & ~3


class RingCore:
    """The hot half of a ring: its shared counters, doorbell flags and records, over
    the mapped segment. The pure Python twin of _ring.RingCore (compiled by pip
    install); `Ring` below is built on whichever serves. The shell sets
    _fragments, _partial and _max_fragment and binds the segment."""

    def _bind(self, buf, capacity: int, data_fd: int, space_fd: int) -> None:
        self._buf = buf
        self.capacity = capacity
        self._data_fd = data_fd
        self._space_fd = space_fd

    def _unbind(self) -> None:
        """Let go of the segment (before it is unmapped)."""

    # -- shared counters -------------------------------------------------------

    def _get(self, offset: int) -> int:
        return _u64.unpack_from(self._buf, offset)[0]

    def _set(self, offset: int, value: int) -> None:
        _u64.pack_into(self._buf, offset, value)

    def free_space(self) -> int:
        return self.capacity - (self._get(_HEAD) - self._get(_TAIL))

    def is_empty(self) -> bool:
        return self._get(_HEAD) == self._get(_TAIL)

    def written(self) -> int:
        """Bytes ever written (a position in the ring's stream)."""
        return self._get(_HEAD)

    def consumed(self) -> int:
        """Bytes ever read and freed by the consumer."""
        return self._get(_TAIL)

    # -- producer --------------------------------------------------------------

    def write_many(self, records) -> int:
        """Write records in order as far as they fit; return how many were taken.
        A record is bytes-like, or a list of bytes-like pieces written back to back."""
        head = self._get(_HEAD)
        tail = self._get(_TAIL)
        head = self._push_fragments(head, tail)
        taken = 0
        if not self._fragments:
            for record in records:
                pieces = record if type(record) is list else (record,)
                size = sum(map(len, pieces)) if type(record) is list else len(record)
                if size > self._max_fragment:
                    self._fragment(pieces, size)
                    taken += 1
                    head = self._push_fragments(head, tail)
                    if self._fragments:
                        break
                    continue
                new_head = self._put(head, tail, pieces, size, 0)
                if new_head is None:
                    break
                head = new_head
                taken += 1
        self._set(_HEAD, head)
        return taken

    def backlogged(self) -> bool:
        """Fragments of an accepted large record still wait for ring space."""
        return bool(self._fragments)

    def _push_fragments(self, head: int, tail: int) -> int:
        while self._fragments:
            pieces, more = self._fragments[0]
            new_head = self._put(head, tail, pieces, sum(map(len, pieces)), MORE if more else 0)
            if new_head is None:
                break
            head = new_head
            self._fragments.popleft()
        return head

    def _put(self, head: int, tail: int, pieces, size: int, flags: int) -> int | None:
        """Write one length-prefixed record of `size` bytes from `pieces` at `head`;
        the new head, or None if full."""
        need = 4 + _padded(size)
        pos = head % self.capacity
        room_to_end = self.capacity - pos
        wrap = need > room_to_end
        if (room_to_end if wrap else 0) + need > self.capacity - (head - tail):
            return None
        buf = self._buf
        if wrap:
            _u32.pack_into(buf, HEADER_SIZE + pos, WRAP)
            head += room_to_end
            pos = 0
        start = HEADER_SIZE + pos
        _u32.pack_into(buf, start, size | flags)
        start += 4
        for piece in pieces:
            end = start + len(piece)
            buf[start:end] = piece
            start = end
        return head + need

    def flush(self) -> None:
        """Ring the data doorbell once, if the consumer said it sleeps."""
        if _u32.unpack_from(self._buf, _READER_SLEEPING)[0]:
            _u32.pack_into(self._buf, _READER_SLEEPING, 0)
            os.eventfd_write(self._data_fd, 1)

    def want_space(self) -> bool:
        """Producer is stuck: ask for the space doorbell. True if still stuck
        (wait for space_fd, then clear_space_doorbell() and write again)."""
        _u32.pack_into(self._buf, _WRITER_WAITING, 1)
        if self.free_space() >= self.capacity // 2:
            _u32.pack_into(self._buf, _WRITER_WAITING, 0)
            return False
        return True

    def want_read_to(self, position: int) -> bool:
        """Producer waits for the consumer to read up to `position` (written()
        then): ask for the space doorbell. True if still unread (wait for space_fd;
        it rings once a read leaves half the ring free)."""
        _u32.pack_into(self._buf, _WRITER_WAITING, 1)
        if self._get(_TAIL) >= position:
            _u32.pack_into(self._buf, _WRITER_WAITING, 0)
            return False
        return True

    # -- consumer --------------------------------------------------------------

    def read_many(self, decode=bytes, max_records: int = 1 << 30) -> list:
        """`decode(record)` of each whole record (fragments joined), in order; the
        record is a view of the ring, valid only during the call, so `decode` must
        copy what it keeps (the default copies the record). Frees the space once."""
        head = self._get(_HEAD)
        tail = self._get(_TAIL)
        records: list = []
        buf = self._buf
        try:
            while tail < head and len(records) < max_records:
                pos = tail % self.capacity
                word = _u32.unpack_from(buf, HEADER_SIZE + pos)[0]
                if word == WRAP:
                    tail += self.capacity - pos
                    continue
                size = word & _LENGTH_MASK
                start = HEADER_SIZE + pos + 4
                tail += 4 + _padded(size)  # the space is freed below, after decoding
                with buf[start:start + size] as data:
                    if word & MORE:
                        self._partial += data
                    elif self._partial:
                        self._partial += data
                        whole, self._partial = self._partial, bytearray()
                        records.append(decode(whole))
                    else:
                        records.append(decode(data))
        finally:
            self._set(_TAIL, tail)
        if _u32.unpack_from(buf, _WRITER_WAITING)[0] and \
                self.capacity - (head - tail) >= self.capacity // 2:
            _u32.pack_into(buf, _WRITER_WAITING, 0)
            os.eventfd_write(self._space_fd, 1)
        return records

    def sleep(self) -> bool:
        """Consumer found nothing: ask for the data doorbell. True if still empty
        (wait for data_fd, then clear_data_doorbell() and read again)."""
        _u32.pack_into(self._buf, _READER_SLEEPING, 1)
        if not self.is_empty():
            _u32.pack_into(self._buf, _READER_SLEEPING, 0)
            return False
        return True

    def awake(self) -> None:
        """Consumer no longer sleeps on this ring (its doorbell is drained elsewhere:
        shared with other rings)."""
        _u32.pack_into(self._buf, _READER_SLEEPING, 0)

    def clear_data_doorbell(self) -> None:
        _u32.pack_into(self._buf, _READER_SLEEPING, 0)
        _drain(self._data_fd)


class _Ring:
    """A ring's shell, whichever core it is built on: making and mapping the
    segment, its doorbells, closing, and cutting large records into fragments."""

    __slots__ = ()  # its state is the core's (_ring.pxd says why)

    def __init__(self, spec: RingSpec, buf, owner: str | None, mapping,
                 own_fds: tuple[int, ...] = ()):
        self._spec = spec
        self._own_fds = own_fds  # the doorbells this ring made or was handed, closed with it
        self._buf = buf
        self._owner = owner  # the creator's: the segment's path, which it unlinks
        self._mapping = mapping
        # An eighth of the ring: with a wrap's waste, one piece then needs under half
        # the ring, so 'half free' (the space doorbell's threshold) always fits it.
        self._max_fragment = max(4, (spec.capacity // 8) & ~3)
        self._fragments = deque()  # producer: (pieces, more follow)
        self._partial = bytearray()  # consumer: fragments of a record being joined
        self._bind(buf, spec.capacity, spec.data_fd, spec.space_fd)

    @classmethod
    def create(cls, capacity: int = 8 * 1024 * 1024, data_fd: int | None = None):
        """A new ring; with `data_fd`, its data doorbell is that eventfd, shared with
        other rings the same reader sleeps on (the caller keeps it and closes it)."""
        capacity = _padded(capacity)
        # Named after the creating process, so a leaked segment in /dev/shm says whose it is.
        path = f"{SEGMENTS}/warren_{os.getpid()}_{secrets.token_hex(4)}"
        mapping = _map(path, HEADER_SIZE + capacity, os.O_CREAT | os.O_EXCL)
        space_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        own = (space_fd,)
        if data_fd is None:
            data_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            own += (data_fd,)
        spec = RingSpec(os.path.basename(path), capacity, data_fd, space_fd)
        return cls(spec, memoryview(mapping), path, mapping, own)

    @classmethod
    def attach(cls, spec: RingSpec, own_fds: bool = False):
        """The ring `spec` names, made by another process; with `own_fds` its
        doorbells (handed over, not inherited) are closed with it."""
        mapping = _map(f"{SEGMENTS}/{spec.shm_name}", HEADER_SIZE + spec.capacity)
        return cls(spec, memoryview(mapping), None, mapping,
                   (spec.data_fd, spec.space_fd) if own_fds else ())

    def spec(self) -> RingSpec:
        return self._spec

    def close(self) -> None:
        self._unbind()
        self._buf.release()
        self._mapping.close()
        for fd in self._own_fds:
            os.close(fd)

    def unlink(self) -> None:
        if self._owner is not None:
            try:
                os.unlink(self._owner)
            except FileNotFoundError:  # removed as an orphan already
                pass

    def reset(self) -> None:
        """Empty the ring, as new: for when the process at its other end died and
        this one is its only user. A doorbell rung before stays rung (a spurious
        wake-up, which both sides take in their stride)."""
        self._buf[:HEADER_SIZE] = bytes(HEADER_SIZE)
        self._fragments.clear()
        self._partial = bytearray()

    def write(self, record) -> bool:
        """Queue one record; False (nothing written) when it does not fit now."""
        return self.write_many((record,)) == 1

    def _fragment(self, pieces, size: int) -> None:
        """Cut a large record into fragments: lists of views of its pieces."""
        step = self._max_fragment
        fragment, room = [], step
        for piece in pieces:
            view = memoryview(piece).cast("B")
            while view:
                part = view[:room]
                fragment.append(part)
                view = view[len(part):]
                room -= len(part)
                size -= len(part)
                if not room:
                    self._fragments.append((fragment, size > 0))
                    fragment, room = [], step
        if fragment:
            self._fragments.append((fragment, False))

    def clear_space_doorbell(self) -> None:
        _drain(self._spec.space_fd)


class PureRing(_Ring, RingCore):
    """A ring on the pure Python core."""


_compiled = build.extension("warren.shards._ring")
if _compiled is None:  # the pure core serves (shards/build.py)
    CompiledRing = None
else:
    class CompiledRing(_Ring, _compiled.RingCore):
        """A ring on the compiled core."""

        __slots__ = ()

Ring = PureRing if CompiledRing is None else CompiledRing


def _map(path: str, size: int, create: int = 0) -> mmap.mmap:
    """A shared-memory segment, mapped. Not multiprocessing.shared_memory: in 3.11
    that registers each segment with a resource tracker, one more process (14 MB
    resident) that also unlinks an attacher's segments when the attacher exits.
    Rings left by a killed broker are removed_orphans' to clean."""
    fd = os.open(path, os.O_RDWR | create, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)  # zero-filled: an empty ring
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _drain(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass
