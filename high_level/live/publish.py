"""The job's half of the live seam (:mod:`contract.live`): each micro-batch's provisional values of open
windows and final values of closed ones to the query's compacted live topic.

Runs where the batch's result files are written, after them: in each Spark task for the queries the
tasks write (:mod:`high_level.results.tasks`, so no row reaches the driver), on the driver for the rest.
A task's finals reach Kafka before the driver commits the batch (a commit's length earlier); a kill in
between replays the batch, which republishes the same values with the same version, and the reader
keeps one value per key and ignores a version it has (``high_level.live.hub``). Once KEEP_CLOSED newer
windows of a query have closed (in that task, for a task), the keys of an older closed window get a
tombstone (a null value), so compaction removes them and the topic stays the size of the last few
windows, not of every (window, group) of the retention period. A task keeps those keys in files beside
the store (:func:`contract.results.live_keys_dir`): its Python worker is not sure to outlive the batch.
Best effort: a Kafka error is logged and counted, the batch (and the exact results) go on.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contract import live as L
from contract import query as Q
from contract import results as R
from contract.live import window_of_key
from high_level.aggregate.packed import QueryWindows
from high_level.aggregate.rollup import Layout
from high_level.kafkaclients import KafkaClients
from high_level.results.store import typed_columns

log = logging.getLogger("lowwater.live")
LIVE_KINDS = (L.PROVISIONAL_KIND,)
# best effort: the store is the exact copy; a broker that is away costs a batch 10 s, not a minute
PRODUCER = {"linger_ms": 5, "acks": 1, "max_block_ms": 10_000}
KEEP_CLOSED = 3  # closed windows per query whose finals stay on the topic (the API shows the newest 3)


def split_provisional(packed: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(the packed rows of kind 'provisional', every other packed row)."""
    is_prov = pc.fill_null(pc.equal(packed["kind"], L.PROVISIONAL_KIND), False)
    return packed.filter(is_prov), packed.filter(pc.invert(is_prov))


