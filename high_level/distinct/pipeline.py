"""The distinct queries' streams in the Spark job: Kafka (the input select's topic) -> one state group per
distinct (:class:`high_level.distinct.dupelim.DistinctProcessor`, every partition) -> the job's sink and
store, like the joins. One streaming query per distinct, checkpoint ``<checkpoint>/distinct-<name>``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from contract import query as Q
from contract.topics import wanted_topics
from high_level.aggregate.packed import OUTPUT_DDL
from high_level.aggregate.processor import Settings
from high_level.distinct.dupelim import DistinctLayout, DistinctProcessor
from high_level.pipeline import Pipeline

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink

log = logging.getLogger("lowwater.job.distinct")


class MissingDistinctInput(RuntimeError):
    """A distinct's input topic does not exist on the broker (or has another partition count)."""


def layouts(cfg: Q.Config) -> list[DistinctLayout]:
    return [DistinctLayout.of(d, cfg.select(d.input)) for d in cfg.distincts]


def distinct_state_function(
    layout: DistinctLayout, settings: Settings, tick_ms: int
) -> Callable[..., Iterator[pd.DataFrame]]:
    """The applyInPandasWithState body of one distinct: restore, feed each partition in offset order, save."""

    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        proc = (
            DistinctProcessor.from_bytes(state.get[0], layout, settings)
            if state.exists
            else DistinctProcessor(layout, settings)
        )
        frames = [df for df in pdfs if len(df)]
        values: dict[int, list[bytes]] = {}
        if frames:
            df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            df = df.sort_values(["partition", "offset"], kind="stable")
            for p, g in df.groupby("partition", sort=True):
                values[int(p)] = g["value"].tolist()
        out = proc.process_packed(values, int(state.getCurrentProcessingTimeMs()))
        state.update((proc.to_bytes(),))
        state.setTimeoutDuration(tick_ms)
        yield out

    return fn


class DistinctPipeline(Pipeline):
    """The distinct queries of a config, one stream each."""

    def __init__(self, config: Q.Config) -> None:
        self.config = config

    def topics(self) -> dict[str, int]:
        return wanted_topics([self.config.select(d.input) for d in self.config.distincts])

    def check(self, opts: JobOptions) -> None:
        """A missing input topic is an error before any stream starts (nothing emitted)."""
        from contract.topics import existing_partitions

        lays = layouts(self.config)
        admin = opts.kafka.admin(30)
        try:
            have = existing_partitions(admin, sorted({lay.topic for lay in lays}))
        finally:
            admin.close()
        for lay in lays:
            if have.get(lay.topic) != lay.partitions:
                raise MissingDistinctInput(
                    f"distinct {lay.name!r}: input topic {lay.topic!r} "
                    + (
                        "does not exist (start the capture agents or create it)"
                        if lay.topic not in have
                        else f"has {have[lay.topic]} partitions, select {lay.input!r} declares {lay.partitions}"
                    )
                )

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        from high_level.aggregate.ingest import kafka_stream

        streams = []
        for lay in layouts(self.config):
            raw = kafka_stream(
                spark,
                opts.bootstrap,
                [lay.topic],
                max_offsets_per_trigger=opts.max_offsets_per_trigger,
                extra=opts.source_options,
            )
            out = (
                raw.withColumn("distinct", F.lit(lay.name))
                .groupBy("distinct")
                .applyInPandasWithState(
                    distinct_state_function(lay, opts.settings, opts.trigger_ms),
                    outputStructType=OUTPUT_DDL,
                    stateStructType="blob binary",
                    outputMode="append",
                    timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
                )
            )
            streams.append(
                out.writeStream.queryName(f"{opts.name}-distinct-{lay.name}")
                .foreachBatch(sink.foreach_packed)
                .option("checkpointLocation", str(Path(opts.checkpoint) / f"distinct-{lay.name}"))
                .trigger(processingTime=f"{opts.trigger_ms} milliseconds")
                .start()
            )
            log.info("distinct %s of %s within %.6f s", lay.name, lay.input, lay.within_ns / 1e9)
        return streams
