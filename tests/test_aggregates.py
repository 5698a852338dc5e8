"""The aggregate registry (contract/aggregates.py) and the bounded aggregates it adds by one entry each:
population ``variance`` and ``stddev`` (dissertation §6.2.2.1: state count, sum and sum of squares,
merged by adding). Pure logic first (exact finalize, layout, validation), then the generated kernel
against a hand-written oracle, then end to end: the agent's kernel on a pcap -> real Kafka -> the real
Spark job -> the results store, equal to the exact rational of every window's values."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contract import aggregates as A
from contract import fields as F
from contract import query as Q
from contract import results as R
from low_level.kernel.tables import Tables
from lowwater_testing.capture import make_query, run_kernel
from lowwater_testing.queries import ConfigDoc, config, query
from lowwater_testing.traffic import make_traffic, merge_partials, oracle

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def _exact_variance(values: list[int]) -> float:
    """Population variance as the exact rational, rounded once (Python's int / int is correctly rounded)."""
    n, s, sq = len(values), sum(values), sum(v * v for v in values)
    return (n * sq - s * s) / (n * n)


def test_every_function_is_declared_once_and_consistently() -> None:
    for fn, agg in A.REGISTRY.items():
        assert agg.fn == fn
        doc = {
            "fn": fn,
            **({"field": "length"} if agg.field_kinds else {}),
            **({"q": [0.5]} if fn == "quantiles" else {}),
            **({"k": 3} if fn == "top" else {}),
        }
        spec = Q.AggregateSpec.model_validate(doc)
        assert spec.holistic == agg.holistic
        assert all(p.merge in A.MERGE_UFUNCS for p in agg.parts(spec))
        assert all(kind in A.RESULT_KINDS for _, kind in spec.output_columns())
    assert set(R.FLOAT_FNS) == {k for k, r in A.RESULT_KINDS.items() if r.float}
    assert {"variance", "stddev"} <= set(R.FLOAT_FNS) and "count" not in R.FLOAT_FNS
    assert set(Q.HOLISTIC) == {"count_distinct", "quantiles", "top"}


def test_variance_finalize_is_the_exact_rational_correctly_rounded() -> None:
    rng = np.random.default_rng(3)
    groups = [list(map(int, rng.integers(0, 1 << 16, int(rng.integers(1, 400))))) for _ in range(300)]
    groups += [[7], [5, 5, 5], [0, 65535], [1, 2]]
    groups += [
        [2**30] * 3 + [2**29 + 1],
        [int(x) for x in rng.integers(2**26, 2**28, 50)],
    ]  # above 2^52: Python ints
    n = np.array([len(g) for g in groups] + [0], np.int64)
    s = np.array([sum(g) for g in groups] + [0], np.int64)
    sq = np.array([sum(v * v for v in g) for g in groups] + [0], np.int64)
    state = np.column_stack([n, s, sq])
    got = A.finalize([("variance", "v")], state)["v"]
    std = A.finalize([("stddev", "sd")], state)["sd"]
    for i, g in enumerate(groups):
        exact = Fraction(len(g) * sum(v * v for v in g) - sum(g) ** 2, len(g) ** 2)
        assert got[i] == float(exact) == _exact_variance(g), (i, g[:5])
        assert std[i] == math.sqrt(float(exact))
    assert np.isnan(got[-1]) and np.isnan(std[-1]), "an empty group has no variance"
    n, s1 = 2**27 + 1, 3  # many packets, few non-zero: n^2 is no exact float64
    big = A.finalize([("variance", "v")], np.array([[n, s1, 5]], np.int64))["v"][0]
    assert big == float(Fraction(n * 5 - s1 * s1, n * n))
    assert got[len(groups) - 6] == 0.0 and got[len(groups) - 5] == 0.0  # [7], [5, 5, 5]


def test_variance_state_is_count_sum_and_sum_of_squares() -> None:
    aggs = "[{fn: variance, field: length, as: v}, {fn: stddev, field: ttl}, {fn: count, as: n}]"
    q = make_query("lazy", 64, group="[dst_port]", aggs=aggs)
    cols = Q.state_columns(q)
    assert [c.name for c in cols] == [
        "v.count",
        "v.sum",
        "v.sumsq",
        "stddev_ttl.count",
        "stddev_ttl.sum",
        "stddev_ttl.sumsq",
        "n",
    ]
    assert all(c.merge == Q.MERGE_SUM for c in cols)
    assert [c.source for c in cols] == [Q.SRC_ONE, F.LEN, F.LEN, Q.SRC_ONE, F.TTL, F.TTL, Q.SRC_ONE]
    assert [c.square for c in cols] == [False, False, True, False, False, True, False]
    assert R.aggregate_columns(q) == [("v", "variance"), ("stddev_ttl", "stddev"), ("n", "count")]
    fin = Q.finalize(q, np.array([4, 10, 30, 2, 6, 20, 4]))
    assert fin == {"v": 1.25, "stddev_ttl": 1.0, "n": 4}


@pytest.mark.parametrize(
    ("agg", "reason"),
    [
        ("{fn: variance}", "variance needs a field"),
        ("{fn: stddev, field: src_ip}", "stddev needs a numeric field"),
        ("{fn: variance, field: src_mac}", "wider than 16 bits"),
        ("{fn: variance, field: length, k: 3}", "'k' is a parameter of top, not of variance"),
    ],
)
def test_variance_is_validated_with_a_reason(agg: str, reason: str) -> None:
    with pytest.raises(Q.ConfigError, match=reason):
        make_query("lazy", 64, aggs=f"[{agg}]")


@pytest.mark.parametrize("policy", ["lazy", "slow", "iop"])
def test_generated_kernel_sums_squares_exactly(policy: str) -> None:
    t = make_traffic(20_000, 300, T0, 12 * NS, seed=8)
    q = make_query(
        policy,
        64,
        group="[dst_port, protocol]",
        window="{range: 4s, slide: 2s}",
        aggs="[{fn: variance, field: length, as: v}, {fn: stddev, field: ttl, as: s}]",
    )
    got = merge_partials(q, *Tables.build([q]).split(0, run_kernel([q], t)[0]))
    assert got.equals(oracle(q, t))
    rows = t.rows()
    pane = (rows[:, F.TS] - q.window.origin_ns) // q.window.pane_ns
    d = pd.DataFrame(
        {
            "pane": pane,
            "k0": rows[:, F.DPORT],
            "k1": rows[:, F.PROTO],
            "len": rows[:, F.LEN],
            "ttl": rows[:, F.TTL],
        }
    )
    d["len2"], d["ttl2"] = d["len"] ** 2, d["ttl"] ** 2
    hand = d.groupby(["pane", "k0", "k1"], as_index=False).agg(
        n=("len", "size"), s0=("len", "sum"), q0=("len2", "sum"), s1=("ttl", "sum"), q1=("ttl2", "sum")
    )
    assert np.array_equal(
        got[["s0", "s1", "s2", "s4", "s5"]].to_numpy(), hand[["n", "s0", "q0", "s1", "q1"]].to_numpy()
    )
    assert np.array_equal(got["s3"].to_numpy(), hand["n"].to_numpy())


def spread_config(topic: str) -> ConfigDoc:
    """Packet counts, length variance and standard deviations per port, on 2 partitions."""
    return config(
        query(
            "spread",
            group_by=["dst_port"],
            aggregates=[
                "count as packets",
                "variance(length) as len_var",
                "stddev(length) as len_sd",
                "stddev(ttl) as ttl_sd",
                "avg(length) as len_avg",
            ],
            window="2s",
            table=256,
            topic=topic,
            partitions=2,
        )
    )


@pytest.mark.kafka
@pytest.mark.spark
def test_variance_and_stddev_end_to_end_equal_the_exact_oracle(
    spark, kafka, topic_factory, tmp_path: Path
) -> None:
    from lowwater_testing.agent import run_agent, traffic_pcap
    from lowwater_testing.spark import assert_exact, expecting, read_results, run_job

    cfg = tmp_path / "v.yaml"
    t, pcap = traffic_pcap(tmp_path / "v.pcap", 12_000, 600, T0, 12 * NS, seed=29)
    spread_config(topic_factory(partitions=2)).write(cfg)
    run_agent(cfg, f"pcap:{pcap}", host="cap-1", bootstrap=kafka.bootstrap_servers)
    q = Q.load(cfg).queries[0]
    job = run_job(spark, [q], tmp_path, "spread", **expecting(kafka, ["cap-1"]))
    assert_exact(Path(job.opts.results), q, t)  # the suite's oracle, finalized by the registry
    got = read_results(Path(job.opts.results), "spread")
    got = got[got["kind"] == "final"]
    rows = t.rows()
    end = (
        q.window.origin_ns
        + ((rows[:, F.TS] - q.window.origin_ns) // q.window.range_ns + 1) * q.window.range_ns
    )
    by: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e, port, length, ttl in zip(end, rows[:, F.DPORT], rows[:, F.LEN], rows[:, F.TTL], strict=True):
        by.setdefault((int(e), int(port)), []).append((int(length), int(ttl)))
    assert len(got) == len(by) > 20
    for r in got.itertuples(index=False):
        vals = by[(pd.Timestamp(r.window_end).value, int(r.dst_port))]
        lens, ttls = [v[0] for v in vals], [v[1] for v in vals]
        assert r.packets == len(vals)
        assert r.len_var == _exact_variance(lens), (r.window_end, r.dst_port)
        assert r.len_sd == math.sqrt(_exact_variance(lens))
        assert r.ttl_sd == math.sqrt(_exact_variance(ttls))
        assert r.complete
