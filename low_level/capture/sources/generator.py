"""Synthetic traffic: valid Ethernet/IPv4/IPv6 TCP/UDP/ICMP frames built by Numba straight into a ring.

Why: benchmarks and end-to-end tests need traffic whose aggregates are known in advance, at rates no
capture file or NIC on a developer machine gives. Every packet is a pure function of
``(seed, packet index)`` (a counter-based splitmix64 hash), so :func:`generate_frames` and a
:class:`GeneratorSource` with the same parameters produce the same frames, however they are chunked.

Traffic model. Packet ``i`` belongs to group ``g`` (uniform over ``groups``, or Zipf-skewed with
exponent ``zipf`` so that group 0 is the most popular). A group fixes the source address, the
destination address and the destination port, see :func:`group_tuple`; the protocol (``proto_mix``),
the size (uniform in ``sizes``), the SYN flag (``syn_fraction`` of TCP packets are pure SYNs, the rest
PSH|ACK), IPv4 vs IPv6 (``ipv6_fraction``) and the source port (random, >= 1024) are drawn per packet.
ICMP packets (echo requests; ICMPv6 for IPv6) carry no ports. Payload bytes are zero, and the IP, TCP,
UDP and ICMP checksums are correct for the whole frame of the chosen size. Only the first
``ring.snaplen`` bytes are written; the wire length is the chosen size (at least the headers' size).

The server side (opt-in, off by default so other runs' packets do not change): with ``synack_fraction``
> 0 that share of the pure SYNs is answered by a SYN-ACK (server -> client: addresses and ports swapped,
ack = the SYN's seq + 1) after a lognormal latency (median ``synack_latency_ms``, log-sd
``synack_latency_sigma``, clipped to 10 us .. 60 s); ``synack_duplicate_fraction`` of the SYN-ACKs are
sent again after 1 s (RFC 6298's initial RTO), and ``syn_retransmit_fraction`` of the unanswered SYNs
are retransmitted (same bytes) after 1 s. Each decision is a hash of ``(seed, index)``; the answers are
kept on a heap and go out in timestamp order between the ordinary packets, so a host's timestamps stay
non-decreasing. A finite run (``count``) ends by sending the answers still scheduled.

Timestamps: ``clock="synthetic"`` spaces packets ``1/synthetic_pps`` s apart from ``start_ns``,
independent of real time (``live_clock`` False); ``clock="wall"`` stamps them with the wall clock (the
scheduled send time when ``rate`` is set). ``skew_ns`` is added to every timestamp, to emulate a host
whose clock or link lags.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from low_level.capture.ring import DEFAULT_SNAPLEN, HEAD, TAIL, Ring, ring_push
from low_level.capture.sources.base import ST_BYTES, ST_DROPS, ST_PUSHED, ST_READ, Backoff, Source
from low_level.jit.refcount import pin

MAX_GROUPS = 1 << 24
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000  # 2023-11-14T22:13:20Z: synthetic runs are reproducible
DST_PORTS = np.array(
    [80, 443, 53, 22, 25, 123, 161, 3306, 5432, 6379, 8080, 8443, 9092, 11211, 27017, 993], dtype=np.int64
)
ETH_DST = bytes.fromhex("020000000002")  # a locally administered "gateway" MAC
ETH_DST_NB = np.frombuffer(ETH_DST, dtype=np.uint8).copy()
CHUNK = 8192

# int64 parameter vector of the kernels
(G_SEED, G_GROUPS, G_ZIPF, G_SIZE_LO, G_SIZE_HI, G_TCP, G_UDP, G_SYN, G_V6, G_IFIDX, G_SNAP, G_CLOCK,
 G_START, G_PPS, G_SKEW, G_WAIT, G_REPLIES, G_ANSWER, G_LAT_MED, G_LAT_SIG, G_RETX, G_DUP) = range(22)
NG = 22
CLOCK_SYNTHETIC, CLOCK_GIVEN = 0, 1
# what a scheduled packet is (column 2 of the reply heap); 0 is an ordinary packet
K_SYNACK, K_DUP_SYNACK, K_RETX_SYN = 1, 2, 3
RTO_NS = 1_000_000_000  # RFC 6298's initial retransmission timeout: a lost SYN / SYN-ACK is sent again after 1 s
LATENCY_MIN_NS, LATENCY_MAX_NS = 10_000, 60_000_000_000  # the lognormal latency, clipped to 10 us .. 60 s

PROTO_TCP, PROTO_UDP, PROTO_ICMP = 6, 17, 1


# ---------------------------------------------------------------------------------------------------
# groups


@njit(cache=True, nogil=True)
def group_tuple_nb(g: int) -> tuple[int, int, int]:
    """Numba twin of :func:`group_tuple`: (src IPv4 as uint32, dst IPv4 as uint32, dst port)."""
    g = np.int64(g)
    h = (g * np.int64(2654435761)) & np.int64(0xFFFFFFFF)
    src = np.int64(0x0A000000) | (g & np.int64(0xFFFFFF))
    dst = np.int64(0xAC100000) | (h & np.int64(0xFFFFF))
    port = DST_PORTS[(h >> 20) & 15]
    return src, dst, port


def group_tuple(g: int, ipv6: bool = False) -> tuple[str, str, int]:
    """The (src_ip, dst_ip, dst_port) of group ``g``: src = 10.0.0.0 + g, dst in 172.16.0.0/12.

    IPv6 packets of the group use ``fd00:a::<src as uint32>`` and ``fd00:ac10::<dst low 20 bits>``.
    """
    if not 0 <= g < MAX_GROUPS:
        raise ValueError(f"group {g} out of range [0, {MAX_GROUPS})")
    src, dst, port = group_tuple_nb(g)
    if ipv6:
        s6 = ipaddress.IPv6Address((0xFD00000A << 96) | int(src))
        d6 = ipaddress.IPv6Address((0xFD00AC10 << 96) | (int(dst) & 0xFFFFF))
        return str(s6), str(d6), int(port)
    return str(ipaddress.IPv4Address(int(src))), str(ipaddress.IPv4Address(int(dst))), int(port)


# ---------------------------------------------------------------------------------------------------
# Numba frame builder


@njit(cache=True, nogil=True, inline="always")
def _mix64(x):
    """splitmix64 finaliser: a good 64-bit hash of a counter (uint64 in, uint64 out)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _w16(b, o, v):
    b[o] = (v >> 8) & 0xFF
    b[o + 1] = v & 0xFF
    pin(b)


