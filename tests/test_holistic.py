"""Holistic aggregates (distinct count, quantiles, top-k): computed sub-keys in the generated kernel,
the roll-up under disorder, the second stage against a brute-force oracle, the HLL and quantile
error bounds, the store's columns, HAVING and alerts over the new aggregates."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contract import query as Q
from contract import results as R
from contract import sketch
from high_level.aggregate import holistic
from high_level.aggregate.processor import Settings
from high_level.results.store import ResultStore, typed_table
from low_level.kernel import sketchkey
from low_level.kernel.tables import Tables
from lowwater_testing.capture import run_kernel
from lowwater_testing.hosts import HOSTS, emulated_messages, final_rows, run_offline, step_rows
from lowwater_testing.oracle import packet_partials, window_oracle
from lowwater_testing.queries import config, query, spec
from lowwater_testing.traffic import NS, T0, make_mixed_traffic, make_traffic, merge_partials, oracle


def talkers(capacity: int | None = None) -> dict:
    """Top 3 sources by bytes per destination /24 (a Misra-Gries summary of ``capacity`` items if given)."""
    top = {"fn": "top", "field": "src_ip", "k": 3, "capacity": capacity, "by": "length", "as": "bytes"}
    return query(
        "talkers",
        group_by=["dst_ip/24"],
        aggregates=[{k: v for k, v in top.items() if v is not None}, "count as packets"],
        table=512,
    )


CONFIG = config(
    query(
        "scan",
        group_by=["dst_ip"],
        aggregates=[
            "count as packets",
            "count_distinct(src_ip) as sources",
            "avg(length) as avg_len",
            "max(ttl) as max_ttl",
        ],
        having="sources > 3",
        alerts=[{"name": "scan", "when": "sources >= 10", "severity": "critical"}],
        window={"range": "10s", "slide": "5s"},
        table=256,
    ),
    query(
        "scanhll",
        group_by=["dst_ip"],
        aggregates=[
            {"fn": "count_distinct", "field": "src_ip", "approx": "hll", "precision": 8, "as": "sources"},
            "count as packets",
        ],
        table=256,
    ),
    query(
        "porthll",
        aggregates=[{"fn": "count_distinct", "field": "src_port", "approx": "hll", "as": "ports"}],
        table=1024,
        window={"range": "9s", "slide": "3s"},
    ),
    query(
        "sizes",
        group_by=["protocol"],
        aggregates=[
            {"fn": "quantiles", "field": "length", "q": [0.5, 0.95, 0.99], "as": "len"},
            "sum(length) as bytes",
        ],
        having="len_p95 > 100",
        table=128,
    ),
    query(
        "ttls",
        group_by=["dst_port"],
        aggregates=[{"fn": "quantiles", "field": "ttl", "q": [0.1, 0.5, 0.9], "accuracy": 0, "as": "ttl"}],
        table=64,
    ),
    talkers(),
    query(
        "dscps",
        group_by=["protocol"],
        aggregates=[{"fn": "count_distinct", "field": "dscp", "approx": "hll", "precision": 4, "as": "n"}],
        table=16,
    ),
).text


@pytest.fixture(scope="module")
def cfg() -> Q.Config:
    return Q.load_text(CONFIG)


def _spread(t, seed: int, sources: int = 2000):
    """Many sources per destination (scans), lengths spread over decades (quantile buckets)."""
    rng = np.random.default_rng(seed)
    t.src = (0x0A000000 + rng.integers(0, sources, len(t))).astype(np.uint32)
    t.length = np.minimum(60 + rng.lognormal(4.5, 1.2, len(t)).astype(np.int64), 9000)
    return t


@pytest.fixture(scope="module")
def traffic():
    return _spread(make_traffic(12000, 300, T0, 60 * NS, seed=21), 3)


# -- the per-packet computed keys ------------------------------------------------------------------
def test_numba_sketch_keys_equal_the_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(-(1 << 63), (1 << 63) - 1, (20000, 2), dtype=np.int64)
    for p in (4, 14, 18):
        reg2, rank2 = sketch.hll_register_rank(w, p)
        reg1, rank1 = sketch.hll_register_rank(w[:, :1], p)
        for i in range(0, 20000, 97):
            h2 = np.uint64(sketchkey.value_hash2(w[i, 0], w[i, 1]))
            h1 = np.uint64(sketchkey.value_hash1(w[i, 0]))
            assert (sketchkey.hll_register(h2, p), sketchkey.hll_rank(h2, p)) == (reg2[i], rank2[i])
            assert (sketchkey.hll_register(h1, p), sketchkey.hll_rank(h1, p)) == (reg1[i], rank1[i])
        assert rank2.min() >= 1 and rank2.max() <= 65 - p
    v = np.r_[rng.integers(-(10**9), 10**9, 5000), -1, 0, 1, 2, 3, np.int64(2**62)]
    for acc in (0.01, 0.05, 0.001):
        ref = sketch.log_bucket(v, acc)
        inv = sketch.inv_log_gamma(acc)
        assert [sketchkey.log_bucket(x, inv) for x in v.tolist()] == ref.tolist()
        assert np.all(np.diff(ref[np.argsort(v)]) >= 0)  # monotone: sorted buckets are sorted values


def test_kernel_computes_sub_keys_and_ranks_exactly(cfg) -> None:
    """One generated pass over the computed holistic shapes (address HLL, dscp HLL, buckets, items
    weighted by bytes) with small tables (evictions, overdue packets): merged partials equal the oracle,
    whose sub-keys come from contract.sketch, not from the kernel's key program."""
    qs = [cfg.query(n) for n in ("scanhll", "sizes", "talkers", "dscps")]  # each computed shape, one compile
    t = _spread(make_mixed_traffic(20000, 400, T0, 20 * NS, seed=5), 6)
    recs = run_kernel(qs, t)
    for i, q in enumerate(qs):
        got = merge_partials(q, *Tables.build([q]).split(0, recs[i]))
        assert got.equals(oracle(q, t)), q.name


