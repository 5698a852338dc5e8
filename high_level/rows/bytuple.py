"""Slide-by-tuple windows with FCA bins (dissertation §5.1.5, §6.1.4): RANGE over the timestamp, a window
every ``every``-th row of a capture host, ending at that row's timestamp (Eq. 5.13-5.15).

Such a window is *forward-context aware*: which windows a row belongs to depends on rows still to come,
so a row cannot be bucketed on arrival. The dissertation's answer (Fig. 6-7) keeps no rows: it keeps the
function ``f(x) = aggregate of the rows u with x - RANGE < u.ts <= x`` as *bins*, one breakpoint at every
row's timestamp (its start bin) and at its timestamp + RANGE (its end bin), each with the partial
aggregate of the region it starts. A new row splits the bins its two breakpoints fall into (a new bin
starts with its left neighbour's value) and merges itself into every bin of ``[ts, ts + RANGE)``; the
host's punctuation (a timestamp mark) closes the windows below it, whose value is ``f`` at their id, and
purges the bins below it but the last (and those no row reaches). Arrival order does not matter; the
state is two bins per row of the last RANGE, partial aggregates rather than rows. Batch-wise on arrays:
the split is one ``lexsort`` of the old and new breakpoints, the merge one compiled loop over the rows
(the paper's per-tuple update).

Groups (``group_by``): the bins are kept per group, sorted by (group, id), so a row splits and merges only
its own group's bins; the windows stay the host's (every ``every``-th row of all groups), and a window
gives a row for each group with rows in its RANGE (each bin carries a hidden row count).
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


@njit(cache=True, nogil=True)
def _at(gstart: np.ndarray, gend: np.ndarray, ids: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Index of the bin holding ``xs[w]`` in each group's bins (``[gstart[g], gend[g])``), -1: none below it."""
    out = np.empty((xs.shape[0], gstart.shape[0]), np.int64)
    for w in range(xs.shape[0]):
        for g in range(gstart.shape[0]):
            lo, hi = gstart[g], gend[g]
            while lo < hi:  # the first bin above xs[w]
                mid = (lo + hi) // 2
                if ids[mid] <= xs[w]:
                    lo = mid + 1
                else:
                    hi = mid
            out[w, g] = lo - 1 if lo > gstart[g] else -1
    return out


