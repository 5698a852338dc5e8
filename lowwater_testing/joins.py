"""Band-join fixtures: the handshake select/join config, its selected rows, a brute-force join oracle and
every emulated host's select messages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from contract import query as Q
from high_level.join.band import JoinLayout
from lowwater_testing import oracle as simulate
from lowwater_testing.traffic import NS, T0, make_handshake_traffic


def rows_of(cfg: Q.Config, n_syn: int, seed: int, dup: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Selected SYN and SYN-ACK rows of handshake traffic (answered 70 %, latency 0-4 s around the 3-s band),
    with retransmitted SYNs and duplicate SYN-ACKs when ``dup``."""
    t = make_handshake_traffic(n_syn, T0, 60 * NS, seed=seed, max_latency_ns=4 * NS, noise=n_syn // 2)
    parsed = t.rows()
    left, right = (simulate.select_oracle(s, parsed) for s in cfg.selects)
    if dup:
        rng = np.random.default_rng(seed)
        rl = left[rng.random(len(left)) < 0.1].copy()
        rl[:, 0] += rng.integers(0, 2 * NS, len(rl))  # retransmitted SYN
        rr = right[rng.random(len(right)) < 0.1].copy()
        rr[:, 0] += rng.integers(0, NS, len(rr))  # duplicate SYN-ACK
        left, right = np.concatenate([left, rl]), np.concatenate([right, rr])
    return left, right


def join_oracle(lay: JoinLayout, left: np.ndarray, right: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Brute-force join (pandas merge on the key words, then the band or same-window filter): pairs and
    unmatched left rows."""
    ldf = pd.DataFrame(left, columns=["ts"] + [f"l{i}" for i in range(lay.lw)])
    rdf = pd.DataFrame(right, columns=["ts"] + [f"r{i}" for i in range(lay.rw)])
    lk = [("ts" if w < 0 else f"l{w}") for w in lay.lkey]
    rk = [("ts" if w < 0 else f"r{w}") for w in lay.rkey]
    ldf["lid"] = np.arange(len(ldf))
    m = ldf.merge(rdf, left_on=lk, right_on=rk, suffixes=("", "_r"))
    if lay.window_ns:  # same tumbling window of the timestamp
        o, w = lay.window_origin_ns, lay.window_ns
        m = m[(m["ts"] - o) // w == (m["ts_r"] - o) // w]
    else:  # band [lo, hi] on right.ts - left.ts
        m = m[(m["ts_r"] - m["ts"] >= lay.band_lo_ns) & (m["ts_r"] - m["ts"] <= lay.band_ns)]
    pairs = m[["ts"] + [f"l{i}" for i in range(lay.lw)] + ["ts_r"] + [f"r{i}" for i in range(lay.rw)]]
    unmatched = ldf[~ldf["lid"].isin(m["lid"])].drop(columns="lid")
    return sort_rows(pairs.to_numpy(np.int64)), sort_rows(unmatched.to_numpy(np.int64))


def join_window_oracle(lay: JoinLayout, pairs: np.ndarray, unmatched: np.ndarray) -> pd.DataFrame:
    """Aggregates per (window, group) of the oracle's output rows, brute force over each row's windows (of
    its left timestamp, or its right one with ``window_on: right``)."""
    rl = lay.rollup
    rows = []
    src = [] if lay.type == "anti" else [(pairs, True)]
    if lay.type != "inner":
        src.append((unmatched, False))
    for a, is_pair in src:
        for r in a:
            lts, lcols = r[0], r[1 : 1 + lay.lw]
            rts, rcols = (r[1 + lay.lw], r[2 + lay.lw :]) if is_pair else (0, None)

            def val(side: str, ws: tuple[int, ...], lts=lts, lcols=lcols, rts=rts, rcols=rcols) -> list[int]:
                ts, cols = (lts, lcols) if side == "left" else (rts, rcols)
                return [int(ts) if w < 0 else int(cols[w]) for w in ws]

            key = tuple(v for side, ws in lay.group for v in val(side, ws)) or (0,)
            vals = {
                alias: sum(sign * val(side, ws)[0] for sign, side, ws in terms)
                for _, alias, terms in lay.aggs
            }
            pane = ((rts if lay.window_on == "right" and is_pair else lts) - rl.origin_ns) // rl.pane_ns
            for w in range(pane, pane + rl.k):
                if (w - rl.k + 1) % rl.s == 0:
                    rows.append({"window": w, "key": key, **vals})
    df = pd.DataFrame(rows)
    agg = {alias: {"count": "size", "avg": "mean"}.get(fn, fn) for fn, alias, _ in lay.aggs}
    first = next(iter(agg))
    out = df.groupby(["window", "key"]).agg(
        {a: (f if f != "size" else "size") for a, f in agg.items() if a != first or f != "size"}
    )
    if agg[first] == "size":
        out[first] = df.groupby(["window", "key"]).size()
    return out.reset_index().sort_values(["window", "key"]).reset_index(drop=True)[["window", "key", *agg]]


def handshake_messages(
    cfg: Q.Config, left: np.ndarray, right: np.ndarray, hosts: int, skew_s: int, seed: int
) -> list[tuple[str, int, bytes]]:
    """(topic, partition, value) of every emulated host's messages for both selects, merged by send time."""
    rng = np.random.default_rng(seed)
    tagged = []
    for s, rows in zip(cfg.selects, (left, right), strict=True):
        hidx = rng.integers(0, hosts, len(rows))
        streams = [
            simulate.select_messages(
                s, rows[hidx == h], f"cap-{h}", skew_ns=skew_s * NS * h // max(1, hosts - 1)
            )
            for h in range(hosts)
        ]
        tagged += [(m.t_ns, s.topic, m.partition, m.value) for m in simulate.interleave(streams, seed=seed)]
    tagged.sort(key=lambda x: x[0])
    return [(t, p, v) for _, t, p, v in tagged]


HANDSHAKE = """
queries:
  - name: syn
    kind: select
    filter: protocol == tcp and tcp_flags & SYN and not tcp_flags & ACK
    fields: [src_ip, src_port, dst_ip, dst_port]
    partition_by: [src_ip, src_port, dst_ip, dst_port]
    kafka: {partitions: 4}
  - name: synack
    kind: select
    filter: protocol == tcp and tcp_flags & SYN and tcp_flags & ACK
    fields: [src_ip, src_port, dst_ip, dst_port, ttl]
    partition_by: [dst_ip, dst_port, src_ip, src_port]
    kafka: {partitions: 4}
  - name: handshakes
    kind: join
    left: syn
    right: synack
    on: {left: [src_ip, src_port, dst_ip, dst_port], right: [dst_ip, dst_port, src_ip, src_port]}
    within: 3s
    group_by: [left.dst_port]
    aggregates:
      - {fn: count, as: completed}
      - {fn: avg, expr: right.timestamp - left.timestamp, as: avg_latency_ns}
    window: {range: 1m}
"""


def handshake_kind(text: str, kind: str, group: str) -> str:
    """The handshake config ``text`` (HANDSHAKE with its topics or window set) as a ``kind`` join (inner as is;
    left, anti) grouped by ``group``: with no SYN-ACK on every row it keeps the largest source port instead of
    the mean latency."""
    if kind == "inner":
        return text
    text = text.replace("    group_by: [left.dst_port]\n", f"    type: {kind}\n    group_by: [{group}]\n")
    return text.replace(
        "      - {fn: avg, expr: right.timestamp - left.timestamp, as: avg_latency_ns}\n",
        "      - {fn: max, expr: left.src_port, as: max_port}\n",
    )


def sort_rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.int64)
    return a[np.lexsort(a.T[::-1])] if len(a) else a


def job_step_finals(
    proc: Any, msgs: list[tuple[str, int, bytes]], every: int, reload: Any = None
) -> pd.DataFrame:
    """The 'final' rows a join's job step (:class:`high_level.join.step.JoinProcessor`) writes when fed
    ``msgs`` ``every`` at a time, by Kafka partition; ``reload(proc)`` after each batch (a restart from the
    state's bytes) when given. Keys as tuples."""
    from high_level.aggregate.packed import unpack_rows

    rl = {proc.layout.name: proc.layout.rollup}
    got = []
    for i in range(0, len(msgs), every):
        by_part: dict[int, list[bytes]] = {}
        for _, p, v in msgs[i : i + every]:
            by_part.setdefault(p, []).append(v)
        d = unpack_rows(proc.process_packed(by_part, i), rl).to_pandas()
        proc = reload(proc) if reload is not None else proc
        got.append(d[d["kind"] == "final"])
    g = pd.concat(got, ignore_index=True)
    g["key"] = [tuple(k) for k in g["key"]]
    return g
