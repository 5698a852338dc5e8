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
(``avg_exact`` is false in /queries).

Why a cache of prepared files: decoding Parquet (strings above all) dominates a request, and result
files never change once written, so each file is decoded once into Arrow, ranked and hashed (see
:class:`Reader`), and kept in a bounded LRU; requests whose files do not fit read Parquet directly.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import fields as F
from contract.query import QuerySpec
from high_level.serve.params import KeyFilter, OrderTerm

_PART = re.compile(r"^part-(\d+)")
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 0.001}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_U64 = (1 << 64) - 1
log = logging.getLogger("lowwater.api")
SETTLE_S = 10.0  # a file modified this recently may still be being written: stat it on every request
FULL_RECHECK_S = 30.0  # re-stat every file of a directory this often (in-place rewrites)


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
    def avg_state_columns(self) -> list[str]:
        """``<avg>.sum``/``<avg>.count`` state columns, read (when the store has them) to fold avg exactly."""
        if self.count_col is not None:
            return []
        return [f"{a}.{part}" for a, fn in self.aggs if fn == "avg" for part in ("sum", "count")]

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
    size: int
    mtime_ns: int
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


def read_stats(path: str, size: int = 0, mtime_ns: int = 0) -> FileStats | None:
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
    return FileStats(path, size, mtime_ns, batch, lo, hi, names, frozenset(kinds) if kinds is not None else None)


@dataclass
class _DirState:
    mtime_ns: int
    checked: float  # time.monotonic() of the last full listing
    files: dict[str, tuple[int, int, FileStats | None]] = field(default_factory=dict)  # path -> size, mtime, stats
    good: list[FileStats] | None = None  # the readable ones (None: to be recomputed)