# -- the second stage against brute force ----------------------------------------------------------
def _packets_per_window(q: Q.QuerySpec, t) -> pd.DataFrame:
    """Per matching packet and window containing it: the window id, group words and the raw values."""
    rows = t.rows()
    idx, pane, key, _ = packet_partials(q, rows)
    r = rows[idx]
    k, s = q.window.panes_per_window, q.window.panes_per_slide
    gw = Q.group_width(q)
    out = []
    for j in range(k):
        w = pane + j
        ok = (w - (k - 1)) % s == 0
        d = {"window": w[ok], **{f"g{i}": key[ok, i] for i in range(gw)}}
        d["len"], d["src_lo"], d["ttl"] = r[ok, 9], r[ok, 3], r[ok, 12]
        out.append(pd.DataFrame(d))
    return pd.concat(out, ignore_index=True)


def _stage2(q: Q.QuerySpec, wo: pd.DataFrame) -> pd.DataFrame:
    kc = [c for c in wo.columns if c.startswith("k")]
    sc = [c for c in wo.columns if c.startswith("s")]
    return holistic.offline(
        q, wo["window"].to_numpy(np.int64), wo[kc].to_numpy(np.int64), wo[sc].to_numpy(np.int64)
    )


def test_second_stage_equals_brute_force(cfg, traffic) -> None:
    # distinct sources per destination, sliding windows: the union of pane sets
    q = cfg.query("scan")
    got = _stage2(q, window_oracle(q, oracle(q, traffic))).sort_values(["window", "k0", "k1"])
    raw = _packets_per_window(q, traffic)
    exp = (
        raw.groupby(["window", "g0", "g1"])
        .agg(
            sources=("src_lo", "nunique"),
            packets=("len", "size"),
            avg_len=("len", "mean"),
            max_ttl=("ttl", "max"),
        )
        .reset_index()
    )
    assert len(got) == len(exp) and exp["sources"].max() > 10
    assert np.array_equal(got["sources"], exp["sources"]) and np.array_equal(got["packets"], exp["packets"])
    assert np.array_equal(got["max_ttl"], exp["max_ttl"]) and np.allclose(got["avg_len"], exp["avg_len"])
    # exact quantiles (accuracy 0): the nearest-rank value itself
    q = cfg.query("ttls")
    got = _stage2(q, window_oracle(q, oracle(q, traffic))).sort_values(["window", "k0"])
    raw = _packets_per_window(q, traffic)
    for x, col in ((0.1, "ttl_p10"), (0.5, "ttl_p50"), (0.9, "ttl_p90")):
        exp = raw.groupby(["window", "g0"])["ttl"].apply(
            lambda v, x=x: np.sort(v.to_numpy())[int(sketch.quantile_rank(x, np.array([len(v)]))[0]) - 1]
        )
        assert np.array_equal(got[col].to_numpy(), exp.to_numpy().astype(float)), col
    # top 3 sources by bytes per /24: weight desc, then smaller address first
    q = cfg.query("talkers")
    got = _stage2(q, window_oracle(q, oracle(q, traffic)))
    raw = _packets_per_window(q, traffic)
    w = raw.groupby(["window", "g0", "g1", "src_lo"], as_index=False).agg(
        bytes=("len", "sum"), packets=("len", "size")
    )
    w = w.sort_values(["window", "g0", "g1", "bytes", "src_lo"], ascending=[True, True, True, False, True])
    w["rank"] = w.groupby(["window", "g0", "g1"]).cumcount() + 1
    exp = w[w["rank"] <= 3].reset_index(drop=True)
    assert np.array_equal(got["k3"], exp["src_lo"]) and np.array_equal(got["bytes"], exp["bytes"])
    assert np.array_equal(got["bytes_rank"], exp["rank"]) and np.array_equal(got["packets"], exp["packets"])


