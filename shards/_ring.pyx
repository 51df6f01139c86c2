# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ring.RingCore: the same layout, counters, flags and
records, read and written through a pointer into the mapped segment. Both ends
of every ring touch these on each loop turn (a few calls each), and in Python
each costs a struct call and a frame per counter; profiles at a steady 10,000
msg/s put them at a fifth of a shard's turn. The pure core stays the reference:
the ring tests run both, and either may sit at either end of a ring.

Counters are loaded with acquire and stored with release semantics, and the two
sleep/wake handshakes (reader: set the flag, then re-check the head; writer:
publish the head, then read the flag) have a full fence between their store and
load, so no wake-up is lost whatever the CPU reorders.
"""

import sys

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.errno cimport EAGAIN, errno
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from .ring import HEADER_SIZE, MORE, WRAP

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ

cdef extern from *:
    """
    #include <stdint.h>
    #include <unistd.h>
    static inline uint64_t ring_load64(const char *p) {
        return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE); }
    static inline void ring_store64(char *p, uint64_t v) {
        __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE); }
    static inline uint32_t ring_load32(const char *p) {
        return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE); }
    static inline void ring_store32(char *p, uint32_t v) {
        __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE); }
    static inline void ring_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    static inline int ring_doorbell(int fd) {
        uint64_t one = 1; return write(fd, &one, 8) == 8 ? 0 : -1; }
    static inline int ring_drain(int fd) {
        uint64_t value; return read(fd, &value, 8) == 8 ? 0 : -1; }
    """
    uint64_t ring_load64(const char *p) nogil
    void ring_store64(char *p, uint64_t v) nogil
    uint32_t ring_load32(const char *p) nogil
    void ring_store32(char *p, uint32_t v) nogil
    void ring_fence() nogil
    int ring_doorbell(int fd) nogil
    int ring_drain(int fd) nogil

if sys.byteorder != "little":  # the pure core's words are little-endian, as these loads
    raise ImportError("the compiled ring core assumes a little-endian machine")

cdef enum:  # the header's words (ring.py's layout)
    _HEAD = 0
    _TAIL = 64
    _READER_SLEEPING = 128
    _WRITER_WAITING = 192
    _LENGTH_MASK = 0x7FFFFFFF
cdef Py_ssize_t _HEADER = HEADER_SIZE
cdef uint32_t _WRAP = WRAP
cdef uint32_t _MORE = MORE


cdef inline Py_ssize_t _padded(Py_ssize_t n) noexcept:
    return (n + 3) & ~3


cdef int _ring_or_raise(int fd) except -1:
    if ring_doorbell(fd) < 0:
        raise OSError(errno, "eventfd write failed")
    return 0


cdef Py_ssize_t _size_of(object piece) except -1:
    cdef Py_buffer view
    if type(piece) is bytes:
        return PyBytes_GET_SIZE(piece)
    PyObject_GetBuffer(piece, &view, PyBUF_SIMPLE)
    try:
        return view.len
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _pieces_size(object pieces) except -1:
    cdef Py_ssize_t size = 0
    for piece in pieces:
        size += _size_of(piece)
    return size


cdef char* _copy_piece(char* at, object piece) except NULL:
    cdef Py_buffer view
    if type(piece) is bytes:
        memcpy(at, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece))
        return at + PyBytes_GET_SIZE(piece)
    PyObject_GetBuffer(piece, &view, PyBUF_SIMPLE)
    try:
        memcpy(at, view.buf, view.len)
        return at + view.len
    finally:
        PyBuffer_Release(&view)


cdef class RingCore:  # its state and C methods: _ring.pxd

    def _bind(self, buf, Py_ssize_t capacity, int data_fd, int space_fd):
        if self._bound:
            raise ValueError("ring already bound")
        PyObject_GetBuffer(buf, &self._view, PyBUF_WRITABLE)
        if self._view.len < _HEADER + capacity:
            PyBuffer_Release(&self._view)
            raise ValueError("the segment is smaller than the ring")
        self._bound = True
        self._base = <char*>self._view.buf
        self._data = self._base + _HEADER
        self.capacity = capacity
        self._data_fd = data_fd
        self._space_fd = space_fd

    def _unbind(self):
        """Let go of the segment (before it is unmapped)."""
        if self._bound:
            self._bound = False
            PyBuffer_Release(&self._view)

    def __dealloc__(self):
        if self._bound:
            PyBuffer_Release(&self._view)

    cdef int _check(self) except -1:
        if not self._bound:
            raise ValueError("the ring is closed")
        return 0

    # -- shared counters -------------------------------------------------------

    def free_space(self):
        self._check()
        return self.capacity - <Py_ssize_t>(ring_load64(self._base + _HEAD)
                                            - ring_load64(self._base + _TAIL))

    cpdef bint is_empty(self) except -1:
        self._check()
        return ring_load64(self._base + _HEAD) == ring_load64(self._base + _TAIL)

    def written(self):
        self._check()
        return ring_load64(self._base + _HEAD)

    def consumed(self):
        self._check()
        return ring_load64(self._base + _TAIL)

    # -- producer --------------------------------------------------------------

    cpdef Py_ssize_t write_many(self, records) except -1:
        self._check()
        cdef uint64_t head = ring_load64(self._base + _HEAD)
        cdef uint64_t tail = ring_load64(self._base + _TAIL)
        cdef Py_ssize_t taken = 0, size
        cdef bint ok
        head = self._push_fragments(head, tail)
        if not self._fragments:
            for record in records:
                if type(record) is list:
                    size = _pieces_size(record)
                    pieces = record
                else:
                    size = _size_of(record)
                    pieces = (record,)
                if size > self._max_fragment:
                    self._fragment(pieces, size)
                    taken += 1
                    head = self._push_fragments(head, tail)
                    if self._fragments:
                        break
                    continue
                if not self._put(&head, tail, pieces, size, 0):
                    break
                taken += 1
        ring_store64(self._base + _HEAD, head)
        return taken

    cpdef bint backlogged(self) except -1:
        return bool(self._fragments)

    cdef uint64_t _push_fragments(self, uint64_t head, uint64_t tail) except? 0:
        fragments = self._fragments
        while fragments:
            pieces, more = fragments[0]
            if not self._put(&head, tail, pieces, _pieces_size(pieces), _MORE if more else 0):
                break
            fragments.popleft()
        return head

    cdef bint _put(self, uint64_t* head, uint64_t tail, object pieces, Py_ssize_t size,
                   uint32_t flags) except -1:
        """One length-prefixed record at *head (advanced); False if it does not fit."""
        cdef Py_ssize_t need = 4 + _padded(size)
        cdef Py_ssize_t pos = head[0] % self.capacity
        cdef Py_ssize_t room_to_end = self.capacity - pos
        cdef bint wrap = need > room_to_end
        cdef uint32_t word
        cdef char* at
        if (room_to_end if wrap else 0) + need > self.capacity - <Py_ssize_t>(head[0] - tail):
            return False
        if wrap:
            memcpy(self._data + pos, &_WRAP, 4)
            head[0] += room_to_end
            pos = 0
        word = <uint32_t>size | flags
        memcpy(self._data + pos, &word, 4)
        at = self._data + pos + 4
        for piece in pieces:
            at = _copy_piece(at, piece)
        head[0] += need
        return True

    cpdef flush(self):
        self._check()
        ring_fence()  # the head stored before the flag is read
        if ring_load32(self._base + _READER_SLEEPING):
            ring_store32(self._base + _READER_SLEEPING, 0)
            _ring_or_raise(self._data_fd)

    def want_space(self):
        self._check()
        ring_store32(self._base + _WRITER_WAITING, 1)
        ring_fence()
        if self.capacity - <Py_ssize_t>(ring_load64(self._base + _HEAD)
                                        - ring_load64(self._base + _TAIL)) >= self.capacity // 2:
            ring_store32(self._base + _WRITER_WAITING, 0)
            return False
        return True

    def want_read_to(self, uint64_t position):
        self._check()
        ring_store32(self._base + _WRITER_WAITING, 1)
        ring_fence()
        if ring_load64(self._base + _TAIL) >= position:
            ring_store32(self._base + _WRITER_WAITING, 0)
            return False
        return True

    # -- consumer --------------------------------------------------------------

    cpdef list read_many(self, decode=bytes, Py_ssize_t max_records=1 << 30):
        self._check()
        cdef uint64_t head = ring_load64(self._base + _HEAD)
        cdef uint64_t tail = ring_load64(self._base + _TAIL)
        cdef Py_ssize_t pos, size, count = 0
        cdef uint32_t word
        records = []
        try:
            while tail < head and count < max_records:
                pos = tail % self.capacity
                memcpy(&word, self._data + pos, 4)
                if word == _WRAP:
                    tail += self.capacity - pos
                    continue
                size = word & _LENGTH_MASK
                if pos + 4 + size > self.capacity:  # records never straddle the end
                    raise ValueError(f"a damaged ring record: {size} bytes at {pos}")
                tail += 4 + _padded(size)  # the space is freed below, after decoding
                view = PyMemoryView_FromMemory(self._data + pos + 4, size, PyBUF_READ)
                try:
                    if word & _MORE:
                        self._partial += view
                    elif self._partial:
                        self._partial += view
                        whole, self._partial = self._partial, bytearray()
                        records.append(decode(whole))
                        count += 1
                    else:
                        records.append(decode(view))
                        count += 1
                finally:
                    view.release()
        finally:
            ring_store64(self._base + _TAIL, tail)
        ring_fence()  # the tail stored before the flag is read
        if ring_load32(self._base + _WRITER_WAITING) and \
                self.capacity - <Py_ssize_t>(head - tail) >= self.capacity // 2:
            ring_store32(self._base + _WRITER_WAITING, 0)
            _ring_or_raise(self._space_fd)
        return records

    cpdef bint sleep(self) except -1:
        self._check()
        ring_store32(self._base + _READER_SLEEPING, 1)
        ring_fence()  # the flag stored before the head is read again
        if ring_load64(self._base + _HEAD) != ring_load64(self._base + _TAIL):
            ring_store32(self._base + _READER_SLEEPING, 0)
            return False
        return True

    cpdef awake(self):
        self._check()
        ring_store32(self._base + _READER_SLEEPING, 0)

    cpdef clear_data_doorbell(self):
        self._check()
        ring_store32(self._base + _READER_SLEEPING, 0)
        if ring_drain(self._data_fd) < 0 and errno != EAGAIN:
            raise OSError(errno, "eventfd read failed")
