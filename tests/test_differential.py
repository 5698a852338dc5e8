"""Differential (subtractable) aggregates over sliding windows (dissertation §6.2.2.2-3): the running window
plus the entering panes minus the expired ones equals re-merging every pane, under disorder, skew,
partitions, late partials and a restart of the processor between every micro-batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contract import aggregates as A
from contract import query as Q
from high_level.aggregate.chunks import RUN_PANE, ChunkedRollup, MemoryChunks
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout, QueryRollup
from lowwater_testing.hosts import HOSTS, emulated_messages, final_rows, run_offline, traffic_messages
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import config, query
from lowwater_testing.spark import assert_exact, crash_after_batches, start_job
from lowwater_testing.topics import produce
from lowwater_testing.traffic import make_traffic, oracle

T0 = 1_700_000_000_000_000_000
AGGS = ["count as packets", "sum(length) as bytes", "avg(length) as avg_len", "variance(length) as var_len"]
CONFIG = config(
    query("d10x1", group_by=["src_ip"], aggregates=AGGS, window={"range": "10s", "slide": "1s"}),
    query(
        "d9x6",
        group_by=["dst_port"],
        aggregates=AGGS,
        window={"range": "9s", "slide": "6s", "differential": True},
    ),
    query(
        "d20x5",
        group_by=["dst_ip/24"],
        aggregates=AGGS[:2],
        window={"range": "20s", "slide": "5s", "origin": "2s", "differential": True},
    ),
).text
NAMES = ["d10x1", "d9x6", "d20x5"]
ROLLUPS = {"blob": QueryRollup, "chunked": lambda lay: ChunkedRollup(lay, MemoryChunks())}


CFG = Q.load_text(CONFIG)


@pytest.fixture(scope="module")
def traffic():
    return make_traffic(12000, 200, T0, 120 * 10**9, seed=17)


def _frame(out, kw: int) -> pd.DataFrame:
    w = np.concatenate([o.window for o in out])
    k = np.concatenate([o.key for o in out])
    s = np.concatenate([o.state for o in out])
    df = pd.DataFrame(
        {
            "window": w,
            **{f"k{i}": k[:, i] for i in range(kw)},
            **{f"s{j}": s[:, j] for j in range(s.shape[1])},
        }
    )
    return df.sort_values(["window", *[f"k{i}" for i in range(kw)]]).reset_index(drop=True)


def test_registry_declares_the_subtractable_aggregates_once():
    assert A.SUBTRACTABLE == ("count", "sum", "avg", "variance", "stddev")
    assert not any(A.REGISTRY[fn].subtractable for fn in ("min", "max", *A.HOLISTIC))


@pytest.mark.parametrize("name", NAMES)
def test_sliding_queries_of_subtractable_aggregates_are_differential(name):
    q = CFG.query(name)
    assert Q.differential(q) and Layout.of(q).differential


@pytest.mark.parametrize("state", ROLLUPS)
@pytest.mark.parametrize("name", NAMES)
def test_running_windows_equal_the_oracle_with_late_partials(traffic, name, state):
    """Partials in random pieces, closed in uneven steps, some arriving after their pane's first window
    closed (kept for the open windows, returned as corrections for the closed ones): every final window
    equals the re-merged oracle plus nothing, and the corrections are exactly the late pieces."""
    q = CFG.query(name)
    po = oracle(q, traffic)
    kw, k = Q.key_width(q), q.window.panes_per_window
    pane = po["pane"].to_numpy()
    key = po[[f"k{i}" for i in range(kw)]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    rng = np.random.default_rng(5)
    # two pieces per row: the second piece of some rows arrives late (after a close past its pane)
    share = rng.integers(0, 2, st.shape)
    a, b = st * share, st * (1 - share)
    late = rng.random(len(pane)) < 0.05
    r = ROLLUPS[state](Layout.of(q))
    lay = r.layout
    assert lay.differential
    lwms = np.linspace(pane.min(), pane.max() + k + 1, 13).astype(np.int64)
    order = np.argsort(pane + rng.integers(0, 3, len(pane)), kind="stable")  # disorder of a few panes
    out, corr_rows, sent = [], [], np.zeros(len(pane), bool)
    for lwm in lwms:
        now = order[(pane[order] < lwm + 2) & ~sent[order]]
        sent[now] = True
        r.add(pane[now], key[now], a[now])
        on_time = now[~late[now]]
        r.add(pane[on_time], key[on_time], b[on_time])
        out.append(r.close(int(lwm)))
        back = np.flatnonzero(late & sent & (pane < lwm) & (pane >= lwm - 2 * k))
        late[back] = False
        res = r.add(pane[back], key[back], b[back])  # late: closed windows get corrections
        if res.corrections is not None:
            corr_rows.append(res.corrections)
    rest = np.flatnonzero(late)
    res = r.add(pane[rest], key[rest], b[rest])
    if res.corrections is not None:
        corr_rows.append(res.corrections)
    out.append(r.close(int(lwms[-1]) + 2 * k))
    assert len(r) == 0
    got = _frame(out, kw)
    # the oracle: every final window plus its corrections equals the full window; the finals alone are
    # the oracle of what had arrived by the window's close
    full = window_oracle(q, po)
    both = pd.concat([got, _frame(corr_rows, kw)] if corr_rows else [got])
    keys = ["window", *[f"k{i}" for i in range(kw)]]
    summed = both.groupby(keys, as_index=False).sum().sort_values(keys).reset_index(drop=True)
    # count/sum/avg/variance states all merge by sum, so windows add up exactly
    assert summed.equals(full)


@pytest.mark.parametrize("state", ["blob", "chunked"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("partitions", "punct"), [(1, 1), (2, 1), (4, 10), (2, 1000)])
def test_processor_exact_under_skew_order_partitions_density_and_restart(
    traffic, name, state, partitions, punct
):
    """Three hosts skewed 0/15/40 s, shuffled arrival, 1/2/4 partitions, punctuation every 1, 10 and 1000 s,
    the processor saved and restored between every micro-batch (its running sums with it)."""
    q = CFG.query(name)
    df = run_offline(
        [q],
        emulated_messages(q, traffic, partitions, punct_every_s=punct, seed=partitions + punct),
        partitions,
        Settings(host_timeout_ms=10**9, expected_hosts=HOSTS),
        chunked=state == "chunked",
    )
    assert final_rows(df, q).equals(window_oracle(q, oracle(q, traffic)))
    status = [json.loads(x) for x in df[df["kind"] == "status"]["status"]]
    assert all(
        s["state_rows"] == 0 and s["open_windows"] == 0 for s in {s["partition"]: s for s in status}.values()
    )


def test_the_running_sums_survive_a_restart_and_a_state_without_them_sums_again(traffic):
    q = CFG.query("d10x1")
    po = oracle(q, traffic)
    kw = Q.key_width(q)
    pane = po["pane"].to_numpy()
    key = po[[f"k{i}" for i in range(kw)]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    lay = Layout.of(q)
    r = QueryRollup(lay)
    r.add(pane, key, st)
    mid = int(pane.min()) + 30
    first = r.close(mid)
    assert r.run is not None and len(r.run)
    arrays = r.run_arrays("d10x1")
    for keep in (True, False):  # restored with its running sums, or from a state saved without them
        r2 = QueryRollup(lay, r.pane.copy(), r.key.copy(), r.state.copy(), r.closed)
        r2.load_run(arrays if keep else {}, "d10x1")
        assert (r2.run is not None) == keep
        rest = r2.close(int(pane.max()) + 20)
        assert _frame([first, rest], kw).equals(window_oracle(q, po))


def test_turned_off_it_re_merges_and_the_results_are_the_same(traffic):
    q = CFG.query("d9x6")
    off = q.model_copy(update={"window": q.window.model_copy(update={"differential": False})})
    assert not Q.differential(off) and not Layout.of(off).differential
    po = oracle(q, traffic)
    kw = Q.key_width(q)
    pane = po["pane"].to_numpy()
    key = po[[f"k{i}" for i in range(kw)]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    outs = []
    for lay in (Layout.of(q), Layout.of(off)):
        r = QueryRollup(lay)
        r.add(pane, key, st)
        outs.append(_frame([r.close(int(x)) for x in range(int(pane.min()), int(pane.max()) + 5, 7)], kw))
    assert outs[0].equals(outs[1])


def _bad(window: str, aggs: str) -> str:
    return f"""queries:
  - name: q
    group_by: [src_ip]
    aggregates: [{aggs}]
    window: {window}
