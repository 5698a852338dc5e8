"""Test traffic: packet descriptions as numpy columns, raw Ethernet/IPv4/IPv6 frames built from them,
and the exact offline aggregate (the oracle) computed from the descriptions, never from our parser.

The oracle itself is :func:`lowwater_testing.oracle.pane_oracle`, the one reference of the suite: the
emulated hosts of the high-level tests derive their partials from the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import fields as F
from contract import query as Q
from lowwater_testing.oracle import aggregate, pane_oracle

NS = 1_000_000_000
T0 = 1_700_000_000 * NS  # the data time the tests start at (2023-11-14)
SNAP = 64  # IPv4 frames
SNAP6 = 80  # frames of traffic with IPv6 (Ethernet 14 + IPv6 40 + TCP 20 = 74 bytes of headers)


@dataclass
class Traffic:
    ts: np.ndarray  # int64 ns
    src: np.ndarray  # uint32 IPv4
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    proto: np.ndarray  # 6 or 17, or ICMP (1; 58 for IPv6) whose type/code are sport's two bytes
    flags: np.ndarray  # tcp flags
    length: np.ndarray  # wire length
    ttl: np.ndarray
    tos: np.ndarray | None = None  # IPv4 TOS / IPv6 traffic class; None = all 0
    v6: np.ndarray | None = None  # bool: an IPv6 packet, addresses in src6/dst6; None = all IPv4
    src6: np.ndarray | None = None  # int64 (n, 2) words (hi, lo), used where v6
    dst6: np.ndarray | None = None
    src_mac: np.ndarray | None = None  # int64 48-bit; None = 02:00:00:00:00:02 for all
    dst_mac: np.ndarray | None = None  # None = 02:00:00:00:00:01 for all
    window: np.ndarray | None = None  # TCP window; None = 0 for all
    gre: np.ndarray | None = None  # bool: GRE (proto must be 47) carrying an IPv4 header with inner_src/dst
    inner_src: np.ndarray | None = None  # uint32 IPv4, used where gre
    inner_dst: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray) -> Traffic:
        cols = (getattr(self, f) for f in self.__dataclass_fields__)
        return Traffic(*(None if c is None else c[idx] for c in cols))

    @property
    def has_v6(self) -> bool:
        return self.v6 is not None and bool(self.v6.any())

    def rows(self) -> np.ndarray:
        """Parsed-packet rows as the contract defines them (for the oracle and filter checks)."""
        n = len(self)
        r = np.zeros((n, F.NFIELDS), dtype=np.int64)
        r[:, F.TS] = self.ts
        r[:, F.IPVER] = 4
        r[:, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | self.src.astype(np.int64)
        r[:, F.DST_LO] = F.IPV4_MAPPED_PREFIX | self.dst.astype(np.int64)
        icmp = (self.proto == 1) | (self.proto == 58)
        tcp = self.proto == 6
        r[:, F.SPORT] = np.where(icmp, 0, self.sport)
        r[:, F.DPORT] = np.where(icmp, 0, self.dport)
        r[:, F.ICMP_TYPE] = np.where(icmp, self.sport >> 8, -1)
        r[:, F.ICMP_CODE] = np.where(icmp, self.sport & 0xFF, -1)
        r[:, F.PROTO] = self.proto
        r[:, F.LEN] = self.length
        r[:, F.TCP_FLAGS] = np.where(tcp, self.flags, 0)
        r[:, F.TCP_WINDOW] = np.where(tcp, 0 if self.window is None else self.window, -1)
        r[:, F.TTL] = self.ttl
        r[:, F.ETHERTYPE] = 0x0800
        r[:, F.SRC_MAC] = 0x0200_0000_0002 if self.src_mac is None else self.src_mac
        r[:, F.DST_MAC] = 0x0200_0000_0001 if self.dst_mac is None else self.dst_mac
        if self.tos is not None:
            r[:, F.TOS] = self.tos
        if self.gre is not None:
            g = self.gre
            r[g, F.SPORT] = r[g, F.DPORT] = 0
            r[g, F.INNER_IPVER] = 4
            r[g, F.INNER_SRC_LO] = F.IPV4_MAPPED_PREFIX | self.inner_src[g].astype(np.int64)
            r[g, F.INNER_DST_LO] = F.IPV4_MAPPED_PREFIX | self.inner_dst[g].astype(np.int64)
        if self.v6 is not None:
            r[self.v6, F.IPVER] = 6
            r[self.v6, F.ETHERTYPE] = 0x86DD
            r[self.v6, F.SRC_HI : F.SRC_LO + 1] = self.src6[self.v6]
            r[self.v6, F.DST_HI : F.DST_LO + 1] = self.dst6[self.v6]
        return r


def make_traffic(n: int, groups: int, t0_ns: int, span_ns: int, seed: int = 0) -> Traffic:
    """n packets over ``groups`` (src, dst) pairs, timestamps sorted in [t0, t0 + span)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    src = (0x0A000000 + (g // 256)).astype(np.uint32)
    dst = (0xC0A80000 + (g % 256) * 7 + (g // 4096)).astype(np.uint32)
    ts = np.sort(rng.integers(t0_ns, t0_ns + span_ns, n)).astype(np.int64)
    proto = np.where(rng.random(n) < 0.8, 6, 17).astype(np.int64)
    flags = rng.choice(np.array([2, 16, 18, 24, 17]), n).astype(np.int64)
    return Traffic(
        ts=ts,
        src=src,
        dst=dst,
        sport=rng.integers(1024, 65535, n).astype(np.int64),
        dport=rng.choice(np.array([22, 53, 80, 443, 8080]), n).astype(np.int64),
        proto=proto,
        flags=flags,
        length=rng.integers(60, 1500, n).astype(np.int64),
        ttl=rng.integers(1, 255, n).astype(np.int64),
    )


def make_mixed_traffic(
    n: int, groups: int, t0_ns: int, span_ns: int, seed: int = 0, v6_share: float = 0.5
) -> Traffic:
    """:func:`make_traffic` with a share of IPv6 packets and random TOS bytes (every DSCP and ECN value).

    IPv6 addresses are 2001:db8:S:N:<interface id> with S (0..3) picking the /48 and N a few /64s
    inside it; source interface ids are random, destination ids small: /48, /56, /64 and full-address
    groups all differ.
    """
    t = make_traffic(n, groups, t0_ns, span_ns, seed)
    rng = np.random.default_rng(seed + 1000)
    g = rng.integers(0, groups, n)

    def addr6(site: np.ndarray, net: np.ndarray, iid: np.ndarray) -> np.ndarray:
        hi = np.int64(0x20010DB8 << 32) | (site.astype(np.int64) << 16) | net.astype(np.int64)
        return np.column_stack([hi, iid.astype(np.int64)])

    t.v6 = rng.random(n) < v6_share
    t.src6 = addr6(g % 4, g % 3, rng.integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64))
    t.dst6 = addr6((g // 4) % 4, (g // 16) % 5, (g % 64) + 1)
    t.tos = rng.integers(0, 256, n).astype(np.int64)
    t.length = np.where(t.v6, np.maximum(t.length, SNAP6), t.length)  # whole headers on the wire
    return t


def build_frames(t: Traffic) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw Ethernet/IPv4-or-IPv6/TCP-or-UDP frames (first SNAP, or SNAP6 with IPv6, bytes)
    -> (frames[n, snap], caplen, wirelen, ts)."""
    n = len(t)
    snap = SNAP6 if t.has_v6 else SNAP
    f = np.zeros((n, snap), dtype=np.uint8)
    f[:, 0:6] = [0x02, 0, 0, 0, 0, 1]
    f[:, 6:12] = [0x02, 0, 0, 0, 0, 2]
    f[:, 12:14] = [0x08, 0x00]
    f[:, 14] = 0x45
    ip_len = np.minimum(t.length - 14, 65535)
    f[:, 16] = ip_len >> 8
    f[:, 17] = ip_len & 0xFF
    f[:, 22] = t.ttl
    f[:, 23] = t.proto
    for k in range(4):
        f[:, 26 + k] = (t.src >> (24 - 8 * k)) & 0xFF
        f[:, 30 + k] = (t.dst >> (24 - 8 * k)) & 0xFF
    f[:, 34] = t.sport >> 8
    f[:, 35] = t.sport & 0xFF
    f[:, 36] = t.dport >> 8
    f[:, 37] = t.dport & 0xFF
    tcp = t.proto == 6
    f[tcp, 46] = 0x50
    f[tcp, 47] = t.flags[tcp]
    if t.window is not None:
        f[tcp, 48] = t.window[tcp] >> 8
        f[tcp, 49] = t.window[tcp] & 0xFF
    for base, mac in ((0, t.dst_mac), (6, t.src_mac)):
        if mac is not None:
            for k in range(6):
                f[:, base + k] = (mac >> (40 - 8 * k)) & 0xFF
    if t.tos is not None:
        f[:, 15] = t.tos
    if t.has_v6:
        v6 = t.v6
        f[v6, 14:] = 0
        f[v6, 12:14] = [0x86, 0xDD]
        tc = t.tos if t.tos is not None else np.zeros(n, np.int64)
        f[v6, 14] = 0x60 | (tc[v6] >> 4)
        f[v6, 15] = (tc[v6] & 0x0F) << 4
        plen = np.minimum(t.length - 54, 65535)
        f[v6, 18] = plen[v6] >> 8
        f[v6, 19] = plen[v6] & 0xFF
        f[v6, 20] = t.proto[v6]
        f[v6, 21] = t.ttl[v6]
        for base, words in ((22, t.src6), (38, t.dst6)):
            for w in range(2):
                u = words[v6, w].view(np.uint64)
                for k in range(8):
                    f[v6, base + 8 * w + k] = (u >> np.uint64(56 - 8 * k)) & np.uint64(0xFF)
        f[v6, 54] = t.sport[v6] >> 8
        f[v6, 55] = t.sport[v6] & 0xFF
        f[v6, 56] = t.dport[v6] >> 8
        f[v6, 57] = t.dport[v6] & 0xFF
        tcp6 = v6 & tcp
        f[tcp6, 66] = 0x50
        f[tcp6, 67] = t.flags[tcp6]
        if t.window is not None:
            f[tcp6, 68] = t.window[tcp6] >> 8
            f[tcp6, 69] = t.window[tcp6] & 0xFF
    if t.gre is not None:  # GRE (no optional words, payload 0x0800) and the inner IPv4 header
        v6 = t.v6 if t.v6 is not None else np.zeros(n, bool)
        for rows, l4 in ((t.gre & ~v6, 34), (t.gre & v6, 54)):
            f[rows, l4:] = 0
            f[rows, l4 + 2] = 0x08
            f[rows, l4 + 4] = 0x45
            f[rows, l4 + 6] = 20
            for k in range(4):
                f[rows, l4 + 16 + k] = (t.inner_src[rows] >> (24 - 8 * k)) & 0xFF
                f[rows, l4 + 20 + k] = (t.inner_dst[rows] >> (24 - 8 * k)) & 0xFF
    caplen = np.full(n, snap, dtype=np.int64)
    return f, caplen, t.length.astype(np.int64), t.ts.astype(np.int64)


def oracle(q: Q.QuerySpec, t: Traffic) -> pd.DataFrame:
    """Exact per-(pane, key) state columns of the descriptions (the suite's one reference)."""
    return pane_oracle(q, t.rows())


def merge_partials(q: Q.QuerySpec, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> pd.DataFrame:
    """Roll partial records up to one row per (pane, key), the way the high level must."""
    return aggregate(q, {"pane": pane}, key, state)


def make_handshake_traffic(
    n_syn: int,
    t0_ns: int,
    span_ns: int,
    seed: int = 0,
    answered: float = 0.7,
    max_latency_ns: int = 2_000_000_000,
    noise: int = 0,
) -> Traffic:
    """TCP handshakes: ``n_syn`` SYNs client -> server, a share ``answered`` of them followed by the
    server's SYN-ACK (addresses and ports swapped) 0..max_latency later, plus ``noise`` ACK packets;
    sorted by time."""
    rng = np.random.default_rng(seed)
    cli = (0x0A000000 + rng.integers(0, 4000, n_syn)).astype(np.uint32)
    srv = (0xC0A80000 + rng.integers(0, 64, n_syn)).astype(np.uint32)
    cport = rng.integers(1024, 65535, n_syn).astype(np.int64)
    sport = rng.choice(np.array([22, 80, 443, 8080]), n_syn).astype(np.int64)
    t_syn = rng.integers(t0_ns, t0_ns + span_ns, n_syn).astype(np.int64)
    ans = rng.random(n_syn) < answered
    t_ack = t_syn[ans] + rng.integers(0, max_latency_ns, int(ans.sum()))
    na = int(ans.sum())
    src = np.concatenate([cli, srv[ans], rng.integers(0, 1 << 31, noise).astype(np.uint32)])
    dst = np.concatenate([srv, cli[ans], rng.integers(0, 1 << 31, noise).astype(np.uint32)])
    sp = np.concatenate([cport, sport[ans], rng.integers(1, 65535, noise)])
    dp = np.concatenate([sport, cport[ans], rng.integers(1, 65535, noise)])
    flags = np.concatenate([np.full(n_syn, 2), np.full(na, 18), np.full(noise, 16)]).astype(np.int64)
    ts = np.concatenate([t_syn, t_ack, rng.integers(t0_ns, t0_ns + span_ns, noise)]).astype(np.int64)
    n = len(ts)
    t = Traffic(
        ts=ts,
        src=src,
        dst=dst,
        sport=sp.astype(np.int64),
        dport=dp.astype(np.int64),
        proto=np.full(n, 6, dtype=np.int64),
        flags=flags,
        length=np.full(n, 60, dtype=np.int64),
        ttl=np.full(n, 64, dtype=np.int64),
    )
    return t.take(np.argsort(t.ts, kind="stable"))
