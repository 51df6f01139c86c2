# The compiled twin of main.py's loop: that module built by pip install as
# warren.shards._main (setup.py), its loop's state typed here, so that the steady
# turn's calls into the rings and the outbox are C calls, not Python ones.
cimport cython
from warren.shards._gatewayrings cimport GatewayRings as TypedGatewayRings
from warren.shards._outbox cimport Outbox as TypedOutbox
from warren.shards._shard cimport Shard as TypedShard

@cython.locals(rings=TypedGatewayRings, outbox=TypedOutbox, shard=TypedShard, now=double,
               unmap_at=double, timers_due=bint, early_any=bint, lifeline=int)
cpdef serve(spec)

cdef _wait(poller, extra_fds, int lifeline_fd, timeout=*)
