"""Join shapes beyond the one-sided band: a two-sided band ``band: [lo, hi]`` (the OOP paper's RANGE0/RANGE1)
and the equality join on the progressing attribute over raw rows (``within: window`` between two selects,
OOP Q6/Q8), each against the brute-force oracle under disorder (1-3 hosts, skew 0-40 s, shuffled arrival,
1/2/4 partitions, restarts from the state's bytes), their purge rules, their config errors (file, line,
reason), and through real Kafka and Spark with a restart from the checkpoint."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from high_level.join.band import BandJoin, JoinLayout
from lowwater_testing.joins import HANDSHAKE, handshake_kind, join_oracle, rows_of
from tests.test_join import assert_exact

NS = 1_000_000_000
BAND = "band: [-2s, 5s]"
WINDOW = "within: window"


def shaped(partitions: int, time: str, kind: str = "inner", window: str = "{range: 10s}") -> str:
    """The handshake config with ``time`` (a band or ``within: window``) instead of ``within: 3s``."""
    text = HANDSHAKE.replace("partitions: 4", f"partitions: {partitions}").replace("range: 1m}", window[1:])
    return handshake_kind(text.replace("within: 3s", time), kind, "left.dst_ip")


def cfg_of(partitions: int, time: str, kind: str = "inner", window: str = "{range: 10s}") -> Q.Config:
    return Q.load_text(shaped(partitions, time, kind, window))


@pytest.mark.parametrize(
    ("time", "kind", "hosts", "skew_s", "punct", "partitions"),
    [
        (BAND, "inner", 1, 0, NS, 1),
        (BAND, "inner", 3, 40, NS, 4),
        (BAND, "anti", 2, 10, 10 * NS, 2),
        (BAND, "left", 3, 25, None, 2),
        (WINDOW, "inner", 1, 0, NS, 1),
        (WINDOW, "inner", 3, 40, NS, 4),
        (WINDOW, "anti", 3, 20, 10 * NS, 2),
        (WINDOW, "left", 2, 40, None, 1),
    ],
)
def test_shapes_equal_the_oracle_under_disorder(
    time: str, kind: str, hosts: int, skew_s: float, punct: int | None, partitions: int
) -> None:
    assert_exact(cfg_of(partitions, time, kind), hosts, skew_s, punct, seed=hosts * 11 + partitions)


@pytest.mark.parametrize("time", [BAND, WINDOW])
def test_shapes_restart_from_their_state_bytes(time: str) -> None:
    assert_exact(cfg_of(2, time), 3, 30, NS, seed=41, checkpoint=True)
    assert_exact(cfg_of(2, time, "anti"), 2, 40, NS, seed=42, checkpoint=True)


def test_the_oracle_is_not_trivial_for_either_shape() -> None:
    """The two-sided band finds pairs a one-sided one cannot (right before left: a SYN retransmitted after
    its SYN-ACK), and the window join pairs rows the band does not (and not others), so the tests above
    would fail if either shape fell back to the old band."""
    cfg = cfg_of(1, BAND)
    left, right = rows_of(cfg, 1500, 7)
    pairs, _ = join_oracle(JoinLayout.of(cfg.joins[0], *cfg.selects), left, right)
    lw = JoinLayout.of(cfg.joins[0], *cfg.selects).lw
    d = pairs[:, 1 + lw] - pairs[:, 0]
    assert (d < 0).sum() > 10 and (d > 3 * NS).sum() > 10
    one = Q.load_text(shaped(1, "within: 5s"))
    p1, _ = join_oracle(JoinLayout.of(one.joins[0], *one.selects), left, right)
    assert len(p1) < len(pairs)
    win = cfg_of(1, WINDOW)
    lay = JoinLayout.of(win.joins[0], *win.selects)
    assert lay.window_ns == 10 * NS
    pw, _ = join_oracle(lay, left, right)
    dw = pw[:, 1 + lw] - pw[:, 0]
    assert len(pw) > 200 and (dw < 0).sum() > 0
    assert ((pw[:, 0] - lay.window_origin_ns) // lay.window_ns == (pw[:, 1 + lw] // lay.window_ns)).all()


def _rows(lay: JoinLayout, side: str, ts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(ts, np.int64), np.zeros((len(ts), lay.lw if side == "left" else lay.rw), np.int64)


def _marks(j: BandJoin, left: int, right: int) -> None:
    j.observe("left", "a", 1, left, 0, 0)
    j.observe("right", "a", 1, right, 0, 0)


def test_two_sided_band_purges_on_both_marks() -> None:
    """A left row is final once the right mark passes ts + hi; a right row leaves once the left mark passes
    ts - lo (here ts + 2 s), not at ts as with a one-sided band: it may still meet a later left row."""
    lay = JoinLayout.of(cfg_of(1, BAND, "anti").joins[0], *cfg_of(1, BAND).selects)
    j = BandJoin(lay, host_timeout_ms=10**12)
    _marks(j, 0, 0)
    j.step()
    j.add("left", *_rows(lay, "left", [10 * NS]))
    j.add("right", *_rows(lay, "right", [20 * NS]))
    j.step()
    _marks(j, 21 * NS, 15 * NS)  # right mark = left ts + hi: not past it
    out = j.step()
    assert len(out.u_ts) == 0 and len(j.store["left"]) == 1 and len(j.store["right"]) == 1
    _marks(j, 21 * NS, 15 * NS + 1)  # past: the SYN is final, unanswered
    out = j.step()
    assert out.u_ts.tolist() == [10 * NS] and len(j.store["left"]) == 0
    assert len(j.store["right"]) == 1  # left mark 21 s < 20 s + 2 s: a SYN at 21.5 s would still meet it
    j.add("left", *_rows(lay, "left", [21 * NS + NS // 2]))
    out = j.step()
    assert len(j.store["right"]) == 1
    _marks(j, 22 * NS + 1, 15 * NS + 1)
    j.step()
    assert len(j.store["right"]) == 0


def test_window_join_purges_when_the_marks_pass_the_window_end() -> None:
    """Rows of window [10 s, 20 s) meet only rows of that window; a left row is final (unmatched) once the
    right mark passes the window's end, a right row leaves once the left mark does, whatever the gap."""
    cfg = cfg_of(1, WINDOW, "anti")
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    j = BandJoin(lay, host_timeout_ms=10**12)
    _marks(j, 0, 0)
    j.step()
    j.add("left", *_rows(lay, "left", [11 * NS, 19 * NS]))
    j.add("right", *_rows(lay, "right", [12 * NS, 21 * NS]))  # 12 s answers both; 21 s is the next window
    out = j.step()
    assert out.pairs == 0  # anti: pairs are not output, but both left rows are matched
    _marks(j, 20 * NS - 1, 20 * NS - 1)  # both marks inside the window: nothing decided
    out = j.step()
    assert len(out.u_ts) == 0 and len(j.store["left"]) == 2 and len(j.store["right"]) == 2
    _marks(j, 20 * NS, 20 * NS)  # right mark at the window end: no more right rows of [10, 20)
    out = j.step()
    assert len(out.u_ts) == 0 and len(j.store["left"]) == 0  # both matched: nothing unanswered
    assert sorted(j.store["right"].ts.tolist()) == [21 * NS]  # left mark 20 s passed 12 s's window
    j.add("left", *_rows(lay, "left", [25 * NS]))
    _marks(j, 30 * NS, 30 * NS)
    out = j.step()
    assert out.u_ts.tolist() == [] and j.state_rows == 0  # 25 s met 21 s


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        ("band: [5s, -2s]", "band", "lo is above hi"),
        ("band: [-2s]", "band", r"band is \[lo, hi\]"),
        ("band: [-2s, 5s]\n    within: 3s", "query", "either 'within' or 'band'"),
        ("band: [-90s, 5s]", "band", "larger than what input"),
        ("band: [-2s, 5x]", "band", "not a duration"),
    ],
)
def test_bad_bands_name_file_line_and_reason(edit: str, field: str, reason: str) -> None:
    text = shaped(1, edit)
    with pytest.raises(Q.ConfigError, match=reason) as e:
        Q.load_text(text, "joins.yaml")
    assert e.value.file == "joins.yaml" and f"'handshakes': {field}" in str(e.value)
    want = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(("band", "within")))
    if field != "query":
        assert e.value.line == want


