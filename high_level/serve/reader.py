"""Read-only access to the results store with DuckDB.

Layout (written by the high-level job): ``<results>/query=<name>/date=YYYY-MM-DD/part-<batch>.parquet``
with columns window_start, window_end, the key columns, the aggregate columns, closed_at, hosts and
kind ('final' | 'correction'; a correction adds to the final row of the same window and key).

Why a file index: a dataset of days of one-file-per-batch parts has thousands of files, and letting
DuckDB glob and open all of them per request costs far more than the query itself. The index keeps,
per file (keyed by path, size and mtime, so a rewritten file is re-read), the window_start range from
the Parquet footer statistics; a request then hands DuckDB only the files whose range overlaps the
asked window range (date directories outside the range are not even listed). Files whose footer
cannot be read (still being written) are skipped until they change.

Corrections are folded into finals per (window, key): count/sum add, min/max take min/max; avg is
recomputed exactly as the count-weighted mean when the query also has a ``count`` aggregate (avg and
count both count the group's packets), or from ``<avg>.sum``/``<avg>.count`` state columns if the
store carries them; otherwise the final row's avg is kept and corrections do not change it
(``avg_exact`` is false in :meth:`QueryInfo.describe`).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from contract.query import QuerySpec
from high_level.serve.params import KeyFilter, OrderTerm

_PART = re.compile(r"^part-(\d+)")
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0.001}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class StoreError(RuntimeError):
    """The results store could not be read (not the user's fault): the API answers 503."""


def q(ident: str) -> str:
    """Quote an identifier that was already validated against the query's known columns."""
    return '"' + ident.replace('"', '""') + '"'


def us_of(t: datetime) -> int:
    """Aware datetime -> microseconds since the epoch (exact, no float)."""
    d = t - EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def iso_of_us(us: int) -> str:
    """Microseconds since the epoch -> ISO-8601 UTC text with 'Z' (milliseconds only when needed)."""
    t = EPOCH + timedelta(microseconds=us)
    if us % 1_000_000 == 0:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    if us % 1000 == 0:
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- what the API knows about a query's result columns
_AGG_SQL_TYPE = {"count": "BIGINT", "sum": "BIGINT", "min": "BIGINT", "max": "BIGINT", "avg": "DOUBLE"}


@dataclass(frozen=True)
class QueryInfo:
    """A query's result columns, derived from the contract's QuerySpec (the only source of names)."""

    spec: QuerySpec
    keys: tuple[tuple[str, str], ...]  # (column, 'ip' | 'int')
    aggs: tuple[tuple[str, str], ...]  # (column, fn)

    @classmethod
    def of(cls, spec: QuerySpec) -> QueryInfo:
        keys = tuple((p.name, "ip" if p.field.kind == "ip" else "int") for p in spec.key_parts)
        return cls(spec, keys, tuple((a.name, a.fn) for a in spec.aggregates))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def key_names(self) -> list[str]:
        return [k for k, _ in self.keys]

    @property
    def key_kinds(self) -> dict[str, str]:
        return dict(self.keys)

    @property
    def agg_names(self) -> list[str]:
        return [a for a, _ in self.aggs]

    @property
    def count_col(self) -> str | None:
        """The first count aggregate: the weight that lets avg be folded exactly."""
        return next((a for a, fn in self.aggs if fn == "count"), None)

    @property
    def order_columns(self) -> list[str]:
        return ["window_start", "window_end", *self.agg_names, *self.key_names]

    @property
    def output_columns(self) -> list[str]:
        return ["window_start", "window_end", *self.key_names, *self.agg_names, "hosts", "closed_at", "corrections"]


# --- the per-file statistics index
@dataclass(frozen=True)
class FileStats:
    path: str
    batch: int
    min_us: int | None  # window_start range from the footer; None = unknown (always read)
    max_us: int | None
    columns: frozenset[str]
    kinds: frozenset[str] | None  # {'final'} etc. when the footer says so; None = unknown


def _int_stat(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, datetime):
        return us_of(v if v.tzinfo else v.replace(tzinfo=UTC))
    return None


def read_stats(path: str) -> FileStats | None:
    """Footer of one Parquet file -> its window_start range and columns; None if unreadable or unusable."""
    try:
        md = pq.read_metadata(path)
        schema = md.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, ValueError):
        return None
    names = frozenset(schema.names)
    if "window_start" not in names or md.num_rows == 0:
        return None
    m = _PART.match(os.path.basename(path))
    batch = int(m.group(1)) if m else -1
    ws_type = schema.field("window_start").type
    scale = _UNIT_US.get(getattr(ws_type, "unit", ""), None) if pa.types.is_timestamp(ws_type) else None
    ws_i = kind_i = None
    for i in range(md.num_columns):
        p = md.schema.column(i).path
        if p == "window_start":
            ws_i = i
        elif p == "kind":
            kind_i = i
    lo = hi = None
    kinds: set[str] | None = set() if kind_i is not None else {"final"}
    for rg in range(md.num_row_groups):
        rgm = md.row_group(rg)
        st = rgm.column(ws_i).statistics if ws_i is not None else None
        a = _int_stat(st.min_raw) if st is not None and st.has_min_max else None
        b = _int_stat(st.max_raw) if st is not None and st.has_min_max else None
        if a is None or b is None or scale is None:
            lo = hi = None
            scale = None
        else:
            a, b = int(a * scale), int(b * scale)
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        if kind_i is not None and kinds is not None:
            ks = rgm.column(kind_i).statistics
            if ks is None or not ks.has_min_max or ks.null_count:
                kinds = None
            else:
                kinds.update({str(ks.min), str(ks.max)})
    if scale is None:
        lo = hi = None
    return FileStats(path, batch, lo, hi, names, frozenset(kinds) if kinds is not None else None)


