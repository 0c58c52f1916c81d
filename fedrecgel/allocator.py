"""Keep the memory a client step frees in the process, for the next group and round to reuse.

A group's step allocates and frees the same tens of MB every time (activations of a few
thousand samples, each client's dense score-network gradient). glibc's malloc serves blocks
above its mmap threshold (128 KiB, raised automatically up to 32 MiB) with fresh mappings
and gives the top of its heap back to the system once more than twice that is free there,
so part of a round's memory comes back as new pages, each first write a page fault (a
default FilmTrust round took thousands; ``bench/allocator.py`` measures the difference).
:func:`keep_freed_memory` raises both thresholds, so freed blocks stay in the heap and are
handed out again without faults.

The cost: memory freed after a peak stays mapped (up to :data:`TRIM_THRESHOLD` at the top
of the heap), so the resident size stays near its peak; the peak grows by a few MB at most
in that benchmark.
Applied once per process, on glibc only (elsewhere nothing is changed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

#: blocks up to this size come from the heap (reused) instead of fresh mappings
MMAP_THRESHOLD = 64 << 20
#: free memory at the top of the heap kept before any is returned to the system
TRIM_THRESHOLD = 512 << 20

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process; a second call from another
    thread at the same moment only sets the same values again); whether they are set."""
    if platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return bool(ok_mmap and ok_trim)
