"""The result store: typed Parquet per query and day, plus the latest status as one JSON file.

Layout (read by the REST API with DuckDB ``read_parquet('<root>/query=q/**/*.parquet',
hive_partitioning=true)``)::

    <root>/query=<name>/date=YYYY-MM-DD/part-<batch_id:012d>.parquet
    <root>/_status.json
    <root>/_incomplete/query=<name>/date=YYYY-MM-DD/part-<batch_id:012d>.parquet   flagged short windows

File names depend only on the micro-batch id and the batch's rows, and each file is written to a
temporary name and renamed into place, so a micro-batch that Spark replays after a crash overwrites
exactly the files it wrote before: together with Spark's checkpointed offsets and state this makes the
output exactly once. Readers never see a half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import aggregates as A
from contract import condlang
from contract import fields as F
from contract import query as Q
from contract import results as R
from contract import status as S
from high_level.aggregate import holistic
from high_level.aggregate.packed import COMPLETENESS, GENERIC_SCHEMA, INCOMPLETE_KIND, unpack_incomplete

TS = R.TIMESTAMP
NS_PER_DAY = 86_400 * 1_000_000_000


def ip_strings(hi: np.ndarray, lo: np.ndarray) -> pa.Array:
    """Address words -> text; IPv4-mapped addresses (the common case) vectorised in Arrow.

    Each distinct address is formatted once (results repeat the same addresses across windows and
    keys, so formatting the distinct values and taking is several times cheaper than formatting all).
    """
    hi = np.asarray(hi, np.int64)
    lo = np.asarray(lo, np.int64)
    v4 = (hi == 0) & ((lo >> 32) == 0xFFFF)
    if v4.all():
        codes, uniq = pd.factorize(lo, sort=False)
        if len(uniq) < len(lo):
            return _v4_text(np.asarray(uniq, np.int64)).take(pa.array(codes))
        return _v4_text(lo)
    out = np.empty(len(lo), object)
    if v4.any():
        out[v4] = ip_strings(hi[v4], lo[v4]).to_numpy(zero_copy_only=False)
    rest = np.flatnonzero(~v4)
    pairs = np.column_stack([hi[rest], lo[rest]])
    uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
    text = np.array([F.words_to_ip(int(h), int(lw)) for h, lw in uniq], object)
    out[rest] = text[inv.ravel()]
    return pa.array(out, pa.string())


def _v4_text(lo: np.ndarray) -> pa.Array:
    a = lo & 0xFFFFFFFF
    octets = [pc.cast(pa.array((a >> s) & 0xFF), pa.string()) for s in (24, 16, 8, 0)]
    return pc.binary_join_element_wise(*octets, ".")


def generic_table(rows: pd.DataFrame | pa.Table) -> pa.Table:
    """Generic rows as an Arrow table (the stateful step's output schema)."""
    if isinstance(rows, pa.Table):
        return rows
    if len(rows) == 0:
        return GENERIC_SCHEMA.empty_table()
    return pa.Table.from_pandas(rows[list(GENERIC_SCHEMA.names)], schema=GENERIC_SCHEMA, preserve_index=False)


def _matrix(col: pa.ChunkedArray | pa.Array, n: int, width: int) -> np.ndarray:
    """A list<int64> column whose rows all have ``width`` values -> int64[n, width] (no per-row work)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    flat = arr.flatten().to_numpy(zero_copy_only=False)
    if flat.size != n * width:
        raise ValueError(f"expected {width} words per row, got {flat.size} values for {n} rows")
    return flat.astype(np.int64, copy=False).reshape(n, width)


def _rows_matrix(col: pa.ChunkedArray | pa.Array, rows: np.ndarray, width: int) -> np.ndarray:
    """int64[len(rows), width] of the list<int64> column's ``rows`` (each must hold ``width`` values);
    other rows may have any length (status rows, other queries). No per-row work."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    offs = np.asarray(arr.offsets.to_numpy(), np.int64)
    vals = np.asarray(arr.values.to_numpy(zero_copy_only=False), np.int64)
    start = offs[rows]
    if np.any(offs[rows + 1] - start != width):
        raise ValueError(f"expected {width} words per row")
    return vals[start[:, None] + np.arange(width)] if width else np.zeros((len(rows), 0), np.int64)


def _ints(col: pa.ChunkedArray | pa.Array, dtype: type = np.int64) -> np.ndarray:
    return np.asarray(col.to_numpy(), dtype=dtype)


def typed_table(q: Q.QuerySpec, rows: pd.DataFrame | pa.Table) -> pa.Table:
    """Generic rows (window_*_ns, key/state lists) of one query -> the query's typed columns."""
    rows = generic_table(rows)
    n = rows.num_rows
    return _typed(
        q,
        _ints(rows["window_start_ns"]),
        _ints(rows["window_end_ns"]),
        _matrix(rows["key"], n, Q.key_width(q)),
        _matrix(rows["state"], n, len(Q.state_columns(q))),
        _ints(rows["closed_at_ms"]),
        _ints(rows["hosts"], np.int32),
        rows["kind"].combine_chunks().cast(pa.string()),
        _ints(rows["hosts_expected"], np.int32),
        _completeness(rows, np.arange(n)),
    )


def _completeness(rows: pa.Table, sel: np.ndarray) -> np.ndarray:
    """int64[len(sel), 3] of the generic rows' COMPLETENESS columns (hosts_in_mark, late, missing)."""
    return (
        np.column_stack([_ints(rows[c])[sel] for c in COMPLETENESS])
        if len(sel)
        else np.zeros((0, 3), np.int64)
    )


def _typed(
    q: Q.QuerySpec,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    key: np.ndarray,
    state: np.ndarray,
    closed_at_ms: np.ndarray,
    hosts: np.ndarray,
    kind: pa.Array,
    hosts_expected: np.ndarray,
    comp: np.ndarray,
) -> pa.Table:
    values: dict[str, np.ndarray] | None = None
    subs: dict[str, pa.Array] = {}
    if Q.holistic(q) is not None:  # the second stage: sub-keys of each (window, kind, group) reduced
        kind_codes, _ = pd.factorize(np.asarray(kind.to_numpy(zero_copy_only=False), object), sort=True)
        red = holistic.reduce(
            q,
            start_ns,
            np.asarray(kind_codes, np.int64),
            key,
            state,
            hosts,
            hosts_expected,
            comp,
            closed_at_ms,
        )
        start_ns, end_ns, kind = start_ns[red.rows], end_ns[red.rows], kind.take(pa.array(red.rows))
        key, values, comp = red.key, red.values, red.comp
        hosts, hosts_expected, closed_at_ms = red.hosts, red.hosts_expected, red.closed_at_ms
        state = red.merged if red.merged is not None else state[red.rows]
        if R.subkey_columns(q):  # what the query's tiers merge: each row's sub-keys and their state
            offsets = pa.array(red.offsets, pa.int32())
            words = [red.sub[:, j] for j in range(red.sub.shape[1])] + [red.sub_state]
            subs = {
                c: pa.ListArray.from_arrays(offsets, pa.array(w, pa.int64()))
                for c, w in zip(R.subkey_columns(q), words, strict=True)
            }
    cols: dict[str, pa.Array] = {
        "window_start": pa.array(start_ns // 1000, TS),
        "window_end": pa.array(end_ns // 1000, TS),
    }
    i = 0
    for name, kk in R.key_columns(q):
        if kk == "ip":
            cols[name] = ip_strings(key[:, i], key[:, i + 1])
            i += 2
        else:
            cols[name] = pa.array(key[:, i], pa.int64())
            i += 1
    if values is None:  # bounded aggregates: their merged state finalized (contract.aggregates)
        values = A.finalize([(a.fn, a.name) for a in q.aggregates], state)
    for name, fn in R.aggregate_columns(q):
        cols[name] = pa.array(values[name], pa.float64() if fn in R.FLOAT_FNS else pa.int64())
    if R.raw_state_columns(q):  # what the tiers merge (variance, stddev: count, sum, sum of squares)
        at = {c.name: j for j, c in enumerate(Q.state_columns(q))}
        for col, _, _ in R.raw_state_columns(q):
            cols[col] = pa.array(state[:, at[col]], pa.int64())
    cols.update(subs)
    cols["closed_at"] = pa.array(closed_at_ms * 1000, TS)
    cols["hosts"] = pa.array(hosts, pa.int32())
    cols["hosts_expected"] = pa.array(hosts_expected, pa.int32())
    cols["hosts_in_mark"] = pa.array(comp[:, 0], pa.int32())
    cols["late_partials"] = pa.array(comp[:, 1], pa.int64())
    cols["missing_records"] = pa.array(comp[:, 2], pa.int64())
    # decided once, here, from the columns next to it (contract.results: what "complete" means)
    provisional = np.asarray(pc.equal(kind, "update").to_numpy(zero_copy_only=False), bool)
    cols["complete"] = pa.array(
        (comp[:, 0] == hosts_expected) & (comp[:, 1] == 0) & (comp[:, 2] == 0) & ~provisional
    )
    cols["kind"] = kind
    return pa.table(cols, schema=R.schema(q))


typed_columns = _typed  # the same typed columns for the live publisher (high_level/live/publish.py)


def _aggregate_columns(q: Q.QuerySpec, typed: pa.Table) -> dict[str, np.ndarray]:
    """The finalized aggregates of typed rows as numpy columns (what conditions are evaluated on), and
    the window totals the query's conditions read, over the final rows of each window (the sink hands
    a query with ``total()`` every final row of a window at once: high_level/results/windowtotal.py)."""
    cols = {
        n: np.asarray(typed[n].to_numpy(), np.float64 if fn in R.FLOAT_FNS else np.int64)
        for n, fn in R.aggregate_columns(q)
    }
    totals = Q.window_totals(q)
    if totals:
        start = np.asarray(typed["window_start"].combine_chunks().cast(pa.int64()).to_numpy(), np.int64)
        final = np.asarray(pc.equal(typed["kind"], "final").to_numpy(zero_copy_only=False), bool)
        for n, fn in totals.items():
            cols[condlang.total_column(n)] = A.window_total(fn, cols[n], start, final)
    return cols


def _json_value(v: object) -> object:
    return None if isinstance(v, float) and v != v else v


def alert_rows(q: Q.QuerySpec, rule: Q.AlertSpec, rows: pa.Table, keys: list[str]) -> pa.Table:
    """Fired (window, group) rows of one rule -> rows of :data:`contract.results.ALERT_SCHEMA`.

    Per fired row Python work (JSON texts): alerts are the rare rows, by definition of a threshold.
    """
    aggs = Q.result_names(q)
    d = rows.select(["window_start", "window_end", "closed_at", *keys, *aggs]).to_pydict()
    us = {c: rows[c].combine_chunks().cast(pa.int64()).to_pylist() for c in ("window_start", "window_end")}
    out: dict[str, list] = {f.name: [] for f in R.ALERT_SCHEMA}
    for i in range(rows.num_rows):
        group = {k: d[k][i] for k in keys}
        gtext = json.dumps(group, sort_keys=True, separators=(",", ":"))
        ws, we = d["window_start"][i], d["window_end"][i]
        labels = {
            **rule.labels,
            **{k: str(v) for k, v in group.items()},
            "alertname": rule.name,
            "severity": rule.severity,
            "query": q.name,
            "window_start": ws.isoformat().replace("+00:00", "Z"),
            "window_end": we.isoformat().replace("+00:00", "Z"),
        }
        values = {a: _json_value(d[a][i]) for a in aggs}
        out["id"].append(R.alert_id(q.name, rule.name, us["window_start"][i], gtext))
        out["query"].append(q.name)
        out["alert"].append(rule.name)
        out["severity"].append(rule.severity)
        out["window_start"].append(us["window_start"][i])
        out["window_end"].append(us["window_end"][i])
        out["closed_at"].append(d["closed_at"][i])
        out["group"].append(gtext)
        out["values"].append(json.dumps(values, sort_keys=True, separators=(",", ":")))
        out["labels"].append(json.dumps(labels, sort_keys=True, separators=(",", ":")))
        out["summary"].append(rule.summary or f"{q.name}: {rule.when} ({gtext})")
    out["window_start"] = pa.array(out["window_start"], pa.int64()).cast(TS)
    out["window_end"] = pa.array(out["window_end"], pa.int64()).cast(TS)
    return pa.table(out, schema=R.ALERT_SCHEMA)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResultStore:
    """Writes one micro-batch's closed windows as Parquet files and keeps ``_status.json`` current."""

    def __init__(self, root: str | Path, queries: Iterable[Q.QuerySpec]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.queries = {q.name: q for q in queries}
        for q in self.queries.values():
            R.check_names(q)
        self.status_path = R.status_path(self.root)
        self.on_written: list[Callable[[Q.QuerySpec, pa.Table], None]] = []
        self.having = {q.name: Q.condition(q, q.having) for q in self.queries.values() if q.having}
        self.alert_rules = {
            q.name: [(a, Q.condition(q, a.when)) for a in q.alerts] for q in self.queries.values() if q.alerts
        }
        self.having_dropped: dict[str, int] = {}  # final rows HAVING did not store, per query
        self.flagged: dict[tuple[str, str], int] = {}  # flagged-window rows written, per (query, cause)
        self.fired: list[pa.Table] = []

    def write_batch(self, batch_id: int, rows: pd.DataFrame | pa.Table) -> dict[str, int]:
        """Write the 'final'/'correction' rows of a batch, and its flagged windows (:meth:`write_incomplete`);
        returns rows written per query.

        Files are ``query=<q>/date=<day of window_start, UTC>/part-<batch_id>.parquet``; a replayed
        batch rewrites the same files with the same content.
        """
        written: dict[str, int] = {}
        if rows is None or len(rows) == 0:
            return written
        tbl = generic_table(rows)
        self.write_incomplete(batch_id, unpack_incomplete(tbl))
        # Work on row indices and numpy columns: filtering/sorting the table itself would move the
        # list columns and strings around once per step.
        kind = tbl["kind"].combine_chunks().cast(pa.string())
        not_data = pc.is_in(kind, pa.array(["status", INCOMPLETE_KIND]))
        is_data = ~np.asarray(not_data.to_numpy(zero_copy_only=False), bool)
        query = tbl["query"].combine_chunks().cast(pa.string())
        window = _ints(tbl["window"])
        # (window, kind) order with kind as text ('correction' < 'final'), stable like Table.sort_by
        kinds = pc.unique(kind).sort()
        kind_rank = np.asarray(pc.index_in(kind, value_set=kinds).to_numpy(zero_copy_only=False), np.int64)
        start_all, end_all = _ints(tbl["window_start_ns"]), _ints(tbl["window_end_ns"])
        closed_all, hosts_all = _ints(tbl["closed_at_ms"]), _ints(tbl["hosts"], np.int32)
        expected_all = _ints(tbl["hosts_expected"], np.int32)
        for name in sorted(pc.unique(pc.filter(query, pa.array(is_data))).to_pylist()):
            q = self.queries.get(str(name))
            if q is None:
                continue
            sel = np.flatnonzero(
                is_data & np.asarray(pc.equal(query, name).to_numpy(zero_copy_only=False), bool)
            )
            key = _rows_matrix(tbl["key"], sel, Q.key_width(q))
            state = _rows_matrix(tbl["state"], sel, len(Q.state_columns(q)))
            written[str(name)] = self.write_query(
                batch_id,
                q,
                window[sel],
                kind_rank[sel],
                kind.take(pa.array(sel)),
                start_all[sel],
                end_all[sel],
                key,
                state,
                closed_all[sel],
                hosts_all[sel],
                expected_all[sel],
                _completeness(tbl, sel),
            )
        return written

    def write_query(
        self,
        batch_id: int,
        q: Q.QuerySpec,
        window: np.ndarray,
        kind_rank: np.ndarray,
        kind: pa.Array,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        key: np.ndarray,
        state: np.ndarray,
        closed_at_ms: np.ndarray,
        hosts: np.ndarray,
        hosts_expected: np.ndarray,
        comp: np.ndarray,
    ) -> int:
        """Write one query's 'final'/'correction' rows of a batch given as numpy columns (one row per
        window and key; ``kind_rank`` orders kinds as their text does); returns the row count.

        Rows go out in (window, kind) order, stable, one file per day of window_start. Why numpy in:
        the OOP sink unpacks the stateful step's output straight into these columns, without building
        generic rows (list columns) first.
        """
        n = len(window)
        if n == 0:
            return 0
        if not (
            np.all(window[1:] >= window[:-1])
            and np.all((window[1:] > window[:-1]) | (kind_rank[1:] >= kind_rank[:-1]))
        ):
            order = np.lexsort((kind_rank, window))
            window, kind, key, state = window[order], kind.take(pa.array(order)), key[order], state[order]
            start_ns, end_ns, closed_at_ms, hosts = (
                start_ns[order],
                end_ns[order],
                closed_at_ms[order],
                hosts[order],
            )
            hosts_expected, comp = hosts_expected[order], comp[order]
        typed = _typed(q, start_ns, end_ns, key, state, closed_at_ms, hosts, kind, hosts_expected, comp)
        self._fire(q, typed)
        typed = self._having(batch_id, q, typed)
        if typed.num_rows == 0:
            return 0
        for (
            listener
        ) in self.on_written:  # e.g. the Prometheus exporter of results (high_level/results/export.py)
            listener(q, typed)
        start_us = np.asarray(typed["window_start"].combine_chunks().cast(pa.int64()).to_numpy(), np.int64)
        day = start_us // (NS_PER_DAY // 1000)
        if np.any(np.diff(day) < 0):
            raise AssertionError("window start not monotone in the window")
        # rows are sorted by window and window_start grows with the window: a day is a slice
        bounds = np.flatnonzero(np.r_[True, day[1:] != day[:-1], True])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            path = R.part_path(
                self.root, q.name, datetime.fromtimestamp(int(day[a]) * 86400, tz=UTC).date(), batch_id
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            pq.write_table(typed.slice(a, b - a), tmp, compression="zstd")
            os.replace(tmp, path)
        return typed.num_rows

    def _having(self, batch_id: int, q: Q.QuerySpec, typed: pa.Table) -> pa.Table:
        """Keep the final (and landmark update) rows that pass the query's HAVING and the corrections
        of stored finals only.

        Why corrections are judged by their final row: HAVING is decided once, when the window closes
        (as alerts are); a correction is a delta, not a window value, so it is kept exactly when its
        window and group were stored, which keeps every stored group's value exact after folding.
        A late correction never admits a group that did not pass at close.
        """
        cond = self.having.get(q.name)
        if cond is None or typed.num_rows == 0:
            return typed
        kind = typed["kind"]
        final = np.asarray(pc.equal(kind, "final").to_numpy(zero_copy_only=False), bool)
        # late rows (policy drop) are annotations of a final row: kept exactly as corrections are
        corr = np.asarray(
            pc.is_in(kind, pa.array(["correction", "late"])).to_numpy(zero_copy_only=False), bool
        )
        keep = ~corr & condlang.evaluate(
            cond, _aggregate_columns(q, typed), typed.num_rows
        )  # finals, updates
        if corr.any():
            keep |= corr & self._stored_finals(batch_id, q, typed, keep & final)
        self.having_dropped[q.name] = self.having_dropped.get(q.name, 0) + int(
            np.count_nonzero(final & ~keep)
        )
        return typed if keep.all() else typed.filter(pa.array(keep))

    def _stored_finals(self, batch_id: int, q: Q.QuerySpec, typed: pa.Table, kept: np.ndarray) -> np.ndarray:
        """bool per row: a final row of the same (window, group) is stored by an earlier batch (or kept
        in this one). Reads only the days the rows touch, and only files of earlier batches, so a
        replayed batch decides the same."""
        cols = ["window_start", *[n for n, _ in R.key_columns(q)]]
        days = sorted(
            set(
                (
                    np.asarray(typed["window_start"].combine_chunks().cast(pa.int64()).to_numpy(), np.int64)
                    // (NS_PER_DAY // 1000)
                ).tolist()
            )
        )
        found = [typed.filter(pa.array(kept)).select(cols)]
        for d in days:
            folder = R.date_dir(self.root, q.name, datetime.fromtimestamp(d * 86400, tz=UTC).date())
            if not folder.is_dir():
                continue
            named = {f.name: r for f in folder.iterdir() if (r := R.batch_range(f.name)) is not None}
            for name in R.visible_files(named):  # compacted files hold earlier batches' rows too
                if named[name][1] < batch_id:
                    t = pq.read_table(folder / name, columns=[*cols, "kind"])
                    found.append(t.filter(pc.equal(t["kind"], "final")).select(cols))
        known = pa.concat_tables(found).group_by(cols).aggregate([])
        probe = typed.select(cols).append_column("_row", pa.array(np.arange(typed.num_rows, dtype=np.int64)))
        joined = probe.join(known, cols, join_type="inner")
        out = np.zeros(typed.num_rows, bool)
        out[np.asarray(joined["_row"].to_numpy(), np.int64)] = True
        return out

    def _fire(self, q: Q.QuerySpec, typed: pa.Table) -> None:
        """Evaluate the query's alert rules on its final rows; fired rows wait in :attr:`fired` until
        :meth:`write_alerts` writes the batch's alert file."""
        rules = self.alert_rules.get(q.name)
        if not rules or typed.num_rows == 0:
            return
        final = np.asarray(pc.equal(typed["kind"], "final").to_numpy(zero_copy_only=False), bool)
        aggs = _aggregate_columns(q, typed)
        keys = [n for n, _ in R.key_columns(q)]
        for rule, cond in rules:
            rows = np.flatnonzero(final & condlang.evaluate(cond, aggs, typed.num_rows))
            if len(rows):
                self.fired.append(alert_rows(q, rule, typed.take(pa.array(rows)), keys))

    def write_alerts(self, batch_id: int) -> pa.Table:
        """Write the alerts fired while writing this batch (a file per query and batch, replaced on replay)."""
        fired, self.fired = self.fired, []
        if not fired:
            return R.ALERT_SCHEMA.empty_table()
        tbl = pa.concat_tables(fired)
        for name in sorted(set(tbl["query"].to_pylist())):
            path = R.alert_part_path(self.root, name, batch_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            pq.write_table(tbl.filter(pc.equal(tbl["query"], name)), tmp, compression="zstd")
            os.replace(tmp, path)
        return tbl

    def write_incomplete(self, batch_id: int, flagged: dict[str, list[tuple[int, list]]]) -> int:
        """Write the batch's flagged windows (:data:`contract.results.INCOMPLETE_SCHEMA`), a file per query
        and day of window_start, replaced on replay; returns the rows written. ``flagged``: per query,
        (partition, window) as :func:`high_level.aggregate.packed.unpack_incomplete` gives them."""
        total = 0
        for name in sorted(flagged):
            if name not in self.queries or not flagged[name]:
                continue
            rows = sorted(flagged[name], key=lambda pw: (pw[1][0], pw[0], pw[1][2], pw[1][5], pw[1][6]))
            cols = list(zip(*[w for _, w in rows], strict=True))
            us = [np.asarray(cols[c], np.int64) // 1000 for c in (0, 1, 2, 3)]
            tbl = pa.table(
                {
                    "window_start": pa.array(us[0], TS),
                    "window_end": pa.array(us[1], TS),
                    "flagged_at": pa.array(np.asarray(cols[8], np.int64) * 1000, TS),
                    "partition": pa.array([p for p, _ in rows], pa.int32()),
                    "host": pa.array(cols[5], pa.string()),
                    "cause": pa.array(cols[6], pa.string()),
                    "first_pane_start": pa.array(us[2], TS),
                    "last_pane_end": pa.array(us[3], TS),
                    "records": pa.array(cols[4], pa.int64()),
                    "after_close": pa.array(cols[7], pa.bool_()),
                },
                schema=R.INCOMPLETE_SCHEMA,
            )
            day = us[0] // (NS_PER_DAY // 1000)
            for d in np.unique(day).tolist():
                path = R.incomplete_part_path(
                    self.root, name, datetime.fromtimestamp(d * 86400, tz=UTC).date(), batch_id
                )
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                pq.write_table(tbl.filter(pa.array(day == d)), tmp, compression="zstd")
                os.replace(tmp, path)
            total += tbl.num_rows
            for cause in R.INCOMPLETE_CAUSES:
                n = sum(1 for w in cols[6] if w == cause)
                if n:
                    self.flagged[(name, cause)] = self.flagged.get((name, cause), 0) + n
        return total

    def expire(self, today: date, days: int | None) -> list[Path]:
        """Delete the result files of windows that started more than the query's raw retention (its
        ``retention: {raw: ...}``, else ``days``) before ``today`` (UTC), a whole ``date=`` directory at a
        time; returns the directories removed. Tiers expire in high_level/results/compact.py.

        Readers index files by directory and tolerate files that vanish between listing and reading.
        """
        gone = []
        for name in sorted(self.queries):
            keep = R.retention_ns(self.queries[name], R.RAW_TIER, days)
            if keep is None:
                continue
            cutoff = today - timedelta(microseconds=keep // 1000)
            for day, d in [*R.date_dirs(self.root, name), *R.incomplete_date_dirs(self.root, name)]:
                if day < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
                    gone.append(d)
        return gone

    def size_bytes(self) -> int:
        """Bytes of every file under the store (results, alerts, status)."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.stat(os.path.join(dirpath, f)).st_size
                except FileNotFoundError:
                    continue
        return total

    def write_status(self, doc: S.StatusDocument) -> None:
        """Replace ``_status.json`` atomically (write + rename) with a document of the status contract."""
        _atomic_write_bytes(self.status_path, doc.model_dump_json(indent=1).encode())