def test_quantile_sketch_within_its_relative_accuracy(cfg, traffic) -> None:
    """Every sketch quantile is within accuracy (1%) of the true nearest-rank value, and equals the
    representative of the true value's bucket exactly (same buckets under any order)."""
    q = cfg.query("sizes")
    got = _stage2(q, window_oracle(q, oracle(q, traffic))).sort_values(["window", "k0"])
    raw = _packets_per_window(q, traffic)
    acc = q.aggregates[0].quantile_accuracy
    assert acc == 0.01
    for x, col in ((0.5, "len_p50"), (0.95, "len_p95"), (0.99, "len_p99")):
        true = (
            raw.groupby(["window", "g0"])["len"]
            .apply(
                lambda v, x=x: np.sort(v.to_numpy())[int(sketch.quantile_rank(x, np.array([len(v)]))[0]) - 1]
            )
            .to_numpy()
        )
        est = got[col].to_numpy()
        assert np.all(np.abs(est - true) <= acc * true + 1e-9), col
        assert np.array_equal(est, sketch.bucket_value(sketch.log_bucket(true, acc), acc))


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_hll_error_at_the_default_precision_over_a_million_values(seed: int) -> None:
    """p = 14 (std error 0.81%): within 2% over 10^6 distinct addresses, through the second stage."""
    q = spec("d", aggregates=[{"fn": "count_distinct", "field": "src_ip", "approx": "hll"}])
    p = q.aggregates[0].hll_precision
    assert p == sketch.HLL_DEFAULT_P and sketch.hll_relative_error(p) < 0.0082
    rng = np.random.default_rng(seed)
    n = 1_000_000
    words = np.column_stack([np.zeros(n, np.int64), 0xFFFF_0000_0000 + rng.choice(1 << 32, n, replace=False)])
    reg, rank = sketch.hll_register_rank(words, p)
    regs = pd.Series(rank).groupby(reg).max()  # what the roll-up's max merge leaves per register
    est = _stage2(
        q, pd.DataFrame({"window": 0, "k0": regs.index.to_numpy(np.int64), "s0": regs.to_numpy(np.int64)})
    )
    assert abs(int(est["distinct_src_ip"].iloc[0]) / n - 1) <= 0.02
    # small cardinalities: linear counting is close to exact
    few = rng.choice(1 << 32, 500, replace=False).reshape(-1, 1).astype(np.int64)
    reg, rank = sketch.hll_register_rank(few, p)
    regs = pd.Series(rank).groupby(reg).max()
    est = _stage2(
        q, pd.DataFrame({"window": 0, "k0": regs.index.to_numpy(np.int64), "s0": regs.to_numpy(np.int64)})
    )
    assert abs(int(est["distinct_src_ip"].iloc[0]) - 500) <= 5


