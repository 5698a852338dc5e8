"""Computed key words and state of holistic aggregates, per packet in Numba (contract.sketch in numpy).

The generated kernel calls these for a query whose sub-key is an HLL register or a DDSketch bucket:
the hash is contract.wire.key_hash's splitmix64 chain over the value words, so the register and rank
equal :func:`contract.sketch.hll_register_rank` bit for bit (tests compare them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from low_level.jit.splitmix import GOLDEN as _GOLDEN
from low_level.jit.splitmix import mix64


@njit(cache=True, nogil=True, inline="always")
def value_hash1(w0: np.int64) -> np.uint64:
    return mix64(_GOLDEN ^ np.uint64(w0)) + _GOLDEN


@njit(cache=True, nogil=True, inline="always")
def value_hash2(w0: np.int64, w1: np.int64) -> np.uint64:
    h = mix64(_GOLDEN ^ np.uint64(w0)) + _GOLDEN
    return mix64(h ^ np.uint64(w1)) + _GOLDEN


@njit(cache=True, nogil=True, inline="always")
def hll_register(h: np.uint64, p: int) -> np.int64:
    return np.int64(h >> np.uint64(64 - p))


@njit(cache=True, nogil=True, inline="always")
def hll_rank(h: np.uint64, p: int) -> np.int64:
    """Leading zeros of the hash's low 64 - p bits + 1 (a sentinel bit bounds it at 65 - p)."""
    x = (h << np.uint64(p)) | (np.uint64(1) << np.uint64(p - 1))
    r = np.int64(1)
    while (x >> np.uint64(63)) == np.uint64(0):
        r += 1
        x = x << np.uint64(1)
    return r


@njit(cache=True, nogil=True, inline="always")
def log_bucket(v: np.int64, inv_log_gamma: float) -> np.int64:
    """DDSketch bucket of an integer value (contract.sketch.log_bucket)."""
    if v > 0:
        return np.int64(math.ceil(math.log(float(v)) * inv_log_gamma))
    if v == 0:
        return np.int64(-1)
    return np.int64(-2) - np.int64(math.ceil(math.log(float(-v)) * inv_log_gamma))
