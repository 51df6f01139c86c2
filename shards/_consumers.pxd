# The compiled twin of consumers.py: that module built by pip install as
# warren.shards._consumers (setup.py). Consumer and Roster are extension types
# whose state is typed here; the compiled queue (_queue.pxd) finds the next
# consumer with C calls. Roster is final: its cpdef methods are called without
# asking whether a subclass overrides them.
cimport cython


cdef class Consumer:
    cdef public object holder, channel, tag, priority, timeout
    cdef public bint no_ack, exclusive
    cdef public Py_ssize_t prefetch, credit
    cdef public set timed_out

@cython.final
cdef class Roster:
    cdef public dict consumers, rotations, locks
    cdef public list priorities, lock_heap
    cdef public bint single_active

    cpdef Consumer next_consumer(self, dict holdings)
    cdef bint _can_take(self, Consumer c, dict holdings) except -1
    cpdef lock(self, holder, seq, double now)
    cdef _lock(self, holder, seq, double deadline)
    cpdef next_lock(self)
