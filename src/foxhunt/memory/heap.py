"""Freed host memory kept for the next step (glibc's malloc), not given back and faulted in again.

Why: glibc serves a block over its mmap threshold (128 kB, rising to at most 32 MB as blocks are
freed) with fresh pages from the OS and unmaps them at free; a step's big activations are then
faulted in page by page at their first write, every step. Measured on 2 CPU cores at bench config
DLE (batch 1,024, hidden 128): 2.9 million page faults per training step, 8.4 s a step against
5.6 s with this, and evaluation 2.5 s against 1.5 s (`docs/performance.md`). The cost: the
process keeps its peak's memory mapped after the peak (its RSS no longer falls), which the next
step or validation reuses. Nothing changes where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import cache

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
LARGEST = 2**31 - 1  # mallopt takes an int: blocks above 2 GiB are still mapped afresh


@cache
def keep_freed_memory() -> bool:
    """Serve blocks up to 2 GiB from malloc's heap and never trim it (once per process);
    whether glibc took it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
        return False
    taken = bool(mallopt(M_MMAP_THRESHOLD, LARGEST)) and bool(mallopt(M_TRIM_THRESHOLD, LARGEST))
    log.debug("malloc keeps freed memory: %s", taken)
    return taken
