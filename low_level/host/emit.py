"""Kafka output: partial-aggregate batches and punctuation, partitioned by a stable key hash.

kafka-python's idempotent producer (acks=all) retries without duplicates and keeps per-partition
order, so a punctuation always lands after the partials it covers. Its own buffer is unbounded, so we
bound what we hand it (unacknowledged bytes); the rest waits in our :class:`Backlog`, which merges in
place and so stays bounded by distinct keys while Kafka is slow or down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from contract import query as Q
from contract import wire
from low_level.host.backlog import Backlog, Block
from low_level.kernel.selection import SelectOutbox
from low_level.kernel.tuplerows import row_stage

log = logging.getLogger(__name__)
MAX_BATCH_RECORDS = 16384


@dataclass
class EmitStats:
    records_sent: int = 0
    bytes_sent: int = 0
    batches_sent: int = 0
    punctuations_sent: int = 0
    send_errors: int = 0
    delivery_failures: int = 0


@dataclass
class Emitter:
    """Owns the producer, the backlog and per-partition sequence numbers for one agent incarnation."""

    queries: list[Q.QuerySpec]
    host: str
    bootstrap: str | None
    producer_config: dict = field(default_factory=dict)
    merge_at: int = 2_000_000
    max_records: int = 8_000_000
    producer: object | None = (
        None  # a kafka.KafkaProducer, or any object with send(topic, value=, partition=)
    )
    ensure_topics: bool = True  # create/grow the queries' topics on connect
    max_inflight_bytes: int = (
        64 << 20
    )  # unacknowledged bytes handed to the producer; beyond it data waits here
    selects: list[Q.SelectSpec] = field(default_factory=list)  # select queries: rows go through self.outbox
    rows: list[Q.RowQuerySpec] = field(default_factory=list)  # row-window queries: self.row_panes

    def __post_init__(self) -> None:
        self.incarnation = time.time_ns()
        self.by_name = {q.name: q for q in self.queries}
        self.backlog = Backlog(
            {q.name: Q.merge_ops(q) for q in self.queries},
            self.merge_at,
            self.max_records,
            pane_time={q.name: (q.window.origin_ns, q.window.pane_ns) for q in self.queries},
        )
        self.seq: dict[tuple[str, int], int] = {}
        # newest pane sent or shed per (query, partition): each punctuation states it (wire sent_upto)
        self.sent_upto: dict[tuple[str, int], int] = {}
        self.stats = EmitStats()
        self.inflight_bytes = 0
        self._lock = threading.Lock()
        self._closing = False
        self.connect_errors = 0
        self.outbox = SelectOutbox(self.selects, self.host, self.incarnation)
        self.row_panes = [row_stage(r, self.host, self.incarnation) for r in self.rows]
        self._connector: threading.Thread | None = None
        if self.producer is None and self.bootstrap:
            # connect in the background: Kafka may be down when capture starts, and a blocking
            # bootstrap would stall the capture loop; until then everything waits in the backlog
            self._connector = threading.Thread(target=self._connect, name="kafka-connect", daemon=True)
            self._connector.start()

    def _ensure_topics(self) -> None:
        """Make the queries' topics exist with their partition counts (an auto-created topic has one)."""
        from contract.topics import connect, ensure_topics, wanted_topics

        security = {
            k: v for k, v in self.producer_config.items() if k.startswith(("security_", "sasl_", "ssl_"))
        }
        admin = connect(self.bootstrap or "", security, 10)
        try:
            for topic, action in ensure_topics(
                admin, wanted_topics([*self.queries, *self.selects, *self.rows]), exact=True
            ).items():
                log.info("topic %s: %s", topic, action)
        finally:
            admin.close()

    def _connect(self) -> None:
        from kafka import KafkaProducer

        from contract.topics import PartitionChangeRefused

        cfg = dict(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            batch_size=1 << 20,
            max_request_size=8 << 20,
            max_block_ms=0,  # never stall capture: what does not fit stays in our backlog
            delivery_timeout_ms=600_000,
            request_timeout_ms=30_000,
            retry_backoff_ms=200,
            reconnect_backoff_max_ms=2000,
            client_id=f"lowwater-agent-{self.host}",
            # the client's own sensors (rates, sizes, latencies per request) were a third of its I/O
            # thread's CPU on the capture core; nothing reads them (the agent exports its own metrics)
            metrics_enabled=False,
        )
        cfg.update(self.producer_config)
        backoff = 0.5
        while self.producer is None and not self._closing:
            try:
                if self.ensure_topics:
                    self._ensure_topics()
                self.producer = KafkaProducer(**cfg)
            except PartitionChangeRefused as exc:  # reachable, but the topic does not fit the config
                self.connect_errors += 1
                log.error("%s; capture goes on into the bounded backlog, retrying in 30 s", exc)
                time.sleep(30)
                continue
            except Exception as exc:  # noqa: BLE001 - any bootstrap failure: retry with backoff
                self.connect_errors += 1
                log.warning(
                    "Kafka not reachable at %s (%s; check the address and any --kafka-security "
                    "credentials or CA); retrying in %.1fs",
                    self.bootstrap,
                    exc,
                    backoff,
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # -- input side
    def submit(self, query: str, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Queue partial records of one query, split by the stable partition of their group key."""
        if pane.shape[0] == 0:
            return
        q = self.by_name[query]
        nparts = q.kafka.partitions
        if nparts == 1:
            self.backlog.add_partials(query, 0, Block(pane, key, state))
            return
        # a holistic query partitions by its group words only (contract.query.partition_width)
        part = wire.partition_of(key[:, : Q.partition_width(q)], nparts)
        for p in range(nparts):
            sel = part == p
            if sel.any():
                self.backlog.add_partials(query, p, Block(pane[sel], key[sel], state[sel]))

    def punctuate(
        self,
        query: str,
        mark_pane: int,
        mark_ns: int,
        stats: dict[str, int],
        losses: tuple[tuple[int, int, str, int], ...] = (),
    ) -> None:
        """Queue a punctuation for every partition of the query's topic (after everything queued so far).
        ``losses`` (low_level.host.losses) go to every partition: which one a lost packet's group hashes
        to is unknown."""
        q = self.by_name[query]
        now = time.time_ns()
        for p in range(q.kafka.partitions):
            self.backlog.add_punctuation(
                query,
                p,
                wire.Punctuation(
                    query, self.host, self.incarnation, p, 0, mark_pane, mark_ns, now, stats, losses=losses
                ),
            )

    def group_done(self, query: str, key: np.ndarray, done_pane: np.ndarray) -> None:
        """Queue group-wise punctuation (OOP App. A): group ``key[i]`` (its group words) is done up to
        pane ``done_pane[i]``, in the partition its partials go to, after everything queued so far. The
        caller promises it submitted every partial of those groups with pane < done_pane (it drained
        them from its table) and will submit no more: the job closes those windows at once."""
        q = self.by_name[query]
        key = np.asarray(key, np.int64).reshape(len(done_pane), -1)[:, : Q.partition_width(q)]
        done = np.asarray(done_pane, np.int64)
        if len(done) == 0:
            return
        part = (
            wire.partition_of(key, q.kafka.partitions) if q.kafka.partitions > 1 else np.zeros(len(done), int)
        )
        for p in np.unique(part).tolist():
            sel = part == p
            g = wire.GroupPunctuation(query, self.host, self.incarnation, p, 0, key[sel], done[sel])
            self.backlog.add_punctuation(query, p, g)

    # -- output side
    def _acked(self, size: int) -> None:
        with self._lock:
            self.inflight_bytes -= size

    def _failed(self, size: int, exc: BaseException) -> None:
        with self._lock:
            self.inflight_bytes -= size
            self.stats.delivery_failures += 1
        log.warning("Kafka delivery failed after all retries: %s", exc)

    def _send(self, topic: str, partition: int, value: bytes) -> bool:
        from kafka.errors import KafkaTimeoutError

        try:
            fut = self.producer.send(topic, value=value, partition=partition)  # type: ignore[union-attr]
        except KafkaTimeoutError:
            return False  # producer buffer full or metadata unavailable: keep it in the backlog
        except Exception as exc:  # noqa: BLE001 - any other client error: count it, keep the data
            self.stats.send_errors += 1
            log.warning("Kafka send error: %s", exc)
            return False
        size = len(value)
        if hasattr(fut, "add_errback"):
            with self._lock:
                self.inflight_bytes += size
            fut.add_callback(lambda _md, size=size: self._acked(size))
            fut.add_errback(lambda exc, size=size: self._failed(size, exc))
        self.stats.bytes_sent += size
        return True

    def pump(self) -> int:
        """Hand queued items to the producer in FIFO order per partition; returns items handed over."""
        handed = 0
        if self.producer is None:
            return handed  # not connected yet: keep everything in the backlog
        for (query, part), fifo in self.backlog.fifos.items():
            topic = self.by_name[query].topic
            while fifo:
                if self.inflight_bytes > self.max_inflight_bytes:
                    return handed  # Kafka is slow or down: keep the rest here, merged in place if needed
                if isinstance(fifo[0], Block) and len(fifo) > 1 and isinstance(fifo[1], Block):
                    _coalesce(fifo)  # many small drained blocks -> fewer, larger Kafka messages
                item = fifo[0]
                shed = self.backlog.take_shed_records(query, part)  # shed records count as sent (a gap)
                if shed:
                    self.seq[(query, part)] = self.seq.get((query, part), 0) + shed
                seq = self.seq.get((query, part), 0)
                if isinstance(item, Block):
                    n = min(item.n, MAX_BATCH_RECORDS)
                    value = wire.encode_partials(
                        query,
                        self.host,
                        self.incarnation,
                        part,
                        seq,
                        item.pane[:n],
                        item.key[:n],
                        item.state[:n],
                    )
                    if not self._send(topic, part, value):
                        return handed
                    self.seq[(query, part)] = seq + n
                    self._upto(query, part, int(item.pane[:n].max()))
                    self.stats.records_sent += n
                    self.stats.batches_sent += 1
                    self.backlog.records -= n
                    if n == item.n:
                        fifo.popleft()
                    else:
                        fifo[0] = Block(item.pane[n:], item.key[n:], item.state[n:])
                elif isinstance(item, wire.GroupPunctuation):
                    if not self._send(topic, part, wire.encode_group_punctuation(replace(item, seq=seq))):
                        return handed
                    self.stats.punctuations_sent += 1
                    fifo.popleft()
                else:
                    ranges = self.backlog.take_shed(
                        query, part
                    )  # whole panes shed: the high level flags them
                    for r in ranges:
                        self._upto(query, part, int(r[1]))
                    p = replace(item, seq=seq, shed=ranges, sent_upto=self.sent_upto.get((query, part)))
                    if not self._send(topic, part, wire.encode_punctuation(p)):
                        self.backlog.give_back_shed(query, part, ranges)
                        return handed
                    self.stats.punctuations_sent += 1
                    fifo.popleft()
                handed += 1
        if self.inflight_bytes <= self.max_inflight_bytes:
            handed += self.outbox.pump(self._send)
            for rp in self.row_panes:
                handed += rp.pump(self._send)
        return handed

    def _upto(self, query: str, part: int, pane: int) -> None:
        self.sent_upto[(query, part)] = max(self.sent_upto.get((query, part), pane), pane)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Pump until the backlog is empty and the producer has delivered everything (or time runs out)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.pump()
            if (
                self.backlog.records == 0
                and not any(self.backlog.fifos.values())
                and self.outbox.empty
                and all(rp.empty for rp in self.row_panes)
            ):
                if self.producer is not None and hasattr(self.producer, "flush"):
                    self.producer.flush(timeout=max(0.1, deadline - time.monotonic()))
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self._closing = True
        if self.producer is not None and hasattr(self.producer, "close"):
            self.producer.close(timeout=5)


def _coalesce(fifo: deque) -> None:
    """Merge the leading run of blocks (up to MAX_BATCH_RECORDS) into one, keeping FIFO order."""
    run = [fifo.popleft()]
    total = run[0].n
    while fifo and isinstance(fifo[0], Block) and total + fifo[0].n <= MAX_BATCH_RECORDS:
        b = fifo.popleft()
        run.append(b)
        total += b.n
    fifo.appendleft(
        Block(
            np.concatenate([b.pane for b in run]),
            np.concatenate([b.key for b in run]),
            np.concatenate([b.state for b in run]),
        )
    )
