"""The local services work together: kafka-python -> Kafka 4.1 broker -> Spark's Kafka source.

Why: the capture agent writes binary partial aggregates with kafka-python and the Spark job
reads them with Structured Streaming; these tests pin down that bytes, keys and partitions
survive that path unchanged, and that acknowledged data survives a broker crash.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from local_stack.kafka_broker import KafkaBroker
from lowwater_testing.spark import read_available

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# (partition, key, value): binary payloads with NUL and 0xff bytes, an empty value, a null key.
MESSAGES: list[tuple[int, bytes | None, bytes]] = [
    (0, b"agent-1", bytes(range(256))),
    (1, b"agent-2", b"\x00\xff\x00\x01"),
    (0, None, b"\x7fELF\x00\x00"),
    (1, b"\x00\x01binary-key\xff", b""),
    (1, b"agent-2", struct.pack("<QdI", 2**63 - 1, -0.5, 7)),
]

Record = tuple[int, int, bytes | None, bytes]  # (partition, offset, key, value)


def _produce(bootstrap: str, topic: str, messages: list[tuple[int, bytes | None, bytes]]) -> list[Record]:
    """Send with acks='all' and return what the broker acknowledged, ordered by (partition, offset)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        sent = [(producer.send(topic, key=k, value=v, partition=p), k, v) for p, k, v in messages]
        producer.flush(timeout=30)
        acked = []
        for future, key, value in sent:
            md = future.get(timeout=30)
            acked.append((md.partition, md.offset, key, value))
    finally:
        producer.close()
    return sorted(acked, key=lambda r: (r[0], r[1]))


def _consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 60.0) -> list[Record]:
    """Read ``count`` records from the beginning of every partition with kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        got: list[Record] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.partition, r.offset, r.key, r.value) for r in records)
    finally:
        consumer.close()
    return sorted(got, key=lambda r: (r[0], r[1]))


def test_spark_kafka_source_reads_exact_bytes_keys_and_partitions(
    kafka: KafkaBroker, spark: SparkSession, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    expected = _produce(kafka.bootstrap_servers, topic, MESSAGES)
    assert {r[0] for r in expected} == {0, 1}

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = read_available(
        source.select("topic", "partition", "offset", "key", "value"), tmp_path / "checkpoint", 180
    )
    assert {r["topic"] for r in rows} == {topic}
    got = sorted(
        (
            (r["partition"], r["offset"], None if r["key"] is None else bytes(r["key"]), bytes(r["value"]))
            for r in rows
        ),
        key=lambda r: (r[0], r[1]),
    )
    assert got == expected


def test_acknowledged_messages_survive_broker_kill_and_restart(
    kafka: KafkaBroker, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=2)
    expected = _produce(kafka.bootstrap_servers, topic, MESSAGES)

    kafka.kill()
    assert not kafka.is_running()
    kafka.restart()

    assert _consume(kafka.bootstrap_servers, topic, partitions=2, count=len(expected)) == expected
    # The recovered log goes on where it stopped: nothing truncated, nothing duplicated.
    (after,) = _produce(kafka.bootstrap_servers, topic, [(1, b"after", b"restart")])
    assert after[:2] == (1, max(r[1] for r in expected if r[0] == 1) + 1)
