# The compiled twin of queue.py: that module built by pip install as
# warren.shards._queue (setup.py). Queue and QueueCounters are extension types
# whose state is typed here; a publish's short way (the consumer it goes to) is
# C calls, into the compiled roster too (_consumers.pxd), and a C call from the
# compiled shard. __dict__: a queue keeps what it was configured with beside
# these. Queue is final: its cpdef methods are called without asking whether a
# subclass overrides them.
cimport cython
from warren.shards._consumers cimport Roster as TypedRoster


cdef class QueueCounters:
    cdef public Py_ssize_t published, published_bytes, delivered, redelivered, acked
    cdef public Py_ssize_t rejected, requeued, expired, dead_lettered, dropped, timeouts

@cython.final
cdef class Queue:
    cdef dict __dict__
    cdef public object qid, spec, ready, last_used
    cdef public bint stored, straight, tracked, deleted, may_expire
    cdef public Py_ssize_t next_seq, ram_bytes, ready_bytes
    cdef public double now
    cdef public list returned, lock_heap
    cdef public dict holdings, consumers, locks
    cdef public TypedRoster roster
    cdef public QueueCounters counters

    cpdef publish_straight(self, cmd, double now)
    cpdef list apply(self, cmd, double now)
    cpdef _settle(self, cmd, list effects)
    cpdef _settled(self, msg, list effects, list removed=*)
    cpdef _dispatch(self, list effects)


cpdef Py_ssize_t ram_size(content) except -1