def test_a_window_join_of_selects_needs_a_tumbling_window() -> None:
    with pytest.raises(Q.ConfigError, match="tumbling 'window") as e:
        Q.load_text(shaped(1, WINDOW, window="{range: 20s, slide: 5s}"), "w.yaml")
    assert e.value.line is not None and "window" in str(e.value)
    rows_only = shaped(1, WINDOW).split("    group_by: [left.dst_port]")[0]
    assert "window:" not in rows_only.split("kind: join")[1]
    with pytest.raises(Q.ConfigError, match="tumbling 'window"):
        Q.load_text(rows_only, "w.yaml")
    with pytest.raises(Q.ConfigError, match="window 300s is larger than what input 'syn' can hold"):
        Q.load_text(rows_only + "    window: {range: 5m}\n", "w.yaml")
    ok = Q.load_text(rows_only + "    window: {range: 30s}\n", "w.yaml")
    assert JoinLayout.of(ok.joins[0], *ok.selects).band_ns == 0


# -- through real Kafka and Spark -------------------------------------------------------------------


def _with_topics(text: str, t1: str, t2: str) -> str:
    for t in (t1, t2):
        text = text.replace("kafka: {partitions: 2}", f"kafka: {{topic: {t}, partitions: 2}}", 1)
    return text


