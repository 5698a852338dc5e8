"""``kind: distinct`` (OOP section 5.4's Dupelim) against a brute-force oracle: the packets two taps both saw
(and a tap's own repeats) stored once, exactly, whatever the arrival order, skew, partitions or restarts;
state purged by punctuation; config errors with file, line and reason; through real Kafka and Spark."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from high_level.aggregate.processor import Settings
from high_level.distinct.dupelim import DistinctLayout, DistinctProcessor, DupElim
from lowwater_testing import oracle as simulate

NS = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * NS
TAPS = """
queries:
  - name: pkts
    kind: select
    fields: [src_ip, dst_ip, src_port, dst_port, length]
    partition_by: [src_ip, dst_ip]
    kafka: {partitions: 2}
  - name: pkts_once
    kind: distinct
    input: pkts
    within: 1ms
    window: {range: 10s}
"""


def cfg_of(partitions: int, text: str = TAPS) -> Q.Config:
    return Q.load_text(text.replace("partitions: 2", f"partitions: {partitions}"), "taps.yaml")


def tap_rows(sel: Q.SelectSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of tap A (every packet, some captured twice at the same instant) and tap B (80 % of them,
    0-400 us later). 40 flows and 3 lengths: one flow's packets repeat their identity, some under 1 ms
    apart (one row by definition), most further apart (distinct rows)."""
    rng = np.random.default_rng(seed)
    flow = rng.integers(0, 40, n)
    ts = T0 + np.sort(rng.integers(0, 60 * NS, n))
    ts[rng.random(n) < 0.05] = ts[0]  # a burst: equal timestamps of different flows
    rows = np.zeros((n, 1 + sel.width), np.int64)
    rows[:, 0] = ts
    rows[:, 1 + sel.word_index("src_ip")[1]] = 0x0A000000 + flow
    rows[:, 1 + sel.word_index("dst_ip")[1]] = 0x0A010000 + flow % 7
    rows[:, 1 + sel.word_index("src_ip")[0]] = rows[:, 1 + sel.word_index("dst_ip")[0]] = 0xFFFF
    rows[:, 1 + sel.word_index("src_port")[0]] = 1000 + flow
    rows[:, 1 + sel.word_index("dst_port")[0]] = 443
    rows[:, 1 + sel.word_index("length")[0]] = rng.choice([60, 1500, 576], n)
    a = np.concatenate([rows, rows[rng.random(n) < 0.05]])  # tap A's own repeats, same timestamp
    b = rows[rng.random(n) < 0.8].copy()
    b[:, 0] += rng.integers(0, 400_000, len(b))
    return a, b


def distinct_oracle(rows: np.ndarray, key: list[int], within: int) -> np.ndarray:
    """Brute force in pandas: per identity in time order, keep a row whose previous copy is over
    ``within`` before it (or that has none)."""
    df = pd.DataFrame(rows)
    kc = [1 + k for k in key]
    df = df.sort_values([*kc, 0], kind="stable")
    gap = df[0].diff()
    same = (df[kc].shift() == df[kc]).all(axis=1)
    kept = df[~(same & (gap <= within))]
    return _sorted(kept.to_numpy(np.int64))


def _sorted(a: np.ndarray) -> np.ndarray:
    return a[np.lexsort(a.T[::-1])] if len(a) else a


def arrival(sel: Q.SelectSpec, a: np.ndarray, b: np.ndarray, skew_s: float, punct: int | None, seed: int):
    rng = np.random.default_rng(seed)
    streams = []
    for h, rows in enumerate((a, b)):
        msgs = simulate.select_messages(
            sel, rows, f"tap-{h}", punct_every_ns=punct, skew_ns=int(skew_s * NS * h), batch_ns=200 * MS
        )
        for p in range(sel.kafka.partitions):
            st = [m for m in msgs if m.partition == p]
            d = int(rng.integers(0, 5 * NS))
            streams.append(
                [simulate.Message(m.t_ns + d, m.host, m.partition, m.value, m.mark_pane) for m in st]
            )
    return simulate.interleave(streams, seed=seed)


