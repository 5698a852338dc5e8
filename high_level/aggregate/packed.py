"""The packed batch format: what the stateful steps (aggregates and joins) hand the JVM, and its way back.

The generic output rows (:data:`GENERIC_SCHEMA`) are what the store writes; the steps emit them *packed*
(:data:`PACKED_COLUMNS`, runs of windows as LZ4 Arrow IPC in one binary column) and the driver unpacks
them (:func:`unpack_windows` for the sink's fast path, :func:`unpack_rows` for generic rows). Its own
module because the processors, the join step, the sink, the store and the live and feed publishers all
read it, and none of them is the format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import results as R
from high_level.aggregate.rollup import I64, Layout, Windows

# The generic output schema of the stateful step (one schema for all queries).
# Completeness of each window row (see contract/results.py): hosts_expected (hosts the partition knows),
# hosts_in_mark (known hosts whose mark passed the window's end), late_partials, missing_records.
OUTPUT_COLUMNS = (
    "query",
    "partition",
    "window",
    "window_start_ns",
    "window_end_ns",
    "key",
    "state",
    "kind",
    "closed_at_ms",
    "hosts",
    "hosts_expected",
    "hosts_in_mark",
    "late_partials",
    "missing_records",
    "status",
)
GENERIC_SCHEMA = pa.schema(
    [
        ("query", pa.string()),
        ("partition", pa.int32()),
        ("window", pa.int64()),
        ("window_start_ns", pa.int64()),
        ("window_end_ns", pa.int64()),
        ("key", pa.list_(pa.int64())),
        ("state", pa.list_(pa.int64())),
        ("kind", pa.string()),
        ("closed_at_ms", pa.int64()),
        ("hosts", pa.int32()),
        ("hosts_expected", pa.int32()),
        ("hosts_in_mark", pa.int32()),
        ("late_partials", pa.int64()),
        ("missing_records", pa.int64()),
        ("status", pa.string()),
    ]
)
COMPLETENESS = ("hosts_in_mark", "late_partials", "missing_records")  # per-row columns of Part.comp
INCOMPLETE_KIND = (
    "incomplete"  # output rows flagging short windows (contract.results.INCOMPLETE_SCHEMA), as JSON
)


# What the stateful step hands to the JVM: the generic rows *packed*. Each 'final'/'correction' row of
# the packed form carries a run of up to PACK_BYTES of windows as int64 columns (window, key words,
# state columns) in ``data``; each 'status' row carries one status (``rows`` 0, ``data`` empty).
# Why: Spark moves every output row of applyInPandasWithState through pandas -> Arrow -> UnsafeRow ->
# Arrow (toArrow) with per-row work on both sides (array<bigint> columns are even converted with
# ``list(value)`` per row in Python, and the serializer pads its state column per output row); a few
# large binary values cost a memcpy. :func:`unpack_rows` turns the packed rows back into generic rows
# on the driver without per-row work. No pickle: ``data`` is an Arrow IPC stream of plain numbers.
PACKED_COLUMNS = (
    "query",
    "partition",
    "kind",
    "closed_at_ms",
    "hosts",
    "hosts_expected",
    "status",
    "rows",
    "kw",
    "na",
    "data",
)
OUTPUT_DDL = (
    "query string, partition int, kind string, closed_at_ms long, hosts int, hosts_expected int, "
    "status string, rows int, kw int, na int, data binary"
)
PACKED_SCHEMA = pa.schema(  # OUTPUT_DDL in Arrow: the generic columns it shares, then the run's own
    [GENERIC_SCHEMA.field(c) for c in PACKED_COLUMNS[:7]]
    + [pa.field(c, pa.int32()) for c in PACKED_COLUMNS[7:10]]
    + [pa.field("data", pa.binary())]
)
PACK_BYTES = 16 << 20  # at most this many bytes of int64 columns per packed row (before compression)
# The columns travel as one LZ4-compressed Arrow IPC record batch (w, k0.., s0.., then m, l, x: the
# row's hosts_in_mark, late_partials, missing_records): every byte moved
# Python -> JVM -> driver costs time in the stateful stage, and LZ4 removes far more of that than it
# costs (benchmarks/bench_stages.py shows the stages). The IPC reader checks every decompressed
# length, so a damaged value fails loudly.
PACK_CODEC = "lz4"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression=PACK_CODEC)


_COMP_NAMES = ("m", "l", "x")  # COMPLETENESS in the packed IPC batch


def _ipc_bytes(window: np.ndarray, key: np.ndarray, state: np.ndarray, comp: np.ndarray) -> bytes:
    cols = [
        window,
        *(key[:, i] for i in range(key.shape[1])),
        *(state[:, j] for j in range(state.shape[1])),
        *(comp[:, c] for c in range(len(_COMP_NAMES))),
    ]
    names = [
        "w",
        *(f"k{i}" for i in range(key.shape[1])),
        *(f"s{j}" for j in range(state.shape[1])),
        *_COMP_NAMES,
    ]
    batch = pa.RecordBatch.from_arrays([pa.array(np.ascontiguousarray(c, I64)) for c in cols], names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_OPTIONS) as wr:
        wr.write_batch(batch)
    return sink.getvalue().to_pybytes()


@dataclass
class Part:
    """A run of output rows sharing query/kind/time/hosts: a status row, or closed windows/corrections."""

    lay: Layout
    partition: int
    kind: str
    closed_at_ms: int
    hosts: int
    windows: Windows | None = None  # None for a status row
    status: str | None = None
    hosts_expected: int = 0
    comp: np.ndarray | None = None  # int64[n, 3]: COMPLETENESS per window row (None: status row)

    def __len__(self) -> int:
        return 1 if self.windows is None else len(self.windows)

    def columns(self) -> dict[str, Any]:
        """The generic columns of these rows (key/state as int64 matrices)."""
        n, w, lay = len(self), self.windows, self.lay
        win = np.array([-1], I64) if w is None else w.window
        return {
            "query": np.full(n, lay.name, object),
            "partition": np.full(n, self.partition, np.int32),
            "window": win,
            "window_start_ns": np.zeros(1, I64) if w is None else lay.window_start_ns(win),
            "window_end_ns": np.zeros(1, I64) if w is None else lay.window_end_ns(win),
            "key": np.empty((1, 0), I64) if w is None else w.key,
            "state": np.empty((1, 0), I64) if w is None else w.state,
            "kind": np.full(n, self.kind, object),
            "closed_at_ms": np.full(n, self.closed_at_ms, I64),
            "hosts": np.full(n, self.hosts, np.int32),
            "hosts_expected": np.full(n, self.hosts_expected, np.int32),
            **{
                c: np.zeros(1, I64)
                if self.comp is None
                else self.comp[:, j].astype(np.int32 if j == 0 else I64)
                for j, c in enumerate(COMPLETENESS)
            },
            "status": np.full(n, self.status, object),
        }


def pack_parts(parts: Sequence[Part]) -> pd.DataFrame:
    """Output parts (see :meth:`high_level.aggregate.processor.PartitionProcessor._process`) -> packed rows (:data:`PACKED_COLUMNS`)."""
    out: dict[str, list[Any]] = {c: [] for c in PACKED_COLUMNS}

    def row(p: Part, n: int, kw: int, na: int, data: bytes) -> None:
        for c, v in (
            ("query", p.lay.name),
            ("partition", p.partition),
            ("kind", p.kind),
            ("closed_at_ms", p.closed_at_ms),
            ("hosts", p.hosts),
            ("hosts_expected", p.hosts_expected),
            ("status", p.status),
            ("rows", n),
            ("kw", kw),
            ("na", na),
            ("data", data),
        ):
            out[c].append(v)

    for p in parts:
        w = p.windows
        if w is None:
            row(p, 0, 0, 0, b"")
            continue
        n, kw, na = len(w), w.key.shape[1], w.state.shape[1]
        step = max(1, PACK_BYTES // (8 * (1 + kw + na)))
        for s in range(0, n, step):
            e = min(n, s + step)
            row(p, e - s, kw, na, _ipc_bytes(w.window[s:e], w.key[s:e], w.state[s:e], p.comp[s:e]))
    return pd.DataFrame(
        {
            "query": np.array(out["query"], object),
            "partition": np.array(out["partition"], np.int32),
            "kind": np.array(out["kind"], object),
            "closed_at_ms": np.array(out["closed_at_ms"], I64),
            "hosts": np.array(out["hosts"], np.int32),
            "hosts_expected": np.array(out["hosts_expected"], np.int32),
            "status": np.array(out["status"], object),
            "rows": np.array(out["rows"], np.int32),
            "kw": np.array(out["kw"], np.int32),
            "na": np.array(out["na"], np.int32),
            "data": np.array(out["data"], object),
        }
    )


def _read_pack(
    data: pa.BinaryScalar, lay: Layout, i: int, n: int, kw: int, na: int
) -> tuple[np.ndarray, ...]:
    """One packed window row -> (window int64[n], key int64[n, kw], state int64[n, na], completeness
    int64[n, 3]), checked against the query layout (names, widths, row count, no nulls)."""
    if (kw, na) != (lay.kw, lay.na):
        raise ValueError(
            f"query {lay.name!r}: output has {kw}/{na} key/state columns, layout {lay.kw}/{lay.na}"
        )
    raw = data.as_buffer()
    if raw is None:
        raise ValueError(f"packed row {i} of {lay.name!r} holds no windows")
    t = pa.ipc.open_stream(raw).read_all()
    want = ["w", *(f"k{c}" for c in range(kw)), *(f"s{c}" for c in range(na)), *_COMP_NAMES]
    if (
        t.column_names != want
        or t.num_rows != n
        or any(f.type != pa.int64() or f.nullable and t[f.name].null_count for f in t.schema)
    ):
        raise ValueError(f"packed row {i}: columns {t.column_names} x {t.num_rows}, expected {want} x {n}")
    cols = [np.asarray(t[c].to_numpy(), I64) for c in want]
    key = np.column_stack(cols[1 : 1 + kw]) if kw else np.zeros((n, 0), I64)
    state = np.column_stack(cols[1 + kw : 1 + kw + na]) if na else np.zeros((n, 0), I64)
    return cols[0], key, state, np.column_stack(cols[1 + kw + na :])


@dataclass
class QueryWindows:
    """One query's 'final'/'correction' rows of a micro-batch as numpy columns (what the store writes)."""

    window: np.ndarray  # int64[n]
    rank: np.ndarray  # int8[n]: index of the row kind in contract.results.ROW_KINDS
    key: np.ndarray  # int64[n, kw]
    state: np.ndarray  # int64[n, na]
    closed_at_ms: np.ndarray  # int64[n]
    hosts: np.ndarray  # int32[n]
    hosts_expected: np.ndarray  # int32[n]
    comp: np.ndarray  # int64[n, 3]: COMPLETENESS

    @property
    def final(self) -> np.ndarray:
        return self.rank == R.ROW_KINDS.index("final")

    @property
    def correction(self) -> np.ndarray:
        return self.rank == R.ROW_KINDS.index("correction")


