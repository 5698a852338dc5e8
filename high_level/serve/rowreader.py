"""Reading a row-window query's results (``kind: rows``) for the API: its files, filtered and paged.

A row window has no time span, so the time-window reader (window_start statistics, DuckDB, tiers) does not
apply: a request's range is by ``closed_at`` (the day directories the job files them under), and the files
are few per day (one per micro-batch that closed windows), read whole with Arrow and kept while unchanged
(by path, size and mtime). The layout is :func:`contract.rowresults.row_schema`'s: a file that breaks it
is skipped, logged once and counted (``/health``), never cast, as the time-window reader does.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import fields as F
from contract import results as R
from contract.query.rows import RowQuerySpec
from contract.rowresults import row_schema
from high_level.serve import params as P
from high_level.serve.reader import ResultSet

log = logging.getLogger("lowwater.api")
CACHE_FILES = 512  # row-window files kept read (the newest are what the page asks for)
STREAM = ("host", "incarnation")  # with the partition_by columns: one numbering of rows


@dataclass(frozen=True)
class RowInfo:
    """A row query's columns as the API serves them."""

    spec: RowQuerySpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def schema(self) -> pa.Schema:
        return row_schema(self.spec)

    @property
    def key_kinds(self) -> dict[str, str]:
        """The columns a filter may name: the host, the partition and group fields (ip or int)."""
        kinds = {"host": "text"}
        for n in (*self.spec.partition_by, *self.spec.group_by):
            kinds[n] = "ip" if F.CATALOG[n].kind == "ip" else "int"
        return kinds

    @property
    def agg_names(self) -> list[str]:
        return [n for a in self.spec.aggregates for n, _ in a.output_columns()]

    @property
    def order_columns(self) -> list[str]:
        bounds = [f.name for f in self.schema if f.name in ("first_row", "end_row", "window_end")]
        return [
            "closed_at",
            "window",
            *bounds,  # a row window's row numbers, a slide-by-tuple window's end time
            *self.agg_names,
            *self.key_kinds,
            "incarnation",
        ]

    @property
    def stream_columns(self) -> list[str]:
        return [*STREAM, *self.spec.partition_by]


