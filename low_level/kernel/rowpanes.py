"""A row query (``kind: rows``) at the capture host: number its rows, sub-aggregate them per row pane, send.

The compiled per-packet pass runs the query as a select (``RowQuerySpec.selection``: its filter, and the
words of its partition, group and aggregate fields), so its rows leave the kernel in capture order. Per
drained block (never a Python loop per row): the partition lookup is one ``np.unique`` and the numbering
the compiled loop of :mod:`low_level.kernel.rownum`; each row's pane is its number // pane rows; the lifted
state columns are merged per (partition, pane, group) (``low_level.host.backlog.merge_records``). The
blocks and the row marks (the counters, the host's punctuation) wait in one FIFO per query until Kafka
takes them: partials always before the marks that cover them, one Kafka partition per host (its order
is the promise). While Kafka is away the queued blocks are merged in place, so the FIFO is bounded by
the (partition, pane, group) triples of the rows it holds, not by the rows; nothing is shed.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from contract import aggregates as A
from contract import wire
from contract.query.rows import RowQuerySpec
from low_level.host.backlog import Block, merge_records
from low_level.kernel.rownum import RowCounter

I64 = np.int64
MERGE_AT = 1 << 20  # queued partial records from which the FIFO is merged in place
MAX_BATCH = 65_536  # partial records per Kafka message


class HostFifo:
    """A ``kind: rows`` query's batches on one capture host incarnation, in the order Kafka must keep: one
    partition per host, so its records always precede the marks that cover them."""

    def __init__(self, spec: RowQuerySpec, host: str, incarnation: int) -> None:
        self.spec, self.host, self.incarnation = spec, host, incarnation
        self.partition = zlib.crc32(host.encode()) % spec.kafka.partitions
        self.fifo: deque = deque()
        self.queued = 0  # records in the FIFO
        self.seq = 0  # records sent
        self.rows = 0  # rows numbered
        self.records_sent = 0
        self.marks_sent = 0

    def _batch(self, item: Any) -> tuple[int, bytes, Any]:
        """(records, the Kafka value, what of ``item`` is left or None) of the FIFO's head."""
        raise NotImplementedError

    def pump(self, send: Any) -> int:
        """Hand queued batches to ``send(topic, partition, value) -> bool`` in FIFO order (a host's
        records and marks in one Kafka partition, in order; ``seq`` counts the records handed)."""
        handed, topic, part = 0, self.spec.topic, self.partition
        while self.fifo:
            n, value, rest = self._batch(self.fifo[0])
            if not send(topic, part, value):
                return handed
            if n:
                self.seq += n
                self.queued -= n
                self.records_sent += n
            else:
                self.marks_sent += 1
            if rest is None:
                self.fifo.popleft()
            else:
                self.fifo[0] = rest
            handed += 1
        return handed

    @property
    def empty(self) -> bool:
        return not self.fifo


