"""The stateful step of a join query in the Spark job: every Kafka partition's band join, one aggregation.

A join is partitioned by its key (the connection's 4-tuple) but aggregated by something else (the
server port): one group's window gets rows from every partition. So one state group holds all of a
join's partitions (:class:`high_level.join.band.BandJoin` each, the pairs and unmatched rows found there)
and one roll-up (:class:`high_level.aggregate.rollup.QueryRollup`) over their output; a window closes when the
output mark of *every* partition has passed its end. The output is the packed form of the aggregate
queries' step (:func:`high_level.aggregate.packed.pack_parts`), so the sink, store, API and page take join
windows as they take any query's: 'final' rows with the completeness columns, and one 'status' row
per partition with the join's state (rows and bytes of stored input rows).

Completeness: a window's ``hosts_in_mark`` counts the hosts whose punctuation passed its end on both
inputs of every partition; a host declared dead by the timeout (its mark stays behind) leaves its
windows flagged incomplete, which for an anti join means "some SYN-ACKs may be missing: unanswered
counts may be too high". What either input lost on the way (rows shed by a host's outbox, lost
before Kafka, a sequence gap, rows below the job's mark: ``BandJoin.take_losses``) counts in
``missing_records`` of every output window within a band of its time range (a lost right row could
have matched any left row up to a band before it) and flags those windows (``_incomplete``), so an
anti join never calls a SYN unanswered, complete, when its SYN-ACK may have been lost.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from contract import results as R
from contract import wire
from contract.status import PartitionStatus
from high_level import codec
from high_level.aggregate.meld import Meld
from high_level.aggregate.packed import INCOMPLETE_KIND, Part, pack_parts
from high_level.aggregate.processor import NO_MARK, Settings, flag_windows, gap_records
from high_level.aggregate.rollup import Layout, QueryRollup
from high_level.join.band import SIDES, BandJoin, JoinLayout, JoinOutput, _key, unpack_state
from high_level.join.feed import FeedDedup
from high_level.join.rows import partials_of

I64 = np.int64
ZMAGIC = b"LWJZ"  # a zstd-compressed codec blob follows (its raw length first)
HASH_ARRAYS = ("left_h", "right_h")
_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(partitions: int) -> ThreadPoolExecutor | None:
    """Threads for a join's partitions (one per core at most; None: one core or one partition), kept per
    process (a Spark Python worker serves many micro-batches)."""
    n = min(partitions, os.cpu_count() or 1)
    if n <= 1:
        return None
    if n not in _POOLS:
        _POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="lw-join")
    return _POOLS[n]


class JoinProcessor:
    """One join query's state in the job: its partitions' band joins and the roll-up of their output."""

    def __init__(self, layout: JoinLayout, settings: Settings, feed_sides: tuple[str, ...] = ()) -> None:
        assert layout.rollup is not None, "the job stores a join's windows: the query needs a window"
        self.layout = layout
        self.settings = settings
        self.feed_sides = tuple(
            feed_sides
        )  # inputs that are aggregates' closed windows (high_level/join/feed.py)
        bare = replace(layout, rollup=None)
        self.joins = {
            p: self._feed_melds(BandJoin(bare, settings.host_timeout_ms, settings.expected_hosts))
            for p in range(layout.partitions)
        }
        self.rollup = QueryRollup(layout.rollup)
        self.partials = partials_of(layout)
        self.dedup = FeedDedup([layout.left if s == "left" else layout.right for s in self.feed_sides])
        self.windows_closed = 0
        self.records = 0
        self.gaps: list[list] = []  # [first pane, last pane, records, host, cause] of the output windows

    def _feed_melds(self, j: BandJoin) -> BandJoin:
        """A closed-window feed has one publisher (the job), not the capture hosts: expect none of them there
        (before its first punctuation the feed's mark is unknown, so nothing is final: safe)."""
        for s in self.feed_sides:
            j.check_seq[s] = False
            m = Meld(self.settings.host_timeout_ms, (), self.settings.max_gap_ms)
            m.load_dict(j.melds[s].to_dict())
            j.melds[s] = m
        return j

    # -- persistence (no pickle: npz of numbers and a JSON header)
    def to_bytes(self) -> bytes:
        """One :mod:`high_level.codec` blob (the roll-up and every partition's join state, ``join<p>/...``),
        zstd-compressed (:data:`ZMAGIC`), without the stored rows' key hashes (recomputed on load).

        Why: Spark ships this blob JVM -> Python -> JVM and into the state store every micro-batch, and the
        JVM pickles a byte array byte by byte (Pyrolite): its size is JVM CPU. The hashes are random (they
        do not compress) and cheap to recompute; the rest compresses ~3x."""
        r = self.rollup
        head: dict = {
            "closed": r.closed,
            "windows_closed": self.windows_closed,
            "records": self.records,
            "fed": self.dedup.fed,
            "fed_skipped": self.dedup.skipped,
            "joins": {},
            "hashes": "recompute",
            "gaps": self.gaps,
        }
        arrays = {"pane": r.pane, "key": r.key, "state": r.state}
        for p, j in self.joins.items():
            jh, ja = j.state()
            head["joins"][str(p)] = jh
            arrays |= {f"join{p}/{k}": v for k, v in ja.items() if k not in HASH_ARRAYS}
        raw = codec.pack(head, arrays)
        return codec.compress(raw, ZMAGIC)

    @classmethod
    def from_bytes(
        cls, buf: bytes, layout: JoinLayout, settings: Settings, feed_sides: tuple[str, ...] = ()
    ) -> JoinProcessor:
        jp = cls(layout, settings, feed_sides)
        bare = replace(layout, rollup=None)
        head, z = unpack_state(codec.decompress(buf, ZMAGIC))
        jp.rollup.pane, jp.rollup.key, jp.rollup.state = z["pane"], z["key"], z["state"]
        for p in jp.joins:
            if "joins" in head:
                pre = f"join{p}/"
                jh, ja = head["joins"][str(p)], {k[len(pre) :]: v for k, v in z.items() if k.startswith(pre)}
            else:  # an .npz of earlier builds: each partition's join state nested as bytes
                jh, ja = unpack_state(z[f"join{p}"].tobytes())
            if head.get("hashes") == "recompute":  # stored in hash order: the same hashes, no sort
                for s, words in (("left", layout.lkey), ("right", layout.rkey)):
                    ja[f"{s}_h"] = wire.key_hash(_key(ja[f"{s}_ts"], ja[f"{s}_cols"], words, slice(None)))
            jp.joins[p] = jp._feed_melds(
                BandJoin.from_state(jh, ja, bare, settings.host_timeout_ms, settings.expected_hosts)
            )
        jp.rollup.closed = head["closed"]
        jp.windows_closed, jp.records = head["windows_closed"], head["records"]
        jp.gaps = [list(g) for g in head.get("gaps", [])]
        jp.dedup.fed, jp.dedup.skipped = dict(head.get("fed", {})), int(head.get("fed_skipped", 0))
        return jp

    # -- one micro-batch
    def process_packed(self, values: dict[int, list[bytes]], now_ms: int) -> pd.DataFrame:
        """Messages of both input topics by Kafka partition (each topic-partition in offset order)."""
        lay, rl = self.layout, self.layout.rollup
        assert rl is not None
        errors: dict[int, str] = {}
        batch = {p: self.dedup.filter(values.get(p, [])) for p in self.joins}  # in partition order, as before

        def run(p: int) -> JoinOutput:
            j = self.joins[p]
            try:
                return j.process(batch[p], now_ms)
            except wire.WireError as exc:  # a damaged batch: counted per partition, never a crash
                errors[p] = str(exc)
                j.advance(now_ms)
                return j.step()

        # Why threads: the partitions' joins are independent and their numpy work (decompress, hash, sort,
        # search, copy) releases the GIL, so one state group still uses the machine's cores; the output
        # is rolled up below in partition order, as if the joins had run one after the other.
        pool = _pool(len(self.joins))
        outs = list(pool.map(run, self.joins)) if pool is not None else [run(p) for p in self.joins]
        for out in outs:
            for pane, key, state in self.partials(lay, out):
                self.records += len(pane)
                self.rollup.add(pane, key, state)
        lwm = mark_pane(rl, [j.mark_ns for j in self.joins.values()])
        new_from = len(self.gaps)
        for j in self.joins.values():
            charge_losses(rl, self.gaps, j.take_losses(), int(lay.reach_ns))
        parts = close_output(
            self, rl, lwm, new_from, [j.melds[s] for j in self.joins.values() for s in SIDES], now_ms
        )
        live = len(live_hosts([j.melds[s] for j in self.joins.values() for s in SIDES]))
        for p, j in self.joins.items():
            st = self.status(p, j, now_ms, errors.get(p, ""))
            parts.append(Part(rl, p, "status", now_ms, live, None, st.model_dump_json()))
        return pack_parts(parts)

    def status(self, p: int, j: BandJoin, now_ms: int, error: str = "") -> PartitionStatus:
        """The status contract's partition snapshot for one join partition: marks of both inputs per host,
        and the join state (stored rows of both inputs) in ``state_rows`` / ``state_bytes``."""
        hosts = {}
        for h in sorted({h for s in SIDES for h in set(j.melds[s].hosts) | set(j.melds[s].expected_ids())}):
            hm = [j.melds[s].hosts.get(h) for s in SIDES]
            known = [m for m in hm if m is not None]
            mark = min((m.mark_ns for m in known), default=None)
            hosts[h] = {
                "live": all(j.melds[s].is_live(h) for s in SIDES if h in j.melds[s].hosts) and bool(known),
                "expected": h in j.melds["left"].expected_ids(),
                "mark_pane": mark,
                "mark_ns": mark,
                "lag_s": (now_ms * 1_000_000 - mark) / 1e9
                if mark is not None and 0 < mark < wire.END_OF_STREAM
                else None,
                "last_heard_ms": max((m.last_heard_ms for m in known), default=None),
                "silent_s": min((m.silent_ms for m in known), default=0) / 1e3 if known else None,
                "punctuations": sum(m.punctuations for m in known),
                "incarnation": known[0].incarnation if known else None,
                "records": 0,
                "sent_records": 0,
                "received_records": 0,
                "missing_records": 0,
                "late_partials": 0,
            }
        batch = {
            "late_left": j.late["left"],
            "late_right": j.late["right"],
            "stored_left": len(j.store["left"]),
            "stored_right": len(j.store["right"]),
            **({"feed_replays_skipped": self.dedup.skipped} if self.feed_sides else {}),
        }
        melds = [j.melds[s] for s in SIDES]
        return partition_status(
            self, p, j.mark_ns, melds, (j.state_rows, j.state_bytes), batch, error, now_ms, hosts
        )


# -- the output's windows: shared by every operator whose partitions feed one roll-up (joins, distinct) ----
def mark_pane(rl: Layout, marks: list[int | None]) -> int | None:
    """The output's low-water mark as a pane: the min of the partitions' marks (None: one is unknown)."""
    if any(m is None for m in marks) or not marks:
        return None
    m = min(marks)  # type: ignore[type-var]
    return wire.END_OF_STREAM if m >= wire.END_OF_STREAM else (m - rl.origin_ns) // rl.pane_ns


def charge_losses(rl: Layout, gaps: list[list], losses: list[list], reach_ns: int) -> None:
    """Append each input loss [first ns, last ns, rows, host, cause] as output panes widened by ``reach_ns``
    (a lost row could have met, or been a copy of, rows that far from it)."""
    for lo, hi, n, host, cause in losses:
        first = NO_MARK if lo <= NO_MARK else (lo - reach_ns - rl.origin_ns) // rl.pane_ns
        last = (hi + reach_ns - rl.origin_ns) // rl.pane_ns
        gaps.append([int(first), int(last), int(n), host, R.WIRE_CAUSES.get(cause, cause)])


def live_hosts(melds: list[Meld]) -> list[str]:
    return sorted({h for m in melds for h in m.live_hosts()})


def host_marks(melds: list[Meld]) -> dict[str, int | None]:
    """Per known host: the lowest mark it sent on any input and partition (None: silent somewhere it is
    expected). A host whose mark passed a window's end on everything is 'in mark' for that window."""
    out: dict[str, int | None] = {}
    for meld in melds:
        for h in set(meld.hosts) | set(meld.expected_ids()):
            hm = meld.hosts.get(h)
            mark = hm.mark_ns if hm is not None and meld.is_live(h) else None
            prev = out.get(h, wire.END_OF_STREAM) if h in out else wire.END_OF_STREAM
            out[h] = None if mark is None or prev is None else min(prev, mark)
    return out


def close_output(
    proc: Any, rl: Layout, lwm: int | None, new_from: int, melds: list[Meld], now_ms: int
) -> list[Part]:
    """Close ``proc.rollup``'s windows up to ``lwm``: the 'final' rows with their completeness, the
    flagged windows of the losses in ``proc.gaps`` (from ``new_from`` new), and drop gaps no open window
    needs; counts ``proc.windows_closed``."""
    before = proc.rollup.closed
    # at end of stream, close through the newest pane an input's loss touched too: a window whose every
    # output row was lost has no data to close it by, and must close to be flagged
    closed = proc.rollup.close(lwm, max((int(g[1]) for g in proc.gaps), default=None))
    hosts = host_marks(melds)
    live = len(live_hosts(melds))
    parts = []
    if len(closed):
        proc.windows_closed += len(closed)
        end = rl.window_end_ns(closed.window)
        in_mark = np.zeros(len(closed), I64)
        for mark in hosts.values():
            in_mark += (mark >= end) if mark is not None else 0
        comp = np.column_stack(
            [in_mark, np.zeros(len(closed), I64), gap_records(rl, proc.gaps, closed.window)]
        )
        parts.append(Part(rl, 0, "final", now_ms, live, closed, hosts_expected=len(hosts), comp=comp))
    flagged = flag_windows(rl, proc.gaps, before, proc.rollup.closed, new_from, now_ms)
    if flagged:
        text = json.dumps({"partition": 0, "windows": flagged}, separators=(",", ":"))
        parts.append(Part(rl, 0, INCOMPLETE_KIND, now_ms, live, None, text))
    if proc.rollup.closed is not None and proc.gaps and proc.rollup.closed < wire.END_OF_STREAM - rl.k:
        first_open = rl.first_needed_pane(proc.rollup.closed)
        proc.gaps[:] = [g for g in proc.gaps if g[1] >= first_open]
    return parts


def partition_status(
    proc: Any,
    p: int,
    mark: int | None,
    melds: list[Meld],
    state: tuple[int, int],
    batch: dict,
    error: str,
    now_ms: int,
    hosts: dict,
) -> PartitionStatus:
    """The status contract's snapshot of one partition of an operator (``proc``: its roll-up and counts)."""
    return PartitionStatus.model_validate(
        {
            "query": proc.layout.name,
            "partition": p,
            "now_ms": now_ms,
            "low_water_mark_pane": mark,
            "low_water_mark_ns": mark if mark is None or mark < wire.END_OF_STREAM else None,
            "closed_before_window": proc.rollup.closed,
            "blocked_by": sorted({h for m in melds for h in m.blocking_hosts()}),
            "live_hosts": len(live_hosts(melds)),
            "open_windows": proc.rollup.open_windows(),
            "state_rows": state[0],
            "state_bytes": state[1],
            "windows_closed": proc.windows_closed,
            "records": proc.records,
            "batch": batch,
            "errors": {"wire": 1} if error else {},
            "last_error": error,
            "hosts": hosts,
        }
    )
