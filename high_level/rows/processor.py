"""A row-window query in the job: its topic's batches -> :class:`high_level.rows.windows.RowWindows` -> rows
for the store. One state group holds every Kafka partition of the query's topic (a host sends all of
its batches to one partition, so its partials always arrive before the row marks that cover them).

A *stream* of the pane operator is one capture host incarnation (a restarted agent numbers its rows
from 0 again, so its windows are new ones), or one (incarnation, ``partition_by`` value). Pure and
serialisable: the Spark step (:mod:`high_level.rows.pipeline`) restores it, feeds a micro-batch, saves it.
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
                self.gaps += max(0, m.seq - self.seq.get(at, 0))
                self.seq[at] = max(self.seq.get(at, 0), m.seq + m.n)
                part, key = m.key[:, : self.pw], m.key[:, self.pw :]
                if key.shape[1] == 0:
                    key = np.zeros((m.n, 1), I64)
                self.op.add(stream, part, m.pane, key[:, : self.kw], m.state)
            elif isinstance(m, wire.RowMarks):
                self.gaps += max(0, m.seq - self.seq.get(at, 0))
                self.seq[at] = max(self.seq.get(at, 0), m.seq)
                self.op.punctuate(stream, m.part, m.rows)

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
        return row_table(self.spec, res, now_ms)

    def to_bytes(self) -> bytes:
        head = {"seq": self.seq, "gaps": self.gaps, "bad": self.bad, "windows": self.windows}
        return codec.compress(json.dumps(head).encode() + b"\n" + self.op.snapshot(), ZMAGIC)

    @classmethod
    def from_bytes(cls, buf: bytes, spec: RowQuerySpec) -> RowProcessor:
        rp = cls(spec)
        head, _, blob = codec.decompress(buf, ZMAGIC).partition(b"\n")
        h = json.loads(head)
        rp.seq, rp.gaps, rp.bad, rp.windows = h["seq"], h["gaps"], h["bad"], h["windows"]
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


def row_table(spec: RowQuerySpec, res: RowResults, now_ms: int) -> pa.Table:
    """Closed row windows as stored rows (:func:`contract.rowresults.row_schema`)."""
    schema = row_schema(spec)
    n = len(res)
    host, _, inc = np.char.partition(res.host.astype(str), "#").T if n else (np.zeros(0, str),) * 3
    cols: dict[str, Any] = {"host": pa.array(host, pa.string()), "incarnation": pa.array(inc.astype(I64))}
    cols |= _columns(spec, spec.partition_by, res.part)
    cols |= {"window": res.window, "first_row": res.first_row, "end_row": res.end_row}
    cols |= _columns(spec, spec.group_by, res.key)
    cols |= {a.name: res.values[a.name] for a in spec.aggregates}
    cols["closed_at"] = pa.array(np.full(n, now_ms * 1000, I64)).cast(R.TIMESTAMP)
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
