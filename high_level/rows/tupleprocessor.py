"""A slide-by-tuple query in the job: its topic's row batches and marks -> one FCA-bin operator per host
stream (:class:`high_level.rows.bytuple.SlideByTuple`) -> rows for the store.

The capture host (``low_level.kernel.tuplerows``) sends each row's timestamp, row number and lifted state
(wire ROWS) and its timestamp mark (PUNCT), all on one Kafka partition, so a host's rows precede the
marks that cover them. A *stream* is one host incarnation: a restarted agent numbers from 0 again, so its
windows are new ones; its last mark (``wire.END_OF_STREAM``, sent at a stop or the end of a capture)
closes every window it has. Windows are per host, so the disorder between hosts does not matter; within
a host, rows below its mark are late (counted, dropped: the kernel already drops them at the host).

Completeness: a mark carries the host's losses since its previous one as ns ranges (drops over the
interval's time span, late rows, rows shed while Kafka was away; malformed frames are reported, not charged), and a sequence gap the next mark does not explain as shed
(rows sent and never received) becomes a range from the stream's newest row before it (less
``max_disorder``) to that mark. Every window of the stream whose time range ``(window_end - range, window_end]`` meets a range gets its
records in ``missing_records``; ``complete`` is ``missing_records == 0``. A range is forgotten once the
stream's mark is a ``range`` past its end (no later window can meet it).
Pure and serialisable, as :class:`high_level.rows.processor.RowProcessor`, whose Spark step runs it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from contract import aggregates as A
from contract import results as R
from contract import wire
from contract.query.rows import RowQuerySpec
from contract.rowresults import tuple_schema
from high_level import codec
from high_level.rows.bytuple import SlideByTuple
from high_level.rows.processor import RowProcessor, _columns

I64 = np.int64
ZMAGIC = b"LWTP"  # a zstd-compressed slide-by-tuple state follows


class TupleProcessor:
    """One slide-by-tuple query's state in the job: an operator per host stream, sequence checks, counters."""

    def __init__(self, spec: RowQuerySpec) -> None:
        self.spec = spec
        self.kw = len(spec.words(spec.group_by))  # a row's group words, after its number
        self.ops: dict[str, SlideByTuple] = {}  # "<host>#<incarnation>" -> its windows
        self.done: list[str] = []  # streams whose last mark came (their rows are all in)
        self.seq: dict[str, int] = {}  # "<stream>/<partition>" -> rows seen
        self.gaps = 0  # rows a sequence gap says were sent and never arrived (shed rows not included)
        self.bad = 0  # batches that did not decode (counted, skipped)
        self.late = 0  # rows of a finished stream (counted, dropped)
        self.windows = 0  # rows written
        self.incomplete = 0  # of them, windows a loss range met
        self.out: list[tuple] = []  # closed windows not yet written: (stream, ts, row, key, state, missing)
        self.losses: dict[str, list[list[int]]] = {}  # stream -> [first ns, last ns, records] not yet passed
        self.newest: dict[str, int] = {}  # stream -> newest row timestamp received (a gap's lower end)
        self.pending: dict[str, tuple[int, int]] = {}  # stream -> (lower end, records) of gaps its next mark
        # may explain (rows shed by the host count in its seq and are reported by the mark after them)

    def _op(self, stream: str) -> SlideByTuple:
        if stream not in self.ops:
            self.ops[stream] = SlideByTuple.of(self.spec)
        return self.ops[stream]

    def _seen(self, at: str, seq: int, n: int) -> int:
        """A batch of ``at`` that follows ``seq`` records and carries ``n``: the sequence gap before it."""
        gap = max(0, seq - self.seq.get(at, 0))
        self.seq[at] = max(self.seq.get(at, 0), seq + n)
        return gap

    def _lost(self, stream: str, lo: int, hi: int, n: int) -> None:
        if n > 0:
            self.losses.setdefault(stream, []).append([int(lo), int(max(lo, hi)), int(n)])

    def feed(self, values: list[bytes]) -> None:
        """One Kafka partition's batches of a micro-batch, in offset order."""
        for m in map(_decoded, values):
            if m is None:
                self.bad += 1
            elif m.query == self.spec.name and isinstance(m, wire.Rows | wire.Punctuation):
                stream = f"{m.host}#{m.incarnation}"
                rows = isinstance(m, wire.Rows)
                gap = self._seen(f"{stream}/{m.partition}", m.seq, m.n if rows else 0)
                if gap:  # rows sent (or shed: the next mark says) and not received since the newest row
                    lo = self.newest.get(stream, -(2**62)) - self.spec.heartbeat.max_disorder_ns
                    was = self.pending.get(stream, (lo, 0))
                    self.pending[stream] = (min(was[0], lo), was[1] + gap)
                if stream in self.done:
                    self.late += m.n if rows else 0
                elif rows:
                    cols, kw = np.asarray(m.cols, I64), self.kw
                    state = np.ascontiguousarray(cols[:, 1 + kw :])
                    self._op(stream).add(m.ts, cols[:, 0], state, cols[:, 1 : 1 + kw])
                    self.newest[stream] = max(self.newest.get(stream, -(2**62)), int(np.max(m.ts)))
                else:
                    for lo, hi, n in m.shed:
                        self._lost(stream, lo, hi, n)
                    for lo, hi, cause, n in m.losses:
                        if cause != "malformed":  # reported, not a loss of this query's rows
                            self._lost(stream, lo, hi, n)
                    lo, gap = self.pending.pop(stream, (0, 0))
                    gap -= sum(
                        n for _, _, n in m.shed
                    )  # what the host shed is in its seq, not lost on the way
                    if gap > 0:  # lost on the way: from the newest row before the gap to this mark
                        self.gaps += gap
                        self._lost(stream, lo, m.mark_ns, gap)
                    self._mark(stream, m.mark_ns)

    def _mark(self, stream: str, mark: int) -> None:
        """``stream`` sent every row below ``mark``: its windows below it close (END_OF_STREAM: all), each
        with the records of the loss ranges its time range meets."""
        ts, row, key, state = self._op(stream).close(mark)
        rng = self.spec.window.range_ns
        missing = np.zeros(len(ts), I64)
        for lo, hi, n in self.losses.get(stream, ()):
            missing += np.where((ts >= lo) & (ts - rng < hi), n, 0)  # (end - range, end] meets [lo, hi]
        if len(ts):
            self.out.append((stream, ts, row, key, state, missing))
        if stream in self.losses:  # ranges no later window can meet (its end is at least the mark)
            self.losses[stream] = [r for r in self.losses[stream] if r[1] + rng > mark]
        if mark == wire.END_OF_STREAM:  # nothing more comes: its state can go
            self.late += self.ops.pop(stream).late
            self.done.append(stream)
            self.losses.pop(stream, None)
            self.newest.pop(stream, None)

    process_packed = RowProcessor.process_packed  # the row queries' Spark step: feed by partition, close

    def close(self, now_ms: int) -> pa.Table:
        """The windows the hosts' marks have passed, as a table of :func:`contract.rowresults.tuple_schema`."""
        out, self.out = self.out, []
        schema = tuple_schema(self.spec)
        if not out:
            return schema.empty_table()
        stream = np.concatenate([np.full(len(o[1]), o[0], object) for o in out])
        ts, row = np.concatenate([o[1] for o in out]), np.concatenate([o[2] for o in out])
        key, state = np.vstack([o[3] for o in out]), np.vstack([o[4] for o in out])
        missing = np.concatenate([o[5] for o in out])
        host, _, inc = np.char.partition(stream.astype(str), "#").T
        n = len(ts)
        values = A.finalize(self.spec.aggs, state)
        cols = {
            "host": pa.array(host, pa.string()),
            "incarnation": pa.array(inc.astype(I64)),
            "window": pa.array(row, pa.int64()),
            "window_end": pa.array(ts, pa.int64()),
            **_columns(self.spec, self.spec.group_by, key),
            **{name: pa.array(values[name]) for a in self.spec.aggregates for name, _ in a.output_columns()},
            "closed_at": pa.array(np.full(n, now_ms * 1000, I64)).cast(R.TIMESTAMP),
            "missing_records": pa.array(missing),
            "complete": pa.array(missing == 0),
            "kind": pa.array(["final"] * n, pa.string()),
        }
        self.windows += n
        self.incomplete += int((missing > 0).sum())
        return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)

    def to_bytes(self) -> bytes:
        names = sorted(self.ops)
        blobs = [self.ops[s].snapshot() for s in names]
        head = {
            "streams": names,
            "sizes": [len(b) for b in blobs],
            "done": self.done,
            "seq": self.seq,
            "gaps": self.gaps,
            "bad": self.bad,
            "late": self.late,
            "windows": self.windows,
            "incomplete": self.incomplete,
            "losses": self.losses,
            "newest": self.newest,
            "pending": self.pending,
        }
        return codec.compress(json.dumps(head).encode() + b"\n" + b"".join(blobs), ZMAGIC)

    @classmethod
    def from_bytes(cls, buf: bytes, spec: RowQuerySpec) -> TupleProcessor:
        tp = cls(spec)
        head, _, blob = codec.decompress(buf, ZMAGIC).partition(b"\n")
        h = json.loads(head)
        tp.done, tp.seq, tp.gaps, tp.bad, tp.late, tp.windows = (
            h["done"],
            h["seq"],
            h["gaps"],
            h["bad"],
            h["late"],
            h["windows"],
        )
        tp.incomplete = h.get("incomplete", 0)
        tp.losses, tp.newest = h.get("losses", {}), h.get("newest", {})
        tp.pending = {k: tuple(v) for k, v in h.get("pending", {}).items()}
        at = 0
        for s, size in zip(h["streams"], h["sizes"], strict=True):
            tp._op(s).restore(blob[at : at + size])
            at += size
        return tp


def _decoded(value: bytes) -> Any:
    """A batch, or None when it does not decode."""
    try:
        return wire.decode(value)
    except wire.WireError:
        return None
