"""A row-window query in the job: its topic's batches -> :class:`high_level.rows.windows.RowWindows` -> rows
for the store. One state group holds every Kafka partition of the query's topic (a host sends all of
its batches to one partition, so its partials always arrive before the row marks that cover them).

A *stream* of the pane operator is one capture host incarnation (a restarted agent numbers its rows
from 0 again, so its windows are new ones), or one (incarnation, ``partition_by`` value). Pure and
serialisable: the Spark step (:mod:`high_level.rows.pipeline`) restores it, feeds a micro-batch, saves it.

Completeness (:func:`contract.rowresults.row_schema`): a host's row marks may carry its losses charged to
row slots, and a sequence gap (partials sent, never received) is charged to the slots between the marks
before and after it. Each becomes a *loss range* (stream, partition value, slots [lo, hi], records); a
range always arrives before any window holding its slots closes (the marks that carry it close them), and
a window's ``missing_records`` is the sum of the ranges holding one of its slots. A range is dropped once
every window that could hold its slots has closed.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from contract import fields as F
from contract import results as R
from contract import wire
from contract.query.rows import RowQuerySpec
from contract.rowresults import row_schema
from high_level import codec
from high_level.aggregate.merge import key_codes
from high_level.results.store import ip_strings
from high_level.rows.windows import RowResults, RowWindows

I64 = np.int64
ZMAGIC = b"LWRW"  # a zstd-compressed row-window state follows
OUTPUT_DDL = "query string, ipc binary"  # the Spark step's output: a query's closed windows, Arrow IPC


class RowProcessor:
    """One row query's state in the job: the pane operator, sequence checks and counters."""

    def __init__(self, spec: RowQuerySpec) -> None:
        self.spec = spec
        self.pw = len(spec.words(spec.partition_by))
        self.kw = max(1, len(spec.words(spec.group_by)))  # the operator's key: at least one word
        self.op = RowWindows(spec, self.pw, self.kw)
        self.seq: dict[str, int] = {}  # "<host>#<incarnation>/<partition>" -> partial records seen
        self.gaps = 0  # partial records a sequence gap says were sent and never arrived
        self.bad = 0  # batches that did not decode (counted, skipped)
        self.windows = 0  # rows written
        self.lost: dict[
            str, int
        ] = {}  # records the hosts reported lost, by wire cause (malformed: not charged)
        self.pending_gap: dict[str, int] = {}  # stream -> gap records not yet charged (until its next marks)
        self.ranges = LossRanges(self.pw)
        self.incomplete = 0  # windows written with missing_records > 0

    def feed(self, values: list[bytes]) -> None:
        """One Kafka partition's batches of a micro-batch, in offset order."""
        for v in values:
            try:
                m = wire.decode(v)
            except wire.WireError:
                self.bad += 1
                continue
            if m.query != self.spec.name:
                continue
            stream = f"{m.host}#{m.incarnation}"
            at = f"{stream}/{m.partition}"
            if isinstance(m, wire.Partials):
                self._gap(stream, max(0, m.seq - self.seq.get(at, 0)))
                self.seq[at] = max(self.seq.get(at, 0), m.seq + m.n)
                part, key = m.key[:, : self.pw], m.key[:, self.pw :]
                if key.shape[1] == 0:
                    key = np.zeros((m.n, 1), I64)
                self.op.add(stream, part, m.pane, key[:, : self.kw], m.state)
            elif isinstance(m, wire.RowMarks):
                self._gap(stream, max(0, m.seq - self.seq.get(at, 0)))
                self.seq[at] = max(self.seq.get(at, 0), m.seq)
                self._charge(stream, m)
                self.op.punctuate(stream, m.part, m.rows)

    def _gap(self, stream: str, n: int) -> None:
        """Partials a host sent that never arrived: their rows lie below its next marks (charged there)."""
        if n:
            self.gaps += n
            self.pending_gap[stream] = self.pending_gap.get(stream, 0) + n

    def _charge(self, stream: str, m: wire.RowMarks) -> None:
        """The losses these marks carry and the stream's pending gap, as loss ranges of their counters."""
        for cause, n in m.losses:
            self.lost[cause] = self.lost.get(cause, 0) + n
        records = sum(n for c, n in m.losses if c != "malformed") + self.pending_gap.pop(stream, 0)
        if not records:
            return
        old = self.op.counts(stream, m.part)  # the slots below the previous marks are closed already
        lo = old if m.since is None else np.minimum(old, m.since)
        self.ranges.add(stream, m.part, lo, m.rows + m.slack, records)

    def process_packed(self, values: dict[int, list[bytes]], now_ms: int) -> pd.DataFrame:
        """A micro-batch by Kafka partition -> one output row (:data:`OUTPUT_DDL`) of the closed windows."""
        for p in sorted(values):
            self.feed(values[p])
        table = self.close(now_ms)
        return pd.DataFrame({"query": [self.spec.name], "ipc": [ipc_bytes(table) if len(table) else b""]})

    def close(self, now_ms: int) -> pa.Table:
        """The windows every host's row marks have passed, as a table of :func:`contract.rowresults.row_schema`."""
        res = self.op.close()
        self.windows += len(res)
        missing = self.ranges.missing(res)
        self.incomplete += int((missing > 0).sum())
        self.ranges.purge(self.op, self.spec.window.rows + self.spec.window.pane_rows)
        return row_table(self.spec, res, now_ms, missing)

    def to_bytes(self) -> bytes:
        head = {
            "seq": self.seq,
            "gaps": self.gaps,
            "bad": self.bad,
            "windows": self.windows,
            "lost": self.lost,
            "pending_gap": self.pending_gap,
            "incomplete": self.incomplete,
            "ranges": self.ranges.to_json(),
        }
        return codec.compress(json.dumps(head).encode() + b"\n" + self.op.snapshot(), ZMAGIC)

    @classmethod
    def from_bytes(cls, buf: bytes, spec: RowQuerySpec) -> RowProcessor:
        rp = cls(spec)
        head, _, blob = codec.decompress(buf, ZMAGIC).partition(b"\n")
        h = json.loads(head)
        rp.seq, rp.gaps, rp.bad, rp.windows = h["seq"], h["gaps"], h["bad"], h["windows"]
        rp.lost, rp.pending_gap, rp.incomplete = h["lost"], h["pending_gap"], h["incomplete"]
        rp.ranges = LossRanges.from_json(rp.pw, h["ranges"])
        rp.op.restore(blob)
        return rp