def test_hll_error_agrees_with_datasketches_magnitude() -> None:
    """An independent implementation (Apache DataSketches HLL, same precision) on the same values
    errs by the same order of magnitude: both within 3 standard errors."""
    ds = pytest.importorskip("datasketches")
    rng = np.random.default_rng(7)
    n, p = 200_000, 12
    vals = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    reg, rank = sketch.hll_register_rank(vals.reshape(-1, 1), p)
    regs = pd.Series(rank).groupby(reg).max()
    z = np.ldexp(1.0, -regs.to_numpy()).sum()
    ours = float(sketch.hll_estimate(np.array([z]), np.array([len(regs)]), p)[0])
    h = ds.hll_sketch(p, ds.tgt_hll_type.HLL_8)
    for v in vals.tolist():
        h.update(v)
    bound = 3 * sketch.hll_relative_error(p)
    assert abs(ours / n - 1) <= bound and abs(h.get_estimate() / n - 1) <= bound


# -- the roll-up under disorder: the first stage is a plain key, exact ---------------------------------
@pytest.mark.parametrize("name", ["scan", "sizes", "talkers", "porthll"])
def test_processor_exact_for_holistic_under_disorder(cfg, traffic, name) -> None:
    q = cfg.query(name)
    exp = window_oracle(q, oracle(q, traffic))
    want = _stage2(q, exp)
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS)
    for partitions, punct, seed in ((1, 1, 0), (2, 1, 1), (4, 10, 2)):
        msgs = emulated_messages(q, traffic, partitions, punct_every_s=punct, seed=seed)
        df = run_offline([q], msgs, partitions, settings, batches=11)
        assert final_rows(df, q).equals(exp), (partitions, punct)
        # each partition completes its groups: the second stage per partition gives the whole answer
        fin = df[(df["kind"] == "final") & (df["query"] == q.name)]
        parts = [_stage2(q, final_rows(fin[fin["partition"] == p], q)) for p in range(partitions)]
        got = pd.concat(parts, ignore_index=True)
        kc = [c for c in got.columns if c.startswith("k")]
        got = got.sort_values(["window", *kc], kind="stable").reset_index(drop=True)
        w2 = want.sort_values(["window", *kc], kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, w2, check_dtype=False)


def test_partition_is_a_hash_of_the_group_words_only(cfg) -> None:
    from contract import wire

    q = cfg.query("scan")
    assert Q.partition_width(q) == 2 and Q.key_width(q) == 4
    plain = spec("p", group_by=["src_ip", "dst_ip"], aggregates=["count"], window="1s")
    assert Q.partition_width(plain) == Q.key_width(plain) == 4  # unchanged
    key = np.array([[0, 5, 0, 1], [0, 5, 0, 2], [0, 5, 7, 9]], np.int64)
    part = wire.partition_of(key[:, : Q.partition_width(q)], 8)
    assert part[0] == part[1] == part[2]


