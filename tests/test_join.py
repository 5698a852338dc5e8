"""The order-agnostic band join against an offline oracle: identical pairs, unmatched rows and windows for
1-3 hosts, inter-host skew 0-40 s, shuffled arrival, punctuation every 1 s / 10 s / only at the end,
1/2/4 partitions; unmatched rows never before the right input's punctuation passes their band; state
bounded by punctuation; checkpointed state resumes exactly."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from contract import wire
from high_level.join.band import BandJoin, JoinLayout, finalize, match_pairs, merge_partitions
from lowwater_testing import oracle as simulate
from lowwater_testing.agent import run_agent
from lowwater_testing.joins import (
    HANDSHAKE,
    handshake_kind,
    handshake_messages,
    join_oracle,
    join_window_oracle,
    rows_of,
    sort_rows,
)

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
BAND = 3 * NS


def config(partitions: int, kind: str = "inner", window: str = "{range: 10s}") -> Q.Config:
    text = HANDSHAKE.replace("partitions: 4", f"partitions: {partitions}").replace("range: 1m}", window[1:])
    return Q.load_text(handshake_kind(text, kind, "left.dst_ip"))


def run_join(
    cfg: Q.Config,
    left: np.ndarray,
    right: np.ndarray,
    *,
    hosts: int,
    skew_s: float,
    punct: int | None,
    seed: int,
    checkpoint: bool = False,
) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, list[BandJoin]]:
    """Emulated hosts -> shuffled arrival -> one BandJoin per partition in random micro-batches."""
    j = cfg.joins[0]
    sl, sr = cfg.selects
    lay = JoinLayout.of(j, sl, sr)
    rng = np.random.default_rng(seed)
    streams = []
    for s, rows in ((sl, left), (sr, right)):
        hidx = rng.integers(0, hosts, len(rows))  # asymmetric routing: any host may see either packet
        for h in range(hosts):
            skew = int(skew_s * NS * h / max(1, hosts - 1))
            msgs = simulate.select_messages(
                s,
                rows[hidx == h],
                f"cap-{h}",
                punct_every_ns=punct,
                skew_ns=skew,
                batch_ns=int(rng.choice([50, 200, 700])) * 1_000_000,
            )
            for p in range(s.kafka.partitions):  # Kafka keeps order per (topic, partition, producer) only
                streams.append([m for m in msgs if m.partition == p])
    # shuffled arrival: each stream delayed by a random amount, merged by send time
    for st in streams:
        d = int(rng.integers(0, 5 * NS))
        st[:] = [simulate.Message(m.t_ns + d, m.host, m.partition, m.value, m.mark_pane) for m in st]
    arrival = simulate.interleave(streams, seed=seed)
    expected = tuple(f"cap-{h}" for h in range(hosts))  # exact from the start: every host is known
    joins = [BandJoin(lay, host_timeout_ms=10**12, expected_hosts=expected) for _ in range(lay.partitions)]
    pairs, unmatched, wins = [], [], []
    i = 0
    while i < len(arrival):
        n = int(rng.integers(1, 60))
        chunk = arrival[i : i + n]
        i += n
        now_ms = chunk[-1].t_ns // 1_000_000
        for p in range(lay.partitions):
            vals = [m.value for m in chunk if m.partition == p]
            if not vals:
                continue
            out = joins[p].process(vals, now_ms)
            pairs.append(np.column_stack([out.l_ts, out.l_cols, out.r_ts, out.r_cols]))
            unmatched.append(np.column_stack([out.u_ts, out.u_cols]))
            if out.windows is not None and len(out.windows):
                wins.append(out.windows)
            if checkpoint and rng.random() < 0.2:  # a restart: the state from its bytes alone
                joins[p] = BandJoin.from_bytes(
                    joins[p].to_bytes(), lay, host_timeout_ms=10**12, expected_hosts=expected
                )
    w = merge_partitions(lay, wins)  # a group's window is closed on every partition: merge the partials
    got_w = pd.DataFrame({"window": w.window, "key": [tuple(k) for k in w.key.tolist()]})
    for k, v in finalize(lay, w.state).items():
        got_w[k] = v
    got_w = got_w.sort_values(["window", "key"]).reset_index(drop=True)
    return sort_rows(np.concatenate(pairs)), sort_rows(np.concatenate(unmatched)), got_w, joins


def assert_exact(
    cfg: Q.Config, hosts: int, skew_s: float, punct: int | None, seed: int, checkpoint: bool = False
) -> None:
    left, right = rows_of(cfg, 1500, seed)
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    want_p, want_u = join_oracle(lay, left, right)
    assert len(want_p) > 200 and len(want_u) > 100
    got_p, got_u, got_w, joins = run_join(
        cfg, left, right, hosts=hosts, skew_s=skew_s, punct=punct, seed=seed, checkpoint=checkpoint
    )
    if lay.type != "anti":
        np.testing.assert_array_equal(got_p, want_p)
    else:
        assert len(got_p) == 0
    if lay.type != "inner":
        np.testing.assert_array_equal(got_u, want_u)
    else:
        assert len(got_u) == 0
    want_w = join_window_oracle(lay, want_p, want_u)
    pd.testing.assert_frame_equal(got_w, want_w, check_dtype=False)
    assert all(j.state_rows == 0 for j in joins), "the closing punctuation empties the state"
    assert all(j.late == {"left": 0, "right": 0} for j in joins)


@pytest.mark.parametrize(
    ("hosts", "skew_s", "punct", "partitions"),
    [
        (1, 0, NS, 1),
        (2, 10, 10 * NS, 2),
        (3, 40, NS, 4),
        (3, 40, None, 2),
        (3, 25, 10 * NS, 1),
    ],
)
def test_inner_join_equals_the_oracle_under_disorder(
    hosts: int, skew_s: float, punct: int | None, partitions: int
) -> None:
    assert_exact(config(partitions), hosts, skew_s, punct, seed=hosts * 7 + partitions)


@pytest.mark.parametrize(
    ("kind", "hosts", "skew_s", "punct", "partitions"),
    [
        ("anti", 1, 0, 10 * NS, 1),
        ("anti", 3, 40, NS, 4),
        ("anti", 2, 5, None, 2),
        ("left", 3, 40, 10 * NS, 2),
    ],
)
def test_anti_and_left_joins_equal_the_oracle_under_disorder(
    kind: str, hosts: int, skew_s: float, punct: int | None, partitions: int
) -> None:
    assert_exact(config(partitions, kind), hosts, skew_s, punct, seed=hosts * 3 + partitions + 100)


def test_sliding_windows_and_restarts_from_checkpointed_state() -> None:
    assert_exact(config(2, window="{range: 20s, slide: 5s}"), 3, 20, NS, seed=5, checkpoint=True)
    assert_exact(config(2, "anti", window="{range: 20s, slide: 5s}"), 2, 40, NS, seed=6, checkpoint=True)


def test_an_unanswered_syn_is_never_reported_before_the_right_input_passes_its_band() -> None:
    cfg = config(1, "anti")
    sl, sr = cfg.selects
    lay = JoinLayout.of(cfg.joins[0], sl, sr)
    left, right = rows_of(cfg, 400, seed=9, dup=False)
    _, want_u = join_oracle(lay, left, right)
    j = BandJoin(lay, host_timeout_ms=10**12)
    # the left input is complete and punctuated to its end; the right input is held back
    for m in simulate.select_messages(sl, left, "cap-0", punct_every_ns=NS):
        assert len(j.process([m.value], 0).u_ts) == 0
    emitted = []
    right_msgs = simulate.select_messages(sr, right, "cap-1", punct_every_ns=NS)
    b_right = None
    for m in right_msgs:
        out = j.process([m.value], 0)
        if m.is_punctuation:
            b_right = m.mark_pane
        if len(out.u_ts):
            assert b_right is not None and (out.u_ts + lay.band_ns < b_right).all(), (
                "anti row before its band closed"
            )
            # and no later than needed: every unmatched row whose band the right mark passed is out now
        if b_right is not None:
            due = want_u[(want_u[:, 0] + lay.band_ns < b_right)]
            emitted += list(map(tuple, np.column_stack([out.u_ts, out.u_cols]).tolist()))
            assert len(emitted) == len(due)
    assert sort_rows(np.array(emitted)).tolist() == want_u.tolist()


def test_state_is_bounded_by_the_other_inputs_mark() -> None:
    cfg = config(1)
    sl, sr = cfg.selects
    lay = JoinLayout.of(cfg.joins[0], sl, sr)
    j = BandJoin(lay, host_timeout_ms=10**12)
    left, right = rows_of(cfg, 2000, seed=4, dup=False)
    msgs = simulate.interleave(
        [
            simulate.select_messages(sl, left, "a", punct_every_ns=NS),
            simulate.select_messages(sr, right, "a", punct_every_ns=NS),
        ]
    )
    peak = 0
    for m in msgs:
        j.process([m.value], 0)
        bl, br = j.b["left"], j.b["right"]
        if bl is not None and br is not None and br < wire.END_OF_STREAM:
            assert (j.store["left"].ts >= br - lay.band_ns).all() and (j.store["right"].ts >= bl).all()
        peak = max(peak, j.state_rows)
    assert 0 < peak < (len(left) + len(right)) / 5  # a few seconds of rows, not the minute
    assert j.mark_ns == wire.END_OF_STREAM and j.state_rows == 0


def test_a_state_saved_as_npz_by_an_earlier_build_resumes_exactly() -> None:
    """Checkpoints written before the stored sides were kept sorted by key hash (an .npz, no hashes)
    load, are hashed and sorted once, and the join goes on to the same pairs and unmatched rows."""
    import io
    import json

    cfg = config(1, "left")
    sl, sr = cfg.selects
    lay = JoinLayout.of(cfg.joins[0], sl, sr)
    left, right = rows_of(cfg, 600, seed=12)
    msgs = simulate.interleave(
        [simulate.select_messages(sl, left, f"cap-{h}", skew_ns=h * 5 * NS) for h in (0, 1)]
        + [simulate.select_messages(sr, right, "cap-0", skew_ns=0)],
        seed=3,
    )
    a, b = BandJoin(lay, host_timeout_ms=10**12), BandJoin(lay, host_timeout_ms=10**12)
    half = len(msgs) // 2
    outs: dict[str, list] = {"a": [], "b": []}
    for name, j in (("a", a), ("b", b)):
        out = j.process([m.value for m in msgs[:half]], 0)
        outs[name].append(out)
    head, arrays = b.state()
    assert b.state_rows > 50
    old = {k: v for k, v in arrays.items() if not k.endswith("_h")}
    rng = np.random.default_rng(1)
    for s in ("left", "right"):  # an earlier build kept arrival order, not hash order
        perm = rng.permutation(len(old[f"{s}_ts"]))
        for k in ("ts", "cols", "matched"):
            old[f"{s}_{k}"] = old[f"{s}_{k}"][perm]
    buf = io.BytesIO()
    np.savez(buf, head=np.frombuffer(json.dumps(head).encode(), np.uint8), **old)
    b = BandJoin.from_bytes(buf.getvalue(), lay, host_timeout_ms=10**12)
    assert (np.diff(b.store["left"].h.astype(np.float64)) >= 0).all() and b.state_rows == a.state_rows
    for name, j in (("a", a), ("b", b)):
        outs[name].append(j.process([m.value for m in msgs[half:]], 0))
    for k in ("l_ts", "r_ts", "u_ts"):
        got = [np.sort(np.concatenate([getattr(o, k) for o in outs[n]])) for n in ("a", "b")]
        np.testing.assert_array_equal(got[0], got[1])
        assert len(got[0]) > 0


def test_rows_below_their_inputs_mark_are_late_never_joined() -> None:
    cfg = config(1)
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    j = BandJoin(lay, host_timeout_ms=10**12)
    j.observe("left", "a", 1, 100, 0, 0)
    j.observe("right", "a", 1, 100, 0, 0)
    j.step()
    cols = np.zeros((2, lay.lw), np.int64)
    j.add("left", np.array([99, 100]), cols)
    j.add("right", np.array([99, 100]), np.zeros((2, lay.rw), np.int64))
    out = j.step()
    assert j.late == {"left": 1, "right": 1} and out.pairs == 1


def test_match_pairs_checks_every_word_not_only_the_hash() -> None:
    lk = np.array([[1, 2], [1, 2], [3, 4]])
    rk = np.array([[1, 2], [3, 4], [1, 3]])
    li, ri = match_pairs(lk, np.array([0, 10, 0]), rk, np.array([2, 1, 5]), 3)
    assert sorted(zip(li.tolist(), ri.tolist(), strict=True)) == [(0, 0), (2, 1)]


def _topics(cfg: Q.Config, t1: str, t2: str, partitions: int) -> Q.Config:
    text = HANDSHAKE.replace("partitions: 4}", f"partitions: {partitions}}}")
    text = text.replace(
        f"kafka: {{partitions: {partitions}}}", f"kafka: {{topic: {t1}, partitions: {partitions}}}", 1
    )
    text = text.replace(
        f"kafka: {{partitions: {partitions}}}", f"kafka: {{topic: {t2}, partitions: {partitions}}}", 1
    )
    return Q.load_text(text)


def expected_windows(cfg: Q.Config, left: np.ndarray, right: np.ndarray) -> pd.DataFrame:
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    pairs, unmatched = join_oracle(lay, left, right)
    w = join_window_oracle(lay, pairs, unmatched)
    rl = lay.rollup
    w["window_end"] = pd.to_datetime(rl.origin_ns + (w["window"] + 1) * rl.pane_ns, utc=True)
    w["dst_port"] = [k[0] for k in w["key"]]
    return (
        w[["window_end", "dst_port", "completed", "avg_latency_ns"]]
        .sort_values(["window_end", "dst_port"])
        .reset_index(drop=True)
    )


@pytest.mark.parametrize("threads", [True, False])
def test_job_step_merges_partitions_into_exact_windows(threads: bool, monkeypatch) -> None:
    """The job's state group (all partitions of one join, one roll-up) through its packed output, its
    partitions' joins run on threads (two, whatever the machine) or one after the other."""
    from concurrent.futures import ThreadPoolExecutor

    from high_level.aggregate.packed import unpack_rows
    from high_level.aggregate.processor import Settings
    from high_level.join import step as joinstep
    from high_level.join.step import JoinProcessor

    pool = ThreadPoolExecutor(2) if threads else None
    monkeypatch.setattr(joinstep, "_pool", lambda n: pool)

    cfg = config(4)
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    left, right = rows_of(cfg, 1200, seed=21)
    msgs = handshake_messages(cfg, left, right, hosts=3, skew_s=30, seed=3)
    settings = Settings(10**9, ("cap-0", "cap-1", "cap-2"), "drop")
    proc = JoinProcessor(lay, settings)
    got, statuses = [], []
    for i in range(0, len(msgs), 97):
        by_part: dict[int, list[bytes]] = {}
        for _, p, v in msgs[i : i + 97]:
            by_part.setdefault(p, []).append(v)
        rows = unpack_rows(proc.process_packed(by_part, i), {lay.name: lay.rollup})
        proc = JoinProcessor.from_bytes(proc.to_bytes(), lay, settings)
        d = rows.to_pandas()
        got.append(d[d["kind"] == "final"])
        statuses += [s for s in d.loc[d["kind"] == "status", "status"]]
    g = pd.concat(got, ignore_index=True)
    g["key"] = [tuple(k) for k in g["key"]]
    assert not g.duplicated(["window", "key"]).any()
    assert (g["hosts_in_mark"] == 3).all() and (g["hosts_expected"] == 3).all()
    fin = finalize(lay, np.array(g["state"].tolist()))
    got_df = pd.DataFrame(
        {
            "window_end": pd.to_datetime(g["window_end_ns"], utc=True),
            "dst_port": [k[0] for k in g["key"]],
            **fin,
        }
    )
    got_df = got_df.sort_values(["window_end", "dst_port"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got_df, expected_windows(cfg, left, right), check_dtype=False)
    peak = max(__import__("json").loads(s)["state_rows"] for s in statuses)
    assert peak > 0
    if pool is not None:
        pool.shutdown()


def run_to_end(job: Any) -> None:
    """Start the job, process what the topics hold, again after a tick (the state step's timer), and stop."""
    job.start()
    try:
        job.process_all_available()
        time.sleep(0.5)
        job.process_all_available()
    finally:
        job.stop()


def test_handshake_join_through_real_kafka_and_spark(spark, kafka, topic_factory, tmp_path) -> None:
    """Select batches of 3 skewed hosts in real Kafka -> the real job -> stored windows equal the oracle;
    the join state shows in /status; a join over a topic that does not exist is a clear error."""
    from high_level.job import HighLevelJob, JobOptions
    from high_level.join.pipeline import MissingInputTopic
    from lowwater_testing.spark import job_options, read_results
    from lowwater_testing.topics import produce

    t1, t2 = topic_factory(partitions=2), topic_factory(partitions=2)
    cfg = _topics(config(2), t1, t2, 2)
    left, right = rows_of(cfg, 800, seed=31)
    produce(kafka, handshake_messages(cfg, left, right, hosts=3, skew_s=20, seed=4))
    opts = job_options(
        kafka.bootstrap_servers,
        tmp_path,
        "t-join",
        create_topics=False,
        expected_hosts=("cap-0", "cap-1", "cap-2"),
    )
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    got = read_results(tmp_path / "res", "handshakes")
    fin = got[got["kind"] == "final"].copy()
    assert fin["complete"].all()
    fin["window_end"] = pd.to_datetime(fin["window_end"], utc=True).astype("datetime64[ns, UTC]")
    g = fin[["window_end", "dst_port", "completed", "avg_latency_ns"]].sort_values(["window_end", "dst_port"])
    want = expected_windows(cfg, left, right)
    want["window_end"] = want["window_end"].astype("datetime64[ns, UTC]")
    pd.testing.assert_frame_equal(g.reset_index(drop=True), want, check_dtype=False)
    st = __import__("json").loads((tmp_path / "res" / "_status.json").read_text())
    parts = st["queries"]["handshakes"]["partitions"]
    assert set(parts) == {"0", "1"} and all("state_bytes" in p for p in parts.values())
    # a join whose input topic is missing: a clear error before anything runs, nothing written
    bad = _topics(config(2), t1, "no-such-topic-" + t2, 2)
    job2 = HighLevelJob(
        spark,
        [],
        JobOptions(
            bootstrap=kafka.bootstrap_servers,
            results=str(tmp_path / "res2"),
            checkpoint=str(tmp_path / "ck2"),
            name="t-join2",
            create_topics=False,
        ),
        config=bad,
    )
    with pytest.raises(MissingInputTopic, match="no-such-topic"):
        job2.start()
    assert not list((tmp_path / "res2").glob("query=*"))


TRAFFIC = dict(groups=300, seed=5, syn_fraction=0.3, ipv6_fraction=0.1, synthetic_pps=1000, start_ns=T0)
GENERATED = TRAFFIC | dict(  # and the server's answers
    synack_fraction=0.7,
    synack_latency_ms=300,
    synack_latency_sigma=1.0,
    syn_retransmit_fraction=0.4,
    synack_duplicate_fraction=0.2,
)


def generated_rows(cfg: Q.Config, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The SYN and SYN-ACK rows of the generator's packets (SYN-ACKs on), parsed by dpkt: the oracle's input."""
    import dpkt

    from low_level.capture.sources import generate_frames

    frames, caplen, _, ts = generate_frames(n, snaplen=128, **GENERATED)
    left, right = [], []
    for k in range(len(ts)):
        ip = dpkt.ethernet.Ethernet(bytes(frames[k, : caplen[k]])).data
        tcp = ip.data
        if not isinstance(tcp, dpkt.tcp.TCP) or not tcp.flags & dpkt.tcp.TH_SYN:
            continue
        if isinstance(ip, dpkt.ip.IP):
            src, dst = (
                (0, 0xFFFF00000000 | int.from_bytes(ip.src, "big")),
                (0, 0xFFFF00000000 | int.from_bytes(ip.dst, "big")),
            )
            ttl = ip.ttl
        else:
            src, dst = (
                (int.from_bytes(a, "big", signed=True) for a in (ip.src[:8], ip.src[8:])),
                (int.from_bytes(a, "big", signed=True) for a in (ip.dst[:8], ip.dst[8:])),
            )
            ttl = ip.hlim
        row = [int(ts[k]), *src, tcp.sport, *dst, tcp.dport]
        (right if tcp.flags & dpkt.tcp.TH_ACK else left).append(
            row + [ttl] * (tcp.flags & dpkt.tcp.TH_ACK != 0)
        )
    widths = [1 + sum(1 for _ in s.columns) for s in cfg.selects]
    return (np.array(left, np.int64).reshape(-1, widths[0]), np.array(right, np.int64).reshape(-1, widths[1]))


def test_generated_handshakes_through_the_agent_kafka_and_spark_equal_the_oracle(
    spark, kafka, topic_factory, tmp_path
) -> None:
    """The generator answering SYNs (lognormal latency, retransmitted SYNs, duplicate SYN-ACKs) -> the real
    agent process -> real Kafka -> the real job: the inner and the anti join's stored windows equal the
    brute-force oracle over the same packets parsed by dpkt (some handshakes, some unanswered SYNs)."""

    from high_level.job import HighLevelJob
    from lowwater_testing.spark import job_options, read_results

    t1, t2 = topic_factory(partitions=2), topic_factory(partitions=2)
    text = HANDSHAKE.replace("partitions: 4}", "partitions: 2}").replace("range: 1m}", "range: 10s}")
    text = text.replace("kafka: {partitions: 2}", f"kafka: {{topic: {t1}, partitions: 2}}", 1)
    text = text.replace("kafka: {partitions: 2}", f"kafka: {{topic: {t2}, partitions: 2}}", 1)
    text += """  - name: unanswered
    kind: join
    left: syn
    right: synack
    on: {left: [src_ip, src_port, dst_ip, dst_port], right: [dst_ip, dst_port, src_ip, src_port]}
    within: 3s
    type: anti
    group_by: [left.dst_port]
    aggregates:
      - {fn: count, as: unanswered}
      - {fn: max, expr: left.src_port, as: max_port}
    window: {range: 10s}
"""
    path = tmp_path / "hs.yaml"
    path.write_text(text)
    cfg = Q.load(path)
    n = 30_000  # 30 s at 1000 packets/s: 4 windows of 10 s
    source = f"generator:clock=synthetic,count={n}," + ",".join(f"{k}={v}" for k, v in GENERATED.items())
    run_agent(path, source, host="cap-0", bootstrap=kafka.bootstrap_servers, timeout=600)
    opts = job_options(
        kafka.bootstrap_servers,
        tmp_path,
        "t-join-gen",
        create_topics=False,
        expected_hosts=("cap-0",),
    )
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    left, right = generated_rows(cfg, n)
    for j, cols in zip(cfg.joins, (["completed", "avg_latency_ns"], ["unanswered", "max_port"]), strict=True):
        lay = JoinLayout.of(j, *cfg.selects)
        pairs, unmatched = join_oracle(lay, left, right)
        assert len(pairs) > 1000 and len(unmatched) > 500
        want = join_window_oracle(lay, pairs, unmatched)
        want["window_end"] = pd.to_datetime(
            lay.rollup.origin_ns + (want["window"] + 1) * lay.rollup.pane_ns, utc=True
        )
        want["dst_port"] = [k[0] for k in want["key"]]
        want = (
            want[["window_end", "dst_port", *cols]]
            .sort_values(["window_end", "dst_port"])
            .reset_index(drop=True)
        )
        want["window_end"] = want["window_end"].astype("datetime64[ns, UTC]")
        got = read_results(tmp_path / "res", j.name)
        fin = got[got["kind"] == "final"].copy()
        assert fin["complete"].all()
        fin["window_end"] = pd.to_datetime(fin["window_end"], utc=True).astype("datetime64[ns, UTC]")
        g = (
            fin[["window_end", "dst_port", *cols]]
            .sort_values(["window_end", "dst_port"])
            .reset_index(drop=True)
        )
        pd.testing.assert_frame_equal(g, want, check_dtype=False)
    # the generator's share shows: ~70 % of the SYNs answered within the band, retransmissions among the rest
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    pairs, _ = join_oracle(lay, left, right)
    assert 0.5 < len({tuple(r[:7]) for r in pairs}) / len(left) < 0.8


def test_watermark_mode_refuses_join_queries_at_start(tmp_path, capsys) -> None:
    """--mode watermark has no join: a config with joins is refused before Spark starts, naming the joins
    and the mode to use, never run with the joins silently skipped; a config without joins still starts."""
    from pathlib import Path

    from high_level import cli
    from high_level.aggregate.watermark import WatermarkJoinRefused, refuse_joins
    from high_level.job import HighLevelJob, JobOptions

    hs = Path(__file__).resolve().parents[1] / "configs" / "handshake.yaml"
    rc = cli.main(
        [
            "--config",
            str(hs),
            "--mode",
            "watermark",
            "--results",
            str(tmp_path / "r"),
            "--checkpoint",
            str(tmp_path / "c"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "'handshakes'" in err and "'silent_servers'" in err and "--mode oop" in err
    assert str(hs) in err and not (tmp_path / "r").exists()
    opts = JobOptions(
        bootstrap="127.0.0.1:1", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "c"), mode="watermark"
    )
    with pytest.raises(WatermarkJoinRefused, match="punctuation mode only"):
        HighLevelJob(None, [], opts, config=Q.load(hs))
    refuse_joins(Q.load(Path(__file__).resolve().parents[1] / "configs" / "default.yaml"))  # no joins: fine


def test_a_configs_run_source_is_checked_and_used_by_the_stack() -> None:
    """configs/handshake.yaml names its generator (SYNs answered) as 'source:'; a bad one is a config error
    with file, line and reason."""
    from pathlib import Path

    from low_level.cli import parse_source

    cfg = Q.load(Path(__file__).resolve().parents[1] / "configs" / "handshake.yaml")
    spec = parse_source(cfg.source)
    assert spec["type"] == "generator" and 0 < spec["synack_fraction"] < 1
    text = "queries:\n  - name: q\n    aggregates: [{fn: count, as: n}]\n    window: {range: 1m}\nsource: pcp:/x\n"
    with pytest.raises(Q.ConfigError, match="source string starting with one of generator") as e:
        Q.load_text(text, "x.yaml")
    assert e.value.line == 5 and str(e.value).startswith("x.yaml:5")
    assert Q.load_text(text.replace("pcp:", "pcap:"), "x.yaml").source == "pcap:/x"


def test_job_step_state_is_compressed_and_reads_the_earlier_layout() -> None:
    """The join state group's blob is zstd-compressed without the key hashes (recomputed on load, same
    order); a blob of the earlier layout (plain codec bytes, hashes stored) still restores to the same state."""
    from high_level import codec
    from high_level.aggregate.processor import Settings
    from high_level.join.step import ZMAGIC, JoinProcessor

    cfg = config(2)
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    left, right = rows_of(cfg, 600, seed=5)
    msgs = handshake_messages(cfg, left, right, hosts=2, skew_s=20, seed=4)
    settings = Settings(10**9, ("cap-0", "cap-1"), "drop")
    proc = JoinProcessor(lay, settings)
    by_part: dict[int, list[bytes]] = {}
    for _, p, v in msgs[: len(msgs) // 2]:
        by_part.setdefault(p, []).append(v)
    proc.process_packed(by_part, 0)
    assert sum(j.state_rows for j in proc.joins.values()) > 0
    new = proc.to_bytes()
    assert new.startswith(ZMAGIC)
    head, arrays = codec.unpack(
        __import__("pyarrow").decompress(
            new[12:], decompressed_size=int.from_bytes(new[4:12], "little"), codec="zstd", asbytes=True
        )
    )
    assert not any(k.endswith("_h") for k in arrays)
    del head["hashes"]
    for p, j in proc.joins.items():
        arrays |= {f"join{p}/{s}_h": j.store[s].h for s in ("left", "right")}
    old = codec.pack(head, arrays)
    for blob in (new, old):
        back = JoinProcessor.from_bytes(blob, lay, settings)
        for p, j in proc.joins.items():
            for s in ("left", "right"):
                np.testing.assert_array_equal(back.joins[p].store[s].h, j.store[s].h)
                np.testing.assert_array_equal(back.joins[p].store[s].cols, j.store[s].cols)
        assert back.to_bytes() == new


def test_a_select_gap_is_charged_up_to_the_newest_row_the_host_sent() -> None:
    """Rows lost between two punctuations may lead the mark (a select sends rows as they come): the gap's
    time range reaches the punctuation's ``sent_upto``, not just its mark."""
    cfg = config(1)
    sl, _ = cfg.selects
    lay = JoinLayout.of(cfg.joins[0], sl, cfg.selects[1])
    j, w = BandJoin(lay, host_timeout_ms=10**12), lay.lw

    def rows(seq: int, ts: list[int]) -> bytes:
        block = np.column_stack([np.array(ts, np.int64), np.ones((len(ts), w), np.int64)])
        return wire.encode_rows(sl.name, "cap-0", 1, 0, seq, block)

    def punct(seq: int, mark: int, upto: int) -> bytes:
        return wire.encode_punctuation(
            wire.Punctuation(sl.name, "cap-0", 1, 0, seq, mark, mark, 0, sent_upto=upto)
        )

    lost_ts = 50 * NS
    msgs = [
        rows(0, [NS]),
        punct(1, 2 * NS, NS),
        rows(1, [lost_ts]),
        rows(2, [2 * NS]),
        punct(3, 3 * NS, lost_ts),
    ]
    j.process([m for i, m in enumerate(msgs) if i != 2], 0)
    gaps = [g for g in j.take_losses() if g[4] == "gap"]
    assert len(gaps) == 1 and gaps[0][0] <= lost_ts <= gaps[0][1] and gaps[0][2] == 1
