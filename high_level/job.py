"""The high-level Spark Structured Streaming job: the streaming queries and how they run.

OOP mode (default): Kafka -> ``groupBy(topic, partition)`` -> a stateful step (one group per Kafka
partition, so a single shuffle; the body is :class:`high_level.aggregate.processor.PartitionProcessor`)
-> ``foreachBatch`` sink (:mod:`high_level.results.sink`) writing typed Parquet and the status document. Windows close by punctuation
(min over live hosts), never by Spark's event-time watermark. ``--mode watermark`` runs the
max-event-time-minus-delay baseline (:mod:`high_level.aggregate.watermark`) into the same layout. The CLI is
:mod:`high_level.cli`, the placement of state groups :mod:`high_level.cluster.placement`.

The state of the stateful step has two layouts (``--state``): *chunked* (``chunked``, or ``auto``, the
default), ``transformWithStateInPandas`` with the pane tables as per-batch chunks in RocksDB
(:mod:`high_level.aggregate.chunkstep`, :mod:`high_level.aggregate.chunks`), so a micro-batch costs what it brings; and
*blob* (``blob``), the processor saved whole every batch (:func:`state_function`), also what ``auto``
keeps for what needs the whole open table every close or merge (landmark and bounded-top queries) and
for checkpoints written by it. A checkpoint is resumed by the layout that wrote it or refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from contract import query as Q
from contract import status as S
from contract.kafka_security import KafkaSecurity
from high_level.aggregate.processor import (
    LATE_POLICIES,
    OUTPUT_DDL,
    PartitionProcessor,
    Settings,
    unpack_rows,
)
from high_level.aggregate.rollup import Layout
from high_level.cluster.placement import checkpoint_shuffle_partitions, placement_salts
from high_level.metrics import JobMetrics
from high_level.results.alerts import AlertDelivery
from high_level.results.export import ResultExporter
from high_level.results.sink import ResultSink
from high_level.results.store import ResultStore

log = logging.getLogger("lowwater.job")
_FS_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _is_local_path(location: str) -> bool:
    """A checkpoint on this machine's file system (a plain path or file: URI), not HDFS/S3/..."""
    return "://" not in location or location.startswith("file:")


MODES = ("oop", "watermark")
# State layout of the OOP step: "blob" (the processor saved whole every micro-batch), "chunked" (pane tables
# as per-batch chunks in RocksDB, high_level/aggregate/chunks.py: a batch pays for what it brings, not for the open
# groups), "auto" (chunked unless a query needs the blob: high_level.aggregate.chunks.chunked_unsupported).
STATES = ("auto", "blob", "chunked")
CHECKPOINT_DIRS = {"blob": "oop", "chunked": "oop-chunked"}  # the OOP stream's checkpoint per layout


@dataclass(frozen=True)
class JobOptions:
    """Everything the job needs besides the Spark session and the queries."""

    bootstrap: str
    results: str
    checkpoint: str
    mode: str = "oop"
    trigger_ms: int = 1000
    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    watermark_delay_ms: int = 10_000
    max_offsets_per_trigger: int | None = None
    shuffle_partitions: int | None = None  # None: the session's setting (fixed per checkpoint)
    name: str = "lowwater"
    create_topics: bool = True
    kafka_options: dict[str, str] = field(default_factory=dict)  # extra kafka.* source options
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    control_topic: str | None = None  # ask blocking hosts for punctuation on this topic (oop mode)
    retention_days: int | None = None  # delete result files of windows older than this
    alert_webhook: str | None = None  # Alertmanager v2 endpoint, e.g. http://am:9093/api/v2/alerts
    alert_timeout_ms: int = 2000
    alert_queue: int = 10_000
    alert_generator_url: str = "http://127.0.0.1:8080/ui"
    live: bool = False  # publish provisional and final values to lowwater.live.<query> (contract/live.py)
    state: str = "auto"  # STATES (see README, "High-level state")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}")
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}")
        if self.trigger_ms <= 0 or self.host_timeout_ms <= 0:
            raise ValueError("trigger and host timeout must be positive")

    @property
    def settings(self) -> Settings:
        return Settings(self.host_timeout_ms, tuple(self.expected_hosts), self.late_policy,
                        live=self.live and self.mode == "oop")  # fmt: skip

    @property
    def source_options(self) -> dict[str, str]:
        """``kafka.*`` options of Spark's Kafka source: the security block's, then the extra ones."""
        return {**self.kafka_security.spark_options(), **self.kafka_options}

    @property
    def status_settings(self) -> S.JobSettings:
        """The settings as the status document reports them."""
        return S.JobSettings(trigger_ms=self.trigger_ms, host_timeout_ms=self.host_timeout_ms,
                             expected_hosts=list(self.expected_hosts), late_policy=self.late_policy,
                             watermark_delay_ms=self.watermark_delay_ms,
                             alert_webhook=bool(self.alert_webhook), retention_days=self.retention_days)  # fmt: skip


