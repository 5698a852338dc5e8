"""The join queries' streams in the Spark job: Kafka (both inputs' topics) -> one state group per join
(:class:`high_level.join.step.JoinProcessor`) -> the job's sink, store and status, like the aggregates.

One streaming query per join, with its own checkpoint (``<checkpoint>/join-<name>``). Its input topics
must exist when it starts: a missing one is a clear error naming the join and the topic, and nothing is
emitted (with topic creation on, the job creates them first, as for the aggregates). An input that is an
aggregate query reads that query's closed-window feed (:mod:`high_level.join.feed`), which this job
publishes from its aggregate stream; a join without aggregates stores its rows (:mod:`high_level.join.rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from contract import query as Q
from contract.query import joins as JI
from contract.topics import wanted_topics
from high_level.aggregate.packed import OUTPUT_DDL
from high_level.aggregate.processor import Settings
from high_level.join.band import JoinLayout
from high_level.join.feed import FeedPublisher, feed_queries
from high_level.join.rows import layout_of
from high_level.join.step import JoinProcessor
from high_level.pipeline import Outputs, Pipeline

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink

log = logging.getLogger("lowwater.job.join")


class MissingInputTopic(RuntimeError):
    """A join's input topic does not exist on the broker."""


def layouts(cfg: Q.Config) -> list[JoinLayout]:
    """The joins of a config with their inputs (selects, aggregates' closed windows) resolved."""
    ins = JI.inputs(cfg.selects, cfg.queries)
    return [layout_of(j, ins) for j in cfg.joins]


def feed_sides(cfg: Q.Config, lay: JoinLayout) -> tuple[str, ...]:
    """The sides of a join that read an aggregate query's closed windows."""
    aggs = {q.name for q in cfg.queries}
    return tuple(s for s, n in (("left", lay.left), ("right", lay.right)) if n in aggs)


def join_state_function(
    layout: JoinLayout, settings: Settings, tick_ms: int, feeds: tuple[str, ...] = ()
) -> Callable[..., Iterator[pd.DataFrame]]:
    """The applyInPandasWithState body of one join: restore, feed the batch per partition in offset order, save."""
    return packed_state_function(
        lambda: JoinProcessor(layout, settings, feeds),
        lambda buf: JoinProcessor.from_bytes(buf, layout, settings, feeds),
        tick_ms,
    )


def packed_state_function(
    new: Callable[[], Any], load: Callable[[bytes], Any], tick_ms: int
) -> Callable[..., Iterator[pd.DataFrame]]:
    """The applyInPandasWithState body of an operator whose one state group holds every Kafka partition
    (a join, a distinct): restore (``load``) or start (``new``), feed its ``process_packed`` the batch per
    partition in (topic, offset) order, save its ``to_bytes``."""

    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        proc = load(state.get[0]) if state.exists else new()
        frames = [df for df in pdfs if len(df)]
        values: dict[int, list[bytes]] = {}
        if frames:
            df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            df = df.sort_values(["partition", "topic", "offset"], kind="stable")
            for p, g in df.groupby("partition", sort=True):
                values[int(p)] = g["value"].tolist()
        out = proc.process_packed(values, int(state.getCurrentProcessingTimeMs()))
        state.update((proc.to_bytes(),))
        state.setTimeoutDuration(tick_ms)
        yield out

    return fn


