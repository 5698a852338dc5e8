"""Zeroed arrays backed by transparent huge pages where the kernel allows (2 MiB instead of 4 KiB pages).

Why: the per-packet pass walks the capture ring (five arrays, one slot each per frame) and probes
hash tables of tens of MiB at random. With 4 KiB pages the tables miss the TLB on nearly every
packet and the ring every few dozen frames; in a VM each miss is a two-level page walk. Linux's
default THP mode ("madvise") gives huge pages only to memory that asks, hence the anonymous mapping
and madvise. Small arrays, or systems without THP, get ordinary memory (the hint is only a hint).
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def zeros(n: int, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """n zeroed elements of dtype, on huge pages when the array spans at least one."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(n, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        pass
    return np.frombuffer(region, dtype=dtype, count=n)  # the array keeps the mapping alive
