# The compiled twin of shard.py: that module built by pip install as
# warren.shards._shard (setup.py), Shard an extension type whose state is typed
# here, and whose steady turn's methods are C calls for the compiled shard loop
# (final: nothing overrides them), as are its calls into its outbox and queues
# (compiled too: a compiled twin only ever works with compiled ones, tests/twins.py).
# __dict__: tests may set what they look at.
cimport cython
from warren.shards._outbox cimport Outbox as TypedOutbox
from warren.shards._queue cimport Queue as TypedQueue

@cython.final
cdef class Shard:
    cdef dict __dict__
    cdef public object index, persister, stats, commits, timers, streams, replicas
    cdef public TypedOutbox outbox
    cdef public dict queues, holder_queues, costs
    cdef public list lost
    cdef public set alarms, behind
    cdef public bint running, stored_ok, paced
    cdef public Py_ssize_t ram_bytes

    cpdef list take_events(self)
    cpdef bint has_commit_work(self, double now) except -1
    cpdef bint check_resources(self, Py_ssize_t memory_limit, bint stored) except -1
    cpdef run_all(self, commands, double now)
    @cython.locals(accepted=bint, before=Py_ssize_t, queue=TypedQueue)
    cpdef handle(self, cmd, double now)
    @cython.locals(before=Py_ssize_t)
    cpdef bint _apply(self, TypedQueue queue, cmd, double now) except -1
    cpdef bint _step(self, TypedQueue queue, Py_ssize_t before, list effects) except -1
    cpdef bint _effects(self, list effects) except -1


cdef bint _has_timers(TypedQueue queue) except -1
