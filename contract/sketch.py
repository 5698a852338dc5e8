"""The mergeable sketches of holistic aggregates: their computed key words, defined once in numpy.

A holistic aggregate (distinct count, quantiles, top-k) runs in two stages, as Gigascope splits it:
the low level groups by (group, sub-key) per pane, the high level's roll-up merges panes into windows
per (window, group, sub-key) unchanged, and a second stage at close reduces the sub-keys of each
(window, group) (:mod:`high_level.aggregate.holistic`). The sub-key is either a field's value itself (exact) or
a word computed from it:

* HyperLogLog register: the top ``p`` bits of a 64-bit hash of the value words; the state is the
  rank (leading zeros of the remaining bits + 1), merged by max. The roll-up's max over panes is
  exactly the HLL register union.
* DDSketch bucket: ``ceil(log(v) / log(gamma))`` with ``gamma = (1 + a) / (1 - a)``; every value of a
  bucket is within relative error ``a`` of the bucket's representative ``2 gamma^k / (gamma + 1)``.

The low level computes the same words per packet in Numba (``low_level.kernel.sketchkey``); tests compare
the two. The hash is :func:`contract.wire.key_hash` of the value words (splitmix64 chain).
"""

from __future__ import annotations

import math

import numpy as np

from contract import wire

HLL_MIN_P, HLL_MAX_P, HLL_DEFAULT_P = 4, 18, 14
BUCKET_ZERO = -1  # the bucket of value 0; negative values get buckets below it (mirrored)
BUCKET_NEG = -2
# Every sub-key word of the row carrying a bounded top's Misra-Gries error (its weight column), not an item.
ERROR_ITEM = np.iinfo(np.int64).min


def value_hash(words: np.ndarray) -> np.ndarray:
    """uint64 hash per row of the value words int64[n, w] (w = 1 numeric, 2 address)."""
    return wire.key_hash(words)


def hll_register_rank(words: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(register index, rank) per value: index = top ``p`` hash bits, rank = leading zeros of the
    other ``64 - p`` bits + 1 (1 .. 65 - p)."""
    h = value_hash(words)
    reg = (h >> np.uint64(64 - p)).astype(np.int64)
    rest = (h << np.uint64(p)) | np.uint64(1 << (p - 1))  # a sentinel bit bounds the rank at 65 - p
    # leading zeros of a uint64 via float64 exponent is inexact near 2^k boundaries: count exactly
    lz = np.zeros(len(h), np.int64)
    x = rest.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        small = (x >> np.uint64(64 - shift)) == 0
        lz += np.where(small, shift, 0)
        x = np.where(small, x << np.uint64(shift), x)
    return reg, lz + 1


def hll_alpha(m: int) -> float:
    if m == 16:
        return 0.673
    if m == 32:
        return 0.697
    if m == 64:
        return 0.709
    return 0.7213 / (1 + 1.079 / m)


def hll_estimate(zsum: np.ndarray, present: np.ndarray, p: int) -> np.ndarray:
    """Cardinality estimates from per-group sums: ``zsum`` = sum over present registers of 2^-rank,
    ``present`` = registers present (absent registers are 0, contributing 1 each to the harmonic
    sum). Standard HLL with linear counting below 2.5 m (64-bit hash: no large-range correction)."""
    m = 1 << p
    zeros = m - present
    raw = hll_alpha(m) * m * m / (zsum + zeros)
    with np.errstate(divide="ignore"):
        lin = m * np.log(m / np.maximum(zeros, 1))
    return np.where((raw <= 2.5 * m) & (zeros > 0), lin, raw)


def hll_relative_error(p: int) -> float:
    """The standard error of the HLL estimate, 1.04 / sqrt(2^p) (0.81% at p = 14)."""
    return 1.04 / math.sqrt(1 << p)


def gamma_of(accuracy: float) -> float:
    return (1 + accuracy) / (1 - accuracy)


def inv_log_gamma(accuracy: float) -> float:
    """The literal the kernel multiplies log(v) by (Python float, the same on both sides)."""
    return 1.0 / math.log(gamma_of(accuracy))


def log_bucket(values: np.ndarray, accuracy: float) -> np.ndarray:
    """DDSketch bucket of each integer value: k >= 0 for v >= 1, BUCKET_ZERO for 0, BUCKET_NEG - k(-v)
    below (monotone in v). ``accuracy`` 0: the value itself (exact)."""
    v = np.asarray(values, np.int64)
    if accuracy == 0:
        return v
    inv = inv_log_gamma(accuracy)
    mag = np.abs(v).astype(np.float64)
    with np.errstate(divide="ignore"):
        k = np.ceil(np.log(np.maximum(mag, 1.0)) * inv).astype(np.int64)
    return np.where(v > 0, k, np.where(v == 0, BUCKET_ZERO, BUCKET_NEG - k))


def bucket_value(buckets: np.ndarray, accuracy: float) -> np.ndarray:
    """The representative value of each bucket (float64): within ``accuracy`` relative error of every
    value the bucket holds; the value itself when exact."""
    k = np.asarray(buckets, np.int64)
    if accuracy == 0:
        return k.astype(np.float64)
    g = gamma_of(accuracy)
    pos = np.where(k >= 0, k, np.where(k == BUCKET_ZERO, 0, BUCKET_NEG - k))
    rep = 2.0 * np.power(g, pos.astype(np.float64)) / (g + 1.0)
    return np.where(k >= 0, rep, np.where(k == BUCKET_ZERO, 0.0, -rep))


def quantile_rank(q: float, n: np.ndarray) -> np.ndarray:
    """The 1-based rank of quantile ``q`` among ``n`` values (nearest rank: the smallest value with at
    least ceil(q n) values <= it); q n is rounded to 9 decimals first so 0.95 * 20 is 19, not 19.000...04."""
    n = np.asarray(n, np.int64)
    return np.clip(np.ceil(np.round(q * n, 9)).astype(np.int64), 1, np.maximum(n, 1))
