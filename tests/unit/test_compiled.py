"""The compiled twins are built by the install wherever there is a C compiler, and
the broker uses them unless WARREN_PURE_PYTHON is set; everything that names the
compiled modules reads shards/build.py's one list."""

from __future__ import annotations

import fnmatch
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from warren.gateway.amqp import frames, hotpath
from warren.gateway.io import shardlink, shardpool
from warren.shards import (
    batches,
    build,
    codec,
    gatewayrings,
    main,
    model,
    outbox,
    queue,
    ring,
    shard,
)

from ..support import twins

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = [build.extension_name(source) for source in build.COMPILED]


def test_the_compiled_twins_are_built_and_used_where_there_is_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the pure twins serve")
    # imported whatever WARREN_PURE_PYTHON says: the install built them all
    built = {name.rsplit("._", 1)[1]: importlib.import_module(name) for name in EXTENSIONS}
    hot, compiled_queue, compiled_batches = built["hotpath"], built["queue"], built["batches"]
    builds = {name: getattr(built[name], cls) for name, cls in (
        ("shardlink", "ShardLink"), ("gatewayrings", "GatewayRings"), ("outbox", "Outbox"),
        ("shard", "Shard"), ("queue", "Queue"), ("main", "serve"))}
    # extension types, their state typed by their .pxd (attributes are struct fields,
    # internal steps C functions)
    assert not hasattr(builds["shardlink"], "_spend")
    assert not hasattr(built["consumers"].Roster, "_can_take")
    for built_class, attribute in ((builds["shardlink"], "credit"),
                                   (builds["gatewayrings"], "commands"),
                                   (builds["outbox"], "records"), (builds["shard"], "queues"),
                                   (compiled_queue.Queue, "consumers"),
                                   (built["consumers"].Consumer, "credit")):
        assert type(vars(built_class)[attribute]).__name__ == "getset_descriptor"
    if build.pure_only():
        assert hotpath.deliver_frames is hotpath.pure_deliver_frames
        assert frames.FrameReader is frames.PureFrameReader
        assert ring.Ring is ring.PureRing and ring.CompiledRing is None
        assert shardpool.ShardLink is shardlink.ShardLink
        assert main.GatewayRings is gatewayrings.GatewayRings and shard.Outbox is outbox.Outbox
        assert main.Shard is shard.Shard and codec.batches is batches
        assert model.queue is queue
        assert twins.compiled is None and len(twins.SHARDS) == len(twins.RINGS) == 1
        assert build.check() == ("pure Python build (WARREN_PURE_PYTHON is set)", "")
    else:
        assert hotpath.deliver_frames is hot.deliver_frames
        assert frames.FrameReader is hot.FrameReader
        assert ring.Ring is ring.CompiledRing and issubclass(ring.Ring, built["ring"].RingCore)
        assert shardpool.ShardLink is builds["shardlink"]
        assert main.GatewayRings is builds["gatewayrings"]
        assert shard.Outbox is builds["outbox"] and main.Shard is builds["shard"]
        assert codec.batches is compiled_batches
        assert model.queue is compiled_queue
        assert build.check() == ("compiled build", "")


def test_serve_says_which_build_runs_and_why_a_compiled_one_failed(monkeypatch):
    monkeypatch.setenv("WARREN_PURE_PYTHON", "1")
    assert build.check() == ("pure Python build (WARREN_PURE_PYTHON is set)", "")
    monkeypatch.delenv("WARREN_PURE_PYTHON")
    real = importlib.import_module

    def without_queue(name, *args):
        if name == "warren.shards._queue":
            raise ImportError("warren.shards._queue: undefined symbol: x")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_queue)
    running, failed = build.check()
    assert running == "partly compiled build"
    assert failed.startswith(f"the compiled build failed (1 of {len(EXTENSIONS)} extensions ")
    assert failed.endswith(": warren.shards._queue: warren.shards._queue: undefined symbol: x")

    def none(name, *args):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", none)
    running, failed = build.check()
    assert running == "pure Python build"
    assert f"({len(EXTENSIONS)} of {len(EXTENSIONS)} extensions" in failed
    assert "warren.shards._main: No module named 'warren.shards._main'" in failed


def test_the_one_list_names_every_compiled_module_where_packaging_and_git_expect_it():
    assert EXTENSIONS[:2] == ["warren.gateway.amqp._hotpath", "warren.shards._ring"]
    assert "warren.shards._queue" in EXTENSIONS
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["*"]
    for source in build.COMPILED:
        assert (ROOT / source).is_file(), source
    # every .pxd types a module of the list (a pure module's is named after its
    # extension: shards/_queue.pxd for shards/queue.py), and is installed
    typed = {str(Path(source).parent / build.extension_name(source).rsplit(".", 1)[1])
             for source in build.COMPILED}
    for pxd in [*ROOT.glob("gateway/**/*.pxd"), *ROOT.glob("shards/*.pxd")]:
        assert str(pxd.relative_to(ROOT).with_suffix("")) in typed, pxd
        assert any(fnmatch.fnmatch(pxd.name, pattern) for pattern in package_data), pxd
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: .gitignore is not checked")
    generated = [str(Path(source).with_suffix(".c")) for source in build.COMPILED]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *generated], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert sorted(ignored) == sorted(generated)


def test_without_a_c_compiler_the_install_goes_on_with_the_pure_twins(tmp_path):
    """Every extension is optional (cythonize drops the flag: setup.py sets it
    after): a build whose compiler fails goes on, and builds nothing."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "*.so", "*.c"))
    built = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=source, env={**os.environ, "CC": "false"}, capture_output=True, text=True,
        timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    for name in EXTENSIONS:  # each was tried
        assert f"building '{name}' extension" in built.stdout
    assert not list((tmp_path / "lib").rglob("*.so"))
