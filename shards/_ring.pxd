# The compiled ring core's state and the methods a steady turn calls (_ring.pyx),
# declared here so that the compiled modules holding rings (the shard's
# gatewayrings, the gateway's shardlink) call them as C methods.
from libc.stdint cimport uint32_t, uint64_t


cdef class RingCore:
    cdef Py_buffer _view
    cdef char* _base
    cdef char* _data
    cdef bint _bound
    cdef readonly Py_ssize_t capacity
    cdef int _data_fd
    cdef int _space_fd
    cdef public object _fragments
    cdef public object _partial
    cdef public Py_ssize_t _max_fragment
    # The shell's state (ring._Ring), kept here so that a ring has no __dict__:
    # Cython checks whether a Python subclass overrides a cpdef method at every
    # call, and caches the answer only for instances without one.
    cdef public object _spec, _own_fds, _buf, _owner, _mapping

    cdef int _check(self) except -1
    cdef uint64_t _push_fragments(self, uint64_t head, uint64_t tail) except? 0
    cdef bint _put(self, uint64_t* head, uint64_t tail, object pieces, Py_ssize_t size,
                   uint32_t flags) except -1
    cpdef bint is_empty(self) except -1
    cpdef Py_ssize_t write_many(self, records) except -1
    cpdef bint backlogged(self) except -1
    cpdef flush(self)
    cpdef list read_many(self, decode=*, Py_ssize_t max_records=*)
    cpdef bint sleep(self) except -1
    cpdef awake(self)
    cpdef clear_data_doorbell(self)
