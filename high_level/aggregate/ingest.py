"""Kafka source of the high-level job: the raw batches of the queries' topics, in partition order.

Only (topic, partition, offset, value) are kept: the partition is the unit of ordering (punctuation
is only meaningful relative to the partials before it in the same partition) and the offset lets
the stateful step restore that order after Spark's shuffle and sort.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark.sql import DataFrame, SparkSession


def kafka_stream(
    spark: SparkSession,
    bootstrap: str,
    topics: Iterable[str],
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> DataFrame:
    """A streaming DataFrame (topic, partition, offset, value) over ``topics``.

    ``failOnDataLoss`` stays on: losing Kafka records silently would turn into silently wrong
    aggregates; the record counts in punctuation catch the rest (``missing_records``).
    """
    names = sorted(set(topics))
    if not names:
        raise ValueError("no topics to read")
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", ",".join(names))
        .option("startingOffsets", starting_offsets)
        .option("failOnDataLoss", "true")
    )
    # A consumer that reaches the end of a partition otherwise waits fetch.max.wait.ms (500 ms) per
    # task and micro-batch for data that is not there; punctuation latency matters more here.
    reader = reader.option("kafka.fetch.max.wait.ms", "50")
    # Messages are whole partial batches (hundreds of KB): with the consumer's default 1 MiB per
    # partition and fetch, reading a backlog is one round trip per few messages (the Kafka stage of
    # benchmarks/bench_rollup.py is faster with this). Only what is there is returned: no latency cost.
    reader = reader.option("kafka.max.partition.fetch.bytes", str(16 << 20))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(int(max_offsets_per_trigger)))
    for k, v in (extra or {}).items():
        reader = reader.option(k, v)
    return reader.load().select("topic", "partition", "offset", "value")