class RowPanes(HostFifo):
    """One row query on one capture host incarnation: numbering, pane partials and their Kafka FIFO."""

    def __init__(self, spec: RowQuerySpec, host: str, incarnation: int) -> None:
        super().__init__(spec, host, incarnation)
        self.part_cols = spec.words(spec.partition_by)
        self.key_cols = spec.words(spec.group_by)
        self.lifts = spec.lift_columns
        self.ops = np.asarray(spec.ops, I64)
        self.pane_rows = spec.window.pane_rows
        self.counter = RowCounter(len(self.part_cols))
        # the counters at the previous row marks: where the next losses' row slots start (wire ROW_MARKS)
        self.prev_keys, self.prev_count = self.counter.keys.copy(), self.counter.count.copy()

    def submit(self, rows: np.ndarray) -> None:
        """A drained block of the query's selected rows (int64[n, 1 + width], capture order)."""
        n = rows.shape[0]
        if n == 0:
            return
        part = rows[:, self.part_cols]
        number = self.counter.number(part)
        state = np.column_stack([A.lift(p, rows[:, c]) for c, p in self.lifts]).astype(I64)
        key = np.column_stack([part, rows[:, self.key_cols]]) if self.part_cols or self.key_cols else None
        key = np.zeros((n, 1), I64) if key is None else key  # the wire's key has at least one word
        b = merge_records(number // self.pane_rows, key, state, self.ops)
        self.fifo.append(b)
        self.queued += b.n
        self.rows += n
        if self.queued > MERGE_AT:
            self._compact()

    def punctuate(
        self, every: bool = False, losses: tuple[tuple[str, int], ...] = (), slack: int = 0
    ) -> None:
        """Queue the counters numbered since the last marks (``every``: all of them, e.g. at a stop).

        ``losses`` ((cause, records), counted by the host since the previous marks) ride on these marks
        with every counter, charged to the row slots from each counter's previous count to its count plus
        ``slack`` (frames still in the ring): a dropped packet's partition value is unknown."""
        if every or losses:
            self.counter.touched[:] = True
        part, count = self.counter.punctuation()
        since = None
        if losses and len(count):
            since = np.zeros(len(count), I64)  # a value first seen since the previous marks: from row 0
            if len(self.prev_keys):
                at = _rows_of(self.prev_keys, part)
                hit = at >= 0
                since[hit] = self.prev_count[at[hit]]
        if len(count):
            m = wire.RowMarks(self.spec.name, self.host, self.incarnation, self.partition, 0, part, count)
            self.fifo.append(m if since is None else replace(m, losses=losses, since=since, slack=slack))
        self.prev_keys, self.prev_count = self.counter.keys.copy(), self.counter.count.copy()

    def _compact(self) -> None:
        """Merge the queued blocks into one and the queued marks into one (the newest count per value)."""
        blocks = [b for b in self.fifo if isinstance(b, Block)]
        marks = [m for m in self.fifo if isinstance(m, wire.RowMarks)]
        self.fifo.clear()
        if blocks:
            merged = merge_records(
                np.concatenate([b.pane for b in blocks]),
                np.concatenate([b.key for b in blocks]),
                np.concatenate([b.state for b in blocks]),
                self.ops,
            )
            self.fifo.append(merged)
            self.queued = merged.n
        if marks:
            part = np.concatenate([m.part for m in marks])
            rows = np.concatenate([m.rows for m in marks])
            uniq, inv = np.unique(part, axis=0, return_inverse=True)
            top = np.zeros(len(uniq), I64)
            np.maximum.at(top, inv.ravel(), rows)
            m = wire.RowMarks(self.spec.name, self.host, self.incarnation, self.partition, 0, uniq, top)
            lossy = [x for x in marks if x.losses]
            if lossy:  # merged marks keep their losses: from each counter's oldest slot, the causes summed
                since = top.copy()
                for x in lossy:
                    np.minimum.at(since, _rows_of(uniq, x.part), x.since)
                for x in marks:  # a counter numbered before the first lossy marks starts no later
                    np.minimum.at(since, _rows_of(uniq, x.part), x.rows)
                got: dict[str, int] = {}
                for x in lossy:
                    for c, r in x.losses:
                        got[c] = got.get(c, 0) + r
                slack = max(x.slack for x in lossy)
                m = replace(m, losses=tuple(got.items()), since=since, slack=slack)
            self.fifo.append(m)

    def _batch(self, item: Any) -> tuple[int, bytes, Any]:
        """(partial records, the Kafka value, what of ``item`` is left or None) of the FIFO's head."""
        if isinstance(item, Block):
            n = min(item.n, MAX_BATCH)
            value = wire.encode_partials(
                self.spec.name,
                self.host,
                self.incarnation,
                self.partition,
                self.seq,
                item.pane[:n],
                item.key[:n],
                item.state[:n],
            )
            rest = Block(item.pane[n:], item.key[n:], item.state[n:]) if n < item.n else None
            return n, value, rest
        m = replace(item, partition=self.partition, seq=self.seq, sent_wall_ns=time.time_ns())
        return 0, wire.encode_row_marks(m), None


def _rows_of(keys: np.ndarray, part: np.ndarray) -> np.ndarray:
    """Index of each row of ``part`` in the sorted unique rows ``keys`` (-1: not there), vectorised."""
    part = np.asarray(part, I64).reshape(len(part), keys.shape[1])
    if len(keys) == 0:
        return np.full(len(part), -1, I64)
    if keys.shape[1] == 0:  # one counter
        return np.zeros(len(part), I64)
    row = [("", I64)] * keys.shape[1]
    kv = np.ascontiguousarray(keys, I64).view(row).ravel()
    pv = np.ascontiguousarray(part).view(row).ravel()
    at = np.minimum(np.searchsorted(kv, pv), len(kv) - 1)
    return np.where(kv[at] == pv, at, -1).astype(I64)
