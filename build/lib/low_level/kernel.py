"""The fused per-packet pass: parse once, then filter, key and sub-aggregate for every query.

One Numba call consumes a run of frames from the ring (or from plain arrays in benchmarks) and
leaves evicted/flushed partials in each query's output region. It stops early only when ``limit``
packets were taken, so the output regions (sized for one chunk) can never overflow.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from low_level import flush
from low_level.filter import run_filter
from low_level.parse import NERR, PARSE_OK, parse_frame
from low_level.ring import HEAD, TAIL
from low_level.subaggregate import (
    emit_packet,
    emit_slot,
    extract_key,
    fold_packet,
    insert_at,
    key_hash,
    probe,
)
from low_level.tables import (
    QP_FLEN,
    QP_FOFF,
    QP_I,
    QP_IFMASK,
    QP_KLEN,
    QP_KOFF,
    QP_KW,
    QP_M,
    QP_NA,
    QP_ORIGIN,
    QP_PANE_NS,
    QP_POLICY,
    QP_SOFF,
    QS_CUR,
    QS_EVICT,
    QS_LATE,
    QS_MARK,
    QS_MATCHED,
    QS_MAXTS,
    QS_OVERDUE,
    QS_STARTED,
    QS_TICK,
    Tables,
)

POLICY_LAZY, POLICY_SLOW, POLICY_IOP = 0, 1, 2
# host-level counters (one int64 array, shared with metrics)
(HC_PACKETS, HC_PARSED_OK, HC_NON_IP) = range(3)
NHC = 4


@njit(cache=True, nogil=True, inline="always")
def aggregate_row(q: int, row, key, qp, qs, tab, out, pane_counts, scols) -> None:
    """Fold one parsed, filter-passing packet (its key already extracted) into query q's table under its flush policy."""
    pane = (row[F.TS] - qp[q, QP_ORIGIN]) // qp[q, QP_PANE_NS]
    if pane < qs[q, QS_MARK]:
        qs[q, QS_LATE] += 1  # punctuation already promised this pane is complete: grammatical drop
        return
    qs[q, QS_MATCHED] += 1
    if row[F.TS] > qs[q, QS_MAXTS]:
        qs[q, QS_MAXTS] = row[F.TS]
    policy = qp[q, QP_POLICY]
    if qs[q, QS_STARTED] == 0:
        qs[q, QS_STARTED] = 1
        qs[q, QS_CUR] = pane
    elif pane > qs[q, QS_CUR]:
        old = qs[q, QS_CUR]
        qs[q, QS_CUR] = pane
        flush.on_advance(q, old, pane, qp, qs, tab, out, pane_counts)
    cur = qs[q, QS_CUR]
    kw = qp[q, QP_KW]
    if pane < cur - qp[q, QP_M]:
        # older than the table's horizon but not late: ship it as its own one-packet partial
        emit_packet(q, pane, key, row, qp, qs, out, scols)
        qs[q, QS_OVERDUE] += 1
        return
    h = key_hash(key, kw)
    match, empty, victim, victim_pane = probe(q, pane, key, h, qp, tab)
    if match >= 0:
        fold_packet(tab, match + 1 + kw, qp[q, QP_NA], scols, qp[q, QP_SOFF], row, False)
    elif empty >= 0:
        insert_at(q, empty, pane, key, row, qp, qs, tab, scols, pane_counts)
    else:
        if policy == POLICY_IOP and victim_pane >= cur:
            flush.iop_burst(q, qp, qs, tab, out, pane_counts)
            match, empty, victim, victim_pane = probe(q, pane, key, h, qp, tab)
        if empty >= 0:
            insert_at(q, empty, pane, key, row, qp, qs, tab, scols, pane_counts)
        else:
            emit_slot(q, victim, qp, qs, tab, out, pane_counts)
            qs[q, QS_EVICT] += 1
            insert_at(q, victim, pane, key, row, qp, qs, tab, scols, pane_counts)
    if policy == POLICY_IOP:
        flush.slow_tick(q, qp, qs, tab, out, pane_counts)
    elif policy == POLICY_SLOW:
        qs[q, QS_TICK] += 1
        if qs[q, QS_TICK] >= qp[q, QP_I]:
            qs[q, QS_TICK] = 0
            flush.slow_tick(q, qp, qs, tab, out, pane_counts)


