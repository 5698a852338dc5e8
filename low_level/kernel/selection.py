"""Select queries at the capture host: the kernel's row buffers, their punctuation and their Kafka outbox.

The generated per-packet pass (``low_level.kernel.codegen``) appends the timestamp and projected words of
every packet a select query's filter passes to that query's region of ``sout`` (one chunk of rows,
and a kernel call never takes more than a chunk, so it cannot overflow). The agent drains the
regions after every call: one slice copy per query, then the rows travel as int64 blocks, are split
by partition with one vectorised hash (:func:`contract.wire.partition_of` over the ``partition_by``
words) and leave as column-major, LZ4-compressed ROWS batches: no Python per row anywhere.

Punctuation: rows leave as soon as they are drained, so a host's mark is its clock (the largest
timestamp it parsed, or wall clock - skew when idle on a live source): every row below it was
sent before the punctuation. A packet that arrives after with a smaller timestamp is late: the kernel
counts it and drops it (the mark promised it away). Rows cannot be merged like partials, so the
outbox is bounded by dropping its oldest blocks while Kafka is away (counted as lost).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from contract import query as Q
from contract import wire

# sst columns (per select query)
SS_N, SS_MARK, SS_LATE, SS_MAXTS, SS_MATCHED, SS_BASE, SS_LOST, SS_LATE_MIN = range(8)
NSS = 8
MAX_BATCH_ROWS = 16384


class SelectBuffers:
    """The kernel's per-select row regions (``sout``) and counters (``sst``), allocated once."""

    def __init__(self, selects: list[Q.SelectSpec], chunk: int) -> None:
        self.selects = list(selects)
        self.widths = [1 + s.width for s in self.selects]
        self.sst = np.zeros((max(1, len(self.selects)), NSS), dtype=np.int64)
        base = 0
        for k, w in enumerate(self.widths):
            self.sst[k, SS_BASE] = base
            base += chunk * w
        self.sst[:, SS_MARK] = np.iinfo(np.int64).min
        self.sst[:, SS_MAXTS] = np.iinfo(np.int64).min
        self.sst[:, SS_LATE_MIN] = np.iinfo(np.int64).max  # oldest timestamp of a late row since last taken
        self.sout = np.zeros(max(base, 1), dtype=np.int64)

    def drain(self, k: int) -> np.ndarray:
        """Copy out select k's rows, int64[n, 1 + width] (timestamp first), and reset its region."""
        n, w, base = int(self.sst[k, SS_N]), self.widths[k], int(self.sst[k, SS_BASE])
        rows = self.sout[base : base + n * w].reshape(n, w).copy()
        self.sst[k, SS_N] = 0
        return rows

    def advance_mark(
        self, k: int, now_ns: int, idle: bool, live_clock: bool, end_of_stream: bool = False
    ) -> int | None:
        """Raise select k's mark to its clock (call after draining); later packets below it are late."""
        if end_of_stream:
            mark = wire.END_OF_STREAM
        else:
            maxts = int(self.sst[k, SS_MAXTS])
            clock = None if maxts == np.iinfo(np.int64).min else maxts
            if clock is not None and not idle:  # a busy host's rows may come up to max_disorder out of order
                clock -= self.selects[k].heartbeat.max_disorder_ns
            if live_clock and idle:
                wall = now_ns - self.selects[k].heartbeat.skew_ns
                clock = wall if clock is None else max(clock, wall)
            if clock is None:
                return None
            mark = clock
        mark = max(mark, int(self.sst[k, SS_MARK]))
        self.sst[k, SS_MARK] = mark
        return mark


