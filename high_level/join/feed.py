"""Aggregate queries' closed windows as a join input (:mod:`contract.query.joins`): the job publishes them,
the join reads them exactly once.

:class:`FeedPublisher` runs on the driver, in the sink, after a batch's rows are in the store and its
partition statuses are folded: the batch's ``final`` rows of every aggregate query a join reads go to
its feed topic as select-row batches (``seq`` = micro-batch id << 20 | chunk), then one punctuation
whose mark is the start of the first window not closed on every Kafka partition of the query. A Kafka
error fails the batch (the join's input would otherwise miss rows silently): Spark replays it.

The punctuation carries the query's short windows of the batch (:func:`feed_losses`: rows not complete,
windows flagged, with their cause and records) as loss ranges at the window's start, the feed rows'
time: the join charges them to its output windows like any input's loss, so a join of an incomplete
window is incomplete too.

:class:`FeedDedup` is the join's half: a replayed batch republishes the same rows with the same ``seq``;
rows batches of a feed whose ``seq`` is not above the highest one applied are skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contract import query as Q
from contract import results as R
from contract import status as S
from contract import wire
from contract.query import joins as JI
from high_level.aggregate.packed import QueryWindows
from high_level.aggregate.rollup import Layout
from high_level.kafkaclients import KafkaClients

log = logging.getLogger("lowwater.job.feed")
CHUNK_ROWS = 20_000  # rows per Kafka message (LZ4-compressed, well under the broker's 1 MiB default)
CHUNK_BITS = 20
PRODUCER = {"acks": "all", "linger_ms": 5, "retries": 5}  # a join's input: every replica, or the batch fails


def feed_queries(cfg: Q.Config) -> list[Q.QuerySpec]:
    """The aggregate queries some join of ``cfg`` reads."""
    names = {n for j in cfg.joins for n in (j.left, j.right)}
    return [q for q in cfg.queries if q.name in names]


def feed_rows(lay: Layout, w: QueryWindows) -> np.ndarray:
    """int64[n, 1 + kw + na]: the final rows of one query's batch as feed rows (window start, key, state)."""
    sel = np.flatnonzero(w.final)
    if not len(sel):
        return np.empty((0, 1 + lay.kw + lay.na), np.int64)
    start = lay.window_start_ns(w.window[sel])
    return np.column_stack([start, w.key[sel], w.state[sel]]).astype(np.int64)


def feed_mark(lay: Layout, partitions: int, statuses: Mapping[int, S.PartitionStatus]) -> int | None:
    """The feed's mark: start of the first window not closed on every partition (None: one never closed).
    When every partition's hosts finished (end-of-stream marks: a replayed capture), the end of stream, so
    the join closes its last windows too (as it does when its select inputs end)."""
    if len(statuses) >= partitions and all(
        (statuses[p].low_water_mark_pane or 0) >= wire.END_OF_STREAM
        for p in range(partitions)
        if p in statuses
    ):
        return wire.END_OF_STREAM
    closed = [statuses[p].closed_before_window if p in statuses else None for p in range(partitions)]
    if any(c is None for c in closed):
        return None
    return int(lay.window_start_ns(np.array([min(closed)]))[0])  # type: ignore[type-var]


_TO_WIRE = {v: k for k, v in R.WIRE_CAUSES.items()}  # a flagged window's cause -> its wire name


def feed_losses(
    lay: Layout, w: QueryWindows | None, flagged: Sequence[tuple[int, list[Any]]] = ()
) -> tuple[tuple[int, int, str, int], ...]:
    """The short windows of one query's batch as feed loss ranges ``(start, start, cause, records)``: every
    flagged window (``_incomplete``: its cause and records), and every final row not complete for a reason
    no flag names (a gap of unknown start: ``gap``; late partials: ``job_late``; hosts not in its mark:
    ``timeout``). Records are at least 1: a short window is never charged nothing."""
    out: dict[tuple[int, str], int] = {}
    for _, f in flagged:
        key = (int(f[0]), _TO_WIRE.get(str(f[6]), "gap"))
        out[key] = out.get(key, 0) + max(1, int(f[4]))
    flagged_at = {s for s, _ in out}
    if w is not None and len(w.window):
        hosts_in, late, missing = (w.comp[:, i] for i in range(3))
        short = w.final & ((hosts_in < w.hosts_expected) | (late > 0) | (missing > 0))
        for i in np.flatnonzero(short):
            start = int(lay.window_start_ns(w.window[i : i + 1])[0])
            if start in flagged_at:
                continue
            for cause, n in (
                ("gap", int(missing[i])),
                ("job_late", int(late[i])),
                ("timeout", int(w.hosts_expected[i]) - int(hosts_in[i])),
            ):
                if n > 0:
                    out[(start, cause)] = max(out.get((start, cause), 0), n)
    return tuple((s, s, c, n) for (s, c), n in sorted(out.items()))


