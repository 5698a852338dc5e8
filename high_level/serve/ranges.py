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
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import aggregates as A
from contract import results as R
from high_level.serve import sql as S
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import StoreError
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


class GroupIds:
    """Dense integer ids of one query's group keys, so a range top adds per-file sums into arrays
    instead of grouping every row by its key per request. A key is its parts as text (null apart),
    joined by a separator no key part holds (addresses and integers); ids grow as files are read and
    start over (a new ``generation``) past ``max_groups``."""

    max_groups = 5_000_000

    def __init__(self, key_names: list[str]) -> None:
        self.key_names = key_names
        self.generation = 0
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._index = pd.Index([], dtype=object)
        self._keys: list[pa.Table] = []
        self._n = 0

    @staticmethod
    def tokens(keys: pa.Table) -> np.ndarray:
        parts = []
        for c in keys.columns:
            text = pc.cast(c, pa.string())
            parts.append(pc.if_else(pc.is_null(text), "\x00", pc.binary_join_element_wise("v", text, "")))
        joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x00\x1f")
        return np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object)

    def ids(self, keys: pa.Table) -> tuple[int, np.ndarray]:
        """(generation, the id of each row's key); new keys get new ids. Rows hold distinct keys."""
        tok = self.tokens(keys)
        with self._lock:
            got = self._index.get_indexer(tok)
            new = np.flatnonzero(got < 0)
            if len(new):
                got[new] = np.arange(self._n, self._n + len(new))
                self._n += len(new)
                self._index = self._index.append(pd.Index(tok[new], dtype=object))
                self._keys.append(keys.take(pa.array(new)))
            return self.generation, got.astype(np.int64)

    def trim(self) -> None:
        """Start new ids (a new generation) once past ``max_groups``; called before a request only, so
        one request's sums are of one generation unless another request trims meanwhile."""
        with self._lock:
            if self._n > self.max_groups:
                self._reset()
                self.generation += 1

    def keys_of(self, ids: np.ndarray) -> pa.Table:
        """The key columns of ``ids`` (of the current generation)."""
        with self._lock:
            table = pa.concat_tables(self._keys) if self._keys else None
        if table is None:
            return pa.table({k: pa.array([], pa.string()) for k in self.key_names})
        return table.take(pa.array(ids))


@dataclass(frozen=True)
class FileSums:
    """One file's rows summed per group: group ids, the additive columns' sums, windows per group,
    and the window_start range of the file (lo < 0: empty)."""

    lo: int
    hi: int
    generation: int
    ids: np.ndarray
    sums: dict[str, np.ndarray]
    windows: np.ndarray

    @classmethod
    def of(cls, lo: int, hi: int, ids: GroupIds, table: pa.Table, key_names: list[str]) -> FileSums:
        gen, gid = ids.ids(table.select(key_names))
        sums = {
            c: np.asarray(table[c].fill_null(0).to_numpy(), np.int64)
            for c in table.column_names
            if c not in key_names and c != "windows"
        }
        return cls(lo, hi, gen, gid, sums, np.asarray(table["windows"].fill_null(0).to_numpy(), np.int64))

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.windows.nbytes + sum(v.nbytes for v in self.sums.values())


