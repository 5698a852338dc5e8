"""Kafka in the tests: a topic read back up to the partitions' current end offsets, decoded, and messages
produced in a given order."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from contract import wire


def read_topic(bootstrap: str, topic: str, partitions: int, **client: Any) -> dict[int, list[bytes]]:
    """partition -> message values, stopping at the end offsets seen at the start (a live producer
    keeps appending, so waiting for silence would never end)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **client)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 60
    while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for tp, recs in consumer.poll(timeout_ms=500).items():
            out[tp.partition].extend(r.value for r in recs if r.offset < ends[tp])
    consumer.close()
    return out


class KeyedRecorder:
    """Stands in for a keyed Kafka producer (the live publisher's) in pure-logic tests: records
    (topic, key, value) in the order sent, a tombstone's value being None."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def send(self, topic: str, key: bytes, value: bytes | None) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float | None = None) -> None:
        pass


def produce(kafka: Any, items: list[tuple[str, int, bytes]]) -> None:
    """Send (topic, partition, value) in this order (kafka-python keeps per-partition order)."""
    from kafka import KafkaProducer

    prod = KafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=2, max_request_size=8 << 20
    )
    try:
        for topic, part, value in items:
            prod.send(topic, value=value, partition=part)
        prod.flush(30)
    finally:
        prod.close(5)


def read_all(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, wire.Partials | wire.Punctuation]]:
    return [(p, wire.decode(v)) for p, vals in read_topic(bootstrap, topic, partitions).items() for v in vals]
