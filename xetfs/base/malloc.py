"""glibc malloc settings for the daemon and its decode workers."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

from xetfs.base.settings import MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def keep_freed_memory() -> None:
    """Have glibc keep and reuse this process's freed memory.

    One arena per process instead of one per thread: chunks decoded in
    threads otherwise leave freed memory scattered over several arenas, and
    RSS drifts tens of MiB above the cache's byte bound.  No trimming of the
    heap and no mmap for buffers up to a few MiB: the read path allocates
    and frees ~1 MiB buffers all the time, and memory handed back to the
    kernel costs a page fault per 4 KiB when it is taken again.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_ARENA_MAX, 1)
        libc.mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
        libc.mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
