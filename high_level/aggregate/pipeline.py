"""The aggregate queries' stream in the Spark job: Kafka -> ``groupBy(topic, partition)`` -> a stateful
step (one group per Kafka partition, so a single shuffle; the body is
:class:`high_level.aggregate.processor.PartitionProcessor`) -> the job's sink. Windows close by
punctuation (min over live hosts), never by Spark's event-time watermark.

The state of the stateful step has two layouts (``--state``): *chunked* (``chunked``, or ``auto``, the
default), ``transformWithStateInPandas`` with the pane tables as per-batch chunks in RocksDB
(:mod:`high_level.aggregate.chunkstep`, :mod:`high_level.aggregate.chunks`), so a micro-batch costs what
it brings; and *blob* (``blob``), the processor saved whole every batch (:func:`state_function`), also
what ``auto`` keeps for what needs the whole open table every close or merge (landmark and bounded-top
queries) and for checkpoints written by it. A checkpoint is resumed by the layout that wrote it or refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from contract import query as Q
from contract.topics import wanted_topics
from high_level.aggregate.packed import OUTPUT_DDL
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.cluster.placement import checkpoint_shuffle_partitions, placement_salts
from high_level.pipeline import Outputs, Pipeline

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink

log = logging.getLogger("lowwater.job")
CHECKPOINT_DIRS = {"blob": "oop", "chunked": "oop-chunked"}  # the OOP stream's checkpoint per layout
# Settings of the aggregate stream only (it copies them when it starts), for the driver's planning every
# micro-batch: its rows are Kafka messages (thousands of partial records each), so whole-stage code generation
# only costs the driver (generating, compiling and JIT-compiling the classes again each batch); two optimizer
# rules that never apply to it are skipped. Measured on the standalone cluster (batches of ~3,400 records,
# load ~30, with 20 progress reports kept instead of 100, left out here: the benchmarks read every batch's):
# 404 -> 323 driver CPU-ms per batch (docs/design.md).
PLANNING_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation,"
    "org.apache.spark.sql.catalyst.optimizer.PropagateEmptyRelation",
}


def state_function(
    layouts: Sequence[Layout], settings: Settings, tick_ms: int
) -> Callable[..., Iterator[pd.DataFrame]]:
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


def _blob_step(
    grouped: Any, layouts: list[Layout], opts: JobOptions, ckpt: Path
) -> tuple[Any, dict[str, str]]:
    """The blob state: ``applyInPandasWithState``, the processor saved whole every micro-batch."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    rolled = grouped.applyInPandasWithState(
        state_function(layouts, opts.settings, opts.trigger_ms),
        outputStructType=OUTPUT_DDL,
        stateStructType="blob binary",
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )
    return rolled, {}


def _chunked_step(
    grouped: Any, layouts: list[Layout], opts: JobOptions, ckpt: Path
) -> tuple[Any, dict[str, str]]:
    """The chunked state: ``transformWithStateInPandas`` over RocksDB, with its state-store settings; no
    timers unless the checkpoint was written with them (:class:`high_level.aggregate.chunkstep.ChunkedStep`)."""
    from high_level.aggregate.chunkstep import SESSION_CONF, ChunkedStep, processing_timers

    timers = processing_timers(ckpt)
    rolled = grouped.transformWithStateInPandas(
        ChunkedStep(layouts, opts.settings, opts.trigger_ms, timers=timers),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="ProcessingTime" if timers else "None",
    )
    return rolled, SESSION_CONF


STEPS = {"blob": _blob_step, "chunked": _chunked_step}