def run(cfg: Q.Config, msgs, seed: int, restart: bool) -> tuple[np.ndarray, pd.DataFrame, DistinctProcessor]:
    """The job's state group over shuffled arrival in random micro-batches; kept rows from the stored windows."""
    from high_level.aggregate.packed import unpack_rows

    lay = DistinctLayout.of(cfg.distincts[0], cfg.selects[0])
    settings = Settings(10**12, ("tap-0", "tap-1"), "drop")
    proc = DistinctProcessor(lay, settings)
    rng = np.random.default_rng(seed)
    got, i = [], 0
    while i < len(msgs):
        n = int(rng.integers(1, 40))
        by_part: dict[int, list[bytes]] = {}
        for m in msgs[i : i + n]:
            by_part.setdefault(m.partition, []).append(m.value)
        now_ms = msgs[min(i + n, len(msgs)) - 1].t_ns // MS
        i += n
        d = unpack_rows(proc.process_packed(by_part, now_ms), {lay.name: lay.rollup}).to_pandas()
        got.append(d[d["kind"] == "final"])
        if restart and rng.random() < 0.3:
            proc = DistinctProcessor.from_bytes(proc.to_bytes(), lay, settings)
    g = pd.concat(got, ignore_index=True)
    return lay, g, proc


def kept_rows(lay: DistinctLayout, g: pd.DataFrame, width: int) -> np.ndarray:
    """Stored (window, key) rows back to input rows: the key is the identity words, then the timestamp."""
    key = np.array(g["key"].tolist(), np.int64).reshape(len(g), len(lay.key) + 1)
    rows = np.zeros((len(g), 1 + width), np.int64)
    rows[:, 0] = key[:, -1]
    for i, w in enumerate(lay.key):
        rows[:, 1 + w] = key[:, i]
    return _sorted(rows)


@pytest.mark.parametrize(
    ("partitions", "skew_s", "punct", "restart", "seed"),
    [(1, 0, NS, False, 1), (2, 30, NS, True, 2), (4, 10, 10 * NS, True, 3), (2, 40, None, False, 4)],
)
def test_each_distinct_row_is_stored_once_exactly_under_disorder(
    partitions: int, skew_s: float, punct: int | None, restart: bool, seed: int
) -> None:
    cfg = cfg_of(partitions)
    sel = cfg.selects[0]
    a, b = tap_rows(sel, 4000, seed)
    lay, g, proc = run(cfg, arrival(sel, a, b, skew_s, punct, seed), seed, restart)
    want = distinct_oracle(np.concatenate([a, b]), list(lay.key), MS)
    assert len(a) + len(b) - len(want) > 3000, "taps' copies and repeats removed"
    assert len(want) > 3000
    assert (g["state"].apply(lambda s: s[0]) == 1).all(), "every stored row once"
    assert not pd.Series([tuple(k) for k in g["key"]]).duplicated().any()
    np.testing.assert_array_equal(kept_rows(lay, g, sel.width), want)
    assert (g["hosts_in_mark"] == 2).all() and (g["hosts_expected"] == 2).all()
    assert all(d.state_rows == 0 and d.late == 0 for d in proc.parts.values()), "closing mark empties it"


def test_within_zero_is_select_distinct_and_the_oracle_is_not_trivial() -> None:
    """within 0: only equal timestamps are copies (tap A's repeats), so tap B's rows all stay."""
    cfg = cfg_of(1, TAPS.replace("within: 1ms", "within: 0"))
    sel = cfg.selects[0]
    a, b = tap_rows(sel, 2000, 9)
    lay, g, _ = run(cfg, arrival(sel, a, b, 5, NS, 9), 9, True)
    want = distinct_oracle(np.concatenate([a, b]), list(lay.key), 0)
    np.testing.assert_array_equal(kept_rows(lay, g, sel.width), want)
    assert len(want) == len(np.unique(np.concatenate([a, b]), axis=0))