class FileIndex:
    """Per-file footer statistics, cached by (path, size, mtime) so only new or changed files are read."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[str, _DirState] = {}
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

    def _scan_dir(self, d: str, old: _DirState | None, mtime_ns: int) -> _DirState:
        """List and stat every part of a directory (re-reading footers only of new or changed files)."""
        state = _DirState(mtime_ns, time.monotonic())
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            return state
        except OSError as exc:
            raise StoreError(f"cannot list {d}: {exc.strerror}") from None
        known = old.files if old is not None else {}
        for e in entries:
            if e.name.startswith((".", "_")) or not e.name.endswith(".parquet"):
                continue
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            state.files[e.path] = self._check(e.path, st, known.get(e.path))
        return state

    @staticmethod
    def _check(path: str, st: os.stat_result, got: tuple[int, int, FileStats | None] | None
               ) -> tuple[int, int, FileStats | None]:  # fmt: skip
        if got is not None and got[0] == st.st_size and got[1] == st.st_mtime_ns:
            return got
        return st.st_size, st.st_mtime_ns, read_stats(path, st.st_size, st.st_mtime_ns)

    def files_in(self, dirs: list[str]) -> list[FileStats]:
        """The readable Parquet parts in these directories (tmp/hidden files skipped).

        A directory whose mtime is unchanged holds the same names, so only its unsettled files (footer
        unreadable, or modified in the last SETTLE_S seconds: maybe still being written) are stat'ed
        again; every FULL_RECHECK_S the whole directory is, in case a writer rewrote a file in place.
        """
        out: list[FileStats] = []
        wall = time.time()
        for d in dirs:
            try:
                mtime_ns = os.stat(d).st_mtime_ns
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot stat {d}: {exc.strerror}") from None
            state = self._dirs.get(d)
            if state is None or state.mtime_ns != mtime_ns or time.monotonic() - state.checked > FULL_RECHECK_S:
                state = self._scan_dir(d, state, mtime_ns)
            else:
                for path, got in list(state.files.items()):
                    if got[2] is None or wall - got[1] / 1e9 < SETTLE_S:
                        try:
                            new = self._check(path, os.stat(path), got)
                        except FileNotFoundError:
                            del state.files[path]
                            state.good = None
                            continue
                        if new is not got:
                            state.files[path] = new
                            state.good = None
            if state.good is None:
                state.good = [got[2] for got in state.files.values() if got[2] is not None]
            with self._lock:
                self._dirs[d] = state
            out.extend(state.good)
        return out

    def forget(self) -> None:
        """Drop every directory listing (the next request lists and stats again)."""
        with self._lock:
            self._dirs.clear()

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


# --- normalised in-memory copies of the files
def target_schema(qi: QueryInfo) -> pa.Schema:
    """The one schema every file is normalised to, so cached tables concatenate without copies."""
    ts = pa.timestamp("us", tz="UTC")
    fields = [pa.field("window_start", ts), pa.field("window_end", ts)]
    fields += [pa.field(k, pa.string() if kind == "ip" else pa.int64()) for k, kind in qi.keys]
    fields += [pa.field(a, pa.float64() if fn == "avg" else pa.int64()) for a, fn in qi.aggs]
    fields += [pa.field(c, pa.int64()) for c in qi.avg_state_columns]
    fields += [pa.field("hosts", pa.int32()), pa.field("closed_at", ts), pa.field("kind", pa.string())]
    return pa.schema(fields)


def load_normalised(path: str, schema: pa.Schema) -> pa.Table:
    """One Parquet file as a table of ``schema``: missing columns null, kind null -> 'final', types cast."""
    pf = pq.ParquetFile(path)
    present = set(pf.schema_arrow.names)
    table = pf.read(columns=[n for n in schema.names if n in present])
    n = table.num_rows
    cols = []
    for f in schema:
        if f.name not in present:
            arr: pa.ChunkedArray | pa.Array = pa.nulls(n, f.type)
        else:
            arr = table.column(f.name)
            if arr.type != f.type:
                arr = arr.cast(f.type)
        if f.name == "kind":
            arr = pc.fill_null(arr, "final")
        cols.append(arr)
    return pa.Table.from_arrays(cols, schema=schema)


@dataclass(frozen=True)
class Prepared:
    """One file in memory, prepared for cheap top-N selection.

    ``table``: all rows, finals first sorted by ``_rank`` (so "rank <= k" is a prefix), then the
    corrections; ``corr``: the correction rows alone; ``ranks``: ``_rank`` of the finals (ascending);
    ``wkh_sorted`` / ``wkh_order``: the finals' window-and-key hashes sorted, and their row numbers;
    ``final_windows``: the windows the file has finals of.
    """

    table: pa.Table
    corr: pa.Table
    ranks: np.ndarray
    wkh_sorted: np.ndarray
    wkh_order: np.ndarray
    final_windows: np.ndarray  # window_start (us) of the windows this file has final rows of, unique

    @classmethod
    def of(cls, table: pa.Table) -> Prepared:
        """``table`` must already be sorted by ``_rank`` (nulls, i.e. corrections, last)."""
        table = table.combine_chunks()
        n = table.num_rows - pc.sum(pc.equal(table.column("kind"), "correction")).as_py() if table.num_rows else 0
        ranks = table.column("_rank").slice(0, n).to_numpy()
        wkh = table.column("_wkh").slice(0, n).to_numpy()
        order = np.argsort(wkh, kind="stable")
        windows = np.unique(table.column("window_start").slice(0, n).cast(pa.int64()).to_numpy())
        return cls(table, table.slice(n), ranks, wkh[order], order, windows)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.ranks.nbytes + self.wkh_sorted.nbytes + self.wkh_order.nbytes

    def top_rows(self, k: int, corrected: np.ndarray | None) -> pa.Table:
        """Finals ranked <= k, plus the finals whose hash is in ``corrected`` (sorted unique)."""
        cut = int(np.searchsorted(self.ranks, k, side="right"))
        head = self.table.slice(0, cut)
        if corrected is None or not len(self.wkh_sorted):
            return head
        lo = np.searchsorted(self.wkh_sorted, corrected, "left")
        hi = np.searchsorted(self.wkh_sorted, corrected, "right")
        counts = hi - lo
        if not counts.any():
            return head
        starts = np.repeat(lo, counts)
        idx = self.wkh_order[starts + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))]
        idx = np.sort(idx[idx >= cut])
        return pa.concat_tables([head, self.table.take(pa.array(idx))]) if len(idx) else head


def add_ip_words(table: pa.Table, columns: list[str]) -> pa.Table:
    """Add ``_ip_<col>_hi``/``_lo`` (uint64 words, IPv4 mapped) per address column; NULL if unparsable.

    Parsed once per distinct address of the file (dictionary encoding), so prefix filters on cached
    data compare integers instead of parsing text on every request.
    """
    for c in columns:
        enc = pc.dictionary_encode(table.column(c)).combine_chunks()
        his, los = [], []
        for text in enc.dictionary.to_pylist():
            try:
                h, w = F.ip_to_words(text)
            except (ValueError, TypeError):
                h = w = None
            his.append(h)
            los.append(w)
        idx = enc.indices
        table = table.append_column(f"_ip_{c}_hi", pa.array(his, pa.uint64()).take(idx))
        table = table.append_column(f"_ip_{c}_lo", pa.array(los, pa.uint64()).take(idx))
    return table


class TableCache:
    """LRU of prepared files by (path, size, mtime). Result files are immutable, so each is decoded and
    prepared once; later requests scan memory, several times cheaper than decoding Parquet again."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, tuple[int, int, Prepared]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, f: FileStats, load: Callable[[str], Prepared]) -> Prepared | None:
        """The prepared file (``load(path)`` on a miss); None if it cannot be read now."""
        with self._lock:
            got = self._tables.get(f.path)
            if got is not None and got[0] == f.size and got[1] == f.mtime_ns:
                self._tables.move_to_end(f.path)
                return got[2]
        try:
            table = load(f.path)
        except (OSError, pa.ArrowException, ValueError, duckdb.Error) as exc:
            log.warning("skipping unreadable results file %s: %s", f.path, exc)
            return None
        with self._lock:
            old = self._tables.pop(f.path, None)
            if old is not None:
                self._bytes -= old[2].nbytes
            self._tables[f.path] = (f.size, f.mtime_ns, table)
            self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                _, (_, _, t) = self._tables.popitem(last=False)
                self._bytes -= t.nbytes
        return table