@njit(cache=True, nogil=True)
def process_frames(frames, snaplen, caplen, wirelen, ts, iface, ctr, limit,
                   qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, key, stack) -> int:
    """Consume up to ``limit`` frames from the ring (advancing its TAIL); returns how many."""
    nslots = caplen.shape[0]
    nq = qp.shape[0]
    start = ctr[TAIL]
    avail = ctr[HEAD] - start
    n = avail if avail < limit else limit
    for k in range(n):
        slot = (start + k) & (nslots - 1)
        hc[HC_PACKETS] += 1
        status = parse_frame(frames, slot * snaplen, caplen[slot], wirelen[slot], ts[slot], iface[slot], row)
        err_counts[status] += 1
        if status != PARSE_OK:
            continue
        hc[HC_PARSED_OK] += 1
        for q in range(nq):
            if (qp[q, QP_IFMASK] >> row[F.IFACE]) & 1 == 0:
                continue
            if not run_filter(fprog, qp[q, QP_FOFF], qp[q, QP_FLEN], row, stack):
                continue
            extract_key(kprog, qp[q, QP_KOFF], qp[q, QP_KLEN], row, key)
            aggregate_row(q, row, key, qp, qs, tab, out, pane_counts, scols)
    ctr[TAIL] = start + n
    return n


@njit(cache=True, nogil=True)
def process_arrays(frames2d, caplen, wirelen, ts, start, stop,
                   qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, key, stack) -> int:
    """Same pass over frames held in plain arrays (benchmarks, tests); frames2d is (n, snaplen)."""
    nq = qp.shape[0]
    flat = frames2d.reshape(-1)
    snaplen = frames2d.shape[1]
    for i in range(start, stop):
        hc[HC_PACKETS] += 1
        status = parse_frame(flat, i * snaplen, caplen[i], wirelen[i], ts[i], 0, row)
        err_counts[status] += 1
        if status != PARSE_OK:
            continue
        hc[HC_PARSED_OK] += 1
        for q in range(nq):
            if not run_filter(fprog, qp[q, QP_FOFF], qp[q, QP_FLEN], row, stack):
                continue
            extract_key(kprog, qp[q, QP_KOFF], qp[q, QP_KLEN], row, key)
            aggregate_row(q, row, key, qp, qs, tab, out, pane_counts, scols)
    return stop - start


class Kernel:
    """Scratch memory and counters around the compiled pass for one host's queries."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables
        self.err_counts = np.zeros(NERR, dtype=np.int64)
        self.hc = np.zeros(NHC, dtype=np.int64)
        self.row = np.zeros(F.NFIELDS, dtype=np.int64)
        self.key = np.zeros(8, dtype=np.int64)
        self.stack = np.zeros(32, dtype=np.int64)

    def run_ring(self, ring) -> int:
        t = self.t
        return process_frames(ring.frames, ring.snaplen, ring.caplen, ring.wirelen, ring.ts, ring.iface, ring.ctr,
                              t.chunk, t.qp, t.qs, t.tab, t.out, t.pane_counts, t.fprog, t.kprog, t.scols,
                              self.err_counts, self.hc, self.row, self.key, self.stack)

    def run_arrays(self, frames2d, caplen, wirelen, ts, start: int, stop: int) -> int:
        """Process frames[start:stop]; callers keep stop - start <= tables.chunk and drain between calls."""
        t = self.t
        return process_arrays(frames2d, caplen, wirelen, ts, start, stop, t.qp, t.qs, t.tab, t.out,
                              t.pane_counts, t.fprog, t.kprog, t.scols, self.err_counts, self.hc,
                              self.row, self.key, self.stack)

    def flush_below(self, q: int, bound: int) -> int:
        """Emit every entry of query q older than pane ``bound`` (heartbeats, idle, end of stream)."""
        t = self.t
        return flush.sweep_below(q, bound, t.qp, t.qs, t.tab, t.out, t.pane_counts)

    def min_pane(self, q: int) -> int:
        t = self.t
        return flush.min_pane(q, t.qs, t.qp, t.pane_counts)
