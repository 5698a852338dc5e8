"""A slide-by-tuple query (``window: {range, every}``) at the capture host: number its rows, lift, send.

Why rows and not panes: a slide-by-tuple window is forward-context aware (dissertation §5.1.5): which
windows a row belongs to depends on rows still to come, so the host cannot bucket it on arrival. What the
job's FCA bins (``high_level.rows.bytuple``) need of each row is its timestamp, its row number (every
``every``-th row defines a window), its group words and its lifted aggregate state, so that is what
leaves: wire ROWS batches on the query's topic, ``ts`` = the row's timestamp, columns = row number, the
``group_by`` words, then the state columns (``contract.wire``). The punctuation is the host's timestamp mark, as a select query's (PUNCT,
``mark_pane == mark_ns``: every row below it was sent before it; the kernel drops and counts later rows
below it), so the job closes a window once its host's mark passed its timestamp, whatever the arrival
order. Numbering is :mod:`low_level.kernel.rownum`'s compiled loop; lifting is one vectorised call per
state column: no Python per row.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from contract import aggregates as A
from contract import wire
from contract.query.rows import RowQuerySpec
from contract.query.windows import TupleSlideSpec
from low_level.kernel.rownum import RowCounter
from low_level.kernel.rowpanes import HostFifo, RowPanes

I64 = np.int64
MAX_BATCH = 16_384  # rows per Kafka message
MAX_QUEUED = 2_000_000  # rows held while Kafka is away, beyond which the oldest are shed (counted)


class TupleRows(HostFifo):
    """One slide-by-tuple query on one capture host incarnation: numbering, lifted rows and their FIFO."""

    def __init__(self, spec: RowQuerySpec, host: str, incarnation: int) -> None:
        super().__init__(spec, host, incarnation)  # FIFO: (ts, row, key, state) blocks, wire.Punctuation
        self.lifts = spec.lift_columns
        self.key_cols = spec.words(spec.group_by)
        self.counter = RowCounter(0)
        self.mark: int | None = None  # the last mark queued
        self.max_queued = MAX_QUEUED
        self.lost = 0  # rows shed while Kafka could not take them
        self.shed: tuple[int, int, int] | None = None  # (first ts, last ts, rows) shed, for the next mark

    def submit(self, rows: np.ndarray) -> None:
        """A drained block of the query's selected rows (int64[n, 1 + width], capture order)."""
        n = rows.shape[0]
        if n == 0:
            return
        number = self.counter.number(np.zeros((n, 0), I64))
        state = [A.lift(p, rows[:, c]).astype(I64) for c, p in self.lifts]
        self.fifo.append(np.column_stack([rows[:, 0], number, rows[:, self.key_cols], *state]).astype(I64))
        self.queued += n
        self.rows += n
        if self.queued > self.max_queued:
            self._shed(self.queued - self.max_queued)

    def _shed(self, excess: int) -> None:
        """Drop the oldest queued rows (never a mark) until ``excess`` are gone; their time range and count
        go with the next mark, and they count in ``seq`` as if sent (the job sees no gap, the range)."""
        keep: deque = deque()
        while self.fifo and excess > 0:
            item = self.fifo.popleft()
            if isinstance(item, np.ndarray):
                cut = min(excess, len(item))
                ts = item[:cut, 0]
                lo, hi, r = int(ts.min()), int(ts.max()), self.shed
                self.shed = (lo, hi, cut) if r is None else (min(r[0], lo), max(r[1], hi), r[2] + cut)
                excess -= cut
                self.queued -= cut
                self.lost += cut
                self.seq += cut
                if cut < len(item):
                    keep.append(item[cut:])
            else:
                keep.append(item)
        self.fifo.extendleft(reversed(keep))

    def punctuate(
        self,
        mark: int | None,
        stats: dict[str, int] | None = None,
        losses: tuple[tuple[int, int, str, int], ...] = (),
    ) -> None:
        """Queue the host's timestamp mark (None: the host has no clock yet, nothing to say) with the
        host's losses since the previous one (ns ranges, ``low_level.host.losses``)."""
        if mark is None:
            return
        self.mark = mark
        self.fifo.append(
            wire.Punctuation(
                self.spec.name,
                self.host,
                self.incarnation,
                self.partition,
                0,
                mark,
                mark,
                0,
                stats or {},
                losses=tuple(losses),
            )
        )

    def _batch(self, item: Any) -> tuple[int, bytes, Any]:
        """(rows, the Kafka value, what of ``item`` is left or None) of the FIFO's head."""
        if isinstance(item, np.ndarray):
            n = min(len(item), MAX_BATCH)
            value = wire.encode_rows(
                self.spec.name, self.host, self.incarnation, self.partition, self.seq, item[:n]
            )
            return n, value, item[n:] if n < len(item) else None
        shed, self.shed = ((self.shed,) if self.shed else ()), None  # rows shed ahead of this mark
        p = replace(item, partition=self.partition, seq=self.seq, sent_wall_ns=time.time_ns(), shed=shed)
        return 0, wire.encode_punctuation(p), None


def row_stage(spec: RowQuerySpec, host: str, incarnation: int) -> RowPanes | TupleRows:
    """The host's stage of a ``kind: rows`` query: pane partials for a row window, rows for slide-by-tuple."""
    if isinstance(spec.window, TupleSlideSpec):
        return TupleRows(spec, host, incarnation)
    return RowPanes(spec, host, incarnation)