"""


@pytest.mark.parametrize(
    ("window", "aggs", "reason"),
    [
        (
            "{range: 10s, slide: 1s, differential: true}",
            "{fn: count}, {fn: max, field: ttl}",
            "max cannot subtract an expired pane",
        ),
        ("{range: 10s, differential: true}", "{fn: count}", "needs a sliding window"),
        ("{landmark: 1d, update: 1h, differential: true}", "{fn: count}", "needs a sliding window"),
        ("{range: 10s, slide: 1s, differential: maybe}", "{fn: count}", "differential"),
    ],
)
def test_config_refuses_what_cannot_be_differential_with_file_and_line(tmp_path, window, aggs, reason):
    path = tmp_path / "bad.yaml"
    path.write_text(_bad(window, aggs))
    with pytest.raises(Q.ConfigError) as exc:
        Q.load(path)
    assert f"{path}:" in str(exc.value) and reason in str(exc.value)
    assert exc.value.line is not None


def test_config_auto_and_explicit(tmp_path):
    for window, aggs, want in (
        ("{range: 10s, slide: 1s}", "{fn: count}, {fn: sum, field: length}", True),
        ("{range: 4s, slide: 1s}", "{fn: count}", False),  # auto: too few panes per window to pay
        ("{range: 4s, slide: 1s, differential: true}", "{fn: count}", True),
        (
            "{range: 10s, slide: 1s}",
            "{fn: count}, {fn: min, field: ttl}",
            False,
        ),  # auto: min has no inverse, re-merged
        ("{range: 10s, slide: 1s, differential: false}", "{fn: count}", False),
        (
            "{range: 10s, slide: 1s, differential: true}",
            "{fn: avg, field: length}, {fn: stddev, field: length}",
            True,
        ),
        ("{range: 10s}", "{fn: count}", False),  # tumbling: nothing to subtract
    ):
        path = tmp_path / "ok.yaml"
        path.write_text(_bad(window, aggs))
        assert Q.differential(Q.load(path).query("q")) is want, window


# -- end to end: real Kafka, real Spark, a kill and a restart -------------------------------------


@pytest.mark.parametrize("state", ["blob", "chunked"])
def test_spark_job_keeps_running_windows_exact_across_a_kill_and_restart(
    spark, kafka, topic_factory, tmp_path, state
):
    """Three hosts skewed 0/12/40 s, shuffled arrival, 2 and 3 partitions, punctuation every 1 s and 10 s;
    the job stopped abruptly mid-stream (its last batch uncommitted, so replayed) and restarted from its
    checkpoint: every stored window equals the oracle, the running sums restored from the state."""
    t = make_traffic(2000, 60, T0, 40 * 10**9, seed=3)
    queries = []
    for name, parts in (("d10x1", 2), ("d9x6", 3)):
        topic = topic_factory(partitions=parts, prefix=f"hl-diff-{name}")
        queries.append(
            CFG.query(name).model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=parts)})
        )
    assert all(Q.differential(q) for q in queries)
    msgs = traffic_messages(queries, t, {"d9x6": 10}, seed=3)
    cut = len(msgs) * 2 // 3

    def job():
        return start_job(
            spark,
            queries,
            tmp_path,
            "diff",
            bootstrap=kafka.bootstrap_servers,
            expected_hosts=HOSTS,
            host_timeout_ms=600_000,
            max_offsets_per_trigger=250,
            state=state,
        )

    produce(kafka, msgs[:cut])
    last = crash_after_batches(job(), state, batches=1)
    produce(kafka, msgs[cut:])
    again = job()
    try:
        again.process_all_available()
        assert again.streams[0].recentProgress[0]["batchId"] == last  # the uncommitted batch replayed
    finally:
        again.stop()
    for q in queries:
        assert_exact(Path(again.opts.results), q, t)


@pytest.mark.parametrize("state", ["blob", "chunked"])
def test_the_processor_saves_its_running_sums_and_a_chunked_close_reads_only_the_panes_in_and_out(
    traffic, state
):
    """Saved and restored between batches, the processor keeps its running sums (not summed again); with
    the chunked state a close reads the panes that enter and expire, not the window's k panes."""
    q = CFG.query("d10x1")
    lay = Layout.of(q)
    msgs = emulated_messages(q, traffic, 1, punct_every_s=1, seed=4)
    store = MemoryChunks() if state == "chunked" else None
    reads: list[int] = []
    if store is not None:
        get = store.get
        store.get = lambda query, pane, seq: reads.append(pane) or get(query, pane, seq)  # type: ignore[method-assign]
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS)
    proc = PartitionProcessor([lay], 0, settings, store)
    seen_run = fewer = 0
    for chunk in np.array_split(np.arange(len(msgs)), 60):
        proc = PartitionProcessor.from_bytes(proc.to_bytes(), [lay], settings, store)
        r = proc.queries[q.name].rollup
        has = r.has_run if state == "chunked" else r.run is not None
        seen_run += bool(has)
        before, reads[:] = r.closed, []
        proc.process([msgs[i].value for i in chunk], 1_000_000)
        if state == "chunked" and has and r.closed is not None and before is not None and r.closed > before:
            panes = {p for p in reads if p != RUN_PANE}
            assert max(panes, default=before) < r.closed
            # the entering panes [before, closed) and the expiring ones; re-merging reads closed - before + k - 1
            n = r.closed - before
            assert len(panes) <= 2 * n
            fewer += n < lay.k - 1
    assert seen_run >= 20  # restored with its running sums in most batches (not summed again)
    assert state == "blob" or fewer >= 10