def _both(t1: str, t2: str) -> Q.Config:
    """One config, two joins over the same selects: a two-sided band and a window join."""
    band = _with_topics(shaped(2, BAND), t1, t2)
    win = shaped(2, WINDOW).split("  - name: handshakes\n", 1)[1]
    return Q.load_text(band + "  - name: handshakes_w\n" + win)


def _expected(cfg: Q.Config, j: Q.JoinSpec, left: np.ndarray, right: np.ndarray) -> pd.DataFrame:
    from lowwater_testing.joins import join_window_oracle

    lay = JoinLayout.of(j, *cfg.selects)
    w = join_window_oracle(lay, *join_oracle(lay, left, right))
    rl = lay.rollup
    w["window_end"] = pd.to_datetime(rl.origin_ns + (w["window"] + 1) * rl.pane_ns, utc=True)
    w["dst_port"] = [k[0] for k in w["key"]]
    w = w[["window_end", "dst_port", "completed", "avg_latency_ns"]]
    w["window_end"] = w["window_end"].astype("datetime64[ns, UTC]")
    return w.sort_values(["window_end", "dst_port"]).reset_index(drop=True)


def test_band_and_window_joins_through_real_kafka_and_spark_with_a_restart(
    spark, kafka, topic_factory, tmp_path
) -> None:
    """3 skewed hosts' select batches in real Kafka, half of them, the job stops, the rest, the job resumes
    from its checkpoint: both joins' stored windows equal the oracle, every window once and complete."""
    from high_level.job import HighLevelJob
    from lowwater_testing.joins import handshake_messages
    from lowwater_testing.spark import job_options, read_results
    from lowwater_testing.topics import produce
    from tests.test_join import run_to_end

    t1, t2 = topic_factory(partitions=2), topic_factory(partitions=2)
    cfg = _both(t1, t2)
    left, right = rows_of(cfg, 800, seed=33)
    msgs = handshake_messages(cfg, left, right, hosts=3, skew_s=20, seed=5)
    hosts = tuple(f"cap-{h}" for h in range(3))
    opts = job_options(
        kafka.bootstrap_servers, tmp_path, "t-shapes", create_topics=False, expected_hosts=hosts
    )
    half = len(msgs) // 2
    produce(kafka, msgs[:half])
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    first = {
        n: len(read_results(tmp_path / "res", n)) if (tmp_path / "res" / f"query={n}").exists() else 0
        for n in ("handshakes", "handshakes_w")
    }
    produce(kafka, msgs[half:])
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    for j in cfg.joins:
        got = read_results(tmp_path / "res", j.name)
        fin = got[got["kind"] == "final"].copy()
        assert len(fin) > first[j.name], "the second run, resumed from the checkpoint, closed more windows"
        assert fin["complete"].all()
        fin["window_end"] = pd.to_datetime(fin["window_end"], utc=True).astype("datetime64[ns, UTC]")
        g = fin[["window_end", "dst_port", "completed", "avg_latency_ns"]].sort_values(
            ["window_end", "dst_port"]
        )
        pd.testing.assert_frame_equal(
            g.reset_index(drop=True), _expected(cfg, j, left, right), check_dtype=False
        )
