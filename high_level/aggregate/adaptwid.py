"""AdaptWID (dissertation §6.3): per group, eager or lazy window aggregation, chosen at run time from a
memory-cost model and switched without changing any result.

*Lazy* buffers a group's partial rows ``(pane, key, state)`` as they come and builds its windows at the
close (memory grows with the group's volume, Eq. 6.6/6.8). *Eager* folds a group's rows on arrival into
one partial aggregate per open window (WID; memory grows with the open windows, Eq. 6.5), so a close
only hands them out. Dense groups are cheaper eager, sparse ones lazy; skewed traffic has both, and a
group's density changes, hence the per-group choice at every close (Cond. 6.9, with two thresholds
against thrashing). The model is fed with what is measured, per group: ``winVol`` is the rows the group
buffers (or would: each eager aggregate counts the rows that expire with it, the paper's ``tupleCnt``),
which is what Eq. 6.7 estimates from the sources' volumes and offsets; ``wed/SLIDE`` is the open
windows the group spans. Switching (§6.3.3): lazy -> eager folds the group's buffered rows into window
aggregates; eager -> lazy buffers the new rows while the old aggregates stay until their windows close
(a transitional group's window = its aggregate merged with its buffered rows). Every merge is the
registry's (``contract/aggregates``), so the three strategies give the same windows exactly.

Vectorised over numpy arrays (per batch and per close, no per-record Python). The caller (the roll-up)
keeps the frontier rules: rows passed to :meth:`AdaptiveWindows.merge` are not late.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract import aggregates as A
from high_level.aggregate.rollup import I64, Layout, Windows, expand_windows, group_reduce, key_codes

STRATEGIES = ("lazy", "eager", "adaptive")


def supports(lay: Layout) -> str | None:
    """Why ``lay`` cannot run with a window strategy other than lazy (None: it can)."""
    if lay.landmark:
        return "landmark windows keep one running row per group already"
    if lay.differential:
        return "differential sliding windows keep running sums already"
    if lay.top_capacity:
        return "top with a capacity bounds its panes (Misra-Gries), not mergeable per window"
    return None


@dataclass(frozen=True)
class CostModel:
    """Memory costs in int64 words (Eqs. 6.5 and 6.8) and the switching thresholds (Cond. 6.9)."""

    tup: int  # one buffered row: pane + key + state
    aggr: int  # one window aggregate: window + key + state + tupleCnt
    up: float = 1.0  # lazy -> eager once lazy would cost more than ``up`` x eager
    down: float = 0.5  # eager -> lazy once lazy would cost less than ``down`` x eager (hysteresis)

    @classmethod
    def of(cls, lay: Layout, up: float = 1.0, down: float = 0.5) -> CostModel:
        return cls(1 + lay.kw + lay.na, 2 + lay.kw + lay.na, up, down)

    def eager(self, open_windows: np.ndarray) -> np.ndarray:
        """Eq. 6.5: aggr * wed / SLIDE, the open windows a group spans."""
        return self.aggr * np.asarray(open_windows, np.float64)

    def lazy(self, win_vol: np.ndarray) -> np.ndarray:
        """Eq. 6.8: tup * (vol * wed - sum_k vol_k * offset_k), the rows a group buffers."""
        return self.tup * np.asarray(win_vol, np.float64)


def lazy_rows(vol: float, wed: float, vol_k: np.ndarray, offset_k: np.ndarray) -> float:
    """Eq. 6.7: the rows lazy aggregation buffers for a group fed by n unsynchronised sources (volume per
    time unit ``vol`` in all, ``vol_k`` per source, ``offset_k`` behind the earliest source)."""
    return float(vol * wed - np.sum(np.asarray(vol_k) * np.asarray(offset_k)))


@dataclass
class AdaptiveWindows:
    """One query's window state on one partition under a strategy: a buffer of lazy rows, a table of eager
    window aggregates (one row per (window, key), ``tupleCnt`` last), and the set of eager groups."""

    layout: Layout
    strategy: str = "adaptive"
    model: CostModel | None = None
    closed: int | None = None
    buf_pane: np.ndarray = field(default_factory=lambda: np.empty(0, I64))
    buf_key: np.ndarray | None = None
    buf_state: np.ndarray | None = None
    ew: np.ndarray = field(default_factory=lambda: np.empty(0, I64))
    ek: np.ndarray | None = None
    es: np.ndarray | None = None
    eager_keys: np.ndarray | None = None  # int64[g, kw]: the groups evaluated eagerly
    switches: list[int] = field(default_factory=lambda: [0, 0])  # lazy->eager, eager->lazy so far

    def __post_init__(self) -> None:
        lay = self.layout
        if self.strategy not in STRATEGIES:
            raise ValueError(f"window strategy {self.strategy!r}: one of {', '.join(STRATEGIES)}")
        why = supports(lay)
        if self.strategy != "lazy" and why:
            raise ValueError(f"window strategy {self.strategy}: {why}")
        self.model = self.model or CostModel.of(lay)
        self.buf_key = np.empty((0, lay.kw), I64) if self.buf_key is None else self.buf_key
        self.buf_state = np.empty((0, lay.na), I64) if self.buf_state is None else self.buf_state
        self.ek = np.empty((0, lay.kw), I64) if self.ek is None else self.ek
        self.es = np.empty((0, lay.na + 1), I64) if self.es is None else self.es
        self.eager_keys = np.empty((0, lay.kw), I64) if self.eager_keys is None else self.eager_keys

    # memory --------------------------------------------------------------------------------------
    def words(self) -> int:
        """State held, in int64 words (the measure of Fig. 6-19's memory)."""
        m = self.model
        return len(self.buf_pane) * m.tup + len(self.ew) * m.aggr + self.eager_keys.size

    def _is_eager(self, key: np.ndarray) -> np.ndarray:
        if self.strategy == "eager":
            return np.ones(len(key), bool)
        if self.strategy == "lazy":
            return np.zeros(len(key), bool)
        return _member(key, self.eager_keys)

    # input ---------------------------------------------------------------------------------------
    def merge(self, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Partial rows of open windows: eager groups fold them now, lazy groups buffer them."""
        pane = np.asarray(pane, I64)
        if len(pane) == 0:
            return
        key = np.asarray(key, I64).reshape(len(pane), self.layout.kw)
        state = np.asarray(state, I64).reshape(len(pane), self.layout.na)
        eager = self._is_eager(key)
        lz = ~eager
        if lz.any():
            self.buf_pane = np.concatenate([self.buf_pane, pane[lz]])
            self.buf_key = np.concatenate([self.buf_key, key[lz]])
            self.buf_state = np.concatenate([self.buf_state, state[lz]])
        if eager.any():
            self._fold(pane[eager], key[eager], state[eager])

    def _fold(self, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Rows into the eager table: every open window they belong to, tupleCnt on each row's last."""
        lay = self.layout
        lo = int(pane.min()) if self.closed is None else self.closed
        idx, w = expand_windows(pane, lo, int(pane.max()) + lay.k, lay.k, lay.s)
        if len(idx) == 0:
            return
        last = np.zeros(len(idx), bool)  # a row's last window: where the next pair is another row
        last[-1] = True
        last[:-1] = idx[1:] != idx[:-1]
        st = np.column_stack([state[idx], last.astype(I64)])
        keys, out = group_reduce(
            np.column_stack([np.concatenate([self.ew, w]), np.concatenate([self.ek, key[idx]])]),
            np.concatenate([self.es, st]),
            (*self.layout.ops, A.MERGE_SUM),
        )
        self.ew, self.ek, self.es = keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), out

    # close ---------------------------------------------------------------------------------------
    def close(self, lwm: int) -> Windows:
        """Emit every window ``w < lwm`` not emitted before (eager aggregates merged with buffered rows),
        purge what no open window needs, then let each group switch (adaptive)."""
        lay = self.layout
        if self.closed is not None and lwm <= self.closed:
            return Windows.empty(lay.kw, lay.na)
        lows = [int(self.buf_pane.min())] if len(self.buf_pane) else []
        lows += [int(self.ew.min())] if len(self.ew) else []
        lo = self.closed if self.closed is not None else (min(lows) if lows else lwm)
        idx, w = expand_windows(self.buf_pane, lo, lwm, lay.k, lay.s)
        sel = (self.ew >= lo) & (self.ew < lwm)
        keys = np.column_stack(
            [np.concatenate([w, self.ew[sel]]), np.concatenate([self.buf_key[idx], self.ek[sel]])]
        )
        st = np.concatenate([self.buf_state[idx], self.es[sel, : lay.na]])
        if len(keys):
            keys, st = group_reduce(keys, st, lay.ops)
            out = Windows(keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st)
        else:
            out = Windows.empty(lay.kw, lay.na)
        plan = self._plan(lo) if self.strategy == "adaptive" else None
        self.closed = int(lwm)
        keep = self.buf_pane >= lay.first_needed_pane(self.closed)
        self.buf_pane, self.buf_key, self.buf_state = (
            self.buf_pane[keep],
            self.buf_key[keep],
            self.buf_state[keep],
        )
        keep = self.ew >= self.closed
        self.ew, self.ek, self.es = self.ew[keep], self.ek[keep], self.es[keep]
        if plan is not None:  # switch after the purge: lazy -> eager folds the rows still needed
            eager_keys, up_keys = plan
            mv = _member(self.buf_key, up_keys)
            if mv.any():
                p, k, s = self.buf_pane[mv], self.buf_key[mv], self.buf_state[mv]
                self.buf_pane, self.buf_key, self.buf_state = (
                    self.buf_pane[~mv],
                    self.buf_key[~mv],
                    self.buf_state[~mv],
                )
                self._fold(p, k, s)
            self.eager_keys = eager_keys
        return out

    def _plan(self, lo: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Cond. 6.9 per group, measured at the close before the purge (the state at its fullest): winVol
        = the rows the group buffers, or that expire with its eager aggregates (``tupleCnt``), against
        its open windows (``wed/SLIDE``). Returns the eager groups after the close and the lazy groups
        going eager (over ``up``); eager groups under ``down`` go lazy (hysteresis against thrashing)."""
        lay, m = self.layout, self.model
        nb, ne = len(self.buf_pane), len(self.ew)
        allk = np.concatenate([self.buf_key, self.ek, self.eager_keys])
        if len(allk) == 0:
            return None
        codes = key_codes(allk)
        g = int(codes.max()) + 1
        vol = np.bincount(codes[:nb], minlength=g) + np.bincount(
            codes[nb : nb + ne], weights=self.es[:, -1], minlength=g
        )
        # windows a group spans: its eager aggregates plus the windows its buffered rows reach
        bi, bw = expand_windows(self.buf_pane, lo, int(self.buf_pane.max(initial=0)) + lay.k, lay.k, lay.s)
        if len(bi):
            span = int(bw.max() - bw.min()) + 1
            pair = np.unique(codes[:nb][bi] * span + (bw - bw.min()))
            wins = np.bincount(pair // span, minlength=g)
        else:
            wins = np.zeros(g, I64)
        wins = wins + np.bincount(codes[nb : nb + ne], minlength=g)
        lazy_c, eager_c = m.lazy(vol), m.eager(np.maximum(wins, 1))
        is_eager = np.zeros(g, bool)
        is_eager[codes[nb + ne :]] = True
        live = np.zeros(g, bool)
        live[codes[: nb + ne]] = True
        up = ~is_eager & live & (lazy_c > m.up * eager_c)
        down = is_eager & (~live | (lazy_c < m.down * eager_c))
        self.switches[0] += int(up.sum())
        self.switches[1] += int(down.sum())
        first = np.zeros(g, I64)
        first[codes[::-1]] = np.arange(len(codes))[::-1]  # a row of each group in allk
        new = (is_eager & ~down) | up
        return (
            np.ascontiguousarray(allk[first[np.flatnonzero(new)]]),
            np.ascontiguousarray(allk[first[np.flatnonzero(up)]]),
        )


def _member(key: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Per row of ``key``: is it a row of ``of`` (exact)."""
    if len(of) == 0 or len(key) == 0:
        return np.zeros(len(key), bool)
    codes = key_codes(np.concatenate([of, key]))
    return np.isin(codes[len(of) :], codes[: len(of)])
