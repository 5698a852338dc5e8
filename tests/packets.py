"""Test traffic: packet descriptions as numpy columns, raw Ethernet/IPv4 frames built from them, and
the exact offline aggregate (the oracle) computed from the descriptions, never from our parser."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import fields as F
from contract import query as Q
from contract.filterlang import compile_filter, evaluate

SNAP = 64


@dataclass
class Traffic:
    ts: np.ndarray  # int64 ns
    src: np.ndarray  # uint32 IPv4
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    proto: np.ndarray  # 6 or 17
    flags: np.ndarray  # tcp flags
    length: np.ndarray  # wire length
    ttl: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, idx: np.ndarray) -> Traffic:
        return Traffic(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    def rows(self) -> np.ndarray:
        """Parsed-packet rows as the contract defines them (for the oracle and filter checks)."""
        n = len(self)
        r = np.zeros((n, F.NFIELDS), dtype=np.int64)
        r[:, F.TS] = self.ts
        r[:, F.IPVER] = 4
        r[:, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | self.src.astype(np.int64)
        r[:, F.DST_LO] = F.IPV4_MAPPED_PREFIX | self.dst.astype(np.int64)
        r[:, F.SPORT] = self.sport
        r[:, F.DPORT] = self.dport
        r[:, F.PROTO] = self.proto
        r[:, F.LEN] = self.length
        r[:, F.TCP_FLAGS] = np.where(self.proto == 6, self.flags, 0)
        r[:, F.TTL] = self.ttl
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
        ts=ts, src=src, dst=dst,
        sport=rng.integers(1024, 65535, n).astype(np.int64),
        dport=rng.choice(np.array([22, 53, 80, 443, 8080]), n).astype(np.int64),
        proto=proto, flags=flags,
        length=rng.integers(60, 1500, n).astype(np.int64),
        ttl=rng.integers(1, 255, n).astype(np.int64),
    )


def build_frames(t: Traffic) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw Ethernet/IPv4/TCP-or-UDP frames (first SNAP bytes) -> (frames[n,SNAP], caplen, wirelen, ts)."""
    n = len(t)
    f = np.zeros((n, SNAP), dtype=np.uint8)
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
    caplen = np.full(n, SNAP, dtype=np.int64)
    return f, caplen, t.length.astype(np.int64), t.ts.astype(np.int64)


def oracle(q: Q.QuerySpec, t: Traffic) -> pd.DataFrame:
    """Exact per-(pane, key) state columns, computed offline with pandas from the descriptions."""
    rows = t.rows()
    prog = compile_filter(q.filter)
    keep = np.array([evaluate(prog, r) for r in rows], dtype=bool) if len(prog) else np.ones(len(rows), bool)
    rows = rows[keep]
    pane = (rows[:, F.TS] - q.window.origin_ns) // q.window.pane_ns
    data = {"pane": pane}
    kp = Q.key_program(q)
    w = 0
    for col, is_ip, m4h, m4l, _m6h, _m6l in kp:
        if is_ip:
            data[f"k{w}"] = rows[:, col] & m4h
            data[f"k{w + 1}"] = rows[:, col + 1] & m4l
            w += 2
        else:
            data[f"k{w}"] = (rows[:, F.TOS] >> 2) if col == Q.SRC_DSCP else rows[:, col]
            w += 1
    if w == 0:
        data["k0"] = np.zeros(len(rows), np.int64)
        w = 1
    aggs = {}
    for j, c in enumerate(Q.state_columns(q)):
        v = np.ones(len(rows), np.int64) if c.source == Q.SRC_ONE else rows[:, c.source]
        data[f"s{j}"] = v
        aggs[f"s{j}"] = {Q.MERGE_SUM: "sum", Q.MERGE_MIN: "min", Q.MERGE_MAX: "max"}[c.merge]
    df = pd.DataFrame(data)
    keys = ["pane"] + [f"k{i}" for i in range(w)]
    return df.groupby(keys, as_index=False).agg(aggs).sort_values(keys).reset_index(drop=True)


def merge_partials(q: Q.QuerySpec, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> pd.DataFrame:
    """Roll partial records up to one row per (pane, key), the way the high level must."""
    cols = Q.state_columns(q)
    data = {"pane": pane}
    for i in range(key.shape[1]):
        data[f"k{i}"] = key[:, i]
    aggs = {}
    for j, c in enumerate(cols):
        data[f"s{j}"] = state[:, j]
        aggs[f"s{j}"] = {Q.MERGE_SUM: "sum", Q.MERGE_MIN: "min", Q.MERGE_MAX: "max"}[c.merge]
    keys = ["pane"] + [f"k{i}" for i in range(key.shape[1])]
    return pd.DataFrame(data).groupby(keys, as_index=False).agg(aggs).sort_values(keys).reset_index(drop=True)