def start_state_stream(
    spark: Any,
    opts: JobOptions,
    sink: ResultSink,
    topics: list[str],
    kind: str,
    query: str,
    fn: Callable[..., Any],
    ddl: str = OUTPUT_DDL,
    write: Callable[[Any, int], None] | None = None,
) -> Any:
    """One streaming query: ``topics`` -> one state group (``fn``, all partitions, keyed by column ``kind``
    = ``query``, output ``ddl``) -> the sink (or ``write(batch, id)``); named and checkpointed ``<kind>-<query>``."""
    name = f"{kind}-{query}"
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from high_level.aggregate.ingest import kafka_stream

    raw = kafka_stream(
        spark,
        opts.bootstrap,
        topics,
        max_offsets_per_trigger=opts.max_offsets_per_trigger,
        extra=opts.source_options,
    )
    out = (
        raw.withColumn(kind, F.lit(query))
        .groupBy(kind)
        .applyInPandasWithState(
            fn,
            outputStructType=ddl,
            stateStructType="blob binary",
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
    )
    return (
        out.writeStream.queryName(f"{opts.name}-{name}")
        .foreachBatch(write or sink.foreach_packed)
        .option("checkpointLocation", str(Path(opts.checkpoint) / name))
        .trigger(processingTime=f"{opts.trigger_ms} milliseconds")
        .start()
    )


def check_topics(opts: JobOptions, lays: list[JoinLayout]) -> None:
    """Every input topic exists with the join's partition count, or MissingInputTopic (nothing starts)."""
    from contract.topics import existing_partitions

    admin = opts.kafka.admin(30)
    try:
        have = existing_partitions(
            admin, sorted({t for lay in lays for t in (lay.left_topic, lay.right_topic)})
        )
    finally:
        admin.close()
    for lay in lays:
        for topic in (lay.left_topic, lay.right_topic):
            if topic not in have:
                feed = JI.FEED_SUFFIX in topic
                raise MissingInputTopic(
                    f"join {lay.name!r}: input topic {topic!r} does not exist on {opts.bootstrap} "
                    + (
                        "(the closed-window feed of an aggregate query: the job creates it when it starts with "
                        "topic creation on)"
                        if feed
                        else "(start the capture agents or create it)"
                    )
                )
            if have[topic] != lay.partitions:
                raise MissingInputTopic(
                    f"join {lay.name!r}: input topic {topic!r} has {have[topic]} partitions, "
                    f"the join expects {lay.partitions}"
                )


def join_asker(cfg: Q.Config, opts: JobOptions, producer: Any = None) -> Any:
    """A punctuation asker for the joins' select inputs (a side that reads an aggregate's closed windows is
    asked through that aggregate's own asker); None when no join reads a select."""
    from high_level.ondemand import PunctuationAsker

    lays, inputs = [], {}
    for lay in layouts(cfg):
        feeds = feed_sides(cfg, lay)
        sel = tuple(n for s, n in (("left", lay.left), ("right", lay.right)) if s not in feeds)
        if sel and lay.rollup is not None:
            lays.append(replace(lay.rollup, name=lay.name))
            inputs[lay.name] = tuple(dict.fromkeys(sel))
    if not lays:
        return None
    return PunctuationAsker(
        lays, opts.kafka, topic=opts.control_topic, inputs=inputs, ns_marks=inputs, producer=producer
    )


class JoinPipeline(Pipeline):
    """The windowed joins of a config, one stream each; also the closed-window feed of the aggregate
    queries they read, which the sink publishes from the aggregate stream."""

    def __init__(self, config: Q.Config) -> None:
        self.config = config
        self.feed_queries = feed_queries(config)

    def topics(self) -> dict[str, int]:
        """The select inputs' topics and the feeds' (one partition each)."""
        inputs = [
            s for s in self.config.selects if any(s.name in (j.left, j.right) for j in self.config.joins)
        ]
        return wanted_topics(inputs) | {JI.closed_topic(q): 1 for q in self.feed_queries}

    def outputs(self, opts: JobOptions) -> Outputs:
        """The feed of the aggregate queries the joins read, and (``--control-topic``) the asker that
        requests punctuation from the hosts holding a join window back, for the join's select inputs."""
        feed = FeedPublisher(self.feed_queries, opts.kafka) if self.feed_queries else None
        return Outputs(asker=join_asker(self.config, opts) if opts.control_topic else None, feed=feed)

    def check(self, opts: JobOptions) -> None:
        """A missing join input is an error before any stream starts (nothing emitted)."""
        check_topics(opts, layouts(self.config))

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        """Start one streaming query per windowed join; results go through ``sink``."""
        streams = []
        for lay in layouts(self.config):
            fn = join_state_function(lay, opts.settings, opts.trigger_ms, feed_sides(self.config, lay))
            streams.append(
                start_state_stream(spark, opts, sink, [lay.left_topic, lay.right_topic], "join", lay.name, fn)
            )
            log.info(
                "join %s: %s x %s within %.3f s (%s), %d partitions",
                lay.name,
                lay.left,
                lay.right,
                lay.band_ns / 1e9,
                lay.type,
                lay.partitions,
            )
        return streams
