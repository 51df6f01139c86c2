"""Which twin serves: the compiled one where pip install built it (the ring's core,
or a pure module compiled as it is, typed by the .pxd named after its extension:
setup.py), the pure one where none was built (no C compiler) or
WARREN_PURE_PYTHON is set, as for the codec's twins."""

from __future__ import annotations

import importlib
import os


def built_module(module: str):
    """The compiled extension `module`, or None where it was not built."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def built(module: str, name: str):
    """`name` from the compiled extension `module`, or None where it was not built."""
    extension = built_module(module)
    return None if extension is None else getattr(extension, name)


def chosen(pure, compiled):
    """The compiled twin, unless there is none or WARREN_PURE_PYTHON asks for the pure one."""
    return pure if compiled is None or os.environ.get("WARREN_PURE_PYTHON") else compiled