class AggregatePipeline(Pipeline):
    """Every aggregate query of the job in one stream (blob or chunked state); also the punctuation asker
    and the live values, which read its windows."""

    def __init__(self, queries: Sequence[Q.QuerySpec]) -> None:
        self.queries = list(queries)
        self.layouts = [Layout.of(q) for q in self.queries]

    def topics(self) -> dict[str, int]:
        return wanted_topics(self.queries)

    def provision(self, admin: Any, opts: JobOptions) -> dict[str, str]:
        if not opts.live:
            return {}
        from high_level.live.publish import ensure_live_topics

        return ensure_live_topics(admin, self.queries)

    def outputs(self, opts: JobOptions) -> Outputs:
        asker = live = None
        if opts.control_topic:
            from high_level.ondemand import PunctuationAsker

            asker = PunctuationAsker(self.layouts, opts.kafka, topic=opts.control_topic)
        if opts.live:
            from high_level.live.publish import LivePublisher

            live = LivePublisher(self.queries, opts.kafka)
        return Outputs(asker=asker, live=live)

    def state_layout(self, opts: JobOptions) -> str:
        """The step's state layout for these options and queries: 'blob' or 'chunked'.

        A checkpoint is resumed by the layout that wrote it: 'auto' follows it (a job started before
        chunks were the default goes on with the blob), an explicit other layout is refused (no
        migration: the two states share nothing, and rolling back is a new checkpoint)."""
        from high_level.aggregate.chunks import chunked_unsupported

        why = chunked_unsupported(self.layouts)
        held = [st for st, d in CHECKPOINT_DIRS.items() if (Path(opts.checkpoint) / d).exists()]
        if held and opts.state not in ("auto", held[0]):
            raise ValueError(
                f"checkpoint {opts.checkpoint} holds the {held[0]} state: --state {opts.state} "
                f"cannot resume it; keep --state {held[0]} (or auto) or use a new checkpoint"
            )
        if opts.state == "chunked" and why:
            raise ValueError(f"--state chunked: {why}; use --state blob or auto")
        if opts.state == "auto":
            if held == ["chunked"] and why:
                raise ValueError(
                    f"checkpoint {opts.checkpoint} holds the chunked state, but {why}: "
                    "use a new checkpoint (the blob state)"
                )
            if held == ["blob"]:
                why = "the checkpoint holds the blob state"
            if why:
                log.info("blob state: %s", why)
            else:
                log.info("chunked state (RocksDB)")
        return "blob" if opts.state == "blob" or why else "chunked"

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        from pyspark.sql import functions as F

        from high_level.aggregate.ingest import kafka_stream

        raw = kafka_stream(
            spark,
            opts.bootstrap,
            [lay.topic for lay in self.layouts],
            max_offsets_per_trigger=opts.max_offsets_per_trigger,
            extra=opts.source_options,
        )
        state = self.state_layout(opts)
        ckpt = Path(opts.checkpoint) / CHECKPOINT_DIRS[state]
        parts: dict[str, int] = {}
        for q in self.queries:
            parts[q.topic] = max(parts.get(q.topic, 0), q.kafka.partitions)
        n_tasks = checkpoint_shuffle_partitions(ckpt) or int(spark.conf.get("spark.sql.shuffle.partitions"))
        salts = placement_salts(parts, n_tasks)
        if salts:
            table = F.create_map(
                *[x for (t, p), v in sorted(salts.items()) for x in (F.lit(f"{t}/{p}"), F.lit(v))]
            )
            salt = F.coalesce(
                F.try_element_at(table, F.concat_ws("/", "topic", F.col("partition").cast("string"))),
                F.lit(0),
            ).cast("int")
        else:
            salt = F.lit(0)
        # now_ms: the batch's timestamp from the offset log (a streaming query resolves current_timestamp()
        # to it, the same on a replay), the chunked step's clock when it runs without timers
        raw = raw.withColumn("salt", salt).withColumn("now_ms", F.unix_millis(F.current_timestamp()))
        grouped = raw.groupBy("topic", "partition", "salt")
        rolled, step_conf = STEPS[state](grouped, self.layouts, opts, ckpt)
        conf = {**PLANNING_CONF, **step_conf}
        if opts.idle_trigger_ms > 0 and "://" not in str(ckpt):
            from high_level.aggregate.pacer import IdlePacer

            sink.pacer = IdlePacer(opts.kafka, ckpt, opts.idle_trigger_ms, poll_ms=min(200, opts.trigger_ms))
        writer = (
            rolled.writeStream.queryName(f"{opts.name}-oop")
            .foreachBatch(sink.foreach_tasks)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime=f"{opts.trigger_ms} milliseconds")
        )
        # the stream copies the session's settings when it starts: set the state store's for it only
        before = {k: spark.conf.get(k, None) for k in conf}
        for k, v in conf.items():
            spark.conf.set(k, v)
        try:
            return [writer.start()]
        finally:
            for k, v in before.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)
