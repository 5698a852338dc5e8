"""The API's half of the live seam: read the live topics (:mod:`contract.live`), keep the newest value
per (window, group) of the last few windows, and feed each connected consumer its own update queue.

One reader thread per API process consumes every ``lowwater.live.<query>`` topic from a recent offset:
the first message published after now minus the query's :func:`lookback_ms` (the windows a consumer is
shown, plus a margin), found by time (``offsets_for_times``), so a restart reads the current values
then the changes, not a week of older runs (replaying those kept the live panel 13 minutes behind).
Compaction and the job's tombstones of long-closed windows keep the topic itself small. The messages of
a query nobody consumes wait unread (the newest per key) until someone asks for its values: each batch
republishes every open window's groups, so most are replaced before anyone would look at them.

Each live consumer (an SSE stream of ``/live/{query}``) subscribes with a policy and a
service rate: it gets the current values first, then every newer update through its
:class:`~high_level.live.queue.UpdateQueue`, which decides what a slow consumer sees (fresh values,
windows all or nothing). Messages that do not validate are counted and skipped, never guessed at.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import live as L
from contract import query as Q
from contract import results as R
from high_level.live.queue import Skipped, Update, UpdateQueue

log = logging.getLogger("lowwater.live")
KEEP_WINDOWS = 3  # newest windows per query whose values a new consumer gets first
MAX_SUBSCRIBERS = 64
BOOTSTRAP_TIMEOUT_MS = 10_000  # the live reader gives up a bootstrap (and reports why on /live) after this
LOOKBACK_MARGIN_MS = 60_000  # publication lags a window by the job's batches and the hosts' marks
QUIET_TOPIC_MESSAGES = 20_000  # a topic with nothing recent: read its newest messages only (the last values)
# raw values of a query nobody consumes held before the values of windows the table would drop go (then
# twice what is left: each value is looked at a bounded number of times, and never decoded for that)
MAX_UNREAD = 20_000
# the reader's consumer (librdkafka): a poll takes a whole burst (the job publishes once per micro-batch)
POLL_MESSAGES = 20_000
CONSUMER = {"queued.max.messages.kbytes": 16_384}  # prefetched per partition, at most (librdkafka: 64 MB)
ERROR_HOLD_S = 30.0  # /live shows the reader's last error this long, unless messages arrive again
# the collector's first threshold while the reader runs: above what one poll holds at once (its messages
# and their (key, value) pairs), so a poll's objects, freed by reference counting, are not moved to the
# old generation; at the default 700 they were, and full collections over the whole process took over a
# quarter of the API's CPU with no client (demo-shaped live traffic)
GC_YOUNG_THRESHOLD = 4 * POLL_MESSAGES


def collect_polls_young() -> None:
    """Raise the collector's first threshold to GC_YOUNG_THRESHOLD (never lower it; off stays off)."""
    young, *older = gc.get_threshold()
    if young and young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)