def state_function(layouts: Sequence[Layout], settings: Settings, tick_ms: int) -> Callable[..., Iterator[pd.DataFrame]]:
    """The applyInPandasWithState body: restore the partition's processor, feed it the batch in
    offset order, save it as compact bytes, re-arm the processing-time timeout (so a silent
    partition is still evaluated and its hosts can time out)."""
    by_topic: dict[str, list[Layout]] = {}
    for lay in layouts:
        by_topic.setdefault(lay.topic, []).append(lay)

    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        topic, partition = str(key[0]), int(key[1])  # key[2] is the placement salt
        lays = by_topic[topic]
        if state.exists:
            proc = PartitionProcessor.from_bytes(state.get[0], lays, settings)
        else:
            proc = PartitionProcessor(lays, partition, settings)
        frames = [df for df in pdfs if len(df)]
        values: list[bytes] = []
        if frames:
            df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            df = df.sort_values("offset", kind="stable")
            values = df["value"].tolist()
        out = proc.process_packed(values, int(state.getCurrentProcessingTimeMs()))
        state.update((proc.to_bytes(),))
        state.setTimeoutDuration(tick_ms)
        yield out

    return fn


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
    """Builds, starts and feeds the streaming queries; owns the result store and the metrics."""

    def __init__(self, spark: Any, queries: Sequence[Q.QuerySpec], opts: JobOptions,
                 metrics: JobMetrics | None = None, config: Q.Config | None = None) -> None:  # fmt: skip
        # join queries (high_level/join/pipeline.py) come with the config that names their select inputs
        self.joins = list(config.joins) if config is not None else []
        if not queries and not self.joins:
            raise ValueError("no queries")
        if opts.mode == "watermark":
            from high_level.aggregate.watermark import refuse_joins

            refuse_joins(config)  # joins have no watermark-mode stream: refused, not skipped
        self.spark = spark
        self.queries = list(queries)
        self.config = config
        self.opts = opts
        self.metrics = metrics or JobMetrics()
        stored = self.queries + (config.stored_queries[len(config.queries):] if config is not None else [])
        self.store = ResultStore(opts.results, stored)
        self.exporter = ResultExporter(self.queries)
        if self.exporter.queries:  # results as Prometheus series, from the rows the store writes
            self.store.on_written.append(self.exporter.observe)
            self.metrics.registry.register(self.exporter)
        self.layouts = {q.name: Layout.of(q) for q in self.queries}
        self.streams: list[Any] = []
        self._dropped: dict[str, int] = {}
        self._dropped_seen: dict[str, int] = {}
        self.asker = None
        if opts.control_topic and opts.mode == "oop":
            from high_level.ondemand import PunctuationAsker

            self.asker = PunctuationAsker(list(self.layouts.values()), opts.bootstrap, topic=opts.control_topic,
                                          producer_config=opts.kafka_security.kafka_python())  # fmt: skip
        self.delivery = None
        if opts.alert_webhook:
            self.delivery = AlertDelivery(opts.results, opts.alert_webhook, self.metrics, timeout_s=opts.alert_timeout_ms / 1e3,
                                          queue_size=opts.alert_queue, generator_url=opts.alert_generator_url)  # fmt: skip
        self.live = None
        if opts.live and opts.mode == "oop":
            from high_level.live.publish import LivePublisher

            self.live = LivePublisher(self.queries, opts.bootstrap, producer_config=opts.kafka_security.kafka_python())
        self.feed = None  # closed windows of the aggregate queries that joins read (high_level/join/feed.py)
        if config is not None and opts.mode == "oop":
            from high_level.join.feed import FeedPublisher, feed_queries

            if feed_queries(config):
                self.feed = FeedPublisher(feed_queries(config), opts.bootstrap,
                                          producer_config=opts.kafka_security.kafka_python())  # fmt: skip
        self.sink = ResultSink(self.store, stored, opts.mode, opts.status_settings, self.metrics,
                               self.stream_progress, self.delivery, self.asker.observe if self.asker else None,
                               live=self.live, feed=self.feed)  # fmt: skip

    # -- building ---------------------------------------------------------------------------------
    def start(self) -> list[Any]:
        """Start the streaming query (one in OOP mode, one per query in watermark mode)."""
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
        if self.opts.mode == "oop":
            if self.joins:  # a missing join input is an error before any stream starts (nothing emitted)
                from high_level.join.pipeline import check_topics, layouts

                check_topics(self, layouts(self.config))
            self.streams = [self._start_oop()] if self.queries else []
            if self.joins:
                from high_level.join.pipeline import start_joins

                self.streams += start_joins(self)
        else:
            from high_level.aggregate.watermark import start_watermark

            self.streams = start_watermark(self)
        return self.streams

    def provision_topics(self, deadline_s: float = 60.0) -> dict[str, str]:
        """Make the queries' topics exist (Spark's Kafka source fails on a missing topic, and agents may
        start after the job), authenticating exactly as the Kafka source does (one security block)."""
        from contract.topics import connect, ensure_topics, wanted_topics

        admin = connect(self.opts.bootstrap, self.opts.kafka_security.kafka_python(), deadline_s)
        inputs = [] if self.config is None else [s for s in self.config.selects
                                                 if any(s.name in (j.left, j.right) for j in self.joins)]
        try:
            wanted = wanted_topics([*self.queries, *inputs])
            if self.feed is not None:
                from contract.query.joins import closed_topic

                wanted |= {closed_topic(q): 1 for q in self.feed.queries.values()}
            actions = ensure_topics(admin, wanted)
            if self.live is not None:
                from high_level.live.publish import ensure_live_topics

                actions.update(ensure_live_topics(admin, self.queries))
        finally:
            admin.close()
        for topic, action in actions.items():
            log.info("topic %s: %s", topic, action)
        return actions

    def _start_oop(self) -> Any:
        from pyspark.sql.streaming.state import GroupStateTimeout

        from high_level.aggregate.ingest import kafka_stream

        o = self.opts
        layouts = [Layout.of(q) for q in self.queries]
        from pyspark.sql import functions as F

        raw = kafka_stream(self.spark, o.bootstrap, [lay.topic for lay in layouts],
                           max_offsets_per_trigger=o.max_offsets_per_trigger, extra=o.source_options)  # fmt: skip
        ckpt = Path(o.checkpoint) / "oop"
        parts: dict[str, int] = {}
        for q in self.queries:
            parts[q.topic] = max(parts.get(q.topic, 0), q.kafka.partitions)
        chunked = self.state_layout(layouts) == "chunked"
        if chunked:
            ckpt = Path(o.checkpoint) / CHECKPOINT_DIRS["chunked"]
        n_tasks = checkpoint_shuffle_partitions(ckpt) or int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        salts = placement_salts(parts, n_tasks)
        if salts:
            table = F.create_map(*[x for (t, p), v in sorted(salts.items()) for x in (F.lit(f"{t}/{p}"), F.lit(v))])
            salt = F.coalesce(F.try_element_at(table, F.concat_ws("/", "topic", F.col("partition").cast("string"))),
                              F.lit(0)).cast("int")  # fmt: skip
        else:
            salt = F.lit(0)
        raw = raw.withColumn("salt", salt)
        grouped = raw.groupBy("topic", "partition", "salt")
        conf: dict[str, str] = {}
        if chunked:
            from high_level.aggregate.chunkstep import SESSION_CONF, ChunkedStep

            rolled = grouped.transformWithStateInPandas(ChunkedStep(layouts, o.settings, o.trigger_ms),
                                                        outputStructType=OUTPUT_DDL, outputMode="Append",
                                                        timeMode="ProcessingTime")  # fmt: skip
            conf = SESSION_CONF
        else:
            rolled = grouped.applyInPandasWithState(
                state_function(layouts, o.settings, o.trigger_ms),
                outputStructType=OUTPUT_DDL,
                stateStructType="blob binary",
                outputMode="append",
                timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
            )
        writer = (
            rolled.writeStream.queryName(f"{o.name}-oop")
            .foreachBatch(self._sink_oop)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime=f"{o.trigger_ms} milliseconds")
        )
        # the stream copies the session's settings when it starts: set the state store's for it only
        before = {k: self.spark.conf.get(k, None) for k in conf}
        for k, v in conf.items():
            self.spark.conf.set(k, v)
        try:
            return writer.start()
        finally:
            for k, v in before.items():
                if v is None:
                    self.spark.conf.unset(k)
                else:
                    self.spark.conf.set(k, v)

    def state_layout(self, layouts: Sequence[Layout] | None = None) -> str:
        """The OOP step's state layout for these options and queries: 'blob' or 'chunked'.

        A checkpoint is resumed by the layout that wrote it: 'auto' follows it (a job started before
        chunks were the default goes on with the blob), an explicit other layout is refused (no
        migration: the two states share nothing, and rolling back is a new checkpoint)."""
        from high_level.aggregate.chunks import chunked_unsupported

        lays = list(self.layouts.values()) if layouts is None else layouts
        why = chunked_unsupported(lays)
        held = [st for st, d in CHECKPOINT_DIRS.items() if (Path(self.opts.checkpoint) / d).exists()]
        if held and self.opts.state not in ("auto", held[0]):
            raise ValueError(f"checkpoint {self.opts.checkpoint} holds the {held[0]} state: --state {self.opts.state} "
                             f"cannot resume it; keep --state {held[0]} (or auto) or use a new checkpoint")  # fmt: skip
        if self.opts.state == "chunked" and why:
            raise ValueError(f"--state chunked: {why}; use --state blob or auto")
        if self.opts.state == "auto":
            if held == ["chunked"] and why:
                raise ValueError(f"checkpoint {self.opts.checkpoint} holds the chunked state, but {why}: "
                                 "use a new checkpoint (the blob state)")  # fmt: skip
            if held == ["blob"]:
                why = "the checkpoint holds the blob state"
            if why:
                log.info("blob state: %s", why)
            else:
                log.info("chunked state (RocksDB)")
        return "blob" if self.opts.state == "blob" or why else "chunked"

    # -- sink -------------------------------------------------------------------------------------
    def _sink_oop(self, df: Any, batch_id: int) -> None:
        """foreachBatch: one action (toArrow) so the stateful step runs once, then write.

        The packed output goes straight to the store (:meth:`handle_packed`); a subclass that overrides
        :meth:`handle_rows` (to watch the generic rows, e.g. a benchmark's recorder) gets generic rows.
        """
        t0 = time.monotonic()
        packed = df.toArrow()
        if type(self).handle_rows is HighLevelJob.handle_rows:
            self.handle_packed(packed, batch_id)
        else:
            self.handle_rows(unpack_rows(packed, self.layouts), batch_id)
        self.metrics.batch_duration.observe(time.monotonic() - t0)

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
        return {name: S.StreamProgress(batch_id=p["batchId"], input_rows=p["numInputRows"], duration_ms=p["durationMs"],
                                       state_rows=p["stateRows"], state_memory_bytes=p["stateMemoryBytes"],
                                       dropped_by_watermark=p["droppedByWatermark"])
                for name, p in self.progress().items()}  # fmt: skip

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
                    self._dropped[name] = self._dropped.get(name, 0) + sum(int(o.get("numRowsDroppedByWatermark", 0)) for o in ops)
                    seen = bid
            self._dropped_seen[name] = seen
        return dict(self._dropped)

    def refresh_metrics(self) -> None:
        """Copy Spark's state-store numbers into the gauges (per stream name)."""
        for name, p in self.progress().items():
            self.metrics.state_bytes.labels(name).set(p["stateMemoryBytes"])
        for name, n in self.dropped_by_watermark().items():
            self.metrics.dropped.labels(name).set(n)

    def process_all_available(self) -> None:
        for s in self.streams:
            s.processAllAvailable()

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the streams, each after its running micro-batch if that ends within ``grace_s`` (an operator's
        stop). Stopping mid-batch is safe (the batch is replayed from the checkpoint) but cancels its Spark
        job, which logs stack traces that look like a failure."""
        deadline = time.monotonic() + grace_s
        for s in self.streams:
            wait_for_batch_end(s, deadline)
            try:
                s.stop()
            except Exception as exc:  # noqa: BLE001 - stopping must not hide the other streams
                log.warning("stopping %s: %s", s.name, exc)
        if self.asker is not None:
            self.asker.close()
        if self.live is not None:
            self.live.close()
        if self.feed is not None:
            self.feed.close()
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
