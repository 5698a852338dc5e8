"""A join query's layout: what the band join needs to know of a join and its two inputs (plain data, cheap
to ship to Spark's workers), and its time condition: the band ``[lo, hi]`` or the same tumbling window,
with how far each side's rows reach (which decides when a row is final and leaves the state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import aggregates as A
from contract import query as Q
from contract.query.joins import ClosedInput
from contract.wire import END_OF_STREAM as END
from high_level.aggregate.rollup import Layout


def _words(s: Q.SelectSpec, name: str) -> tuple[int, ...]:
    """Row-word indices of a field of select ``s`` (-1: the timestamp)."""
    return (-1,) if name == "timestamp" else tuple(s.word_index(name))


def rollup_layout(name: str, w: Q.WindowSpec, ops: tuple[int, ...], key_words: int) -> Layout:
    """The roll-up of a join's output (its aggregates, or its rows counted) over window ``w``."""
    return Layout(
        name,
        f"join:{name}",
        w.pane_ns,
        w.panes_per_window,
        w.origin_ns,
        w.range_ns,
        ops,
        key_words,
        w.panes_per_slide,
        w.landmark,
    )


@dataclass(frozen=True)
class JoinLayout:
    """What the join needs to know about a join query and its two inputs (plain data, cheap to ship)."""

    name: str
    left: str
    right: str
    left_topic: str
    right_topic: str
    band_ns: int
    type: str
    lkey: tuple[int, ...]
    rkey: tuple[int, ...]
    lw: int
    rw: int
    group: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (side, words) per group-by item
    group_names: tuple[str, ...] = ()
    aggs: tuple[tuple[str, str, tuple[tuple[int, str, tuple[int, ...]], ...]], ...] = ()  # (fn, alias, terms)
    rollup: Layout | None = None
    partitions: int = 1
    band_lo_ns: int = 0  # two-sided band (RANGE0/RANGE1): band_lo_ns <= r.ts - l.ts <= band_ns
    window_ns: int = 0  # > 0: equality on the tumbling window of the timestamp instead of a band (OOP Q6/Q8)
    window_origin_ns: int = 0
    window_on: str = "left"  # which timestamp of an output row files it in the aggregation's windows

    def _floor(self, t: int, shift: int) -> int:
        """The lowest timestamp of the other side of a pair whose timestamp is at least ``t``: the start of
        t's window (window join), else ``t + shift``; the end of stream stays the end."""
        if t >= END:
            return END
        if self.window_ns:
            return self.window_origin_ns + (t - self.window_origin_ns) // self.window_ns * self.window_ns
        return t + shift

    def right_floor(self, ml: int) -> int:
        """The lowest right timestamp a pair can have whose left timestamp is at least ``ml``."""
        return self._floor(ml, self.band_lo_ns)

    def left_floor(self, mr: int) -> int:
        """The lowest left timestamp a pair can have whose right timestamp is at least ``mr``."""
        return self._floor(mr, -self.band_ns)

    @property
    def reach_ns(self) -> int:
        """How far apart two matching rows' timestamps may be (what a loss's time range is widened by)."""
        return max(abs(self.band_lo_ns), abs(self.band_ns), self.window_ns)

    def window_last(self, ts: np.ndarray) -> np.ndarray:
        """The last nanosecond of the tumbling window of each timestamp (window joins)."""
        w, o = self.window_ns, self.window_origin_ns
        return o + ((ts - o) // w + 1) * w - 1

    def left_reach(self, ts: np.ndarray) -> np.ndarray:
        """The newest right timestamp a left row at ``ts`` can meet: once the right mark passes it, the row
        is final (emitted unmatched if it met none) and leaves the state."""
        return self.window_last(ts) if self.window_ns else ts + self.band_ns

    def right_reach(self, ts: np.ndarray) -> np.ndarray:
        """The newest left timestamp a right row at ``ts`` can meet: once the left mark passes it, it leaves."""
        return self.window_last(ts) if self.window_ns else ts - self.band_lo_ns

    def matches(self, lts: np.ndarray, rts: np.ndarray) -> np.ndarray:
        """The time condition of a pair: in the band, or in the same tumbling window."""
        if self.window_ns:
            o = self.window_origin_ns
            return (lts - o) // self.window_ns == (rts - o) // self.window_ns
        d = rts - lts
        return (d >= self.band_lo_ns) & (d <= self.band_ns)

    @classmethod
    def of(cls, j: Q.JoinSpec, sl: Q.SelectSpec, sr: Q.SelectSpec) -> JoinLayout:
        sel = {"left": sl, "right": sr}
        lkey = tuple(w for n in j.on.left for w in _words(sl, n))
        rkey = tuple(w for n in j.on.right for w in _words(sr, n))
        group = tuple((g.split(".")[0], _words(sel[g.split(".")[0]], g.split(".")[1])) for g in j.group_by)
        aggs = tuple(
            (
                a.fn,
                a.alias,
                tuple(
                    (sign, side, _words(sel[side], f))
                    for sign, side, f in (Q.parse_join_expr(a.expr) if a.expr else [])
                ),
            )
            for a in j.aggregates
        )
        rollup = None
        if j.window is not None:
            w = j.window
            ops = tuple(p.merge for a in j.aggregates for p in A.REGISTRY[a.fn].parts())
            rollup = rollup_layout(j.name, w, ops, max(1, sum(len(ws) for _, ws in group)))
        return cls(
            j.name,
            sl.name,
            sr.name,
            sl.topic,
            sr.topic,
            j.within_ns,
            j.type,
            lkey,
            rkey,
            sl.width,
            sr.width,
            group,
            tuple(g.split(".")[1] for g in j.group_by),
            aggs,
            rollup,
            sl.kafka.partitions,
            j.band_lo_ns,
            *window_equality(j, sl, sr),
            j.window_on,
        )

    def side_of(self, query: str) -> str | None:
        return "left" if query == self.left else "right" if query == self.right else None


def window_equality(j: Q.JoinSpec, sl: Any, sr: Any) -> tuple[int, int]:
    """(window range, origin) of a ``within: window`` join of two selects' rows, else (0, 0). Two aggregates'
    closed windows travel stamped with their window start, so they join on band [0, 0] instead."""
    if not j.same_window or j.window is None or isinstance(sl, ClosedInput) or isinstance(sr, ClosedInput):
        return 0, 0
    return j.window.range_ns, j.window.origin_ns
