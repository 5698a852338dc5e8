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
from high_level.serve.tierfiles import TierFiles
from high_level.serve.timefmt import EPOCH, us_of

T = TypeVar("T")


def _corrections(files: list[FileStats]) -> bool:
    """Whether any of the files may hold correction or late rows (the footers' min/max kinds say which
    hold finals only; any other pair of kinds may hide a late row between them)."""
    return any(f.kinds is None or bool(f.kinds - {"final"}) for f in files)


def _retry_once(fn: Callable[..., T]) -> Callable[..., T]:
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


@dataclass(frozen=True)
class StepPercentile:
    value: int | None  # None: the range has no step
    at_us: int | None  # the start of a step holding that value (the first such)
    steps: int
    empty: int  # steps without rows (counted as 0)
    max: int | None


def nearest_rank_over_steps(
    totals: dict[int, int], start_us: int, end_us: int, step_us: int, p: float
) -> StepPercentile:
    """Billing-style percentile: every step of [start, end) is one sample (a step without rows is 0),
    and the p-th percentile is the nearest rank: the ceil(p/100 * N)-th smallest sample (no
    interpolation, so the value is one a step actually had; numpy's ``method='inverted_cdf'``)."""
    starts = np.arange(start_us, end_us, step_us, dtype=np.int64)
    if not len(starts):
        return StepPercentile(None, None, 0, 0, None)
    vals = np.array([totals.get(int(b), 0) for b in starts], dtype=np.int64)
    rank = max(1, int(np.ceil(p / 100 * len(vals) - 1e-9)))
    v = int(np.sort(vals, kind="stable")[rank - 1])
    at = int(starts[int(np.argmax(vals == v))])
    empty = len(vals) - sum(1 for b in starts.tolist() if b in totals)
    return StepPercentile(v, at, len(vals), empty, int(vals.max()))


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
        self.tiers = TierFiles(self.root)
        self._partials: dict[
            tuple, pa.Table
        ] = {}  # per-file per-window partial summaries (insertion order: LRU-ish)
        self._partials_lock = threading.Lock()
        self._tops: dict[tuple, tuple[int, int, pa.Table]] = {}  # per-file group sums (range_top)
        self._tops_bytes = 0
        self.max_partials = 20_000
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
    @_retry_once
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

    @_retry_once
    def series(
        self,
        qi: QueryInfo,
        start: datetime,
        end: datetime,
        filters: list[KeyFilter],
        complete: bool | None = None,
        step_us: int | None = None,
        tier: str = R.RAW_TIER,
    ) -> ResultSet:
        """Per window (or per ``step_us`` bucket: :meth:`_stepped_series`) over all (filtered) groups: the
        number of groups and each aggregate's total.

        Totals need no per-group folding, so this is one pass over finals and corrections together:
        count/sum add up, min/max take the min/max, avg is the count-weighted mean when the query has a
        count aggregate (exact, corrections included), else the plain mean of the final rows' averages.
        ``groups`` counts the groups that have a final row. Late rows add nothing to the totals. A
        window is ``complete`` when every final and late row of it is (``complete`` filters on that);
        ``incomplete_groups`` counts its groups that are not, ``hosts_in_mark`` is the smallest and
        ``hosts_expected`` the largest over its rows (Kafka partitions), ``missing_records`` the largest.

        """
        if step_us:
            return self._stepped_series(qi, start, end, filters, step_us, tier)
        files = self.index.files_for(qi.spec, us_of(start), us_of(end))
        tier_paths: list[str] = []
        columns = [
            "window_start",
            "window_end",
            "groups",
            *qi.agg_names,
            "complete",
            "incomplete_groups",
            "hosts_expected",
            "hosts_in_mark",
            "late_partials",
            "missing_records",
        ]
        times = frozenset({"window_start", "window_end"})
        if not files and not tier_paths:
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
            src = S.parquet_source(qi, tier_paths) if tier_paths else self._source(cur, qi, files)
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

    @_retry_once
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

    def warm_tiers(self, qi: QueryInfo, stop: threading.Event | None = None) -> int:
        """Compute the per-file partials of the query's tier files, newest first (so the first stepped
        series over months does not read every tier file while a user waits)."""
        done = 0
        for tier in reversed(qi.spec.tier_names):
            for p in reversed(self.tiers.files(qi.spec, tier, 0, 1 << 62)):
                if stop is not None and stop.is_set() or done >= self.max_partials // 2:
                    return done
                self._file_partials(qi, p, (p, *self.tiers.stamp(p)), None)
                done += 1
        return done

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

    @_retry_once
    def range_top(
        self,
        qi: QueryInfo,
        start: datetime,
        end: datetime,
        filters: list[KeyFilter],
        by: str,
        n: int,
        tier: str = R.RAW_TIER,
    ) -> ResultSet:
        """The ``n`` groups with the largest sum of the additive column ``by`` over every window in
        [start, end), with the sums of every additive aggregate and the number of windows each group
        has a row in. Exact: a count or sum folds by adding, so summing finals and corrections over the
        range is the same as folding per window, then summing (late rows add nothing). Ties by key.
        ``tier``: sum that roll-up tier's rows instead (the same sums; ``windows`` from their counts)."""
        adds = [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]
        columns = [*qi.key_names, *adds, "windows", "rank"]
        files: list[FileStats] = []
        if tier != R.RAW_TIER:
            tier_paths = self.tiers.files(qi.spec, tier, us_of(start), us_of(end))
            if not tier_paths:
                return ResultSet(columns, [], 0, frozenset())
            windows = 'CAST(sum("windows") AS BIGINT)'
        else:
            tier_paths = []
            files = self.index.files_for(qi.spec, us_of(start), us_of(end))
            if not files:
                return ResultSet(columns, [], 0, frozenset())
            windows = "count(DISTINCT window_start) FILTER (WHERE kind = 'final')"
        keys = [S.q(k) for k in qi.key_names]
        sums = [f"CAST(sum({S.q(a)}) AS BIGINT) AS {S.q(a)}" for a in adds]
        if not filters and keys and self.cache.max_bytes > 0:
            keyed = (
                [(p, (p, *self.tiers.stamp(p))) for p in tier_paths]
                if tier_paths
                else [(f.path, (f.path, f.size, f.mtime_ns)) for f in files]
            )
            rows = self._top_from_partials(qi, keyed, bool(tier_paths), start, end, by, n, adds, windows)
            return ResultSet(columns, rows, len(rows), frozenset())
        cur = self.db.cursor()
        try:
            src = (
                S.parquet_source(qi, tier_paths, ["windows"]) if tier_paths else self._source(cur, qi, files)
            )
            params = {**src.params, "start": start, "end": end, "n": n}
            rows_sql = S.scan(src, filters, params)
            group = f" GROUP BY {', '.join(keys)}" if keys else ""
            sql = (
                f"SELECT {', '.join([*keys, *sums])}, {windows}"
                f" FROM {rows_sql} WHERE kind IN ('final', 'correction'){group}"
                f" ORDER BY sum({S.q(by)}) DESC NULLS LAST{''.join(', ' + k for k in keys)} LIMIT $n"
            )
            rows = [(*r, i) for i, r in enumerate(self._exec(cur, sql, params), 1)]
        finally:
            cur.close()
        return ResultSet(columns, rows, len(rows), frozenset())

    def _top_partial(
        self, qi: QueryInfo, path: str, tier: bool, windows: str, where: str = "", params: dict | None = None
    ) -> pa.Table:
        """One file's rows summed per group (finals and corrections), with a 128-bit key hash (two
        independent 64-bit hashes) that the range's combine groups by."""
        keys = ", ".join(S.q(k) for k in qi.key_names)
        adds = [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]
        src = S.parquet_source(qi, [path], ["windows"] if tier else None)
        sql = (
            f"SELECT hash({keys}) AS _h1, hash({keys}, 'lw') AS _h2, {keys}, "
            + "".join(f"CAST(sum({S.q(a)}) AS BIGINT) AS {S.q(a)}, " for a in adds)
            + f"{windows} AS windows FROM {src.rel} WHERE kind IN ('final', 'correction'){where} GROUP BY {keys}"
        )
        cur = self.db.cursor()
        try:
            return cur.sql(sql, params={**src.params, **(params or {})}).to_arrow_table()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()

    def _file_top(
        self, qi: QueryInfo, path: str, key: tuple, tier: bool, windows: str
    ) -> tuple[int, int, pa.Table]:
        """A file's per-group sums and the window_start range it holds, cached per (path, size, mtime)
        within half the cache budget."""
        got = self._tops.get(key)
        if got is not None:
            return got
        table = self._top_partial(qi, path, tier, windows)
        cur = self.db.cursor()
        try:
            src = S.parquet_source(qi, [path])
            lo, hi = cur.sql(
                f"SELECT epoch_us(min(window_start)), epoch_us(max(window_start)) FROM {src.rel}",
                params=src.params,
            ).fetchall()[0]
        finally:
            cur.close()
        entry = (-1 if lo is None else int(lo), -1 if hi is None else int(hi), table)
        with self._partials_lock:
            self._tops[key] = entry
            self._tops_bytes += table.nbytes
            while self._tops_bytes > self.cache.max_bytes // 2 and self._tops:
                self._tops_bytes -= self._tops.pop(next(iter(self._tops)))[2].nbytes
        return entry

    def _top_from_partials(
        self,
        qi: QueryInfo,
        keyed: list[tuple[str, tuple]],
        tier: bool,
        start: datetime,
        end: datetime,
        by: str,
        n: int,
        adds: list[str],
        windows: str,
    ) -> list[tuple]:
        """Top-n over a range from per-file group sums: a file wholly inside the range contributes its
        cached sums, one straddling it is summed over the range's windows now. The n-th largest sum
        over the 128-bit key hashes bounds the candidates, whose real keys are then grouped and ranked
        (ties by key), so the answer is the same as grouping every row by its key."""
        s_us, e_us = us_of(start), us_of(end)
        parts = []
        for path, key in keyed:
            lo, hi, table = self._file_top(qi, path, key, tier, windows)
            if lo < 0:
                continue
            if s_us <= lo and hi < e_us:
                parts.append(table)
            elif hi >= s_us and lo < e_us:
                parts.append(
                    self._top_partial(
                        qi,
                        path,
                        tier,
                        windows,
                        " AND window_start >= $start AND window_start < $end",
                        {"start": start, "end": end},
                    )
                )
        if not parts:
            return []
        keys = [S.q(k) for k in qi.key_names]
        v = S.q(by)
        cur = self.db.cursor()
        try:
            cur.register("lw_top", pa.concat_tables(parts, promote_options="permissive"))
            sql = (
                f"WITH g AS (SELECT _h1, _h2, sum({v}) AS v FROM lw_top GROUP BY _h1, _h2),"
                f" t AS (SELECT v FROM g ORDER BY v DESC NULLS LAST LIMIT 1 OFFSET {int(n) - 1}),"
                " c AS (SELECT _h1, _h2 FROM g WHERE NOT EXISTS (SELECT 1 FROM t) OR v >= (SELECT v FROM t))"
                f" SELECT {', '.join(keys)}, "
                + "".join(f"CAST(sum({S.q(a)}) AS BIGINT), " for a in adds)
                + f"CAST(sum(windows) AS BIGINT) FROM lw_top SEMI JOIN c USING (_h1, _h2) GROUP BY {', '.join(keys)}"
                f" ORDER BY sum({v}) DESC NULLS LAST, {', '.join(keys)} LIMIT {int(n)}"
            )
            got = cur.sql(sql).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()
        return [(*r, i) for i, r in enumerate(got, 1)]

    # ---- stepped series: per-window partial summaries, cached per immutable file, combined per step
    def _partials_sql(self, qi: QueryInfo) -> list[str]:
        """Per window: partial summaries that combine across files and windows (sum, min, max, and a
        weighted mean's numerator and denominator), then the completeness partials."""
        w = S.q(qi.count_col) if qi.count_col else None
        fin = "kind = 'final'"
        sel = ["epoch_us(window_start) AS ws"]
        for i, (a, fn) in enumerate(qi.aggs):
            c, total = S.q(a), A.RESULT_KINDS[fn].total
            if total in ("sum", "min", "max"):
                sel += [f"{total}({c}) FILTER (WHERE {S.VALUE_ROWS}) AS p{i}a", f"NULL::DOUBLE AS p{i}b"]
            elif w is not None:  # the count-weighted mean, as the per-window summary
                ok = f"{w} > 0 AND isfinite({c}) AND {S.VALUE_ROWS}"
                sel += [
                    f"sum(CASE WHEN {ok} THEN {c} * {w} END) AS p{i}a",
                    f"sum(CASE WHEN {ok} THEN {w} END)::DOUBLE AS p{i}b",
                ]
            else:  # the plain mean of the final rows' values
                v = f"CASE WHEN isfinite({c}) THEN {c} END"
                sel += [
                    f"sum({v}) FILTER (WHERE {fin}) AS p{i}a",
                    f"count({v}) FILTER (WHERE {fin})::DOUBLE AS p{i}b",
                ]
        return [
            *sel,
            "bool_and(complete) FILTER (WHERE kind IN ('final', 'late')) AS done",
            "max(hosts_expected) AS he",
            f"min(hosts_in_mark) FILTER (WHERE {fin}) AS him",
            "CAST(sum(late_partials) AS BIGINT) AS late",
            f"max(missing_records) FILTER (WHERE {fin}) AS miss",
        ]

    def _file_partials(self, qi: QueryInfo, path: str, key: tuple, extra: list[str] | None) -> pa.Table:
        """The per-window partials of one file, computed once per (path, size, mtime): store files
        are immutable once written (a rewrite or a merged file changes the key)."""
        got = self._partials.get(key)
        if got is not None:
            return got
        cur = self.db.cursor()
        try:
            src = S.parquet_source(qi, [path], extra)
            table = cur.sql(
                f"SELECT {', '.join(self._partials_sql(qi))} FROM {src.rel} GROUP BY window_start",
                params=src.params,
            ).to_arrow_table()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()
        with self._partials_lock:
            self._partials[key] = table
            while len(self._partials) > self.max_partials:
                self._partials.pop(next(iter(self._partials)))
        return table

    @_retry_once
    def _stepped_series(
        self, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter], step_us: int, tier: str
    ) -> ResultSet:
        """Per bucket of ``step_us`` (aligned to ``start``) over all (filtered) groups: count/sum add over
        its windows, min/max fold, avg is the count-weighted mean of the bucket (exact; corrections in,
        late rows out); a bucket is ``complete`` when every row of it is. Groups are not counted per
        step: distinct groups do not add up across windows or tier files (/top counts them over a
        range). ``tier``: read that roll-up tier's files instead of raw windows (same sums, exact).

        Without filters every file's per-window partials are computed once and cached, so a month of
        hourly tier files costs a combine over ~N windows x files rows, not a scan of the rows."""
        columns = ["window_start", "window_end", *qi.agg_names, "complete"]
        columns += ["hosts_expected", "hosts_in_mark", "late_partials", "missing_records"]
        times = frozenset({"window_start", "window_end"})
        s_us, e_us = us_of(start), us_of(end)
        if tier != R.RAW_TIER:
            paths = self.tiers.files(qi.spec, tier, s_us, e_us)
            keyed = [(p, (p, *self.tiers.stamp(p))) for p in paths]
        else:
            stats = self.index.files_for(qi.spec, s_us, e_us)
            keyed = [(f.path, (f.path, f.size, f.mtime_ns)) for f in stats]
        if not keyed:
            return ResultSet(columns, [], 0, times)
        cur = self.db.cursor()
        try:
            if filters:
                src = S.parquet_source(qi, [p for p, _ in keyed])
                params = {**src.params, "start": start, "end": end}
                sql = f"SELECT {', '.join(self._partials_sql(qi))} FROM {S.scan(src, filters, params)} GROUP BY window_start"
                parts = cur.sql(
                    sql, params={k: v for k, v in params.items() if f"${k}" in sql}
                ).to_arrow_table()
            else:
                parts = pa.concat_tables([self._file_partials(qi, p, k, None) for p, k in keyed])
            cur.register("lw_part", parts)
            sel = ["_b", f"_b + {int(step_us)}"]
            for i, (_, fn) in enumerate(qi.aggs):
                total = A.RESULT_KINDS[fn].total
                if total in ("sum", "min", "max"):
                    cast = (
                        "CAST(sum(p{0}a) AS BIGINT)"
                        if total == "sum" and not A.RESULT_KINDS[fn].float
                        else "{1}(p{0}a)"
                    )
                    sel.append(cast.format(i, total))
                else:
                    sel.append(f"sum(p{i}a) / nullif(sum(p{i}b), 0)")
            sel += [
                "coalesce(bool_and(done), false)",
                "max(he)",
                "min(him)",
                "CAST(sum(late) AS BIGINT)",
                "max(miss)",
            ]
            rows = cur.execute(
                f"SELECT {', '.join(sel)} FROM (SELECT *, ws - (ws - $s) % $step AS _b FROM lw_part"
                " WHERE ws >= $s AND ws < $e) GROUP BY _b ORDER BY _b",
                {"s": s_us, "e": e_us, "step": int(step_us)},
            ).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()
        return ResultSet(columns, rows, len(rows), times)
