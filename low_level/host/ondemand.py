"""Agent side of on-demand punctuation on request: read the control topic, remember who asked.

A daemon thread consumes ``contract.control.CONTROL_TOPIC`` from its end (a restarted agent does not
replay old requests) and keeps, per query of this host, a pending flag. The agent's loop takes the
flag (``take``) and punctuates as if idle: it flushes every entry below its clock's pane and sends
the new mark. Select queries are listened for too (``take_query``): a join blocked by this host asks
for its select inputs' marks (``high_level/join/pipeline.py``, ``join_asker``). Requests for other hosts or unknown queries are ignored; undecodable ones counted.
The capture loop never waits on this thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from contract import control as C
from contract import query as Q

log = logging.getLogger("lowwater.ondemand")


class RequestListener:
    """Punctuation requests addressed to ``host``, per query index (set by a thread, taken by the loop)."""

    def __init__(
        self,
        host: str,
        queries: Sequence[Q.QuerySpec | Q.SelectSpec],
        bootstrap: str,
        topic: str = C.CONTROL_TOPIC,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        self.host, self.topic, self.bootstrap = host, topic, bootstrap
        self.index = {q.name: i for i, q in enumerate(queries)}
        self.consumer_config = consumer_config or {}
        self.pending = [False] * len(queries)
        self.lock = threading.Lock()
        self.ready = threading.Event()  # set once the consumer sits at the topic's end
        self.stopping = threading.Event()
        self.received = self.accepted = self.bad = 0
        self.thread = threading.Thread(target=self._run, name=f"lowwater-control-{host}", daemon=True)

    def start(self) -> RequestListener:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def take(self, i: int) -> bool:
        """True once per request burst for query i (the flag is cleared)."""
        with self.lock:
            asked, self.pending[i] = self.pending[i], False
        return asked

    def take_query(self, name: str) -> bool:
        """:meth:`take` by query name (False for a query this listener does not know)."""
        i = self.index.get(name)
        return i is not None and self.take(i)

    def offer(self, value: bytes) -> None:
        """One control message (what the thread does with each record; public for tests)."""
        self.received += 1
        try:
            r = C.decode_request(value)
        except C.ControlError:
            self.bad += 1
            return
        i = self.index.get(r.query)
        if r.host != self.host or i is None:
            return
        self.accepted += 1
        with self.lock:
            self.pending[i] = True

    def _run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = None
        while not self.stopping.is_set() and consumer is None:
            try:
                consumer = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    enable_auto_commit=False,
                    group_id=None,
                    **self.consumer_config,
                )
                parts = consumer.partitions_for_topic(self.topic)
                if not parts:
                    consumer.close()
                    consumer = None
                    self.stopping.wait(0.5)  # the job creates the topic; wait for it
                    continue
                tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
                consumer.assign(tps)
                consumer.seek_to_end(*tps)
                for tp in tps:
                    consumer.position(tp)  # resolve now: requests sent after ready are seen
            except Exception as exc:  # broker down: capture goes on, try again
                log.warning("control topic %s unavailable: %s", self.topic, exc)
                if consumer is not None:
                    consumer.close()
                consumer = None
                self.stopping.wait(1.0)
        if consumer is None:
            return
        self.ready.set()
        try:
            while not self.stopping.is_set():
                for records in consumer.poll(timeout_ms=50).values():
                    for rec in records:
                        self.offer(rec.value)
        finally:
            consumer.close()
