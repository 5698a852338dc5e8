"""Store maintenance: compaction of micro-batch files, roll-up tiers, retention per tier.

Where it runs: a background thread of the job process (:class:`Maintenance`, started by the job), not a
role of its own. Why: the job is the store's only writer and knows its checkpoint; a second role would
need the same paths and settings, a second deployment unit and a way to agree with the job on which
batches are final, while this work is a few seconds of Parquet I/O per hour. ``python -m
high_level.results.compact`` runs one pass by hand (or from a kill test) against a store and checkpoint.

What is final: a file of batch b, once b is below Spark's last committed batch (``commits/`` of the
stream's checkpoint), is never rewritten by a replay. Each pass, per query:

1. **tiers** (:mod:`high_level.results.tiers`): fold the final batches not folded yet into every tier;
2. **compaction**: per ``date=`` directory, merge the visible final files folded into the tiers into
   ``compact-<first>-<last>.parquet`` (the same rows, concatenated: nothing is re-aggregated): the
   batches of a run (an hour with the default interval) into one file, and a finished day's files into
   one; tier directories likewise, their files folded;
3. **deletes**: files covered by a merged file (:func:`contract.results.visible_files`) once the merged
   file has been in place ``grace_s`` (a reader listing a large directory while it changes could
   otherwise miss the merged file and the deleted ones alike);
4. **retention**: whole ``date=`` directories of the raw files and of each tier past the query's
   ``retention`` (raw defaults to ``--retention-days``).

Atomic for readers: a merged file is written to a hidden temporary name, fsynced and renamed into place
before anything it covers is deleted; readers skip covered files. Exactly once across kills: a merged
file's name is its batch range; a pass killed before the rename leaves a hidden temporary file (deleted
at the next pass) and the inputs, after it the merged file covering them (its inputs are then deleted).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from contract import query as Q
from contract import results as R
from contract import status as S
from high_level.results import tiers as T

log = logging.getLogger("lowwater.compact")
NS_PER_DAY = 86_400 * 1_000_000_000
# The checkpoint directories of the streams that write the store (high_level/aggregate/pipeline.py,
# watermark.py, join/pipeline.py): a query's batch ids are those of the stream that writes it.
_STREAM_DIRS = ("watermark/{q}", "join-{q}", "oop-chunked", "oop")
_TMP = re.compile(r"^\.(compact|part)-\d{12}-\d{12}\.parquet\.tmp$")


def committed_batch(checkpoint: str | Path, query: str) -> int | None:
    """Spark's last committed batch of the stream that writes ``query`` (None: no commit yet)."""
    for pattern in _STREAM_DIRS:
        commits = Path(checkpoint) / pattern.format(q=query) / "commits"
        try:
            ids = [int(e.name) for e in os.scandir(commits) if e.name.isdigit()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        return max(ids) if ids else None
    return None


@dataclass
class PassResult:
    merged: int = 0  # input files merged
    deleted: int = 0  # covered files deleted
    tier_rows: int = 0
    expired: list[Path] = field(default_factory=list)


class Compactor:
    """One maintenance pass over the store (:meth:`run_once`); see the module docstring."""

    def __init__(
        self,
        root: str | Path,
        queries: Iterable[Q.QuerySpec],
        checkpoint: str | Path,
        raw_retention_days: int | None = None,
        grace_s: float = 30.0,
        min_files: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.queries = {q.name: q for q in queries}
        self.checkpoint = Path(checkpoint)
        self.raw_retention_days = raw_retention_days
        self.grace_s = grace_s
        self.min_files = min_files
        self.clock = clock
        self.status = S.CompactionStatus()

    def run_once(self) -> PassResult:
        out = PassResult()
        now = self.clock()
        bound = None
        for q in self.queries.values():
            committed = committed_batch(self.checkpoint, q.name)
            if committed is None:
                continue
            bound = committed if bound is None else max(bound, committed)
            newest = max(
                (
                    r[1]
                    for _d, d in R.date_dirs(self.root, q.name)
                    for n in os.listdir(d)
                    if (r := R.batch_range(n))
                ),
                default=-1,
            )
            if newest > committed + 1:  # only the running batch may be ahead of the commit log
                raise RuntimeError(
                    f"query {q.name}: the store holds batch {newest} but the checkpoint committed only "
                    f"{committed} (a new checkpoint over old results?): not compacting, new files could be hidden"
                )
            final = committed - 1  # below the last committed batch: no replay can rewrite it
            if q.tiers:
                out.tier_rows += T.build(self.root, q, final)
                final = min(final, T.folded_through(self.root, q.name))
            self._compact_raw(q, final, now, out)
            for width in q.tiers:
                self._compact_tier(q, R.tier_name(width), now, out)
            self._expire(q, now, out)
        self.status = S.CompactionStatus(
            runs=self.status.runs + 1,
            last_run_ms=int(now * 1000),
            committed_batch=bound,
            files_merged=self.status.files_merged + out.merged,
            files_deleted=self.status.files_deleted + out.deleted,
            tier_rows=self.status.tier_rows + out.tier_rows,
            errors=self.status.errors,
            last_error=self.status.last_error,
        )
        return out

    # ---- compaction
    def _listing(
        self, d: Path, ranged: Callable[[str], tuple[int, int] | None]
    ) -> dict[str, tuple[int, int]]:
        named = {}
        for e in os.scandir(d):
            if _TMP.match(e.name):  # a merge a killed pass left half-written: never renamed, never read
                Path(e.path).unlink(missing_ok=True)
            elif (r := ranged(e.name)) is not None:
                named[e.name] = r
        return named

    def _delete_covered(
        self, d: Path, named: dict[str, tuple[int, int]], now: float, out: PassResult, upto: int | None = None
    ) -> None:
        """Delete the files a merged file covers, once it has been in place ``grace_s`` (``upto``: the
        query's committed batch, :func:`contract.results.committed_batch`)."""
        visible = R.visible_files(named, upto)
        for name in visible:
            a, b = named[name]
            if a == b and not name.startswith("compact-"):
                continue
            inside = [
                n for n, (x, y) in named.items() if n != name and a <= x and y <= b and n not in visible
            ]
            if not inside:
                continue
            try:
                if max(now, time.time()) - os.stat(d / name).st_mtime < self.grace_s:
                    continue
            except FileNotFoundError:
                continue
            T.stop_at("before_delete")
            for n in inside:
                (d / n).unlink(missing_ok=True)
                out.deleted += 1

    def _compact_raw(self, q: Q.QuerySpec, final: int, now: float, out: PassResult) -> None:
        today = datetime.fromtimestamp(now, UTC).date()
        upto = R.committed_batch(self.root, q.name)
        for day, d in R.date_dirs(self.root, q.name):
            named = self._listing(d, R.batch_range)
            named = {
                n: r for n, r in named.items() if not R.is_task_part(n) or upto is not None and r[1] <= upto
            }
            visible = R.visible_files(named, upto)
            done = [n for n in visible if named[n][1] <= final]
            if day < today and len(done) == len(visible) and len(done) >= 2:
                pick = done  # a finished day: one file
            else:
                pick = [n for n in done if not n.startswith("compact-")]  # this run's batches
                lo = min((named[n][0] for n in pick), default=0)
                hi = max((named[n][1] for n in pick), default=-1)
                pick = [n for n in done if lo <= named[n][0] and named[n][1] <= hi]  # a nested compact too
            if len(pick) >= self.min_files:
                first, last = min(named[n][0] for n in pick), max(named[n][1] for n in pick)
                path = d / R.compact_name(first, last)
                self._concat(q, [d / n for n in pick], path)
                named[path.name] = (first, last)
                out.merged += len(pick)
            self._delete_covered(d, named, now, out, upto)

    def _concat(self, q: Q.QuerySpec, inputs: list[Path], path: Path) -> None:
        """The inputs' rows, in order, into one file (streamed: one input in memory at a time)."""
        schema = R.schema(q)
        tmp = path.with_name(f".{path.name}.tmp")
        with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
            for p in inputs:
                w.write_table(pq.read_table(p, schema=schema))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        T.stop_at("before_rename")
        os.replace(tmp, path)
        T.stop_at("after_rename")

    def _compact_tier(self, q: Q.QuerySpec, tier: str, now: float, out: PassResult) -> None:
        today = datetime.fromtimestamp(now, UTC).date()
        for day, d in R.tier_date_dirs(self.root, q.name, tier):
            named = self._listing(d, R.tier_batch_range)
            visible = R.visible_files(named)
            # a finished day's files folded into one (the day's run files stay apart until then: each
            # merge re-folds the whole day)
            if day < today and len(visible) >= self.min_files:
                first, last = min(named[n][0] for n in visible), max(named[n][1] for n in visible)
                path = d / R.tier_part_name(first, last)
                merged = T.merge_files(q, tier, [d / n for n in visible])
                T.stop_at("before_rename")
                T.write_atomic(merged, path)
                named[path.name] = (first, last)
                out.merged += len(visible)
            self._delete_covered(d, named, now, out)

    # ---- retention
    def _expire(self, q: Q.QuerySpec, now: float, out: PassResult) -> None:
        now_ns = int(now * 1e9)
        raw = R.retention_ns(q, R.RAW_TIER, self.raw_retention_days)
        tiers = [(R.tier_name(w), R.retention_ns(q, R.tier_name(w))) for w in q.tiers]
        for tier, keep in [(R.RAW_TIER, raw), *tiers]:
            if keep is None:
                continue
            cutoff = _day_of(now_ns - keep)  # a day wholly before it is gone
            if tier == R.RAW_TIER:
                dirs = [*R.date_dirs(self.root, q.name), *R.incomplete_date_dirs(self.root, q.name)]
            else:
                dirs = R.tier_date_dirs(self.root, q.name, tier)
            for day, d in dirs:
                if day < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
                    out.expired.append(d)

    def tier_bytes(self) -> dict[str, dict[str, int]]:
        """Per query, per tier (``raw`` and each roll-up tier): bytes of its files."""
        out: dict[str, dict[str, int]] = {}
        for q in self.queries.values():
            sizes = {R.RAW_TIER: sum(_dir_bytes(d) for _, d in R.date_dirs(self.root, q.name))}
            for w in q.tiers:
                t = R.tier_name(w)
                sizes[t] = sum(_dir_bytes(d) for _, d in R.tier_date_dirs(self.root, q.name, t))
            out[q.name] = sizes
        return out


def _day_of(ns: int) -> date:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)).date()


