"""The API's half of the live seam: read the live topics (:mod:`contract.live`), keep the newest value
per (window, group) of the last few windows, and feed each connected consumer its own update queue.

One reader thread per API process consumes every ``lowwater.live.<query>`` topic from the beginning
(compaction leaves the newest message per key, so a restart reads the current values, then the
changes). Each live consumer (an SSE stream of ``/live/{query}``) subscribes with a policy and a
service rate: it gets the current values first, then every newer update through its
:class:`~high_level.live.queue.UpdateQueue`, which decides what a slow consumer sees (fresh values,
windows all or nothing). Messages that do not validate are counted and skipped, never guessed at.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import live as L
from contract import query as Q
from high_level.live.queue import Skipped, Update, UpdateQueue

log = logging.getLogger("lowwater.live")
KEEP_WINDOWS = 3  # newest windows per query whose values a new consumer gets first
MAX_SUBSCRIBERS = 64
BOOTSTRAP_TIMEOUT_MS = 10_000  # the live reader gives up a bootstrap (and reports why on /live) after this


@dataclass
class Subscription:
    """One consumer's queue (guarded by ``lock``: the reader thread offers, the stream takes)."""

    id: int
    query: str
    queue: UpdateQueue
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float = field(default_factory=time.monotonic)

    def take(self) -> Update | Skipped | None:
        with self.lock:
            return self.queue.take(time.monotonic())

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"id": self.id, "query": self.query, **self.queue.snapshot(time.monotonic())}