class RowReader:
    """The row-window files of a results directory, read whole and kept while unchanged."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int, int], pa.Table] = OrderedDict()
        self._rejected: set[tuple[str, int, int]] = set()

    @property
    def rejected_count(self) -> int:
        with self._lock:
            return len(self._rejected)

    def table(self, ri: RowInfo, start: datetime | None = None, end: datetime | None = None) -> pa.Table:
        """Every stored row of the query whose ``closed_at`` is in [start, end) (None: unbounded)."""
        lo = None if start is None else start.date()
        hi = None if end is None else end.date()
        days = [
            d
            for day, d in R.date_dirs(self.root, ri.name)
            if (lo is None or day >= lo) and (hi is None or day <= hi)
        ]
        t = self._days(ri, days)
        if start is not None:
            t = t.filter(pc.greater_equal(t["closed_at"], pa.scalar(start, R.TIMESTAMP)))
        if end is not None:
            t = t.filter(pc.less(t["closed_at"], pa.scalar(end, R.TIMESTAMP)))
        return t

    def newest_day(self, ri: RowInfo) -> pa.Table:
        """The rows of the newest day directory that has any (what /latest and the page start from)."""
        for _, d in reversed(R.date_dirs(self.root, ri.name)):
            t = self._days(ri, [d])
            if t.num_rows:
                return t
        return ri.schema.empty_table()

    def _days(self, ri: RowInfo, days: list[Path]) -> pa.Table:
        committed = R.committed_batch(self.root, ri.name)
        parts = []
        for d in days:
            named = {}
            for f in d.iterdir():
                rng = R.batch_range(f.name)
                if rng is not None:
                    named[f.name] = rng
            for name in R.visible_files(named, committed):
                t = self._read(ri, d / name)
                if t is not None and t.num_rows:
                    parts.append(t)
        return pa.concat_tables(parts) if parts else ri.schema.empty_table()

    def _read(self, ri: RowInfo, path: Path) -> pa.Table | None:
        try:
            st = path.stat()
        except FileNotFoundError:  # compacted or replaced meanwhile
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._rejected:
                return None
            t = self._cache.get(key)
            if t is not None:
                self._cache.move_to_end(key)
                return t
        try:
            t = pq.read_table(path)
            problem = (
                None if t.schema.equals(ri.schema, check_metadata=False) else "columns differ from the layout"
            )
        except (OSError, pa.ArrowException) as exc:
            t, problem = None, f"unreadable: {exc}"
        with self._lock:
            if problem is not None:
                if key not in self._rejected:
                    log.warning(
                        "row-window file %s skipped: %s (contract.rowresults.row_schema)", path, problem
                    )
                self._rejected.add(key)
                return None
            self._cache[key] = t
            while len(self._cache) > CACHE_FILES:
                self._cache.popitem(last=False)
        return t


def select(
    ri: RowInfo,
    t: pa.Table,
    filters: list[P.KeyFilter],
    order: list[P.OrderTerm],
    complete: bool | None,
    limit: int,
    offset: int,
) -> ResultSet:
    """Filter (same column OR-ed, columns AND-ed), keep complete / incomplete rows, order and page."""
    by_col: dict[str, list[P.KeyFilter]] = {}
    for f in filters:
        by_col.setdefault(f.column, []).append(f)
    for col, fs in by_col.items():
        mask = None
        for f in fs:
            m = _match(t[col], f)
            mask = m if mask is None else pc.or_(mask, m)
        t = t.filter(mask)
    if complete is not None:
        t = t.filter(pc.equal(t["complete"], complete))
    terms = order or [P.OrderTerm("closed_at", False), *(P.OrderTerm(c, False) for c in ri.stream_columns)]
    if not order:
        terms += [P.OrderTerm("window", False), *(P.OrderTerm(c, False) for c in ri.spec.group_by)]
    t = t.sort_by([(x.column, "descending" if x.descending else "ascending") for x in terms])
    total = t.num_rows
    page = t.slice(offset, limit)
    cols = [c for c in page.column_names if c != "kind"]
    plain = page.select(cols)
    for i, f in enumerate(plain.schema):  # ns timestamps to us first: the cast to int64 keeps the unit
        if pa.types.is_timestamp(f.type) and f.type.unit != "us":
            plain = plain.set_column(i, f.name, plain[f.name].cast(pa.timestamp("us", f.type.tz), safe=False))
    times = frozenset(f.name for f in plain.schema if pa.types.is_timestamp(f.type))
    rows = [tuple(r[c] for c in cols) for r in plain.cast(_plain(plain.schema)).to_pylist()]
    return ResultSet(cols, rows, total, times)


def latest(ri: RowInfo, t: pa.Table) -> pa.Table:
    """The newest closed window of each stream (host incarnation, partition value): all its groups."""
    if not t.num_rows:
        return t
    cols = ri.stream_columns
    top = t.group_by(cols, use_threads=False).aggregate([("window", "max")])
    return (
        t.join(top, cols, use_threads=False)
        .filter(pc.equal(pc.field("window"), pc.field("window_max")))
        .drop(["window_max"])
    )


def _plain(schema: pa.Schema) -> pa.Schema:
    """Timestamps (``closed_at``; a slide-by-tuple window's ``window_end``, in ns) as microseconds since the
    epoch (the API's time converter formats them), the rest as is."""
    return pa.schema([pa.field(f.name, pa.int64()) if pa.types.is_timestamp(f.type) else f for f in schema])


def _match(col: pa.ChunkedArray, f: P.KeyFilter) -> pa.ChunkedArray:
    if f.op == "eq":
        return pc.equal(col, pa.scalar(f.value, col.type))
    if f.op == "v4prefix":
        return pc.starts_with(col, f.value)
    lo, hi = f.bounds or (0, -1)
    values = pc.unique(col).to_pylist()  # per distinct address, not per row
    inside = [v for v in values if v is not None and lo <= _addr128(v) <= hi]
    return pc.is_in(col, pa.array(inside, col.type))


def _addr128(text: str) -> int:
    a = ipaddress.ip_address(text)
    return P.V4_MAPPED | int(a) if a.version == 4 else int(a)