class FileIndex:
    """Per-file footer statistics, cached by (path, size, mtime) so only new or changed files are read."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, tuple[int, int, FileStats | None]] = {}
        self._lock = threading.Lock()

    def date_dirs(self, query: str) -> list[tuple[date | None, str]]:
        """(date or None if the name is not a date, path) of a query's partitions, oldest first."""
        base = self.root / f"query={query}"
        out: list[tuple[date | None, str]] = []
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {base}: {exc.strerror}") from None
        for e in entries:
            if not e.is_dir() or e.name.startswith((".", "_")):
                continue
            m = _DATE_DIR.match(e.name)
            d = None
            if m:
                try:
                    d = date.fromisoformat(m.group(1))
                except ValueError:
                    d = None
            out.append((d, e.path))
        out.sort(key=lambda x: (x[0] or date.min, x[1]))
        return out

    def files_in(self, dirs: list[str]) -> list[FileStats]:
        """The readable Parquet parts in these directories (tmp/hidden files skipped)."""
        out: list[FileStats] = []
        for d in dirs:
            try:
                entries = list(os.scandir(d))
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot list {d}: {exc.strerror}") from None
            for e in entries:
                if e.name.startswith((".", "_")) or not e.name.endswith(".parquet"):
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                got = self._cache.get(e.path)
                if got is None or got[0] != st.st_size or got[1] != st.st_mtime_ns:
                    stats = read_stats(e.path)
                    with self._lock:
                        self._cache[e.path] = (st.st_size, st.st_mtime_ns, stats)
                    got = self._cache[e.path]
                if got[2] is not None:
                    out.append(got[2])
        return out

    def files_for(self, query: str, start_us: int, end_us: int) -> list[FileStats]:
        """Files that may hold windows with window_start in [start_us, end_us)."""
        first = (EPOCH + timedelta(microseconds=start_us)).date() - timedelta(days=1)
        last = (EPOCH + timedelta(microseconds=end_us)).date() + timedelta(days=1)
        dirs = [p for d, p in self.date_dirs(query) if d is None or first <= d <= last]
        return [
            f for f in self.files_in(dirs)
            if f.min_us is None or f.max_us is None or (f.max_us >= start_us and f.min_us < end_us)
        ]


