"""Baseline: Spark's own event-time watermark (max event time seen minus a fixed delay).

This is the "slack" approach the OOP paper argues against, kept to measure it: one fast host
pushes the watermark forward, a host lagging by more than the delay has its partials silently
dropped, and state must cover the whole delay. It ignores punctuation entirely. One streaming query
per configured query (each has its own key/state layout), writing the same Parquet layout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from contract import aggregates as A
from contract import query as Q
from contract import wire
from contract.topics import wanted_topics
from high_level.aggregate.rollup import I64, Layout
from high_level.pipeline import Pipeline

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink


class WatermarkJoinRefused(ValueError):
    """A config with join queries started in ``--mode watermark``: refused at start, never run silently."""


def refuse_joins(config: Q.Config | None) -> None:
    """Joins run in the punctuation mode only. Without this, the watermark mode would start the
    aggregates and skip the joins, leaving an operator with empty join results and no reason: the
    baseline has no join of its own (Spark's stream-stream join with watermarks is measured next to the
    OA-Join in benchmarks/bench_join.py, not run as a job mode)."""
    if config is None or not config.joins:
        return
    names = ", ".join(repr(j.name) for j in config.joins)
    raise WatermarkJoinRefused(
        f"{config.path}: join queries ({names}) run in the punctuation mode only (--mode oop, the default); "
        "--mode watermark (the max-event-time-minus-delay baseline) has no join: run it on a config "
        "without join queries"
    )


def explode_partials(lay: Layout, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Kafka values -> one row per partial record (host, pane start in us, k0.., s0..)."""
    kcols = [f"k{i}" for i in range(lay.kw)]
    scols = [f"s{j}" for j in range(lay.na)]
    for pdf in frames:
        panes, keys, states, hosts = [], [], [], []
        for v in pdf["value"]:
            try:
                b = wire.decode(v)
            except wire.WireError:
                continue
            if not isinstance(b, wire.Partials) or b.query != lay.name:
                continue
            if b.key.shape[1] != lay.kw or b.state.shape[1] != lay.na:
                continue
            panes.append(b.pane)
            keys.append(b.key)
            states.append(b.state)
            hosts.append(np.full(b.n, b.host, object))
        if not panes:
            continue
        pane = np.concatenate(panes)
        key = np.concatenate(keys)
        state = np.concatenate(states)
        data: dict[str, Any] = {
            "host": np.concatenate(hosts),
            "event_us": (lay.origin_ns + pane * lay.pane_ns) // 1000,
        }
        for i, c in enumerate(kcols):
            data[c] = key[:, i]
        for j, c in enumerate(scols):
            data[c] = state[:, j]
        yield pd.DataFrame(data)


def to_generic(lay: Layout, pdf: pd.DataFrame, closed_at_ms: int) -> pd.DataFrame:
    """Aggregated rows (start_us, end_us, k.., s..) -> the generic row schema the store writes."""
    n = len(pdf)
    end_ns = pdf["end_us"].to_numpy(I64) * 1000
    w = (end_ns - lay.origin_ns) // lay.pane_ns - 1
    key = pdf[[f"k{i}" for i in range(lay.kw)]].to_numpy(I64).reshape(n, lay.kw)
    state = pdf[[f"s{j}" for j in range(lay.na)]].to_numpy(I64).reshape(n, lay.na)
    return pd.DataFrame(
        {
            "query": np.full(n, lay.name, object),
            "partition": np.full(n, -1, np.int32),
            "window": w,
            "window_start_ns": pdf["start_us"].to_numpy(I64) * 1000,
            "window_end_ns": end_ns,
            "key": list(key),
            "state": list(state),
            "kind": np.full(n, "final", object),
            "closed_at_ms": np.full(n, closed_at_ms, I64),
            "hosts": np.zeros(n, np.int32),
            # the baseline knows no hosts and Spark drops late records silently: never claim completeness
            "hosts_expected": np.ones(n, np.int32),
            "hosts_in_mark": np.zeros(n, np.int32),
            "late_partials": np.zeros(n, I64),
            "missing_records": np.zeros(n, I64),
            "status": np.full(n, None, object),
        }
    )


class WatermarkPipeline(Pipeline):
    """One watermark-mode streaming query per configured query; no punctuation, no Kafka publishers."""

    def __init__(self, queries: Sequence[Q.QuerySpec]) -> None:
        self.queries = list(queries)

    def topics(self) -> dict[str, int]:
        return wanted_topics(self.queries)

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        from pyspark.sql import functions as F

        from high_level.aggregate.ingest import kafka_stream

        streams = []
        for q in self.queries:
            lay = Layout.of(q)
            kcols = [f"k{i}" for i in range(lay.kw)]
            scols = [f"s{j}" for j in range(lay.na)]
            schema = ", ".join(["host string", "event_us long", *[f"{c} long" for c in kcols + scols]])
            raw = kafka_stream(
                spark,
                opts.bootstrap,
                [q.topic],
                max_offsets_per_trigger=opts.max_offsets_per_trigger,
                extra=opts.source_options,
            )
            rows = raw.select("value").mapInPandas(lambda it, lay=lay: explode_partials(lay, it), schema)
            rows = rows.withColumn("event_time", F.timestamp_micros("event_us"))
            slide_ns = lay.pane_ns * lay.s  # Spark's windows start at origin + n*slide, as lowwater's do
            win = F.window(
                "event_time",
                f"{lay.range_ns // 1000} microseconds",
                f"{slide_ns // 1000} microseconds",
                f"{(lay.origin_ns % slide_ns) // 1000} microseconds",
            )
            agg = (
                rows.withWatermark("event_time", f"{opts.watermark_delay_ms} milliseconds")
                .groupBy(win.alias("w"), *kcols)
                .agg(
                    *[
                        getattr(F, A.MERGE_NAMES[op])(c).cast("long").alias(c)
                        for op, c in zip(lay.ops, scols, strict=True)
                    ]
                )
                .select(
                    F.unix_micros("w.start").alias("start_us"),
                    F.unix_micros("w.end").alias("end_us"),
                    *kcols,
                    *scols,
                )
            )

            def write(df: Any, batch_id: int, lay: Layout = lay) -> None:
                with sink.timed():
                    sink.handle_rows(to_generic(lay, df.toPandas(), int(time.time() * 1000)), batch_id)

            streams.append(
                agg.writeStream.queryName(f"{opts.name}-watermark-{q.name}")
                .outputMode("append")
                .foreachBatch(write)
                .option("checkpointLocation", str(Path(opts.checkpoint) / "watermark" / q.name))
                .trigger(processingTime=f"{opts.trigger_ms} milliseconds")
                .start()
            )
        return streams