class LiveHub:
    """Newest values per query plus the subscriptions they are fanned out to."""

    def __init__(self, queries: Sequence[Q.QuerySpec], clock: Callable[[], float] = time.monotonic) -> None:
        self.queries = {q.name: q for q in queries}
        self.clock = clock
        self.latest: dict[str, dict[tuple, L.LiveUpdate]] = {n: {} for n in self.queries}
        self.subs: dict[int, Subscription] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.received = 0
        self.ignored = 0  # older or repeated versions (replays)
        self.rejected = 0  # did not validate / unknown query
        self.last_error = ""
        self.source_error = ""

    def ingest(self, u: L.LiveUpdate) -> bool:
        """One validated update from the topic; False when it is not newer than what is known."""
        q = self.queries.get(u.query)
        if q is None:
            self.rejected += 1
            self.last_error = f"update of unknown query {u.query!r}"
            return False
        try:
            L.check_query(u, q)
        except L.LiveFormatError as exc:
            self.rejected += 1
            self.last_error = str(exc)
            return False
        with self._lock:
            self.received += 1
            table = self.latest[u.query]
            old = table.get(u.key)
            if old is not None and (
                old.final or old.version > u.version or (old.version == u.version and not u.final)
            ):
                self.ignored += 1
                return False
            table[u.key] = u
            if old is None:
                self._trim(table)
            subs = [s for s in self.subs.values() if s.query == u.query]
        now = self.clock()
        upd = Update(u.window_start_us, tuple(u.group.values()), u, u.final, u.version)
        for s in subs:
            with s.lock:
                s.queue.offer(Update(**vars(upd)), now)
        return True

    def ingest_raw(self, key: bytes | None, value: bytes | None) -> bool:
        try:
            u = L.decode(key, value)
        except L.LiveFormatError as exc:
            self.rejected += 1
            self.last_error = str(exc)
            return False
        return self.ingest(u)

    @staticmethod
    def _trim(table: dict[tuple, L.LiveUpdate]) -> None:
        starts = sorted({k[0] for k in table})
        if len(starts) > KEEP_WINDOWS:
            cut = starts[-KEEP_WINDOWS]
            for k in [k for k in table if k[0] < cut]:
                del table[k]

    def subscribe(self, query: str, policy: str, service_s: float, max_cells: int = 100_000) -> Subscription:
        """A new consumer of ``query``: its queue starts with the current values (window order)."""
        with self._lock:
            if len(self.subs) >= MAX_SUBSCRIBERS:
                raise OverflowError(f"{MAX_SUBSCRIBERS} live consumers already")
            sub = Subscription(next(self._ids), query, UpdateQueue(policy, service_s, max_cells=max_cells))
            now = self.clock()
            for u in sorted(self.latest[query].values(), key=lambda x: (x.window_start_us, not x.final)):
                sub.queue.offer(
                    Update(u.window_start_us, tuple(u.group.values()), u, u.final, u.version), now
                )
            self.subs[sub.id] = sub
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self.subs.pop(sub.id, None)

    def snapshot(self, query: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = sorted(self.latest[query].values(), key=lambda x: (x.window_start_us, x.key[1]))
        return [u.model_dump() for u in rows]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            subs = list(self.subs.values())
            base = {
                "received": self.received,
                "ignored": self.ignored,
                "rejected": self.rejected,
                "last_error": self.last_error,
                "source_error": self.source_error,
                "windows": {n: len({k[0] for k in t}) for n, t in self.latest.items()},
            }
        return {**base, "consumers": [s.stats() for s in subs]}


class KafkaLiveSource:
    """The reader thread: every live topic of the hub's queries, from the beginning, into the hub."""

    def __init__(
        self,
        hub: LiveHub,
        bootstrap: str,
        consumer_config: dict[str, Any] | None = None,
        consumer: Any = None,
    ) -> None:
        self.hub, self.bootstrap = hub, bootstrap
        self.config = dict(consumer_config or {})
        self.consumer = consumer
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lowwater-live-source", daemon=True)
        self.assigned: set[str] = set()

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)

    def _assign(self) -> None:
        from kafka import TopicPartition

        want = {L.live_topic(n) for n in self.hub.queries}
        present = want & set(self.consumer.topics())
        if present - self.assigned:
            tps = [
                TopicPartition(t, p)
                for t in sorted(present)
                for p in sorted(self.consumer.partitions_for_topic(t) or ())
            ]
            new = [tp for tp in tps if tp.topic not in self.assigned]
            self.consumer.assign(tps)
            self.consumer.seek_to_beginning(*new)
            self.assigned = {tp.topic for tp in tps}

    def _run(self) -> None:
        last_assign = 0.0
        while not self.stop_event.is_set():
            try:
                if self.consumer is None:
                    from kafka import KafkaConsumer

                    # a broker that refuses us (wrong credentials, untrusted CA) fails the bootstrap: say so soon
                    opts = {"bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS, **self.config}
                    self.consumer = KafkaConsumer(
                        bootstrap_servers=self.bootstrap,
                        enable_auto_commit=False,
                        group_id=None,
                        client_id="lowwater-api-live",
                        **opts,
                    )
                if time.monotonic() - last_assign > 5 or len(self.assigned) < len(self.hub.queries):
                    if time.monotonic() - last_assign > 1:
                        self._assign()
                        last_assign = time.monotonic()
                if not self.assigned:
                    self.stop_event.wait(0.5)
                    continue
                for records in self.consumer.poll(timeout_ms=200).values():
                    for r in records:
                        self.hub.ingest_raw(r.key, r.value)
                self.hub.source_error = ""
            except Exception as exc:  # noqa: BLE001 - Kafka down: say so in /live, retry
                self.hub.source_error = (
                    f"{type(exc).__name__}: {exc} (check --live-bootstrap and --kafka-security)"
                )
                log.warning("live source: %s", exc)
                self.stop_event.wait(2)
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception:  # noqa: BLE001
                pass


def sse(event: str, data: str) -> bytes:
    """One Server-Sent Events message."""
    return f"event: {event}\ndata: {data}\n\n".encode()


def offer_all(hub: LiveHub, updates: Iterable[L.LiveUpdate]) -> int:
    """Ingest several updates (tests, replays); returns how many were new."""
    return sum(hub.ingest(u) for u in updates)


async def stream(
    hub: LiveHub, query: str, policy: str, rate: float, max_s: float | None, disconnected: Callable[[], Any]
) -> Any:
    """The SSE body of one live consumer: ``hello``, then ``update`` (a :class:`contract.live.LiveUpdate`),
    ``skip`` (a window that will not be delivered in full) and, every second, ``stats`` (its queue's
    staleness, load factor, overwrites, skipped windows). At most ``rate`` updates per second: the
    bounded service rate the queue's policy works against."""
    import asyncio
    import json

    service_s = 1.0 / rate
    sub = hub.subscribe(query, policy, service_s)
    try:
        yield sse("hello", json.dumps({"query": query, "policy": policy, "rate": rate, "consumer": sub.id}))
        end = None if max_s is None else time.monotonic() + max_s
        next_stats = 0.0
        while end is None or time.monotonic() < end:
            if await disconnected():
                break
            item = sub.take()
            if isinstance(item, Update):
                yield sse("update", item.value.model_dump_json())
                await asyncio.sleep(service_s)
            elif isinstance(item, Skipped):
                yield sse("skip", json.dumps({"window_start_us": item.window}))
            else:
                await asyncio.sleep(min(0.05, service_s))
            now = time.monotonic()
            if now >= next_stats:
                next_stats = now + 1.0
                yield sse("stats", json.dumps(sub.stats()))
        yield sse("end", json.dumps(sub.stats()))
    finally:
        hub.unsubscribe(sub)
