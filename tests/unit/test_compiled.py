"""The compiled twins are built by the install wherever there is a C compiler, and
the broker uses them unless WARREN_PURE_PYTHON is set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from warren.gateway.amqp import frames, hotpath
from warren.gateway.io import shardlink, shardpool
from warren.shards import batches, codec, gatewayrings, main, model, outbox, queue, ring, shard
from warren.shards.compiled import built, built_module

from ..support import twins


def test_the_compiled_twins_are_built_and_used_where_there_is_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the pure twins serve")
    hot = built_module("warren.gateway.amqp._hotpath")
    assert hot is not None, "pip install built no warren.gateway.amqp._hotpath"
    assert ring.CompiledRing is not None, "pip install built no warren.shards._ring"
    builds = {name: built(f"warren.{package}._{name}", cls) for package, name, cls in (
        ("gateway.io", "shardlink", "ShardLink"), ("shards", "gatewayrings", "GatewayRings"),
        ("shards", "outbox", "Outbox"), ("shards", "shard", "Shard"),
        ("shards", "queue", "Queue"), ("shards", "main", "serve"),
        ("shards", "batches", "encode_batch"))}
    assert None not in builds.values(), f"pip install built none of {builds}"
    compiled_queue = built_module("warren.shards._queue")
    compiled_batches = built_module("warren.shards._batches")
    # extension types, their state typed by their .pxd (attributes are struct fields,
    # internal steps C functions)
    assert not hasattr(builds["shardlink"], "_spend")
    assert not hasattr(compiled_queue.Queue, "_next_consumer")
    for built_class, attribute in ((builds["shardlink"], "credit"),
                                   (builds["gatewayrings"], "commands"),
                                   (builds["outbox"], "records"), (builds["shard"], "queues"),
                                   (compiled_queue.Queue, "consumers"),
                                   (compiled_queue.Consumer, "credit")):
        assert type(vars(built_class)[attribute]).__name__ == "getset_descriptor"
    if os.environ.get("WARREN_PURE_PYTHON"):
        assert hotpath.deliver_frames is hotpath.pure_deliver_frames
        assert frames.FrameReader is frames.PureFrameReader
        assert ring.Ring is ring.PureRing
        assert shardpool.ShardLink is shardlink.ShardLink
        assert main.GatewayRings is gatewayrings.GatewayRings and shard.Outbox is outbox.Outbox
        assert main.Shard is shard.Shard and codec.batches is batches
        assert model.queue is queue
        assert twins.compiled is None and len(twins.SHARDS) == len(twins.RINGS) == 1
    else:
        assert hotpath.deliver_frames is hot.deliver_frames
        assert frames.FrameReader is hot.FrameReader
        assert ring.Ring is ring.CompiledRing
        assert shardpool.ShardLink is builds["shardlink"]
        assert main.GatewayRings is builds["gatewayrings"]
        assert shard.Outbox is builds["outbox"] and main.Shard is builds["shard"]
        assert codec.batches is compiled_batches
        assert model.queue is compiled_queue


def test_without_a_c_compiler_the_install_goes_on_with_the_pure_twins(tmp_path):
    """Every extension is optional (cythonize drops the flag: setup.py sets it
    after): a build whose compiler fails goes on, and builds nothing."""
    root = Path(__file__).resolve().parents[2]
    source = tmp_path / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "*.so", "*.c"))
    built = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=source, env={**os.environ, "CC": "false"}, capture_output=True, text=True,
        timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert "building 'warren.shards._queue' extension" in built.stdout  # it was tried
    assert not list((tmp_path / "lib").rglob("*.so"))
