# The compiled twin of outbox.py: that module built by pip install as
# warren.shards._outbox (setup.py), Outbox an extension type whose state is typed
# here, and whose steady turn's methods are C calls for the compiled shard loop
# (final: nothing overrides them). __dict__ holds `add`, which take() rebinds each turn.
cimport cython

@cython.final
cdef class Outbox:
    cdef dict __dict__
    cdef public Py_ssize_t gateways, origin
    cdef public list _turn, records

    cpdef list take(self)
    cpdef put(self, Py_ssize_t gateway, list events)
    cpdef put_each(self, list turn)
    cpdef sent(self, Py_ssize_t gateway, Py_ssize_t count)