def test_state_is_purged_by_punctuation_and_rows_wait_for_the_mark() -> None:
    """A row is decided (and its window can close) only once the mark passes it; its identity is kept as
    long as a copy could still come (mark below ts + within), then purged."""
    cfg = cfg_of(1)
    lay = DistinctLayout.of(cfg.distincts[0], cfg.selects[0])
    d = DupElim(lay, Settings(10**12, (), "drop"))
    cols = np.zeros((1, lay.width), np.int64)

    def mark(ns: int) -> tuple[np.ndarray, np.ndarray]:
        d.meld.observe("a", 1, ns, ns, 0, 0)
        return d.step()

    mark(0)
    d.add(np.array([10 * MS]), cols)
    ts, _ = mark(10 * MS)
    assert len(ts) == 0 and len(d.p_ts) == 1  # mark at the row: a copy at 10 ms may still come
    d.add(np.array([10 * MS + MS // 2]), cols)  # a copy 0.5 ms later (the other tap)
    ts, _ = mark(10 * MS + 1)
    assert ts.tolist() == [10 * MS] and len(d.p_ts) == 1 and len(d.h_ts) == 1
    ts, _ = mark(11 * MS)
    assert len(ts) == 0 and len(d.h_ts) == 2  # the copy dropped; both kept as predecessors
    ts, _ = mark(11 * MS + MS // 4)
    assert d.h_ts.tolist() == [10 * MS + MS // 2]  # 10 ms can no longer be anyone's copy
    ts, _ = mark(20 * MS)
    assert d.state_rows == 0
    d.add(np.array([19 * MS]), cols)
    assert d.late == 1 and d.losses[-1][4] == "job_late"


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        ("input: pkts", "input: nope", "unknown select 'nope'"),
        ("within: 1ms", "within: 1ms\n    fields: [src_ip, ttl]", "'ttl' is not a field"),
        ("within: 1ms", "within: 2m", "larger than what select"),
        ("within: 1ms", "within: 1ms\n    fields: [src_port]", "partition_by"),
        ("window: {range: 10s}", "window: {range: 10s, slide: 5s}", "tumbling"),
        ("within: 1ms", "within: 1ms\n    oops: 1", "unknown field"),
    ],
)
def test_bad_distincts_name_file_line_and_reason(edit: str, field: str, reason: str) -> None:
    text = TAPS.replace(edit, field)
    with pytest.raises(Q.ConfigError, match=reason) as e:
        Q.load_text(text, "taps.yaml")
    assert e.value.file == "taps.yaml" and "pkts_once" in str(e.value)
    first = field.splitlines()[-1].strip().split(":")[0]
    want = next(
        i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(first + ":") and i > 8
    )
    assert e.value.line == want


def test_a_distinct_is_a_stored_query_with_its_fields_and_timestamp() -> None:
    from contract import results as R

    cfg = cfg_of(2)
    sq = cfg.stored_queries[-1]
    assert sq.name == "pkts_once"
    names = [f.name for f in R.schema(sq)]
    for c in ("src_ip", "dst_ip", "src_port", "dst_port", "length", "timestamp", "rows"):
        assert c in names


def test_distinct_rows_through_real_kafka_and_spark_with_a_restart(
    spark, kafka, topic_factory, tmp_path
) -> None:
    """Two taps' select batches in real Kafka, half, the job stops, the rest, the job resumes from its
    checkpoint: the stored rows are the oracle's, each once, every window complete."""
    from high_level.job import HighLevelJob
    from lowwater_testing.spark import job_options, read_results
    from lowwater_testing.topics import produce
    from tests.test_join import run_to_end

    topic = topic_factory(partitions=2)
    cfg = Q.load_text(TAPS.replace("kafka: {partitions: 2}", f"kafka: {{topic: {topic}, partitions: 2}}"))
    sel = cfg.selects[0]
    a, b = tap_rows(sel, 1500, 11)
    msgs = arrival(sel, a, b, 20, NS, 11)
    lay = DistinctLayout.of(cfg.distincts[0], sel)
    want = distinct_oracle(np.concatenate([a, b]), list(lay.key), MS)
    opts = job_options(
        kafka.bootstrap_servers,
        tmp_path,
        "t-distinct",
        create_topics=False,
        expected_hosts=("tap-0", "tap-1"),
    )
    half = len(msgs) // 2
    produce(kafka, [(topic, m.partition, m.value) for m in msgs[:half]])
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    produce(kafka, [(topic, m.partition, m.value) for m in msgs[half:]])
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    got = read_results(tmp_path / "res", "pkts_once")
    fin = got[got["kind"] == "final"]
    assert fin["complete"].all() and (fin["rows"] == 1).all()
    assert len(fin) == len(want)
    got_keys = sorted(zip(fin["timestamp"].astype("int64"), fin["src_port"], fin["length"], strict=True))
    ws = {n: sel.word_index(n)[0] + 1 for n in ("src_port", "length")}
    want_keys = sorted(zip(want[:, 0], want[:, ws["src_port"]], want[:, ws["length"]], strict=True))
    assert got_keys == want_keys
