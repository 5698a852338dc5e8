"""AdaptWID (high_level/aggregate/adaptwid.py): eager, lazy and adaptive give the offline oracle's windows
exactly, and the existing roll-up's, under disorder, skew, groups switching mid-stream and several
partitions. Pure logic (numpy), ~2 s."""

from __future__ import annotations

import numpy as np
import pytest

from contract import aggregates as A
from high_level.aggregate.adaptwid import STRATEGIES, AdaptiveWindows, CostModel, lazy_rows
from high_level.aggregate.rollup import I64, Layout, QueryRollup, expand_windows, group_reduce

OPS = (A.MERGE_SUM, A.MERGE_MIN, A.MERGE_MAX)


def layout(k: int, s: int = 1) -> Layout:
    return Layout("q", "t", 1, k, 0, k, OPS, 1, s)


def stream(rng: np.random.Generator, panes: int, disorder: int, dense: int, sparse: int, shift: int = 0):
    """Batches of (pane, key, state) in arrival order and the low-water mark after each: dense keys (a row
    per pane from several sources), sparse keys (a row every ~20 panes), panes disordered by up to
    ``disorder`` (never late: a batch only holds panes >= the mark). ``shift``: from the middle on, the
    dense and sparse key sets swap (groups switch both ways)."""
    out = []
    for t in range(panes):
        d_keys = np.arange(dense) if not (shift and t > panes // 2) else np.arange(dense) + 1000
        s_keys = 1000 + rng.integers(0, sparse, max(1, sparse // 20))
        if shift and t > panes // 2:
            s_keys = rng.integers(0, dense, max(1, dense // 5))
        keys = np.concatenate([np.repeat(d_keys, 3), s_keys])  # dense keys: 3 sources each
        lwm = max(0, t - disorder)
        pane = np.clip(t - rng.integers(0, disorder + 1, len(keys)), lwm, None)
        v = rng.integers(1, 1500, len(keys))
        state = np.column_stack([v, v, v]).astype(I64)
        perm = rng.permutation(len(keys))
        out.append((pane[perm].astype(I64), keys[perm].reshape(-1, 1).astype(I64), state[perm], lwm))
    return out


def oracle(batches, lay: Layout) -> dict:
    pane = np.concatenate([b[0] for b in batches])
    key = np.concatenate([b[1] for b in batches])
    state = np.concatenate([b[2] for b in batches])
    idx, w = expand_windows(pane, int(pane.min()), int(pane.max()) + lay.k, lay.k, lay.s)
    keys, st = group_reduce(np.column_stack([w, key[idx]]), state[idx], lay.ops)
    return {tuple(k): tuple(s) for k, s in zip(keys.tolist(), st.tolist(), strict=True)}


def as_dict(wins) -> dict:
    out = {}
    for w in wins:
        for i in range(len(w)):
            k = (int(w.window[i]), *w.key[i].tolist())
            assert k not in out, f"window {k} emitted twice"
            out[k] = tuple(w.state[i].tolist())
    return out


def run(batches, lay: Layout, strategy: str, model: CostModel | None = None, parts: int = 1):
    """Feed every batch, spread over ``parts`` partitions by key, close after each; end: close all."""
    ws = [AdaptiveWindows(lay, strategy, model) for _ in range(parts)]
    out = []
    for pane, key, state, lwm in batches:
        for p, aw in enumerate(ws):
            sel = key[:, 0] % parts == p
            aw.merge(pane[sel], key[sel], state[sel])
            out.append(aw.close(lwm))
    top = max(int(b[0].max()) for b in batches) + lay.k + 1
    out += [aw.close(top) for aw in ws]
    return as_dict(out), ws


def rollup(batches, lay: Layout) -> dict:
    r = QueryRollup(lay)
    out = []
    for pane, key, state, lwm in batches:
        r.merge(pane, key, state)
        out.append(r.close(lwm))
    out.append(r.close(max(int(b[0].max()) for b in batches) + lay.k + 1))
    return as_dict(out)


@pytest.mark.parametrize(("k", "s"), [(1, 1), (10, 1), (6, 2), (5, 5)])
@pytest.mark.parametrize("disorder", [0, 4])
def test_strategies_match_oracle_and_rollup(k: int, s: int, disorder: int) -> None:
    rng = np.random.default_rng(k * 100 + s * 10 + disorder)
    lay = layout(k, s)
    batches = stream(rng, 40, disorder, dense=8, sparse=200, shift=1)
    want = oracle(batches, lay)
    assert rollup(batches, lay) == want
    for strategy in STRATEGIES:
        for parts in (1, 3):
            got, _ = run(batches, lay, strategy, parts=parts)
            assert got == want, (strategy, parts)


def test_adaptive_switches_both_ways_and_holds_less_than_either() -> None:
    """Skew: dense groups go eager, sparse stay lazy, and the swap mid-stream moves groups both ways;
    the adaptive state at its peak is below eager's and lazy's (the point of Fig. 6-19)."""
    lay = layout(10)
    batches = stream(np.random.default_rng(7), 80, 2, dense=20, sparse=2000, shift=1)
    want = oracle(batches, lay)
    peaks = {}
    for strategy in STRATEGIES:
        aw = AdaptiveWindows(lay, strategy)
        out, peak = [], 0
        for pane, key, state, lwm in batches:
            aw.merge(pane, key, state)
            peak = max(peak, aw.words())
            out.append(aw.close(lwm))
        out.append(aw.close(10_000))
        assert as_dict(out) == want, strategy
        peaks[strategy] = peak
        if strategy == "adaptive":
            assert aw.switches[0] >= 20 and aw.switches[1] >= 1, aw.switches
    assert peaks["adaptive"] < peaks["eager"] and peaks["adaptive"] < peaks["lazy"], peaks


def test_thrashing_thresholds_and_forced_switches() -> None:
    """A model that flips every group at every close (up=0: always eager; then down huge) still matches."""
    lay = layout(4)
    batches = stream(np.random.default_rng(3), 40, 3, dense=5, sparse=100)
    want = oracle(batches, lay)
    for up, down in ((0.0, 0.0), (0.0, 1e9), (1e9, 0.0)):
        got, ws = run(batches, lay, "adaptive", CostModel.of(lay, up, down))
        assert got == want, (up, down)
    assert ws[0].switches == [0, 0]  # up huge: nobody ever goes eager


def test_cost_model_and_validation() -> None:
    m = CostModel.of(layout(10))
    assert m.tup == 1 + 1 + 3 and m.aggr == 2 + 1 + 3
    assert m.eager(np.array([10]))[0] == 60 and m.lazy(np.array([3]))[0] == 15
    # Eq. 6.7: three sources, B and C behind A by 2 and 4 time units
    assert lazy_rows(30.0, 10.0, np.array([10, 10, 10]), np.array([0, 2, 4])) == 300 - 60
    with pytest.raises(ValueError, match="one of"):
        AdaptiveWindows(layout(2), "greedy")
    lm = Layout("q", "t", 1, 4, 0, 4, OPS, 1, 4, landmark=True)
    with pytest.raises(ValueError, match="landmark"):
        AdaptiveWindows(lm, "adaptive")
