"""HAVING and alerts over the window's total (``total(bytes)``, dissertation Q6-4 heavy hitters): the
condition language against a reference, config errors with file and line, the hold-until-every-
partition gate (replay, restart), and the real Kafka + Spark job under skew, disorder, 3 partitions
and a kill/restart against a pandas oracle of the whole window."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract import aggregates as A
from contract import condlang as C
from contract import query as Q
from contract import results as R
from contract import status as S
from contract import wire
from high_level.aggregate.packed import QueryWindows
from high_level.results.windowtotal import TotalGate
from lowwater_testing.queries import config, query
from lowwater_testing.traffic import make_traffic

T0 = 1_700_000_000_000_000_000
NS = 10**9


def hh_text(
    having: str = "bytes >= 0.05 * total(bytes)", when: str = "packets >= 0.1 * total(packets)", **kw
):
    return config(
        query(
            "hh",
            group_by=["dst_ip"],
            aggregates=[
                "count as packets",
                "sum(length) as bytes",
                "avg(length) as avg_len",
                "max(ttl) as top_ttl",
            ],
            having=having,
            alerts=[{"name": "elephant", "when": when, "severity": "warning"}],
            window=kw.pop("window", {"range": "10s", "slide": "5s"}),
            **kw,
        )
    ).text


def test_total_in_the_condition_language_matches_a_python_reference():
    rng = np.random.default_rng(1)
    n = 400
    win = rng.integers(0, 7, n)
    cols = {"a": rng.integers(0, 1000, n), "m": rng.integers(-50, 50, n), "f": rng.normal(0, 1, n)}
    fin = rng.random(n) < 0.8  # corrections are not part of a window's total
    tot_a = {w: cols["a"][(win == w) & fin].sum() for w in range(7)}
    max_m = {w: cols["m"][(win == w) & fin].max() for w in range(7)}
    cols[C.total_column("a")] = A.window_total("sum", cols["a"], win, fin)
    cols[C.total_column("m")] = A.window_total("max", cols["m"], win, fin)
    cases = {
        "a >= 0.05 * total(a)": lambda i: cols["a"][i] >= 0.05 * tot_a[win[i]],
        "a * 20 >= total(a) and not m == total(m)": lambda i: (
            cols["a"][i] * 20 >= tot_a[win[i]] and not cols["m"][i] == max_m[win[i]]
        ),
        "total(m) - m < 3 or a / total(a) > 0.1": lambda i: (
            max_m[win[i]] - cols["m"][i] < 3 or cols["a"][i] / tot_a[win[i]] > 0.1
        ),
    }
    for text, ref in cases.items():
        got = C.evaluate(C.parse(text, ["a", "m", "f"], ["a", "m"]), cols, n)
        assert got.tolist() == [bool(ref(i)) for i in range(n)], text
    node = C.parse("a > total(a) / 2", ["a", "m", "f", "total"], ["a"])
    assert C.totals(node) == {"a"} and C.names(node) == {"a"}
    assert C.names(C.parse("total > 1", ["total"])) == {"total"}  # an aggregate named total still reads
    for bad, why in (
        ("a > total(f)", "no window total"),
        ("a > total(x)", "takes one of the query's aggregates"),
        ("a > total(a", "expected ')'"),
        ("a > total(1)", "takes one of"),
    ):
        with pytest.raises(C.ConditionError, match=re.escape(why)):
            C.parse(bad, ["a", "m", "f"], ["a", "m"])
    with pytest.raises(C.ConditionError, match="no window total"):
        C.parse("a > total(a)", ["a"])  # totals not offered: a caller that cannot compute them


def test_total_config_is_checked_with_file_and_line():
    cfg = Q.load_text(hh_text())
    assert Q.window_totals(cfg.query("hh")) == {"bytes": "sum", "packets": "sum"}
    assert Q.window_totals(Q.load_text(hh_text("top_ttl >= total(top_ttl)", "packets > 1")).query("hh")) == {
        "top_ttl": "max"
    }
    for having, want in (
        ("bytes >= 0.05 * total(avg_len)", "total(avg_len): 'avg_len' has no window total"),
        ("bytes >= total(nope)", "total() takes one of the query's aggregates"),
    ):
        with pytest.raises(Q.ConfigError) as e:
            Q.load_text(hh_text(having), "configs/hh.yaml")
        msg = str(e.value)
        assert msg.startswith("configs/hh.yaml:") and "having" in msg and want in msg, msg
        assert int(msg.split(":")[1]) > 1  # the line of the having key, not the file's start
    with pytest.raises(Q.ConfigError, match="alert 'elephant'.*no window total"):
        Q.load_text(hh_text(when="packets > total(avg_len)"), "configs/hh.yaml")
    with pytest.raises(Q.ConfigError, match="landmark"):
        Q.load_text(hh_text(window={"landmark": "20s", "update": "5s"}), "configs/hh.yaml")
    holistic = config(
        query(
            "hd",
            group_by=["dst_port"],
            aggregates=["count as packets", "count_distinct(src_ip) as sources"],
            having="packets >= 0.1 * total(packets)",
        )
    ).text
    with pytest.raises(Q.ConfigError, match="no window total"):
        Q.load_text(holistic, "configs/hd.yaml")


def _wins(window, rank, values) -> QueryWindows:
    n = len(window)
    return QueryWindows(
        np.asarray(window, np.int64),
        np.asarray(rank, np.int8),
        np.arange(n, dtype=np.int64).reshape(n, 1),
        np.asarray(values, np.int64).reshape(n, 1),
        np.zeros(n, np.int64),
        np.ones(n, np.int32),
        np.ones(n, np.int32),
        np.zeros((n, 3), np.int64),
    )


def _st(p: int, closed: int | None, lwm: int = 0) -> S.PartitionStatus:
    return S.PartitionStatus.model_construct(
        query="hh", partition=p, closed_before_window=closed, low_water_mark_pane=lwm
    )


def test_gate_holds_until_every_partition_closed_and_replays_and_restarts_the_same(tmp_path):
    q = Q.load_text(hh_text(kafka={"partitions": 2})).query("hh")
    fin = R.ROW_KINDS.index("final")
    gate = TotalGate(tmp_path, [q])
    # batch 0: partition 0 closes windows 3 and 4; partition 1 has closed none
    out = gate.admit(0, q, _wins([3, 4], [fin, fin], [10, 20]), {0: _st(0, 5)})
    assert len(out.window) == 0 and gate.held["hh"] == 2
    # batch 1: partition 1 closes window 3 (closed before 4): window 3 leaves with both partitions' rows
    b1 = _wins([3], [fin], [30])
    statuses = {0: _st(0, 5), 1: _st(1, 4)}
    out = gate.admit(1, q, b1, statuses)
    assert sorted(zip(out.window.tolist(), out.state[:, 0].tolist(), strict=True)) == [(3, 10), (3, 30)]
    assert gate.held["hh"] == 1
    # a replay of batch 1 (Spark re-runs an uncommitted batch) decides and writes the same
    again = gate.admit(1, q, b1, statuses)
    assert again.window.tolist() == out.window.tolist() and again.state.tolist() == out.state.tolist()
    # a restarted job (a new gate on the same results) continues from the snapshot of batch 1
    gate2 = TotalGate(tmp_path, [q])
    out = gate2.admit(2, q, _wins([4], [fin], [40]), {0: _st(0, 5), 1: _st(1, 9)})
    assert sorted(out.state[:, 0].tolist()) == [20, 40] and gate2.held["hh"] == 0
    # only the newest earlier snapshot is kept (older ones are committed history)
    left = sorted(p.name for p in (tmp_path / "_pending" / "query=hh").iterdir())
    assert left == ["held-000000000001.npz", "held-000000000002.npz"]
    # a restart whose config no longer reads a total still drains what an earlier run held
    gate2.admit(3, q, _wins([7], [fin], [1]), {0: _st(0, 5), 1: _st(1, 9)})
    plain = Q.load_text(hh_text("packets > 0", "packets < 0", kafka={"partitions": 2})).query("hh")
    assert TotalGate(tmp_path, [plain]).queries == {"hh": plain}
    # end of stream on every partition releases whatever is left
    eos = wire.END_OF_STREAM
    out = gate2.admit(4, q, None, {0: _st(0, 5, eos), 1: _st(1, 9, eos)})
    assert out.window.tolist() == [7] and gate2.held["hh"] == 0
    assert TotalGate(tmp_path, [plain]).queries == {}  # nothing held: a plain query writes at close again


def alerts_in(root: Path) -> pd.DataFrame:
    tables = [pq.read_table(f) for f in R.alert_files(root)]
    return pa.concat_tables(tables).to_pandas() if tables else pd.DataFrame(columns=["alert", "group"])


def test_spark_heavy_hitters_of_the_window_total_exact_across_partitions_skew_and_restart(
    spark, kafka, topic_factory, tmp_path
):
    """Three hosts skewed 0/12/40 s with shuffled arrival, 3 partitions each holding a share of the
    groups, a job stopped mid-batch and restarted from its checkpoint: the stored rows are exactly the
    oracle's (window, group) rows with bytes >= f * the whole window's bytes, the alerts exactly those with
    packets >= g * the window's packets, each once; rows were held while partitions disagreed."""
    from lowwater_testing.hosts import HOSTS, traffic_messages
    from lowwater_testing.spark import expected_typed, normalised, read_results, start_job
    from lowwater_testing.topics import produce

    t = make_traffic(6000, 40, T0, 60 * NS, seed=11)
    plain = Q.load_text(hh_text("packets > 0", "packets < 0")).query("hh")
    exp = expected_typed(plain, t)
    share_b = exp["bytes"] / exp.groupby("window_end")["bytes"].transform("sum")
    share_p = exp["packets"] / exp.groupby("window_end")["packets"].transform("sum")
    f = round(float(share_b.quantile(0.6)), 4)  # about 40 % of the groups pass
    g = round(float(share_p.quantile(0.9)), 4)
    topic = topic_factory(partitions=3, prefix="hh-total")
    q = (
        Q.load_text(hh_text(f"bytes >= {f} * total(bytes)", f"packets >= {g} * total(packets)"))
        .query("hh")
        .model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=3)})
    )
    msgs = traffic_messages([q], t, seed=11)
    # partition 2 lags: its second third arrives only after the restart, so the other two partitions
    # close windows long before it does (per-partition order kept)
    n = len(msgs)
    early = [i < n * 2 // 3 and (m[1] != 2 or i < n // 3) for i, m in enumerate(msgs)]
    produce(kafka, [m for m, e in zip(msgs, early, strict=True) if e])
    kw = dict(
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=HOSTS,
        host_timeout_ms=600_000,
        max_offsets_per_trigger=40,
    )
    held: list[int] = []
    job = start_job(spark, [q], tmp_path, "hh", **kw)
    job.sink.on_batch.append(lambda b: held.append(job.sink.totals.held.get("hh", 0)))
    deadline = time.monotonic() + 300
    while (job.streams[0].lastProgress or {}).get("batchId", -1) < 4 or not any(held):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job.streams[0].stop()  # abrupt: interrupts whatever batch is running
    ckpt = next(p for p in Path(job.opts.checkpoint).iterdir() if (p / "commits").is_dir())

    def ids(d: str) -> list[int]:
        return sorted(int(p.name) for p in (ckpt / d).iterdir() if p.name.isdigit())

    last = ids("offsets")[-1]
    if ids("commits")[-1] == last:  # stopped between batches: make the last one a replay
        (ckpt / "commits" / str(last)).unlink()
        (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    assert max(held) > 0  # windows closed on partitions 0 and 1 wait for partition 2, across the restart
    produce(kafka, [m for m, e in zip(msgs, early, strict=True) if not e])
    job2 = start_job(spark, [q], tmp_path, "hh", **kw)
    job2.sink.on_batch.append(lambda b: held.append(job2.sink.totals.held.get("hh", 0)))
    try:
        job2.process_all_available()
        first = job2.streams[0].recentProgress[0]["batchId"]
    finally:
        job2.stop()
    assert first == last  # the uncommitted batch was replayed
    res = Path(job2.opts.results)
    got = read_results(res, "hh")
    fin = got[got["kind"] == "final"]
    assert not fin.duplicated(["window_end", "dst_ip"]).any()
    want = exp[exp["bytes"] >= f * exp.groupby("window_end")["bytes"].transform("sum")]
    assert 0 < len(want) < len(exp) and len(want) < len(exp) / 3 * 2
    pd.testing.assert_frame_equal(normalised(fin, q), normalised(want, q), check_dtype=False, rtol=1e-12)
    # one partition's share of a window's groups would pass far more of them: the total is the window's
    fired = alerts_in(res)
    fire = exp[exp["packets"] >= g * exp.groupby("window_end")["packets"].transform("sum")]
    seen = sorted(
        zip(
            pd.to_datetime(fired["window_end"], utc=True).tolist(),
            [json.loads(gr)["dst_ip"] for gr in fired["group"]],
            strict=True,
        )
    )
    expect = sorted(
        zip(
            pd.to_datetime(fire["window_end"], utc=True).tolist(),
            fire["dst_ip"].astype(str).tolist(),
            strict=True,
        )
    )
    assert set(fired["alert"]) <= {"elephant"}
    assert len(expect) > 0 and seen == expect
    assert (
        not (Path(job2.opts.results) / "_pending" / "query=hh").exists() or job2.sink.totals.held["hh"] == 0
    )
