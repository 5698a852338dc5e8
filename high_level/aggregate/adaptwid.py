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

Vectorised over numpy arrays (per batch and per close, no per-record Python). The caller keeps the
frontier rules: rows passed to :meth:`AdaptiveWindows.merge` are not late (a late row's pane may be below
the frontier when it still belongs to an open window: only those windows take it). In the job,
``window.strategy: eager | adaptive`` runs it through :class:`StrategyRollup`, the roll-up's rules (late
partials, corrections, end of stream, saved state) around it; ``lazy`` is the roll-up's own pane table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract import aggregates as A
from contract import query as Q
from contract import wire
from high_level import codec
from high_level.aggregate.rollup import (
    I64,
    Layout,
    QueryRollup,
    Windows,
    expand_windows,
    group_reduce,
    key_codes,
    touched_pairs,
)

STRATEGIES = Q.STRATEGIES


def supports(lay: Layout, strategy: str = "adaptive") -> str | None:
    """Why ``lay`` cannot run window ``strategy`` (None: it can); the loader's rule
    (:func:`contract.query.strategy_refusal`)."""
    return Q.strategy_refusal(strategy, lay.landmark, lay.differential, bool(lay.top_capacity), lay.groups)


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
        why = supports(lay, self.strategy)
        if why:
            raise ValueError(why)
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

    def peek(self, w: np.ndarray, wkey: np.ndarray) -> Windows:
        """The current value of the open (window, group) pairs ``(w, wkey)`` that hold data, in (window,
        group) order: buffered rows and eager aggregates merged (live provisional rows). A 64-bit hash
        selects the rows: a collision only adds rows that the exact pair filter drops."""
        lay = self.layout
        if len(w) == 0:
            return Windows.empty(lay.kw, lay.na)
        sel = np.isin(wire.key_hash(self.buf_key), wire.key_hash(wkey))
        idx, bw = expand_windows(self.buf_pane[sel], int(w.min()), int(w.max()) + 1, lay.k, lay.s)
        pairs = wire.key_hash(np.column_stack([w, wkey]))
        esel = np.isin(wire.key_hash(np.column_stack([self.ew, self.ek])), pairs)
        keys = np.column_stack(
            [np.concatenate([bw, self.ew[esel]]), np.concatenate([self.buf_key[sel][idx], self.ek[esel]])]
        )
        st = np.concatenate([self.buf_state[sel][idx], self.es[esel, : lay.na]])
        if len(keys) == 0:
            return Windows.empty(lay.kw, lay.na)
        keys, st = group_reduce(keys, st, lay.ops)
        keep = np.isin(wire.key_hash(keys), pairs)
        keys, st = keys[keep], st[keep]
        order = np.lexsort([*(keys[:, j] for j in reversed(range(1, lay.kw + 1))), keys[:, 0]])
        return Windows(keys[order, 0].copy(), np.ascontiguousarray(keys[order, 1:]), st[order])

    def open_windows(self) -> int:
        """Windows that hold data and are not emitted yet (buffered rows' windows and eager ones)."""
        u = np.unique(self.buf_pane)
        lo = int(u.min()) if self.closed is None and len(u) else (self.closed or 0)
        _, w = expand_windows(u, lo, int(u.max(initial=lo)) + self.layout.k, self.layout.k, self.layout.s)
        return len(np.union1d(w, self.ew))

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
            pair = codes[:nb][bi] * span + (bw - bw.min())
            if g * span <= _MARKS_MAX:  # a mark per (group, window): linear, no sort or hash of the pairs
                seen = np.zeros(g * span, bool)
                seen[pair] = True
                wins = seen.reshape(g, span).sum(axis=1)
            else:
                wins = np.bincount(np.unique(pair) // span, minlength=g)
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


_MARKS_MAX = 1 << 24  # (group, window) marks a close may allocate (16 MB) before it sorts instead


def _member(key: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Per row of ``key``: is it a row of ``of`` (exact)."""
    if len(of) == 0 or len(key) == 0:
        return np.zeros(len(key), bool)
    codes = key_codes(np.concatenate([of, key]))
    return np.isin(codes[len(of) :], codes[: len(of)])


class StrategyRollup(QueryRollup):
    """The job's roll-up of a query with ``window.strategy`` eager or adaptive: :class:`QueryRollup`'s rules
    (late partials and their corrections, end of stream, saved state) over :class:`AdaptiveWindows`.

    Its pane table (``pane``, ``key``, ``state``) is the lazy groups' buffer, so the partition processor
    saves and restores it as any pane table (a lazy query's saved table is a valid buffer: a query
    switched from lazy to adaptive resumes its checkpoint); the eager aggregates, the eager groups and the
    switch counters are its running state (:meth:`run_arrays`). Group-wise punctuation, landmark,
    differential and bounded-top queries are refused (:func:`supports`), so the inherited group and
    landmark paths never run."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.windows = AdaptiveWindows(self.layout, self.layout.strategy)
        self.top: int | None = None  # newest pane merged since the state was last empty (end of stream)

    def _in(self) -> AdaptiveWindows:
        aw = self.windows
        aw.buf_pane, aw.buf_key, aw.buf_state, aw.closed = self.pane, self.key, self.state, self.closed
        return aw

    def _out(self) -> None:
        aw = self.windows
        self.pane, self.key, self.state, self.closed = aw.buf_pane, aw.buf_key, aw.buf_state, aw.closed
        if len(self) == 0:
            self.top = None

    def __len__(self) -> int:
        return int(self.pane.shape[0]) + len(self.windows.ew)

    def merge(self, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Partials of open windows (late ones only for their open windows: :meth:`QueryRollup.add`)."""
        if len(pane):
            self._in().merge(pane, key, state)
            self._out()
            top = int(np.max(pane))
            self.top = top if self.top is None else max(self.top, top)

    def close_global(self, lwm: int | None, through_pane: int | None = None) -> Windows:
        """As :meth:`QueryRollup.close_global` (end of stream closes through the newest pane held or shed)."""
        lay = self.layout
        if lwm is not None and lwm >= wire.END_OF_STREAM:
            tops = [self.top] if self.top is not None else []
            tops += [through_pane] if through_pane is not None else []
            lwm = max(tops) + lay.k if tops else None
        if lwm is None or (self.closed is not None and lwm <= self.closed):
            return Windows.empty(lay.kw, lay.na)
        out = self._in().close(int(lwm))
        self._out()
        return out

    def provisional(self, pane: np.ndarray, key: np.ndarray) -> Windows:
        """As :meth:`QueryRollup.provisional`: the open windows and groups the partials touched, now."""
        w, wkey = touched_pairs(self.layout, self.closed, pane, key)
        if len(w) == 0 or len(self) == 0:
            return Windows.empty(self.layout.kw, self.layout.na)
        return self._in().peek(w, wkey)

    def panes(self) -> np.ndarray:
        return np.unique(self.pane)

    def open_windows(self) -> int:
        return self._in().open_windows()

    def run_arrays(self, name: str) -> dict[str, np.ndarray]:
        """The eager aggregates, the eager groups and [lazy->eager, eager->lazy, newest pane] for the saved
        state."""
        aw = self.windows
        top = wire.END_OF_STREAM if self.top is None else self.top
        return {
            f"{name}/eager_window": aw.ew,
            f"{name}/eager_key": aw.ek,
            f"{name}/eager_state": aw.es,
            f"{name}/eager_groups": aw.eager_keys,
            f"{name}/adapt": np.array([*aw.switches, top], I64),
        }

    def load_run(self, arrays: dict[str, np.ndarray], name: str) -> None:
        """Restore :meth:`run_arrays`; none saved (a lazy query's state): everything is buffered."""
        lay, aw = self.layout, self.windows
        ew, ek, es = (arrays.get(f"{name}/eager_{x}") for x in ("window", "key", "state"))
        groups, adapt = arrays.get(f"{name}/eager_groups"), arrays.get(f"{name}/adapt")
        if ew is None or ek is None or es is None or groups is None or adapt is None:
            aw.ew, aw.ek, aw.es = np.empty(0, I64), np.empty((0, lay.kw), I64), np.empty((0, lay.na + 1), I64)
            aw.eager_keys, aw.switches = np.empty((0, lay.kw), I64), [0, 0]
            self.top = int(self.pane.max()) if len(self.pane) else None
            return
        if ek.shape[1:] != (lay.kw,) or es.shape[1:] != (lay.na + 1,) or groups.shape[1:] != (lay.kw,):
            raise codec.CodecError(f"query {lay.name!r}: saved eager aggregates of another layout")
        aw.ew, aw.ek, aw.es = (
            np.asarray(ew, I64),
            np.ascontiguousarray(ek, I64),
            np.ascontiguousarray(es, I64),
        )
        aw.eager_keys, aw.switches = np.ascontiguousarray(groups, I64), [int(adapt[0]), int(adapt[1])]
        self.top = None if int(adapt[2]) == wire.END_OF_STREAM else int(adapt[2])
