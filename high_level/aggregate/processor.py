"""One Kafka partition's high-level processor: decode batches, merge partials, meld punctuation, close.

This is the body of the Spark stateful step, kept free of Spark so it can be tested directly and
replayed offline. Everything it decides depends only on (its saved state, the messages in offset
order, ``now_ms``), and Spark supplies ``now_ms`` from the batch timestamp recorded in the offset
log, so a replayed micro-batch produces byte-identical output (exactly-once with an idempotent sink).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from contract import results as R
from contract import wire
from contract.live import PROVISIONAL_KIND
from contract.status import PartitionStatus
from high_level import codec
from high_level.aggregate.adaptwid import StrategyRollup
from high_level.aggregate.chunks import ChunkedRollup, ChunkStore
from high_level.aggregate.meld import Meld
from high_level.aggregate.packed import COMPLETENESS, INCOMPLETE_KIND, OUTPUT_COLUMNS, Part, pack_parts
from high_level.aggregate.rollup import I64, Layout, QueryRollup, Windows

LATE_POLICIES = ("drop", "correction")
STATE_ZMAGIC = b"LWPZ"  # the processor's saved bytes, zstd-compressed (state of earlier builds: uncompressed)
MAX_INCARNATIONS = 4  # per host: record counters kept for the newest few incarnations

NO_MARK = -(2**62)  # the "previous mark" of a host's first punctuation: any pane may have lost records


@dataclass(frozen=True)
class Settings:
    """Job-level settings the processor needs (same on every worker)."""

    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    max_gap_ms: int | None = None
    live: bool = False  # emit 'provisional' rows of the open windows a batch changed (contract/live.py)

    def __post_init__(self) -> None:
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}, got {self.late_policy!r}")


def gap_records(lay: Layout, gaps: Sequence[Sequence[Any]], window: np.ndarray) -> np.ndarray:
    """int64[n]: the records of every gap or loss range ``[first pane, last pane, records, ...]`` that
    overlaps each window (a range's records count in every window it overlaps: its keys are unknown)."""
    w = np.asarray(window, I64)
    if not gaps:
        return np.zeros(len(w), I64)
    g = np.array([x[:3] for x in gaps], I64)
    first = w - lay.k + 1
    hit = (g[None, :, 0] <= w[:, None]) & (g[None, :, 1] >= first[:, None])
    return hit.astype(I64) @ g[:, 2]


def flag_windows(
    lay: Layout,
    gaps: Sequence[Sequence[Any]],
    before: int | None,
    after: int | None,
    new_from: int,
    now_ms: int,
) -> list[list[Any]]:
    """The short windows to flag (contract.results.INCOMPLETE_SCHEMA), one per (window, range): every
    window closed between ``before`` and ``after`` that a range ``[first pane, last pane, records, host,
    cause]`` overlaps, and every earlier-closed window that a range learned now (``gaps[new_from:]``)
    overlaps (``after_close``). A range of unknown start (``NO_MARK``) flags only the rows. Each list is
    ``[window_start_ns, window_end_ns, first_pane_start_ns, last_pane_end_ns, records, host, cause,
    after_close, now_ms]``, in (window, range) order: deterministic, so a replayed batch flags the same."""
    if after is None or not gaps:
        return []
    out = []
    for i, (lo, hi, n, host, cause) in enumerate(gaps):
        if lo <= NO_MARK:
            continue
        first = lo if i >= new_from or before is None else max(lo, before)
        last = min(hi + lay.k - 1, after - 1)  # windows [lo, hi + k - 1] hold a pane of [lo, hi]
        if last < first:
            continue
        w = np.arange(first, last + 1, dtype=I64)
        w = w[(w - lay.k + 1) % lay.s == 0]
        ends = lay.window_end_ns(w)
        p_lo = np.maximum(w - lay.k + 1, lo)  # the window's own panes within the range
        p_hi = np.minimum(w, hi)
        for j in range(len(w)):
            out.append(
                [
                    int(ends[j] - lay.range_ns),
                    int(ends[j]),
                    lay.origin_ns + int(p_lo[j]) * lay.pane_ns,
                    lay.origin_ns + (int(p_hi[j]) + 1) * lay.pane_ns,
                    int(n),
                    host,
                    cause,
                    before is not None and int(w[j]) < before,
                    now_ms,
                ]
            )
    out.sort(key=lambda r: (r[0], r[2], r[5], r[6]))
    return out


class _QueryState:
    """Roll-up + meld + counters of one query on one partition."""

    def __init__(self, layout: Layout, settings: Settings, store: ChunkStore | None = None) -> None:
        self.layout = layout
        self.rollup = QueryRollup(layout) if store is None else ChunkedRollup(layout, store)
        if store is None and layout.strategy != "lazy":  # window.strategy eager/adaptive (blob state only)
            self.rollup = StrategyRollup(layout)
        # an expected host that does not run this query (its `sources`) would hold it open forever
        expected = [h for h in settings.expected_hosts if layout.runs_on(h)]
        self.meld = Meld(settings.host_timeout_ms, expected, settings.max_gap_ms)
        # host -> {"late": n, "records": n, "inc": {str(incarnation): [received, sent, missing, lead]}}, lead:
        # the most panes a partial of the host was ahead of its mark (a gap's records may be that far ahead)
        self.hosts: dict[str, dict[str, Any]] = {}
        self.windows_closed = 0
        self.records = 0
        # [first pane, last pane, records, host, cause]: sequence gaps seen at a punctuation and pane
        # ranges a host shed (cause in contract.results.INCOMPLETE_CAUSES), kept until every window
        # they overlap has closed (the records a host sends between two punctuations with marks P
        # and M belong to panes >= P; the gap is attributed to the windows overlapping [P, M])
        self.gaps: list[list[Any]] = []

    def completeness(self, window: np.ndarray, late: np.ndarray | None = None) -> tuple[int, np.ndarray]:
        """(hosts the partition knows, int64[n, 3] COMPLETENESS) of window rows, decided now.

        A known host is in a window's mark when its latest mark passed the window's end (``mark >
        w``): live or not, it promised nothing more for the window. Expected hosts never heard are known
        and in no mark. Why per window and not "live at close": a host that died after its mark passed
        a window has sent everything of that window, one that died before has not.
        """
        meld = self.meld
        known = set(meld.hosts) | set(meld.expected_ids()) | set(self.hosts)
        marks = np.sort(np.array([meld.hosts[h].mark_pane for h in known if h in meld.hosts], I64))
        w = np.asarray(window, I64)
        comp = np.zeros((len(w), len(COMPLETENESS)), I64)
        comp[:, 0] = len(marks) - np.searchsorted(marks, w, side="right")
        if late is not None:
            comp[:, 1] = late
        comp[:, 2] = gap_records(self.layout, self.gaps, w)
        return len(known), comp

    def incomplete_windows(self, before: int | None, new_from: int, now_ms: int) -> list[list[Any]]:
        """The short windows to flag in this batch (contract.results.INCOMPLETE_SCHEMA), one per (window,
        gap): every window closed by this batch that a known gap overlaps, and every earlier-closed
        window that a gap learned in this batch (``self.gaps[new_from:]``) overlaps (``after_close``).

        Why: a window whose every record was shed or lost has no row to carry ``missing_records``. A
        gap of unknown start (``NO_MARK``) flags only the rows. Each list is ``[window_start_ns,
        window_end_ns, first_pane_start_ns, last_pane_end_ns, records, host, cause, after_close,
        now_ms]``, in (window, gap) order: deterministic, so a replayed batch flags the same.
        """
        return flag_windows(self.layout, self.gaps, before, self.rollup.closed, new_from, now_ms)

    def timeout_windows(self, before: int | None, closed: Windows, now_ms: int) -> list[list[Any]]:
        """Flag every window this batch closed without a known host's mark past it (the host timed out,
        or an expected one never came), per such host, cause ``timeout``, records 0 (unknown): a
        window whose every record would have come from that host has no row to say so."""
        after, lay, meld = self.rollup.closed, self.layout, self.meld
        if after is None:
            return []
        if (
            after >= wire.END_OF_STREAM - lay.k
        ):  # closed to the end of stream: up to the last window with rows
            after = int(closed.window.max()) + 1 if len(closed) else (before if before is not None else 0)
        if before is not None:
            w = np.arange(max(before, after - 4096), after, dtype=I64)  # bounded: a long-dead host's backlog
        else:
            w = np.unique(closed.window) if len(closed) else np.zeros(0, I64)
        w = w[(w - lay.k + 1) % lay.s == 0]
        if not len(w):
            return []
        known = set(meld.hosts) | set(meld.expected_ids()) | set(self.hosts)
        out = []
        ends = lay.window_end_ns(w)
        for h in sorted(known):
            hm = meld.hosts.get(h)
            short = w if hm is None else w[hm.mark_pane <= w]
            for j in np.searchsorted(w, short).tolist():
                out.append(
                    [
                        int(ends[j] - lay.range_ns),
                        int(ends[j]),
                        int(ends[j] - lay.range_ns),
                        int(ends[j]),
                        0,
                        h,
                        "timeout",
                        False,
                        now_ms,
                    ]
                )
        return out

    def shed_through(self) -> int | None:
        """The newest pane a host reported shed (an end-of-stream close must reach its windows too)."""
        return max((int(g[1]) for g in self.gaps if g[4] == "shed"), default=None)

    def purge_gaps(self) -> None:
        """Forget gaps that no window still to close overlaps (state stays bounded)."""
        closed = self.rollup.closed
        if closed is not None and self.gaps:
            first_open = self.layout.first_needed_pane(closed)
            self.gaps = [g for g in self.gaps if g[1] >= first_open]

    def host(self, name: str) -> dict[str, Any]:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = {"late": 0, "records": 0, "inc": {}}
        return h

    def incarnation(self, name: str, inc: int) -> list[int]:
        incs = self.host(name)["inc"]
        key = str(inc)
        if key in incs and len(incs[key]) < 4:  # state of an earlier build: no lead yet
            incs[key].append(0)
        if key not in incs:
            incs[key] = [0, 0, 0, 0]
            if len(incs) > MAX_INCARNATIONS:
                for old in sorted(incs, key=int)[: len(incs) - MAX_INCARNATIONS]:
                    del incs[old]
        return incs[key]


class PartitionProcessor:
    """The state and logic for one (topic, Kafka partition): bytes in, closed windows out.

    With a ``store`` (:mod:`high_level.aggregate.chunks`) the pane tables live there as per-batch chunks and
    :meth:`to_bytes` holds only the small part (marks, counters, frontier, pane index); without, the
    whole state is in :meth:`to_bytes` (the blob state).
    """

    def __init__(
        self, layouts: Sequence[Layout], partition: int, settings: Settings, store: ChunkStore | None = None
    ) -> None:
        self.partition = int(partition)
        self.settings = settings
        self.layouts = {lay.name: lay for lay in layouts}
        self.queries: dict[str, _QueryState] = {
            n: _QueryState(lay, settings, store) for n, lay in self.layouts.items()
        }
        self.errors = {"bad_messages": 0, "unknown_query": 0, "misrouted": 0, "bad_layout": 0}
        self.last_error = ""

    # -- state bytes ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        meta: dict[str, Any] = {
            "partition": self.partition,
            "errors": self.errors,
            "last_error": self.last_error,
            "queries": {},
        }
        arrays: dict[str, np.ndarray] = {}
        for name, qs in self.queries.items():
            r = qs.rollup
            meta["queries"][name] = {
                "closed": r.closed,
                "meld": qs.meld.to_dict(),
                "hosts": qs.hosts,
                "windows_closed": qs.windows_closed,
                "records": qs.records,
                "gaps": qs.gaps,
            }
            if isinstance(r, ChunkedRollup):
                meta["queries"][name]["chunks"] = r.index_dict()
            arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"] = r.pane, r.key, r.state
            arrays.update(r.run_arrays(name))  # differential windows' running sums (blob state)
            arrays.update(r.group_arrays(name))  # group-wise punctuation's frontiers (blob state)
        return codec.compress(codec.pack(meta, arrays), STATE_ZMAGIC)

    @classmethod
    def from_bytes(
        cls, buf: bytes, layouts: Sequence[Layout], settings: Settings, store: ChunkStore | None = None
    ) -> PartitionProcessor:
        meta, arrays = codec.unpack(codec.decompress(buf, STATE_ZMAGIC))
        p = cls(layouts, meta["partition"], settings, store)
        p.errors.update(meta.get("errors", {}))
        p.last_error = meta.get("last_error", "")
        for name, qm in meta["queries"].items():
            qs = p.queries.get(name)
            if qs is None:  # query removed from the config: its state is dropped
                continue
            lay = qs.layout
            pane, key, state = arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"]
            if key.shape[1:] != (lay.kw,) or state.shape[1:] != (lay.na,):
                raise codec.CodecError(f"query {name!r} changed its key/state layout; use a new checkpoint")
            if ("chunks" in qm) != isinstance(qs.rollup, ChunkedRollup):
                raise codec.CodecError(
                    "state saved by the other state layout (blob/chunked); use a new checkpoint"
                )
            qs.rollup.pane, qs.rollup.key, qs.rollup.state = pane, key, state
            qs.rollup.load_run(arrays, name)
            qs.rollup.load_groups(arrays, name)
            if isinstance(qs.rollup, ChunkedRollup):
                qs.rollup.load_index(qm["chunks"])
            closed = qm["closed"]
            if closed is not None and closed > wire.END_OF_STREAM - lay.k and not len(qs.rollup):
                closed = None  # a frontier at end of stream (saved before it stopped at the data): reopen
            qs.rollup.closed = closed
            qs.meld.load_dict(qm["meld"])
            qs.hosts = qm["hosts"]
            qs.windows_closed = qm.get("windows_closed", 0)
            qs.records = qm.get("records", 0)
            qs.gaps = [
                [int(g[0]), int(g[1]), int(g[2]), *(g[3:5] if len(g) >= 5 else ("", "gap"))]
                for g in qm.get("gaps", [])
            ]
        return p

    # -- processing -----------------------------------------------------------------------------
    def _process(self, values: Iterable[bytes], now_ms: int) -> list[Part]:
        """One micro-batch -> output parts (corrections, finals, status per query)."""
        for qs in self.queries.values():
            qs.meld.advance(now_ms)
        pending: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {
            n: [] for n in self.queries
        }
        batch = {n: {"messages": 0, "records": 0, "punctuations": 0} for n in self.queries}
        known_gaps = {n: len(qs.gaps) for n, qs in self.queries.items()}  # what is learned later is new
        for value in values:
            try:
                b = wire.decode(value)
            except wire.WireError as exc:
                self.errors["bad_messages"] += 1
                self.last_error = str(exc)
                continue
            qs = self.queries.get(b.query)
            if qs is None:
                self.errors["unknown_query"] += 1
                self.last_error = f"unknown query {b.query!r}"
                continue
            if b.partition != self.partition:
                self.errors["misrouted"] += 1
            bq = batch[b.query]
            bq["messages"] += 1
            inc = qs.incarnation(b.host, b.incarnation)
            if isinstance(b, wire.Partials):
                if b.key.shape[1] != qs.layout.kw or b.state.shape[1] != qs.layout.na:
                    self.errors["bad_layout"] += 1
                    self.last_error = (
                        f"{b.query}: key/state width {b.key.shape[1]}/{b.state.shape[1]} from {b.host}"
                    )
                    continue
                pending[b.query].append((b.host, b.pane, b.key, b.state))
                inc[0] += b.n
                prev = qs.meld.hosts.get(b.host)
                if prev is not None and b.n and prev.mark_pane < wire.END_OF_STREAM:
                    inc[3] = max(inc[3], int(b.pane.max()) - int(prev.mark_pane))
                qs.host(b.host)["records"] += b.n
                bq["records"] += b.n
            elif isinstance(b, wire.GroupPunctuation):  # closed with the batch (rollup.close) or counted
                qs.rollup.offer_groups(b, self.errors)
            else:
                inc[1] = int(b.seq)
                missing = max(0, int(b.seq) - inc[0])
                prev = qs.meld.hosts.get(b.host)
                shed_now = sum(int(r[2]) for r in b.shed)  # in seq too; attributed to their panes below
                if missing > inc[2] + shed_now:  # records sent since the previous punctuation never came
                    since = (
                        prev.mark_pane if prev is not None and prev.incarnation == b.incarnation else NO_MARK
                    )
                    # records sent before this mark belong to panes from the previous mark up to the newest
                    # pane the host had sent (wire sent_upto, a bound); an older host does not say it: its
                    # clock then may lead the mark (open panes evicted early) by the lead seen so far
                    if b.sent_upto is not None:
                        upto = max(b.sent_upto, since)
                    elif b.mark_pane >= wire.END_OF_STREAM:
                        upto = b.mark_pane
                    else:
                        upto = b.mark_pane + max(inc[3], 0)
                    qs.gaps.append([int(since), int(upto), missing - inc[2] - shed_now, b.host, "gap"])
                inc[2] = missing
                if prev is not None and prev.incarnation != b.incarnation:
                    # the agent restarted: what its old incarnation held unflushed (panes from its last
                    # mark on) is lost; report the range of windows that may be incomplete
                    h = qs.host(b.host)
                    h["restarts"] = h.get("restarts", 0) + 1
                    h["last_restart"] = {
                        "old_incarnation": prev.incarnation,
                        "new_incarnation": b.incarnation,
                        "incomplete_from_pane": prev.mark_pane,
                        "new_mark_pane": int(b.mark_pane),
                    }
                for lo, hi, n in b.shed:  # whole panes the host shed from its uplink backlog: windows short
                    qs.gaps.append([int(lo), int(hi), int(n), b.host, "shed"])
                    qs.host(b.host)["shed"] = qs.host(b.host).get("shed", 0) + int(n)
                for lo, hi, cause, n in b.losses:  # lost before Kafka (socket, ring, late at the host)
                    h = qs.host(b.host)
                    if cause == "malformed":  # reported, not a loss of this query's records
                        h["malformed"] = h.get("malformed", 0) + int(n)
                        continue
                    qs.gaps.append([int(lo), int(hi), int(n), b.host, R.WIRE_CAUSES[cause]])
                    h["lost_" + cause] = h.get("lost_" + cause, 0) + int(n)
                if b.stats.get("workers", 0) > 0:
                    qs.meld.workers_of(b.host, int(b.stats["workers"]))
                qs.meld.observe(b.host, b.incarnation, b.mark_pane, b.mark_ns, b.sent_wall_ns, now_ms)
                bq["punctuations"] += 1
        parts = []
        for name, qs in self.queries.items():
            parts.extend(self._finish(qs, pending[name], batch[name], now_ms, known_gaps[name]))
        return parts

    def process(self, values: Iterable[bytes], now_ms: int) -> pd.DataFrame:
        """Apply one micro-batch of Kafka message values (in offset order) at processing time ``now_ms``.

        Returns rows in the generic output schema: 'final' windows, 'correction' rows and one
        'status' row per query.
        """
        parts = [p.columns() for p in self._process(values, now_ms)]
        if not parts:
            return empty_output()
        return pd.DataFrame(
            {
                c: np.concatenate([p[c] for p in parts])
                if c not in ("key", "state")
                else [r for p in parts for r in p[c]]
                for c in OUTPUT_COLUMNS
            }
        )

    def process_packed(self, values: Iterable[bytes], now_ms: int) -> pd.DataFrame:
        """:meth:`process` in the packed form (:data:`high_level.aggregate.packed.PACKED_COLUMNS`): what the Spark step emits."""
        return pack_parts(self._process(values, now_ms))

    def _finish(
        self, qs: _QueryState, pending: list, batch: dict[str, int], now_ms: int, known_gaps: int = 0
    ) -> list[Part]:
        lay = qs.layout
        late_batch: dict[str, int] = {}
        parts = []
        if pending:
            hosts = sorted({p[0] for p in pending})
            hix = {h: i for i, h in enumerate(hosts)}
            pane = np.concatenate([p[1] for p in pending])
            key = np.concatenate([p[2] for p in pending])
            state = np.concatenate([p[3] for p in pending])
            host_idx = np.repeat(np.array([hix[p[0]] for p in pending], I64), [len(p[1]) for p in pending])
            res = qs.rollup.add(pane, key, state, host_idx, len(hosts))
            for h, n in zip(hosts, res.late_per_host.tolist(), strict=True):
                if n:
                    qs.host(h)["late"] += n
                    late_batch[h] = n
            if res.corrections is not None and len(res.corrections):
                # policy correction: stored as deltas to fold; policy drop: 'late' rows that only say
                # which closed (window, group) rows lost how many records (their values stay as closed)
                kind = "correction" if self.settings.late_policy == "correction" else "late"
                expected, comp = qs.completeness(res.corrections.window, res.late_records)
                parts.append(
                    Part(
                        lay,
                        self.partition,
                        kind,
                        now_ms,
                        len(qs.meld.live_hosts()),
                        res.corrections,
                        hosts_expected=expected,
                        comp=comp,
                    )
                )
            qs.records += len(pane)
        lwm = qs.meld.low_water_mark()
        before = qs.rollup.closed
        closed = qs.rollup.close(lwm, qs.shed_through())
        n_live = len(qs.meld.live_hosts())
        if len(closed):
            qs.windows_closed += len(closed)
            expected, comp = qs.completeness(closed.window)
            comp[: qs.rollup.group_rows, 0] = expected  # closed by a group punctuation: every host's promise
            parts.append(
                Part(lay, self.partition, "final", now_ms, n_live, closed, hosts_expected=expected, comp=comp)
            )
        if lay.landmark and qs.rollup.closed != before:
            upd = qs.rollup.landmark_update()
            if len(upd):
                expected, comp = qs.completeness(upd.window)
                parts.append(
                    Part(
                        lay, self.partition, "update", now_ms, n_live, upd, hosts_expected=expected, comp=comp
                    )
                )
        if self.settings.live and pending:
            parts.extend(self._provisional(qs, pending, now_ms, n_live))
        flagged = qs.incomplete_windows(before, known_gaps, now_ms) + qs.timeout_windows(
            before, closed, now_ms
        )
        if flagged:
            text = json.dumps({"partition": self.partition, "windows": flagged}, separators=(",", ":"))
            parts.append(Part(lay, self.partition, INCOMPLETE_KIND, now_ms, n_live, None, text))
        qs.purge_gaps()
        status = self.status(qs, now_ms, batch, late_batch, len(closed))
        parts.append(Part(lay, self.partition, "status", now_ms, n_live, None, status.model_dump_json()))
        return parts

    def _provisional(self, qs: _QueryState, pending: list, now_ms: int, n_live: int) -> list[Part]:
        """Live results (contract/live.py): the current value of every open window and group the batch's
        partials changed, as 'provisional' rows with their coverage (hosts_in_mark of hosts_expected)."""
        pane = np.concatenate([p[1] for p in pending])
        key = np.concatenate([p[2] for p in pending])
        upd = qs.rollup.provisional(pane, key)
        if not len(upd):
            return []
        expected, comp = qs.completeness(upd.window)
        return [
            Part(
                qs.layout,
                self.partition,
                PROVISIONAL_KIND,
                now_ms,
                n_live,
                upd,
                hosts_expected=expected,
                comp=comp,
            )
        ]

    def status(
        self,
        qs: _QueryState,
        now_ms: int,
        batch: dict[str, int] | None = None,
        late_batch: dict[str, int] | None = None,
        closed_batch: int = 0,
    ) -> PartitionStatus:
        """A snapshot in the status contract: per-host marks, liveness, lag, late and missing records, open windows."""
        lay, meld = qs.layout, qs.meld
        lwm = meld.low_water_mark()
        hosts: dict[str, Any] = {}
        for name in sorted(set(meld.hosts) | set(qs.hosts) | set(meld.expected_ids())):
            hm = meld.hosts.get(name)
            hc = qs.hosts.get(name, {"late": 0, "records": 0, "inc": {}})
            incs = hc["inc"]
            cur = str(hm.incarnation) if hm else (max(incs, key=int) if incs else None)
            hosts[name] = {
                "live": meld.is_live(name),
                "expected": name in meld.expected_ids() or name in meld.expected,
                "mark_pane": hm.mark_pane if hm else None,
                "mark_ns": hm.mark_ns if hm else None,
                "lag_s": (now_ms * 1_000_000 - hm.mark_ns) / 1e9
                if hm and 0 < hm.mark_ns < wire.END_OF_STREAM
                else None,
                "last_heard_ms": hm.last_heard_ms if hm else None,
                "silent_s": hm.silent_ms / 1e3 if hm else None,
                "punctuations": hm.punctuations if hm else 0,
                "incarnation": int(cur) if cur is not None else None,
                "records": hc["records"],
                "sent_records": incs[cur][1] if cur in incs else 0,
                "received_records": incs[cur][0] if cur in incs else 0,
                "missing_records": sum(v[2] for v in incs.values()),
                "late_partials": hc["late"],
                "restarts": hc.get("restarts", 0),
                "last_restart": hc.get("last_restart"),
                "late_batch": (late_batch or {}).get(name, 0),
                "losses": {k[5:]: v for k, v in hc.items() if k.startswith("lost_")},
                "malformed": hc.get("malformed", 0),
            }
        return PartitionStatus.model_validate(
            {
                "query": lay.name,
                "partition": self.partition,
                "now_ms": now_ms,
                "low_water_mark_pane": lwm,
                "low_water_mark_ns": _pane_ns(lay, lwm),
                "closed_before_window": qs.rollup.closed,
                "blocked_by": meld.blocking_hosts(),
                "live_hosts": len(meld.live_hosts()),
                "open_windows": qs.rollup.open_windows(),
                "state_rows": len(qs.rollup),
                "windows_closed": qs.windows_closed,
                "windows_closed_batch": closed_batch,
                "records": qs.records,
                "batch": batch or {},
                "errors": dict(self.errors),
                "last_error": self.last_error,
                "hosts": hosts,
            }
        )


def _pane_ns(lay: Layout, pane: int | None) -> int | None:
    """Start time of a pane in ns, None when unknown or beyond int64 (END_OF_STREAM)."""
    if pane is None:
        return None
    ns = lay.origin_ns + pane * lay.pane_ns
    return ns if -(2**63) <= ns < 2**63 - 1 else None


def empty_output() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in OUTPUT_COLUMNS})
