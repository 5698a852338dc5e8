"""The fused per-packet pass: parse once, then filter, key and sub-aggregate for every query.

One Numba call consumes a run of frames from the ring (or from plain arrays in benchmarks) and
leaves evicted/flushed partials in each query's output region. It stops early only when ``limit``
packets were taken, so the output regions (sized for one chunk) can never overflow.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from contract.query import MERGE_MAX, MERGE_MIN, MERGE_SUM, SRC_DSCP, SRC_ONE
from low_level import flush
from low_level.filter import run_filter_at
from low_level.parse import NERR, PARSE_OK, parse_frame
from low_level.ring import HEAD, TAIL
from low_level.subaggregate import (
    PANE_MAX,
    emit_packet_at,
    emit_slot,
    extract_key_at,
    key_hash,  # noqa: F401  (re-exported: callers import key_hash from here)
    key_hash_at,
    pin,
    prefetch_w,
)
from low_level.tables import (
    EMPTY,
    MAXKW,
    PANE_RING,
    QP_BASE,
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
    QP_PROBES,
    QP_SIZE,
    QP_SOFF,
    QP_STRIDE,
    QS_CUR,
    QS_EVICT,
    QS_LATE,
    QS_MARK,
    QS_MATCHED,
    QS_MAXTS,
    QS_OCC,
    QS_OVERDUE,
    QS_STARTED,
    QS_TICK,
    Tables,
)

POLICY_LAZY, POLICY_SLOW, POLICY_IOP = 0, 1, 2
# host-level counters (one int64 array, shared with metrics)
(HC_PACKETS, HC_PARSED_OK, HC_NON_IP) = range(3)
NHC = 4
NF = F.NFIELDS
BLOCK = 128  # packets per block: parsed, filtered, keyed and hashed first, then folded query by query


@njit(cache=True, nogil=True)
def aggregate_block(q: int, cnt: int, rows, keys, sel, hs, qp, qs, tab, out, pane_counts, scols) -> None:
    """Fold query q's filter-passing packets of one block (in arrival order) into its table.

    Packet j of the block's selection is parsed row ``sel[q, j]`` of ``rows`` (NF words each), with key
    words at ``keys[(q * BLOCK + j) * MAXKW:]`` and key hash ``hs[q, j]``. Exactly the per-packet logic:
    late drop, pane advance (m-pane sweep), overdue one-packet partials, probe, update / insert / evict,
    flush-policy ticks. Query parameters and the counters nothing else touches stay in locals for the
    block (the compiler cannot keep them in registers across stores to the int64 table otherwise).
    """
    kw, na, soff = qp[q, QP_KW], qp[q, QP_NA], qp[q, QP_SOFF]
    base, stride, probes = qp[q, QP_BASE], qp[q, QP_STRIDE], qp[q, QP_PROBES]
    umask = np.uint64(qp[q, QP_SIZE] - 1)
    origin, pane_ns = qp[q, QP_ORIGIN], qp[q, QP_PANE_NS]
    policy, m, every = qp[q, QP_POLICY], qp[q, QP_M], qp[q, QP_I]
    mark = qs[q, QS_MARK]
    started, cur = qs[q, QS_STARTED], qs[q, QS_CUR]
    late, matched, maxts = qs[q, QS_LATE], qs[q, QS_MATCHED], qs[q, QS_MAXTS]
    evict, overdue, tick = qs[q, QS_EVICT], qs[q, QS_OVERDUE], qs[q, QS_TICK]
    # pane of the last timestamp seen, valid for ts in [plo, phi): saves the division for most packets
    plo, phi, lpane = np.int64(1), np.int64(0), np.int64(0)
    for j in range(cnt):
        ro = sel[q, j] * NF
        ko = (q * BLOCK + j) * MAXKW
        t = rows[ro + F.TS]
        if t >= plo and t < phi:
            pane = lpane
        else:
            pane = (t - origin) // pane_ns
            lpane = pane
            plo = origin + pane * pane_ns
            phi = plo + pane_ns
        if pane < mark:
            late += 1  # punctuation already promised this pane is complete: grammatical drop
        else:
            matched += 1
            if t > maxts:
                maxts = t
            if started == 0:
                started = 1
                cur = pane
                qs[q, QS_STARTED] = 1
                qs[q, QS_CUR] = pane
            elif pane > cur:
                old = cur
                cur = pane
                qs[q, QS_CUR] = pane
                flush.on_advance(q, old, pane, qp, qs, tab, out, pane_counts)
            if pane < cur - m:
                # older than the table's horizon but not late: ship it as its own one-packet partial
                emit_packet_at(q, pane, keys, ko, rows, ro, qp, qs, out, scols)
                overdue += 1
            else:
                # probe / update / insert / evict, written out here rather than called: a call passes
                # every array as a struct (no cross-module inlining), a Numba-inlined helper rebinds its
                # array arguments (an atomic incref/decref per packet)
                s0 = hs[q, j] & umask
                burst = policy == POLICY_IOP
                probing = True
                while probing:
                    probing = False
                    match = -1
                    empty = -1
                    victim = -1
                    victim_pane = PANE_MAX
                    jj = 0
                    while jj < probes:
                        pos = base + np.int64((s0 + np.uint64(jj)) & umask) * stride
                        sp = tab[pos]
                        if sp == EMPTY:
                            if empty < 0:
                                empty = pos
                        else:
                            if sp == pane:
                                w = 0
                                while w < kw and tab[pos + 1 + w] == keys[ko + w]:
                                    w += 1
                                if w == kw:
                                    match = pos
                                    break
                            if sp < victim_pane:  # the oldest probed entry (first on ties) is the victim
                                victim_pane = sp
                                victim = pos
                        jj += 1
                    if match < 0 and empty < 0 and burst and victim_pane >= cur:
                        # IOP: a current-pane entry would leave while old ones remain: flush them, re-probe
                        flush.iop_burst(q, qp, qs, tab, out, pane_counts)
                        burst = False
                        probing = True
                fresh = match < 0
                if fresh:
                    if empty < 0:
                        emit_slot(q, victim, qp, qs, tab, out, pane_counts)
                        evict += 1
                        empty = victim
                    match = empty
                    tab[match] = pane
                    for w in range(kw):
                        tab[match + 1 + w] = keys[ko + w]
                    pane_counts[q, pane & (PANE_RING - 1)] += 1
                    qs[q, QS_OCC] += 1
                spos = match + 1 + kw
                for c in range(na):
                    src = scols[soff + c, 0]
                    merge = scols[soff + c, 1]
                    v = np.int64(1)
                    if src == SRC_DSCP:
                        v = rows[ro + F.TOS] >> 2
                    elif src != SRC_ONE:
                        v = rows[ro + src]
                    if fresh:
                        tab[spos + c] = v
                    elif merge == MERGE_SUM:
                        tab[spos + c] += v
                    elif merge == MERGE_MIN:
                        if v < tab[spos + c]:
                            tab[spos + c] = v
                    elif merge == MERGE_MAX:
                        if v > tab[spos + c]:
                            tab[spos + c] = v
                # the flush step is a call (with refcount overhead): make it only when old entries exist
                if policy == POLICY_IOP:
                    if qs[q, QS_OCC] - pane_counts[q, cur & (PANE_RING - 1)] > 0:
                        flush.slow_tick(q, qp, qs, tab, out, pane_counts)
                elif policy == POLICY_SLOW:
                    tick += 1
                    if tick >= every:
                        tick = 0
                        if qs[q, QS_OCC] - pane_counts[q, cur & (PANE_RING - 1)] > 0:
                            flush.slow_tick(q, qp, qs, tab, out, pane_counts)
    qs[q, QS_LATE], qs[q, QS_MATCHED], qs[q, QS_MAXTS] = late, matched, maxts
    qs[q, QS_EVICT], qs[q, QS_OVERDUE], qs[q, QS_TICK] = evict, overdue, tick
    pin(rows)
    pin(keys)
    pin(sel)
    pin(hs)
    pin(qp)
    pin(qs)
    pin(tab)
    pin(out)
    pin(pane_counts)
    pin(scols)


@njit(cache=True, nogil=True)
def fused_pass(frames, snaplen, caplen, wirelen, ts, iface, use_iface, seq0, n, smask,
               qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, stack,
               rows, keys, sel, hs, cnt) -> None:
    """The pass over frames seq0 .. seq0+n-1 (frame seq sits in slot ``seq & smask``), block by block.

    Phase 1 parses each frame into the one scratch ``row`` (see low_level.parse), keeps a copy in
    ``rows`` and, per query, runs the interface mask and filter, extracts and hashes the key, and hints
    the CPU to fetch every cache line of the key's probe window (software prefetch). Phase 2 folds each query's selected packets in order
    (queries share no state, so per-query order is all the semantics need). By the time phase 2 probes
    a slot its lines have had a block's worth of parsing to arrive: the misses overlap instead of
    stalling one packet at a time (at 260K groups in a 2^19-slot table, prefetching only the first line
    gave 12.9 Mpkt/s, the whole window 19.2: a miss of a collided key's later slots costs as much). ``use_iface`` = 0: every frame is interface 0, no mask check.
    """
    nq = qp.shape[0]
    b0 = 0
    while b0 < n:
        bn = n - b0 if n - b0 < BLOCK else BLOCK
        for q in range(nq):
            cnt[q] = 0
        for i in range(bn):
            slot = (seq0 + b0 + i) & smask
            hc[HC_PACKETS] += 1
            ifc = iface[slot] if use_iface else 0
            status = parse_frame(frames, slot * snaplen, caplen[slot], wirelen[slot], ts[slot], ifc, row)
            err_counts[status] += 1
            if status == PARSE_OK:
                hc[HC_PARSED_OK] += 1
                ro = i * NF
                for f in range(NF):
                    rows[ro + f] = row[f]
                for q in range(nq):
                    ok = True
                    if use_iface:
                        ok = (qp[q, QP_IFMASK] >> row[F.IFACE]) & 1 != 0
                    if ok and qp[q, QP_FLEN] != 0:
                        ok = run_filter_at(fprog, qp[q, QP_FOFF], qp[q, QP_FLEN], row, 0, stack)
                    if ok:
                        j = cnt[q]
                        ko = (q * BLOCK + j) * MAXKW
                        extract_key_at(kprog, qp[q, QP_KOFF], qp[q, QP_KLEN], row, 0, keys, ko)
                        h = key_hash_at(keys, ko, qp[q, QP_KW])
                        sel[q, j] = i
                        hs[q, j] = h
                        pos = qp[q, QP_BASE] + np.int64(h & np.uint64(qp[q, QP_SIZE] - 1)) * qp[q, QP_STRIDE]
                        # every cache line of the probe window (prefetches never fault, even past the end)
                        pend = pos + qp[q, QP_PROBES] * qp[q, QP_STRIDE] - 1
                        if pend >= tab.shape[0]:
                            pend = tab.shape[0] - 1
                        while pos <= pend:
                            prefetch_w(tab, pos)
                            pos += 8
                        prefetch_w(tab, pend)
                        cnt[q] = j + 1
        for q in range(nq):
            if cnt[q] > 0:
                aggregate_block(q, cnt[q], rows, keys, sel, hs, qp, qs, tab, out, pane_counts, scols)
        b0 += bn
    pin(frames)
    pin(caplen)
    pin(wirelen)
    pin(ts)
    pin(iface)
    pin(qp)
    pin(qs)
    pin(tab)
    pin(out)
    pin(pane_counts)
    pin(fprog)
    pin(kprog)
    pin(scols)
    pin(err_counts)
    pin(hc)
    pin(row)
    pin(stack)
    pin(rows)
    pin(keys)
    pin(sel)
    pin(hs)
    pin(cnt)


@njit(cache=True, nogil=True)
def process_frames(frames, snaplen, caplen, wirelen, ts, iface, ctr, limit,
                   qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, stack,
                   rows, keys, sel, hs, cnt) -> int:
    """Consume up to ``limit`` frames from the ring (advancing its TAIL); returns how many."""
    nslots = caplen.shape[0]
    start = ctr[TAIL]
    avail = ctr[HEAD] - start
    n = avail if avail < limit else limit
    fused_pass(frames, snaplen, caplen, wirelen, ts, iface, True, start, n, nslots - 1,
               qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, stack,
               rows, keys, sel, hs, cnt)
    ctr[TAIL] = start + n
    return n


@njit(cache=True, nogil=True)
def process_arrays(frames2d, caplen, wirelen, ts, start, stop,
                   qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, stack,
                   rows, keys, sel, hs, cnt) -> int:
    """Same pass over frames held in plain arrays (benchmarks, tests); frames2d is (n, snaplen)."""
    flat = frames2d.reshape(-1)
    fused_pass(flat, frames2d.shape[1], caplen, wirelen, ts, caplen, False, start, stop - start, -1,
               qp, qs, tab, out, pane_counts, fprog, kprog, scols, err_counts, hc, row, stack,
               rows, keys, sel, hs, cnt)
    return stop - start


class Kernel:
    """Scratch memory and counters around the compiled pass for one host's queries."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables
        self.err_counts = np.zeros(NERR, dtype=np.int64)
        self.hc = np.zeros(NHC, dtype=np.int64)
        self.row = np.zeros(F.NFIELDS, dtype=np.int64)
        self.key = np.zeros(MAXKW, dtype=np.int64)
        self.stack = np.zeros(32, dtype=np.int64)
        # per-block scratch (see fused_pass), allocated once
        nq = max(1, tables.qp.shape[0])
        self.rows = np.zeros(BLOCK * NF, dtype=np.int64)
        self.keys = np.zeros(nq * BLOCK * MAXKW, dtype=np.int64)
        self.sel = np.zeros((nq, BLOCK), dtype=np.int64)
        self.hs = np.zeros((nq, BLOCK), dtype=np.uint64)
        self.cnt = np.zeros(nq, dtype=np.int64)

    def _scratch(self) -> tuple:
        return (self.err_counts, self.hc, self.row, self.stack, self.rows, self.keys, self.sel, self.hs, self.cnt)

    def run_ring(self, ring) -> int:
        t = self.t
        return process_frames(ring.frames, ring.snaplen, ring.caplen, ring.wirelen, ring.ts, ring.iface, ring.ctr,
                              t.chunk, t.qp, t.qs, t.tab, t.out, t.pane_counts, t.fprog, t.kprog, t.scols,
                              *self._scratch())

    def run_arrays(self, frames2d, caplen, wirelen, ts, start: int, stop: int) -> int:
        """Process frames[start:stop]; callers keep stop - start <= tables.chunk and drain between calls."""
        t = self.t
        return process_arrays(frames2d, caplen, wirelen, ts, start, stop, t.qp, t.qs, t.tab, t.out,
                              t.pane_counts, t.fprog, t.kprog, t.scols, *self._scratch())

    def flush_below(self, q: int, bound: int) -> int:
        """Emit every entry of query q older than pane ``bound`` (heartbeats, idle, end of stream)."""
        t = self.t
        return flush.sweep_below(q, bound, t.qp, t.qs, t.tab, t.out, t.pane_counts)

    def min_pane(self, q: int) -> int:
        t = self.t
        return flush.min_pane(q, t.qs, t.qp, t.pane_counts)