@dataclass
class SelectOutbox:
    """Per (select, partition) FIFO of row blocks and punctuations, sent through the agent's producer."""

    selects: list[Q.SelectSpec]
    host: str
    incarnation: int
    max_rows: int = 4_000_000
    fifos: dict[tuple[str, int], deque] = field(default_factory=dict)
    seq: dict[tuple[str, int], int] = field(default_factory=dict)
    rows: int = 0  # rows waiting
    lost: int = 0  # rows shed while Kafka could not take them
    rows_sent: int = 0
    batches_sent: int = 0
    punctuations_sent: int = 0

    # per (select, partition): (first ts, last ts, rows) shed since its last punctuation went out; the
    # next one carries them (wire loss cause "shed") and the shed rows count in seq as if sent
    shed: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    # newest timestamp sent or shed per (select, partition): each punctuation states it (wire sent_upto)
    sent_upto: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.selects}
        for s in self.selects:
            for p in range(s.kafka.partitions):
                self.fifos[(s.name, p)] = deque()

    def submit(self, name: str, rows: np.ndarray) -> None:
        """Queue drained rows of one select, split by the partition of their ``partition_by`` words."""
        if rows.shape[0] == 0:
            return
        s = self.by_name[name]
        nparts = s.kafka.partitions
        if nparts == 1 or not s.partition_by:
            self.fifos[(name, 0)].append(rows)
        else:
            words = rows[:, [1 + i for i in s.partition_words]]
            part = wire.partition_of(words, nparts)
            order = np.argsort(part, kind="stable")
            bounds = np.searchsorted(part[order], np.arange(nparts + 1))
            for p in range(nparts):
                if bounds[p + 1] > bounds[p]:
                    self.fifos[(name, p)].append(rows[order[bounds[p] : bounds[p + 1]]])
        self.rows += rows.shape[0]
        if self.rows > self.max_rows:
            self._shed(self.rows - self.max_rows)

    def _shed(self, excess: int) -> None:
        """Drop the oldest rows (never a punctuation) until ``excess`` rows are gone; their time range
        and count go with the partition's next punctuation, and into its seq (a lost punctuation then
        still leaves a visible gap): the join flags the windows they touch."""
        for key, fifo in self.fifos.items():
            keep: deque = deque()
            while fifo and excess > 0:
                item = fifo.popleft()
                if isinstance(item, np.ndarray):
                    cut = min(excess, item.shape[0])
                    excess -= cut
                    self.rows -= cut
                    self.lost += cut
                    ts = item[:cut, 0]
                    r = self.shed.get(key)  # one range per partition: bounded however long the outage
                    lo, hi = int(ts.min()), int(ts.max())
                    self.shed[key] = (
                        (lo, hi, cut) if r is None else (min(r[0], lo), max(r[1], hi), r[2] + cut)
                    )
                    self.seq[key] = self.seq.get(key, 0) + cut
                    if cut < item.shape[0]:
                        keep.append(item[cut:])
                else:
                    keep.append(item)
            fifo.extendleft(reversed(keep))
            if excess <= 0:
                return

    def punctuate(
        self,
        name: str,
        mark_ns: int,
        stats: dict[str, int],
        losses: tuple[tuple[int, int, str, int], ...] = (),
    ) -> None:
        """Queue a punctuation on every partition of the select's topic, after everything queued so far."""
        s = self.by_name[name]
        now = time.time_ns()
        for p in range(s.kafka.partitions):
            self.fifos[(name, p)].append(
                wire.Punctuation(
                    name, self.host, self.incarnation, p, 0, mark_ns, mark_ns, now, stats, losses=losses
                )
            )

    def pump(self, send: Any) -> int:
        """Hand queued batches to ``send(topic, partition, value) -> bool`` in FIFO order per partition."""
        handed = 0
        for (name, part), fifo in self.fifos.items():
            topic = self.by_name[name].topic
            while fifo:
                item = fifo[0]
                seq = self.seq.get((name, part), 0)
                if isinstance(item, np.ndarray):
                    if len(fifo) > 1 and isinstance(fifo[1], np.ndarray) and item.shape[0] < MAX_BATCH_ROWS:
                        _coalesce(fifo)
                        item = fifo[0]
                    n = min(item.shape[0], MAX_BATCH_ROWS)
                    value = wire.encode_rows(name, self.host, self.incarnation, part, seq, item[:n])
                    if not send(topic, part, value):
                        return handed
                    self.seq[(name, part)] = seq + n
                    self._upto((name, part), int(item[:n, 0].max()))
                    self.rows -= n
                    self.rows_sent += n
                    self.batches_sent += 1
                    if n == item.shape[0]:
                        fifo.popleft()
                    else:
                        fifo[0] = item[n:]
                else:
                    shed = (self.shed[(name, part)],) if (name, part) in self.shed else ()
                    for r in shed:
                        self._upto((name, part), r[1])
                    p = replace(item, seq=seq, shed=shed, sent_upto=self.sent_upto.get((name, part)))
                    if not send(topic, part, wire.encode_punctuation(p)):
                        return handed
                    self.shed.pop((name, part), None)
                    self.punctuations_sent += 1
                    fifo.popleft()
                handed += 1
        return handed

    def _upto(self, key: tuple[str, int], ts: int) -> None:
        self.sent_upto[key] = max(self.sent_upto.get(key, ts), ts)

    @property
    def empty(self) -> bool:
        return not any(self.fifos.values())


def _coalesce(fifo: deque) -> None:
    """Merge the leading run of row blocks (up to MAX_BATCH_ROWS) into one, keeping FIFO order."""
    run = [fifo.popleft()]
    total = run[0].shape[0]
    while fifo and isinstance(fifo[0], np.ndarray) and total + fifo[0].shape[0] <= MAX_BATCH_ROWS:
        b = fifo.popleft()
        run.append(b)
        total += b.shape[0]
    fifo.appendleft(np.concatenate(run))
