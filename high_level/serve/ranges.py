"""The API's requests over long ranges: a series per step, the top groups over a range, from raw windows
or a roll-up tier (which one: :mod:`high_level.serve.tierpick`), and the billing percentile's method.

Why their own module: these read per-file partial results that they cache (a stepped series' per-window
summaries, a top's per-group sums), computed once per immutable store file, so a month costs a combine
over files rather than a scan of their rows; :mod:`high_level.serve.reader` serves windows as stored.
The SQL pieces are :mod:`high_level.serve.sql`'s; the layout of tier files :mod:`contract.results`'s.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from contract import aggregates as A
from contract import results as R
from high_level.serve import sql as S
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import FileStats, StoreError
from high_level.serve.params import KeyFilter
from high_level.serve.reader import Reader, ResultSet, retry_once
from high_level.serve.tierfiles import TierFiles
from high_level.serve.timefmt import us_of


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


def _answer_cached(method: Callable[..., ResultSet]) -> Callable[..., ResultSet]:
    """A range request (``qi, start, end, filters, *more, tier``) answered from the reader's cache when
    the same request reads the same files (:meth:`RangeReader._answer`)."""

    @functools.wraps(method)
    def wrapper(
        self: RangeReader, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter], *more: Any
    ) -> ResultSet:
        flt = tuple((f.column, f.op, repr(f.value)) for f in filters)
        key = (method.__name__, qi.name, us_of(start), us_of(end), flt, *more)
        stamps = self._stamps(qi, more[-1], start, end)
        return self._answer((*key, stamps), lambda: method(self, qi, start, end, filters, *more))

    return wrapper


class RangeReader:
    """Stepped series and range top-N over a :class:`Reader`'s store (its DuckDB, file index and cache
    budget), with the tier files' listing and the per-file partials' caches."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.db = reader.db
        self.index = reader.index
        self.cache = reader.cache
        self.tiers = TierFiles(reader.root)
        self._partials: dict[tuple, pa.Table] = {}  # per-file per-window partial summaries (insertion order)
        self._partials_lock = threading.Lock()
        self._tops: dict[tuple, tuple[int, int, pa.Table]] = {}  # per-file group sums (range_top)
        self._tops_bytes = 0
        self.max_partials = 20_000
        # whole answers, keyed by the request and the (path, size, mtime) of every file it reads: store
        # files are immutable, so the same files give the same answer; a new batch or tier file is a miss
        self._answers: OrderedDict[tuple, ResultSet] = OrderedDict()
        self.max_answers = 256
        self.max_answer_rows = 10_000

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

    def _stamps(self, qi: QueryInfo, tier: str, start: datetime, end: datetime) -> tuple:
        """What a range request over [start, end) reads: every file's (path, size, mtime)."""
        s_us, e_us = us_of(start), us_of(end)
        if tier != R.RAW_TIER:
            return tuple((p, *self.tiers.stamp(p)) for p in self.tiers.files(qi.spec, tier, s_us, e_us))
        return tuple((f.path, f.size, f.mtime_ns) for f in self.index.files_for(qi.spec, s_us, e_us))

    def _answer(self, key: tuple, compute: Callable[[], ResultSet]) -> ResultSet:
        """The cached answer of a request over the same files, else ``compute()`` (then kept, if small)."""
        with self._partials_lock:
            got = self._answers.get(key)
            if got is not None:
                self._answers.move_to_end(key)
                return got
        rs = compute()
        if len(rs.rows) <= self.max_answer_rows and self.cache.max_bytes > 0:
            with self._partials_lock:
                self._answers[key] = rs
                while len(self._answers) > self.max_answers:
                    self._answers.popitem(last=False)
        return rs

    @_answer_cached
    @retry_once
    def range_top(
        self,
        qi: QueryInfo,
        start: datetime,
        end: datetime,
        filters: list[KeyFilter],
        by: str,
        n: int,
        tier: str,
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
                S.parquet_source(qi, tier_paths, ["windows"])
                if tier_paths
                else self.reader._source(cur, qi, files)
            )
            params = {**src.params, "start": start, "end": end, "n": n}
            rows_sql = S.scan(src, filters, params)
            group = f" GROUP BY {', '.join(keys)}" if keys else ""
            sql = (
                f"SELECT {', '.join([*keys, *sums])}, {windows}"
                f" FROM {rows_sql} WHERE kind IN ('final', 'correction'){group}"
                f" ORDER BY sum({S.q(by)}) DESC NULLS LAST{''.join(', ' + k for k in keys)} LIMIT $n"
            )
            rows = [(*r, i) for i, r in enumerate(Reader._exec(cur, sql, params), 1)]
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

    @_answer_cached
    @retry_once
    def series(
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
