"""The sink of the job: each micro-batch's closed windows to the result store, its status rows to the
status document and the metrics, its fired alerts to the alert store and the delivery queue.

The aggregate stream's closed rows are written where they are (:mod:`high_level.results.tasks`): each
Spark task writes its partitions' files and evaluates HAVING, alerts and the holistic second stage on
them, and hands the driver a summary; the driver commits the batch (:meth:`ResultSink.commit`: a
manifest, then each query's commit marker), so no row is encoded in one process. The driver still
writes what needs every partition or goes to Kafka from here: the rows of queries whose conditions
read a window total (:mod:`high_level.results.windowtotal`), the finals the joins' feed publishes,
the joins' own output, and the flagged windows (small). With live values on, the tasks also publish
the provisional values and the finals they wrote, with the tombstones (:mod:`high_level.live.publish`),
so no row of those queries reaches the driver. It owns the alert deliveries and the status document,
so a replayed batch decides and writes the same.

Why its own module: it is the job's half of the job -> API seam (:mod:`contract.results` for the
Parquet files, :mod:`contract.status` for ``_status.json``); the Spark wiring in :mod:`high_level.job`
only hands it Arrow tables.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import query as Q
from contract import results as R
from contract import status as S
from high_level.aggregate.pacer import IdlePacer
from high_level.aggregate.packed import QueryWindows, unpack_incomplete, unpack_rows, unpack_windows
from high_level.aggregate.rollup import Layout
from high_level.live.publish import LIVE_KINDS, LivePublisher, split_provisional
from high_level.metrics import JobMetrics
from high_level.results.alerts import AlertDelivery
from high_level.results.compact import Compactor
from high_level.results.export import ResultExporter
from high_level.results.store import ResultStore, atomic_write_bytes, generic_table
from high_level.results.tasks import (
    ALERTS_KIND,
    EXPORT_KIND,
    SUMMARY_KINDS,
    WRITTEN_KIND,
    closed_windows,
    ipc_table,
    latest_close,
)
from high_level.results.windowtotal import TotalGate

log = logging.getLogger("lowwater.sink")
# A test's kill point: the job stops itself (SIGSTOP) before committing batch >= this. Unset in production.
STOP_AT_ENV = "LOWWATER_JOB_STOP_BEFORE_COMMIT"
MANIFESTS_KEPT = 100  # batch manifests kept (the newest); the commit markers say what is visible


class ResultSink:
    """Writes closed windows, folds per-partition status into the status document, feeds the metrics."""

    def __init__(
        self,
        store: ResultStore,
        queries: Sequence[Q.QuerySpec],
        mode: str,
        settings: S.JobSettings,
        metrics: JobMetrics,
        progress: Callable[[], dict[str, S.StreamProgress]],
        delivery: AlertDelivery | None = None,
        on_status: Callable[[list[S.PartitionStatus]], object] | None = None,
        live: LivePublisher | None = None,
        feed: Any = None,
    ) -> None:
        self.store = store
        self.delivery = delivery
        self.layouts = {q.name: Layout.of(q) for q in queries}
        self.mode = mode
        self.settings = settings
        self.metrics = metrics
        self.progress = progress
        self.on_status = on_status  # e.g. the punctuation asker (high_level/ondemand.py)
        self.live = live  # provisional and final values to the live topics (contract/live.py)
        self.feed = feed  # closed windows that joins read (high_level/join/feed.FeedPublisher)
        # watchers (tests, benchmarks): each batch's generic rows, unpacked only if someone watches; and a
        # call after each batch is written
        self.on_rows: list[Callable[[pa.Table, int], object]] = []
        self.on_batch: list[Callable[[int], object]] = []
        self.before_commit: list[Callable[[int], object]] = []  # fault hooks: after the tasks wrote
        self.exporter: ResultExporter | None = None  # merges the tasks' export summaries (the job sets it)
        self._lock = threading.Lock()
        self.partitions: dict[str, dict[int, S.PartitionStatus]] = {}
        self._summaries: dict[str, S.QueryStatus] = {}  # summarize_query of each query's partitions
        self.totals = TotalGate(
            store.root, queries
        )  # HAVING/alerts over total(): rows wait for every partition
        self.last_batch: dict[str, Any] = {}
        self._maintained_ms = 0
        self.store_bytes: int | None = None
        self.tier_bytes: dict[str, dict[str, int]] = {}
        self.compactor: Compactor | None = None  # the store's maintenance (the job sets it): its status
        self.pacer: IdlePacer | None = (
            None  # waits after a batch that left no window open (the pipeline sets it)
        )
        try:
            prev = S.read(store.status_path)
        except S.StatusUnavailable:
            prev = None
        if prev is not None and prev.mode == mode:  # a restart: keep what partitions reported before
            for qn, qs in prev.queries.items():
                self.partitions[qn] = {int(k): v for k, v in qs.partitions.items()}

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Time one micro-batch of a stream (its Spark job included) into the batch-duration metric."""
        t0 = time.monotonic()
        yield
        self.metrics.batch_duration.observe(time.monotonic() - t0)

    def foreach_packed(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` of the stateful streams: one action (``toArrow``) so the step runs once, then write."""
        with self.timed():
            self.handle_packed(df.toArrow(), batch_id)

    def driver_queries(self) -> frozenset[str]:
        """The queries whose closed rows the driver needs, and so writes itself: those whose conditions
        read a window total (the gate needs every partition's rows), every query when a watcher wants
        generic rows, and those a join reads (the feed). The live topics need none: the tasks write
        the store and send the finals back for the publisher (:meth:`foreach_tasks`)."""
        if self.on_rows:
            return frozenset(self.layouts)
        feed = set(self.feed.queries) if self.feed is not None else set()
        return frozenset(self.totals.queries) | frozenset(feed)

    def foreach_tasks(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` of the aggregate stream: the tasks write their closed rows
        (:mod:`high_level.results.tasks`, one action), the driver gets the summaries and commits."""
        from high_level.aggregate.packed import OUTPUT_DDL
        from high_level.results.tasks import task_writer

        local = frozenset(self.store.queries) - self.driver_queries()
        live = self.live.kafka if self.live is not None else None
        if not local:  # every row goes to the driver anyway (a watcher): no pass over them in the tasks
            self.foreach_packed(df, batch_id)
        else:
            with self.timed():
                fn = task_writer(self.store.root, list(self.store.queries.values()), batch_id, local, live)
                self.handle_packed(df.mapInArrow(fn, OUTPUT_DDL).toArrow(), batch_id, written_by_tasks=local)
        if self.pacer is not None and self.at_rest():
            self.pacer.hold(batch_id)

    def at_rest(self) -> bool:
        """No window open on any partition of any query and no row held for a window total: the next
        punctuation can close nothing (:mod:`high_level.aggregate.pacer`)."""
        with self._lock:
            if any(self.totals.held.values()):
                return False
            parts = [st for by in self.partitions.values() for st in by.values()]
            return bool(parts) and all(st.open_windows == 0 for st in parts)

    def handle_packed(
        self, packed: pa.Table, batch_id: int, written_by_tasks: frozenset[str] = frozenset()
    ) -> dict[str, int]:
        """The stateful step's packed output (and the summaries of the rows its tasks wrote, if they did):
        the same files, status and metrics as :meth:`handle_rows`, without building generic rows first
        (their list columns cost more than the Parquet encoding). The rows of ``written_by_tasks``
        queries are in the tasks' files, summaries and live messages: none of them comes here."""
        summary_rows = pc.fill_null(pc.is_in(packed["kind"], pa.array(list(SUMMARY_KINDS))), False)
        tasks = packed.filter(summary_rows)
        if tasks.num_rows:
            packed = packed.filter(pc.invert(summary_rows))
        if self.on_rows:
            rows = unpack_rows(packed, self.layouts)
            for watch in self.on_rows:
                watch(rows, batch_id)
        prov = None
        if self.live is not None:  # provisional rows go to the live topics only, never to the store
            prov_packed, packed = split_provisional(packed)
            prov, _ = unpack_windows(prov_packed, self.layouts, LIVE_KINDS)
        wins, texts = unpack_windows(packed, self.layouts)
        flagged = unpack_incomplete(packed)
        with self._lock:
            if self.totals.queries:
                wins = self.gate_totals(batch_id, wins, texts)
            written: dict[str, int] = {}
            if flagged:  # windows known short, rows or not (contract.results: flagged windows)
                self.store.write_incomplete(batch_id, flagged)
            for name in sorted(wins):
                w, lay = wins[name], self.layouts[name]
                if name in written_by_tasks:
                    continue  # written, counted and observed by the tasks (take_tasks)
                q = self.store.queries.get(name)
                if q is not None:
                    written[name] = self.store.write_query(batch_id, q, w)
                    self.count_closed(name, closed_windows(q, w), int(np.count_nonzero(w.correction)))
                else:
                    self.count_closed(
                        name, int(np.count_nonzero(w.final)), int(np.count_nonzero(w.correction))
                    )
                self.observe_latency(
                    latest_close(lay.window_end_ns(w.window)[w.final], w.closed_at_ms[w.final])
                )
            statuses = [S.PartitionStatus.model_validate_json(t) for t in texts]
            if tasks.num_rows:
                self.take_tasks(tasks, written)
                if self.store.files:  # a batch whose tasks only published live values commits nothing
                    self.commit(batch_id, written, statuses)
            self.after_write(batch_id)
            if self.live is not None:  # after the store: a final is in Kafka only once it is in the store
                self.live.publish(batch_id, prov or {}, wins)
            self.fold_status(statuses, batch_id, written)
            if self.feed is not None and any(st.query in self.feed.queries for st in statuses):
                # after the store and the folded frontier: a join sees a window once it is final and stored
                self.feed.publish(batch_id, wins, self.partitions, flagged=flagged)
            for done in self.on_batch:
                done(batch_id)
            return written

    def count_closed(self, name: str, finals: int, corrections: int) -> None:
        self.metrics.windows.labels(name).inc(finals)
        self.metrics.corrections.labels(name).inc(corrections)

    def observe_latency(self, closes: list[list[int]]) -> None:
        """One latency observation per closed window end: its latest close."""
        for end, at_ms in closes:
            self.metrics.latency.observe(max(0.0, at_ms / 1e3 - int(end) / 1e9))

    def take_tasks(self, tasks: pa.Table, written: dict[str, int]) -> None:
        """Fold the tasks' summaries (:mod:`high_level.results.tasks`) into the batch's written rows,
        files, HAVING drops, fired alerts, metrics and the export: no row of theirs reaches the driver."""
        exports: dict[str, list] = {}
        latency: dict[str, dict[int, int]] = {}  # per query: window end -> its latest close
        meta = tasks.select(["kind", "query", "status"]).to_pydict()
        for i, kind in enumerate(meta["kind"]):
            if kind == WRITTEN_KIND:
                doc = json.loads(meta["status"][i])
                for name, n in doc["written"].items():
                    written[name] = written.get(name, 0) + n
                for name, n in doc["having_dropped"].items():
                    self.store.having_dropped[name] = self.store.having_dropped.get(name, 0) + n
                for name in doc["finals"]:
                    self.count_closed(name, doc["finals"][name], doc["corrections"][name])
                for name, closes in doc["latency"].items():  # a window end may close in several tasks
                    for end, at_ms in closes:
                        last = latency.setdefault(name, {})
                        last[end] = max(last.get(end, at_ms), at_ms)
                self.store.files += doc["files"]
                if "live" in doc and self.live is not None:
                    self.live.take(doc["live"])
            elif kind == ALERTS_KIND:
                self.store.fired.append(ipc_table(tasks["data"][i].as_py()))
            elif kind == EXPORT_KIND:
                doc = json.loads(meta["status"][i])
                top = ipc_table(tasks["data"][i].as_py())
                exports.setdefault(meta["query"][i], []).append((doc["end_ms"], top, doc["totals"]))
        for _name, last in sorted(latency.items()):
            self.observe_latency([[end, at_ms] for end, at_ms in last.items()])
        for name, parts in sorted(exports.items()):
            if self.exporter is not None:
                self.exporter.merge(self.store.queries[name], parts)

    def commit(self, batch_id: int, written: dict[str, int], statuses: list[S.PartitionStatus]) -> None:
        """Make the batch's task files visible: the manifest (files, rows, each partition's window mark),
        then each written query's commit marker (:func:`contract.results.committed_batch`). A kill
        before the markers leaves the batch invisible; Spark replays it, which rewrites the same files."""
        for hook in self.before_commit:  # fault injection (tests): a kill between the writes and this
            hook(batch_id)
        if (at := os.environ.get(STOP_AT_ENV)) is not None and batch_id >= int(at):
            os.kill(os.getpid(), signal.SIGSTOP)  # a test SIGKILLs the job here (tests/test_exactly_once.py)
        files, self.store.files = self.store.files, []
        if missing := [f for f in files if not (self.store.root / f).is_file()]:
            # A task wrote it on its executor's file system, which is not the driver's: committing would
            # publish a batch nobody can read. Stop instead; the batch replays once the store is shared.
            raise RuntimeError(
                f"batch {batch_id}: {len(missing)} results file(s) the executors wrote are not in "
                f"{self.store.root} on the driver (first: {missing[0]}): the results store must be on storage "
                "shared by the driver, the API and every Spark worker at the same path (deploy/README.md)"
            )
        marks: dict[str, dict[str, int | None]] = {}
        for st in statuses:
            marks.setdefault(st.query, {})[str(st.partition)] = st.closed_before_window
        doc = {"batch": batch_id, "files": sorted(files), "rows": written, "marks": marks}
        path = R.manifest_path(self.store.root, batch_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(doc, separators=(",", ":")).encode())
        for name in sorted({f.split("/", 1)[0].removeprefix("query=") for f in files}):
            atomic_write_bytes(
                R.committed_path(self.store.root, name), json.dumps({"batch": batch_id}).encode()
            )
        if batch_id >= MANIFESTS_KEPT:
            R.manifest_path(self.store.root, batch_id - MANIFESTS_KEPT).unlink(missing_ok=True)

    def gate_totals(
        self, batch_id: int, wins: dict[str, QueryWindows], texts: list[str]
    ) -> dict[str, QueryWindows]:
        """Hold the rows of queries whose conditions read a window total until every partition closed
        their window (:mod:`high_level.results.windowtotal`); the rest pass as they are."""
        now: dict[str, dict[int, S.PartitionStatus]] = {}
        for t in texts:
            st = S.PartitionStatus.model_validate_json(t)
            if st.query in self.totals.queries:
                now.setdefault(st.query, {})[st.partition] = st
        out = dict(wins)
        for name, q in self.totals.queries.items():
            seen = {**self.partitions.get(name, {}), **now.get(name, {})}
            released = self.totals.admit(batch_id, q, wins.get(name), seen)
            if released is None or not len(released.window):
                out.pop(name, None)
            else:
                out[name] = released
            self.metrics.total_held.labels(name).set(self.totals.held.get(name, 0))
        return out

    def handle_rows(self, rows: pd.DataFrame | pa.Table, batch_id: int) -> dict[str, int]:
        """Write one batch of generic rows and fold its status rows into the status document + metrics."""
        tbl = generic_table(rows)
        for watch in self.on_rows:
            watch(tbl, batch_id)
        with self._lock:
            is_status = pc.equal(tbl["kind"], "status")
            statuses = [
                S.PartitionStatus.model_validate_json(s)
                for s in pc.filter(tbl["status"], is_status).to_pylist()
            ]
            written = self.store.write_batch(batch_id, tbl)
            # per query: finals, corrections, and one latency observation per closed window end
            data = tbl.select(["query", "kind", "window_end_ns", "closed_at_ms"]).filter(pc.invert(is_status))
            if data.num_rows:
                counts = data.group_by(["query", "kind"]).aggregate([([], "count_all")]).to_pydict()
                per_query: dict[str, dict[str, int]] = {}
                for qn, kind, n in zip(counts["query"], counts["kind"], counts["count_all"], strict=True):
                    per_query.setdefault(qn, {})[kind] = n
                for qn in sorted(per_query):
                    self.metrics.windows.labels(qn).inc(per_query[qn].get("final", 0))
                    self.metrics.corrections.labels(qn).inc(per_query[qn].get("correction", 0))
                fin = data.filter(pc.equal(data["kind"], "final"))
                lat = (
                    fin.group_by(["query", "window_end_ns"]).aggregate([("closed_at_ms", "max")]).to_pydict()
                )
                for end_ns, at_ms in zip(lat["window_end_ns"], lat["closed_at_ms_max"], strict=True):
                    self.metrics.latency.observe(max(0.0, at_ms / 1e3 - int(end_ns) / 1e9))
            self.after_write(batch_id)
            self.fold_status(statuses, batch_id, written)
            for done in self.on_batch:
                done(batch_id)
            return written

    def after_write(self, batch_id: int) -> None:
        """The batch's fired alerts: written to the alert store first (durable, replay-idempotent), then
        handed to the delivery thread without waiting; HAVING counts to the metrics."""
        dropped, self.store.having_dropped = self.store.having_dropped, {}
        for qn, n in sorted(dropped.items()):
            self.metrics.having_dropped.labels(qn).inc(n)
        flagged, self.store.flagged = self.store.flagged, {}
        for (qn, cause), n in sorted(flagged.items()):
            self.metrics.flagged_windows.labels(qn, cause).inc(n)
        alerts = self.store.write_alerts(batch_id)
        if alerts.num_rows:
            counts = alerts.group_by(["query", "alert"]).aggregate([([], "count_all")]).to_pydict()
            for qn, rule, n in zip(counts["query"], counts["alert"], counts["count_all"], strict=True):
                self.metrics.alerts_fired.labels(qn, rule).inc(n)
            if self.delivery is not None:
                self.delivery.submit(alerts)

    def fold_status(self, statuses: list[S.PartitionStatus], batch_id: int, written: dict[str, int]) -> None:
        """The batch's per-partition status -> partitions, metrics and the status document."""
        for st in statuses:
            self.partitions.setdefault(st.query, {})[st.partition] = st
        self.metrics.on_batch_status(statuses)
        now_ms = max([st.now_ms for st in statuses], default=int(time.time() * 1000))
        for qn in {st.query for st in statuses} | (self.partitions.keys() - self._summaries.keys()):
            self._summaries[qn] = S.summarize_query(self.partitions[qn])  # only what this batch changed
        queries = dict(sorted(self._summaries.items()))
        self.metrics.on_status(queries, now_ms)
        self.last_batch = {"batch_id": batch_id, "written": written, "now_ms": now_ms}
        self.write_status(queries, now_ms)
        if self.on_status is not None:
            self.on_status(statuses)

    def maintain(self, now_ms: int, retention_days: int | None, every_ms: int = 60_000) -> None:
        """Every ``every_ms``: delete result days older than ``retention_days`` and measure the store (for
        the status document). Runs on the driver between batches, never inside one."""
        if now_ms - self._maintained_ms < every_ms:
            return
        self._maintained_ms = now_ms
        today = datetime.fromtimestamp(now_ms / 1000, UTC).date()
        with self._lock:  # not while a batch writes (a late correction may touch an old day)
            gone = self.store.expire(today, retention_days)
        for d in gone:
            log.info("retention: deleted %s (windows older than the query's raw retention)", d)
        self.store_bytes = self.store.size_bytes()
        if self.compactor is not None:
            self.tier_bytes = self.compactor.tier_bytes()
            for qn, sizes in self.tier_bytes.items():
                for tier, n in sizes.items():
                    self.metrics.store_tier_bytes.labels(qn, tier).set(n)

    def touch(self, now_ms: int, every_ms: int = 10_000) -> None:
        """Rewrite the status document when no micro-batch has for ``every_ms``: an idle job (a finished
        capture, no data) is still up, and the page must not call its status stale."""
        with self._lock:
            if not self.partitions or now_ms - int(self.last_batch.get("written_ms", 0)) < every_ms:
                return
            queries = {qn: S.summarize_query(parts) for qn, parts in sorted(self.partitions.items())}
            self.write_status(queries, now_ms)

    def write_status(self, queries: dict[str, S.QueryStatus], now_ms: int) -> None:
        self.last_batch["written_ms"] = now_ms
        doc = S.StatusDocument(
            mode=self.mode,
            updated_ms=now_ms,
            batch_id=self.last_batch.get("batch_id"),
            settings=self.settings,
            queries=queries,
            hosts=S.summarize_hosts(queries),
            progress=self.progress(),
            store_bytes=self.store_bytes,
            tier_bytes=self.tier_bytes,
            compaction=self.compactor.status if self.compactor is not None else None,
        )
        self.store.write_status(doc)
