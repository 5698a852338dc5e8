"""The aggregate stream at rest: after a micro-batch that left no window open, the next one waits until a
partial arrives (or ``idle_ms`` passes) instead of running every trigger.

Why: an idle capture host still punctuates every query each second (its liveness), so Spark's offsets
move every trigger and it runs a whole micro-batch each time (Kafka offsets, the stateful step over every
shuffle partition and its Python workers, the checkpoint's files): 1.24 cores busy with nothing to
monitor (``idle.json``). With no window open a punctuation can close nothing, so those batches only
refresh liveness and status; one every ``idle_ms`` does that (a host heard in each batch is never
silent, :mod:`high_level.aggregate.meld`).

How it stays on time: the wait reads the topics from the batch's own end offsets (the checkpoint's
offset log, written before the batch runs) with a kafka-python consumer and ends at the first message
that is not a punctuation (``contract.wire`` kind byte), so a batch with records starts within
``poll_ms`` of their arrival; windows then close as before. The wait also ends at once when the job
stops (:meth:`IdlePacer.wake`). Only a checkpoint on this machine's file system is read; elsewhere the
stream is not paced.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contract import wire as W
from high_level.kafkaclients import KafkaClients

log = logging.getLogger("lowwater.pacer")
PUNCT_KINDS = frozenset({W.KIND_PUNCT, W.KIND_PUNCT_SHED, W.KIND_PUNCT_LOSS})
MAX_SCAN = 20_000  # messages one wait reads at most: more than that is traffic, not rest


def is_punctuation(value: bytes | None) -> bool:
    """A message that only moves a mark (``contract.wire`` header: magic, version, kind)."""
    return value is not None and len(value) >= 4 and value[:2] == W.MAGIC and value[3] in PUNCT_KINDS


def batch_offsets(checkpoint: Path, batch_id: int) -> dict[str, dict[int, int]] | None:
    """The Kafka end offsets of micro-batch ``batch_id`` from the stream's offset log (``offsets/<id>``:
    a version line, the batch metadata, then one line per source); None if it cannot be read."""
    try:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        doc = json.loads(lines[2])
        return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in doc.items()}
    except (OSError, IndexError, ValueError, AttributeError):
        return None


def first_traffic(records: Sequence[Any]) -> bool:
    """Whether any of ``records`` (kafka-python ``ConsumerRecord``) is not a punctuation."""
    return any(not is_punctuation(r.value) for r in records)


class IdlePacer:
    """Holds the aggregate stream's ``foreachBatch`` while the job is at rest (module docstring)."""

    def __init__(
        self,
        kafka: KafkaClients,
        checkpoint: Path,
        idle_ms: int,
        poll_ms: int = 200,
        consumer_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.kafka = kafka
        self.checkpoint = checkpoint
        self.idle_ms = idle_ms
        self.poll_ms = poll_ms
        self._factory = consumer_factory
        self._consumer: Any = None
        self._stop = threading.Event()
        self.holds = 0  # waits that ran, those a partial ended, and the seconds waited (tests)
        self.woken = 0
        self.held_s = 0.0
        self.holding = False

    def consumer(self) -> Any:
        if self._consumer is None:
            if self._factory is not None:
                self._consumer = self._factory()
            else:
                from kafka import KafkaConsumer

                self._consumer = KafkaConsumer(
                    bootstrap_servers=self.kafka.bootstrap,
                    group_id=None,
                    enable_auto_commit=False,
                    fetch_max_wait_ms=self.poll_ms,
                    **self.kafka.security.kafka_python(),
                )
        return self._consumer

    def hold(self, batch_id: int) -> float:
        """Wait after batch ``batch_id`` (which left no window open) until a message that is not a
        punctuation follows its end offsets, ``idle_ms`` passes or the job stops; the seconds waited."""
        if self._stop.is_set() or self.idle_ms <= 0:
            return 0.0
        ends = batch_offsets(self.checkpoint, batch_id)
        if not ends:
            return 0.0
        t0 = time.monotonic()
        deadline = t0 + self.idle_ms / 1e3
        self.holding = True
        try:
            from kafka import TopicPartition

            c = self.consumer()
            tps = {TopicPartition(t, p): o for t, parts in ends.items() for p, o in parts.items()}
            c.assign(list(tps))
            for tp, off in tps.items():
                c.seek(tp, off)
            scanned = 0
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                got = c.poll(timeout_ms=int(min(left, self.poll_ms / 1e3) * 1000), max_records=1000)
                records = [r for batch in got.values() for r in batch]
                scanned += len(records)
                if first_traffic(records) or scanned > MAX_SCAN:
                    self.woken += 1
                    break
        except Exception as exc:  # noqa: BLE001 - pacing is an economy: on any error run the next batch
            log.warning("idle pacing off for this batch: %s", exc)
        finally:
            self.holding = False
        held = time.monotonic() - t0
        self.holds += 1
        self.held_s += held
        return held

    def wake(self) -> None:
        """End a wait now and never wait again (the job stops)."""
        self._stop.set()

    def close(self) -> None:
        self.wake()
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass
