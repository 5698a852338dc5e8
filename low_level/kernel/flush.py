"""Flush policies: how old partial aggregates leave the table (OOP paper, section 6).

* ``lazy`` (m): entries leave when a collision pushes them out; when the current pane advances, any
  entry more than m panes old is swept out, so a result is delayed by at most m panes.
* ``slow`` (i, m): additionally one old entry (pane < current) leaves every i packets.
* ``iop``: the in-order baseline. One old entry per packet, and a collision that would evict a
  current-pane entry while old entries remain first flushes *all* old entries (the burst that makes
  IOP drop packets). Kept only to compare against.

Every policy keeps the invariant "all table entries lie in panes [cur - m, cur]" which also keeps the
per-pane entry counters (a ring of 64) exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.jit.refcount import pin, pin_tables
from low_level.kernel.subaggregate import emit_slot
from low_level.kernel.tables import (
    EMPTY,
    PANE_RING,
    QP_BASE,
    QP_M,
    QP_SIZE,
    QP_STRIDE,
    QS_BURST_MAX,
    QS_CUR,
    QS_CURSOR,
    QS_FLUSH_IOP,
    QS_FLUSH_SLOW,
    QS_FLUSH_SWEEP,
    QS_OCC,
)


@njit(cache=True, nogil=True)
def entries_below(q: int, bound: int, lo: int, pane_counts: np.ndarray) -> int:
    """Entries with pane in [lo, bound), from the per-pane counters (the range must span < 64 panes)."""
    n = 0
    p = lo
    while p < bound:
        n += pane_counts[q, p & (PANE_RING - 1)]
        p += 1
    pin(pane_counts)
    return n


@njit(cache=True, nogil=True)
def sweep_below(q: int, bound: int, qp, qs, tab, out, pane_counts) -> int:
    """Emit every entry of query q with pane < bound (a full table scan); returns how many."""
    base, size, stride = qp[q, QP_BASE], qp[q, QP_SIZE], qp[q, QP_STRIDE]
    n = 0
    for s in range(size):
        pos = base + s * stride
        sp = tab[pos]
        if sp != EMPTY and sp < bound:
            emit_slot(q, pos, qp, qs, tab, out, pane_counts)
            n += 1
    pin_tables(qp, qs, tab, out, pane_counts)
    return n


@njit(cache=True, nogil=True)
def on_advance(q: int, old_cur: int, new_cur: int, qp, qs, tab, out, pane_counts) -> None:
    """The current pane moved forward: enforce the m-pane bound on what stays in the table.

    Like every helper the per-packet path calls, written with one exit (no early return), so Numba's
    refcount pruning leaves no atomic NRT incref/decref of the array arguments (see low_level.kernel.parse).
    """
    m = qp[q, QP_M]
    bound = new_cur - m
    lo = old_cur - m
    if bound > lo:
        hi = bound if bound - lo < PANE_RING else lo + PANE_RING
        if entries_below(q, hi, lo, pane_counts) > 0:
            n = sweep_below(q, bound, qp, qs, tab, out, pane_counts)
            qs[q, QS_FLUSH_SWEEP] += n
            if n > qs[q, QS_BURST_MAX]:
                qs[q, QS_BURST_MAX] = n
    pin_tables(qp, qs, tab, out, pane_counts)


@njit(cache=True, nogil=True)
def old_entries(q: int, qs, pane_counts) -> int:
    """Entries in panes before the current one."""
    return qs[q, QS_OCC] - pane_counts[q, qs[q, QS_CUR] & (PANE_RING - 1)]


@njit(cache=True, nogil=True)
def flush_one_old(q: int, qp, qs, tab, out, pane_counts) -> bool:
    """Advance the flush cursor to the next old entry and emit it (the slow-flush step)."""
    done = False
    if old_entries(q, qs, pane_counts) > 0:
        base, size, stride = qp[q, QP_BASE], qp[q, QP_SIZE], qp[q, QP_STRIDE]
        cur = qs[q, QS_CUR]
        c = qs[q, QS_CURSOR]
        k = 0
        while k < size and not done:
            pos = base + c * stride
            c = (c + 1) & (size - 1)
            sp = tab[pos]
            if sp != EMPTY and sp < cur:
                emit_slot(q, pos, qp, qs, tab, out, pane_counts)
                done = True
            k += 1
        qs[q, QS_CURSOR] = c
    pin_tables(qp, qs, tab, out, pane_counts)
    return done


@njit(cache=True, nogil=True)
def iop_burst(q: int, qp, qs, tab, out, pane_counts) -> None:
    """IOP: flush all old entries at once before a current-pane entry may leave."""
    if old_entries(q, qs, pane_counts) > 0:
        n = sweep_below(q, qs[q, QS_CUR], qp, qs, tab, out, pane_counts)
        qs[q, QS_FLUSH_IOP] += n
        if n > qs[q, QS_BURST_MAX]:
            qs[q, QS_BURST_MAX] = n
    pin_tables(qp, qs, tab, out, pane_counts)


@njit(cache=True, nogil=True)
def slow_tick(q: int, qp, qs, tab, out, pane_counts) -> None:
    if flush_one_old(q, qp, qs, tab, out, pane_counts):
        qs[q, QS_FLUSH_SLOW] += 1
    pin_tables(qp, qs, tab, out, pane_counts)


@njit(cache=True, nogil=True)
def min_pane(q: int, qs, qp, pane_counts) -> int:
    """Oldest pane present in the table, or the current pane + 1 when the table is empty."""
    cur = qs[q, QS_CUR]
    res = cur + 1
    if qs[q, QS_OCC] != 0:
        p = cur - qp[q, QP_M]
        while p <= cur:
            if pane_counts[q, p & (PANE_RING - 1)] > 0:
                res = p
                break
            p += 1
    pin(qs)
    pin(qp)
    pin(pane_counts)
    return res
