"""Joint punctuation (OOP section 7, Fig. 8, query Q3; dissertation Figs. 7-3/7-4): a band join's output
punctuation is a pair (left ts, right ts), and an aggregation on the right timestamp (``window_on: right``)
closes its windows by the right component. Checked against the brute-force oracle under shuffled and
skewed arrival, 1-4 partitions and restarts from the state's bytes; every output row is checked against
the joint punctuation the join had announced before it (never earlier: exactness); and measured against
individual punctuation (the left output mark carried over by the band), which closes a band later."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.bench_joint import close_delays, q3
from contract import query as Q
from high_level.join import band as B
from high_level.join.band import BandJoin, JoinLayout
from lowwater_testing.joins import HANDSHAKE, rows_of
from tests import test_join as TJ

NS = 1_000_000_000


class Checked(BandJoin):
    """A band join that checks every step's output against the joint punctuation it announced before."""

    def step(self) -> B.JoinOutput:
        jl, jr = self.joint
        out = super().step()
        if jl is not None:
            assert len(out.l_ts) == 0 or out.l_ts.min() >= jl, "a pair below the announced left mark"
            assert len(out.u_ts) == 0 or out.u_ts.min() >= jl, "an unmatched row below the left mark"
        if jr is not None:
            assert len(out.r_ts) == 0 or out.r_ts.min() >= jr, "a pair below the announced right mark"
        return out


@pytest.mark.parametrize(
    ("hosts", "skew_s", "punct", "partitions", "band"),
    [
        (1, 0, NS, 1, "within: 20s"),
        (3, 40, NS, 4, "within: 20s"),
        (2, 20, 10 * NS, 2, "band: [-2s, 15s]"),
        (3, 25, None, 3, "within: 3s"),
    ],
)
def test_q3_right_timestamp_windows_equal_the_oracle(
    hosts: int, skew_s: float, punct: int | None, partitions: int, band: str, monkeypatch
) -> None:
    monkeypatch.setattr(TJ, "BandJoin", Checked)
    cfg = q3(partitions, band)
    assert JoinLayout.of(cfg.joins[0], *cfg.selects).window_on == "right"
    TJ.assert_exact(cfg, hosts, skew_s, punct, seed=7 * hosts + partitions)


def test_q3_restarts_from_its_state_bytes(monkeypatch) -> None:
    monkeypatch.setattr(TJ, "BandJoin", Checked)
    TJ.assert_exact(q3(2), 3, 30, NS, seed=43, checkpoint=True)


def test_the_right_windows_differ_from_the_left_ones() -> None:
    """The oracle files rows by the right timestamp: with a 20-s band and 10-s windows many pairs change
    window, so a join that kept windowing on the left timestamp would fail the tests above."""
    from lowwater_testing.joins import join_oracle, join_window_oracle

    cfg, lcfg = q3(1), q3(1, window_on="left")
    left, right = rows_of(cfg, 1500, 7)
    lay, llay = (JoinLayout.of(c.joins[0], *c.selects) for c in (cfg, lcfg))
    pairs, unmatched = join_oracle(lay, left, right)
    a, b = join_window_oracle(lay, pairs, unmatched), join_window_oracle(llay, pairs, unmatched)
    assert a["completed"].sum() == b["completed"].sum() == len(pairs)
    assert not a[["window", "key", "completed"]].equals(b[["window", "key", "completed"]])


def test_the_job_step_windows_on_the_right_timestamp_across_partitions_and_restarts() -> None:
    """The job's state group (every partition's join, one roll-up) closes right-timestamp windows by the
    min over partitions of the right component, through its packed output and its bytes."""
    from high_level.aggregate.processor import Settings
    from high_level.join.band import finalize
    from high_level.join.step import JoinProcessor
    from lowwater_testing.joins import handshake_messages, job_step_finals, join_oracle, join_window_oracle

    cfg = q3(4)
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    left, right = rows_of(cfg, 1200, seed=21)
    msgs = handshake_messages(cfg, left, right, hosts=3, skew_s=30, seed=3)
    settings = Settings(10**9, ("cap-0", "cap-1", "cap-2"), "drop")
    g = job_step_finals(
        JoinProcessor(lay, settings),
        msgs,
        97,
        lambda p: JoinProcessor.from_bytes(p.to_bytes(), lay, settings),
    )
    assert not g.duplicated(["window", "key"]).any()
    fin = finalize(lay, np.array(g["state"].tolist()))
    got_df = pd.DataFrame({"window": g["window"], "key": g["key"], **fin})
    got_df = got_df.sort_values(["window", "key"]).reset_index(drop=True)
    want = join_window_oracle(lay, *join_oracle(lay, left, right))
    pd.testing.assert_frame_equal(got_df, want, check_dtype=False)


def test_window_on_right_needs_an_inner_join() -> None:
    text = HANDSHAKE.replace("    within: 3s\n", "    within: 3s\n    type: anti\n    window_on: right\n")
    text = text.replace(
        "      - {fn: avg, expr: right.timestamp - left.timestamp, as: avg_latency_ns}\n", ""
    ).replace("group_by: [left.dst_port]", "group_by: [left.dst_ip]")
    with pytest.raises(Q.ConfigError, match="window_on: right needs an inner join") as e:
        Q.load_text(text, "q3.yaml")
    assert e.value.file == "q3.yaml" and "'handshakes'" in str(e.value)


@pytest.mark.parametrize("lag_s", [0.0, 5.0])
def test_joint_punctuation_closes_a_band_earlier_than_individual(lag_s: float) -> None:
    """The measurement behind OOP Fig. 8 (``benchmarks/bench_joint.py``): right-timestamp windows close
    about ``lag`` after their end by joint punctuation whatever the band, and about a band later by
    individual punctuation; both exact (every window's pairs emitted by the time it closed)."""
    for band in (3, 20):
        d = close_delays(q3(1, f"within: {band}s"), lag_s, n_syn=300)
        print(f"lag {lag_s} s, band {band} s: {d}")
        assert d["joint"]["exact"] and d["individual"]["exact"]
        assert d["joint"]["mean_delay_s"] <= lag_s + 1.0
        # a band later while SYNs keep coming; less at the end of the stream, when no stored SYN holds it
        assert d["individual"]["mean_delay_s"] >= d["joint"]["mean_delay_s"] + 0.8 * band
