"""The high-level Spark Structured Streaming job: conducts the pipelines of its mode.

The job holds one :class:`high_level.pipeline.Pipeline` per query kind (:data:`PIPELINES`): in OOP mode
(default) the aggregates (:mod:`high_level.aggregate.pipeline`: Kafka -> one stateful step per Kafka
partition, windows closed by punctuation, never by Spark's event-time watermark) and the joins
(:mod:`high_level.join.pipeline`); ``--mode watermark`` runs the max-event-time-minus-delay baseline
(:mod:`high_level.aggregate.watermark`) into the same layout. It provisions their topics, collects their
Kafka publishers, starts them, and owns what they share: the result store, the sink
(:mod:`high_level.results.sink`: typed Parquet and the status document), the alert delivery and the
metrics. The CLI is :mod:`high_level.cli`, the options :mod:`high_level.options`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from contract import query as Q
from contract import status as S
from high_level.aggregate.pipeline import AggregatePipeline
from high_level.aggregate.rollup import Layout
from high_level.aggregate.watermark import WatermarkJoinRefused, WatermarkPipeline, refuse_joins
from high_level.distinct.pipeline import DistinctPipeline
from high_level.join.pipeline import JoinPipeline
from high_level.metrics import JobMetrics
from high_level.options import MODES, STATES, JobOptions
from high_level.pipeline import Outputs, Pipeline
from high_level.results.alerts import AlertDelivery
from high_level.results.compact import Compactor, Maintenance
from high_level.results.export import ResultExporter
from high_level.results.sink import ResultSink
from high_level.results.store import ResultStore
from high_level.rows.pipeline import RowPipeline

__all__ = ["MODES", "PIPELINES", "STATES", "HighLevelJob", "JobOptions", "pipelines", "wait_for_batch_end"]
log = logging.getLogger("lowwater.job")
_FS_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def _is_local_path(location: str) -> bool:
    """A checkpoint on this machine's file system (a plain path or file: URI), not HDFS/S3/..."""
    return "://" not in location or location.startswith("file:")


def _punctuation(queries: Sequence[Q.QuerySpec], config: Q.Config | None) -> list[Pipeline]:
    """OOP mode: the aggregates' stream (if any) and the joins' (if any)."""
    out: list[Pipeline] = [AggregatePipeline(queries)] if queries else []
    out += [JoinPipeline(config)] if config is not None and config.joins else []
    out += [DistinctPipeline(config)] if config is not None and config.distincts else []
    return out + ([RowPipeline(config)] if config is not None and config.rows else [])


def _watermark(queries: Sequence[Q.QuerySpec], config: Q.Config | None) -> list[Pipeline]:
    """The baseline: aggregates only; joins are refused, never skipped silently."""
    refuse_joins(config)
    if config is not None and config.distincts:
        names = ", ".join(repr(d.name) for d in config.distincts)
        raise WatermarkJoinRefused(
            f"{config.path}: distinct queries ({names}) run in the punctuation mode only (--mode oop, the default)"
        )
    if config is not None and config.rows:
        names = ", ".join(repr(r.name) for r in config.rows)
        raise WatermarkJoinRefused(
            f"{config.path}: row queries ({names}) run in the punctuation mode only (--mode oop, the default)"
        )
    return [WatermarkPipeline(queries)]


PIPELINES: dict[str, Callable[[Sequence[Q.QuerySpec], Q.Config | None], list[Pipeline]]] = {
    "oop": _punctuation,
    "watermark": _watermark,
}
assert set(PIPELINES) == set(MODES)


def pipelines(mode: str, queries: Sequence[Q.QuerySpec], config: Q.Config | None = None) -> list[Pipeline]:
    """The pipelines of ``mode`` for these queries (and the config's joins); cheap, no Spark, no Kafka."""
    return PIPELINES[mode](queries, config)


def wait_for_batch_end(stream: Any, deadline: float, poll_s: float = 0.05) -> bool:
    """Wait (until ``deadline``, a ``time.monotonic()`` value) for ``stream`` to be between micro-batches;
    True if it is (or has stopped), False if the deadline came first."""
    while True:
        try:
            if not stream.isActive or not stream.status.get("isTriggerActive"):
                return True
        except Exception:  # noqa: BLE001 - a stream that cannot say is stopped as before
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


