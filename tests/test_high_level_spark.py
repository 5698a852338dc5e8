"""Integration: emulated capture hosts -> real Kafka -> the real Spark job -> Parquet, checked exactly.

Batches are driven with ``processAllAvailable`` on running queries (one Spark session for the whole
run, the ``spark`` fixture). Hosts are emulated by :mod:`lowwater_testing.oracle` (partials split as by
evictions, skew 0-40 s between hosts) or by hand where a test needs to control each punctuation.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import generate_latest

from contract import query as Q
from contract import wire
from lowwater_testing.hosts import HOSTS, traffic_messages
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import ConfigDoc, config, query
from lowwater_testing.spark import (
    PORTS,
    Host,
    assert_exact,
    crash_after_batches,
    expected_typed,
    normalised,
    read_results,
    start_job,
    status,
    variant,
    windows_of,
)
from lowwater_testing.topics import produce
from lowwater_testing.traffic import make_mixed_traffic, make_traffic, oracle

T0 = 1_700_000_000_000_000_000


# -- exactness ------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["blob", "chunked"])
def test_exact_for_any_partition_count_and_punctuation_density(spark, kafka, topic_factory, tmp_path, state):
    """Tumbling and sliding queries on 1, 2 and 4 partitions, punctuation every 1 s and every 10 s of
    data time, three hosts skewed 0/12/40 s: every result equals the oracle (so they equal each other).
    One more query groups mixed IPv4/IPv6 traffic by /24 and /48 prefixes and DSCP, with TOS min/max.
    Both state layouts (high_level/aggregate/chunks.py): the blob one and the per-batch chunks in RocksDB (fewer
    variants: the state code is the same for every partition count, offline tests cover the rest)."""
    t = make_traffic(6000, 150, T0, 90 * 10**9, seed=7)
    tm = make_mixed_traffic(4000, 120, T0, 90 * 10**9, seed=9)
    mixed = variant(topic_factory, "mixed", "mixed_v6_dscp", 2)
    queries, punct = [], {}
    combos = ((1, 1), (2, 1), (4, 1), (2, 10)) if state == "blob" else ((4, 1), (2, 10))
    for base in ("tumble", "slide"):
        for parts, every in combos:
            name = f"{base}_p{parts}_{every}s"
            queries.append(variant(topic_factory, base, name, parts))
            punct[name] = every
    msgs = traffic_messages(queries, t, punct) + traffic_messages([mixed], tm)
    job = start_job(
        spark,
        [*queries, mixed],
        tmp_path,
        "exact",
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=HOSTS,
        host_timeout_ms=600_000,
        state=state,
    )
    try:
        t0 = time.monotonic()
        for chunk in np.array_split(np.arange(len(msgs)), 3):
            produce(kafka, [msgs[i] for i in chunk])
            job.process_all_available()
        took = time.monotonic() - t0
    finally:
        job.stop()
    results = Path(job.opts.results)
    frames = {q.name: assert_exact(results, q, t) for q in queries}
    got_mixed = assert_exact(results, mixed, tm)
    assert got_mixed["dst_ip_24"].str.contains(":").any() and got_mixed["dst_ip_24"].str.contains(r"\.").any()
    assert got_mixed["dscp"].nunique() == 64
    for base in ("tumble", "slide"):
        same = [f for n, f in frames.items() if n.startswith(base)]
        assert all(f.equals(same[0]) for f in same)
    st = status(job)
    for q in queries:
        hs = st["queries"][q.name]["hosts"]
        assert set(hs) == set(HOSTS)
        assert all(h["late_partials"] == 0 and h["missing_records"] == 0 and h["live"] for h in hs.values())
        assert st["queries"][q.name]["state_rows"] == 0  # everything closed by END_OF_STREAM and purged
    text = generate_latest(job.metrics.registry).decode()
    for metric in (
        "lowwater_job_records_consumed_total",
        "lowwater_job_windows_closed_total",
        "lowwater_job_host_low_water_mark_timestamp_seconds",
        "lowwater_job_host_lag_seconds",
        "lowwater_job_host_up",
        "lowwater_job_batch_duration_seconds_bucket",
        "lowwater_job_result_latency_seconds_bucket",
    ):
        assert metric in text
    closed = job.metrics.windows.labels("tumble_p2_10s")._value.get()
    assert closed == len(frames["tumble_p2_10s"])
    print(f"\n{len(msgs)} messages, {len(queries)} queries in {took:.1f}s")


# -- punctuation gating, by hand ------------------------------------------------------------------


def test_no_window_closes_before_every_host_punctuates(spark, kafka, topic_factory, tmp_path):
    q = variant(topic_factory, "gate", "gate", 2)
    h = {n: Host(n, q) for n in HOSTS}
    p0 = T0 // q.window.pane_ns
    job = start_job(
        spark,
        [q],
        tmp_path,
        "gate",
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=HOSTS,
        host_timeout_ms=600_000,
    )
    try:
        # expected hosts: two of three have punctuated past window p0 -> it must not close
        produce(
            kafka,
            h["h0"].partials(p0, PORTS, 1, 100)
            + h["h0"].punct(p0 + 1)
            + h["h1"].partials(p0, PORTS, 2, 100)
            + h["h1"].punct(p0 + 1),
        )
        job.process_all_available()
        assert windows_of(job, q) == {}
        assert status(job)["queries"]["gate"]["partitions"]["0"]["blocked_by"] == ["h2"]
        produce(kafka, h["h2"].partials(p0, PORTS, 4, 100) + h["h2"].punct(p0 + 1))
        job.process_all_available()
        got = windows_of(job, q)
        assert list(got) == [p0]
        assert got[p0]["n"].tolist() == [7] * len(PORTS) and got[p0]["bytes"].tolist() == [700] * len(PORTS)
        assert (got[p0]["hosts"] == 3).all()
        # learned hosts: h2 lags; the next window waits for it, then includes its partials
        produce(
            kafka,
            h["h0"].partials(p0 + 1, PORTS, 1, 10)
            + h["h0"].punct(p0 + 2)
            + h["h1"].partials(p0 + 1, PORTS[:2], 1, 10)
            + h["h1"].punct(p0 + 2),
        )
        job.process_all_available()
        assert list(windows_of(job, q)) == [p0]
        produce(kafka, h["h2"].partials(p0 + 1, PORTS[:1], 5, 10) + h["h2"].punct(p0 + 2))
        job.process_all_available()
        got = windows_of(job, q)
        assert sorted(got) == [p0, p0 + 1]
        assert dict(zip(got[p0 + 1]["dst_port"], got[p0 + 1]["n"], strict=True)) == {
            22: 7,
            53: 2,
            80: 1,
            443: 1,
            8080: 1,
        }
    finally:
        job.stop()


@pytest.mark.parametrize("state", ["blob", "chunked"])
def test_silent_host_stops_blocking_after_timeout_and_late_partials_count(
    spark, kafka, topic_factory, tmp_path, state
):
    """A silent host times out through the step's processing-time timeout (blob), or in the batches the live
    hosts' punctuation brings, at the batch's timestamp (chunked: no timers)."""
    q = variant(topic_factory, "gate", "gate_timeout", 2)
    h = {n: Host(n, q) for n in HOSTS}
    p0 = T0 // q.window.pane_ns
    timeout_ms = 3000
    job = start_job(
        spark,
        [q],
        tmp_path,
        "timeout",
        bootstrap=kafka.bootstrap_servers,
        host_timeout_ms=timeout_ms,
        late_policy="correction",
        state=state,
    )
    try:
        produce(kafka, [m for n in HOSTS for m in h[n].partials(p0, PORTS, 1, 100) + h[n].punct(p0 + 1)])
        heard = time.monotonic()  # h2's last punctuation is read by the batch that starts now
        job.process_all_available()
        assert list(windows_of(job, q)) == [p0]
        produce(
            kafka,
            [m for n in ("h0", "h1") for m in h[n].partials(p0 + 1, PORTS, 1, 100) + h[n].punct(p0 + 2)],
        )
        job.process_all_available()
        assert list(windows_of(job, q)) == [p0]
        # h0 and h1 keep heartbeating; h2 stays silent: after host_timeout it stops holding p0+1 open
        while p0 + 1 not in windows_of(job, q):
            assert time.monotonic() - heard < timeout_ms / 1000 + 20, "silent host blocks forever"
            produce(kafka, [m for n in ("h0", "h1") for m in h[n].punct(p0 + 2)])
            job.process_all_available()
            time.sleep(0.3)
        assert time.monotonic() - heard >= timeout_ms / 1000 * 0.95
        got = windows_of(job, q)[p0 + 1]
        assert got["n"].tolist() == [2] * len(PORTS) and (got["hosts"] == 2).all()
        # closed without h2 (dead before its mark passed p0+1): incomplete; p0 was complete
        assert (
            not got["complete"].any()
            and (got["hosts_in_mark"] == 2).all()
            and (got["hosts_expected"] == 3).all()
        )
        assert windows_of(job, q)[p0]["complete"].all()
        st = status(job)["queries"]["gate_timeout"]["hosts"]
        assert not st["h2"]["live"] and st["h0"]["live"]
        # h2 comes back with partials of the closed window: late, counted, corrected; h2 is live again
        produce(kafka, h["h2"].partials(p0 + 1, PORTS[:3], 1, 100) + h["h2"].punct(p0 + 2))
        job.process_all_available()
        st = status(job)["queries"]["gate_timeout"]["hosts"]
        assert st["h2"]["late_partials"] == 3 and st["h2"]["live"]
        corr = windows_of(job, q, "correction")
        assert list(corr) == [p0 + 1] and corr[p0 + 1]["n"].tolist() == [1, 1, 1]
        assert corr[p0 + 1]["late_partials"].tolist() == [1, 1, 1]  # a folded late record, counted
        assert windows_of(job, q)[p0 + 1]["n"].tolist() == [2] * len(PORTS)  # finals are never rewritten
        text = generate_latest(job.metrics.registry).decode()
        assert 'lowwater_job_late_partials_total{host="h2",query="gate_timeout"} 3.0' in text
    finally:
        job.stop()


# -- exactly once across a crash ------------------------------------------------------------------
@pytest.mark.parametrize("state", ["blob", "chunked"])
def test_kill_and_restart_from_checkpoint_loses_and_duplicates_nothing(
    spark, kafka, topic_factory, tmp_path, state
):
    t = make_traffic(4000, 100, T0, 60 * 10**9, seed=3)
    queries = [
        variant(topic_factory, "tumble", "tumble_crash", 2),
        variant(topic_factory, "slide", "slide_crash", 2),
    ]
    msgs = traffic_messages(queries, t, seed=3)
    produce(kafka, msgs[: len(msgs) * 2 // 3])
    kw = dict(
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=HOSTS,
        host_timeout_ms=600_000,
        max_offsets_per_trigger=60,
        state=state,
    )
    job = start_job(spark, queries, tmp_path, "crash", **kw)
    last = crash_after_batches(job, state)
    produce(kafka, msgs[len(msgs) * 2 // 3 :])
    job2 = start_job(spark, queries, tmp_path, "crash", **kw)
    try:
        job2.process_all_available()
        first = job2.streams[0].recentProgress[0]["batchId"]
    finally:
        job2.stop()
    assert first == last  # the uncommitted batch was replayed (same offsets, same files)
    for q in queries:
        assert_exact(Path(job2.opts.results), q, t)


# -- the watermark baseline -----------------------------------------------------------------------
def test_watermark_baseline_writes_same_layout_and_drops_lagging_host(spark, kafka, topic_factory, tmp_path):
    t = make_traffic(3000, 50, T0, 90 * 10**9, seed=5)
    q = variant(topic_factory, "tumble", "tumble_wm", 2)
    msgs = traffic_messages([q], t, seed=5)
    # the lagging host's messages arrive after the other hosts' (a link 90 s behind): by then Spark's
    # watermark (max event time - 10 s) has passed most of its panes
    lagging = [m for m in msgs if wire.decode(m[2]).host == HOSTS[-1]]
    on_time = [m for m in msgs if wire.decode(m[2]).host != HOSTS[-1]]
    assert lagging and on_time
    job = start_job(
        spark,
        [q],
        tmp_path,
        "wm",
        bootstrap=kafka.bootstrap_servers,
        mode="watermark",
        watermark_delay_ms=10_000,
    )
    try:
        for chunk in (*np.array_split(np.arange(len(on_time)), 2), None):
            produce(kafka, lagging if chunk is None else [on_time[i] for i in chunk])
            job.process_all_available()
        prog = job.progress()
    finally:
        job.stop()
    got = read_results(Path(job.opts.results), q.name)
    exp = expected_typed(q, t)
    assert len(got) > 0
    assert list(got.columns[:2]) == ["window_start", "window_end"] and {
        "src_ip",
        "packets",
        "avg_len",
    } <= set(got.columns)
    # the lagging host is beyond the 10 s slack: Spark silently drops its partials, so windows it did
    # close are short (not merely the last windows left open at the end of the data)
    fin = normalised(got[got["kind"] == "final"], q)
    ref = normalised(exp, q)
    both = fin.merge(
        ref, on=["window_end", "src_ip", "dst_ip"], how="left", suffixes=("", "_exp"), validate="1:1"
    )
    assert both["packets_exp"].notna().all(), "a closed window holds a group the oracle does not have"
    assert (both["packets"] <= both["packets_exp"]).all()
    closed = ref[ref["window_end"].isin(fin["window_end"])]
    assert fin["packets"].sum() < closed["packets"].sum(), "closed windows are exact: nothing was dropped"
    (p,) = prog.values()
    assert p["stateRows"] > 0


# -- holistic aggregates end to end ----------------------------------------------------------------
def holistic_config(p: str, t1: str, t2: str) -> ConfigDoc:
    """Distinct sources per destination (sliding, with HAVING) and packet-size percentiles."""
    return config(
        query(
            f"{p}_sources",
            group_by=["dst_ip"],
            aggregates=["count_distinct(src_ip) as sources", "count as packets"],
            having="sources > 1",
            window={"range": "10s", "slide": "5s"},
            topic=t1,
            partitions=2,
        ),
        query(
            f"{p}_sizes",
            group_by=["protocol"],
            aggregates=[{"fn": "quantiles", "field": "length", "q": [0.5, 0.99], "as": "len"}],
            topic=t2,
            partitions=2,
        ),
    )


def test_holistic_distinct_and_quantiles_through_kafka_spark_store_and_api(
    spark, kafka, topic_factory, tmp_path
):
    """Distinct sources per destination (sliding) and packet-size percentiles on 2 partitions, three
    skewed hosts: the stored rows equal the second stage over the oracle, and the API serves them."""
    from fastapi.testclient import TestClient

    from high_level.aggregate import holistic
    from high_level.serve.api import create_app

    t = make_traffic(6000, 150, T0, 60 * 10**9, seed=17)
    rng = np.random.default_rng(17)
    t.src = (0x0A000000 + rng.integers(0, 400, len(t))).astype(np.uint32)
    t.length = np.minimum(60 + rng.lognormal(4.5, 1.2, len(t)).astype(np.int64), 9000)
    cfg_path = holistic_config(
        "hol", topic_factory(partitions=2, prefix="hl-hol1"), topic_factory(partitions=2, prefix="hl-hol2")
    ).write(tmp_path / "holistic.yaml")
    queries = Q.load(cfg_path).queries
    msgs = traffic_messages(queries, t)
    job = start_job(
        spark,
        queries,
        tmp_path,
        "holistic",
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=HOSTS,
        host_timeout_ms=600_000,
    )
    try:
        produce(kafka, msgs)
        job.process_all_available()
    finally:
        job.stop()
    results = Path(job.opts.results)
    for q in queries:
        wo = window_oracle(q, oracle(q, t))
        kc, sc = [c for c in wo.columns if c.startswith("k")], [c for c in wo.columns if c.startswith("s")]
        exp = holistic.offline(
            q, wo["window"].to_numpy(np.int64), wo[kc].to_numpy(np.int64), wo[sc].to_numpy(np.int64)
        )
        assert job.metrics.windows.labels(q.name)._value.get() == len(exp)  # (window, group)s, not sub-keys
        if q.having:
            exp = exp[exp["sources"] > 1]
        exp["window_end"] = pd.to_datetime(
            q.window.origin_ns + (exp["window"] + 1) * q.window.pane_ns, utc=True
        )
        key = q.key_parts[0].name
        exp[key] = [
            str(Q.decode_key(q, np.array(k))[key])
            for k in exp[[f"k{i}" for i in range(Q.group_width(q))]].to_numpy()
        ]
        got = read_results(results, q.name)
        got = got[got["kind"] == "final"].copy()
        got[key] = got[key].astype(str)
        cols = ["window_end", key, *Q.result_names(q)]
        g = got[cols].sort_values(cols[:2]).reset_index(drop=True)
        e = exp[cols].sort_values(cols[:2]).reset_index(drop=True)
        g["window_end"] = pd.to_datetime(g["window_end"], utc=True).astype("datetime64[ns, UTC]")
        e["window_end"] = e["window_end"].astype("datetime64[ns, UTC]")
        assert len(g) > 10
        pd.testing.assert_frame_equal(g, e, check_dtype=False)
    assert read_results(results, "hol_sources")["sources"].max() > 2
    with TestClient(create_app(cfg_path, results)) as c:
        body = c.get(
            "/queries/hol_sizes/results",
            params={"start": "2023-11-14T00:00:00Z", "end": "2023-11-15T00:00:00Z"},
        ).json()
        assert body["rows"] and {"len_p50", "len_p99"} <= set(body["rows"][0])
        assert all(r["len_p50"] <= r["len_p99"] for r in body["rows"])
        csv = c.get("/queries/hol_sources/latest", params={"format": "csv"})
        assert csv.status_code == 200 and "sources" in csv.text.splitlines()[0]
        info = c.get("/queries/hol_sizes").json()
        assert [a["name"] for a in info["aggregate_columns"]] == ["len_p50", "len_p99"]