def _columns(spec: RowQuerySpec, names: list[str], words: np.ndarray) -> dict[str, pa.Array]:
    """Field values from their words (addresses as text, as the aggregate queries store them)."""
    out, i = {}, 0
    for n in names:
        if F.CATALOG[n].kind == "ip":
            out[n] = ip_strings(words[:, i], words[:, i + 1])
            i += 2
        else:
            out[n] = pa.array(words[:, i], pa.int64())
            i += 1
    return out


class LossRanges:
    """Loss ranges of a row query: (stream, partition value) -> row slots [lo, hi] that lost ``records``."""

    def __init__(self, pw: int) -> None:
        self.pw = pw
        self.stream = np.zeros(0, object)  # "<host>#<incarnation>"
        self.part = np.zeros((0, pw), I64)
        self.lo = np.zeros(0, I64)
        self.hi = np.zeros(0, I64)
        self.records = np.zeros(0, I64)

    def __len__(self) -> int:
        return int(self.lo.shape[0])

    def add(self, stream: str, part: np.ndarray, lo: np.ndarray, hi: np.ndarray, records: int) -> None:
        n = len(lo)
        self.stream = np.concatenate([self.stream, np.full(n, stream, object)])
        self.part = np.vstack([self.part, np.asarray(part, I64).reshape(n, self.pw)])
        self.lo = np.concatenate([self.lo, np.asarray(lo, I64)])
        self.hi = np.concatenate([self.hi, np.asarray(hi, I64)])
        self.records = np.concatenate([self.records, np.full(n, records, I64)])

    def missing(self, res: RowResults) -> np.ndarray:
        """Per closed window, the records of the ranges holding one of its slots [first_row, end_row)."""
        out = np.zeros(len(res), I64)
        if not len(self) or not len(res):
            return out
        names = np.concatenate([res.host.astype(str), self.stream.astype(str)])
        _, sid = np.unique(names, return_inverse=True)
        code = key_codes(np.column_stack([sid.ravel().astype(I64), np.vstack([res.part, self.part])]))
        wc, rc = code[: len(res)], code[len(res) :]
        order = np.argsort(rc, kind="stable")
        a = np.searchsorted(rc[order], wc, "left")
        cnt = np.searchsorted(rc[order], wc, "right") - a
        win = np.repeat(np.arange(len(res)), cnt)  # every (window, range of its stream) pair
        rng = order[np.repeat(a - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))]
        hit = (res.first_row[win] <= self.hi[rng]) & (res.end_row[win] > self.lo[rng])
        np.add.at(out, win[hit], self.records[rng[hit]])
        return out

    def purge(self, op: RowWindows, reach: int) -> None:
        """Drop the ranges every window of whose slots has closed (its stream's mark is ``reach`` past)."""
        if not len(self):
            return
        keep = np.ones(len(self), bool)
        for s in np.unique(self.stream.astype(str)):
            at = np.flatnonzero(self.stream == s)
            keep[at] = op.counts(str(s), self.part[at]) < self.hi[at] + reach
        self.stream, self.part, self.lo = self.stream[keep], self.part[keep], self.lo[keep]
        self.hi, self.records = self.hi[keep], self.records[keep]

    def to_json(self) -> dict[str, list]:
        return {
            "stream": self.stream.astype(str).tolist(),
            "part": self.part.tolist(),
            "lo": self.lo.tolist(),
            "hi": self.hi.tolist(),
            "records": self.records.tolist(),
        }

    @classmethod
    def from_json(cls, pw: int, d: dict[str, list]) -> LossRanges:
        r = cls(pw)
        r.stream = np.array(d["stream"], object)
        r.part = np.array(d["part"], I64).reshape(len(d["lo"]), pw)
        r.lo, r.hi, r.records = (np.array(d[k], I64) for k in ("lo", "hi", "records"))
        return r


