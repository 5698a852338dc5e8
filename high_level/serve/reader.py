"""Read-only access to the results store with DuckDB: the requests of the API.

Layout, file names and column schema are :mod:`contract.results`'s; which files a request reads is
:mod:`high_level.serve.fileindex`'s (footer statistics; files that break the layout are rejected);
decoded files are kept by :mod:`high_level.serve.tablecache`; the SQL text is :mod:`high_level.serve.sql`'s.

Corrections are folded into finals per (window, key): count/sum add, min/max take min/max; avg is
recomputed exactly as the count-weighted mean when the query also has a ``count`` aggregate (avg and
count both count the group's packets); otherwise the final row's avg is kept and corrections do not
change it (``avg_exact`` is false in /queries).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contract import aggregates as A
from contract import results as R
from high_level.serve import sql as S
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import FileIndex, FileStats, StoreError
from high_level.serve.params import KeyFilter, OrderTerm
from high_level.serve.tablecache import Prepared, TableCache, add_ip_words, load_table
from high_level.serve.timefmt import EPOCH, us_of

T = TypeVar("T")


def _corrections(files: list[FileStats]) -> bool:
    """Whether any of the files may hold correction or late rows (the footers' min/max kinds say which
    hold finals only; any other pair of kinds may hide a late row between them)."""
    return any(f.kinds is None or bool(f.kinds - {"final"}) for f in files)


def retry_once(fn: Callable[..., T]) -> Callable[..., T]:
    """A file can vanish or change between listing and reading (retention, a rewrite): on a store
    error, list the directories again and retry once before reporting it."""

    @functools.wraps(fn)
    def wrapper(self: Reader, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(self, *args, **kwargs)
        except StoreError:
            self.index.forget()
            return fn(self, *args, **kwargs)

    return wrapper


@dataclass
class ResultSet:
    """Rows of one request plus what paging needs; timestamps are microseconds since the epoch."""

    columns: list[str]
    rows: list[tuple]
    total: int
    time_columns: frozenset[str]
    next_key: list | None = None  # cursor paging: the sort key of this page's last row, when more follow


def sort_terms(qi: QueryInfo, order: list[OrderTerm]) -> list[tuple[str, bool]]:
    """The full row order of /results without top: the ordered columns, then window_start and the keys
    (each once), so every row has a distinct sort key (one row per window and key)."""
    out: list[tuple[str, bool]] = []
    for col, desc in [(t.column, t.descending) for t in order] + [
        (c, False) for c in ("window_start", *qi.key_names)
    ]:
        if col not in (c for c, _ in out):
            out.append((col, desc))
    return out


def sort_key(qi: QueryInfo, order: list[OrderTerm], row: tuple) -> list:
    """The sort key of one /results row (as :meth:`Reader.results` selects it) for a cursor."""
    pos = {c: i for i, c in enumerate(qi.output_columns)}
    return [row[pos[c]] for c, _ in sort_terms(qi, order)]


class Reader:
    """DuckDB over the results store; one in-memory database, one cursor per request (thread-safe).

    A request's files come from the footer index. When their size fits the cache budget they are
    scanned from the Arrow cache, where each file is prepared once with ``_wkh`` (hash of window and
    key, so matching corrections to finals compares one integer instead of the key strings) and
    ``_rank`` (rank of the final rows of each window of that file by the query's first aggregate,
    descending, ties by key). The top-N of a window lies within the per-file top-N of the files that
    hold it (plus the groups that have corrections): for the default top-N request a window held by
    one file and without corrections needs no query at all (a slice of that file), and the others
    hand DuckDB only those candidate rows. Larger requests read the Parquet files directly.
    """

    def __init__(self, root: str | Path, cache_mb: int = 512, threads: int | None = None) -> None:
        self.root = Path(root)
        self.index = FileIndex(self.root)
        self.cache = TableCache(cache_mb * 1024 * 1024)
        config: dict[str, Any] = {}
        if threads:
            config["threads"] = threads
        self.db = duckdb.connect(":memory:", config=config)
        self.db.execute("SET GLOBAL TimeZone = 'UTC'")
        self.db.execute("SET GLOBAL parquet_metadata_cache = true")
        for m in S.MACROS:
            self.db.execute(m)

    def close(self) -> None:
        self.db.close()

    # ---- sources
    def _prepare(self, qi: QueryInfo, path: str) -> Prepared:
        """Load one file and add ``_wkh`` and ``_rank`` (see the class docstring)."""
        table = add_ip_words(load_table(qi, path), [k for k, kind in qi.keys if kind == "ip"])
        keys = "".join(", " + S.q(k) for k in qi.key_names)
        cur = self.db.cursor()
        try:
            cur.register("lw_t", table)
            out = cur.sql(
                f"SELECT *, {S.key_hash(qi)} AS _wkh, CASE WHEN kind = 'final' THEN row_number() OVER"
                f" (PARTITION BY window_start, kind = 'final' ORDER BY {S.rank_value(qi)} DESC NULLS LAST"
                f"{keys}) END AS _rank FROM lw_t ORDER BY _rank NULLS LAST, window_start"
            ).to_arrow_table()
            return Prepared.of(out)
        finally:
            cur.close()

    def _cached(self, qi: QueryInfo, f: FileStats) -> Prepared | None:
        return self.cache.get(f, lambda path: self._prepare(qi, path))

    def _fits(self, files: list[FileStats]) -> bool:
        return sum(f.size for f in files) * 4 <= self.cache.max_bytes // 2

    def _source(self, cur: duckdb.DuckDBPyConnection, qi: QueryInfo, files: list[FileStats]) -> S.Source:
        """Register the request's rows as ``lw_src`` from the cache, or describe a read_parquet subquery."""
        if self._fits(files):
            prepared = [p for f in files if (p := self._cached(qi, f)) is not None]
            if prepared:
                cur.register("lw_src", pa.concat_tables([p.table for p in prepared]))
                return S.Source("lw_src", {}, True)
        return S.parquet_source(qi, [f.path for f in files])

    @staticmethod
    def _exec(cur: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[tuple]:
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        try:
            return cur.execute(sql, used).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None

    def _fast_top(
        self,
        qi: QueryInfo,
        files: list[FileStats],
        start: datetime,
        end: datetime,
        n: int,
        ws_desc: bool,
        limit: int,
        offset: int,
        sel: list[str],
    ) -> tuple[list[tuple], int] | None:
        """Top-n per window by the first aggregate (no filters) from the prepared cache; None: not cached.

        A window whose finals are all in one file and that has no corrections needs no query at all:
        its top-n are that file's rows with ``_rank <= n`` and ``_rank`` is the rank. The other
        windows go through DuckDB, fed only their candidates: per file the finals ranked within
        n + (most corrections of one window), the finals of corrected groups, and the corrections.
        The two sorted streams are merged by (window, rank).
        """
        if not self._fits(files):
            return None
        prepared = [p for f in files if (p := self._cached(qi, f)) is not None]
        s_us, e_us = us_of(start), us_of(end)
        corr = pa.concat_tables([p.corr for p in prepared]) if prepared else None
        if corr is not None and corr.num_rows:
            cws = corr.column("window_start").cast(pa.int64()).to_numpy()
            keep = (cws >= s_us) & (cws < e_us)
            corr, cws = corr.filter(pa.array(keep)), cws[keep]
        else:
            cws = np.empty(0, np.int64)
        cw, cw_counts = np.unique(cws, return_counts=True)
        held = np.concatenate([p.final_windows for p in prepared]) if prepared else np.empty(0, np.int64)
        held = held[(held >= s_us) & (held < e_us)]
        uw, owners = np.unique(held, return_counts=True)
        is_simple = (owners == 1) & ~np.isin(uw, cw)
        simple_w, complex_w = uw[is_simple], np.union1d(uw[~is_simple], cw)
        simple_set, complex_set = set(simple_w.tolist()), set(complex_w.tolist())
        need = offset + limit
        ts_type = pa.timestamp("us", tz="UTC")

        parts = []
        for p in prepared:
            mine = [w for w in p.final_windows.tolist() if w in simple_set]
            if not mine:
                continue
            head = p.table.slice(0, int(np.searchsorted(p.ranks, n, side="right")))
            if len(mine) != len(p.final_windows):
                head = head.filter(
                    pc.is_in(head.column("window_start"), value_set=pa.array(mine).cast(ts_type))
                )
            parts.append(head)
        simple_rows: list[tuple] = []
        n_simple = 0
        if parts:
            t = pa.concat_tables(parts)
            n_simple = t.num_rows
            t = t.sort_by(
                [("window_start", "descending" if ws_desc else "ascending"), ("_rank", "ascending")]
            )
            t = t.slice(0, need)
            cols = [
                t.column("window_start").cast(pa.int64()).to_pylist(),
                t.column("window_end").cast(pa.int64()).to_pylist(),
            ]
            cols += [t.column(c).to_pylist() for c in (*qi.key_names, *qi.agg_names, "hosts")]
            cols += [t.column("closed_at").cast(pa.int64()).to_pylist(), [0] * t.num_rows]
            cols += [t.column(c).to_pylist() for c in S.COMPLETENESS] + [t.column("_rank").to_pylist()]
            simple_rows = list(zip(*cols, strict=True))

        complex_rows: list[tuple] = []
        n_complex = 0
        if len(complex_w):
            per_window = dict(zip(cw.tolist(), cw_counts.tolist(), strict=True))
            corrected = (
                np.unique(corr.column("_wkh").to_numpy()) if corr is not None and corr.num_rows else None
            )
            value_set = pa.array(complex_w).cast(ts_type)
            cand = []
            for p in prepared:
                mine = [w for w in p.final_windows.tolist() if w in complex_set]
                if mine:  # a corrected group can push at most one other group per correction row down
                    rows = p.top_rows(n + max(per_window.get(w, 0) for w in mine), corrected)
                    if len(mine) != len(p.final_windows):
                        rows = rows.filter(pc.is_in(rows.column("window_start"), value_set=value_set))
                    cand.append(rows)
            if corr is not None:
                cand.append(corr)
            cur = self.db.cursor()
            try:
                cur.register("lw_src", pa.concat_tables(cand))
                params: dict[str, Any] = {"start": start, "end": end, "limit": need}
                src = S.Source("lw_src", {}, True)
                rows = S.scan(src, [], params)
                with_ = S.ranked_sql(
                    qi, src, rows, OrderTerm(qi.agg_names[0], True), n, False, _corrections(files)
                )
                got = self._exec(
                    cur,
                    f"{with_} SELECT {', '.join(sel)}, rank, count(*) OVER () FROM ranked"
                    f" ORDER BY window_start {'DESC' if ws_desc else 'ASC'}, rank LIMIT $limit",
                    params,
                )
            finally:
                cur.close()
            if got:
                n_complex = int(got[0][-1])
                complex_rows = [r[:-1] for r in got]
        if complex_rows and simple_rows:
            sign = -1 if ws_desc else 1
            simple_rows = sorted(simple_rows + complex_rows, key=lambda r: (sign * r[0], r[-1]))
        return (simple_rows or complex_rows)[offset:need], n_simple + n_complex

    # ---- requests
    @retry_once
    def results(
        self,
        qi: QueryInfo,
        start: datetime,
        end: datetime,
        filters: list[KeyFilter],
        order: list[OrderTerm],
        top: int | None,
        limit: int,
        offset: int,
        complete: bool | None = None,
        after: list | None = None,
    ) -> ResultSet:
        """Folded rows of windows with window_start in [start, end), optionally top-N per window, one page.

        Ordering: without ``top`` the rows are sorted by ``order`` (then window_start and the keys, so
        pages are stable). With ``top`` the first aggregate in ``order`` (default: the query's first
        aggregate, descending) ranks the groups of each window, ties broken by the key columns; rows
        come grouped by window (ascending unless ``order`` says ``-window_start``) in rank order, with
        a ``rank`` column. ``complete``: only complete (True) or incomplete (False) rows, decided
        after folding (a late row makes its group incomplete); with ``top`` the groups are ranked
        among those rows. ``after`` (cursor paging, without ``top``): the sort key of the previous page's
        last row (:func:`sort_key`); the page starts after it, and ``next_key`` is set when more follow.
        """
        files = self.index.files_for(qi.spec, us_of(start), us_of(end))
        columns = list(qi.output_columns) + (["rank"] if top else [])
        times = frozenset({"window_start", "window_end", "closed_at"})
        if not files:
            return ResultSet(columns, [], 0, times)
        keys = [S.q(k) for k in qi.key_names]
        sel = [
            "epoch_us(window_start)",
            "epoch_us(window_end)",
            *keys,
            *[S.q(a) for a in qi.agg_names],
            "hosts",
            "epoch_us(closed_at)",
            "corrections",
            *S.COMPLETENESS,
        ]
        aggs = set(qi.agg_names)
        default = OrderTerm(qi.agg_names[0], True)
        term = next((t for t in order if t.column in aggs), default)
        ws_desc = any(t.column == "window_start" and t.descending for t in order)
        if top and not filters and term == default and complete is None:
            got = self._fast_top(qi, files, start, end, int(top), ws_desc, limit, offset, sel)
            if got is not None:
                return ResultSet(columns, got[0], got[1], times)
        cur = self.db.cursor()
        try:
            src = self._source(cur, qi, files)
            params = {**src.params, "start": start, "end": end, "limit": limit, "offset": offset}
            rows_sql = S.scan(src, filters, params)
            if top:
                with_ = S.ranked_sql(
                    qi, src, rows_sql, term, int(top), True, _corrections(files), complete, params
                )
                sql = (
                    f"{with_} SELECT {', '.join(sel)}, rank, count(*) OVER () FROM ranked"
                    f" ORDER BY window_start {'DESC' if ws_desc else 'ASC'}, rank LIMIT $limit OFFSET $offset"
                )
                count_sql = f"{with_} SELECT count(*) FROM ranked"
            else:
                ctes, folded = S.folded(qi, src, rows_sql, _corrections(files))
                folded = S.only_complete(folded, complete, params)
                order_sql = [f"{S.q(t.column)} {'DESC' if t.descending else 'ASC'} NULLS LAST" for t in order]
                order_sql += ["window_start", *keys]
                page = folded
                if after is not None:
                    params["limit"] = limit + 1  # one more row says whether another page follows
                    page = (
                        f"(SELECT * FROM {folded} WHERE {S.after_sql(sort_terms(qi, order), after, params)})"
                    )
                sql = (
                    f"WITH _ AS (SELECT 1){ctes} SELECT {', '.join(sel)}, NULL FROM {page}"
                    f" ORDER BY {', '.join(order_sql)} LIMIT $limit OFFSET $offset"
                )
                count_sql = f"WITH _ AS (SELECT 1){ctes} SELECT count(*) FROM {folded}"
            rows = self._exec(cur, sql, params)
            if after is not None:
                more = len(rows) > limit
                rows = rows[:limit]
                total = int(self._exec(cur, count_sql, params)[0][0])
                nxt = sort_key(qi, order, rows[-1]) if more else None
                return ResultSet(columns, [r[:-1] for r in rows], total, times, nxt)
            if top and rows:
                total = int(rows[0][-1])
            elif len(rows) < limit and (rows or not offset):
                total = offset + len(rows)
            else:
                total = int(self._exec(cur, count_sql, params)[0][0])
        finally:
            cur.close()
        rows = [r[:-1] for r in rows]
        nxt = None
        if not top and rows and offset + len(rows) < total:
            nxt = sort_key(qi, order, rows[-1])
        return ResultSet(columns, rows, total, times, nxt)

    @retry_once
    def series(
        self,
        qi: QueryInfo,
        start: datetime,
        end: datetime,
        filters: list[KeyFilter],
        complete: bool | None = None,
    ) -> ResultSet:
        """Per window over all (filtered) groups: the number of groups and each aggregate's total
        (per step over long ranges: :mod:`high_level.serve.ranges`).

        Totals need no per-group folding, so this is one pass over finals and corrections together:
        count/sum add up, min/max take the min/max, avg is the count-weighted mean when the query has a
        count aggregate (exact, corrections included), else the plain mean of the final rows' averages.
        ``groups`` counts the groups that have a final row. Late rows add nothing to the totals. A
        window is ``complete`` when every final and late row of it is (``complete`` filters on that);
        ``incomplete_groups`` counts its groups that are not, ``hosts_in_mark`` is the smallest and
        ``hosts_expected`` the largest over its rows (Kafka partitions), ``missing_records`` the largest.

        """
        files = self.index.files_for(qi.spec, us_of(start), us_of(end))
        marks = [c for c in R.COMPLETENESS_COLUMNS if c != "complete"]  # hosts_expected .. missing_records
        columns = [
            "window_start",
            "window_end",
            "groups",
            *qi.agg_names,
            "complete",
            "incomplete_groups",
            *marks,
        ]
        times = frozenset({"window_start", "window_end"})
        if not files:
            return ResultSet(columns, [], 0, times)
        w = S.q(qi.count_col) if qi.count_col else None
        fin = "kind = 'final'"
        sel = ["epoch_us(window_start)", "epoch_us(max(window_end))", f"count(*) FILTER (WHERE {fin})"]
        sel += [S.fold(A.RESULT_KINDS[fn].summary, a, w) for a, fn in qi.aggs]
        judged = "kind IN ('final', 'late')"
        done = f"coalesce(bool_and(complete) FILTER (WHERE {judged}), false)"
        sel += [
            done,
            f"count(DISTINCT {S.key_hash(qi)}) FILTER (WHERE {judged} AND NOT complete)",
            "max(hosts_expected)",
            f"min(hosts_in_mark) FILTER (WHERE {fin})",
            "CAST(sum(late_partials) AS BIGINT)",
            f"max(missing_records) FILTER (WHERE {fin})",
        ]
        cur = self.db.cursor()
        try:
            src = self._source(cur, qi, files)
            params = {**src.params, "start": start, "end": end, "s_us": us_of(start)}
            having = ""
            if complete is not None:
                params["complete"] = complete
                having = f" HAVING {done} = $complete"
            sql = (
                f"SELECT {', '.join(sel)} FROM {S.scan(src, filters, params)}"
                f" GROUP BY window_start{having} ORDER BY window_start"
            )
            rows = self._exec(cur, sql, params)
        finally:
            cur.close()
        return ResultSet(columns, rows, len(rows), times)

    @retry_once
    def latest_window(self, qi: QueryInfo) -> datetime | None:
        """window_start of the newest window that has a final row (None if the store has none).

        The footer statistics give the newest window_start of every file; only the files whose range
        reaches that far back (minus a few slides, in case the newest rows there are corrections only)
        are read, falling back to every file of the newest date directories if that finds nothing.
        """
        dirs = self.index.date_dirs(qi.name)
        slide_us = max(1, qi.spec.window.slide // 1000)
        for take in (2, len(dirs)):
            files = self.index.files_in(qi.spec, [p for _, p in dirs[-take:]])
            if not files:
                continue
            known = [f.max_us for f in files if f.max_us is not None]
            attempts = []
            if known:
                floor = max(known) - 16 * slide_us
                attempts.append([f for f in files if f.max_us is None or f.max_us >= floor])
            attempts.append(files)
            for cand in attempts:
                cur = self.db.cursor()
                try:
                    src = self._source(cur, qi, cand)
                    rows = self._exec(
                        cur,
                        f"SELECT epoch_us(max(window_start)) FROM {src.rel} WHERE kind = 'final'",
                        src.params,
                    )
                finally:
                    cur.close()
                if rows and rows[0][0] is not None:
                    return EPOCH + timedelta(microseconds=int(rows[0][0]))
        return None

    def warm(self, qi: QueryInfo, span: timedelta, stop: threading.Event | None = None) -> int:
        """Prepare the newest ``span`` of a query in the cache (so the first page view is fast)."""
        dirs = self.index.date_dirs(qi.name)
        files = self.index.files_in(qi.spec, [p for _, p in dirs[-2:]])
        newest = max((f.max_us for f in files if f.max_us is not None), default=None)
        if newest is not None:
            files = [
                f for f in files if f.max_us is None or f.max_us >= newest - int(span.total_seconds() * 1e6)
            ]
        if not self._fits(files):
            return 0
        done = 0
        for f in files:
            if stop is not None and stop.is_set():
                break
            done += self._cached(qi, f) is not None
        return done
