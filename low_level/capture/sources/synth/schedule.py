"""The generator's answers (SYN-ACKs, duplicate SYN-ACKs, retransmitted SYNs) on a heap by timestamp,
and the two generating kernels that interleave them with the ordinary packets (into a ring, or arrays).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.capture.ring import RingArrays, ring_full, ring_push
from low_level.capture.sources.base import count_frames
from low_level.capture.sources.synth.frames import _packet_ts, build_packet
from low_level.capture.sources.synth.model import (
    G_ANSWER,
    G_DUP,
    G_IFIDX,
    G_LAT_MED,
    G_LAT_SIG,
    G_REPLIES,
    G_RETX,
    G_SEED,
    G_SYN,
    G_TCP,
    G_WAIT,
    K_DUP_SYNACK,
    K_RETX_SYN,
    K_SYNACK,
    LATENCY_MAX_NS,
    LATENCY_MIN_NS,
    RTO_NS,
)
from low_level.jit.refcount import pin
from low_level.jit.splitmix import splitmix64


@njit(cache=True, nogil=True, inline="always")
def _h_before(h, a, b):
    """Heap order: (timestamp, packet index, kind), a total order, so the output is deterministic."""
    if h[a, 0] != h[b, 0]:
        return h[a, 0] < h[b, 0]
    if h[a, 1] != h[b, 1]:
        return h[a, 1] < h[b, 1]
    return h[a, 2] < h[b, 2]


@njit(cache=True, nogil=True)
def _h_swap(h, a, b):
    """Swap entries a and b; returns b, where a's entry is now (the sift loops follow it)."""
    for c in range(3):
        t = h[a, c]
        h[a, c] = h[b, c]
        h[b, c] = t
    pin(h)
    return b


@njit(cache=True, nogil=True)
def _h_push(h, hs, ts, idx, kind):
    k = hs[0]
    h[k, 0], h[k, 1], h[k, 2] = ts, idx, kind
    hs[0] = k + 1
    while k > 0:
        up = (k - 1) >> 1
        if not _h_before(h, k, up):
            break
        k = _h_swap(h, k, up)
    pin(h)
    pin(hs)


@njit(cache=True, nogil=True)
def _h_pop(h, hs):
    ts, idx, kind = h[0, 0], h[0, 1], h[0, 2]
    n = hs[0] - 1
    hs[0] = n
    if n > 0:
        h[0, 0], h[0, 1], h[0, 2] = h[n, 0], h[n, 1], h[n, 2]
        k = 0
        while True:
            c = 2 * k + 1
            if c >= n:
                break
            if c + 1 < n and _h_before(h, c + 1, c):
                c += 1
            if not _h_before(h, c, k):
                break
            k = _h_swap(h, k, c)
    pin(h)
    pin(hs)
    return ts, idx, kind


