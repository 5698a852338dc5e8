"""AdaptWID in the job (``window.strategy: lazy | eager | adaptive``): the option in the query model and its
refusals (file, line, reason), the roll-up over eager/adaptive windows against the lazy pane table step by
step (late partials and their corrections, live provisional rows, end of stream, the saved state between
every step), the partition processor against the oracle under skew, disorder, partitions and a restart
between micro-batches. Through real agents, real Kafka and the real job: tests/test_group_punct_e2e.py
(one job start for both features)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from contract import wire
from high_level import codec
from high_level.aggregate.adaptwid import StrategyRollup, supports
from high_level.aggregate.chunks import chunked_unsupported
from high_level.aggregate.processor import Settings
from high_level.aggregate.rollup import Layout, QueryRollup, Windows
from lowwater_testing.hosts import HOSTS, emulated_messages, final_rows, run_offline
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import config, query
from lowwater_testing.traffic import make_traffic, oracle

T0 = 1_700_000_000_000_000_000
AGGS = ["count as packets", "sum(length) as bytes", "min(ttl) as min_ttl", "max(length) as max_len"]
WINDOWS = {
    "tumbling": {"range": "2s"},
    "sliding": {"range": "10s", "slide": "1s"},
    "gcd": {"range": "9s", "slide": "6s"},
}


def _query(shape: str, strategy: str | None, name: str = "a", partitions: int = 1) -> Q.QuerySpec:
    window = WINDOWS[shape] | ({"strategy": strategy} if strategy else {})
    return Q.load_text(
        config(query(name, group_by=["src_ip"], aggregates=AGGS, window=window, partitions=partitions)).text
    ).queries[0]


def _skewed(n: int, span_s: int, seed: int):
    """Packets whose sources are skewed: 8 dense sources carry ~60 %, the rest spread over 3000 (Fig.
    6-19's mix, where the per-group choice pays)."""
    t = make_traffic(n, 4096, T0, span_s * 10**9, seed=seed)
    rng = np.random.default_rng(seed)
    g = np.where(rng.random(n) < 0.6, rng.integers(0, 8, n), 8 + rng.integers(0, 3000, n))
    return dataclasses.replace(t, src=(0x0A000000 + g).astype(np.uint32))


@pytest.fixture(scope="module")
def traffic():
    return _skewed(4000, 40, seed=11)


# -- the option ------------------------------------------------------------------------------------


def test_the_option_defaults_to_lazy_and_reaches_the_layout():
    assert _query("sliding", None).window.strategy == "lazy"
    for s in Q.STRATEGIES:
        q = _query("sliding", s)
        assert Layout.of(q).strategy == s and q.window.strategy == s
    # eager/adaptive keep window aggregates: not differential unless asked (then refused, below)
    q = Q.load_text(
        config(query("d", aggregates=["count as n"], window={"range": "10s", "slide": "1s"})).text
    ).queries[0]
    assert Q.differential(q)
    q = Q.load_text(
        config(
            query("d", aggregates=["count as n"], window={"range": "10s", "slide": "1s", "strategy": "eager"})
        ).text
    ).queries[0]
    assert not Q.differential(q) and supports(Layout.of(q), "eager") is None


@pytest.mark.parametrize(
    ("extra", "line", "reason"),
    [
        ("    window: {range: 10s, strategy: greedy}\n", 4, "'greedy' is not a window strategy"),
        ("    window: {landmark: 1d, update: 1h, strategy: eager}\n", 4, "landmark window"),
        (
            "    window: {range: 10s, slide: 1s, differential: true, strategy: adaptive}\n",
            4,
            "differential sliding windows",
        ),
        (
            "    window:\n      range: 10s\n      strategy: adaptive\n    heartbeat: {groups: true}\n",
            2,
            "group-wise punctuation",
        ),
        (
            "    window: {range: 10s, strategy: eager}\n"
            "    aggregates: [{fn: top, field: src_ip, k: 5, capacity: 50, by: length}]\n",
            2,
            "top with a capacity",
        ),
    ],
)
def test_the_loader_refuses_what_a_strategy_cannot_run(tmp_path, extra, line, reason):
    doc = "queries:\n  - name: q\n    group_by: [dst_port]\n" + extra
    if "aggregates" not in extra:
        doc += "    aggregates: [{fn: count}]\n"
    path = tmp_path / "bad.yaml"
    path.write_text(doc)
    with pytest.raises(Q.ConfigError) as info:
        Q.load(path)
    assert info.value.file == str(path) and info.value.line == line, str(info.value)
    assert reason in info.value.reason, str(info.value)


def test_the_high_level_applies_the_loaders_rule_and_keeps_such_queries_in_the_blob_state():
    lay = Layout.of(_query("sliding", "adaptive"))
    assert "window.strategy adaptive" in chunked_unsupported([lay])
    assert chunked_unsupported([Layout.of(_query("sliding", "lazy"))]) is None
    for field, value in (("landmark", True), ("differential", True), ("top_capacity", 10), ("groups", True)):
        bad = dataclasses.replace(lay, **{field: value})
        assert supports(bad, "eager") == Q.strategy_refusal("eager", *_flags(bad)) is not None
        with pytest.raises(ValueError, match="window.strategy"):
            StrategyRollup(bad)
    assert supports(lay, "lazy") is None


def _flags(lay: Layout) -> tuple[bool, bool, bool, bool]:
    return lay.landmark, lay.differential, bool(lay.top_capacity), lay.groups


# -- the roll-up: eager and adaptive against the lazy pane table, step by step -------------------------


def _frame(w: Windows | None, extra: np.ndarray | None = None) -> pd.DataFrame:
    if w is None or not len(w):
        return pd.DataFrame()
    df = pd.DataFrame({"window": w.window})
    for j in range(w.key.shape[1]):
        df[f"k{j}"] = w.key[:, j]
    for j in range(w.state.shape[1]):
        df[f"s{j}"] = w.state[:, j]
    if extra is not None:
        df["late"] = extra
    return df.sort_values(["window", *(f"k{j}" for j in range(w.key.shape[1]))]).reset_index(drop=True)


def _restart(r: QueryRollup, lay: Layout) -> QueryRollup:
    """The roll-up as the processor saves and restores it (pane table, running state, frontier)."""
    arrays = {"q/pane": r.pane, "q/key": r.key, "q/state": r.state, **r.run_arrays("q")}
    _, arrays = codec.unpack(codec.pack({}, arrays))
    again = (StrategyRollup if lay.strategy != "lazy" else QueryRollup)(lay)
    again.pane, again.key, again.state = arrays["q/pane"], arrays["q/key"], arrays["q/state"]
    again.load_run(arrays, "q")
    again.closed = r.closed
    return again


@pytest.mark.parametrize("shape", WINDOWS)
@pytest.mark.parametrize("strategy", ["eager", "adaptive"])
def test_the_strategies_give_the_lazy_roll_ups_rows_at_every_step(traffic, shape, strategy):
    """Partials in two pieces, some second pieces late (after a close past their pane), closes in uneven
    steps, a restart after every step, then end of stream: every close, every correction and its late
    count, every provisional row equal the lazy pane table's, and the state ends empty."""
    q = _query(shape, None)
    lazy_lay = Layout.of(q)
    lay = dataclasses.replace(lazy_lay, strategy=strategy)
    po = oracle(q, traffic)
    pane = po["pane"].to_numpy()
    key = po[[f"k{i}" for i in range(Q.key_width(q))]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    rng = np.random.default_rng(len(shape))
    # two pieces: counts and sums split, min/max in both (their merge is idempotent)
    share = rng.integers(0, 2, st.shape)
    a, b = st.copy(), st.copy()
    a[:, :2], b[:, :2] = st[:, :2] * share[:, :2], st[:, :2] * (1 - share[:, :2])
    late = rng.random(len(pane)) < 0.08
    k = lay.k
    lwms = np.linspace(pane.min(), pane.max() - 2, 11).astype(np.int64)
    order = np.argsort(pane + rng.integers(0, 4, len(pane)), kind="stable")
    rolls = {"lazy": QueryRollup(lazy_lay), strategy: StrategyRollup(lay)}
    sent = np.zeros(len(pane), bool)
    n_corr = n_closed = 0

    def step(fn):
        got = {}
        for name in rolls:
            rolls[name] = _restart(rolls[name], rolls[name].layout)
            got[name] = fn(rolls[name])
        return got["lazy"], got[strategy]

    for lwm in lwms:
        now = order[(pane[order] < lwm + 3) & ~sent[order]]
        sent[now] = True
        on_time = now[~late[now]]
        for part, rows in ((a, now), (b, on_time)):
            x, y = step(lambda r, rows=rows, part=part: r.add(pane[rows], key[rows], part[rows]))
            assert x.late_per_host.tolist() == y.late_per_host.tolist()
            assert _frame(x.corrections, x.late_records).equals(_frame(y.corrections, y.late_records))
        x, y = step(lambda r, now=now: r.provisional(pane[now], key[now]))
        assert _frame(x).equals(_frame(y))
        x, y = step(lambda r, lwm=lwm: r.close(int(lwm)))
        assert _frame(x).equals(_frame(y)), lwm
        n_closed += len(x)
        assert rolls["lazy"].closed == rolls[strategy].closed
        assert rolls["lazy"].open_windows() == rolls[strategy].open_windows()
        back = np.flatnonzero(late & sent & (pane < lwm) & (pane >= lwm - 2 * k))
        late[back] = False
        x, y = step(lambda r, back=back: r.add(pane[back], key[back], b[back]))
        assert _frame(x.corrections, x.late_records).equals(_frame(y.corrections, y.late_records))
        n_corr += len(x.corrections) if x.corrections is not None else 0
    rest = np.flatnonzero(late)
    x, y = step(lambda r: r.add(pane[rest], key[rest], b[rest]))
    assert _frame(x.corrections).equals(_frame(y.corrections))
    x, y = step(lambda r: r.close(wire.END_OF_STREAM))
    assert len(x) and _frame(x).equals(_frame(y))
    assert rolls["lazy"].closed == rolls[strategy].closed and len(rolls[strategy]) == 0
    assert n_corr > 0 and n_closed > 0
    if strategy == "adaptive":
        assert rolls[strategy].windows.switches[0] > 0  # some groups went eager (zipf: dense ones)


def test_a_lazy_checkpoint_resumes_adaptive_but_not_the_other_way(traffic):
    q = _query("sliding", None)
    po = oracle(q, traffic)
    pane, key = po["pane"].to_numpy(), po[[f"k{i}" for i in range(Q.key_width(q))]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    lazy = Layout.of(q)
    ada = dataclasses.replace(lazy, strategy="adaptive")
    mid = int(pane.min()) + 20
    r = QueryRollup(lazy)
    r.add(pane, key, st)
    first = r.close(mid)
    again = _restart(r, ada)  # the lazy pane table becomes the adaptive buffer
    assert isinstance(again, StrategyRollup) and again.top == int(pane.max())
    both = pd.concat([_frame(first), _frame(again.close(wire.END_OF_STREAM))], ignore_index=True)
    assert both.equals(_frame(QueryRollup(lazy, pane, key, st).close(int(pane.max()) + 20)))
    s = StrategyRollup(dataclasses.replace(lazy, strategy="eager"))
    s.add(pane, key, st)
    s.close(mid)
    assert len(s.windows.ew)  # eager aggregates held: a lazy roll-up must not drop them silently
    with pytest.raises(codec.CodecError, match="keep its window.strategy"):
        _restart(s, lazy)


@pytest.mark.parametrize(("partitions", "punct"), [(1, 1), (2, 10)])
@pytest.mark.parametrize("strategy", ["eager", "adaptive"])
def test_the_processor_is_exact_under_skew_disorder_partitions_and_restart(
    traffic, strategy, partitions, punct
):
    """Three hosts skewed 0/15/40 s, shuffled arrival, punctuation every 1 and 10 s, the processor saved and
    restored between every micro-batch: the finals equal the oracle and the state ends empty."""
    q = _query("sliding", strategy, partitions=partitions)
    df = run_offline(
        [q],
        emulated_messages(q, traffic, partitions, punct_every_s=punct, seed=partitions),
        partitions,
        Settings(host_timeout_ms=10**9, expected_hosts=HOSTS),
    )
    assert final_rows(df, q).equals(window_oracle(q, oracle(q, traffic)))
    last = {s["partition"]: s for s in (json.loads(x) for x in df[df["kind"] == "status"]["status"])}
    assert all(s["state_rows"] == 0 and s["open_windows"] == 0 for s in last.values())
    assert all(s["windows_closed"] > 0 for s in last.values())


def test_live_provisional_rows_are_the_lazy_ones(traffic):
    q = _query("gcd", None, partitions=2)
    msgs = emulated_messages(q, traffic, 2, punct_every_s=3, seed=4)
    live = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS, live=True)
    out = {}
    for s in ("lazy", "adaptive"):
        qs = q.model_copy(update={"window": q.window.model_copy(update={"strategy": s})})
        df = run_offline([qs], msgs, 2, live)
        prov = df[df["kind"] == "provisional"]
        assert len(prov)
        out[s] = prov[["partition", "window", "closed_at_ms"]].assign(
            key=prov["key"].map(tuple), state=prov["state"].map(tuple)
        )
    assert out["lazy"].reset_index(drop=True).equals(out["adaptive"].reset_index(drop=True))
