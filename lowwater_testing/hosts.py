"""Emulated capture hosts feeding the high level: every host's messages for a query, merged by send time,
and the offline partition processor (the Spark step without Spark) run over them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract import query as Q
from contract import wire
from high_level.aggregate.chunks import MemoryChunks
from high_level.aggregate.processor import PartitionProcessor
from high_level.aggregate.rollup import Layout
from lowwater_testing.oracle import host_messages, interleave, split_hosts
from lowwater_testing.queries import config, query, tcp_ports

HOSTS = ("h0", "h1", "h2")


SKEW_S = (0, 12, 40)


def traffic_messages(queries, t, punct_s: dict[str, int] | None = None, seed=7):
    """All hosts' messages for all queries, merged by send time (per-host per-partition order kept)."""
    rows = t.rows()
    hix = split_hosts(len(t), len(HOSTS), seed=seed)
    tagged = []
    for qi, q in enumerate(queries):
        every = (punct_s or {}).get(q.name, 1) * 10**9
        streams = [
            host_messages(
                q,
                rows[hix == i],
                h,
                partitions=q.kafka.partitions,
                skew_ns=SKEW_S[i] * 10**9,
                punct_every_ns=every,
                end_mark=wire.END_OF_STREAM,
                seed=seed + i,
            )
            for i, h in enumerate(HOSTS)
        ]
        for j, m in enumerate(interleave(streams, seed=seed + qi)):
            tagged.append((m.t_ns, qi, j, q.topic, m.partition, m.value))
    tagged.sort(key=lambda x: x[:3])
    return [(topic, p, v) for *_, topic, p, v in tagged]


def run_offline(qs, msgs, partitions, settings, batches=23, roundtrip=True, drop=(), chunked=False):
    lays = [Layout.of(q) for q in qs]
    stores = {p: MemoryChunks() if chunked else None for p in range(partitions)}
    procs = {p: PartitionProcessor(lays, p, settings, stores[p]) for p in range(partitions)}
    out = []
    now = 1_000_000
    for chunk in np.array_split(np.arange(len(msgs)), batches):
        for p in range(partitions):
            vals = [msgs[i].value for i in chunk if msgs[i].partition == p and i not in drop]
            if roundtrip:
                procs[p] = PartitionProcessor.from_bytes(procs[p].to_bytes(), lays, settings, stores[p])
            out.append(procs[p].process(vals, now))
        now += 1000
    return pd.concat(out, ignore_index=True)


def final_rows(df: pd.DataFrame, q: Q.QuerySpec) -> pd.DataFrame:
    f = df[(df["kind"] == "final") & (df["query"] == q.name)]
    kw = Q.key_width(q)
    k = np.stack(f["key"].to_numpy()) if len(f) else np.empty((0, kw), np.int64)
    s = np.stack(f["state"].to_numpy()) if len(f) else np.empty((0, len(Q.state_columns(q))), np.int64)
    got = pd.DataFrame(
        {
            "window": f["window"].to_numpy(np.int64),
            **{f"k{i}": k[:, i] for i in range(kw)},
            **{f"s{j}": s[:, j] for j in range(s.shape[1])},
        }
    )
    return got.sort_values(["window", *[f"k{i}" for i in range(kw)]]).reset_index(drop=True)


def step_rows(q: Q.QuerySpec, window, start_ns, end_ns, key, state, kind, closed_at_ms: int) -> pd.DataFrame:
    """Rows as the stateful step hands them to the sink (partition 0, three hosts expected and all in the
    mark, nothing late or missing): one per (window, key)."""
    return pd.DataFrame(
        {
            "query": q.name,
            "partition": 0,
            "window": window,
            "window_start_ns": start_ns,
            "window_end_ns": end_ns,
            "key": key,
            "state": state,
            "kind": kind,
            "closed_at_ms": closed_at_ms,
            "hosts": 3,
            "hosts_expected": 3,
            "hosts_in_mark": 3,
            "late_partials": 0,
            "missing_records": 0,
            "status": None,
        },
        index=range(len(window)),
    )


def emulated_messages(q, traffic, partitions, punct_every_s=1, skew=(0, 15, 40), seed=0, end=True):
    rows = traffic.rows()
    hix = split_hosts(len(traffic), len(HOSTS), seed=5)
    streams = [
        host_messages(
            q,
            rows[hix == i],
            h,
            partitions=partitions,
            skew_ns=skew[i] * 10**9,
            punct_every_ns=punct_every_s * 10**9,
            seed=i,
            end_mark=wire.END_OF_STREAM if end else None,
        )
        for i, h in enumerate(HOSTS)
    ]
    return interleave(streams, seed=seed)


CONFIG = config(  # the offline roll-up tests' queries: tumbling, sliding, sliding with an origin
    query(
        "pairs",
        group_by=["src_ip", "dst_ip"],
        aggregates=[
            "count as packets",
            "sum(length) as bytes",
            "avg(length) as avg_len",
            "min(ttl) as min_ttl",
            "max(ttl) as max_ttl",
        ],
    ),
    tcp_ports("ports9x3"),
    query(
        "nets",
        group_by=["dst_ip/24"],
        aggregates=["max(length) as max_len"],
        window={"range": "20s", "slide": "5s", "origin": "2s"},
    ),
).text
