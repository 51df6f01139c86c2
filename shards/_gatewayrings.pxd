# The compiled twin of gatewayrings.py: that module built by pip install as
# warren.shards._gatewayrings (setup.py), GatewayRings an extension type whose
# state is typed here, so its methods reach it as struct fields, and whose steady
# turn's methods are C calls for the compiled shard loop (final: nothing overrides
# them), as are theirs into the compiled rings. __dict__: tests may set what they
# look at on an instance.
cimport cython
from warren.shards._outbox cimport Outbox as TypedOutbox
from warren.shards._ring cimport RingCore as TypedRing

@cython.final
cdef class GatewayRings:
    cdef dict __dict__
    cdef public list commands, events, done, blocked, held, _seen, _caught_up, _alive_at
    cdef public object doorbell
    cdef public bint rung

    @cython.locals(ring=TypedRing)
    cpdef write(self, TypedOutbox outbox)
    cpdef worked(self, Py_ssize_t gateway, Py_ssize_t records, TypedOutbox outbox, bint behind)
    cpdef bint unsent(self, TypedOutbox outbox) except -1
    @cython.locals(ring=TypedRing)
    cpdef list read(self)
    @cython.locals(ring=TypedRing)
    cpdef bint is_empty(self) except -1
    @cython.locals(ring=TypedRing, other=TypedRing)
    cpdef bint sleep(self) except -1
    @cython.locals(ring=TypedRing)
    cpdef woke(self)
    cpdef drain_doorbell(self)
