"""The hot paths' two twins, pure Python and compiled (the codec's functions, the
ring's core, the gateway's shard link), for the tests that run both on the same
inputs (the compiled one where it was built); and the shard's pure modules whose
compiled twins are those modules built as they are (typed by .pxd files).

With WARREN_PURE_PYTHON set the suite runs without the compiled extensions: only
the pure twins, here as in the broker (shards/build.py chooses for both). (A
compiled twin works with the compiled twins it calls as C types, so it never
serves beside pure ones.)"""

from __future__ import annotations

import pytest

from warren.gateway.amqp import frames, hotpath
from warren.gateway.io import shardlink
from warren.shards import batches, build, gatewayrings, outbox, queue, ring, shard

compiled = build.extension("warren.gateway.amqp._hotpath")


def twins(name: str, pure) -> list:
    """pytest params: the pure function (or class), then the compiled one of that name
    if built."""
    params = [pytest.param(pure, id="pure")]
    if compiled is not None:
        params.append(pytest.param(getattr(compiled, name), id="compiled"))
    return params


SCAN_PUBLISH = twins("scan_publish", frames.scan_publish)
READERS = twins("FrameReader", frames.PureFrameReader)
DELIVER_FRAMES = twins("deliver_frames", hotpath.pure_deliver_frames)
RINGS = [pytest.param(ring.PureRing, id="pure")] + (
    [pytest.param(ring.CompiledRing, id="compiled")] if ring.CompiledRing is not None else [])


def builds(pure, module: str) -> list:
    """pytest params: a pure module's class, then its compiled build if there is one."""
    compiled = build.extension(module)
    return [pytest.param(pure, id="pure")] + (
        [pytest.param(getattr(compiled, pure.__name__), id="compiled")]
        if compiled is not None else [])


LINKS = builds(shardlink.ShardLink, "warren.gateway.io._shardlink")
GATEWAY_RINGS = builds(gatewayrings.GatewayRings, "warren.shards._gatewayrings")
OUTBOXES = builds(outbox.Outbox, "warren.shards._outbox")
SHARDS = builds(shard.Shard, "warren.shards._shard")


COMPILED_BATCHES = build.extension("warren.shards._batches")
BATCH_CODECS = [pytest.param(batches, id="pure")] + (  # batches.py, and its compiled build
    [pytest.param(COMPILED_BATCHES, id="compiled")] if COMPILED_BATCHES is not None else [])

COMPILED_QUEUE = build.extension("warren.shards._queue")  # queue.py's compiled build, or None
QUEUE_BUILDS = [pytest.param(queue, id="pure")] + (
    [pytest.param(COMPILED_QUEUE, id="compiled")] if COMPILED_QUEUE is not None else [])


def each_queue_build(test_globals: dict, names: tuple[str, ...]):
    """An autouse fixture that runs a test module once for each build of queue.py,
    with `names` (Queue, its effects) taken from that build into the module's
    globals. Module-scoped, so hypothesis's tests may use it."""

    @pytest.fixture(scope="module", autouse=True, params=QUEUE_BUILDS)
    def queue_build(request):
        with pytest.MonkeyPatch.context() as patch:
            for name in names:
                patch.setitem(test_globals, name, getattr(request.param, name))
            yield request.param

    return queue_build
