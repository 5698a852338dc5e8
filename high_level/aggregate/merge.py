"""Merging partial states per key, exactly: the group-by every level of the roll-up uses, and the
Misra-Gries bound of a top's table (holistic ``top`` with a capacity).

Its own module because the roll-up (:mod:`high_level.aggregate.rollup`), the join and the chunked state
all merge (pane, key) rows the same way; one definition of the merge (``contract.aggregates`` ops).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract import aggregates as A
from contract import sketch, wire

I64 = np.int64


def _reduce_sorted(
    state: np.ndarray, order: np.ndarray, starts: np.ndarray, ops: tuple[int, ...]
) -> np.ndarray:
    st = state[order]
    out = np.empty((len(starts), st.shape[1]), I64)
    for j, op in enumerate(ops):
        out[:, j] = _UFUNC[op].reduceat(st[:, j], starts) if len(starts) else np.empty(0, I64)
    return out


_UFUNC, _IDENTITY = A.MERGE_UFUNCS, A.MERGE_IDENTITY
ERROR_ITEM = sketch.ERROR_ITEM


def error_rows(key: np.ndarray, gw: int) -> np.ndarray:
    """bool[n]: the rows of a bounded top's table that carry its error counter, not an item."""
    return np.all(key[:, gw:] == ERROR_ITEM, axis=1) if key.shape[1] > gw else np.zeros(len(key), bool)


def misra_gries(
    pane: np.ndarray, key: np.ndarray, state: np.ndarray, gw: int, c: int, ops: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bound a (pane, key)-unique top table to ``c`` items + 1 error row per (pane, group).

    Weighted Misra-Gries: a (pane, group) with more than ``c`` items loses the (c+1)-th largest
    weight ``d`` from every item (those left at <= 0 are dropped) and ``d`` is added to its error row
    (sub-key words ``ERROR_ITEM``, weight = the last state column, other columns their merge identity).
    The error rows merge by sum across batches and panes like any weight, so for every item a window
    reports, true - error <= reported <= true. Why here: it bounds the high level's state per pane.
    (An item whose every word is ``ERROR_ITEM``, IPv6 ``8000::8000:0:0:0``, would be taken for the error row.)
    """
    err = error_rows(key, gw)
    if c <= 0 or len(pane) <= c:
        return pane, key, state
    ri = np.flatnonzero(~err)
    p, k, wt = pane[ri], key[ri], state[ri, -1]
    order = np.lexsort((-wt, *(k[:, j] for j in reversed(range(gw))), p))
    new = np.ones(len(ri), bool)
    if len(ri) > 1:
        same = p[order][1:] == p[order][:-1]
        for j in range(gw):
            same &= k[order][1:, j] == k[order][:-1, j]
        new[1:] = ~same
    starts = np.flatnonzero(new)
    counts = np.diff(np.r_[starts, len(ri)])
    big = counts > c
    if not big.any():
        return pane, key, state
    d = np.zeros(len(starts), I64)
    d[big] = wt[order][starts[big] + c]  # the (c+1)-th largest weight of the group
    dr = np.repeat(d, counts)
    rows = ri[order]
    st = state[rows].copy()
    st[:, -1] -= dr
    keep = (dr == 0) | (st[:, -1] > 0)
    # one new error row per reduced (pane, group): identities, weight d
    g = starts[big]
    ek = key[rows[g]].copy()
    ek[:, gw:] = ERROR_ITEM
    es = np.array([_IDENTITY[op] for op in ops], I64)[None, :].repeat(len(g), 0)
    es[:, -1] = d[big]
    ei = np.flatnonzero(err)
    ep, ek, es = np.r_[pane[ei], pane[rows[g]]], np.vstack([key[ei], ek]), np.vstack([state[ei], es])
    ekeys, es = group_reduce(np.column_stack([ep, ek]), es, ops)
    keep_rows = rows[keep]
    return (
        np.r_[pane[keep_rows], ekeys[:, 0]],
        np.ascontiguousarray(np.vstack([key[keep_rows], ekeys[:, 1:]])),
        np.ascontiguousarray(np.vstack([st[keep], es])),
    )


def group_reduce(keys: np.ndarray, state: np.ndarray, ops: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of ``keys`` (int64[n, c]) and the merged state per unique row, exactly.

    Unique rows come in order of first appearance. Why a hash: factorising one uint64 per row is
    several times faster than a multi-column sort; the result is verified against the full key and
    falls back to an exact multi-column unique on a (vanishingly rare) 64-bit collision, so the answer
    never depends on luck. The merge is an unbuffered ``ufunc.at`` per state column (no sort needed).
    """
    n = keys.shape[0]
    if n == 0:
        return keys.reshape(0, keys.shape[1]), state.reshape(0, state.shape[1])
    found = _hash_codes(keys)
    if found is None:  # hash collision: exact fallback
        _, inv = np.unique(keys, axis=0, return_inverse=True)
        order = np.argsort(inv.ravel(), kind="stable")
        si = inv.ravel()[order]
        flags = np.r_[True, si[1:] != si[:-1]]
        starts = np.flatnonzero(flags)
        return keys[order[starts]], _reduce_sorted(state, order, starts, ops)
    codes, rep = found
    out = np.empty((len(rep), state.shape[1]), I64)
    for j, op in enumerate(ops):
        col = np.full(len(rep), _IDENTITY[op], I64)
        _UFUNC[op].at(col, codes, state[:, j])
        out[:, j] = col
    return keys[rep], out


def _hash_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row of ``keys`` (int64[n, c], n > 0) its group's number in order of first appearance, and each
    group's first row; None on a 64-bit hash collision (the numbers are verified against the full key)."""
    codes, _ = pd.factorize(wire.key_hash(keys), sort=False)
    # codes are numbered in order of first appearance: a row is its group's first exactly where the
    # running maximum of the codes grows
    top = np.maximum.accumulate(codes)
    first = np.empty(len(codes), bool)
    first[0] = True
    np.greater(top[1:], top[:-1], out=first[1:])
    rep = np.flatnonzero(first)
    ukeys = keys[rep]
    if not all(np.array_equal(keys[:, j], ukeys[:, j].take(codes)) for j in range(keys.shape[1])):
        return None
    return codes, rep


def key_codes(keys: np.ndarray) -> np.ndarray:
    """Per row of ``keys`` a number of its distinct key (int64), exactly (a hash collision falls back)."""
    if len(keys) == 0:
        return np.empty(0, I64)
    found = _hash_codes(keys)
    if found is not None:
        return found[0].astype(I64)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel().astype(I64)