def _dir_bytes(d: Path) -> int:
    total = 0
    for e in os.scandir(d):
        try:
            total += e.stat().st_size
        except FileNotFoundError:
            continue
    return total


class Maintenance:
    """The compactor on a background thread of the job: a pass every ``every_s`` (errors are logged and
    counted, the next pass retries: every step is idempotent)."""

    def __init__(self, compactor: Compactor, every_s: float = 3600.0) -> None:
        self.compactor = compactor
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lowwater-compact", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                res = self.compactor.run_once()
                for d in res.expired:
                    log.info("retention: deleted %s", d)
            except Exception as exc:  # noqa: BLE001 - counted and retried at the next pass
                st = self.compactor.status
                self.compactor.status = st.model_copy(
                    update={"errors": st.errors + 1, "last_error": str(exc)}
                )
                log.exception("store maintenance failed (retried at the next pass)")
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def main(argv: list[str] | None = None) -> int:
    """One maintenance pass: ``--results R --checkpoint C --config queries.yaml``."""
    ap = argparse.ArgumentParser(prog="python -m high_level.results.compact", description=main.__doc__)
    ap.add_argument("--results", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--retention-days", type=int, default=None)
    ap.add_argument("--grace-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = Q.load(args.config)
    c = Compactor(args.results, cfg.stored_queries, args.checkpoint, args.retention_days, args.grace_s)
    res = c.run_once()
    log.info(
        "merged %d files, deleted %d, %d tier rows, expired %d",
        res.merged,
        res.deleted,
        res.tier_rows,
        len(res.expired),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