QUERY_WINDOW_FIELDS = ("window", "rank", "key", "state", "closed_at_ms", "hosts", "hosts_expected", "comp")


def unpack_windows(
    packed: pa.Table, layouts: Mapping[str, Layout], kinds: Sequence[str] = R.ROW_KINDS
) -> tuple[dict[str, QueryWindows], list[str]]:
    """Packed rows -> per query its windows as numpy columns (in packed-row order) and the status JSON
    texts. Same checks as :func:`unpack_rows`, without building generic rows: the OOP sink's fast path.
    ``rank`` is the index of the row kind in ``kinds`` (the live publisher reads 'provisional' rows)."""
    meta = packed.select([c for c in PACKED_COLUMNS if c != "data"]).to_pydict()
    data = packed["data"]
    statuses: list[str] = []
    runs: dict[str, list[tuple[np.ndarray, ...]]] = {}
    for i in range(packed.num_rows):
        kind = meta["kind"][i]
        if kind == "status":
            statuses.append(meta["status"][i])
            continue
        if kind == INCOMPLETE_KIND:  # read by unpack_incomplete
            continue
        if kind not in kinds:
            raise ValueError(f"packed row {i}: unknown kind {kind!r}")
        lay = layouts.get(meta["query"][i])
        if lay is None:
            raise ValueError(f"output rows of unknown query {meta['query'][i]!r}")
        n = int(meta["rows"][i])
        w, key, state, comp = _read_pack(data[i], lay, i, n, int(meta["kw"][i]), int(meta["na"][i]))
        runs.setdefault(lay.name, []).append(
            (
                w,
                np.full(n, kinds.index(kind), np.int8),
                key,
                state,
                np.full(n, int(meta["closed_at_ms"][i]), I64),
                np.full(n, int(meta["hosts"][i]), np.int32),
                np.full(n, int(meta["hosts_expected"][i]), np.int32),
                comp,
            )
        )
    out = {}
    for name, rs in runs.items():
        cols = [np.concatenate([r[j] for r in rs]) if len(rs) > 1 else rs[0][j] for j in range(8)]
        out[name] = QueryWindows(*cols)
    return out, statuses


