"""A join query's layout over any inputs (selects or aggregates' closed windows), and its raw output rows.

:class:`high_level.join.band.JoinLayout` reads its inputs through the select interface (name, topic, width,
words of a field), which :class:`contract.query.joins.ClosedInput` also offers, so one band join serves
both. A join without aggregates stores its output rows themselves (:mod:`contract.query.joins`): here
they are roll-up records keyed by every output column with a count, so the same roll-up closes them by
the join's output punctuation and the same sink, store and API take them; identical rows of a window
add up in ``rows``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import query as Q
from contract.query import joins as JI
from high_level.join.band import JoinOutput, output_partials
from high_level.join.layout import JoinLayout, rollup_layout

I64 = np.int64
Partials = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class RowsLayout(JoinLayout):
    """A join whose output is its rows: ``group`` lists every output column as (side, words), side
    'matched' being the left join's flag; ``rollup`` files them by the left row's window."""


def _words(inp: Any, name: str) -> tuple[int, ...]:
    return (-1,) if name == "timestamp" else tuple(inp.word_index(name))


def layout_of(j: Q.JoinSpec, ins: dict[str, Any]) -> JoinLayout:
    """The join's layout with its inputs resolved (``ins``: :func:`contract.query.joins.inputs`)."""
    left, right = ins[j.left], ins[j.right]
    if j.aggregates:
        return JoinLayout.of(j, left, right)
    base = JoinLayout.of(j, left, right)  # keys, widths, band, topics (no group, no roll-up)
    by = {"left": left, "right": right}
    cols = JI.rows_columns(j, left, right)
    group = tuple((side, () if side == "matched" else _words(by[side], f)) for _, side, f in cols)
    rq = JI.rows_query(j, left, right)
    w = rq.window
    kw = sum(max(1, len(ws)) for _, ws in group)
    rollup = rollup_layout(j.name, w, tuple(int(op) for op in Q.merge_ops(rq)), kw)
    return RowsLayout(
        **{
            **base.__dict__,
            "group": group,
            "group_names": tuple(c for c, _, _ in cols),
            "aggs": tuple((a.fn, a.name, ()) for a in rq.aggregates),
            "rollup": rollup,
        }
    )


def rows_partials(layout: JoinLayout, out: JoinOutput) -> Partials:
    """(pane, key, state) roll-up records of one step's output rows: key = every output column's words,
    state = 1 (a count). An unmatched left row has 0 in the right columns and ``matched`` 0."""
    rl = layout.rollup
    assert rl is not None
    res = []
    for unmatched in (False, True):
        ts = out.u_ts if unmatched else out.l_ts
        n = len(ts)
        if not n:
            continue
        sides = (
            {"left": (out.u_ts, out.u_cols)}
            if unmatched
            else {"left": (out.l_ts, out.l_cols), "right": (out.r_ts, out.r_cols)}
        )
        parts = []
        for side, ws in layout.group:
            if side == "matched":
                parts.append(np.full((n, 1), 0 if unmatched else 1, I64))
            elif side not in sides:
                parts.append(np.zeros((n, len(ws)), I64))
            else:
                t, c = sides[side]
                parts.append(np.column_stack([t if w < 0 else c[:, w] for w in ws]).reshape(n, len(ws)))
        key = np.ascontiguousarray(np.concatenate(parts, axis=1), I64)
        wts = out.r_ts if layout.window_on == "right" and not unmatched else ts
        res.append(((wts - rl.origin_ns) // rl.pane_ns, key, np.ones((n, 1), I64)))
    return res


def partials_of(layout: JoinLayout) -> Callable[[JoinLayout, JoinOutput], Partials]:
    """How one step's output becomes roll-up records: raw rows, or the join's aggregates."""
    return rows_partials if isinstance(layout, RowsLayout) else output_partials
