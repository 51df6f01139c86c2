"""The hot paths' two twins, pure Python and compiled (the codec's functions, the
ring's core, the gateway's shard link), for the tests that run both on the same
inputs (the compiled one where it was built); and the shard's rings and outbox,
whose compiled twins are their modules built as they are (typed by .pxd files)."""

from __future__ import annotations

import importlib

import pytest

from warren.gateway import shardlink
from warren.gateway.amqp import frames, hotpath
from warren.shards import gatewayrings, outbox, ring
from warren.shards.compiled import built

try:  # imported directly: WARREN_PURE_PYTHON switches the broker's choice, not this
    compiled = importlib.import_module("warren.gateway.amqp._hotpath")
except ImportError:
    compiled = None


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
    compiled = built(module, pure.__name__)
    return [pytest.param(pure, id="pure")] + (
        [pytest.param(compiled, id="compiled")] if compiled is not None else [])


LINKS = builds(shardlink.ShardLink, "warren.gateway._shardlink")
GATEWAY_RINGS = builds(gatewayrings.GatewayRings, "warren.shards._gatewayrings")
OUTBOXES = builds(outbox.Outbox, "warren.shards._outbox")
