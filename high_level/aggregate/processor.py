"""One Kafka partition's high-level processor: decode batches, merge partials, meld punctuation, close.

This is the body of the Spark stateful step, kept free of Spark so it can be tested directly and
replayed offline. Everything it decides depends only on (its saved state, the messages in offset
order, ``now_ms``), and Spark supplies ``now_ms`` from the batch timestamp recorded in the offset
log, so a replayed micro-batch produces byte-identical output (exactly-once with an idempotent sink).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import results as R
from contract import wire
from contract.live import PROVISIONAL_KIND
from contract.status import PartitionStatus
from high_level import codec
from high_level.aggregate.chunks import ChunkedRollup, ChunkStore
from high_level.aggregate.meld import Meld
from high_level.aggregate.rollup import I64, Layout, QueryRollup, Windows

LATE_POLICIES = ("drop", "correction")
STATE_ZMAGIC = b"LWPZ"  # the processor's saved bytes, zstd-compressed (state of earlier builds: uncompressed)
MAX_INCARNATIONS = 4  # per host: record counters kept for the newest few incarnations

# The generic output schema of the stateful step (one schema for all queries).
# Completeness of each window row (see contract/results.py): hosts_expected (hosts the partition knows),
# hosts_in_mark (known hosts whose mark passed the window's end), late_partials, missing_records.
OUTPUT_COLUMNS = ("query", "partition", "window", "window_start_ns", "window_end_ns", "key", "state",
                  "kind", "closed_at_ms", "hosts", "hosts_expected", "hosts_in_mark", "late_partials",
                  "missing_records", "status")  # fmt: skip
GENERIC_SCHEMA = pa.schema([
    ("query", pa.string()), ("partition", pa.int32()), ("window", pa.int64()), ("window_start_ns", pa.int64()),
    ("window_end_ns", pa.int64()), ("key", pa.list_(pa.int64())), ("state", pa.list_(pa.int64())),
    ("kind", pa.string()), ("closed_at_ms", pa.int64()), ("hosts", pa.int32()), ("hosts_expected", pa.int32()),
    ("hosts_in_mark", pa.int32()), ("late_partials", pa.int64()), ("missing_records", pa.int64()),
    ("status", pa.string()),
])  # fmt: skip
COMPLETENESS = ("hosts_in_mark", "late_partials", "missing_records")  # per-row columns of _Part.comp
NO_MARK = -(2**62)  # the "previous mark" of a host's first punctuation: any pane may have lost records
INCOMPLETE_KIND = "incomplete"  # output rows flagging short windows (contract.results.INCOMPLETE_SCHEMA), as JSON


# What the stateful step hands to the JVM: the generic rows *packed*. Each 'final'/'correction' row of
# the packed form carries a run of up to PACK_BYTES of windows as int64 columns (window, key words,
# state columns) in ``data``; each 'status' row carries one status (``rows`` 0, ``data`` empty).
# Why: Spark moves every output row of applyInPandasWithState through pandas -> Arrow -> UnsafeRow ->
# Arrow (toArrow) with per-row work on both sides (array<bigint> columns are even converted with
# ``list(value)`` per row in Python, and the serializer pads its state column per output row); a few
# large binary values cost a memcpy. :func:`unpack_rows` turns the packed rows back into generic rows
# on the driver without per-row work. No pickle: ``data`` is an Arrow IPC stream of plain numbers.
PACKED_COLUMNS = ("query", "partition", "kind", "closed_at_ms", "hosts", "hosts_expected", "status", "rows", "kw",
                  "na", "data")  # fmt: skip
OUTPUT_DDL = ("query string, partition int, kind string, closed_at_ms long, hosts int, hosts_expected int, "
              "status string, rows int, kw int, na int, data binary")  # fmt: skip
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
    cols = [window, *(key[:, i] for i in range(key.shape[1])), *(state[:, j] for j in range(state.shape[1])),
            *(comp[:, c] for c in range(len(_COMP_NAMES)))]  # fmt: skip
    names = ["w", *(f"k{i}" for i in range(key.shape[1])), *(f"s{j}" for j in range(state.shape[1])), *_COMP_NAMES]
    batch = pa.RecordBatch.from_arrays([pa.array(np.ascontiguousarray(c, I64)) for c in cols], names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_OPTIONS) as wr:
        wr.write_batch(batch)
    return sink.getvalue().to_pybytes()


@dataclass
class _Part:
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
            "query": np.full(n, lay.name, object), "partition": np.full(n, self.partition, np.int32), "window": win,
            "window_start_ns": np.zeros(1, I64) if w is None else lay.window_start_ns(win),
            "window_end_ns": np.zeros(1, I64) if w is None else lay.window_end_ns(win),
            "key": np.empty((1, 0), I64) if w is None else w.key, "state": np.empty((1, 0), I64) if w is None else w.state,
            "kind": np.full(n, self.kind, object), "closed_at_ms": np.full(n, self.closed_at_ms, I64),
            "hosts": np.full(n, self.hosts, np.int32), "hosts_expected": np.full(n, self.hosts_expected, np.int32),
            **{c: np.zeros(1, I64) if self.comp is None else self.comp[:, j].astype(np.int32 if j == 0 else I64)
               for j, c in enumerate(COMPLETENESS)},
            "status": np.full(n, self.status, object),
        }  # fmt: skip


def pack_parts(parts: Sequence[_Part]) -> pd.DataFrame:
    """Output parts (see ``PartitionProcessor._process``) -> packed rows (:data:`PACKED_COLUMNS`)."""
    out: dict[str, list[Any]] = {c: [] for c in PACKED_COLUMNS}

    def row(p: _Part, n: int, kw: int, na: int, data: bytes) -> None:
        for c, v in (("query", p.lay.name), ("partition", p.partition), ("kind", p.kind),
                     ("closed_at_ms", p.closed_at_ms), ("hosts", p.hosts), ("hosts_expected", p.hosts_expected),
                     ("status", p.status),
                     ("rows", n), ("kw", kw), ("na", na), ("data", data)):  # fmt: skip
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
    return pd.DataFrame({
        "query": np.array(out["query"], object), "partition": np.array(out["partition"], np.int32),
        "kind": np.array(out["kind"], object), "closed_at_ms": np.array(out["closed_at_ms"], I64),
        "hosts": np.array(out["hosts"], np.int32), "hosts_expected": np.array(out["hosts_expected"], np.int32),
        "status": np.array(out["status"], object),
        "rows": np.array(out["rows"], np.int32), "kw": np.array(out["kw"], np.int32),
        "na": np.array(out["na"], np.int32), "data": np.array(out["data"], object),
    })  # fmt: skip


def _read_pack(data: pa.BinaryScalar, lay: Layout, i: int, n: int, kw: int, na: int) -> tuple[np.ndarray, ...]:
    """One packed window row -> (window int64[n], key int64[n, kw], state int64[n, na], completeness
    int64[n, 3]), checked against the query layout (names, widths, row count, no nulls)."""
    if (kw, na) != (lay.kw, lay.na):
        raise ValueError(f"query {lay.name!r}: output has {kw}/{na} key/state columns, layout {lay.kw}/{lay.na}")
    raw = data.as_buffer()
    if raw is None:
        raise ValueError(f"packed row {i} of {lay.name!r} holds no windows")
    t = pa.ipc.open_stream(raw).read_all()
    want = ["w", *(f"k{c}" for c in range(kw)), *(f"s{c}" for c in range(na)), *_COMP_NAMES]
    if t.column_names != want or t.num_rows != n or any(f.type != pa.int64() or f.nullable and t[f.name].null_count
                                                        for f in t.schema):  # fmt: skip
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


def unpack_windows(packed: pa.Table, layouts: Mapping[str, Layout],
                   kinds: Sequence[str] = R.ROW_KINDS) -> tuple[dict[str, QueryWindows], list[str]]:  # fmt: skip
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
        runs.setdefault(lay.name, []).append((w, np.full(n, kinds.index(kind), np.int8), key, state,
                                              np.full(n, int(meta["closed_at_ms"][i]), I64),
                                              np.full(n, int(meta["hosts"][i]), np.int32),
                                              np.full(n, int(meta["hosts_expected"][i]), np.int32), comp))  # fmt: skip
    out = {}
    for name, rs in runs.items():
        cols = [np.concatenate([r[j] for r in rs]) if len(rs) > 1 else rs[0][j] for j in range(8)]
        out[name] = QueryWindows(*cols)
    return out, statuses


def unpack_incomplete(packed: pa.Table | pd.DataFrame) -> dict[str, list[tuple[int, list[Any]]]]:
    """Per query, (partition, flagged window) of the rows of kind :data:`INCOMPLETE_KIND` (packed or
    generic rows: both carry the JSON in ``status``), in row order; see ``_QueryState.incomplete_windows``."""
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
    status_rows = np.asarray(pc.is_in(packed["kind"], pa.array(["status", INCOMPLETE_KIND])).to_numpy(
        zero_copy_only=False), bool)  # fmt: skip
    per_row_kw = np.repeat(np.where(status_rows, 0, np.array(kws, I64)), seg)
    per_row_na = np.repeat(np.where(status_rows, 0, np.array(nas, I64)), seg)

    def lists(vals: list[np.ndarray], width: np.ndarray) -> pa.Array:
        offs = np.zeros(len(width) + 1, np.int32)
        np.cumsum(width, out=offs[1:])
        flat = np.concatenate(vals) if vals else np.zeros(0, I64)
        return pa.ListArray.from_arrays(pa.array(offs, pa.int32()), pa.array(flat, pa.int64()))

    cols = {
        "query": packed["query"].take(take), "partition": packed["partition"].take(take),
        "window": pa.array(np.concatenate(windows)), "window_start_ns": pa.array(np.concatenate(starts)),
        "window_end_ns": pa.array(np.concatenate(ends)), "key": lists(keys, per_row_kw),
        "state": lists(states, per_row_na), "kind": packed["kind"].take(take),
        "closed_at_ms": packed["closed_at_ms"].take(take), "hosts": packed["hosts"].take(take),
        "hosts_expected": packed["hosts_expected"].take(take),
        **{c: pa.array(np.concatenate(comps)[:, j]) for j, c in enumerate(COMPLETENESS)},
        "status": packed["status"].take(take),
    }  # fmt: skip
    return pa.table(cols).cast(GENERIC_SCHEMA)


@dataclass(frozen=True)
class Settings:
    """Job-level settings the processor needs (same on every worker)."""

    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    max_gap_ms: int | None = None
    live: bool = False  # emit 'provisional' rows of the open windows a batch changed (contract/live.py)

    def __post_init__(self) -> None:
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}, got {self.late_policy!r}")


def gap_records(lay: Layout, gaps: Sequence[Sequence[Any]], window: np.ndarray) -> np.ndarray:
    """int64[n]: the records of every gap or loss range ``[first pane, last pane, records, ...]`` that
    overlaps each window (a range's records count in every window it overlaps: its keys are unknown)."""
    w = np.asarray(window, I64)
    if not gaps:
        return np.zeros(len(w), I64)
    g = np.array([x[:3] for x in gaps], I64)
    first = w - lay.k + 1
    hit = (g[None, :, 0] <= w[:, None]) & (g[None, :, 1] >= first[:, None])
    return hit.astype(I64) @ g[:, 2]


def flag_windows(lay: Layout, gaps: Sequence[Sequence[Any]], before: int | None, after: int | None,
                 new_from: int, now_ms: int) -> list[list[Any]]:  # fmt: skip
    """The short windows to flag (contract.results.INCOMPLETE_SCHEMA), one per (window, range): every
    window closed between ``before`` and ``after`` that a range ``[first pane, last pane, records, host,
    cause]`` overlaps, and every earlier-closed window that a range learned now (``gaps[new_from:]``)
    overlaps (``after_close``). A range of unknown start (``NO_MARK``) flags only the rows. Each list is
    ``[window_start_ns, window_end_ns, first_pane_start_ns, last_pane_end_ns, records, host, cause,
    after_close, now_ms]``, in (window, range) order: deterministic, so a replayed batch flags the same."""
    if after is None or not gaps:
        return []
    out = []
    for i, (lo, hi, n, host, cause) in enumerate(gaps):
        if lo <= NO_MARK:
            continue
        first = lo if i >= new_from or before is None else max(lo, before)
        last = min(hi + lay.k - 1, after - 1)  # windows [lo, hi + k - 1] hold a pane of [lo, hi]
        if last < first:
            continue
        w = np.arange(first, last + 1, dtype=I64)
        w = w[(w - lay.k + 1) % lay.s == 0]
        ends = lay.window_end_ns(w)
        p_lo = np.maximum(w - lay.k + 1, lo)  # the window's own panes within the range
        p_hi = np.minimum(w, hi)
        for j in range(len(w)):
            out.append([int(ends[j] - lay.range_ns), int(ends[j]), lay.origin_ns + int(p_lo[j]) * lay.pane_ns,
                        lay.origin_ns + (int(p_hi[j]) + 1) * lay.pane_ns, int(n), host, cause,
                        before is not None and int(w[j]) < before, now_ms])  # fmt: skip
    out.sort(key=lambda r: (r[0], r[2], r[5], r[6]))
    return out


class _QueryState:
    """Roll-up + meld + counters of one query on one partition."""

    def __init__(self, layout: Layout, settings: Settings, store: ChunkStore | None = None) -> None:
        self.layout = layout
        self.rollup = QueryRollup(layout) if store is None else ChunkedRollup(layout, store)
        # an expected host that does not run this query (its `sources`) would hold it open forever
        expected = [h for h in settings.expected_hosts if layout.runs_on(h)]
        self.meld = Meld(settings.host_timeout_ms, expected, settings.max_gap_ms)
        # host -> {"late": n, "records": n, "inc": {str(incarnation): [received, sent, missing]}}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.windows_closed = 0
        self.records = 0
        # [first pane, last pane, records, host, cause]: sequence gaps seen at a punctuation and pane
        # ranges a host shed (cause in contract.results.INCOMPLETE_CAUSES), kept until every window
        # they overlap has closed (the records a host sends between two punctuations with marks P
        # and M belong to panes >= P; the gap is attributed to the windows overlapping [P, M])
        self.gaps: list[list[Any]] = []

    def completeness(self, window: np.ndarray, late: np.ndarray | None = None) -> tuple[int, np.ndarray]:
        """(hosts the partition knows, int64[n, 3] COMPLETENESS) of window rows, decided now.

        A known host is in a window's mark when its latest mark passed the window's end (``mark >
        w``): live or not, it promised nothing more for the window. Expected hosts never heard are known
        and in no mark. Why per window and not "live at close": a host that died after its mark passed
        a window has sent everything of that window, one that died before has not.
        """
        meld = self.meld
        known = set(meld.hosts) | set(meld.expected_ids()) | set(self.hosts)
        marks = np.sort(np.array([meld.hosts[h].mark_pane for h in known if h in meld.hosts], I64))
        w = np.asarray(window, I64)
        comp = np.zeros((len(w), len(COMPLETENESS)), I64)
        comp[:, 0] = len(marks) - np.searchsorted(marks, w, side="right")
        if late is not None:
            comp[:, 1] = late
        comp[:, 2] = gap_records(self.layout, self.gaps, w)
        return len(known), comp

    def incomplete_windows(self, before: int | None, new_from: int, now_ms: int) -> list[list[Any]]:
        """The short windows to flag in this batch (contract.results.INCOMPLETE_SCHEMA), one per (window,
        gap): every window closed by this batch that a known gap overlaps, and every earlier-closed
        window that a gap learned in this batch (``self.gaps[new_from:]``) overlaps (``after_close``).

        Why: a window whose every record was shed or lost has no row to carry ``missing_records``. A
        gap of unknown start (``NO_MARK``) flags only the rows. Each list is ``[window_start_ns,
        window_end_ns, first_pane_start_ns, last_pane_end_ns, records, host, cause, after_close,
        now_ms]``, in (window, gap) order: deterministic, so a replayed batch flags the same.
        """
        return flag_windows(self.layout, self.gaps, before, self.rollup.closed, new_from, now_ms)

    def timeout_windows(self, before: int | None, closed: Windows, now_ms: int) -> list[list[Any]]:
        """Flag every window this batch closed without a known host's mark past it (the host timed out,
        or an expected one never came), per such host, cause ``timeout``, records 0 (unknown): a
        window whose every record would have come from that host has no row to say so."""
        after, lay, meld = self.rollup.closed, self.layout, self.meld
        if after is None:
            return []
        if after >= wire.END_OF_STREAM - lay.k:  # closed to the end of stream: up to the last window with rows
            after = int(closed.window.max()) + 1 if len(closed) else (before if before is not None else 0)
        if before is not None:
            w = np.arange(max(before, after - 4096), after, dtype=I64)  # bounded: a long-dead host's backlog
        else:
            w = np.unique(closed.window) if len(closed) else np.zeros(0, I64)
        w = w[(w - lay.k + 1) % lay.s == 0]
        if not len(w):
            return []
        known = set(meld.hosts) | set(meld.expected_ids()) | set(self.hosts)
        out = []
        ends = lay.window_end_ns(w)
        for h in sorted(known):
            hm = meld.hosts.get(h)
            short = w if hm is None else w[hm.mark_pane <= w]
            for j in np.searchsorted(w, short).tolist():
                out.append([int(ends[j] - lay.range_ns), int(ends[j]), int(ends[j] - lay.range_ns), int(ends[j]),
                            0, h, "timeout", False, now_ms])  # fmt: skip
        return out

    def shed_through(self) -> int | None:
        """The newest pane a host reported shed (an end-of-stream close must reach its windows too)."""
        return max((int(g[1]) for g in self.gaps if g[4] == "shed"), default=None)

    def purge_gaps(self) -> None:
        """Forget gaps that no window still to close overlaps (state stays bounded)."""
        closed = self.rollup.closed
        if closed is not None and self.gaps:
            first_open = self.layout.first_needed_pane(closed)
            self.gaps = [g for g in self.gaps if g[1] >= first_open]

    def host(self, name: str) -> dict[str, Any]:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = {"late": 0, "records": 0, "inc": {}}
        return h

    def incarnation(self, name: str, inc: int) -> list[int]:
        incs = self.host(name)["inc"]
        key = str(inc)
        if key not in incs:
            incs[key] = [0, 0, 0]
            if len(incs) > MAX_INCARNATIONS:
                for old in sorted(incs, key=int)[: len(incs) - MAX_INCARNATIONS]:
                    del incs[old]
        return incs[key]


class PartitionProcessor:
    """The state and logic for one (topic, Kafka partition): bytes in, closed windows out.

    With a ``store`` (:mod:`high_level.aggregate.chunks`) the pane tables live there as per-batch chunks and
    :meth:`to_bytes` holds only the small part (marks, counters, frontier, pane index); without, the
    whole state is in :meth:`to_bytes` (the blob state).
    """

    def __init__(self, layouts: Sequence[Layout], partition: int, settings: Settings,
                 store: ChunkStore | None = None) -> None:  # fmt: skip
        self.partition = int(partition)
        self.settings = settings
        self.layouts = {lay.name: lay for lay in layouts}
        self.queries: dict[str, _QueryState] = {n: _QueryState(lay, settings, store) for n, lay in self.layouts.items()}
        self.errors = {"bad_messages": 0, "unknown_query": 0, "misrouted": 0, "bad_layout": 0}
        self.last_error = ""

    # -- state bytes ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        meta: dict[str, Any] = {"partition": self.partition, "errors": self.errors, "last_error": self.last_error,
                                "queries": {}}  # fmt: skip
        arrays: dict[str, np.ndarray] = {}
        for name, qs in self.queries.items():
            r = qs.rollup
            meta["queries"][name] = {
                "closed": r.closed, "meld": qs.meld.to_dict(), "hosts": qs.hosts,
                "windows_closed": qs.windows_closed, "records": qs.records, "gaps": qs.gaps,
            }  # fmt: skip
            if isinstance(r, ChunkedRollup):
                meta["queries"][name]["chunks"] = r.index_dict()
            arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"] = r.pane, r.key, r.state
        return codec.compress(codec.pack(meta, arrays), STATE_ZMAGIC)

    @classmethod
    def from_bytes(cls, buf: bytes, layouts: Sequence[Layout], settings: Settings,
                   store: ChunkStore | None = None) -> PartitionProcessor:  # fmt: skip
        meta, arrays = codec.unpack(codec.decompress(buf, STATE_ZMAGIC))
        p = cls(layouts, meta["partition"], settings, store)
        p.errors.update(meta.get("errors", {}))
        p.last_error = meta.get("last_error", "")
        for name, qm in meta["queries"].items():
            qs = p.queries.get(name)
            if qs is None:  # query removed from the config: its state is dropped
                continue
            lay = qs.layout
            pane, key, state = arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"]
            if key.shape[1:] != (lay.kw,) or state.shape[1:] != (lay.na,):
                raise codec.CodecError(f"query {name!r} changed its key/state layout; use a new checkpoint")
            if ("chunks" in qm) != isinstance(qs.rollup, ChunkedRollup):
                raise codec.CodecError("state saved by the other state layout (blob/chunked); use a new checkpoint")
            qs.rollup.pane, qs.rollup.key, qs.rollup.state = pane, key, state
            if isinstance(qs.rollup, ChunkedRollup):
                qs.rollup.load_index(qm["chunks"])
            closed = qm["closed"]
            if closed is not None and closed > wire.END_OF_STREAM - lay.k and not len(qs.rollup):
                closed = None  # a frontier at end of stream (saved before it stopped at the data): reopen
            qs.rollup.closed = closed
            qs.meld.load_dict(qm["meld"])
            qs.hosts = qm["hosts"]
            qs.windows_closed = qm.get("windows_closed", 0)
            qs.records = qm.get("records", 0)
            qs.gaps = [[int(g[0]), int(g[1]), int(g[2]), *(g[3:5] if len(g) >= 5 else ("", "gap"))]
                       for g in qm.get("gaps", [])]  # fmt: skip
        return p

    # -- processing -----------------------------------------------------------------------------
    def _process(self, values: Iterable[bytes], now_ms: int) -> list[_Part]:
        """One micro-batch -> output parts (corrections, finals, status per query)."""
        for qs in self.queries.values():
            qs.meld.advance(now_ms)
        pending: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {n: [] for n in self.queries}
        batch = {n: {"messages": 0, "records": 0, "punctuations": 0} for n in self.queries}
        known_gaps = {n: len(qs.gaps) for n, qs in self.queries.items()}  # what is learned later is new
        for value in values:
            try:
                b = wire.decode(value)
            except wire.WireError as exc:
                self.errors["bad_messages"] += 1
                self.last_error = str(exc)
                continue
            qs = self.queries.get(b.query)
            if qs is None:
                self.errors["unknown_query"] += 1
                self.last_error = f"unknown query {b.query!r}"
                continue
            if b.partition != self.partition:
                self.errors["misrouted"] += 1
            bq = batch[b.query]
            bq["messages"] += 1
            inc = qs.incarnation(b.host, b.incarnation)
            if isinstance(b, wire.Partials):
                if b.key.shape[1] != qs.layout.kw or b.state.shape[1] != qs.layout.na:
                    self.errors["bad_layout"] += 1
                    self.last_error = f"{b.query}: key/state width {b.key.shape[1]}/{b.state.shape[1]} from {b.host}"
                    continue
                pending[b.query].append((b.host, b.pane, b.key, b.state))
                inc[0] += b.n
                qs.host(b.host)["records"] += b.n
                bq["records"] += b.n
            else:
                inc[1] = int(b.seq)
                missing = max(0, int(b.seq) - inc[0])
                prev = qs.meld.hosts.get(b.host)
                shed_now = sum(int(r[2]) for r in b.shed)  # in seq too; attributed to their panes below
                if missing > inc[2] + shed_now:  # records sent since the previous punctuation never came
                    since = prev.mark_pane if prev is not None and prev.incarnation == b.incarnation else NO_MARK
                    qs.gaps.append([int(since), int(b.mark_pane), missing - inc[2] - shed_now, b.host, "gap"])
                inc[2] = missing
                if prev is not None and prev.incarnation != b.incarnation:
                    # the agent restarted: what its old incarnation held unflushed (panes from its last
                    # mark on) is lost; report the range of windows that may be incomplete
                    h = qs.host(b.host)
                    h["restarts"] = h.get("restarts", 0) + 1
                    h["last_restart"] = {"old_incarnation": prev.incarnation, "new_incarnation": b.incarnation,
                                         "incomplete_from_pane": prev.mark_pane, "new_mark_pane": int(b.mark_pane)}
                for lo, hi, n in b.shed:  # whole panes the host shed from its uplink backlog: windows short
                    qs.gaps.append([int(lo), int(hi), int(n), b.host, "shed"])
                    qs.host(b.host)["shed"] = qs.host(b.host).get("shed", 0) + int(n)
                for lo, hi, cause, n in b.losses:  # lost before Kafka (socket, ring, late at the host)
                    h = qs.host(b.host)
                    if cause == "malformed":  # reported, not a loss of this query's records
                        h["malformed"] = h.get("malformed", 0) + int(n)
                        continue
                    qs.gaps.append([int(lo), int(hi), int(n), b.host, R.WIRE_CAUSES[cause]])
                    h["lost_" + cause] = h.get("lost_" + cause, 0) + int(n)
                if b.stats.get("workers", 0) > 0:
                    qs.meld.workers_of(b.host, int(b.stats["workers"]))
                qs.meld.observe(b.host, b.incarnation, b.mark_pane, b.mark_ns, b.sent_wall_ns, now_ms)
                bq["punctuations"] += 1
        parts = []
        for name, qs in self.queries.items():
            parts.extend(self._finish(qs, pending[name], batch[name], now_ms, known_gaps[name]))
        return parts

    def process(self, values: Iterable[bytes], now_ms: int) -> pd.DataFrame:
        """Apply one micro-batch of Kafka message values (in offset order) at processing time ``now_ms``.

        Returns rows in the generic output schema: 'final' windows, 'correction' rows and one
        'status' row per query.
        """
        parts = [p.columns() for p in self._process(values, now_ms)]
        if not parts:
            return empty_output()
        return pd.DataFrame({
            c: np.concatenate([p[c] for p in parts]) if c not in ("key", "state")
            else [r for p in parts for r in p[c]] for c in OUTPUT_COLUMNS
        })  # fmt: skip

    def process_packed(self, values: Iterable[bytes], now_ms: int) -> pd.DataFrame:
        """:meth:`process` in the packed form (:data:`PACKED_COLUMNS`): what the Spark step emits."""
        return pack_parts(self._process(values, now_ms))

    def _finish(self, qs: _QueryState, pending: list, batch: dict[str, int], now_ms: int,
                known_gaps: int = 0) -> list[_Part]:  # fmt: skip
        lay = qs.layout
        late_batch: dict[str, int] = {}
        parts = []
        if pending:
            hosts = sorted({p[0] for p in pending})
            hix = {h: i for i, h in enumerate(hosts)}
            pane = np.concatenate([p[1] for p in pending])
            key = np.concatenate([p[2] for p in pending])
            state = np.concatenate([p[3] for p in pending])
            host_idx = np.repeat(np.array([hix[p[0]] for p in pending], I64), [len(p[1]) for p in pending])
            res = qs.rollup.add(pane, key, state, host_idx, len(hosts))
            for h, n in zip(hosts, res.late_per_host.tolist(), strict=True):
                if n:
                    qs.host(h)["late"] += n
                    late_batch[h] = n
            if res.corrections is not None and len(res.corrections):
                # policy correction: stored as deltas to fold; policy drop: 'late' rows that only say
                # which closed (window, group) rows lost how many records (their values stay as closed)
                kind = "correction" if self.settings.late_policy == "correction" else "late"
                expected, comp = qs.completeness(res.corrections.window, res.late_records)
                parts.append(_Part(lay, self.partition, kind, now_ms, len(qs.meld.live_hosts()), res.corrections,
                                   hosts_expected=expected, comp=comp))  # fmt: skip
            qs.records += len(pane)
        lwm = qs.meld.low_water_mark()
        before = qs.rollup.closed
        closed = qs.rollup.close(lwm, qs.shed_through())
        n_live = len(qs.meld.live_hosts())
        if len(closed):
            qs.windows_closed += len(closed)
            expected, comp = qs.completeness(closed.window)
            parts.append(_Part(lay, self.partition, "final", now_ms, n_live, closed, hosts_expected=expected, comp=comp))
        if lay.landmark and qs.rollup.closed != before:
            upd = qs.rollup.landmark_update()
            if len(upd):
                expected, comp = qs.completeness(upd.window)
                parts.append(_Part(lay, self.partition, "update", now_ms, n_live, upd, hosts_expected=expected,
                                   comp=comp))  # fmt: skip
        if self.settings.live and pending:
            parts.extend(self._provisional(qs, pending, now_ms, n_live))
        flagged = qs.incomplete_windows(before, known_gaps, now_ms) + qs.timeout_windows(before, closed, now_ms)
        if flagged:
            text = json.dumps({"partition": self.partition, "windows": flagged}, separators=(",", ":"))
            parts.append(_Part(lay, self.partition, INCOMPLETE_KIND, now_ms, n_live, None, text))
        qs.purge_gaps()
        status = self.status(qs, now_ms, batch, late_batch, len(closed))
        parts.append(_Part(lay, self.partition, "status", now_ms, n_live, None, status.model_dump_json()))
        return parts

    def _provisional(self, qs: _QueryState, pending: list, now_ms: int, n_live: int) -> list[_Part]:
        """Live results (contract/live.py): the current value of every open window and group the batch's
        partials changed, as 'provisional' rows with their coverage (hosts_in_mark of hosts_expected)."""
        pane = np.concatenate([p[1] for p in pending])
        key = np.concatenate([p[2] for p in pending])
        upd = qs.rollup.provisional(pane, key)
        if not len(upd):
            return []
        expected, comp = qs.completeness(upd.window)
        return [_Part(qs.layout, self.partition, PROVISIONAL_KIND, now_ms, n_live, upd, hosts_expected=expected,
                      comp=comp)]  # fmt: skip

    def status(self, qs: _QueryState, now_ms: int, batch: dict[str, int] | None = None,
               late_batch: dict[str, int] | None = None, closed_batch: int = 0) -> PartitionStatus:  # fmt: skip
        """A snapshot in the status contract: per-host marks, liveness, lag, late and missing records, open windows."""
        lay, meld = qs.layout, qs.meld
        lwm = meld.low_water_mark()
        hosts: dict[str, Any] = {}
        for name in sorted(set(meld.hosts) | set(qs.hosts) | set(meld.expected_ids())):
            hm = meld.hosts.get(name)
            hc = qs.hosts.get(name, {"late": 0, "records": 0, "inc": {}})
            incs = hc["inc"]
            cur = str(hm.incarnation) if hm else (max(incs, key=int) if incs else None)
            hosts[name] = {
                "live": meld.is_live(name),
                "expected": name in meld.expected_ids() or name in meld.expected,
                "mark_pane": hm.mark_pane if hm else None,
                "mark_ns": hm.mark_ns if hm else None,
                "lag_s": (now_ms * 1_000_000 - hm.mark_ns) / 1e9 if hm and 0 < hm.mark_ns < wire.END_OF_STREAM else None,
                "last_heard_ms": hm.last_heard_ms if hm else None,
                "silent_s": hm.silent_ms / 1e3 if hm else None,
                "punctuations": hm.punctuations if hm else 0,
                "incarnation": int(cur) if cur is not None else None,
                "records": hc["records"],
                "sent_records": incs[cur][1] if cur in incs else 0,
                "received_records": incs[cur][0] if cur in incs else 0,
                "missing_records": sum(v[2] for v in incs.values()),
                "late_partials": hc["late"],
                "restarts": hc.get("restarts", 0),
                "last_restart": hc.get("last_restart"),
                "late_batch": (late_batch or {}).get(name, 0),
                "losses": {k[5:]: v for k, v in hc.items() if k.startswith("lost_")},
                "malformed": hc.get("malformed", 0),
            }
        return PartitionStatus.model_validate({
            "query": lay.name, "partition": self.partition, "now_ms": now_ms,
            "low_water_mark_pane": lwm,
            "low_water_mark_ns": _pane_ns(lay, lwm),
            "closed_before_window": qs.rollup.closed,
            "blocked_by": meld.blocking_hosts(),
            "live_hosts": len(meld.live_hosts()),
            "open_windows": qs.rollup.open_windows(), "state_rows": len(qs.rollup),
            "windows_closed": qs.windows_closed, "windows_closed_batch": closed_batch,
            "records": qs.records, "batch": batch or {}, "errors": dict(self.errors), "last_error": self.last_error,
            "hosts": hosts,
        })  # fmt: skip


def _pane_ns(lay: Layout, pane: int | None) -> int | None:
    """Start time of a pane in ns, None when unknown or beyond int64 (END_OF_STREAM)."""
    if pane is None:
        return None
    ns = lay.origin_ns + pane * lay.pane_ns
    return ns if -(2**63) <= ns < 2**63 - 1 else None


def empty_output() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in OUTPUT_COLUMNS})
