"""Which twin of the hot-path codec runs: the compiled one (_hotpath.pyx, built by
`pip install`) when it was built, the pure Python one otherwise or when
WARREN_PURE_PYTHON is set (to run or test the broker without it)."""

from __future__ import annotations

import os


def hotpath_module():
    """The compiled module, or None when the pure functions serve."""
    if os.environ.get("WARREN_PURE_PYTHON"):
        return None
    try:
        from . import _hotpath
    except ImportError:  # not built (no compiler when installed): the pure twin serves
        return None
    return _hotpath
