"""glibc's allocator told to keep freed memory for reuse (both kinds of process).

Large message bodies are allocated and freed by the thousand per second. With
glibc's defaults the heap top is trimmed back to the kernel after frees and
bodies over the (dynamic) mmap threshold get a fresh mapping each, so every new
body page-faults its pages in again, which made large bodies cost far more CPU
per MB (the bodycost probe's figures: docs/performance.md). Keeping up to TRIM_THRESHOLD of free heap and serving bodies up to
MMAP_THRESHOLD from the heap reuses pages instead. RSS can stay that much above
what is in use after a burst; memory alarms count message bytes, not RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
TRIM_THRESHOLD = 32 << 20
TOP_PAD = 16 << 20
MMAP_THRESHOLD = 32 << 20


def keep_freed_memory() -> bool:
    """Apply the settings; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD)))