class HighLevelJob:
    """Starts the pipelines of its mode and feeds them one sink; owns the result store and the metrics."""

    def __init__(
        self,
        spark: Any,
        queries: Sequence[Q.QuerySpec],
        opts: JobOptions,
        metrics: JobMetrics | None = None,
        config: Q.Config | None = None,
    ) -> None:
        # join queries (high_level/join/pipeline.py) come with the config that names their select inputs
        if not queries and (config is None or not (config.joins or config.distincts or config.rows)):
            raise ValueError("no queries")
        self.pipelines = pipelines(opts.mode, queries, config)
        self.spark = spark
        self.queries = list(queries)
        self.opts = opts
        self.metrics = metrics or JobMetrics()
        stored = self.queries + (config.stored_queries[len(config.queries) :] if config is not None else [])
        self.store = ResultStore(opts.results, stored)
        self.exporter = ResultExporter(self.queries)
        if self.exporter.queries:  # results as Prometheus series, from the rows the store writes
            self.store.on_written.append(self.exporter.observe)
            self.metrics.registry.register(self.exporter)
        self.layouts = {q.name: Layout.of(q) for q in self.queries}
        self.streams: list[Any] = []
        self._dropped: dict[str, int] = {}
        self._dropped_seen: dict[str, int] = {}
        self.outputs = Outputs()
        for p in self.pipelines:
            self.outputs |= p.outputs(opts)
        self.asker, self.live, self.feed = self.outputs.asker, self.outputs.live, self.outputs.feed
        self.delivery = None
        if opts.alert_webhook:
            self.delivery = AlertDelivery(
                opts.results,
                opts.alert_webhook,
                self.metrics,
                timeout_s=opts.alert_timeout_ms / 1e3,
                queue_size=opts.alert_queue,
                generator_url=opts.alert_generator_url,
            )
        self.sink = ResultSink(
            self.store,
            stored,
            opts.mode,
            opts.status_settings,
            self.metrics,
            self.stream_progress,
            self.delivery,
            self.asker.observe if self.asker else None,
            live=self.live,
            feed=self.feed,
        )
        self.sink.exporter = self.exporter  # the tasks' export summaries merge into it
        # compaction, roll-up tiers and retention per tier on a thread of this process (compact.py says
        # why here); it reads the checkpoint's commit log, so only with a checkpoint on this machine
        self.maintenance: Maintenance | None = None
        if opts.compact_every_s > 0 and _is_local_path(opts.checkpoint):
            ckpt = opts.checkpoint[len("file:") :] if opts.checkpoint.startswith("file:") else opts.checkpoint
            compactor = Compactor(opts.results, stored, ckpt.removeprefix("//"), opts.retention_days)
            self.maintenance = Maintenance(compactor, opts.compact_every_s)
            self.sink.compactor = compactor

    # -- building ---------------------------------------------------------------------------------
    def start(self) -> list[Any]:
        """Start every pipeline's streams (each is checked first: a pipeline that cannot run starts nothing)."""
        if self.opts.create_topics:
            self.provision_topics()
        self.spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        # No empty micro-batches: with a processing-time timeout Spark would otherwise run one every
        # trigger forever (and processAllAvailable would never return). Closing needs no empty
        # batches: a window can only close when some host's punctuation arrives, which is data.
        self.spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        if self.opts.shuffle_partitions:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.opts.shuffle_partitions))
        if _is_local_path(self.opts.checkpoint):
            # Hadoop's FileContext on the local file system (no native libhadoop in pyspark) forks a
            # `readlink` per checkpoint file create/rename, ~40 process spawns per micro-batch; the
            # FileSystem-based manager needs ~10, a chmod per new file (its renames are POSIX rename(2), atomic on one disk).
            # (benchmarks/bench_rollup.py measures the difference.)
            self.spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", _FS_CHECKPOINT_MANAGER)
        if self.delivery is not None:
            self.delivery.start()
        for p in self.pipelines:
            p.check(self.opts)
        self.streams = [s for p in self.pipelines for s in p.start(self.spark, self.opts, self.sink)]
        if self.maintenance is not None:
            self.maintenance.start()
        return self.streams

    def provision_topics(self, deadline_s: float = 60.0) -> dict[str, str]:
        """Make the pipelines' topics exist (Spark's Kafka source fails on a missing topic, and agents may
        start after the job), authenticating exactly as the Kafka source does (one security block)."""
        from contract.topics import ensure_topics

        admin = self.opts.kafka.admin(deadline_s)
        try:
            wanted: dict[str, int] = {}
            for p in self.pipelines:
                for topic, n in p.topics().items():
                    if wanted.setdefault(topic, n) != n:
                        raise ValueError(
                            f"topic {topic!r}: the queries ask for {wanted[topic]} and {n} partitions"
                        )
            actions = ensure_topics(admin, wanted)
            for p in self.pipelines:
                actions.update(p.provision(admin, self.opts))
        finally:
            admin.close()
        for topic, action in actions.items():
            log.info("topic %s: %s", topic, action)
        return actions

    # -- sink (the streams write to self.sink directly; watch batches with its on_rows / on_batch) -------
    def handle_packed(self, packed: pa.Table, batch_id: int) -> dict[str, int]:
        """Write one batch of the stateful step's packed output (see :class:`high_level.results.sink.ResultSink`)."""
        return self.sink.handle_packed(packed, batch_id)

    def handle_rows(self, rows: pd.DataFrame | pa.Table, batch_id: int) -> dict[str, int]:
        """Write one batch of generic rows (see :class:`high_level.results.sink.ResultSink`)."""
        return self.sink.handle_rows(rows, batch_id)

    # -- running ----------------------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """State-store numbers of the last progress of each stream (what the skew benchmark reads)."""
        out: dict[str, Any] = {}
        for s in self.streams:
            try:
                p = s.lastProgress
            except Exception:  # noqa: BLE001 - a stopped query has no progress
                p = None
            if not p:
                continue
            ops = p.get("stateOperators") or []
            out[s.name or str(s.id)] = {
                "batchId": p.get("batchId"),
                "numInputRows": p.get("numInputRows"),
                "durationMs": p.get("durationMs", {}).get("triggerExecution"),
                "stateRows": sum(int(o.get("numRowsTotal", 0)) for o in ops),
                "stateMemoryBytes": sum(int(o.get("memoryUsedBytes", 0)) for o in ops),
                "droppedByWatermark": sum(int(o.get("numRowsDroppedByWatermark", 0)) for o in ops),
            }
        return out

    def stream_progress(self) -> dict[str, S.StreamProgress]:
        """:meth:`progress` in the status contract's terms."""
        return {
            name: S.StreamProgress(
                batch_id=p["batchId"],
                input_rows=p["numInputRows"],
                duration_ms=p["durationMs"],
                state_rows=p["stateRows"],
                state_memory_bytes=p["stateMemoryBytes"],
                dropped_by_watermark=p["droppedByWatermark"],
            )
            for name, p in self.progress().items()
        }

    def dropped_by_watermark(self) -> dict[str, int]:
        """Rows Spark's watermark dropped, per stream, over every micro-batch seen so far.

        Why not the last progress: each progress counts only its own batch, so a gauge of the last one
        reads 0 whenever the latest batch dropped nothing. ``recentProgress`` keeps the last ~100
        batches: this polls it often enough (every second) and adds each batch once.
        """
        for s in self.streams:
            try:
                recent = s.recentProgress
            except Exception:  # noqa: BLE001 - a stopped query has no progress
                continue
            name = s.name or str(s.id)
            seen = self._dropped_seen.get(name, -1)
            for p in recent:
                bid = int(p.get("batchId", -1))
                if bid > seen:
                    ops = p.get("stateOperators") or []
                    self._dropped[name] = self._dropped.get(name, 0) + sum(
                        int(o.get("numRowsDroppedByWatermark", 0)) for o in ops
                    )
                    seen = bid
            self._dropped_seen[name] = seen
        return dict(self._dropped)

    def refresh_metrics(self) -> None:
        """Copy Spark's state-store numbers into the gauges (per stream name)."""
        for name, p in self.progress().items():
            self.metrics.state_bytes.labels(name).set(p["stateMemoryBytes"])
        for name, n in self.dropped_by_watermark().items():
            self.metrics.dropped_so_far(name, n)

    def process_all_available(self) -> None:
        for s in self.streams:
            s.processAllAvailable()

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the streams, each after its running micro-batch if that ends within ``grace_s`` (an operator's
        stop). Stopping mid-batch is safe (the batch is replayed from the checkpoint) but cancels its Spark
        job, which logs stack traces that look like a failure."""
        deadline = time.monotonic() + grace_s
        pacer = self.sink.pacer
        if pacer is not None:  # a batch waiting at rest ends now
            pacer.wake()
        for s in self.streams:
            wait_for_batch_end(s, deadline)
            try:
                s.stop()
            except Exception as exc:  # noqa: BLE001 - stopping must not hide the other streams
                log.warning("stopping %s: %s", s.name, exc)
        self.outputs.close()
        if pacer is not None:
            pacer.close()
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.delivery is not None:
            self.delivery.stop()

    def await_termination(self, poll_s: float = 1.0, stop_event: threading.Event | None = None) -> None:
        """Block until a stream fails or ``stop_event`` is set, refreshing metrics meanwhile."""
        while True:
            for s in self.streams:
                if not s.isActive:
                    exc = s.exception()
                    if exc is not None:
                        raise RuntimeError(f"stream {s.name} failed: {exc}")
                    return
            self.refresh_metrics()
            now_ms = int(time.time() * 1000)
            self.sink.maintain(now_ms, self.opts.retention_days)
            self.sink.touch(now_ms)
            if stop_event is not None and stop_event.wait(poll_s):
                return
            if stop_event is None:
                time.sleep(poll_s)
