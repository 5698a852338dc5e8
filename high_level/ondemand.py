"""Job side of on-demand punctuation: ask the hosts that block a partition for their mark.

After every micro-batch the job knows, per (query, partition), its low-water mark and the hosts
holding it (``blocked_by`` of the status rows). When the first open window has ended by the batch
clock, waiting is pointless: :class:`PunctuationAsker` writes a request to the control topic
(``contract/control.py``) for each blocking host, at most once per ``min_gap_ms`` per (query,
partition, host). The agent flushes and punctuates; the next batch closes the window.

The aggregate pipeline creates one when ``--control-topic`` is set (oop mode) and the sink calls
``asker.observe(statuses)`` with each batch's :class:`contract.status.PartitionStatus` rows.

A join is asked for the same way (the join pipeline's asker, :meth:`PunctuationAsker.merge` makes one
of both): its status row names the join, its mark is in nanoseconds and its window is its output roll-up's;
the request names the join's select inputs (``inputs``), so a host that holds a join window back flushes
and punctuates the selects it runs (``low_level/host/ondemand.py`` listens for select queries too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from contract import control as C
from contract.status import PartitionStatus
from high_level.aggregate.rollup import Layout
from high_level.kafkaclients import KafkaClients

log = logging.getLogger("lowwater.ondemand")
PRODUCER = {"linger_ms": 0, "acks": 1}  # a request is worth sending at once


class PunctuationAsker:
    """Rate-limited punctuation requests from a blocked (query, partition) to the hosts blocking it."""

    def __init__(
        self,
        layouts: Sequence[Layout],
        kafka: KafkaClients | None,
        topic: str = C.CONTROL_TOPIC,
        min_gap_ms: int = 200,
        producer: Any = None,
        clock: Callable[[], float] = time.monotonic,
        inputs: dict[str, tuple[str, ...]] | None = None,
        ns_marks: Iterable[str] = (),
    ) -> None:
        self.layouts = {lay.name: lay for lay in layouts}
        # status query -> the queries whose hosts are asked (a join: its select inputs); default itself
        self.inputs = dict(inputs or {})
        self.ns_marks = set(ns_marks)  # status queries whose low-water mark is in ns (joins), not panes
        self.topic, self.min_gap_s, self.clock = topic, min_gap_ms / 1000.0, clock
        if producer is None:
            assert kafka is not None, "a producer or the Kafka clients to build one"
            producer = kafka.producer(**PRODUCER)
        self.producer = producer
        self.last: dict[tuple[str, int, str], float] = {}
        self.sent = self.suppressed = 0

    def due(self, st: PartitionStatus) -> bool:
        """Has the first open window of this status row ended by the batch clock (worth asking)?"""
        lay = self.layouts.get(st.query)
        lwm = st.low_water_mark_pane
        if lay is None or not st.open_windows:
            return False
        if lwm is None:  # an expected host never punctuated: everything waits on it
            return True
        if st.query in self.ns_marks:  # a join's mark is a time: the pane of its output roll-up
            lwm = (int(lwm) - lay.origin_ns) // lay.pane_ns
        first_open = max(int(lwm), int(st.closed_before_window or lwm))
        end_ms = (lay.origin_ns + (first_open + 1) * lay.pane_ns) // 1_000_000
        return end_ms <= st.now_ms

    def observe(self, statuses: Iterable[PartitionStatus]) -> int:
        """Send the requests this batch's status rows call for; returns how many were sent."""
        now = self.clock()
        n = 0
        for st in statuses:
            if not self.due(st):
                continue
            for host in st.blocked_by:
                k = (st.query, st.partition, host)
                if now - self.last.get(k, -1e18) < self.min_gap_s:
                    self.suppressed += 1
                    continue
                self.last[k] = now
                lwm = st.low_water_mark_pane
                for query in self.inputs.get(st.query, (st.query,)):
                    req = C.PunctuationRequest(
                        query, host, k[1], -1 if lwm is None else int(lwm), time.time_ns()
                    )
                    try:
                        self.producer.send(self.topic, key=host.encode(), value=C.encode_request(req))
                        n += 1
                    except Exception as exc:  # the control path is best effort: the timer still punctuates
                        log.warning("punctuation request to %s failed: %s", host, exc)
        if n:
            self.producer.flush(timeout=1.0)
        self.sent += n
        return n

    def merge(self, other: PunctuationAsker) -> PunctuationAsker:
        """One asker for both (the job has one sink): ``other``'s queries are asked through this one."""
        self.layouts.update(other.layouts)
        self.inputs.update(other.inputs)
        self.ns_marks |= other.ns_marks
        if other.producer is not self.producer:
            other.close()
        return self

    def close(self) -> None:
        self.producer.close(timeout=1.0)