# -- the store: final columns, HAVING, alerts, corrections -----------------------------------------
def test_store_writes_final_columns_having_and_alerts(cfg, traffic, tmp_path) -> None:
    qs = [cfg.query(n) for n in ("scan", "sizes", "talkers")]
    store = ResultStore(tmp_path, qs)
    for q in qs:
        wo = window_oracle(q, oracle(q, traffic))
        want = _stage2(q, wo)
        n = len(wo)
        lay_end = q.window.origin_ns + (wo["window"].to_numpy(np.int64) + 1) * q.window.pane_ns
        kc = [c for c in wo.columns if c.startswith("k")]
        sc = [c for c in wo.columns if c.startswith("s")]
        kind = np.where(np.arange(n) % 50 == 7, "correction", "final")
        key, state = list(wo[kc].to_numpy(np.int64)), list(wo[sc].to_numpy(np.int64))
        rows = step_rows(
            q, wo["window"].to_numpy(), lay_end - q.window.range_ns, lay_end, key, state, kind, 1
        )
        typed = typed_table(q, rows)
        assert typed.schema == R.schema(q)
        assert [c for c, _ in R.aggregate_columns(q)] == [
            c for c in typed.column_names if c in Q.result_names(q)
        ]
        fin = typed.filter(pa.compute.equal(typed["kind"], "final")).to_pandas()
        if q.name == "scan":  # the final rows lack the correction rows' values: fewer or equal sources
            assert set(typed.column_names) >= {"dst_ip", "sources", "packets", "avg_len", "max_ttl"}
            assert (fin["sources"] <= np.sort(want["sources"])[-1]).all() and len(fin) >= len(want) * 0.5
        if q.name == "talkers":
            assert {"dst_ip_24", "src_ip", "bytes", "bytes_rank"} <= set(typed.column_names)
            assert fin["bytes_rank"].between(1, 3).all()
        store.write_batch(1, rows)
    fired = store.write_alerts(1)
    assert fired.num_rows > 0 and set(fired["alert"].to_pylist()) == {"scan"}
    assert store.having_dropped.get("scan", 0) > 0
    # the API serves the final columns (a top query's item is a key column), as JSON and CSV
    from fastapi.testclient import TestClient

    from high_level.serve.api import create_app

    (tmp_path / "q.yaml").write_text(CONFIG)
    span = {"start": "2023-11-14T22:00:00Z", "end": "2023-11-14T23:00:00Z"}
    with TestClient(create_app(tmp_path / "q.yaml", tmp_path)) as c:
        info = c.get("/queries/talkers").json()
        assert [k["name"] for k in info["key_columns"]] == ["dst_ip_24", "src_ip"]
        assert [a["name"] for a in info["aggregate_columns"]] == ["bytes", "bytes_rank", "packets"]
        rows = c.get("/queries/talkers/results", params=span).json()["rows"]
        assert rows and all(1 <= r["bytes_rank"] <= 3 and "." in r["src_ip"] for r in rows)
        csv = c.get("/queries/sizes/results", params={**span, "format": "csv"})
        assert csv.status_code == 200 and "len_p95" in csv.text.splitlines()[0]
        rows = c.get("/queries/scan/results", params={**span, "order_by": "-sources"}).json()["rows"]
        assert rows and rows[0]["sources"] >= rows[-1]["sources"] and all(r["sources"] > 3 for r in rows)


def test_reduce_keeps_kinds_apart_and_merges_completeness() -> None:
    q = spec("d", group_by=["dst_port"], aggregates=["count_distinct(src_port) as n", "count as c"])
    window = np.array([5, 5, 5, 5, 6], np.int64)
    kind = np.array([1, 1, 0, 1, 1], np.int64)
    key = np.array([[80, 1], [80, 2], [80, 1], [443, 9], [80, 1]], np.int64)
    state = np.array([[3, 3], [1, 1], [2, 2], [4, 4], [1, 1]], np.int64)
    comp = np.array([[3, 0, 0], [2, 1, 0], [3, 4, 1], [3, 0, 0], [3, 0, 2]], np.int64)
    hosts = np.array([3, 3, 3, 3, 3], np.int32)
    red = holistic.reduce(
        q, window, kind, key, state, hosts, hosts, comp, np.array([1, 2, 3, 4, 5], np.int64)
    )
    # (5, correction, 80), (5, final, 80), (5, final, 443), (6, final, 80)
    assert red.key[:, 0].tolist() == [80, 80, 443, 80]
    assert red.values["n"].tolist() == [1, 2, 1, 1] and red.values["c"].tolist() == [2, 4, 4, 1]
    assert red.comp.tolist() == [[3, 4, 1], [2, 1, 0], [3, 0, 0], [3, 0, 2]]
    assert red.closed_at_ms.tolist() == [3, 2, 4, 5]


def test_result_names_and_api_types(cfg) -> None:
    q = cfg.query("sizes")
    assert Q.result_names(q) == ["len_p50", "len_p95", "len_p99", "bytes"]
    assert [f.type for f in R.schema(q) if f.name.startswith("len_")] == [pa.float64()] * 3
    assert Q.quantile_suffix(0.999) == "p99_9" and Q.quantile_suffix(0.5) == "p50"
    assert math.isclose(sketch.hll_relative_error(14), 0.0081, rel_tol=0.01)


