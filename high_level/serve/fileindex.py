"""Which result files a request has to read: a footer-statistics index over the results store.

Why: a dataset of days of one-file-per-batch parts has thousands of files, and letting DuckDB glob
and open all of them per request costs far more than the query itself. The index keeps, per file
(keyed by path, size and mtime, so a rewritten file is read again), the window_start range from the
Parquet footer statistics; a request then hands DuckDB only the files whose range overlaps the asked
range (date directories outside it are not even listed).

Names and schema come from :mod:`contract.results`: only ``query=<q>/date=<day>/part-<batch>.parquet``
and ``compact-<first>-<last>.parquet`` are result files (temporary and hidden files are not), and of
those only the visible ones are read (:func:`contract.results.visible_files`: a file a compacted file
covers is skipped, so a request never reads a row twice while the compactor works), and a file whose columns are not exactly
:func:`contract.results.schema` of its query, or whose footer cannot be read, is rejected: skipped,
logged once with the reason and counted (:meth:`FileIndex.rejected`, shown in ``/health``), never cast.

Concurrency: requests run on a thread pool while the job writes. Each refresh of a directory builds a
new immutable :class:`DirState` and publishes it under the lock (copy-on-write), so a request always
works on one consistent listing and never sees another request's half-done update.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R
from contract.query import QuerySpec
from high_level.serve.timefmt import EPOCH, us_of

log = logging.getLogger("lowwater.api")
SETTLE_S = 10.0  # a file modified this recently may still change (a replay): stat it on every request
FULL_RECHECK_S = 30.0  # re-list every directory this often, whatever its mtime says
# A directory modified this close to its listing may have changed again within the same mtime tick
# (filesystem clocks are coarse): its listing is not trusted until it has been re-listed.
DIR_SLACK_S = 1.0
LIST_ATTEMPTS = 5  # a directory listed this many times, each stale before its files were stat'ed: 503


class StoreError(RuntimeError):
    """The results store could not be read (not the user's fault): the API answers 503."""


@dataclass(frozen=True)
class FileStats:
    """One usable result file: its batch and window_start range (None: unknown, always read)."""

    path: str
    size: int
    mtime_ns: int
    batch: int
    min_us: int | None
    max_us: int | None
    kinds: frozenset[str] | None  # row kinds per the footer; None = unknown
    last_batch: int = -1  # a compacted file's last batch (a part: its batch)


@dataclass(frozen=True)
class Checked:
    """What one look at a file found: usable stats, a reason to reject it, or neither (no rows)."""

    size: int
    mtime_ns: int
    stats: FileStats | None
    problem: str | None = None


def _int_stat(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, datetime):
        return us_of(v if v.tzinfo else v.replace(tzinfo=UTC))
    return None


def read_stats(spec: QuerySpec, path: str, size: int = 0, mtime_ns: int = 0) -> Checked:
    """Footer of one result file -> its window_start range, or the reason it breaks the layout.

    FileNotFoundError propagates: a file deleted since it was listed (a replay) is gone, not broken.
    """
    try:
        md = pq.read_metadata(path)
        schema = md.schema.to_arrow_schema()
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:
        return Checked(size, mtime_ns, None, f"unreadable Parquet footer: {exc}")
    try:
        R.check_file_schema(spec, schema, where=path)
    except R.ResultsLayoutError as exc:
        return Checked(size, mtime_ns, None, str(exc))
    if md.num_rows == 0:
        return Checked(size, mtime_ns, None)
    batches = R.batch_range(os.path.basename(path))
    required = {f.name for f in R.schema(spec) if not f.nullable}
    col = {md.schema.column(i).path: i for i in range(md.num_columns)}
    lo = hi = None
    known = True
    kinds: set[str] | None = set()
    for rg in range(md.num_row_groups):
        rgm = md.row_group(rg)
        for name in required:
            st = rgm.column(col[name]).statistics
            if st is not None and st.null_count:
                return Checked(
                    size, mtime_ns, None, f"{path}: column {name!r} has nulls, the layout forbids them"
                )
        st = rgm.column(col["window_start"]).statistics
        a = _int_stat(st.min_raw) if st is not None and st.has_min_max else None
        b = _int_stat(st.max_raw) if st is not None and st.has_min_max else None
        if a is None or b is None:
            known = False
        else:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        ks = rgm.column(col["kind"]).statistics
        if ks is None or not ks.has_min_max:
            kinds = None
        elif kinds is not None:
            kinds.update({str(ks.min), str(ks.max)})
    if kinds is not None and not kinds <= set(R.ROW_KINDS):
        return Checked(
            size, mtime_ns, None, f"{path}: row kinds {sorted(kinds)}, the layout has {list(R.ROW_KINDS)}"
        )
    if not known:
        lo = hi = None
    stats = FileStats(
        path,
        size,
        mtime_ns,
        batches[0] if batches is not None else -1,
        lo,
        hi,
        frozenset(kinds) if kinds is not None else None,
        batches[1] if batches is not None else -1,
    )
    return Checked(size, mtime_ns, stats)


@dataclass(frozen=True)
class DirState:
    """One listing of a date directory; never mutated once published (a refresh makes a new one)."""

    built_ns: (
        int  # time.monotonic_ns() when the refresh began: a newer listing is never replaced by an older one
    )
    mtime_ns: int  # the directory's mtime when it was listed
    sure: bool  # False: mtime within DIR_SLACK_S of the listing, re-list on the next request
    listed: float  # time.monotonic() of the last full listing
    files: Mapping[str, Checked]  # path -> what was found
    good: dict[int | None, tuple[FileStats, ...]]  # the usable ones per committed batch (see _good)


def _dir_state(
    built_ns: int, mtime_ns: int, sure: bool, listed: float, files: dict[str, Checked]
) -> DirState:
    return DirState(built_ns, mtime_ns, sure, listed, MappingProxyType(files), {})


def _good(state: DirState, upto: int | None) -> tuple[FileStats, ...]:
    """The usable files of a listing that a reader reads when ``upto`` is the query's committed batch:
    never a file a compacted file covers, nor a task file of a batch not committed yet."""
    got = state.good.get(upto)
    if got is None:
        files = state.files
        named = {
            os.path.basename(p): r for p in files if (r := R.batch_range(os.path.basename(p))) is not None
        }
        visible = set(R.visible_files(named, upto))
        got = tuple(
            c.stats for p, c in files.items() if c.stats is not None and os.path.basename(p) in visible
        )
        state.good[upto] = got  # a cache of a pure function of the (immutable) listing
    return got


class FileIndex:
    """Per-file footer statistics, cached by (path, size, mtime) so only new or changed files are read.

    Thread-safe: ``_dirs`` is read and replaced only under ``_lock``, and what it maps to is immutable.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[str, DirState] = {}
        self._lock = threading.Lock()
        self._rejected_versions: set[tuple[str, int, int]] = set()

    def date_dirs(self, query: str) -> list[tuple[date, str]]:
        """(day, path) of a query's ``date=`` partitions, oldest first (other entries are not results)."""
        base = R.query_dir(self.root, query)
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {base}: {exc.strerror}") from None
        out = [(d, e.path) for e in entries if (d := R.parse_date_dir(e.name)) is not None and e.is_dir()]
        out.sort()
        return out

    def _check(self, spec: QuerySpec, path: str, st: os.stat_result, got: Checked | None) -> Checked:
        """The cached look at a file if its size and mtime are unchanged, else a fresh one."""
        if got is not None and got.size == st.st_size and got.mtime_ns == st.st_mtime_ns:
            return got
        new = read_stats(spec, path, st.st_size, st.st_mtime_ns)
        if new.problem is not None:
            with self._lock:
                first = (path, new.size, new.mtime_ns) not in self._rejected_versions
                self._rejected_versions.add((path, new.size, new.mtime_ns))
            if first:
                log.warning("skipping results file: %s", new.problem)
        return new

    def _scan_dir(
        self, spec: QuerySpec, d: str, old: DirState | None, mtime_ns: int, wall_ns: int, built_ns: int
    ) -> DirState:
        """List and stat every part of a directory (re-reading footers only of new or changed files).

        A listed file that is gone when stat'ed means the listing is stale (the compactor may have
        renamed in the file that covers it since): list again rather than drop its rows."""
        known = old.files if old is not None else {}
        for _attempt in range(LIST_ATTEMPTS):
            try:
                entries = list(os.scandir(d))
            except FileNotFoundError:
                entries = []
            except OSError as exc:
                raise StoreError(f"cannot list {d}: {exc.strerror}") from None
            files: dict[str, Checked] = {}
            stale = False
            for e in entries:
                if R.batch_range(e.name) is None:
                    continue
                try:
                    files[e.path] = self._check(spec, e.path, e.stat(), known.get(e.path))
                except FileNotFoundError:
                    stale = True
                    break
            if not stale:
                sure = mtime_ns < wall_ns - int(DIR_SLACK_S * 1e9)
                return _dir_state(built_ns, mtime_ns, sure, time.monotonic(), files)
            try:
                mtime_ns, wall_ns = os.stat(d).st_mtime_ns, time.time_ns()
            except FileNotFoundError:
                return _dir_state(built_ns, 0, False, time.monotonic(), {})
        raise StoreError(f"{d} kept changing while it was listed ({LIST_ATTEMPTS} times)")

    def _recheck(self, spec: QuerySpec, state: DirState, wall_ns: int, built_ns: int) -> DirState:
        """Stat again the files that may still change (recent, rejected or empty); ``state`` if none did."""
        files = dict(state.files)
        changed = False
        for path, got in state.files.items():
            if got.stats is not None and wall_ns - got.mtime_ns >= SETTLE_S * 1e9:
                continue
            try:
                new = self._check(spec, path, os.stat(path), got)
            except FileNotFoundError:
                del files[path]  # our own copy: the published state is never edited
                changed = True
                continue
            if new is not got:
                files[path] = new
                changed = True
        if not changed:
            return state
        return _dir_state(built_ns, state.mtime_ns, state.sure, state.listed, files)

    def _publish(self, d: str, state: DirState) -> None:
        with self._lock:
            cur = self._dirs.get(d)
            if cur is None or cur.built_ns <= state.built_ns:
                self._dirs[d] = state

    def files_in(self, spec: QuerySpec, dirs: list[str]) -> list[FileStats]:
        """The usable result files of ``spec`` in these directories.

        A directory whose mtime is unchanged (and was old enough when listed) holds the same names,
        so only its unsettled files are stat'ed again; every FULL_RECHECK_S it is listed again anyway.
        """
        out: list[FileStats] = []
        try:  # read before the listings: a batch committed after it stays hidden until the next request
            upto = R.committed_batch(self.root, spec.name)
        except R.ResultsLayoutError as exc:
            raise StoreError(str(exc)) from None
        for d in dirs:
            built_ns, wall_ns = time.monotonic_ns(), time.time_ns()
            try:
                mtime_ns = os.stat(d).st_mtime_ns
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot stat {d}: {exc.strerror}") from None
            with self._lock:
                state = self._dirs.get(d)
            if (
                state is None
                or state.mtime_ns != mtime_ns
                or not state.sure
                or time.monotonic() - state.listed > FULL_RECHECK_S
            ):
                new = self._scan_dir(spec, d, state, mtime_ns, wall_ns, built_ns)
            else:
                new = self._recheck(spec, state, wall_ns, built_ns)
            if new is not state:
                self._publish(d, new)
            out.extend(_good(new, upto))
        return out

    def files_for(self, spec: QuerySpec, start_us: int, end_us: int) -> list[FileStats]:
        """Files that may hold windows with window_start in [start_us, end_us)."""
        first = (EPOCH + timedelta(microseconds=start_us)).date() - timedelta(days=1)
        last = (EPOCH + timedelta(microseconds=end_us)).date() + timedelta(days=1)
        dirs = [p for d, p in self.date_dirs(spec.name) if first <= d <= last]
        return [
            f
            for f in self.files_in(spec, dirs)
            if f.min_us is None or f.max_us is None or (f.max_us >= start_us and f.min_us < end_us)
        ]

    def forget(self) -> None:
        """Drop every directory listing (the next request lists and stats again)."""
        with self._lock:
            self._dirs.clear()

    def rejected(self) -> dict[str, str]:
        """Path -> reason of every listed result file that breaks the layout (as last seen)."""
        with self._lock:
            states = list(self._dirs.values())
        return {p: c.problem for s in states for p, c in s.files.items() if c.problem is not None}

    @property
    def rejections(self) -> int:
        """How many distinct file versions were rejected since start (a counter: it never goes down)."""
        with self._lock:
            return len(self._rejected_versions)