class SlideByTuple:
    """One capture host's slide-by-tuple windows: bins per group (sorted by group, then id; partial
    aggregates and a row count last) and the open windows, which are the host's, not a group's."""

    def __init__(self, range_ns: int, every: int, ops: tuple[int, ...], key_words: int = 0) -> None:
        assert (A.MERGE_SUM, A.MERGE_MIN, A.MERGE_MAX) == (0, 1, 2)  # the kernel's op codes
        self.range_ns, self.every = range_ns, every
        self.ops = np.asarray((*ops, A.MERGE_SUM), I64)  # and the bin's row count: 0 = no row, identity
        self.identity = np.array([A.MERGE_IDENTITY[op] for op in self.ops], I64)
        self.keys = np.zeros((0 if key_words else 1, key_words), I64)  # group g's key words
        self.gid = np.zeros(0, I64)  # bins: group, id (a timestamp), f on [ids[i], ids[i+1]) of the group
        self.ids = np.zeros(0, I64)
        self.pa = np.zeros((0, len(self.ops)), I64)
        self.win_ts = np.zeros(0, I64)  # open windows: the defining row's timestamp and row number
        self.win_row = np.zeros(0, I64)
        self.mark = np.iinfo(I64).min  # windows below it are emitted
        self.late = 0  # rows below the mark (counted, dropped)

    def _codes(self, key: np.ndarray) -> np.ndarray:
        """Group code of each row's key, new groups added (the bins' codes follow)."""
        known = len(self.keys)
        if self.keys.shape[1] == 0:
            return np.zeros(len(key), I64)
        uniq, inv = np.unique(np.vstack([self.keys, key]), axis=0, return_inverse=True)
        inv = inv.ravel().astype(I64)
        self.gid = inv[:known][self.gid]
        self.keys = uniq
        return inv[known:]

    def add(self, ts: np.ndarray, row: np.ndarray, state: np.ndarray, key: np.ndarray | None = None) -> None:
        """Rows of the host in any order: timestamp, the host's row number, lifted state (int64[n, ns]),
        group key words (int64[n, kw]; none when the query has no groups)."""
        ts, row, state = np.asarray(ts, I64), np.asarray(row, I64), np.asarray(state, I64)
        key = np.zeros((len(ts), 0), I64) if key is None else np.asarray(key, I64).reshape(len(ts), -1)
        ok = ts >= self.mark
        self.late += int(len(ok) - ok.sum())
        ts, row, key = ts[ok], row[ok], key[ok]
        state = np.column_stack([state[ok], np.ones(len(ts), I64)])
        g = self._codes(key)
        n, old = len(ts), len(self.ids)
        # every row's two breakpoints beside the old bins; sorted by (group, id), an old bin first
        gid = np.concatenate([self.gid, g, g])
        ids = np.concatenate([self.ids, ts, ts + self.range_ns])
        order = np.lexsort((np.arange(len(ids)), ids, gid))
        gs, xs = gid[order], ids[order]
        keep = np.r_[True, (gs[1:] != gs[:-1]) | (xs[1:] != xs[:-1])]
        pos = np.empty(len(ids), I64)
        pos[order] = np.cumsum(keep) - 1  # each breakpoint's bin
        is_old = order[keep] < old
        # a new bin starts with the value of the old bin it splits (its group's, below it), else identity
        last_old = np.maximum.accumulate(np.where(is_old, np.arange(len(is_old)), -1))
        gk, src = gs[keep], order[keep]
        split = (last_old >= 0) & (gk[np.maximum(last_old, 0)] == gk)
        pa = np.repeat(self.identity[None, :], len(gk), 0)
        pa[is_old] = self.pa[src[is_old]]
        new = ~is_old & split
        pa[new] = pa[last_old[new]]
        self.gid, self.ids, self.pa = gk, xs[keep], np.ascontiguousarray(pa)
        _merge_rows(pos[old : old + n], pos[old + n :], state, self.ops, self.pa)
        win = (row + 1) % self.every == 0
        self.win_ts = np.concatenate([self.win_ts, ts[win]])
        self.win_row = np.concatenate([self.win_row, row[win]])

    def close(self, mark: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every row below ``mark`` (a timestamp) has arrived: (window ts, row, group key, state) of the
        windows below it, one row per group with rows in the window, by row; the bins below it are
        dropped but each group's last (a later row's split needs its value) unless it holds no row."""
        self.mark = max(self.mark, mark)
        done = self.win_ts < self.mark
        ts, row = self.win_ts[done], self.win_row[done]
        self.win_ts, self.win_row = self.win_ts[~done], self.win_row[~done]
        ng = len(self.keys)
        gstart = np.searchsorted(self.gid, np.arange(ng), "left").astype(I64)
        gend = np.searchsorted(self.gid, np.arange(ng), "right").astype(I64)
        at = _at(gstart, gend, self.ids, ts)  # [window, group]
        w, g = np.nonzero(at >= 0)
        st = self.pa[at[w, g]]
        has = st[:, -1] > 0
        w, g, st = w[has], g[has], st[has]
        order = np.lexsort((g, row[w]))
        w, g, st = w[order], g[order], st[order]
        below = self.ids < self.mark
        last = np.r_[self.gid[1:] != self.gid[:-1], True] | np.r_[~below[1:], True]
        keep = ~below | (last & (self.pa[:, -1] > 0))
        self.gid, self.ids, self.pa = self.gid[keep], self.ids[keep], np.ascontiguousarray(self.pa[keep])
        key = self.keys[g]
        live = np.unique(self.gid)
        if self.keys.shape[1] and len(live) < len(self.keys):  # groups with no bin left are forgotten
            self.keys, self.gid = self.keys[live], np.searchsorted(live, self.gid).astype(I64)
        return ts[w], row[w], key, np.ascontiguousarray(st[:, :-1])

    def snapshot(self) -> bytes:
        """The whole state (restart: :meth:`restore` into a fresh operator of the same query)."""
        return saved.snapshot(self, _ARRAYS, ("mark", "late"))

    def restore(self, blob: bytes) -> None:
        saved.restore(self, blob, _ARRAYS)

    @classmethod
    def of(cls, spec: RowQuerySpec) -> SlideByTuple:
        """The operator of a ``kind: rows`` query with a ``{range, every}`` window."""
        if not isinstance(spec.window, TupleSlideSpec):
            raise ValueError(f"query {spec.name!r} has a row window (high_level.rows.windows)")
        return cls(spec.window.range_ns, spec.window.every, spec.ops, len(spec.words(spec.group_by)))

    @property
    def state_rows(self) -> int:
        """Bins, open windows and groups held."""
        return int(len(self.ids) + len(self.win_ts) + len(self.keys))


_ARRAYS = ("keys", "gid", "ids", "pa", "win_ts", "win_row")
