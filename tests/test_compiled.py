"""The compiled twins are built by the install wherever there is a C compiler, and
the broker uses them unless WARREN_PURE_PYTHON is set."""

from __future__ import annotations

import os
import shutil
import sysconfig

import pytest

from warren.gateway.amqp import frames, hotpath
from warren.shards import ring

from . import twins


def test_the_compiled_twins_are_built_and_used_where_there_is_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the pure twins serve")
    assert twins.compiled is not None, "pip install built no warren.gateway.amqp._hotpath"
    assert ring.CompiledRing is not None, "pip install built no warren.shards._ring"
    if os.environ.get("WARREN_PURE_PYTHON"):
        assert hotpath.deliver_frames is hotpath.pure_deliver_frames
        assert frames.FrameReader is frames.PureFrameReader
        assert ring.Ring is ring.PureRing
    else:
        assert hotpath.deliver_frames is twins.compiled.deliver_frames
        assert frames.FrameReader is twins.compiled.FrameReader
        assert ring.Ring is ring.CompiledRing
