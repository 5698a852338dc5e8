"""Reading a lowwater topic back in tests: every message up to the partitions' current end offsets."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition


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
