# The compiled twin of gatewayrings.py: that module built by pip install as
# warren.shards._gatewayrings (setup.py), GatewayRings an extension type whose
# state is typed here, so its methods reach it as struct fields. __dict__: tests
# may set what they look at on an instance.
cdef class GatewayRings:
    cdef dict __dict__
    cdef public list commands, events, done, blocked, held, _seen, _caught_up, _alive_at
    cdef public object doorbell
    cdef public bint rung
