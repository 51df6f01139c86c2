# The compiled twin of outbox.py: that module built by pip install as
# warren.shards._outbox (setup.py), Outbox an extension type whose state is typed
# here. __dict__ holds `add`, which take() rebinds each turn.
cdef class Outbox:
    cdef dict __dict__
    cdef public Py_ssize_t gateways, origin
    cdef public list _turn, records
