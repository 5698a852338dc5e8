"""The files of a query's roll-up tier that a request reads (layout: :mod:`contract.results`).

Per ``tier=<name>/date=<d>`` directory: the visible files (:func:`contract.results.visible_files`, so a
file covered by a larger merged one is never read twice), each checked once against
:func:`contract.results.tier_schema` (a file that breaks it is skipped and counted, as raw files are).

A tier file is sorted by key then window in small row groups (:data:`high_level.results.tiers.ROW_GROUP`),
so a filtered series needs only the row groups whose key range may hold the filter's keys
(:meth:`TierFiles.row_groups`): the footer's min/max per key column, read once per file.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import results as R
from contract.query import QuerySpec
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import StoreError
from high_level.serve.params import KeyFilter

_DAY_US = 86_400_000_000
# the columns a stepped series reads besides the window, the filters' and the aggregates'
SERIES_COLS = ["kind", "complete", "hosts_expected", "hosts_in_mark", "late_partials", "missing_records"]
# reads of tier files' row groups for filtered series (pyarrow releases the GIL while decoding)
_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lowwater-tier-read")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SETTLED_NS = 2_000_000_000


def text_prefix(f: KeyFilter) -> str | None:
    """A text prefix every matching address's canonical text starts with (None: no useful one), so a
    prefix or range filter can skip row groups by the key column's min/max like an exact value.
    IPv4: the octets the range's ends share; IPv6: the leading non-zero groups they share (a zero
    group may be written as '::', so the text is only known up to the first one)."""
    if f.op == "v4prefix":
        return str(f.value)
    if f.op == "v4range":
        a, b = (ipaddress.IPv4Address(v).packed for v in f.value)  # type: ignore[union-attr]
        n = next((i for i in range(4) if a[i] != b[i]), 4)
        return "".join(f"{o}." for o in a[:n]) or None
    if f.op == "v6range":
        lo, hi = f.value  # type: ignore[misc]
        out = ""
        for i in range(0, 32, 4):
            g = lo[i : i + 4]
            if g != hi[i : i + 4] or int(g, 16) == 0:
                break
            out += f"{int(g, 16):x}:"
        return out or None
    return None


def may_hold(f: KeyFilter, lo: object, hi: object) -> bool:
    """Whether a row group whose column spans [lo, hi] (its min/max statistics) may hold a row that
    ``f`` matches; True when unsure (no statistics, other types, filters without a text bound)."""
    if lo is None or hi is None:
        return True
    if f.op == "eq":
        if type(f.value) is not type(lo) or type(lo) is not type(hi):
            return True
        return lo <= f.value <= hi  # type: ignore[operator]
    p = text_prefix(f)
    if p is None or not isinstance(lo, str) or not isinstance(hi, str):
        return True
    return hi >= p and lo[: len(p)] <= p  # [lo, hi] meets the strings that start with p


def _keep(f: KeyFilter, values: pa.Array) -> pa.Array | None:
    """Which of ``values`` (plain, no dictionary) ``f`` may match: a superset, as :func:`may_hold`
    (its exact condition is the SQL's); None: unsure of every value."""
    if f.op == "eq":
        if pa.types.is_string(values.type) != isinstance(f.value, str):
            return None
        return pc.equal(values, pa.scalar(f.value, values.type))
    p = text_prefix(f)
    if p is None or not pa.types.is_string(values.type):
        return None
    return pc.starts_with(values, p)


def narrow(table: pa.Table, filters: list[KeyFilter]) -> pa.Table:
    """The rows of ``table`` that ``filters`` may match (AND across columns, OR within one), so the
    exact filter runs on a group's few rows, not its row groups' 16K: per dictionary entry of a
    dictionary-encoded column (a row group's few keys), else per row. A superset: rows where a
    filter is unsure (no text bound) stay; a null key matches no filter."""
    by_col: dict[str, list[KeyFilter]] = {}
    for f in filters:
        by_col.setdefault(f.column, []).append(f)
    masks = []
    for col, fs in by_col.items():
        if col not in table.column_names:
            continue
        if not pa.types.is_dictionary(table[col].type):  # one call over every chunk
            plain = [_keep(f, table[col]) for f in fs]
            if all(k is not None for k in plain):
                masks.append(functools.reduce(pc.or_kleene, plain))
            continue
        parts = []
        for chunk in table[col].chunks:
            dictionary = isinstance(chunk, pa.DictionaryArray)
            keeps = [_keep(f, chunk.dictionary if dictionary else chunk) for f in fs]
            if any(k is None for k in keeps):
                break
            keep = functools.reduce(pc.or_kleene, keeps)
            parts.append(pc.take(keep, chunk.indices) if dictionary else keep)
        else:
            if parts:
                masks.append(pa.chunked_array(parts, pa.bool_()))
    if not masks:
        return table
    return table.filter(functools.reduce(pc.and_kleene, masks))  # a null (key) drops the row


def _succ(p: str) -> str:
    """The least string above every string that starts with ``p`` (p ends in '.' or ':')."""
    return p[:-1] + chr(ord(p[-1]) + 1)


def _parsed_bytes(meta: pq.FileMetaData) -> int:
    """The memory a parsed footer takes, estimated from its serialized size (measured ~9x)."""
    return 9 * meta.serialized_size


VARIES = object()  # KeyStats.constant: the column holds more than one value (or nulls) there


@dataclass(frozen=True)
class KeyStats:
    """A file's row groups: their row counts and, per column, their (min, max) (None: unknown) and
    whether they hold nulls; ``lead``: the first key column when the file is sorted by it (its row
    groups' mins and maxes ascend), so a filter on it finds its row groups by bisection."""

    rows: list[int]
    spans: dict[str, list[tuple[object, object]]]
    nulls: dict[str, list[bool]]
    lead: str | None
    lead_lo: list = field(default_factory=list)  # the lead column's mins and maxes, for bisection
    lead_hi: list = field(default_factory=list)

    @classmethod
    def of(cls, meta: pq.FileMetaData, keys: list[str]) -> KeyStats:
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        rows: list[int] = []
        spans: dict[str, list[tuple[object, object]]] = {n: [] for n in names}
        nulls: dict[str, list[bool]] = {n: [] for n in names}
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            rows.append(rg.num_rows)
            for i, n in enumerate(names):
                st = rg.column(i).statistics
                ok = st is not None and st.has_min_max
                spans[n].append((st.min, st.max) if ok else (None, None))
                nulls[n].append(st is None or not st.has_null_count or st.null_count > 0)
        lead = keys[0] if keys and keys[0] in spans else None
        if lead is not None:
            lo, hi = [a for a, _ in spans[lead]], [b for _, b in spans[lead]]
            kinds = {type(v) for v in (*lo, *hi)}
            if len(kinds) != 1 or lo != sorted(lo) or hi != sorted(hi):  # type: ignore[type-var]
                lead = None
            else:
                return cls(rows, spans, nulls, lead, lo, hi)
        return cls(rows, spans, nulls, lead)

    def _lead_range(self, f: KeyFilter) -> tuple[int, int] | None:
        """The row groups [a, b) of the sorted lead column that may hold ``f``'s rows; None: unsure."""
        lo, hi = self.lead_lo, self.lead_hi
        if f.op == "eq":
            if type(f.value) is not type(lo[0]):
                return None
            return bisect.bisect_left(hi, f.value), bisect.bisect_right(lo, f.value)  # type: ignore[arg-type]
        p = text_prefix(f)
        if p is None or not isinstance(lo[0], str):
            return None
        return bisect.bisect_left(hi, p), bisect.bisect_left(lo, _succ(p))  # type: ignore[arg-type]

    def pick(self, filters: list[KeyFilter]) -> list[int]:
        """The row groups that may hold rows of ``filters`` (AND across columns, OR within one)."""
        by_col: dict[str, list[KeyFilter]] = {}
        for f in filters:
            by_col.setdefault(f.column, []).append(f)
        cand: list[int] | None = None
        if self.lead is not None and self.lead in by_col and self.rows:
            got = [self._lead_range(f) for f in by_col[self.lead]]
            if all(r is not None for r in got):
                cand = sorted({g for a, b in got for g in range(a, b)})  # type: ignore[misc]
        return [
            g
            for g in (range(len(self.rows)) if cand is None else cand)
            if all(
                any(may_hold(f, *self.spans[c][g]) for f in fs) if c in self.spans else True
                for c, fs in by_col.items()
            )
        ]

    def constant(self, column: str, groups: list[int]) -> object:
        """The one value ``column`` has in every row of ``groups`` (no nulls), else ``VARIES``."""
        vals = {self.spans[column][g] for g in groups} if column in self.spans else set()
        if len(vals) != 1 or any(self.nulls[column][g] for g in groups):
            return VARIES
        lo, hi = next(iter(vals))
        return lo if lo is not None and lo == hi else VARIES


class TierFiles:
    """Listing and schema checks of tier files; checks are cached by (path, size, mtime)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._checked: dict[str, tuple[tuple[int, int], str | None]] = {}
        # per file: its footer (parsing one costs ~10 ms, reading a row group ~2) and key statistics
        self._footers: OrderedDict[str, tuple[tuple[int, int], pq.FileMetaData, KeyStats, str | None]] = (
            OrderedDict()
        )
        # parsed footers take ~9x their serialized size in memory (a day file of the 1h tier of 100K
        # groups in 4,096-row row groups: 1.1 MB on disk, ~10 MB parsed): kept within this estimate
        self.max_footer_bytes = 512 << 20
        self._footer_bytes = 0
        self._listed: dict[str, tuple[int, list[str]]] = {}  # per date directory: (its mtime, its files)
        self._lock = threading.Lock()

    def files(self, spec: QuerySpec, tier: str, start_us: int, end_us: int) -> list[str]:
        """Paths of the visible, well-formed files of ``tier`` whose day may hold windows in [start, end)."""
        out: list[str] = []
        for day, d in R.tier_date_dirs(self.root, spec.name, tier):
            day_us = (
                int((datetime(day.year, day.month, day.day, tzinfo=UTC) - _EPOCH).total_seconds()) * 10**6
            )
            if day_us >= end_us or day_us + _DAY_US <= start_us:
                continue
            try:
                mtime = d.stat().st_mtime_ns
                got = self._listed.get(str(d))
                if got is not None and got[0] == mtime:
                    out.extend(got[1])
                    continue
                names = {p.name: r for p in d.iterdir() if (r := R.tier_batch_range(p.name)) is not None}
            except FileNotFoundError:  # retention removed the day meanwhile
                continue
            here = []
            for name in R.visible_files(names):
                path = d / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if self._check(spec, tier, path, (st.st_size, st.st_mtime_ns)) is None:
                    here.append(str(path))
            # files enter and leave a directory by rename or unlink only (never rewritten in place), so
            # its mtime says whether the listing changed; kept once that mtime is older than a change
            # within its clock's granularity could hide
            if time.time_ns() - mtime > _SETTLED_NS:
                self._listed[str(d)] = (mtime, here)
            out.extend(here)
        return out

    def stamp(self, path: str) -> tuple[int, int]:
        """(size, mtime) of a listed file as checked: what a cache of its contents keys on."""
        got = self._checked.get(path)
        return got[0] if got is not None else (0, 0)

    def _check(self, spec: QuerySpec, tier: str, path: Path, key: tuple[int, int]) -> str | None:
        got = self._checked.get(str(path))
        if got is not None and got[0] == key:
            return got[1]
        try:
            R.check_tier_schema(spec, tier, pq.read_schema(path), str(path))
            err = None
        except (OSError, ValueError) as exc:
            err = str(exc)
        with self._lock:
            self._checked[str(path)] = (key, err)
        return err

    def _footer(self, path: str, keys: list[str]) -> tuple[pq.FileMetaData, KeyStats]:
        stamp = self.stamp(path)
        with self._lock:
            got = self._footers.get(path)
            if got is not None and got[0] == stamp and (not keys or got[3] == keys[0]):
                self._footers.move_to_end(path)
                return got[1], got[2]
        meta = pq.read_metadata(path)
        ks = KeyStats.of(meta, keys)
        with self._lock:
            old = self._footers.pop(path, None)
            self._footer_bytes += _parsed_bytes(meta) - (_parsed_bytes(old[1]) if old is not None else 0)
            self._footers[path] = (stamp, meta, ks, keys[0] if keys else None)
            while self._footer_bytes > self.max_footer_bytes and len(self._footers) > 1:
                self._footer_bytes -= _parsed_bytes(self._footers.popitem(last=False)[1][1])
        return meta, ks

    def row_groups(
        self, path: str, keys: list[str], filters: list[KeyFilter]
    ) -> tuple[list[int], KeyStats, pq.FileMetaData]:
        """(the row groups of a listed file that may hold ``filters``' rows, the file's statistics,
        its parsed footer to open it with); read once per (path, size, mtime)."""
        meta, ks = self._footer(path, keys)
        return ks.pick(filters), ks, meta

    # a filtered series reads a file's candidate row groups itself up to this many rows; a filter the
    # footer cannot narrow (a later key column alone) leaves the file to DuckDB's scan
    max_pruned_rows = 8 * 16_384

    @staticmethod
    def series_columns(qi: QueryInfo, filters: list[KeyFilter]) -> list[str]:
        """The columns a filtered series reads, in order."""
        return list(
            dict.fromkeys(["window_start", *(f.column for f in filters), *qi.agg_names, *SERIES_COLS])
        )

    def read_groups(
        self, qi: QueryInfo, path: str, filters: list[KeyFilter]
    ) -> tuple[pa.Table, tuple[tuple[str, object], ...]] | str | None:
        """The rows of ``path``'s row groups that may hold ``filters``' rows, the columns a series needs
        but those with one value in all of them (a tier file's kind, completeness), which are returned
        apart as (column, value) from the footer, not read. None: no row group may; ``path``: too many,
        for DuckDB to scan."""
        groups, ks, meta = self.row_groups(path, qi.key_names, filters)
        if not groups:
            return None
        if sum(ks.rows[g] for g in groups) > self.max_pruned_rows:
            return path
        want = self.series_columns(qi, filters)
        consts = tuple(
            (c, v) for c in SERIES_COLS if (v := ks.constant(c, groups)) is not VARIES
        )  # not window_start: an hour's file would be its own set of constants
        skip = {c for c, _ in consts}
        # memory-mapped, without pre-buffering: a few small column chunks, read where they lie; text
        # plain, so the rows of every file are narrowed by one call per filter (not one per file)
        f = pq.ParquetFile(pa.memory_map(path), metadata=meta, pre_buffer=False)
        return f.read_row_groups(
            groups, columns=[c for c in want if c not in skip], use_threads=False
        ), consts

    def read_candidates(
        self, qi: QueryInfo, paths: list[str], filters: list[KeyFilter]
    ) -> list[pa.Table | str]:
        """:meth:`read_groups` of every file, on a small thread pool (pyarrow releases the GIL): the
        paths left to DuckDB, and the rows read, narrowed (:func:`narrow`) and with their constant
        columns, one table per set of constants (usually one)."""
        try:
            got = list(_READERS.map(lambda p: self.read_groups(qi, p, filters), paths))
        except FileNotFoundError:  # compacted or expired since the listing: list again
            raise StoreError("a tier file vanished since it was listed") from None
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None
        out: list[pa.Table | str] = [g for g in got if isinstance(g, str)]
        by_consts: dict[tuple, list[pa.Table]] = {}
        for g in got:
            if isinstance(g, tuple):
                by_consts.setdefault(g[1], []).append(g[0])
        want = self.series_columns(qi, filters)
        types = {f.name: f.type for f in qi.schema}
        for consts, tables in by_consts.items():
            rows = narrow(pa.concat_tables(tables), filters)
            cols = {c: rows[c] for c in rows.column_names}
            cols.update({c: pa.repeat(pa.scalar(v, types[c]), rows.num_rows) for c, v in consts})
            out.append(pa.table({c: cols[c] for c in want}))
        return out

    def rejected(self) -> dict[str, str]:
        """Tier files skipped because they break the layout, with why."""
        return {p: e for p, (_, e) in self._checked.items() if e is not None}