# --- SQL
_MACROS = [
    # dotted IPv4 text -> integer (NULL for anything else); used for prefixes not on octet boundaries
    """CREATE OR REPLACE MACRO lw_ip4num(s) AS
         CASE WHEN regexp_full_match(s, '[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}') THEN
           (TRY_CAST(split_part(s, '.', 1) AS BIGINT) << 24) + (TRY_CAST(split_part(s, '.', 2) AS BIGINT) << 16)
           + (TRY_CAST(split_part(s, '.', 3) AS BIGINT) << 8) + TRY_CAST(split_part(s, '.', 4) AS BIGINT)
         END""",
    # IPv6 text (any '::' compression) -> 32 lower-case hex digits, comparable as a string
    """CREATE OR REPLACE MACRO lw_hex_groups(part) AS
         array_to_string(list_transform(list_filter(string_split(part, ':'), lambda g: g <> ''),
                                        lambda g: lpad(lower(g), 4, '0')), '')""",
    """CREATE OR REPLACE MACRO lw_ip6hex(s) AS
         CASE WHEN NOT contains(s, '::') THEN lw_hex_groups(s)
              ELSE lw_hex_groups(split_part(s, '::', 1))
                   || repeat('0', greatest(0, 32 - length(lw_hex_groups(split_part(s, '::', 1)))
                                              - length(lw_hex_groups(split_part(s, '::', 2)))))
                   || lw_hex_groups(split_part(s, '::', 2))
         END""",
]


@dataclass
class ResultSet:
    """Rows of one request plus what paging needs; timestamps are microseconds since the epoch."""

    columns: list[str]
    rows: list[tuple]
    total: int
    time_columns: frozenset[str]


