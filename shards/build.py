"""Which build runs: the compiled twins of the hot paths, or the pure Python ones.

COMPILED is the one list of compiled modules: setup.py builds each as an
extension beside its source (a .pyx, or a pure module compiled as it is, typed by
the .pxd of its extension's name: shards/_queue.pxd for shards/queue.py), and the
tests and `warren serve` read it. The gateway and the shards both choose here,
one way: a compiled twin serves where its extension imports, the pure one where
it does not (not built: no C compiler when installed) or where WARREN_PURE_PYTHON
is set (to run or test the broker without them). A twin that annotations name
is bound under `if not TYPE_CHECKING:`, so that a type checker reads the pure
one (frames.FrameReader). This module imports nothing of Warren's, so any module
may."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

# Sources under the repository root (the package `warren`).
COMPILED = (
    "gateway/amqp/_hotpath.pyx",  # the codec's hot path
    "shards/_ring.pyx",  # the ring's core
    "gateway/io/shardlink.py",
    "shards/gatewayrings.py",
    "shards/outbox.py",
    "shards/consumers.py",
    "shards/message.py",
    "shards/ready.py",
    "shards/queue.py",
    "shards/shard.py",
    "shards/main.py",
    "shards/batches.py",
)

# Extensions that did not import in this process, with the reason.
_failed: dict[str, str] = {}


def extension_name(source: str) -> str:
    """The installed name of the extension built from `source`:
    warren.shards._queue for shards/queue.py, warren.shards._ring for shards/_ring.pyx."""
    folder, _, file = source.rpartition("/")
    return f"warren.{folder.replace('/', '.')}._{file.rsplit('.', 1)[0].lstrip('_')}"


def pure_only() -> bool:
    """Whether WARREN_PURE_PYTHON asks for the pure twins."""
    return bool(os.environ.get("WARREN_PURE_PYTHON"))


def extension(name: str) -> ModuleType | None:
    """The compiled extension `name` (warren.shards._queue), or None where its pure
    twin serves."""
    if pure_only():
        return None
    try:
        return importlib.import_module(name)
    except ImportError as error:  # not built, or built against other types
        _failed[name] = str(error)
        return None


def twin(pure: T, name: str, attribute: str | None = None) -> T:
    """`attribute` of the extension `name` (the extension itself without one), or
    `pure` where that extension does not serve. Typed as the pure twin, whose
    interface the compiled one has."""
    compiled = extension(name)
    if compiled is None:
        return pure
    found: Any = compiled if attribute is None else getattr(compiled, attribute)
    return found


def check() -> tuple[str, str]:
    """Which build runs, in a few words for `warren serve`'s first line, and what of
    the compiled build failed ('' if nothing), with the reason: it imports every
    extension once, as the processes will."""
    if pure_only():
        return "pure Python build (WARREN_PURE_PYTHON is set)", ""
    names = [extension_name(source) for source in COMPILED]
    failed = [name for name in names if extension(name) is None]
    if not failed:
        return "compiled build", ""
    reasons = "; ".join(f"{name}: {_failed[name]}" for name in failed)
    words = "pure Python build" if len(failed) == len(names) else "partly compiled build"
    return words, (f"the compiled build failed ({len(failed)} of {len(names)} extensions did "
                   f"not import; their pure Python twins serve; reinstall with a C compiler "
                   f"to build them): {reasons}")
