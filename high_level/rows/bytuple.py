"""Slide-by-tuple windows with FCA bins (dissertation §5.1.5, §6.1.4): RANGE over the timestamp, a window
every ``every``-th row of a capture host, ending at that row's timestamp (Eq. 5.13-5.15).

Such a window is *forward-context aware*: which windows a row belongs to depends on rows still to come,
so a row cannot be bucketed on arrival. The dissertation's answer (Fig. 6-7) keeps no rows: it keeps the
function ``f(x) = aggregate of the rows u with x - RANGE < u.ts <= x`` as *bins*, one breakpoint at every
row's timestamp (its start bin) and at its timestamp + RANGE (its end bin), each with the partial
aggregate of the region it starts. A new row splits the bins its two breakpoints fall into (a new bin
starts with its left neighbour's value) and merges itself into every bin of ``[ts, ts + RANGE)``; the
host's punctuation (a timestamp mark) closes the windows below it, whose value is ``f`` at their id, and
purges the bins below it but the last. Arrival order does not matter; the state is two bins per row of
the last RANGE, partial aggregates rather than rows. Batch-wise on arrays: the split is one
``searchsorted``, the merge one compiled loop over the rows (the paper's per-tuple update).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import aggregates as A
from contract.query.rows import RowQuerySpec
from contract.query.windows import TupleSlideSpec
from high_level.rows import saved

I64 = np.int64


@njit(cache=True, nogil=True)
def _merge_rows(lo: np.ndarray, hi: np.ndarray, state: np.ndarray, ops: np.ndarray, pa: np.ndarray) -> None:
    """Merge row r's state into bins ``[lo[r], hi[r])`` (op 0 sum, 1 min, 2 max: contract.aggregates)."""
    for r in range(lo.shape[0]):
        for b in range(lo[r], hi[r]):
            for j in range(ops.shape[0]):
                v = state[r, j]
                if ops[j] == 0:
                    pa[b, j] += v
                elif ops[j] == 1:
                    if v < pa[b, j]:
                        pa[b, j] = v
                elif v > pa[b, j]:
                    pa[b, j] = v


class SlideByTuple:
    """One capture host's slide-by-tuple windows: bins (sorted ids, partial aggregates) and open windows."""

    def __init__(self, range_ns: int, every: int, ops: tuple[int, ...]) -> None:
        assert (A.MERGE_SUM, A.MERGE_MIN, A.MERGE_MAX) == (0, 1, 2)  # the kernel's op codes
        self.range_ns, self.every = range_ns, every
        self.ops = np.asarray(ops, I64)
        self.identity = np.array([A.MERGE_IDENTITY[op] for op in ops], I64)
        self.ids = np.zeros(0, I64)  # bin ids (timestamps), sorted, unique
        self.pa = np.zeros((0, len(ops)), I64)  # f on [ids[i], ids[i+1])
        self.win_ts = np.zeros(0, I64)  # open windows: the defining row's timestamp and row number
        self.win_row = np.zeros(0, I64)
        self.mark = np.iinfo(I64).min  # windows below it are emitted
        self.late = 0  # rows below the mark (counted, dropped)

    def add(self, ts: np.ndarray, row: np.ndarray, state: np.ndarray) -> None:
        """Rows of the host in any order: timestamp, the host's row number, lifted state (int64[n, ns])."""
        ts, row, state = np.asarray(ts, I64), np.asarray(row, I64), np.asarray(state, I64)
        ok = ts >= self.mark
        self.late += int(len(ok) - ok.sum())
        ts, row, state = ts[ok], row[ok], state[ok]
        new = np.setdiff1d(np.concatenate([ts, ts + self.range_ns]), self.ids)
        left = np.searchsorted(self.ids, new, "right") - 1  # the old bin each new one splits
        init = np.repeat(self.identity[None, :], len(new), 0)
        init[left >= 0] = self.pa[left[left >= 0]]
        ids = np.concatenate([self.ids, new])
        order = np.argsort(ids, kind="stable")
        self.ids, self.pa = ids[order], np.ascontiguousarray(np.vstack([self.pa, init])[order])
        lo = np.searchsorted(self.ids, ts, "left")
        hi = np.searchsorted(self.ids, ts + self.range_ns, "left")
        _merge_rows(lo, hi, state, self.ops, self.pa)
        win = (row + 1) % self.every == 0
        self.win_ts = np.concatenate([self.win_ts, ts[win]])
        self.win_row = np.concatenate([self.win_row, row[win]])

    def close(self, mark: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row below ``mark`` (a timestamp) has arrived: (window ts, row, state) of the windows below
        it, by row; the bins below it are dropped but the last (a later row's split needs its value)."""
        self.mark = max(self.mark, mark)
        done = self.win_ts < self.mark
        ts, row = self.win_ts[done], self.win_row[done]
        self.win_ts, self.win_row = self.win_ts[~done], self.win_row[~done]
        state = self.pa[np.searchsorted(self.ids, ts, "right") - 1]
        first = max(int(np.searchsorted(self.ids, self.mark, "left")) - 1, 0)
        self.ids, self.pa = self.ids[first:], self.pa[first:]
        order = np.argsort(row, kind="stable")
        return ts[order], row[order], state[order]

    def snapshot(self) -> bytes:
        """The whole state (restart: :meth:`restore` into a fresh operator of the same query)."""
        return saved.snapshot(self, ("ids", "pa", "win_ts", "win_row"), ("mark", "late"))

    def restore(self, blob: bytes) -> None:
        saved.restore(self, blob, ("ids", "pa", "win_ts", "win_row"))

    @classmethod
    def of(cls, spec: RowQuerySpec) -> SlideByTuple:
        """The operator of a ``kind: rows`` query with a ``{range, every}`` window."""
        if not isinstance(spec.window, TupleSlideSpec):
            raise ValueError(f"query {spec.name!r} has a row window (high_level.rows.windows)")
        return cls(spec.window.range_ns, spec.window.every, spec.ops)

    @property
    def state_rows(self) -> int:
        """Bins and open windows held."""
        return int(len(self.ids) + len(self.win_ts))
