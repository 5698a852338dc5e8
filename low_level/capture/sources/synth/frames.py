"""The generator's Numba frame builder: packet i of a parameter vector, as valid Ethernet/IP bytes.

Every field is a hash of ``(seed, i)`` (splitmix64), so a frame is the same however the run is chunked.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.capture.sources.synth.model import (
    CLOCK_SYNTHETIC,
    ETH_DST_NB,
    G_CLOCK,
    G_GROUPS,
    G_PPS,
    G_SEED,
    G_SIZE_HI,
    G_SIZE_LO,
    G_SKEW,
    G_SNAP,
    G_START,
    G_SYN,
    G_TCP,
    G_UDP,
    G_V6,
    G_ZIPF,
    K_DUP_SYNACK,
    K_SYNACK,
    PROTO_ICMP,
    PROTO_TCP,
    PROTO_UDP,
    group_tuple_nb,
)
from low_level.jit.refcount import pin
from low_level.jit.splitmix import splitmix64


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
    r1 = splitmix64(key)
    r2 = splitmix64(key + np.uint64(1))
    r3 = splitmix64(key + np.uint64(2))
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
        r4 = splitmix64(key + np.uint64(3))
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
