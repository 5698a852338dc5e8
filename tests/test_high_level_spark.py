"""Integration: emulated capture hosts -> real Kafka -> the real Spark job -> Parquet == the oracle.

Batches are driven deterministically with ``processAllAvailable`` on a running query; one Spark
session for the whole file (the ``spark`` fixture).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from contract import wire
from high_level.job import HighLevelJob, JobOptions
from high_level.simulate import Message, host_messages, interleave, split_hosts, window_oracle
from tests.packets import make_traffic, oracle

T0 = 1_700_000_000_000_000_000
HOSTS = ("h0", "h1", "h2")
SKEW_S = (0, 12, 40)

TUMBLING = """
queries:
  - name: tumble
    group_by: [src_ip, dst_ip]
    aggregates:
      - {fn: count, as: packets}
      - {fn: sum, field: length, as: bytes}
      - {fn: avg, field: length, as: avg_len}
      - {fn: max, field: ttl, as: max_ttl}
    window: {range: 10s}
  - name: slide
    filter: protocol == tcp
    group_by: [dst_port]
    aggregates:
      - {fn: count, as: pkts}
      - {fn: min, field: ttl, as: min_ttl}
    window: {range: 9s, slide: 3s}
"""


def _queries(topic_factory, partitions: int) -> list[Q.QuerySpec]:
    cfg = Q.load_text(TUMBLING)
    out = []
    for q in cfg.queries:
        topic = topic_factory(partitions=partitions, prefix=f"hl-{q.name}")
        out.append(q.model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=partitions)}))
    return out


def _produce(kafka, topic_of: dict[str, str], msgs: list[tuple[str, Message]]) -> None:
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=5, max_request_size=8 << 20)
    try:
        for qname, m in msgs:
            prod.send(topic_of[qname], value=m.value, partition=m.partition)
        prod.flush(30)
    finally:
        prod.close(5)


def _traffic_messages(queries, n=6000, groups=120, span_s=90, seed=7, punct_every_s=1, hosts=HOSTS, skew=SKEW_S,
                      end=True):  # fmt: skip
    t = make_traffic(n, groups, T0, span_s * 10**9, seed=seed)
    rows = t.rows()
    hix = split_hosts(len(t), len(hosts), seed=seed)
    out = []
    for q in queries:
        streams = [
            host_messages(q, rows[hix == i], h, partitions=q.kafka.partitions, skew_ns=skew[i] * 10**9,
                          punct_every_ns=punct_every_s * 10**9, end_mark=wire.END_OF_STREAM if end else None,
                          seed=seed + i)  # fmt: skip
            for i, h in enumerate(hosts)
        ]
        out.append((q, interleave(streams, seed=seed)))
    # one global order over queries too (still per-host per-partition ordered)
    tagged = [(m.t_ns, i, j, q.name, m) for i, (q, ms) in enumerate(out) for j, m in enumerate(ms)]
    tagged.sort(key=lambda x: (x[0], x[1], x[2]))
    return t, [(qn, m) for _, _, _, qn, m in tagged]


def _read(results: Path, q: Q.QuerySpec) -> pd.DataFrame:
    files = list((results / f"query={q.name}").glob("**/*.parquet"))
    if not files:
        return pd.DataFrame()
    return duckdb.sql(
        f"select * from read_parquet('{results}/query={q.name}/**/*.parquet', hive_partitioning=true)"
    ).df()


def _expected_typed(q: Q.QuerySpec, t) -> pd.DataFrame:
    """The oracle in the store's typed form (decode_key / finalize from the contract, row by row)."""
    wo = window_oracle(q, oracle(q, t))
    kw = Q.key_width(q)
    recs = []
    for r in wo.itertuples(index=False):
        w = int(r.window)
        end = q.window.origin_ns + (w + 1) * q.window.pane_ns
        rec = {"window_end": pd.Timestamp(end, unit="ns", tz="UTC")}
        rec.update(Q.decode_key(q, np.array([getattr(r, f"k{i}") for i in range(kw)])))
        rec.update(Q.finalize(q, np.array([getattr(r, c) for c in wo.columns if c.startswith("s")])))
        recs.append(rec)
    return pd.DataFrame(recs)


def _compare(got: pd.DataFrame, exp: pd.DataFrame, q: Q.QuerySpec) -> None:
    keys = ["window_end", *[p.name for p in q.key_parts]]
    aggs = [a.name for a in q.aggregates]
    assert len(got) == len(exp), f"{q.name}: {len(got)} rows, oracle {len(exp)}"
    g = got[got["kind"] == "final"][keys + aggs].copy()
    g["window_end"] = pd.to_datetime(g["window_end"], utc=True).astype("datetime64[ns, UTC]")
    e = exp[keys + aggs].copy()
    e["window_end"] = e["window_end"].astype("datetime64[ns, UTC]")
    g = g.sort_values(keys).reset_index(drop=True)
    e = e.sort_values(keys).reset_index(drop=True)
    assert not g.duplicated(keys).any(), f"{q.name}: a (window, key) emitted twice"
    for c in keys:
        assert (g[c].astype(str).to_numpy() == e[c].astype(str).to_numpy()).all(), f"{q.name}: key column {c}"
    for c in aggs:
        np.testing.assert_allclose(g[c].to_numpy(float), e[c].to_numpy(float), rtol=1e-12, err_msg=f"{q.name}.{c}")


def _job(spark, queries, tmp_path: Path, tag: str, **kw) -> HighLevelJob:
    opts = JobOptions(
        bootstrap=kw.pop("bootstrap"), results=str(tmp_path / f"results-{tag}"),
        checkpoint=str(tmp_path / f"ckpt-{tag}"), trigger_ms=kw.pop("trigger_ms", 500), name=f"t-{tag}", **kw,
    )  # fmt: skip
    job = HighLevelJob(spark, queries, opts)
    job.start()
    return job


@pytest.mark.parametrize("partitions", [2])
def test_exact_against_oracle(spark, kafka, topic_factory, tmp_path, partitions):
    queries = _queries(topic_factory, partitions)
    t, msgs = _traffic_messages(queries)
    topic_of = {q.name: q.kafka.topic for q in queries}
    job = _job(spark, queries, tmp_path, "exact", bootstrap=kafka.bootstrap_servers, expected_hosts=HOSTS,
               host_timeout_ms=600_000)  # fmt: skip
    try:
        t0 = time.monotonic()
        for chunk in np.array_split(np.arange(len(msgs)), 4):
            _produce(kafka, topic_of, [msgs[i] for i in chunk])
            job.process_all_available()
        print(f"{len(msgs)} messages in {time.monotonic() - t0:.1f}s")
    finally:
        job.stop()
    results = Path(job.opts.results)
    for q in queries:
        _compare(_read(results, q), _expected_typed(q, t), q)
    status = json.loads((results / "_status.json").read_text())
    for q in queries:
        hs = status["queries"][q.name]["hosts"]
        assert set(hs) == set(HOSTS)
        assert all(h["late_partials"] == 0 and h["missing_records"] == 0 for h in hs.values())