@njit(cache=True, nogil=True)
def _w32(b, o, v):
    b[o] = (v >> 24) & 0xFF
    b[o + 1] = (v >> 16) & 0xFF
    b[o + 2] = (v >> 8) & 0xFF
    b[o + 3] = v & 0xFF
    pin(b)


@njit(cache=True, nogil=True)
def _sum16(b, o, n):
    """Sum of the big-endian 16-bit words of b[o:o+n] (n even), not folded."""
    s = np.int64(0)
    for k in range(0, n, 2):
        s += (np.int64(b[o + k]) << 8) | np.int64(b[o + k + 1])
    pin(b)
    return s


@njit(cache=True, nogil=True, inline="always")
def _fold(s):
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


@njit(cache=True, nogil=True)
def _packet_ts(p, i, t0, per_ns):
    if p[G_CLOCK] == CLOCK_SYNTHETIC:
        pps = p[G_PPS]
        return p[G_START] + (i // pps) * 1_000_000_000 + ((i % pps) * 1_000_000_000) // pps + p[G_SKEW]
    return t0 + np.int64(per_ns * (i - p[G_START])) + p[G_SKEW]


@njit(cache=True, nogil=True)
def build_frame(p: np.ndarray, cdf: np.ndarray, i: int, b: np.ndarray) -> tuple[int, int]:
    """Write packet ``i``'s headers (and zero payload up to p[G_SNAP] bytes) into ``b``; returns
    (wire length, header length). ``b`` must hold max(p[G_SNAP], 128) bytes."""
    return build_packet(p, cdf, i, 0, b)


@njit(cache=True, nogil=True)
def build_packet(p: np.ndarray, cdf: np.ndarray, i: int, kind: int, b: np.ndarray) -> tuple[int, int]:
    """:func:`build_frame` for packet ``i`` (kind 0 or K_RETX_SYN: the same bytes) or for the server's
    answer to it (K_SYNACK, K_DUP_SYNACK): addresses and ports swapped, flags SYN|ACK, ack = the SYN's
    seq + 1, the server's own initial seq."""
    seed = np.uint64(p[G_SEED])
    key = seed * np.uint64(0x100000001B3) + np.uint64(i) * np.uint64(4)
    r1 = _mix64(key)
    r2 = _mix64(key + np.uint64(1))
    r3 = _mix64(key + np.uint64(2))
    ngroups = p[G_GROUPS]
    if p[G_ZIPF] != 0:
        u = np.float64(r1 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        g = np.int64(np.searchsorted(cdf, u, side="right"))
        if g >= ngroups:
            g = ngroups - 1
    else:
        g = np.int64(r1 % np.uint64(ngroups))
    x = np.int64(r2 & np.uint64(0xFFFF))
    proto = PROTO_TCP if x < p[G_TCP] else (PROTO_UDP if x < p[G_UDP] else PROTO_ICMP)
    span = p[G_SIZE_HI] - p[G_SIZE_LO] + 1
    size = p[G_SIZE_LO] + ((np.int64((r2 >> np.uint64(16)) & np.uint64(0xFFFF)) * span) >> 16)
    syn = np.int64((r2 >> np.uint64(32)) & np.uint64(0xFFFF)) < p[G_SYN]
    v6 = np.int64((r2 >> np.uint64(48)) & np.uint64(0xFFFF)) < p[G_V6]
    sport = 1024 + np.int64((r3 & np.uint64(0xFFFF)) % np.uint64(64512))
    ipid = np.int64((r3 >> np.uint64(16)) & np.uint64(0xFFFF))
    seq = np.int64((r3 >> np.uint64(32)) & np.uint64(0xFFFFFFFF))
    src, dst, dport = group_tuple_nb(g)
    # IPv6 addresses: fixed high words (client fd00:a::/96, server fd00:ac10::/96) + the low word
    src_hi, src_lo, dst_hi, dst_lo = np.int64(0xFD00000A), src, np.int64(0xFD00AC10), dst & 0xFFFFF
    flags = 0x02 if syn else 0x18
    ack = 0 if syn else (seq ^ 0x5A5A5A5A)
    if kind == K_SYNACK or kind == K_DUP_SYNACK:  # the server answers: swapped ends, its own seq
        r4 = _mix64(key + np.uint64(3))
        src, dst = dst, src
        src_hi, src_lo, dst_hi, dst_lo = dst_hi, dst_lo, src_hi, src_lo
        sport, dport = dport, sport
        ack = (seq + 1) & 0xFFFFFFFF
        seq = np.int64((r4 >> np.uint64(32)) & np.uint64(0xFFFFFFFF))
        ipid = np.int64(r4 & np.uint64(0xFFFF))
        flags = 0x12

    l4h = 20 if proto == PROTO_TCP else 8
    iph = 40 if v6 else 20
    hdr = 14 + iph + l4h
    if size < hdr:
        size = hdr
    l4len = size - 14 - iph

    # Ethernet
    for k in range(6):
        b[k] = ETH_DST_NB[k]
    b[6] = 0x02
    b[7] = 0x00
    _w32(b, 8, src)
    _w16(b, 12, 0x86DD if v6 else 0x0800)
    o = 14
    l4proto = proto
    if v6:
        if proto == PROTO_ICMP:
            l4proto = 58
        _w32(b, o, 0x60000000)
        _w16(b, o + 4, l4len)
        b[o + 6] = l4proto
        b[o + 7] = 64
        _w32(b, o + 8, src_hi)
        for k in range(8):
            b[o + 12 + k] = 0
        _w32(b, o + 20, src_lo)
        _w32(b, o + 24, dst_hi)
        for k in range(8):
            b[o + 28 + k] = 0
        _w32(b, o + 36, dst_lo)
        pseudo = _sum16(b, o + 8, 32) + l4len + l4proto
    else:
        b[o] = 0x45
        b[o + 1] = 0
        _w16(b, o + 2, size - 14)
        _w16(b, o + 4, ipid)
        _w16(b, o + 6, 0x4000)
        b[o + 8] = 64
        b[o + 9] = proto
        _w16(b, o + 10, 0)
        _w32(b, o + 12, src)
        _w32(b, o + 16, dst)
        _w16(b, o + 10, _fold(_sum16(b, o, 20)))
        pseudo = _sum16(b, o + 12, 8) + l4len + proto
    o += iph
    if proto == PROTO_TCP:
        _w16(b, o, sport)
        _w16(b, o + 2, dport)
        _w32(b, o + 4, seq)
        _w32(b, o + 8, ack)
        b[o + 12] = 0x50
        b[o + 13] = flags
        _w16(b, o + 14, 65535)
        _w16(b, o + 16, 0)
        _w16(b, o + 18, 0)
        _w16(b, o + 16, _fold(pseudo + _sum16(b, o, 20)))
    elif proto == PROTO_UDP:
        _w16(b, o, sport)
        _w16(b, o + 2, dport)
        _w16(b, o + 4, l4len)
        _w16(b, o + 6, 0)
        c = _fold(pseudo + _sum16(b, o, 8))
        _w16(b, o + 6, 0xFFFF if c == 0 else c)
    else:
        b[o] = 128 if v6 else 8  # echo request
        b[o + 1] = 0
        _w16(b, o + 2, 0)
        _w16(b, o + 4, sport)  # identifier
        _w16(b, o + 6, ipid)  # sequence
        s = _sum16(b, o, 8)
        if v6:
            s += pseudo
        _w16(b, o + 2, _fold(s))
    lim = size if size < p[G_SNAP] else p[G_SNAP]
    for k in range(hdr, lim):
        b[k] = 0
    pin(p)
    pin(cdf)
    pin(b)
    return size, hdr


# ---------------------------------------------------------------------------------------------------
# answers: SYN-ACKs, duplicate SYN-ACKs and retransmitted SYNs, scheduled on a heap by timestamp


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
    for c in range(3):
        t = h[a, c]
        h[a, c] = h[b, c]
        h[b, c] = t
    pin(h)


@njit(cache=True, nogil=True)
def _h_push(h, hs, ts, idx, kind):
    k = hs[0]
    h[k, 0], h[k, 1], h[k, 2] = ts, idx, kind
    hs[0] = k + 1
    while k > 0:
        up = (k - 1) >> 1
        if not _h_before(h, k, up):
            break
        _h_swap(h, k, up)
        k = up
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
            _h_swap(h, k, c)
            k = c
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
    r2 = _mix64(key + np.uint64(1))
    tcp = np.int64(r2 & np.uint64(0xFFFF)) < p[G_TCP]
    syn = np.int64((r2 >> np.uint64(32)) & np.uint64(0xFFFF)) < p[G_SYN]
    if not (tcp and syn):
        return
    r4 = _mix64(key + np.uint64(3))
    r5 = _mix64(r4 ^ np.uint64(0x5851F42D4C957F2D))
    if np.int64(r4 & np.uint64(0xFFFF)) < p[G_ANSWER]:
        z = np.sqrt(-2.0 * np.log(_unit(r5))) * np.cos(2.0 * np.pi * _unit(_mix64(r5)))
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
    r4 = _mix64(key + np.uint64(3))
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
def gen_push_kernel(p: np.ndarray, cdf: np.ndarray, scratch: np.ndarray, h: np.ndarray, hs: np.ndarray, i0: int,
                    n: int, flush: bool, t0: int, per_ns: float, st: np.ndarray, frames: np.ndarray, snaplen: int,
                    caplen: np.ndarray, wirelen: np.ndarray, tss: np.ndarray, iface: np.ndarray,
                    ctr: np.ndarray) -> int:
    """Build packets i0 .. i0+n-1, and the answers due before each, into the ring; returns how many of
    the n were consumed. ``flush``: then also every answer still scheduled (the end of a finite run).

    With p[G_WAIT] the kernel stops early at a full ring (the caller waits and resumes there);
    otherwise a full ring drops the packet and counts it, like a live source. ``h`` must have room for
    hs[0] + n entries (each ordinary packet schedules at most one).
    """
    nslots = caplen.shape[0]
    ifidx = p[G_IFIDX]
    wait = p[G_WAIT] != 0
    nread = npushed = ndrops = nbytes = np.int64(0)
    j = 0
    while p[G_REPLIES] == 0 and j < n:  # no answers (the default): the ordinary packets only, no heap
        if wait and ctr[HEAD] - ctr[TAIL] >= nslots:
            break
        i = i0 + j
        size, _ = build_packet(p, cdf, i, 0, scratch)
        if ring_push(frames, snaplen, caplen, wirelen, tss, iface, ctr, scratch, 0, size, size,
                     _packet_ts(p, i, t0, per_ns), ifidx):
            npushed += 1
            nbytes += size
        else:
            ndrops += 1
        j += 1
        nread += 1
    while p[G_REPLIES] != 0 and (j < n or (flush and hs[0] > 0)):
        if wait and ctr[HEAD] - ctr[TAIL] >= nslots:
            break
        have = j < n
        nts = _packet_ts(p, i0 + j, t0, per_ns) if have else np.int64(0)
        size, ts, used = _next_packet(p, cdf, scratch, h, hs, i0 + j, have, nts)
        j += used
        nread += 1
        if ring_push(frames, snaplen, caplen, wirelen, tss, iface, ctr, scratch, 0, size, size, ts, ifidx):
            npushed += 1
            nbytes += size
        else:
            ndrops += 1
    st[ST_READ] += nread
    st[ST_PUSHED] += npushed
    st[ST_DROPS] += ndrops
    st[ST_BYTES] += nbytes
    return j


@njit(cache=True, nogil=True)
def gen_array_kernel(p: np.ndarray, cdf: np.ndarray, scratch: np.ndarray, h: np.ndarray, hs: np.ndarray, i0: int,
                     n: int, flush: bool, out: np.ndarray, caplen: np.ndarray, wirelen: np.ndarray,
                     ts: np.ndarray) -> tuple[int, int]:
    """:func:`gen_push_kernel` into the rows of ``out`` (synthetic timestamps) until it is full;
    returns (ordinary packets consumed, rows written)."""
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


# ---------------------------------------------------------------------------------------------------
# parameters


def _params(
    groups: int,
    seed: int,
    snaplen: int,
    zipf: float,
    sizes: tuple[int, int],
    proto_mix: Mapping[str, float],
    syn_fraction: float,
    ipv6_fraction: float,
    start_ns: int,
    synthetic_pps: int,
    skew_ns: int,
    answers: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    if not 1 <= int(groups) <= MAX_GROUPS:
        raise ValueError(f"groups must be in [1, {MAX_GROUPS}], not {groups!r}")
    lo, hi = (int(v) for v in sizes)
    if not 14 <= lo <= hi <= 65535:
        raise ValueError(f"sizes must be (lo, hi) with 14 <= lo <= hi <= 65535, not {sizes!r}")
    unknown = set(proto_mix) - {"tcp", "udp", "icmp"}
    if unknown:
        raise ValueError(f"proto_mix: unknown protocols {sorted(unknown)} (use tcp, udp, icmp)")
    weights = [float(proto_mix.get(k, 0.0)) for k in ("tcp", "udp", "icmp")]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"proto_mix weights must be >= 0 with a positive sum, not {dict(proto_mix)!r}")
    for name, frac in (("syn_fraction", syn_fraction), ("ipv6_fraction", ipv6_fraction)):
        if not 0.0 <= float(frac) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], not {frac!r}")
    if not zipf >= 0:
        raise ValueError(f"zipf must be >= 0, not {zipf!r}")
    if int(synthetic_pps) <= 0:
        raise ValueError(f"synthetic_pps must be > 0, not {synthetic_pps!r}")
    total = sum(weights)
    p = np.zeros(NG, dtype=np.int64)
    p[G_SEED] = int(seed) & 0x7FFF_FFFF_FFFF_FFFF
    p[G_GROUPS] = int(groups)
    p[G_ZIPF] = zipf > 0
    p[G_SIZE_LO], p[G_SIZE_HI] = lo, hi
    p[G_TCP] = round(65536 * weights[0] / total)
    p[G_UDP] = round(65536 * (weights[0] + weights[1]) / total)
    p[G_SYN] = round(65536 * float(syn_fraction))
    p[G_V6] = round(65536 * float(ipv6_fraction))
    p[G_SNAP] = int(snaplen)
    p[G_CLOCK] = CLOCK_SYNTHETIC
    p[G_START] = int(start_ns)
    p[G_PPS] = int(synthetic_pps)
    p[G_SKEW] = int(skew_ns)
    _answer_params(p, dict(answers or {}))
    if zipf > 0:
        w = 1.0 / np.arange(1, int(groups) + 1, dtype=np.float64) ** float(zipf)
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
    else:
        cdf = np.zeros(1, dtype=np.float64)
    return p, cdf


_DEFAULT_MIX = {"tcp": 0.8, "udp": 0.15, "icmp": 0.05}
ANSWER_DEFAULTS = {"synack_fraction": 0.0, "synack_latency_ms": 20.0, "synack_latency_sigma": 0.8,
                   "syn_retransmit_fraction": 0.0, "synack_duplicate_fraction": 0.0}


def _answer_params(p: np.ndarray, answers: dict[str, float]) -> None:
    """The server side of the SYNs (:data:`ANSWER_DEFAULTS`): off unless a fraction is > 0, so the
    packets of a run without them are exactly those of earlier versions."""
    unknown = set(answers) - set(ANSWER_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown answer option(s) {sorted(unknown)}; known: {sorted(ANSWER_DEFAULTS)}")
    a = {**ANSWER_DEFAULTS, **answers}
    for name in ("synack_fraction", "syn_retransmit_fraction", "synack_duplicate_fraction"):
        if not 0.0 <= float(a[name]) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], not {a[name]!r}")
    if not 0.0 < float(a["synack_latency_ms"]) <= 10_000.0:
        raise ValueError(f"synack_latency_ms (the median latency) must be in (0, 10000], not {a['synack_latency_ms']!r}")
    if not 0.0 <= float(a["synack_latency_sigma"]) <= 5.0:
        raise ValueError(f"synack_latency_sigma must be in [0, 5], not {a['synack_latency_sigma']!r}")
    p[G_ANSWER] = round(65536 * float(a["synack_fraction"]))
    p[G_RETX] = round(65536 * float(a["syn_retransmit_fraction"]))
    p[G_DUP] = round(65536 * float(a["synack_duplicate_fraction"]))
    p[G_LAT_MED] = round(float(a["synack_latency_ms"]) * 1e6)
    p[G_LAT_SIG] = round(float(a["synack_latency_sigma"]) * 1e6)
    p[G_REPLIES] = p[G_ANSWER] > 0 or p[G_RETX] > 0


def generate_frames(
    n: int,
    groups: int = 65536,
    seed: int = 1,
    snaplen: int = DEFAULT_SNAPLEN,
    *,
    zipf: float = 0.0,
    sizes: tuple[int, int] = (64, 1500),
    proto_mix: Mapping[str, float] | None = None,
    syn_fraction: float = 0.1,
    ipv6_fraction: float = 0.0,
    start_ns: int = DEFAULT_START_NS,
    synthetic_pps: int = 1_000_000,
    skew_ns: int = 0,
    start_index: int = 0,
    **answers: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Packets ``start_index .. start_index+n-1`` as arrays, without a ring or a thread.

    Returns ``(frames uint8[rows, snaplen], caplen, wirelen, ts)``, identical to what a synthetic-clock
    :class:`GeneratorSource` with the same parameters and ``count=n`` pushes. For benchmarks and tests.
    ``answers`` (:data:`ANSWER_DEFAULTS`, off by default): the SYN-ACKs, retransmitted SYNs and duplicate
    SYN-ACKs are extra rows, in timestamp order among the n packets, all of them (rows >= n).
    """
    p, cdf = _params(groups, seed, snaplen, zipf, sizes, proto_mix or _DEFAULT_MIX, syn_fraction,
                     ipv6_fraction, start_ns, synthetic_pps, skew_ns, answers)
    scratch = np.zeros(max(snaplen, 128), dtype=np.uint8)
    heap = np.zeros((n + 1, 3), dtype=np.int64)  # each ordinary packet schedules at most one answer
    hs = np.zeros(1, dtype=np.int64)
    parts = []
    done = 0
    while True:
        rows = n if not p[G_REPLIES] else min(max(n - done, 0) + 1024, 4 * CHUNK)  # with answers: in chunks
        out = (np.zeros((rows, snaplen), dtype=np.uint8), np.zeros(rows, dtype=np.int64),
               np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64))
        used, w = gen_array_kernel(p, cdf, scratch, heap, hs, int(start_index) + done, n - done, True, *out)
        done += int(used)
        parts.append(tuple(a[:w] for a in out))
        if done >= n and hs[0] == 0:
            break
    if len(parts) == 1:
        return parts[0]
    frames, caplen, wirelen, ts = (np.concatenate([part[k] for part in parts]) for k in range(4))
    return frames, caplen, wirelen, ts


class GeneratorSource(Source):
    """Pushes synthetic packets into a ring (traffic model in the module docstring).

    ``rate`` None: as fast as the ring accepts, waiting when it is full (nothing is lost). With a rate
    (packets/s) packets are released on schedule and dropped+counted when the ring is full, like a
    live source. ``count`` None runs until stop(); otherwise the source finishes after ``count`` packets.
    """

    kind = "generator"

    def __init__(
        self,
        ring: Ring,
        groups: int = 65536,
        rate: float | None = None,
        count: int | None = None,
        clock: str = "wall",
        start_ns: int | None = None,
        synthetic_pps: int = 1_000_000,
        skew_ns: int = 0,
        zipf: float = 0.0,
        sizes: tuple[int, int] = (64, 1500),
        proto_mix: Mapping[str, float] | None = None,
        syn_fraction: float = 0.1,
        seed: int = 1,
        ipv6_fraction: float = 0.0,
        iface_index: int = 0,
        synack_fraction: float = 0.0,
        synack_latency_ms: float = 20.0,
        synack_latency_sigma: float = 0.8,
        syn_retransmit_fraction: float = 0.0,
        synack_duplicate_fraction: float = 0.0,
    ) -> None:
        super().__init__(ring, ["generator"])
        if clock not in ("wall", "synthetic"):
            raise ValueError(f"generator clock must be 'wall' or 'synthetic', not {clock!r}")
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"generator rate must be a positive number of packets/s or None, not {rate!r}")
        if count is not None and int(count) < 0:
            raise ValueError(f"generator count must be >= 0 or None, not {count!r}")
        self.groups = int(groups)
        self.rate = None if rate is None else float(rate)
        self.count = None if count is None else int(count)
        self.clock = clock
        self.live_clock = clock == "wall"
        self.seed = int(seed)
        self._p, self._cdf = _params(groups, seed, ring.snaplen, zipf, sizes, proto_mix or _DEFAULT_MIX,
                                     syn_fraction, ipv6_fraction,
                                     DEFAULT_START_NS if start_ns is None else start_ns, synthetic_pps, skew_ns,
                                     {"synack_fraction": synack_fraction, "synack_latency_ms": synack_latency_ms,
                                      "synack_latency_sigma": synack_latency_sigma,
                                      "syn_retransmit_fraction": syn_retransmit_fraction,
                                      "synack_duplicate_fraction": synack_duplicate_fraction})
        self.synack_fraction = float(synack_fraction)
        self._p[G_IFIDX] = int(iface_index)
        self._p[G_WAIT] = self.rate is None
        if clock == "wall":
            self._p[G_CLOCK] = CLOCK_GIVEN
            self._p[G_START] = 0  # the packet index the wall-clock interpolation starts from (per chunk)
        self._scratch = np.zeros(max(ring.snaplen, 128), dtype=np.uint8)
        self._next = 0  # index of the next packet to build
        self._heap = np.zeros((CHUNK + 1, 3), dtype=np.int64)  # answers scheduled: (ts, packet index, kind)
        self._heap_n = np.zeros(1, dtype=np.int64)

    def _push(self, n: int, t0: int, per_ns: float, flush: bool = False) -> int:
        p = self._p
        if p[G_CLOCK] == CLOCK_GIVEN:
            p[G_START] = self._next
        need = int(self._heap_n[0]) + n + 1
        if need > len(self._heap):  # each ordinary packet schedules at most one answer
            grown = np.zeros((max(need, 2 * len(self._heap)), 3), dtype=np.int64)
            grown[: len(self._heap)] = self._heap
            self._heap = grown
        done = int(gen_push_kernel(p, self._cdf, self._scratch, self._heap, self._heap_n, self._next, n, flush, t0,
                                   per_ns, self._st, *self.ring.arrays()))
        self._next += done
        return done

    def _flush_answers(self) -> None:
        """A finite run's end: the answers still scheduled go out (their own timestamps), as
        :func:`generate_frames` has them."""
        backoff = Backoff()
        while self._heap_n[0] > 0 and not self._stop_evt.is_set():
            before = int(self._st[ST_READ])
            self._push(0, 0, 0.0, flush=True)
            if int(self._st[ST_READ]) == before:
                backoff.wait()
            else:
                backoff.reset()

    def _left(self) -> int:
        return CHUNK if self.count is None else min(CHUNK, self.count - self._next)

    def _run(self) -> None:
        if self.rate is None:
            self._run_fast()
        else:
            self._run_rate()
        if self.count is not None and self._next >= self.count:
            self._flush_answers()
            self._finished = bool(self._heap_n[0] == 0)

    def _run_fast(self) -> None:
        backoff = Backoff()
        per_ns = 0.0
        last_ts = -1
        prev_now, prev_n = 0, 0
        while not self._stop_evt.is_set():
            n = self._left()
            if n <= 0:
                return
            now = time.time_ns()
            if prev_n:  # spread a chunk's wall timestamps at the rate the previous chunk ran
                per_ns = min((now - prev_now) / prev_n, 1e9 / CHUNK)
            t0 = max(now, last_ts + 1)
            done = self._push(n, t0, per_ns)
            if done:
                backoff.reset()
                last_ts = t0 + int(per_ns * (done - 1))
                prev_now, prev_n = now, done
            else:
                backoff.wait()
                prev_n = 0

    def _run_rate(self) -> None:
        assert self.rate is not None
        rate = self.rate
        per_ns = 1e9 / rate
        start_mono = time.monotonic_ns()
        start_wall = time.time_ns()
        while not self._stop_evt.is_set():
            left = self._left()
            if left <= 0:
                return
            due = int((time.monotonic_ns() - start_mono) * rate / 1e9) + 1
            n = min(due - self._next, left)
            if n <= 0:
                wait = (start_mono + self._next * per_ns - time.monotonic_ns()) / 1e9
                self._stop_evt.wait(min(max(wait, 0.0), 0.01))
                continue
            self._push(n, start_wall + int(self._next * per_ns), per_ns)

    def stats(self) -> dict[str, Any]:
        """Base counters plus the configuration that shapes the traffic."""
        d = super().stats()
        d.update(groups=self.groups, rate=self.rate, count=self.count, clock=self.clock, seed=self.seed,
                 synack_fraction=self.synack_fraction)
        return d