def live_messages(
    q: Q.QuerySpec, lay: Layout, w: QueryWindows, final: bool, batch_id: int
) -> list[tuple[bytes, bytes]]:
    """(key, value) messages of :mod:`contract.live` for one query's rows (all of them, or its finals)."""
    sel = np.flatnonzero(w.final) if final else np.arange(len(w.window))
    if not len(sel):
        return []
    end_ns = lay.window_end_ns(w.window[sel])
    kind = pa.array(["final" if final else L.PROVISIONAL_KIND] * len(sel))
    typed = typed_columns(
        q,
        end_ns - lay.range_ns,
        end_ns,
        w.key[sel],
        w.state[sel],
        w.closed_at_ms[sel],
        w.hosts[sel],
        kind,
        w.hosts_expected[sel],
        w.comp[sel],
    )
    gnames = [n for n, _ in R.key_columns(q)]
    vnames = [n for n, _ in R.aggregate_columns(q)]
    gcols = [typed[n].to_pylist() for n in gnames]
    vcols = [typed[n].to_pylist() for n in vnames]
    # read back from the typed table: a holistic query's second stage reduces its sub-key rows, so the
    # typed rows are not the input rows one for one
    n = typed.num_rows
    complete = typed["complete"].to_pylist() if final else [False] * n
    starts = typed["window_start"].cast(pa.int64()).to_pylist()
    ends = typed["window_end"].cast(pa.int64()).to_pylist()
    at = (np.asarray(typed["closed_at"].cast(pa.int64()).to_numpy()) // 1000).tolist()
    in_mark = typed["hosts_in_mark"].to_pylist()
    expected = typed["hosts_expected"].to_pylist()
    out = []
    for i in range(n):
        group = [c[i] for c in gcols]
        values = {
            n: (None if isinstance(c[i], float) and math.isnan(c[i]) else c[i])
            for n, c in zip(vnames, vcols, strict=True)
        }
        doc = {
            "v": 1,
            "query": q.name,
            "window_start_us": starts[i],
            "window_end_us": ends[i],
            "group": dict(zip(gnames, group, strict=True)),
            "values": values,
            "final": final,
            "version": int(batch_id),
            "published_ms": int(at[i]),
            "hosts_in_mark": int(in_mark[i]),
            "hosts_expected": int(expected[i]),
            "complete": bool(complete[i]),
        }
        key = json.dumps([starts[i], group], separators=(",", ":")).encode()
        out.append((key, json.dumps(doc, separators=(",", ":")).encode()))
    return out


class LivePublisher:
    """Publishes live values to ``lowwater.live.<query>`` (one producer on the driver)."""

    def __init__(
        self,
        queries: Sequence[Q.QuerySpec],
        kafka: KafkaClients | None = None,
        producer: Any = None,
        keys_dir: Callable[[str], Path] | None = None,
        shared: bool = False,
    ) -> None:
        self.queries = {q.name: q for q in queries}
        self.layouts = {q.name: Layout.of(q) for q in queries}
        self.kafka = kafka
        # built at the first message, inside publish's error handling (a job whose tasks publish needs
        # none); ``shared``: the process's producer for these clients (a task's, :func:`task_producer`)
        self._producer = producer
        self.shared = shared
        assert producer is not None or kafka is not None, "a producer or the Kafka clients to build one"
        self.published: dict[str, dict[str, int]] = {n: {"provisional": 0, "final": 0} for n in self.queries}
        self.errors = 0
        self.tombstoned: dict[str, int] = {n: 0 for n in self.queries}
        # per query: window start -> keys of its finals, until KEEP_CLOSED newer windows closed
        self.closed_keys: dict[str, HeldKeys] = {
            n: HeldKeys(keys_dir(n) if keys_dir is not None else None) for n in self.queries
        }

    @property
    def producer(self) -> Any:
        if self._producer is None:
            assert self.kafka is not None
            self._producer = task_producer(self.kafka) if self.shared else self.kafka.producer(**PRODUCER)
        return self._producer

    def counts(self) -> dict[str, Any]:
        """What was sent (a task's summary for the driver's counters, :meth:`take`)."""
        return {"published": self.published, "tombstoned": self.tombstoned, "errors": self.errors}

    def take(self, counts: Mapping[str, Any]) -> None:
        """Add a task's :meth:`counts` to this publisher's."""
        for name, by in counts["published"].items():
            for kind, n in by.items():
                self.published.setdefault(name, {"provisional": 0, "final": 0})[kind] += n
        for name, n in counts["tombstoned"].items():
            self.tombstoned[name] = self.tombstoned.get(name, 0) + n
        self.errors += counts["errors"]

    def publish(
        self, batch_id: int, provisional: Mapping[str, QueryWindows], closed: Mapping[str, QueryWindows]
    ) -> int:
        """Send one batch's provisional values and final values; returns the messages sent."""
        n = 0
        try:
            for name in sorted(set(provisional) | set(closed)):
                q, lay = self.queries.get(name), self.layouts.get(name)
                if q is None:
                    continue
                topic = L.live_topic(name)
                for final, src in ((False, provisional), (True, closed)):
                    if name not in src:
                        continue
                    msgs = live_messages(q, lay, src[name], final, batch_id)
                    for key, value in msgs:
                        self.producer.send(topic, key=key, value=value)
                    self.published[name]["final" if final else "provisional"] += len(msgs)
                    n += len(msgs)
                    if final:
                        n += self._tombstone(name, topic, msgs)
            if n:
                self.producer.flush(timeout=10)
        except Exception as exc:  # noqa: BLE001 - live values are best effort, the store is exact
            self.errors += 1
            log.warning("live publish of batch %d failed: %s", batch_id, exc)
        return n

    def _tombstone(self, name: str, topic: str, finals: list[tuple[bytes, bytes]]) -> int:
        """Remember the finals' keys per window; delete (null value) those of windows older than the
        newest KEEP_CLOSED closed ones. Returns the tombstones sent."""
        held = self.closed_keys[name]
        by_window: dict[int, list[bytes]] = {}
        for key, _ in finals:
            by_window.setdefault(window_of_key(key), []).append(key)
        for start, keys in by_window.items():
            held.add(start, keys)
        n = 0
        starts = held.starts()
        for start in starts[: max(0, len(starts) - KEEP_CLOSED)]:
            for key in held.pop(start):
                self.producer.send(topic, key=key, value=None)
                n += 1
        self.tombstoned[name] += n
        return n

    def close(self) -> None:
        if self._producer is None or self.shared:
            return
        try:
            self._producer.close(timeout=5)
        except Exception:  # noqa: BLE001
            pass


class HeldKeys:
    """The keys of one query's closed windows, per window start, until their tombstones: in memory (the
    driver's publisher lives as long as the job) or, with ``folder``, one file per window (a task's)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.mem: dict[int, list[bytes]] = {}

    def add(self, start: int, keys: list[bytes]) -> None:
        if self.folder is None:
            self.mem.setdefault(start, []).extend(keys)
            return
        path = self.folder / f"{start}.keys"
        old = path.read_bytes().split(b"\n") if path.exists() else []  # another partition closed it too
        new = list(dict.fromkeys([k for k in old if k] + keys))  # a replayed batch adds the same keys
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"\n".join(new))
        os.replace(tmp, path)

    def starts(self) -> list[int]:
        """The window starts held, oldest first."""
        if self.folder is None:
            return sorted(self.mem)
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(int(n[: -len(".keys")]) for n in names if n.endswith(".keys"))

    def pop(self, start: int) -> list[bytes]:
        if self.folder is None:
            return self.mem.pop(start, [])
        path = self.folder / f"{start}.keys"
        try:
            keys = [k for k in path.read_bytes().split(b"\n") if k]
        except FileNotFoundError:
            return []
        path.unlink(missing_ok=True)
        return keys


_TASK_PRODUCERS: dict[str, Any] = {}  # per Python worker: one producer per cluster (reused by its tasks)


def task_producer(kafka: KafkaClients) -> Any:
    """A Spark task's producer of live values: one per Python worker process, kept across its tasks
    (building one costs a metadata round trip, per batch and task otherwise)."""
    key = json.dumps([kafka.bootstrap, kafka.security.kafka_python()], sort_keys=True, default=str)
    if key not in _TASK_PRODUCERS:
        _TASK_PRODUCERS[key] = kafka.producer(**PRODUCER)
    return _TASK_PRODUCERS[key]


def ensure_live_topics(admin: Any, queries: Sequence[Q.QuerySpec], replication: int = 1) -> dict[str, str]:
    """Create the queries' compacted live topics that are missing (idempotent); topic -> action."""
    from kafka.admin import NewTopic

    want = [L.live_topic(q.name) for q in queries]
    have = set(admin.list_topics())
    new = [
        NewTopic(t, L.TOPIC_PARTITIONS, replication, topic_configs=dict(L.TOPIC_CONFIG))
        for t in want
        if t not in have
    ]
    if new:
        admin.create_topics(new, timeout_ms=30_000)
    out = {t: ("created (compacted)" if t not in have else "exists") for t in want}
    old = [t for t in want if t in have]
    if old:  # topics of an earlier release: its config (compaction only, kept for ever) becomes this one
        from kafka.admin import ConfigResource, ConfigResourceType

        try:
            admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t, configs=dict(L.TOPIC_CONFIG)) for t in old]
            )
            out.update({t: "exists (config updated)" for t in old})
        except Exception as exc:  # noqa: BLE001 - no AlterConfigs right: the topic works, only grows
            log.warning("live topics %s keep their config (%s): set %s on them", old, exc, L.TOPIC_CONFIG)
    return out