@dataclass(frozen=True)
class TopPart:
    """One part of a range top: tier files (``tier``) or raw files over [s_us, e_us), as (path, cache key)."""

    tier: bool
    s_us: int
    e_us: int
    keyed: list[tuple[str, tuple]]

    @staticmethod
    def windows_of(tier: bool) -> str:
        """How many windows a group has rows in, per file: a tier row counts its own."""
        return (
            'CAST(sum("windows") AS BIGINT)'
            if tier
            else "count(DISTINCT window_start) FILTER (WHERE kind = 'final')"
        )

    @property
    def windows(self) -> str:
        return self.windows_of(self.tier)


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
        self._tops: dict[tuple, FileSums] = {}  # per-file group sums (range_top)
        self._ids: dict[str, GroupIds] = {}  # per query: dense ids of the groups the tops have seen
        self._tops_bytes = 0
        self.max_partials = 20_000
        # whole answers, keyed by the request and the (path, size, mtime) of every file it reads: store
        # files are immutable, so the same files give the same answer; a new batch or tier file is a miss
        self._answers: OrderedDict[tuple, ResultSet] = OrderedDict()
        self.max_answers = 256
        self.max_answer_rows = 10_000

    def warm_tiers(self, qi: QueryInfo, stop: threading.Event | None = None) -> int:
        """Compute the per-file partials of the query's tier files, newest first (so the first stepped
        series or top over months does not read every tier file while a user waits): the coarsest
        tier's group sums (within a quarter of the cache budget), then every tier's series partials."""
        done = 0
        adds = [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]
        if qi.spec.tier_names and adds and qi.key_names and self.cache.max_bytes > 0:
            coarsest = qi.spec.tier_names[int(np.argmax(qi.spec.tiers))]  # a month's top: every whole day
            for p in reversed(self.tiers.files(qi.spec, coarsest, 0, 1 << 62)):
                if stop is not None and stop.is_set() or self._tops_bytes > self.cache.max_bytes // 4:
                    break
                self._file_top(qi, p, (p, *self.tiers.stamp(p)), True)
                done += 1
        for tier in reversed(qi.spec.tier_names):
            for p in reversed(self.tiers.files(qi.spec, tier, 0, 1 << 62)):
                if stop is not None and stop.is_set() or done >= self.max_partials // 2:
                    return done
                self._file_partials(qi, p, (p, *self.tiers.stamp(p)), None)
                done += 1
        return done

    def _stamps(self, qi: QueryInfo, tier: str | tuple, start: datetime, end: datetime) -> tuple:
        """What a range request over [start, end) reads: every file's (path, size, mtime); ``tier``
        one name, or a top's plan of (tier, start_us, end_us) parts."""
        if isinstance(tier, tuple):
            return tuple(k for part in tier for _, k in self._top_part(qi, *part).keyed)
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
        plan: tuple[tuple[str, int, int], ...],
    ) -> ResultSet:
        """The ``n`` groups with the largest sum of the additive column ``by`` over every window in
        [start, end), with the sums of every additive aggregate and the number of windows each group
        has a row in. Exact: a count or sum folds by adding, so summing finals and corrections over the
        range is the same as folding per window, then summing (late rows add nothing). Ties by key.
        ``plan``: the range's parts (tier or raw, start_us, end_us; :func:`tierpick.plan`), each summed
        from its tier's rows (the same sums; ``windows`` from their counts) or from raw windows."""
        adds = [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]
        columns = [*qi.key_names, *adds, "windows", "rank"]
        parts = [p for p in (self._top_part(qi, *part) for part in plan) if p.keyed]
        if not parts:
            return ResultSet(columns, [], 0, frozenset())
        if not filters and qi.key_names and self.cache.max_bytes > 0:
            rows = self._top_from_partials(qi, parts, by, n, adds)
        else:
            rows = self._top_scan(qi, parts, filters, by, n, adds, start, end)
        return ResultSet(columns, rows, len(rows), frozenset())

    def _top_part(self, qi: QueryInfo, tier: str, s_us: int, e_us: int) -> TopPart:
        if tier != R.RAW_TIER:
            paths = self.tiers.files(qi.spec, tier, s_us, e_us)
            return TopPart(True, s_us, e_us, [(p, (p, *self.tiers.stamp(p))) for p in paths])
        files = self.index.files_for(qi.spec, s_us, e_us)
        return TopPart(False, s_us, e_us, [(f.path, (f.path, f.size, f.mtime_ns)) for f in files])

    def _top_scan(
        self,
        qi: QueryInfo,
        parts: list[TopPart],
        filters: list[KeyFilter],
        by: str,
        n: int,
        adds: list[str],
        start: datetime,
        end: datetime,
    ) -> list[tuple]:
        """The top read by DuckDB (with filters pushed into the Parquet scans): each part grouped by key
        over its files and span, then the parts' sums added per key and ranked."""
        keys = [S.q(k) for k in qi.key_names]
        group = f" GROUP BY {', '.join(keys)}" if keys else ""
        params: dict[str, Any] = {"start": start, "end": end, "n": n}
        selects = []
        for j, part in enumerate(parts):
            src = S.parquet_source(qi, [p for p, _ in part.keyed], ["windows"] if part.tier else None)
            params[f"files{j}"], params[f"s{j}"], params[f"e{j}"] = src.params["files"], part.s_us, part.e_us
            rows = S.scan(S.Source(src.rel.replace("$files", f"$files{j}"), {}, False), filters, params)
            selects.append(
                f"SELECT {''.join(k + ', ' for k in keys)}"
                + "".join(f"CAST(sum({S.q(a)}) AS BIGINT) AS {S.q(a)}, " for a in adds)
                + f"{part.windows} AS windows FROM {rows} WHERE kind IN ('final', 'correction')"
                f" AND epoch_us(window_start) >= $s{j} AND epoch_us(window_start) < $e{j}{group}"
            )
        sql = (
            f"SELECT {''.join(k + ', ' for k in keys)}"
            + "".join(f"CAST(sum({S.q(a)}) AS BIGINT), " for a in adds)
            + f"CAST(sum(windows) AS BIGINT) FROM ({' UNION ALL '.join(selects)}){group}"
            f" ORDER BY sum({S.q(by)}) DESC NULLS LAST{''.join(', ' + k for k in keys)} LIMIT $n"
        )
        cur = self.db.cursor()
        try:
            return [(*r, i) for i, r in enumerate(Reader._exec(cur, sql, params), 1)]
        finally:
            cur.close()

    def _top_partial(
        self, qi: QueryInfo, path: str, tier: bool, span: tuple[int, int] | None = None
    ) -> pa.Table:
        """One file's rows summed per group (finals and corrections); ``span``: only windows in it."""
        keys = ", ".join(S.q(k) for k in qi.key_names)
        adds = [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]
        src = S.parquet_source(qi, [path], ["windows"] if tier else None)
        where = "" if span is None else " AND epoch_us(window_start) >= $s AND epoch_us(window_start) < $e"
        sql = (
            f"SELECT {keys}, "
            + "".join(f"CAST(sum({S.q(a)}) AS BIGINT) AS {S.q(a)}, " for a in adds)
            + f"{TopPart.windows_of(tier)} AS windows FROM {src.rel}"
            f" WHERE kind IN ('final', 'correction'){where} GROUP BY {keys}"
        )
        params = {**src.params, **({} if span is None else {"s": span[0], "e": span[1]})}
        cur = self.db.cursor()
        try:
            return cur.sql(sql, params=params).to_arrow_table()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        finally:
            cur.close()

    def _group_ids(self, qi: QueryInfo) -> GroupIds:
        with self._partials_lock:
            return self._ids.setdefault(qi.name, GroupIds(qi.key_names))

    def _file_top(
        self, qi: QueryInfo, path: str, key: tuple, tier: bool, span: tuple[int, int] | None = None
    ) -> FileSums:
        """A file's per-group sums (as dense group ids and arrays) and the window_start range it holds,
        cached per (path, size, mtime) within half the cache budget; ``span``: the sums over the
        windows in it only (a file straddling a range's edge; cached per span too, as a page asks
        for the same edges again)."""
        ids = self._group_ids(qi)
        key = key if span is None else (*key, span)
        got = self._tops.get(key)
        if got is not None and got.generation == ids.generation:
            return got
        table = self._top_partial(qi, path, tier, span)
        cur = self.db.cursor()
        try:
            src = S.parquet_source(qi, [path])
            lo, hi = cur.sql(
                f"SELECT epoch_us(min(window_start)), epoch_us(max(window_start)) FROM {src.rel}",
                params=src.params,
            ).fetchall()[0]
        finally:
            cur.close()
        entry = FileSums.of(
            -1 if lo is None else int(lo), -1 if hi is None else int(hi), ids, table, qi.key_names
        )
        with self._partials_lock:
            if entry.generation != ids.generation:  # the ids were reset meanwhile: do not keep it
                return entry
            stale = self._tops.pop(key, None)  # of an older generation
            self._tops_bytes += entry.nbytes - (stale.nbytes if stale is not None else 0)
            self._tops[key] = entry
            while self._tops_bytes > self.cache.max_bytes // 2 and self._tops:
                self._tops_bytes -= self._tops.pop(next(iter(self._tops))).nbytes
        return entry

    def _top_from_partials(
        self, qi: QueryInfo, parts: list[TopPart], by: str, n: int, adds: list[str]
    ) -> list[tuple]:
        """Top-n over a range from per-file group sums: a file wholly inside its part's span contributes
        its cached sums, one straddling it is summed over the span now. Each file's groups are dense
        ids (one row per group in a file), so the range's totals are array additions; the groups at or
        above the n-th largest total are then ranked by DuckDB (ties by key): the same answer as
        grouping every row by its key, without grouping the range's rows per request."""
        ids = self._group_ids(qi)
        ids.trim()
        for _attempt in range(3):
            gen = ids.generation
            sums: list[FileSums] = []
            for part in parts:
                for path, key in part.keyed:
                    fs = self._file_top(qi, path, key, part.tier)
                    if fs.lo < 0:
                        continue
                    if part.s_us <= fs.lo and fs.hi < part.e_us:
                        sums.append(fs)
                    elif fs.hi >= part.s_us and fs.lo < part.e_us:
                        sums.append(self._file_top(qi, path, key, part.tier, (part.s_us, part.e_us)))
            if all(p.generation == gen for p in sums):
                break
            # another request started new ids meanwhile: sum again with the new ones
        else:
            raise StoreError("the group ids kept changing during the request; retry")
        size = 1 + max((int(p.ids.max()) for p in sums if len(p.ids)), default=-1)
        if not size:
            return []
        totals = {a: np.zeros(size, np.int64) for a in adds}
        wins = np.zeros(size, np.int64)
        seen = np.zeros(size, bool)
        for p in sums:  # a group is one row of a file: plain fancy-index adds are exact
            for a in adds:
                totals[a][p.ids] += p.sums[a]
            wins[p.ids] += p.windows
            seen[p.ids] = True
        cand = np.flatnonzero(seen)
        if len(cand) > n:
            v = totals[by][cand]
            kth = np.partition(v, len(v) - n)[len(v) - n]  # the n-th largest total
            cand = cand[v >= kth]
        table = ids.keys_of(cand)
        for a in adds:
            table = table.append_column(a, pa.array(totals[a][cand]))
        table = table.append_column("windows", pa.array(wins[cand]))
        keys = [S.q(k) for k in qi.key_names]
        cur = self.db.cursor()
        try:
            cur.register("lw_top", table)
            got = Reader._exec(
                cur,
                f"SELECT {', '.join([*keys, *(S.q(a) for a in adds)])}, windows FROM lw_top"
                f" ORDER BY {S.q(by)} DESC NULLS LAST, {', '.join(keys)} LIMIT {int(n)}",
                {},
            )
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

    def _scan_partials(
        self, qi: QueryInfo, filters: list[KeyFilter], span: tuple[datetime, datetime], cur: Any, src: Any
    ) -> pa.Table:
        """The per-window partials of the filtered rows of ``src`` over ``span``: a file's path (DuckDB
        pushes the filters into the Parquet scan) or a table (row groups already read)."""
        rows = src if isinstance(src, pa.Table) else None
        src = S.parquet_source(qi, [src]) if rows is None else S.Source("lw_rows", {}, False)
        if rows is not None:
            cur.register("lw_rows", rows)
        params = {**src.params, "start": span[0], "end": span[1]}
        sql = f"SELECT {', '.join(self._partials_sql(qi))} FROM {S.scan(src, filters, params)} GROUP BY window_start"
        try:
            return cur.sql(sql, params={k: v for k, v in params.items() if f"${k}" in sql}).to_arrow_table()
        finally:
            if rows is not None:
                cur.unregister("lw_rows")

    def _filtered_partials(
        self, qi: QueryInfo, got: list, filters: list[KeyFilter], span: tuple, cur: Any
    ) -> pa.Table:
        """Per-window partials of a filtered series: paths scanned by DuckDB one by one, row groups read
        (tables; :meth:`TierFiles.read_candidates`) summed by one query of the same SQL (same answer)."""
        read = [g for g in got if isinstance(g, pa.Table)] or [qi.schema.empty_table()]
        read = pa.concat_tables(read, promote_options="permissive")
        srcs = [*(g for g in got if isinstance(g, str)), read]
        return pa.concat_tables(
            [self._scan_partials(qi, filters, span, cur, g) for g in srcs], promote_options="permissive"
        )

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
            if filters:  # tier files: their candidate row groups; raw files: scanned one by one
                paths = [p for p, _ in keyed]
                got = paths if tier == R.RAW_TIER else self.tiers.read_candidates(qi, paths, filters)
                parts = self._filtered_partials(qi, got, filters, (start, end), cur)
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