def lookback_ms(q: Q.QuerySpec) -> int:
    """How far back (wall clock) a restarted reader starts in ``q``'s live topic: the windows it keeps
    (KEEP_WINDOWS slides plus one range) and a margin; older messages are of windows it would drop."""
    w = q.window
    return (w.range_ns + KEEP_WINDOWS * w.slide) // 1_000_000 + LOOKBACK_MARGIN_MS


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
        # each query's (group, value) column names, which an update must carry (L.check_query says why not)
        self.columns = {
            n: (tuple(c for c, _ in R.key_columns(q)), tuple(c for c, _ in R.aggregate_columns(q)))
            for n, q in self.queries.items()
        }
        # per query: window start -> its keys in ``latest``, and a min-heap of those starts, so a new key
        # costs O(log windows) and the trim drops whole windows (sorting every start per key took 77% of a
        # core at 20K packets/s)
        self.windows: dict[str, dict[int, set[tuple]]] = {n: {} for n in self.queries}
        self.starts: dict[str, list[int]] = {n: [] for n in self.queries}
        self.tombstones = 0  # closed windows' deletions on the topic (compaction markers, not values)
        # per query nobody consumes: key -> newest raw value, in arrival order, read (validated) only when
        # someone asks (values, a consumer, /live, /metrics). Why: every batch republishes each open
        # window's groups, so most values are replaced before anyone looks; validating each one was most
        # of the API's CPU with no browser connected (0.1 of a core under the demo traffic)
        self.unread: dict[str, dict[bytes, bytes]] = {n: {} for n in self.queries}
        self.unread_limit = dict.fromkeys(self.queries, MAX_UNREAD)  # when the old windows' values go
        # raw values dropped unread: replaced by a newer one of their key, or of a window older than the
        # newest KEEP_WINDOWS unread ones (it would leave the table as soon as they were read)
        self.coalesced = 0
        self.subs: dict[int, Subscription] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.received = 0
        self.ignored = 0  # older or repeated versions (replays)
        self.rejected = 0  # did not validate / unknown query
        self.last_error = ""
        self.source_error = ""

    def _valid(self, u: L.LiveUpdate) -> bool:
        """The update is of a known query, with its columns; else counted as rejected, with why."""
        q = self.queries.get(u.query)
        if q is None:
            self.rejected += 1
            self.last_error = f"update of unknown query {u.query!r}"
            return False
        try:
            if (tuple(u.group), tuple(u.values)) != self.columns[u.query]:  # the common case costs a compare
                L.check_query(u, q)
        except L.LiveFormatError as exc:
            self.rejected += 1
            self.last_error = str(exc)
            return False
        return True

    def _apply(self, u: L.LiveUpdate) -> list[Subscription] | None:
        """Into the table (the lock held); the consumers to offer it to, None when it is not newer."""
        self.received += 1
        table = self.latest[u.query]
        old = table.get(u.key)
        if old is not None and (
            old.final or old.version > u.version or (old.version == u.version and not u.final)
        ):
            self.ignored += 1
            return None
        table[u.key] = u
        if old is None:
            self._add_key(u.query, u.key)
        return [s for s in self.subs.values() if s.query == u.query]

    def ingest(self, u: L.LiveUpdate) -> bool:
        """One validated update from the topic; False when it is not newer than what is known."""
        if not self._valid(u):
            return False
        with self._lock:
            self._read_unread(u.query)  # what came before it first
            subs = self._apply(u)
        if subs is None:
            return False
        if not subs:  # no consumer of this query: the table is all there is to keep
            return True
        now = self.clock()
        upd = Update(u.window_start_us, tuple(u.group.values()), u, u.final, u.version)
        for s in subs:
            with s.lock:
                s.queue.offer(Update(**vars(upd)), now)
        return True

    def ingest_raw(self, key: bytes | None, value: bytes | None, query: str | None = None) -> bool:
        """One message of ``query``'s live topic (None: not known, read it now). Of a query nobody
        consumes it is kept unread (``unread``) until someone asks; True then (not read yet)."""
        if value is None:  # the job deleted a long-closed window's key (compaction marker): nothing to show
            self.tombstones += 1
            return False
        if query is not None and key is not None and query in self.unread:
            with self._lock:
                if not any(s.query == query for s in self.subs.values()):
                    self._hold(query, ((key, value),))
                    return True
        return self._ingest_now(key, value)

    def ingest_batch(self, query: str, records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
        """A poll's (key, value) records of ``query``'s live topic: what :meth:`ingest_raw` does to
        each, with the lock and the look for a consumer taken once and the values held in one go."""
        keyless = []
        with self._lock:
            watched = query not in self.unread or any(s.query == query for s in self.subs.values())
            if not watched:
                held: list[tuple[bytes, bytes]] = []
                for key, value in records:
                    if value is None:
                        self.tombstones += 1
                    elif key is None:
                        keyless.append((key, value))
                    else:
                        held.append((key, value))
                self._hold(query, held)
        for key, value in records if watched else keyless:  # a consumer is offered each update as it comes
            self.ingest_raw(key, value, query)

    def _hold(self, query: str, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Keep raw values of an unwatched query unread, the newest per key (the lock held). Which of two
        keys was replaced last does not matter: reading leaves the table with each key's newest value
        and the newest KEEP_WINDOWS windows, in any order. Bounded like the table: past the limit, the
        values of windows the table would drop go undecoded (:meth:`_drop_old_unread`)."""
        held = self.unread[query]
        before = len(held)
        held.update(records)
        self.coalesced += len(records) - (len(held) - before)  # replaced a value nobody read
        if len(held) >= self.unread_limit[query]:
            self._drop_old_unread(query)
            self.unread_limit[query] = max(MAX_UNREAD, 2 * len(held))

    def _drop_old_unread(self, query: str) -> None:
        """Drop the unread values of windows older than the newest KEEP_WINDOWS (of the table's and the
        unread ones), without decoding them: the table would drop them as soon as they were read. A key
        that does not parse is read now (it cannot match its value: refused and counted)."""
        held = self.unread[query]
        wins: dict[bytes, int] = {}
        bad = []
        for key in held:
            try:
                wins[key] = L.window_of_key(key)
            except ValueError:
                bad.append(key)
        for key in bad:
            self._read_one(query, key, held.pop(key))
        starts = sorted(set(wins.values()) | self.windows[query].keys(), reverse=True)
        if len(starts) <= KEEP_WINDOWS:
            return
        oldest_kept = starts[KEEP_WINDOWS - 1]
        old = [k for k, w in wins.items() if w < oldest_kept]
        for k in old:
            del held[k]
        self.coalesced += len(old)

    def _read_unread(self, query: str) -> None:
        """Validate and apply ``query``'s unread messages (the lock held), but for those of windows the
        table would drop at once. Nobody consumes the query while it has unread ones (a new consumer
        reads them first)."""
        if not self.unread[query]:
            return
        self._drop_old_unread(query)
        held = self.unread[query]
        self.unread[query] = {}
        self.unread_limit[query] = MAX_UNREAD
        for key, value in held.items():
            self._read_one(query, key, value)

    def _read_one(self, query: str, key: bytes, value: bytes) -> None:
        """Validate and apply one unread message of ``query``'s topic (the lock held)."""
        try:
            u = L.decode(key, value)
        except L.LiveFormatError as exc:
            self.rejected += 1
            self.last_error = str(exc)
            return
        if self._valid(u):
            if u.query != query:  # a message of another query on this topic: read it as sent
                self._read_unread(u.query)
            self._apply(u)

    def _ingest_now(self, key: bytes | None, value: bytes) -> bool:
        try:
            u = L.decode(key, value)
        except L.LiveFormatError as exc:
            self.rejected += 1
            self.last_error = str(exc)
            return False
        return self.ingest(u)

    def _add_key(self, query: str, key: tuple) -> None:
        """Index a new key by its window start, then drop the oldest windows beyond KEEP_WINDOWS."""
        wins, starts = self.windows[query], self.starts[query]
        keys = wins.get(key[0])
        if keys is None:
            keys = wins[key[0]] = set()
            heapq.heappush(starts, key[0])
        keys.add(key)
        table = self.latest[query]
        while len(wins) > KEEP_WINDOWS:
            for k in wins.pop(heapq.heappop(starts)):
                table.pop(k, None)

    def subscribe(self, query: str, policy: str, service_s: float, max_cells: int = 100_000) -> Subscription:
        """A new consumer of ``query``: its queue starts with the current values (window order)."""
        with self._lock:
            if len(self.subs) >= MAX_SUBSCRIBERS:
                raise OverflowError(f"{MAX_SUBSCRIBERS} live consumers already")
            sub = Subscription(next(self._ids), query, UpdateQueue(policy, service_s, max_cells=max_cells))
            self._read_unread(query)
            now = self.clock()
            for u in self._opening(query):
                sub.queue.offer(
                    Update(u.window_start_us, tuple(u.group.values()), u, u.final, u.version), now
                )
            self.subs[sub.id] = sub
        return sub

    def _opening(self, query: str) -> list[L.LiveUpdate]:
        """What a new consumer is offered first, in serving order: the newest window first, and in each
        window the largest values of the first aggregate first. Why: the queue serves at a bounded rate
        (20 updates/s for the page) and a window holds thousands of groups, so offering the oldest window
        first kept the panel on a closed window for minutes; a top-N view is right after N updates."""
        table, wins = self.latest[query], self.windows[query]
        vcols = self.columns[query][1]

        def larger_first(u: L.LiveUpdate) -> float:
            v = u.values.get(vcols[0]) if vcols else None
            return -v if isinstance(v, int | float) and v == v else float("inf")

        out: list[L.LiveUpdate] = []
        for start in sorted(wins, reverse=True):
            out += sorted((table[k] for k in wins[start] if k in table), key=larger_first)
        return out

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self.subs.pop(sub.id, None)

    def snapshot(self, query: str) -> list[dict[str, Any]]:
        with self._lock:
            self._read_unread(query)
            rows = sorted(self.latest[query].values(), key=lambda x: (x.window_start_us, x.key[1]))
        return [u.model_dump() for u in rows]

    def stats(self, read: bool = True) -> dict[str, Any]:
        """The reader's counts and every consumer's queue; ``read``: read what waits unread first (False
        for what is polled, /metrics and /status: a scrape every few seconds would decode every value the
        job republishes, the cost at rest that holding them unread saves; ``unread`` says how many wait)."""
        with self._lock:
            if read:
                for q in self.unread:
                    self._read_unread(q)
            subs = list(self.subs.values())
            base = {
                "coalesced": self.coalesced,
                "received": self.received,
                "ignored": self.ignored,
                "rejected": self.rejected,
                "last_error": self.last_error,
                "source_error": self.source_error,
                "tombstones": self.tombstones,
                "unread": sum(len(h) for h in self.unread.values()),
                "windows": {n: len(w) for n, w in self.windows.items()},
            }
        return {**base, "consumers": [s.stats() for s in subs]}


class KafkaLiveSource:
    """The reader thread: every live topic of the hub's queries, from a recent offset, into the hub.

    Its consumer is librdkafka's (``confluent-kafka``): records are parsed in C and a poll hands over up
    to POLL_MESSAGES at once. Why: kafka-python parsed each record in Python (~15 us each), which was
    most of the API's CPU with no client under the demo traffic (0.1 of a core for ~5K messages/s)."""

    def __init__(
        self,
        hub: LiveHub,
        bootstrap: str,
        consumer_config: dict[str, Any] | None = None,
        consumer: Any = None,
    ) -> None:
        self.hub, self.bootstrap = hub, bootstrap
        self.config = dict(consumer_config or {})  # librdkafka settings (KafkaSecurity.librdkafka)
        self.consumer = consumer
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lowwater-live-source", daemon=True)
        self.assigned: set[str] = set()
        self.start_offsets: dict[str, tuple[int, int]] = {}  # topic -> (where reading began, its end then)
        self.error_at = -ERROR_HOLD_S  # monotonic time of librdkafka's last error

    def start(self) -> None:
        collect_polls_young()
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout)

    def _on_error(self, err: Any) -> None:
        """librdkafka's errors come by callback (a refused login, a broker down): shown on /live."""
        self.error_at = time.monotonic()
        self.hub.source_error = f"{err} (check --live-bootstrap and --kafka-security)"

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "lowwater-api-live",  # required by librdkafka; partitions are assigned, never committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "client.id": "lowwater-api-live",
                "error_cb": self._on_error,
                **CONSUMER,
                **self.config,
            }
        )

    def _assign(self) -> None:
        from confluent_kafka import TopicPartition

        want = {L.live_topic(n) for n in self.hub.queries}
        meta = self.consumer.list_topics(timeout=BOOTSTRAP_TIMEOUT_MS / 1000)
        present = {t for t in want & set(meta.topics) if meta.topics[t].error is None}
        new = [
            TopicPartition(t, p)
            for t in sorted(present - self.assigned)
            for p in sorted(meta.topics[t].partitions)
        ]
        if new:
            self.consumer.incremental_assign(self._seek_recent(new))
            self.assigned |= {tp.topic for tp in new}

    def _seek_recent(self, tps: list[Any]) -> list[Any]:
        """Each new partition at its first message of the last :func:`lookback_ms` (by timestamp); a
        partition with none that recent at its newest QUIET_TOPIC_MESSAGES (the last run's values)."""
        from confluent_kafka import TopicPartition

        timeout = BOOTSTRAP_TIMEOUT_MS / 1000
        now_ms = int(time.time() * 1000)
        when = [
            TopicPartition(
                tp.topic,
                tp.partition,
                max(0, now_ms - lookback_ms(self.hub.queries[L.query_of_topic(tp.topic)])),
            )
            for tp in tps
        ]
        out = []
        for tp, got in zip(tps, self.consumer.offsets_for_times(when, timeout=timeout), strict=True):
            begin, end = self.consumer.get_watermark_offsets(tp, timeout=timeout)
            pos = got.offset if got.offset >= 0 else max(begin, end - QUIET_TOPIC_MESSAGES)
            out.append(TopicPartition(tp.topic, tp.partition, pos))
            self.start_offsets[tp.topic] = (pos, end)
        return out

    def poll_once(self, timeout_s: float) -> int:
        """One poll: its messages, per topic in order, into the hub; returns how many it took."""
        msgs = self.consumer.consume(num_messages=POLL_MESSAGES, timeout=timeout_s)
        by_topic: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
        for m in msgs:
            if m.error() is not None:  # a partition event or error, not a record: say so
                self._on_error(m.error())
                continue
            by_topic.setdefault(m.topic(), []).append((m.key(), m.value()))
        for topic, records in by_topic.items():
            self.hub.ingest_batch(L.query_of_topic(topic), records)
        return len(msgs)

    def _run(self) -> None:
        last_assign = 0.0
        while not self.stop_event.is_set():
            try:
                if self.consumer is None:
                    self.consumer = self._consumer()
                if time.monotonic() - last_assign > 5 or len(self.assigned) < len(self.hub.queries):
                    if time.monotonic() - last_assign > 1:
                        self._assign()
                        last_assign = time.monotonic()
                if not self.assigned:
                    self.stop_event.wait(0.5)
                    continue
                if self.poll_once(0.2) or time.monotonic() - self.error_at > ERROR_HOLD_S:
                    self.hub.source_error = ""  # reading (again), or no error for a while
            except Exception as exc:  # noqa: BLE001 - Kafka down: say so in /live, retry
                self.error_at = time.monotonic()
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