def unpack_incomplete(packed: pa.Table | pd.DataFrame) -> dict[str, list[tuple[int, list[Any]]]]:
    """Per query, (partition, flagged window) of the rows of kind :data:`INCOMPLETE_KIND` (packed or
    generic rows: both carry the JSON in ``status``), in row order; see ``processor._QueryState.incomplete_windows``."""
    if isinstance(packed, pd.DataFrame):
        sel = packed[packed["kind"] == INCOMPLETE_KIND]
        pairs = zip(sel["query"].tolist(), sel["status"].tolist(), strict=True)
    else:
        t = packed.filter(pc.fill_null(pc.equal(packed["kind"], INCOMPLETE_KIND), False))
        pairs = zip(t["query"].to_pylist(), t["status"].to_pylist(), strict=True)
    out: dict[str, list[tuple[int, list[Any]]]] = {}
    for name, text in pairs:
        doc = json.loads(text)
        out.setdefault(name, []).extend((int(doc["partition"]), w) for w in doc["windows"])
    return out


def unpack_rows(packed: pa.Table | pd.DataFrame, layouts: Mapping[str, Layout]) -> pa.Table:
    """Packed rows -> generic rows (:data:`GENERIC_SCHEMA`) in the same order; per packed row, not per
    window. ``layouts`` (by query name) give the window bounds and check the widths."""
    if isinstance(packed, pd.DataFrame):
        packed = pa.Table.from_pandas(packed, preserve_index=False)
    m = packed.num_rows
    if m == 0:
        return GENERIC_SCHEMA.empty_table()
    meta = packed.select([c for c in PACKED_COLUMNS if c != "data"]).to_pydict()
    data = packed["data"]
    seg = np.ones(m, I64)
    windows, starts, ends, keys, states, kws, nas, comps = [], [], [], [], [], [], [], []
    for i in range(m):
        n, kw, na, kind = int(meta["rows"][i]), int(meta["kw"][i]), int(meta["na"][i]), meta["kind"][i]
        if kind in ("status", INCOMPLETE_KIND):
            windows.append(np.array([-1], I64))
            starts.append(np.zeros(1, I64))
            ends.append(np.zeros(1, I64))
            comps.append(np.zeros((1, len(COMPLETENESS)), I64))
            kws.append(0)
            nas.append(0)
            continue
        lay = layouts.get(meta["query"][i])
        if lay is None:
            raise ValueError(f"output rows of unknown query {meta['query'][i]!r}")
        w, key, state, comp = _read_pack(data[i], lay, i, n, kw, na)
        comps.append(comp)
        seg[i] = n
        windows.append(w)
        starts.append(lay.window_start_ns(w))
        ends.append(lay.window_end_ns(w))
        keys.append(key.ravel())
        states.append(state.ravel())
        kws.append(kw)
        nas.append(na)
    take = pa.array(np.repeat(np.arange(m, dtype=I64), seg))
    status_rows = np.asarray(
        pc.is_in(packed["kind"], pa.array(["status", INCOMPLETE_KIND])).to_numpy(zero_copy_only=False), bool
    )
    per_row_kw = np.repeat(np.where(status_rows, 0, np.array(kws, I64)), seg)
    per_row_na = np.repeat(np.where(status_rows, 0, np.array(nas, I64)), seg)

    def lists(vals: list[np.ndarray], width: np.ndarray) -> pa.Array:
        offs = np.zeros(len(width) + 1, np.int32)
        np.cumsum(width, out=offs[1:])
        flat = np.concatenate(vals) if vals else np.zeros(0, I64)
        return pa.ListArray.from_arrays(pa.array(offs, pa.int32()), pa.array(flat, pa.int64()))

    cols = {
        "query": packed["query"].take(take),
        "partition": packed["partition"].take(take),
        "window": pa.array(np.concatenate(windows)),
        "window_start_ns": pa.array(np.concatenate(starts)),
        "window_end_ns": pa.array(np.concatenate(ends)),
        "key": lists(keys, per_row_kw),
        "state": lists(states, per_row_na),
        "kind": packed["kind"].take(take),
        "closed_at_ms": packed["closed_at_ms"].take(take),
        "hosts": packed["hosts"].take(take),
        "hosts_expected": packed["hosts_expected"].take(take),
        **{c: pa.array(np.concatenate(comps)[:, j]) for j, c in enumerate(COMPLETENESS)},
        "status": packed["status"].take(take),
    }
    return pa.table(cols).cast(GENERIC_SCHEMA)