def row_table(
    spec: RowQuerySpec, res: RowResults, now_ms: int, missing: np.ndarray | None = None
) -> pa.Table:
    """Closed row windows as stored rows (:func:`contract.rowresults.row_schema`)."""
    schema = row_schema(spec)
    n = len(res)
    missing = np.zeros(n, I64) if missing is None else missing
    host, _, inc = np.char.partition(res.host.astype(str), "#").T if n else (np.zeros(0, str),) * 3
    cols: dict[str, Any] = {"host": pa.array(host, pa.string()), "incarnation": pa.array(inc.astype(I64))}
    cols |= _columns(spec, spec.partition_by, res.part)
    cols |= {"window": res.window, "first_row": res.first_row, "end_row": res.end_row}
    cols |= _columns(spec, spec.group_by, res.key)
    cols |= {a.name: res.values[a.name] for a in spec.aggregates}
    cols["closed_at"] = pa.array(np.full(n, now_ms * 1000, I64)).cast(R.TIMESTAMP)
    cols["missing_records"] = pa.array(missing, pa.int64())
    cols["complete"] = pa.array(missing == 0, pa.bool_())
    cols["kind"] = pa.array(["final"] * n, pa.string())
    arrays = [c if isinstance(c := cols[f.name], pa.Array) else pa.array(c) for f in schema]
    return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema, strict=True)], schema=schema)


def ipc_bytes(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream (the Spark step's output cell)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def from_ipc(buf: bytes) -> pa.Table:
    return pa.ipc.open_stream(buf).read_all()