# -- top with capacity: a Misra-Gries summary per (pane, group) in the roll-up -----------------------------
def test_misra_gries_bound_and_state_per_pane_and_group() -> None:
    from high_level.aggregate.rollup import Layout, QueryRollup, error_rows

    c, gw = 8, 1
    ru = QueryRollup(Layout("t", "t", 1, 1, 0, 1, (Q.MERGE_SUM, Q.MERGE_SUM), 2, gw=gw, top_capacity=c))
    rng = np.random.default_rng(7)
    truth: dict[tuple[int, int, int], int] = {}
    reduced = 0
    for _ in range(12):  # batches: the reduction repeats after every merge
        n = 3000
        pane, grp = rng.integers(0, 3, n), rng.integers(0, 4, n)
        item, w = rng.zipf(1.3, n) % 400, rng.integers(1, 50, n)
        for t in zip(pane.tolist(), grp.tolist(), item.tolist(), w.tolist(), strict=True):
            truth[t[:3]] = truth.get(t[:3], 0) + t[3]
        ru.add(pane, np.column_stack([grp, item]), np.column_stack([np.ones(n, np.int64), w]))
        per_group = pd.DataFrame({"p": ru.pane, "g": ru.key[:, 0]}).groupby(["p", "g"]).size()
        assert per_group.max() <= c + 1
    err = error_rows(ru.key, gw)
    assert err.sum() == 12  # every (pane, group) was reduced
    p, k, w = ru.pane.tolist(), ru.key.tolist(), ru.state[:, 1].tolist()
    bound = {(p[j], k[j][0]): w[j] for j in np.flatnonzero(err)}
    got = {(p[j], k[j][0], k[j][1]): w[j] for j in np.flatnonzero(~err)}
    for (p, g, i), true in truth.items():
        e, rep = bound[(p, g)], got.get((p, g, i), 0)
        assert true - e <= rep <= true, (p, g, i)
        reduced += rep < true
        if true > e:  # heavier than the bound: always kept
            assert (p, g, i) in got
    assert reduced > 0 and max(bound.values()) > 0


def _capacity_query(capacity: int) -> Q.QuerySpec:
    return config(talkers(capacity)).load().query("talkers")


@pytest.fixture(scope="module")
def skewed():
    """Zipf sources: heavy hitters above the Misra-Gries bound, a long tail below it."""
    t = make_traffic(12000, 300, T0, 60 * NS, seed=22)
    rng = np.random.default_rng(4)
    t.src = (0x0A000000 + rng.zipf(1.4, len(t)) % 3000).astype(np.uint32)
    return t


@pytest.mark.parametrize("capacity", [100_000, 12])
def test_processor_top_with_capacity_under_disorder(capacity, skewed) -> None:
    q = _capacity_query(capacity)
    exp = window_oracle(q, oracle(q, skewed))
    want = _stage2(q, exp)  # the exact answer (the oracle does not reduce), error 0
    kc = [c for c in exp.columns if c.startswith("k")]
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS)
    top1 = 0
    for partitions, punct, seed in ((1, 1, 0), (4, 10, 2)):
        msgs = emulated_messages(q, skewed, partitions, punct_every_s=punct, seed=seed)
        df = run_offline([q], msgs, partitions, settings, batches=11)
        fin = df[(df["kind"] == "final") & (df["query"] == q.name)]
        parts = [_stage2(q, final_rows(fin[fin["partition"] == p], q)) for p in range(partitions)]
        got = pd.concat(parts, ignore_index=True).sort_values(["window", *kc], kind="stable")
        got = got.reset_index(drop=True)
        if capacity >= 3000:  # every partial state fits: exact
            w2 = want.sort_values(["window", *kc], kind="stable").reset_index(drop=True)
            pd.testing.assert_frame_equal(got, w2, check_dtype=False)
            assert (got["bytes_error"] == 0).all()
            continue
        m = got.merge(exp, on=["window", *kc], how="left", validate="one_to_one")
        true = m["s1"].to_numpy()  # s0 packets, s1 bytes per (window, group, item)
        assert (m["bytes_error"] > 0).any()
        assert ((true - m["bytes_error"] <= m["bytes"]) & (m["bytes"] <= true)).all()
        assert (m["packets"] <= m["s0"]).all()
        # the true top-1 item of a group is reported when its weight minus the bound beats the true 4th
        g = exp.sort_values(["window", "k0", "k1", "s1"], ascending=[True, True, True, False])
        g["pos"] = g.groupby(["window", "k0", "k1"]).cumcount()
        t1 = g[g["pos"] == 0].set_index(["window", "k0", "k1"])
        t4 = g[g["pos"] == 3].set_index(["window", "k0", "k1"])["s1"]
        eb = got.groupby(["window", "k0", "k1"])["bytes_error"].max()
        t1 = t1.join(eb, how="inner").join(t4.rename("s1_4th"), how="left").fillna({"s1_4th": 0})
        sure = t1[t1["s1"] - t1["bytes_error"] > t1["s1_4th"]].reset_index()
        hit = sure.merge(got, on=["window", *kc], how="left", indicator=True)
        assert (hit["_merge"] == "both").all()
        top1 += len(sure)
    assert capacity >= 3000 or top1 > 0