def _numeric_prefix(f: KeyFilter, i: int, params: dict[str, Any]) -> str:
    """An address prefix as a range over the (hi, lo) words of lowwater's 128-bit address space."""
    lo, hi = f.bounds  # type: ignore[misc]
    h, w = q(f"_ip_{f.column}_hi"), q(f"_ip_{f.column}_lo")
    mapped = f"({h} = 0 AND ({w} >> 32) = 65535)"
    if lo >> 64 == hi >> 64:  # same high word: a range of the low word
        params[f"f{i}h"], params[f"f{i}a"], params[f"f{i}b"] = lo >> 64, lo & _U64, hi & _U64
        cond = f"({h} = $f{i}h AND {w} BETWEEN $f{i}a AND $f{i}b)"
    else:  # a prefix of at most 64 bits: a range of the high word
        params[f"f{i}a"], params[f"f{i}b"] = lo >> 64, hi >> 64
        cond = f"({h} BETWEEN $f{i}a AND $f{i}b)"
    # IPv6 prefixes never match IPv4 rows (as with text: an IPv4 row is never written as ::ffff:a.b.c.d)
    return cond if f.op.startswith("v4") else f"({cond} AND NOT {mapped})"


T = TypeVar("T")


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


@dataclass
class _Source:
    """Where a request's rows come from: relation SQL text (``lw_src`` or a read_parquet subquery)."""

    rel: str
    params: dict[str, Any]
    cached: bool  # True: prepared tables (``_rank``, ``_wkh``, address words)
    wkh: str = "_wkh"  # the window-and-key hash: a column, or an expression computed where needed


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
        for m in _MACROS:
            self.db.execute(m)

    def close(self) -> None:
        self.db.close()

    # ---- sources
    @staticmethod
    def _rank_value(qi: QueryInfo) -> str:
        a, fn = qi.aggs[0]
        return f"CASE WHEN isfinite({q(a)}) THEN {q(a)} END" if fn == "avg" else q(a)

    @staticmethod
    def _key_hash(qi: QueryInfo, avail: set[str] | None = None) -> str:
        return f"hash({', '.join(['window_start', *(q(k) for k in qi.key_names if avail is None or k in avail)])})"

    def _prepare(self, qi: QueryInfo, path: str) -> Prepared:
        """Normalise one file and add ``_wkh`` and ``_rank`` (see the class docstring)."""
        table = add_ip_words(load_normalised(path, target_schema(qi)), [k for k, kind in qi.keys if kind == "ip"])
        keys = "".join(", " + q(k) for k in qi.key_names)
        cur = self.db.cursor()
        try:
            cur.register("lw_t", table)
            out = cur.sql(
                f"SELECT *, {self._key_hash(qi)} AS _wkh, CASE WHEN kind <> 'correction' THEN row_number() OVER"
                f" (PARTITION BY window_start, kind <> 'correction' ORDER BY {self._rank_value(qi)} DESC NULLS LAST"
                f"{keys}) END AS _rank FROM lw_t ORDER BY _rank NULLS LAST, window_start"
            ).to_arrow_table()  # fmt: skip
            return Prepared.of(out)
        finally:
            cur.close()

    def _cached(self, qi: QueryInfo, f: FileStats) -> Prepared | None:
        return self.cache.get(f, lambda path: self._prepare(qi, path))

    def _fits(self, files: list[FileStats]) -> bool:
        return sum(f.size for f in files) * 4 <= self.cache.max_bytes // 2

    def _source(self, cur: duckdb.DuckDBPyConnection, qi: QueryInfo, files: list[FileStats]) -> _Source:
        """Register the request's rows as ``lw_src`` from the cache, or describe a read_parquet subquery."""
        if self._fits(files):
            prepared = [p for f in files if (p := self._cached(qi, f)) is not None]
            if prepared:
                cur.register("lw_src", pa.concat_tables([p.table for p in prepared]))
                return _Source("lw_src", {}, True)
        avail: set[str] = set().union(*(f.columns for f in files))
        sqltype = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.int32(): "INTEGER"}
        proj = []
        for fld in target_schema(qi):
            typ = sqltype.get(fld.type, "TIMESTAMPTZ")
            if fld.name == "kind":
                proj.append("coalesce(kind, 'final') AS kind" if "kind" in avail else "'final' AS kind")
            elif fld.name in avail:
                proj.append(f"CAST({q(fld.name)} AS {typ}) AS {q(fld.name)}")
            else:
                proj.append(f"CAST(NULL AS {typ}) AS {q(fld.name)}")
        rel = (f"(SELECT {', '.join(proj)} FROM read_parquet($files, hive_partitioning = true,"
               " union_by_name = true))")  # fmt: skip
        return _Source(rel, {"files": [f.path for f in files]}, False, self._key_hash(qi, avail))

    # ---- SQL building blocks
    @staticmethod
    def _filter_sql(filters: list[KeyFilter], params: dict[str, Any], numeric: bool = False) -> list[str]:
        """AND across columns, OR between several filters on the same column.

        ``numeric``: the source has the addresses as words (``_ip_<col>_hi``/``_lo``, prepared in the
        cache), so prefixes are integer ranges instead of text parsing per row.
        """
        by_col: dict[str, list[str]] = {}
        for i, f in enumerate(filters):
            c = q(f.column)
            if numeric and f.bounds is not None:
                by_col.setdefault(f.column, []).append(_numeric_prefix(f, i, params))
                continue
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

    @staticmethod
    def _plain_cols(qi: QueryInfo) -> list[str]:
        """A row that needs no folding, in the folded column order."""
        cols = ["window_start", "window_end", *[q(k) for k in qi.key_names]]
        for a, fn in qi.aggs:
            cols.append(f"CASE WHEN isfinite({q(a)}) THEN {q(a)} END AS {q(a)}" if fn == "avg" else q(a))
        return [*cols, "hosts", "closed_at", "CAST(0 AS BIGINT) AS corrections"]

    @staticmethod
    def _fold_cols(qi: QueryInfo) -> list[str]:
        """Aggregates folding finals and corrections of one (window, key) group."""
        fin = "kind <> 'correction'"
        w = q(qi.count_col) if qi.count_col else None
        cols = ["window_start", "max(window_end) AS window_end", *[q(k) for k in qi.key_names]]
        for a, fn in qi.aggs:
            c = q(a)
            if fn in ("count", "sum"):
                cols.append(f"CAST(sum({c}) AS BIGINT) AS {c}")
            elif fn in ("min", "max"):
                cols.append(f"{fn}({c}) AS {c}")
            elif w is not None:
                ok = f"{w} > 0 AND isfinite({c})"
                cols.append(f"sum(CASE WHEN {ok} THEN {c} * {w} ELSE 0 END)"
                            f" / nullif(sum(CASE WHEN {ok} THEN {w} ELSE 0 END), 0) AS {c}")  # fmt: skip
            else:
                final = f"max(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin})"
                sn, cn = q(f"{a}.sum"), q(f"{a}.count")
                cols.append(f"coalesce(sum({sn}) / nullif(sum({cn}), 0), {final}) AS {c}")
        return [
            *cols,
            f"coalesce(max(hosts) FILTER (WHERE {fin}), max(hosts)) AS hosts",
            f"coalesce(max(closed_at) FILTER (WHERE {fin}), max(closed_at)) AS closed_at",
            "count(*) FILTER (WHERE kind = 'correction') AS corrections",
        ]

    def _scan(self, src: _Source, filters: list[KeyFilter], params: dict[str, Any]) -> str:
        """The rows of the range (and filters) as a subquery; inlined, not a CTE, so it is never copied."""
        where = ["window_start >= $start", "window_start < $end", *self._filter_sql(filters, params, src.cached)]
        return f"(SELECT * FROM {src.rel} WHERE {' AND '.join(where)})"

    def _folded(self, qi: QueryInfo, files: list[FileStats], src: _Source, scan: str) -> tuple[str, str]:
        """(CTE prefix, subquery) of one row per (window, key) with corrections folded into finals.

        Grouping every row is the costly part and corrections are rare, so: rows of windows without
        corrections (``cw``) pass through; in windows with corrections, rows of groups without
        corrections (``ck``, matched on the window-and-key hash) pass through; only the rest is grouped.
        """
        keys = [q(k) for k in qi.key_names]
        plain = ", ".join(self._plain_cols(qi))
        if not any(f.kinds is None or "correction" in f.kinds for f in files):
            return "", f"(SELECT {plain} FROM {scan} WHERE kind <> 'correction')"
        ctes = (f", cw AS (SELECT DISTINCT window_start FROM {scan} WHERE kind = 'correction')"
                f", ck AS (SELECT DISTINCT {src.wkh} AS _h FROM {scan} WHERE kind = 'correction')")  # fmt: skip
        inw = f"(SELECT *, {src.wkh} AS _h FROM (SELECT * FROM {scan} SEMI JOIN cw USING (window_start)))"
        sub = (
            f"(SELECT {plain} FROM {scan} ANTI JOIN cw USING (window_start) WHERE kind <> 'correction'"
            f" UNION ALL SELECT {plain} FROM {inw} ANTI JOIN ck USING (_h) WHERE kind <> 'correction'"
            f" UNION ALL SELECT {', '.join(self._fold_cols(qi))} FROM (SELECT * FROM {inw} SEMI JOIN ck USING (_h))"
            f" GROUP BY {', '.join(['window_start', *keys])})"
        )
        return ctes, sub

    @staticmethod
    def _exec(cur: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[tuple]:
        used = {k: v for k, v in params.items() if f"${k}" in sql}
        try:
            return cur.execute(sql, used).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"reading the results store failed: {exc}") from None

    def _ranked_sql(self, qi: QueryInfo, files: list[FileStats], src: _Source, scan: str, term: OrderTerm, n: int,
                    narrow: bool) -> str:  # fmt: skip
        """``WITH ... ranked AS (...)``: the top-n folded rows of every window, with ``rank``.

        ``narrow``: first bound the candidates by the n-th value of each window (ties stay in), so
        the window function sorts only those rows.
        """
        v = q(term.column)
        rdir = "DESC" if term.descending else "ASC"
        keys = "".join(", " + q(k) for k in qi.key_names)
        ctes, cand = self._folded(qi, files, src, scan)
        if narrow:
            pick, cmp, ext = ("max", ">=", "list_min") if term.descending else ("min", "<=", "list_max")
            ctes += (f", th AS (SELECT window_start, CASE WHEN count({v}) >= {n}"
                     f" THEN {ext}({pick}({v}, {n})) END AS t FROM {cand} GROUP BY window_start)")  # fmt: skip
            cand = f"(SELECT f.* FROM {cand} AS f JOIN th USING (window_start) WHERE th.t IS NULL OR f.{v} {cmp} th.t)"
        return (f"WITH _ AS (SELECT 1){ctes}, ranked AS (SELECT *, row_number() OVER (PARTITION BY window_start"
                f" ORDER BY {v} {rdir} NULLS LAST{keys}) AS rank FROM {cand} QUALIFY rank <= {n})")  # fmt: skip

    def _fast_top(self, qi: QueryInfo, files: list[FileStats], start: datetime, end: datetime, n: int,
                  ws_desc: bool, limit: int, offset: int, sel: list[str]) -> tuple[list[tuple], int] | None:  # fmt: skip
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
                head = head.filter(pc.is_in(head.column("window_start"), value_set=pa.array(mine).cast(ts_type)))
            parts.append(head)
        simple_rows: list[tuple] = []
        n_simple = 0
        if parts:
            t = pa.concat_tables(parts)
            n_simple = t.num_rows
            t = t.sort_by([("window_start", "descending" if ws_desc else "ascending"), ("_rank", "ascending")])
            t = t.slice(0, need)
            cols = [t.column("window_start").cast(pa.int64()).to_pylist(), t.column("window_end").cast(pa.int64()).to_pylist()]
            cols += [t.column(c).to_pylist() for c in (*qi.key_names, *qi.agg_names, "hosts")]
            cols += [t.column("closed_at").cast(pa.int64()).to_pylist(), [0] * t.num_rows, t.column("_rank").to_pylist()]
            simple_rows = list(zip(*cols, strict=True))

        complex_rows: list[tuple] = []
        n_complex = 0
        if len(complex_w):
            per_window = dict(zip(cw.tolist(), cw_counts.tolist(), strict=True))
            corrected = np.unique(corr.column("_wkh").to_numpy()) if corr is not None and corr.num_rows else None
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
                src = _Source("lw_src", {}, True)
                scan = self._scan(src, [], params)
                with_ = self._ranked_sql(qi, files, src, scan, OrderTerm(qi.agg_names[0], True), n, narrow=False)
                got = self._exec(cur, f"{with_} SELECT {', '.join(sel)}, rank, count(*) OVER () FROM ranked"
                                      f" ORDER BY window_start {'DESC' if ws_desc else 'ASC'}, rank LIMIT $limit", params)  # fmt: skip
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
    def results(self, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter],
                order: list[OrderTerm], top: int | None, limit: int, offset: int) -> ResultSet:  # fmt: skip
        """Folded rows of windows with window_start in [start, end), optionally top-N per window, one page.

        Ordering: without ``top`` the rows are sorted by ``order`` (then window_start and the keys, so
        pages are stable). With ``top`` the first aggregate in ``order`` (default: the query's first
        aggregate, descending) ranks the groups of each window, ties broken by the key columns; rows
        come grouped by window (ascending unless ``order`` says ``-window_start``) in rank order, with
        a ``rank`` column.
        """
        files = self.index.files_for(qi.name, us_of(start), us_of(end))
        columns = list(qi.output_columns) + (["rank"] if top else [])
        times = frozenset({"window_start", "window_end", "closed_at"})
        if not files:
            return ResultSet(columns, [], 0, times)
        keys = [q(k) for k in qi.key_names]
        sel = ["epoch_us(window_start)", "epoch_us(window_end)", *keys, *[q(a) for a in qi.agg_names],
               "hosts", "epoch_us(closed_at)", "corrections"]  # fmt: skip
        aggs = set(qi.agg_names)
        default = OrderTerm(qi.agg_names[0], True)
        term = next((t for t in order if t.column in aggs), default)
        ws_desc = any(t.column == "window_start" and t.descending for t in order)
        if top and not filters and term == default:
            got = self._fast_top(qi, files, start, end, int(top), ws_desc, limit, offset, sel)
            if got is not None:
                return ResultSet(columns, got[0], got[1], times)
        cur = self.db.cursor()
        try:
            src = self._source(cur, qi, files)
            params = {**src.params, "start": start, "end": end, "limit": limit, "offset": offset}
            scan = self._scan(src, filters, params)
            if top:
                with_ = self._ranked_sql(qi, files, src, scan, term, int(top), narrow=True)
                sql = (f"{with_} SELECT {', '.join(sel)}, rank, count(*) OVER () FROM ranked"
                       f" ORDER BY window_start {'DESC' if ws_desc else 'ASC'}, rank LIMIT $limit OFFSET $offset")  # fmt: skip
                count_sql = f"{with_} SELECT count(*) FROM ranked"
            else:
                ctes, folded = self._folded(qi, files, src, scan)
                order_sql = [f"{q(t.column)} {'DESC' if t.descending else 'ASC'} NULLS LAST" for t in order]
                order_sql += ["window_start", *keys]
                sql = (f"WITH _ AS (SELECT 1){ctes} SELECT {', '.join(sel)}, NULL FROM {folded}"
                       f" ORDER BY {', '.join(order_sql)} LIMIT $limit OFFSET $offset")  # fmt: skip
                count_sql = f"WITH _ AS (SELECT 1){ctes} SELECT count(*) FROM {folded}"
            rows = self._exec(cur, sql, params)
            if top and rows:
                total = int(rows[0][-1])
            elif len(rows) < limit and (rows or not offset):
                total = offset + len(rows)
            else:
                total = int(self._exec(cur, count_sql, params)[0][0])
        finally:
            cur.close()
        return ResultSet(columns, [r[:-1] for r in rows], total, times)

    @_retry_once
    def series(self, qi: QueryInfo, start: datetime, end: datetime, filters: list[KeyFilter]) -> ResultSet:
        """Per window over all (filtered) groups: the number of groups and each aggregate's total.

        Totals need no per-group folding, so this is one pass over finals and corrections together:
        count/sum add up, min/max take the min/max, avg is the count-weighted mean when the query has a
        count aggregate (exact, corrections included), else the plain mean of the final rows' averages.
        ``groups`` counts the groups that have a final row.
        """
        files = self.index.files_for(qi.name, us_of(start), us_of(end))
        columns = ["window_start", "window_end", "groups", *qi.agg_names]
        times = frozenset({"window_start", "window_end"})
        if not files:
            return ResultSet(columns, [], 0, times)
        w = q(qi.count_col) if qi.count_col else None
        fin = "kind <> 'correction'"
        sel = ["epoch_us(window_start)", "epoch_us(max(window_end))", f"count(*) FILTER (WHERE {fin})"]
        for a, fn in qi.aggs:
            c = q(a)
            if fn in ("count", "sum"):
                sel.append(f"sum({c})")
            elif fn in ("min", "max"):
                sel.append(f"{fn}({c})")
            elif w is not None:
                ok = f"{w} > 0 AND isfinite({c})"
                sel.append(f"sum(CASE WHEN {ok} THEN {c} * {w} END) / nullif(sum(CASE WHEN {ok} THEN {w} END), 0)")
            else:
                sel.append(f"avg(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin})")
        cur = self.db.cursor()
        try:
            src = self._source(cur, qi, files)
            params = {**src.params, "start": start, "end": end}
            sql = (f"SELECT {', '.join(sel)} FROM {self._scan(src, filters, params)}"
                   " GROUP BY window_start ORDER BY window_start")  # fmt: skip
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
            files = self.index.files_in([p for _, p in dirs[-take:]])
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
                    rows = self._exec(cur, f"SELECT epoch_us(max(window_start)) FROM {src.rel}"
                                           " WHERE kind <> 'correction'", src.params)  # fmt: skip
                finally:
                    cur.close()
                if rows and rows[0][0] is not None:
                    return EPOCH + timedelta(microseconds=int(rows[0][0]))
        return None

    def warm(self, qi: QueryInfo, span: timedelta, stop: threading.Event | None = None) -> int:
        """Prepare the newest ``span`` of a query in the cache (so the first page view is fast)."""
        dirs = self.index.date_dirs(qi.name)
        files = self.index.files_in([p for _, p in dirs[-2:]])
        newest = max((f.max_us for f in files if f.max_us is not None), default=None)
        if newest is not None:
            files = [f for f in files if f.max_us is None or f.max_us >= newest - int(span.total_seconds() * 1e6)]
        if not self._fits(files):
            return 0
        done = 0
        for f in files:
            if stop is not None and stop.is_set():
                break
            done += self._cached(qi, f) is not None
        return done
