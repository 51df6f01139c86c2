"""The hot paths' two twins, pure Python and compiled (the codec's functions and
the ring's core), for the tests that run both on the same inputs (the compiled
one where it was built)."""

from __future__ import annotations

import importlib

import pytest

from warren.gateway.amqp import frames, hotpath
from warren.shards import ring

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