def test_bounded_top_ranks_items_only_and_reports_the_error_per_group() -> None:
    from high_level.aggregate.rollup import ERROR_ITEM

    q = _capacity_query(4)
    assert [n for n, _ in R.aggregate_columns(q)] == ["bytes", "bytes_rank", "bytes_error", "packets"]
    assert R.schema(q).field("bytes_error").type == pa.int64()
    e = ERROR_ITEM
    window = np.array([5, 5, 5, 5, 5, 6], np.int64)
    key = np.array(
        [[0, 7, 0, 1], [0, 7, e, e], [0, 7, 0, 2], [0, 7, 0, 3], [0, 8, 0, 4], [0, 7, 0, 1]], np.int64
    )
    state = np.array([[1, 50], [0, 900], [2, 40], [3, 60], [1, 5], [1, 9]], np.int64)
    got = holistic.offline(q, window, key, state)
    # the error row (weight 900) is never ranked; it bounds its own (window, group) only
    assert got["k3"].tolist() == [3, 1, 2, 4, 1] and got["bytes_rank"].tolist() == [1, 2, 3, 1, 1]
    assert got["bytes_error"].tolist() == [900, 900, 900, 0, 0] and got["packets"].tolist() == [3, 1, 2, 1, 1]


def test_misra_gries_bound_holds_through_the_landmark_fold() -> None:
    from high_level.aggregate.rollup import Layout, QueryRollup, error_rows

    c, ops = 5, (Q.MERGE_SUM, Q.MERGE_SUM)
    ru = QueryRollup(Layout("t", "t", 1, 4, 0, 4, ops, 2, s=4, landmark=True, gw=1, top_capacity=c))
    rng = np.random.default_rng(3)
    truth: dict[tuple[int, int], int] = {}
    for pane in range(4):  # one landmark window of 4 panes: the closed ones fold into one pane
        n = 2000
        grp, item, w = rng.integers(0, 2, n), rng.zipf(1.3, n) % 300, rng.integers(1, 50, n)
        for t in zip(grp.tolist(), item.tolist(), w.tolist(), strict=True):
            truth[t[:2]] = truth.get(t[:2], 0) + t[2]
        ru.add(
            np.full(n, pane, np.int64),
            np.column_stack([grp, item]),
            np.column_stack([np.ones(n, np.int64), w]),
        )
        win = ru.close(pane + 1)
        per_group = pd.DataFrame({"p": ru.pane, "g": ru.key[:, 0]}).groupby(["p", "g"]).size()
        assert len(ru) == 0 or per_group.max() <= c + 1
    assert len(ru) == 0 and len(win) and win.window.tolist() == [3] * len(win)
    err = error_rows(win.key, 1)
    bound = dict(zip(win.key[err, 0].tolist(), win.state[err, 1].tolist(), strict=True))
    got = dict(zip(map(tuple, win.key[~err].tolist()), win.state[~err, 1].tolist(), strict=True))
    assert (
        len(bound) == 2 and len(got) <= 2 * 2 * c
    )  # per group: the folded pane's c items, the last pane's c
    for (g, i), true in truth.items():
        assert true - bound[g] <= got.get((g, i), 0) <= true
        assert true <= bound[g] or (g, i) in got