class Reader:
    """DuckDB over the results store; one in-memory database, one cursor per request (thread-safe)."""

    def __init__(self, root: str | Path, threads: int | None = None) -> None:
        self.root = Path(root)
        self.index = FileIndex(self.root)
        config: dict[str, Any] = {}
        if threads:
            config["threads"] = threads
        self.db = duckdb.connect(":memory:", config=config)
        self.db.execute("SET GLOBAL TimeZone = 'UTC'")
        self.db.execute("SET GLOBAL parquet_metadata_cache = true")
        for m in _MACROS:
            self.db.execute(m)

    def close(self) -> None:
        self.db.close()

    # ---- building blocks
    @staticmethod
    def _filter_sql(filters: list[KeyFilter], params: dict[str, Any]) -> list[str]:
        """AND across columns, OR between several filters on the same column."""
        by_col: dict[str, list[str]] = {}
        for i, f in enumerate(filters):
            c = q(f.column)
            if f.op == "eq":
                params[f"f{i}"] = f.value
                cond = f"{c} = $f{i}"
            elif f.op == "v4prefix":
                params[f"f{i}"] = f.value
                cond = f"starts_with({c}, $f{i})"
            elif f.op == "v4range":
                lo, hi = f.value  # type: ignore[misc]
                params[f"f{i}a"], params[f"f{i}b"] = lo, hi
                cond = f"(NOT contains({c}, ':') AND lw_ip4num({c}) BETWEEN $f{i}a AND $f{i}b)"
            elif f.op == "v6range":
                lo, hi = f.value  # type: ignore[misc]
                params[f"f{i}a"], params[f"f{i}b"] = lo, hi
                cond = f"(contains({c}, ':') AND lw_ip6hex({c}) BETWEEN $f{i}a AND $f{i}b)"
            elif f.op == "v4all":
                cond = f"({c} IS NOT NULL AND NOT contains({c}, ':'))"
            elif f.op == "v6all":
                cond = f"contains({c}, ':')"
            else:  # pragma: no cover - params only produces the ops above
                raise ValueError(f.op)
            by_col.setdefault(f.column, []).append(cond)
        return ["(" + " OR ".join(cs) + ")" for cs in by_col.values()]

    def _folded_sql(self, qi: QueryInfo, files: list[FileStats], filters: list[KeyFilter],
                    params: dict[str, Any]) -> str:  # fmt: skip
        """SQL of the (window, key) rows in [$start, $end) with corrections folded into finals."""
        avail: set[str] = set().union(*(f.columns for f in files))

        def col(name: str, typ: str) -> str:
            return q(name) if name in avail else f"CAST(NULL AS {typ}) AS {q(name)}"

        keys = [q(k) for k in qi.key_names]
        src = ["window_start", col("window_end", "TIMESTAMPTZ")]
        src += [col(k, "VARCHAR" if kind == "ip" else "BIGINT") for k, kind in qi.keys]
        src += [col(a, _AGG_SQL_TYPE[fn]) for a, fn in qi.aggs]
        src += [col("hosts", "INTEGER"), col("closed_at", "TIMESTAMPTZ")]
        src.append("coalesce(kind, 'final') AS kind" if "kind" in avail else "'final' AS kind")
        state_avg = [
            a for a, fn in qi.aggs
            if fn == "avg" and qi.count_col is None and f"{a}.sum" in avail and f"{a}.count" in avail
        ]
        for a in state_avg:
            src += [q(f"{a}.sum"), q(f"{a}.count")]
        where = ["window_start >= $start", "window_start < $end", *self._filter_sql(filters, params)]
        params["files"] = [f.path for f in files]

        fin = "kind <> 'correction'"
        # no correction rows in any chosen file (known from footer stats): no need to group at all
        no_corr = all(f.kinds is not None and "correction" not in f.kinds for f in files)
        out = ["window_start", "window_end" if no_corr else "max(window_end) AS window_end", *keys]
        w = q(qi.count_col) if qi.count_col else None
        for a, fn in qi.aggs:
            c = q(a)
            if no_corr:
                out.append(f"CASE WHEN isfinite({c}) THEN {c} END AS {c}" if fn == "avg" else c)
            elif fn in ("count", "sum"):
                out.append(f"sum({c}) AS {c}")
            elif fn in ("min", "max"):
                out.append(f"{fn}({c}) AS {c}")
            elif w is not None:
                ok = f"{w} > 0 AND isfinite({c})"
                out.append(f"sum(CASE WHEN {ok} THEN {c} * {w} ELSE 0 END)"
                           f" / nullif(sum(CASE WHEN {ok} THEN {w} ELSE 0 END), 0) AS {c}")  # fmt: skip
            elif a in state_avg:
                s, n = q(f"{a}.sum"), q(f"{a}.count")
                final = f"max(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin})"
                out.append(f"coalesce(sum({s}) / nullif(sum({n}), 0), {final}) AS {c}")
            else:
                out.append(f"max(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin}) AS {c}")
        src_sql = (f"SELECT {', '.join(src)} FROM read_parquet($files, hive_partitioning = true,"
                   f" union_by_name = true) WHERE {' AND '.join(where)}")  # fmt: skip
        if no_corr:
            out += ["hosts", "closed_at", "0 AS corrections"]
            return f"WITH src AS ({src_sql}) SELECT {', '.join(out)} FROM src"
        out += [
            f"coalesce(max(hosts) FILTER (WHERE {fin}), max(hosts)) AS hosts",
            f"coalesce(max(closed_at) FILTER (WHERE {fin}), max(closed_at)) AS closed_at",
            "count(*) FILTER (WHERE kind = 'correction') AS corrections",
        ]
        group = ", ".join(["window_start", *keys])
        return f"WITH src AS ({src_sql}) SELECT {', '.join(out)} FROM src GROUP BY {group}"

    def _run(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        cur = self.db.cursor()
        try:
            return cur.execute(sql, params).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()

    # ---- requests
    def results(self, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter],
                order: list[OrderTerm], top: int | None, limit: int, offset: int) -> ResultSet:  # fmt: skip
        """Folded rows of windows with window_start in [start, end), optionally top-N per window, one page.

        Ordering: without ``top`` the rows are sorted by ``order`` (then window_start and the keys, so
        pages are stable). With ``top`` the first aggregate in ``order`` (default: the query's first
        aggregate, descending) ranks the groups of each window; rows come grouped by window
        (window_start ascending unless ``order`` says ``-window_start``) in rank order, with a ``rank`` column.
        """
        s_us, e_us = us_of(start), us_of(end)
        files = self.index.files_for(qi.name, s_us, e_us)
        columns = list(qi.output_columns) + (["rank"] if top else [])
        times = frozenset({"window_start", "window_end", "closed_at"})
        if not files:
            return ResultSet(columns, [], 0, times)
        params: dict[str, Any] = {"start": start, "end": end}
        folded = self._folded_sql(qi, files, filters, params)
        keys = [q(k) for k in qi.key_names]
        aggs = set(qi.agg_names)
        if top:
            rank_term = next((t for t in order if t.column in aggs), OrderTerm(qi.agg_names[0], True))
            rc = q(rank_term.column)
            rdir = "DESC NULLS LAST" if rank_term.descending else "ASC NULLS LAST"
            ws_desc = any(t.column == "window_start" and t.descending for t in order)
            params["top"] = top
            body = (f"SELECT *, row_number() OVER (PARTITION BY window_start ORDER BY {rc} {rdir}"
                    f"{''.join(', ' + k for k in keys)}) AS rank FROM folded QUALIFY rank <= $top")  # fmt: skip
            order_sql = [f"window_start {'DESC' if ws_desc else 'ASC'}", "rank"]
        else:
            body = "SELECT * FROM folded"
            order_sql = [f"{q(t.column)} {'DESC' if t.descending else 'ASC'} NULLS LAST" for t in order]
            order_sql += ["window_start", *keys]
        sel = ["epoch_us(window_start)", "epoch_us(window_end)", *keys, *[q(a) for a in qi.agg_names],
               "hosts", "epoch_us(closed_at)", "corrections"]  # fmt: skip
        if top:
            sel.append("rank")
        params["limit"], params["offset"] = limit, offset
        sql = (f"WITH folded AS ({folded}), body AS ({body})"
               f" SELECT {', '.join(sel)}, count(*) OVER () AS __total FROM body"
               f" ORDER BY {', '.join(order_sql)} LIMIT $limit OFFSET $offset")  # fmt: skip
        rows = self._run(sql, params)
        if rows:
            total = int(rows[0][-1])
            rows = [r[:-1] for r in rows]
        elif offset:
            params.pop("limit"), params.pop("offset")
            total = int(self._run(f"WITH folded AS ({folded}), body AS ({body}) SELECT count(*) FROM body", params)[0][0])
        else:
            total = 0
        return ResultSet(columns, rows, total, times)

    def series(self, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter]) -> ResultSet:
        """Per window over all (filtered) groups: the number of groups and each aggregate's total.

        count/sum are summed, min/max take the min/max; avg is the count-weighted mean when the query
        has a count aggregate, else the plain mean of the groups' averages.
        """
        s_us, e_us = us_of(start), us_of(end)
        files = self.index.files_for(qi.name, s_us, e_us)
        columns = ["window_start", "window_end", "groups", *qi.agg_names]
        times = frozenset({"window_start", "window_end"})
        if not files:
            return ResultSet(columns, [], 0, times)
        params: dict[str, Any] = {"start": start, "end": end}
        folded = self._folded_sql(qi, files, filters, params)
        w = q(qi.count_col) if qi.count_col else None
        sel = ["epoch_us(window_start)", "epoch_us(max(window_end))", "count(*)"]
        for a, fn in qi.aggs:
            c = q(a)
            if fn in ("count", "sum"):
                sel.append(f"sum({c})")
            elif fn in ("min", "max"):
                sel.append(f"{fn}({c})")
            elif w is not None:
                sel.append(f"sum(CASE WHEN {w} > 0 AND isfinite({c}) THEN {c} * {w} END) / nullif(sum(CASE WHEN {w} > 0 AND isfinite({c}) THEN {w} END), 0)")
            else:
                sel.append(f"avg(CASE WHEN isfinite({c}) THEN {c} END)")
        sql = f"WITH folded AS ({folded}) SELECT {', '.join(sel)} FROM folded GROUP BY window_start ORDER BY window_start"
        rows = self._run(sql, params)
        return ResultSet(columns, rows, len(rows), times)

    def latest_window(self, qi: QueryInfo) -> datetime | None:
        """window_start of the newest window that has a final row (None if the store has none).

        The footer statistics give the newest window_start of every file; the query then only reads
        the files whose range reaches that far back (minus a few slides, in case the newest rows there
        are corrections only), and falls back to the newest date directories if that finds nothing.
        """
        dirs = self.index.date_dirs(qi.name)
        if not dirs:
            return None
        slide_us = qi.spec.window.slide // 1000
        for take in (2, len(dirs)):
            files = self.index.files_in([p for _, p in dirs[-take:]])
            if not files:
                continue
            known = [f.max_us for f in files if f.max_us is not None]
            newest = max(known) if known else None
            attempts = []
            if newest is not None:
                floor = newest - 16 * max(slide_us, 1)
                attempts.append([f for f in files if f.max_us is None or f.max_us >= floor])
            attempts.append(files)
            for cand in attempts:
                avail = set().union(*(f.columns for f in cand))
                where = "WHERE coalesce(kind, 'final') <> 'correction'" if "kind" in avail else ""
                rows = self._run(
                    "SELECT epoch_us(max(window_start)) FROM read_parquet($files, hive_partitioning = true,"
                    f" union_by_name = true) {where}", {"files": [f.path for f in cand]})  # fmt: skip
                if rows and rows[0][0] is not None:
                    return EPOCH + timedelta(microseconds=int(rows[0][0]))
        return None

