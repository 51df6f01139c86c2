# The compiled twin of shardlink.py: that module built by pip install as
# warren.gateway._shardlink (setup.py), ShardLink an extension type whose state is
# typed here (its methods reach it as struct fields, not dict lookups) and whose
# internal steps below are C calls, as are its calls into its two rings (the
# compiled ring core's: a compiled twin only ever works with compiled ones,
# tests/twins.py). __dict__ lets tests wrap a method on an instance.
from warren.shards._ring cimport RingCore as TypedRing


cdef class ShardLink:
    cdef dict __dict__
    cdef public Py_ssize_t index, gateways, lazy_acks, _records_sent, _next_req
    cdef public bint flush_scheduled, alive, _dispatching
    cdef public list _batch, _pending, _pairs
    cdef public dict _feeds, credit, costs, _waiters
    cdef public set paused
    cdef public object _unreturned, _lazy_until, _loop, _on_events, _on_exit, process
    cdef public TypedRing commands, events
    cdef public object _doorbell, _lifeline_write, _exit_watch
    cdef public object log_dir, log, data_dir, stores, memory_limit, stats_interval
    cdef public object store_map_size

    cdef void _spend(self, dict feeds) except *
    cdef void _credit_returned(self, Py_ssize_t records) except *
    cdef void _dispatch(self, list events) except *