@njit(cache=True, nogil=True)
def _unit(x):
    """A uint64 hash -> a float in (0, 1)."""
    return (np.float64(x >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def _schedule(p, h, hs, i, ts):
    """After packet ``i`` (sent at ``ts``): if it is a pure TCP SYN, schedule the server's SYN-ACK
    (share p[G_ANSWER], lognormal latency) or, unanswered, its retransmission after RTO_NS (share p[G_RETX])."""
    key = np.uint64(p[G_SEED]) * np.uint64(0x100000001B3) + np.uint64(i) * np.uint64(4)
    r2 = splitmix64(key + np.uint64(1))
    tcp = np.int64(r2 & np.uint64(0xFFFF)) < p[G_TCP]
    syn = np.int64((r2 >> np.uint64(32)) & np.uint64(0xFFFF)) < p[G_SYN]
    if not (tcp and syn):
        return
    r4 = splitmix64(key + np.uint64(3))
    r5 = splitmix64(r4 ^ np.uint64(0x5851F42D4C957F2D))
    if np.int64(r4 & np.uint64(0xFFFF)) < p[G_ANSWER]:
        z = np.sqrt(-2.0 * np.log(_unit(r5))) * np.cos(2.0 * np.pi * _unit(splitmix64(r5)))
        lat = np.float64(p[G_LAT_MED]) * np.exp(np.float64(p[G_LAT_SIG]) * 1e-6 * z)
        lat_ns = np.int64(min(max(lat, np.float64(LATENCY_MIN_NS)), np.float64(LATENCY_MAX_NS)))
        _h_push(h, hs, ts + lat_ns, i, K_SYNACK)
    elif np.int64((r4 >> np.uint64(16)) & np.uint64(0xFFFF)) < p[G_RETX]:
        _h_push(h, hs, ts + RTO_NS, i, K_RETX_SYN)
    pin(p)


@njit(cache=True, nogil=True)
def _after_answer(p, h, hs, i, ts):
    """After the SYN-ACK to packet ``i`` (sent at ``ts``): the server sends it again after RTO_NS
    (share p[G_DUP]; its client's ACK was lost)."""
    key = np.uint64(p[G_SEED]) * np.uint64(0x100000001B3) + np.uint64(i) * np.uint64(4)
    r4 = splitmix64(key + np.uint64(3))
    if np.int64((r4 >> np.uint64(48)) & np.uint64(0xFFFF)) < p[G_DUP]:
        _h_push(h, hs, ts + RTO_NS, i, K_DUP_SYNACK)
    pin(p)


@njit(cache=True, nogil=True)
def _next_packet(p, cdf, scratch, h, hs, i, have_next, next_ts):
    """Build the next packet into ``scratch``: the earliest scheduled answer due at or before the next
    ordinary packet ``i`` (at ``next_ts``; none if not ``have_next``), else packet ``i``.
    Returns (size, timestamp, 1 if packet i was consumed)."""
    if hs[0] > 0 and (not have_next or h[0, 0] <= next_ts):
        ts, idx, kind = _h_pop(h, hs)
        size, _ = build_packet(p, cdf, idx, kind, scratch)
        if kind == K_SYNACK:
            _after_answer(p, h, hs, idx, ts)
        return size, ts, 0
    size, _ = build_packet(p, cdf, i, 0, scratch)
    if p[G_REPLIES] != 0:
        _schedule(p, h, hs, i, next_ts)
    return size, next_ts, 1


@njit(cache=True, nogil=True)
def gen_push_kernel(
    gen: tuple, i0: int, n: int, flush: bool, t0: int, per_ns: float, st: np.ndarray, ring: RingArrays
) -> int:
    """Build packets i0 .. i0+n-1, and the answers due before each, into the ring; returns how many of
    the n were consumed. ``flush``: then also every answer still scheduled (the end of a finite run).
    ``gen`` = ``(p, cdf, scratch, h, hs)``: the generator's parameters and size CDF, the packet being
    built, and the heap of scheduled answers with its size ``hs[0]`` (both kernels take it whole).

    With p[G_WAIT] the kernel stops early at a full ring (the caller waits and resumes there);
    otherwise a full ring drops the packet and counts it, like a live source. ``h`` must have room for
    hs[0] + n entries (each ordinary packet schedules at most one).
    """
    p, cdf, scratch, h, hs = gen
    ifidx = p[G_IFIDX]
    wait = p[G_WAIT] != 0
    replies = p[G_REPLIES] != 0
    nread = npushed = ndrops = nbytes = np.int64(0)
    j = 0
    while j < n or (replies and flush and hs[0] > 0):
        if wait and ring_full(ring):
            break
        if not replies:  # no answers (the default): the ordinary packets only, no heap
            size, _ = build_packet(p, cdf, i0 + j, 0, scratch)
            ts, used = _packet_ts(p, i0 + j, t0, per_ns), 1
        else:
            have = j < n
            nts = _packet_ts(p, i0 + j, t0, per_ns) if have else np.int64(0)
            size, ts, used = _next_packet(p, cdf, scratch, h, hs, i0 + j, have, nts)
        j += used
        nread += 1
        if ring_push(ring, scratch, 0, size, size, ts, ifidx):
            npushed += 1
            nbytes += size
        else:
            ndrops += 1
    count_frames(st, nread, npushed, ndrops, nbytes)
    return j


@njit(cache=True, nogil=True)
def gen_array_kernel(gen: tuple, i0: int, n: int, flush: bool, rows: tuple) -> tuple[int, int]:
    """:func:`gen_push_kernel` into ``rows`` = ``(out, caplen, wirelen, ts)`` (synthetic timestamps) until
    ``out`` is full; returns (ordinary packets consumed, rows written)."""
    p, cdf, scratch, h, hs = gen
    out, caplen, wirelen, ts = rows
    snap = out.shape[1]
    j = 0
    w = 0
    if p[G_REPLIES] == 0:  # no answers (the default): packet i is row i - i0
        for j in range(min(n, out.shape[0])):
            size, _ = build_packet(p, cdf, i0 + j, 0, scratch)
            k = size if size < snap else snap
            for m in range(k):
                out[j, m] = scratch[m]
            caplen[j] = k
            wirelen[j] = size
            ts[j] = _packet_ts(p, i0 + j, 0, 0.0)
        w = min(n, out.shape[0])
        return w, w
    while w < out.shape[0] and (j < n or (flush and hs[0] > 0)):
        have = j < n
        nts = _packet_ts(p, i0 + j, 0, 0.0) if have else np.int64(0)
        size, t, used = _next_packet(p, cdf, scratch, h, hs, i0 + j, have, nts)
        j += used
        k = size if size < snap else snap
        for m in range(k):
            out[w, m] = scratch[m]
        caplen[w] = k
        wirelen[w] = size
        ts[w] = t
        w += 1
    return j, w