class FeedPublisher:
    """Publishes the closed windows of the aggregate queries that joins read (one producer, the driver)."""

    def __init__(
        self, queries: Sequence[Q.QuerySpec], kafka: KafkaClients | None = None, producer: Any = None
    ) -> None:
        self.queries = {q.name: q for q in queries}
        self.layouts = {q.name: Layout.of(q) for q in queries}
        if producer is None and self.queries:
            assert kafka is not None, "a producer or the Kafka clients to build one"
            producer = kafka.producer(**PRODUCER)
        self.producer = producer
        self.published = {n: 0 for n in self.queries}
        # late 'correction' rows of a fed query (--late-policy correction): stored, never published (the
        # join's frontier passed their window; its rows stay those of the final row). Counted and logged once
        # per query, so a join that differs from the corrected store says why.
        self.corrections_not_joined = {n: 0 for n in self.queries}

    def messages(
        self,
        batch_id: int,
        wins: Mapping[str, QueryWindows],
        partitions: Mapping[str, Mapping[int, S.PartitionStatus]],
        now_ms: int,
        flagged: Mapping[str, Sequence[tuple[int, list[Any]]]] | None = None,
    ) -> list[tuple[str, bytes]]:
        """(topic, value) of one batch: each feed's rows, then its punctuation with the batch's short
        windows (``flagged``: the batch's ``_incomplete`` windows by query; pure, tested without Kafka)."""
        out = []
        for name, q in sorted(self.queries.items()):
            lay, topic = self.layouts[name], JI.closed_topic(q)
            rows = feed_rows(lay, wins[name]) if name in wins else np.empty((0, 1))
            late = int(np.count_nonzero(wins[name].correction)) if name in wins else 0
            if late:
                if not self.corrections_not_joined[name]:
                    log.warning(
                        "query %r: late corrections of closed windows do not reach the joins that read it "
                        "(they joined its final rows; the corrections are in its own stored rows)",
                        name,
                    )
                self.corrections_not_joined[name] += late
            for c, a in enumerate(range(0, len(rows), CHUNK_ROWS)):
                out.append(
                    (
                        topic,
                        wire.encode_rows(
                            name, JI.FEED_HOST, 0, 0, (batch_id << CHUNK_BITS) | c, rows[a : a + CHUNK_ROWS]
                        ),
                    )
                )
                self.published[name] += min(CHUNK_ROWS, len(rows) - a)
            mark = feed_mark(lay, q.kafka.partitions, partitions.get(name, {}))
            losses = feed_losses(lay, wins.get(name), (flagged or {}).get(name, ()))
            if mark is None and losses:
                mark = 0  # no window closed everywhere yet: a mark that passes nothing, to carry the losses
            if mark is not None:
                out.append(
                    (
                        topic,
                        wire.encode_punctuation(
                            wire.Punctuation(
                                name,
                                JI.FEED_HOST,
                                0,
                                0,
                                batch_id << CHUNK_BITS,
                                mark,
                                mark,
                                now_ms * 1_000_000,
                                losses=losses,
                            )
                        ),
                    )
                )
        return out

    def publish(
        self,
        batch_id: int,
        wins: Mapping[str, QueryWindows],
        partitions: Mapping[str, Mapping[int, S.PartitionStatus]],
        now_ms: int | None = None,
        flagged: Mapping[str, Sequence[tuple[int, list[Any]]]] | None = None,
    ) -> int:
        """Send one batch's feed messages and wait for the broker; raises on any Kafka error."""
        msgs = self.messages(
            batch_id, wins, partitions, int(time.time() * 1000) if now_ms is None else now_ms, flagged
        )
        futures = [self.producer.send(topic, value=v, partition=0) for topic, v in msgs]
        self.producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=30)  # a failed send raises here: the batch fails and is replayed
        return len(msgs)

    def close(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=5)
            except Exception:  # noqa: BLE001
                pass


class FeedDedup:
    """Per feed query: the highest rows-batch ``seq`` applied; replays (not above it) are skipped."""

    def __init__(self, feeds: Sequence[str], fed: Mapping[str, int] | None = None) -> None:
        self.feeds = frozenset(feeds)
        self.fed: dict[str, int] = dict(fed or {})
        self.skipped = 0

    def filter(self, values: list[bytes]) -> list[bytes]:
        """The messages to apply, in order (a feed's rows batch at most once; everything else as it is)."""
        if not self.feeds:
            return values
        out = []
        for v in values:
            try:
                kind, query, _, seq = wire.peek(v)
            except wire.WireError:
                out.append(v)  # decode reports it
                continue
            if query in self.feeds and kind in (wire.KIND_ROWS, wire.KIND_ROWS_LZ4):
                if seq <= self.fed.get(query, -1):
                    self.skipped += 1
                    continue
                self.fed[query] = seq
            out.append(v)
        return out
