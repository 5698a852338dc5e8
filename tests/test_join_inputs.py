"""Joins over aggregate queries' closed windows and joins that store their raw rows (contract/query/joins.py,
high_level/join/feed.py, high_level/join/rows.py), against the join oracle of lowwater_testing/joins.py under
disorder: emulated capture hosts (lowwater_testing/oracle.py) -> the aggregates' partition step -> the
closed-window feed the sink publishes (with replayed batches) -> the join step, in random micro-batches."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contract import query as Q
from contract import wire
from contract.query import joins as JI
from high_level.aggregate.packed import unpack_incomplete, unpack_rows, unpack_windows
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.join.feed import FeedDedup, FeedPublisher
from high_level.join.pipeline import layouts
from high_level.join.rows import RowsLayout
from high_level.join.step import JoinProcessor
from lowwater_testing import oracle as simulate
from lowwater_testing.joins import join_oracle, join_window_oracle
from lowwater_testing.traffic import make_handshake_traffic

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
HOSTS = ("cap-0", "cap-1", "cap-2")


def _join(name: str, kind: str, *extra: str) -> str:
    """A join of syn_dst with synack_src on the server's address within the window, as CONFIG's YAML lines."""
    lines = ("kind: join", "left: syn_dst", "right: synack_src", "on: {left: [dst_ip], right: [server]}")
    return f"  - name: {name}\n" + "".join(
        f"    {ln}\n" for ln in (*lines, "within: window", f"type: {kind}", *extra)
    )


CONFIG = """
queries:
  - name: syn_dst
    filter: protocol == tcp and tcp_flags & SYN and not tcp_flags & ACK
    group_by: [dst_ip]
    aggregates: [{fn: count, as: syns}, {fn: max, field: src_port, as: max_cport}]
    window: {range: 10s}
    kafka: {partitions: 2}
  - name: synack_src
    filter: protocol == tcp and tcp_flags & SYN and tcp_flags & ACK
    group_by: [{field: src_ip, as: server}]
    aggregates: [{fn: count, as: synacks}]
    window: {range: 10s}
    kafka: {partitions: 2}
""" + "".join(
    _join(name, kind, *extra)
    for name, kind, *extra in (
        ("answered", "inner"),
        ("half_answered", "left"),
        ("silent_servers", "anti", "window: {range: 10s}"),
        (
            "unanswered_syns",
            "anti",
            "aggregates: [{fn: count, as: servers}, {fn: sum, expr: left.syns, as: syns}]",
            "window: {range: 20s}",
        ),
    )
)


@pytest.fixture(scope="module")
def cfg() -> Q.Config:
    return Q.load_text(CONFIG)


@pytest.fixture(scope="module")
def traffic():
    # few SYNs per (server, window) so that servers without any SYN-ACK in a window are common
    return make_handshake_traffic(500, T0, 80 * NS, seed=3, answered=0.5, max_latency_ns=4 * NS, noise=300)


def feed_oracle(q: Q.QuerySpec, traffic) -> np.ndarray:
    """The closed rows of ``q`` as the feed carries them (window start, key, state), from the offline oracle."""
    w = simulate.window_oracle(q, simulate.pane_oracle(q, traffic.rows()))
    lay = Layout.of(q)
    cols = [c for c in w.columns if c.startswith("k")] + [c for c in w.columns if c.startswith("s")]
    return np.column_stack([lay.window_start_ns(w["window"].to_numpy()), w[cols].to_numpy(np.int64)])


def feed_messages(
    cfg: Q.Config,
    traffic,
    *,
    skew_s: int,
    punct_s: int,
    seed: int,
    replay: float = 0.2,
    lose: tuple[str, str, float, float] | None = None,
) -> list[tuple[str, bytes]]:
    """What the job's aggregate stream publishes on the feeds: hosts with skew -> shuffled partials -> one
    PartitionProcessor per (query, partition) in random batches -> sink-side publisher; a share ``replay``
    of the batches is published twice (a job restarted between publishing and committing). ``lose`` =
    (query, host, from, to): that host's partials messages of that query from share ``from`` to share
    ``to`` never reach the job (a sequence gap), so some of the query's windows close short."""
    rng = np.random.default_rng(seed)
    aggs = cfg.queries
    rows = traffic.rows()
    hix = simulate.split_hosts(len(rows), len(HOSTS), seed=seed)
    streams = []
    for q in aggs:
        for i, h in enumerate(HOSTS):
            streams.append(
                [
                    (q.name, m)
                    for m in simulate.host_messages(
                        q,
                        rows[hix == i],
                        h,
                        partitions=q.kafka.partitions,
                        skew_ns=skew_s * NS * i // 2,
                        punct_every_ns=punct_s * NS,
                        seed=seed + i,
                        end_mark=wire.END_OF_STREAM,
                    )
                ]
            )
    if lose is not None:
        qn, host, lo, hi = lose
        k = [q.name for q in aggs].index(qn) * len(HOSTS) + HOSTS.index(host)
        parts = [i for i, (_, m) in enumerate(streams[k]) if wire.peek(m.value)[0] != wire.KIND_PUNCT]
        gone = set(parts[int(len(parts) * lo) : int(len(parts) * hi)])
        streams[k] = [x for i, x in enumerate(streams[k]) if i not in gone]
    heads = [[m for _, m in s] for s in streams]
    merged = simulate.interleave(heads, seed=seed)
    owner = {id(m): qn for s in streams for qn, m in s}
    settings = Settings(host_timeout_ms=10**12, expected_hosts=HOSTS)
    lays = {q.name: Layout.of(q) for q in aggs}
    procs = {
        (q.name, p): PartitionProcessor([lays[q.name]], p, settings)
        for q in aggs
        for p in range(q.kafka.partitions)
    }
    pub = FeedPublisher(aggs, producer=object())
    statuses: dict[str, dict[int, object]] = {}
    out: list[tuple[str, bytes]] = []
    i, batch = 0, 0
    while i < len(merged):
        n = int(rng.integers(1, 80))
        chunk, i = merged[i : i + n], i + n
        packed = []
        for (qn, p), proc in procs.items():
            vals = [m.value for m in chunk if owner[id(m)] == qn and m.partition == p]
            packed.append(pa.Table.from_pandas(proc.process_packed(vals, batch), preserve_index=False))
        table = pa.concat_tables(packed)
        wins, texts = unpack_windows(table, lays)
        from contract import status as S

        for t in texts:
            st = S.PartitionStatus.model_validate_json(t)
            statuses.setdefault(st.query, {})[st.partition] = st
        msgs = pub.messages(batch, wins, statuses, batch, unpack_incomplete(table))
        out += msgs
        if rng.random() < replay:
            out += msgs
        batch += 1
    return out


def arrive(msgs: list[tuple[str, bytes]], seed: int) -> list[bytes]:
    """Both feed topics merged in a random order that keeps each topic's own order (one partition each)."""
    rng = np.random.default_rng(seed)
    by_topic: dict[str, list[bytes]] = {}
    for t, v in msgs:
        by_topic.setdefault(t, []).append(v)
    lists = list(by_topic.values())
    pos = [0] * len(lists)
    out = []
    while any(p < len(x) for p, x in zip(pos, lists, strict=True)):
        k = int(rng.choice([j for j, x in enumerate(lists) if pos[j] < len(x)]))
        take = int(rng.integers(1, 6))
        out += lists[k][pos[k] : pos[k] + take]
        pos[k] += take
    return out


def run(lay, values: list[bytes], seed: int, feeds=("left", "right")) -> tuple[pd.DataFrame, JoinProcessor]:
    """The join's state group over the arrival, random micro-batches, state round-tripped through bytes."""
    rng = np.random.default_rng(seed)
    settings = Settings(10**12, HOSTS, "drop")
    proc = JoinProcessor(lay, settings, feeds)
    got = []
    i = 0
    while i < len(values):
        n = int(rng.integers(1, 12))
        d = unpack_rows(proc.process_packed({0: values[i : i + n]}, i), {lay.name: lay.rollup}).to_pandas()
        i += n
        got.append(d[d["kind"] == "final"])
        proc = JoinProcessor.from_bytes(proc.to_bytes(), lay, settings, feeds)
    g = pd.concat(got, ignore_index=True)
    g["key"] = [tuple(k) for k in g["key"]]
    return g, proc


def rows_oracle(lay, left: np.ndarray, right: np.ndarray) -> pd.DataFrame:
    """Raw output rows (window, key words, rows) from the brute-force join, column by column."""
    pairs, unmatched = join_oracle(lay, left, right)
    out = []
    src = [] if lay.type == "anti" else [(pairs, True)]
    if lay.type != "inner":
        src.append((unmatched, False))
    for a, is_pair in src:
        for r in a.tolist():
            lrow, rrow = r[: 1 + lay.lw], (r[1 + lay.lw :] if is_pair else None)
            key = []
            for side, ws in lay.group:
                if side == "matched":
                    key.append(int(is_pair))
                    continue
                row = lrow if side == "left" else rrow
                key += [0 if row is None else row[0 if w < 0 else 1 + w] for w in ws]
            out.append((int((lrow[0] - lay.rollup.origin_ns) // lay.rollup.pane_ns), tuple(key)))
    df = pd.DataFrame(out, columns=["window", "key"])
    return (
        df.groupby(["window", "key"])
        .size()
        .rename("rows")
        .reset_index()
        .sort_values(["window", "key"])
        .reset_index(drop=True)
    )


@pytest.mark.parametrize(("skew_s", "punct_s", "seed"), [(0, 1, 1), (40, 1, 2), (20, 10, 3), (40, 1000, 4)])
def test_joins_of_closed_windows_equal_the_oracle_under_disorder(cfg, traffic, skew_s, punct_s, seed) -> None:
    """inner / left / anti raw rows and an aggregated anti join over two aggregates' closed windows: exact,
    whatever the hosts' skew and punctuation, the batches, the feeds' interleaving and replayed batches."""
    left, right = (feed_oracle(q, traffic) for q in cfg.queries)
    values = arrive(feed_messages(cfg, traffic, skew_s=skew_s, punct_s=punct_s, seed=seed), seed)
    for lay in layouts(cfg):
        got, proc = run(lay, values, seed)
        assert not got.duplicated(["window", "key"]).any(), lay.name
        assert (got["hosts_expected"] == 1).all()  # one publisher: the job
        if isinstance(lay, RowsLayout):
            want = rows_oracle(lay, left, right)
            g = pd.DataFrame(
                {"window": got["window"], "key": got["key"], "rows": [s[0] for s in got["state"]]}
            )
            g = g.sort_values(["window", "key"]).reset_index(drop=True)
            pd.testing.assert_frame_equal(g, want, check_dtype=False)
        else:
            want = join_window_oracle(lay, *join_oracle(lay, left, right))
            g = pd.DataFrame(
                {
                    "window": got["window"],
                    "key": got["key"],
                    "servers": [s[0] for s in got["state"]],
                    "syns": [s[1] for s in got["state"]],
                }
            )
            pd.testing.assert_frame_equal(
                g.sort_values(["window", "key"]).reset_index(drop=True), want, check_dtype=False
            )
        assert proc.dedup.skipped > 0, "replayed feed batches are skipped"
        assert all(j.state_rows == 0 for j in proc.joins.values())
        assert len(got) >= 4


@pytest.mark.parametrize(("lost", "seed"), [("syn_dst", 5), ("synack_src", 6)])
def test_a_join_of_an_aggregate_window_that_closed_short_is_flagged_never_complete(
    cfg, traffic, lost, seed
) -> None:
    """A host's partials of one input aggregate are lost on the way (a sequence gap): the aggregate's short
    windows travel on its feed with their cause, so every join window that differs from the oracle over
    all packets is flagged (a row not complete, or listed in ``_incomplete``), and windows away from the
    gap stay exact and complete (the flags discriminate)."""
    left, right = (feed_oracle(q, traffic) for q in cfg.queries)
    msgs = feed_messages(
        cfg, traffic, skew_s=0, punct_s=1, seed=seed, replay=0.0, lose=(lost, "cap-1", 0.3, 0.5)
    )
    values = arrive(msgs, seed)
    causes = {
        c for _, v in msgs if isinstance(b := wire.decode(v), wire.Punctuation) for *_, c, _ in b.losses
    } | {"shed" for _, v in msgs if isinstance(b := wire.decode(v), wire.Punctuation) and b.shed}
    assert "gap" in causes, causes  # the feed says why its windows are short
    exact = 0
    for lay in layouts(cfg):
        rl, names = lay.rollup, ("rows",) if isinstance(lay, RowsLayout) else ("servers", "syns")
        settings = Settings(10**12, HOSTS, "drop")
        proc = JoinProcessor(lay, settings, ("left", "right"))
        fins, flagged = [], set()
        for i in range(0, len(values), 7):
            packed = proc.process_packed({0: values[i : i + 7]}, i)
            d = unpack_rows(packed, {lay.name: rl}).to_pandas()
            fins.append(d[d["kind"] == "final"])
            for _, w in unpack_incomplete(packed).get(lay.name, []):
                flagged.add(int((w[0] - rl.origin_ns) // rl.pane_ns) + rl.k - 1)
            proc = JoinProcessor.from_bytes(proc.to_bytes(), lay, settings, ("left", "right"))
        got_df = pd.concat(fins, ignore_index=True)
        got: dict[int, set] = {}
        for w, k, st in got_df[["window", "key", "state"]].itertuples(index=False):
            got.setdefault(int(w), set()).add((tuple(k), *st[: len(names)]))
        short = (
            (got_df["hosts_in_mark"] < got_df["hosts_expected"])
            | (got_df["late_partials"] > 0)
            | (got_df["missing_records"] > 0)
        )
        flagged |= set(got_df.loc[short, "window"].astype(int))
        if isinstance(lay, RowsLayout):
            want = rows_oracle(lay, left, right)
        else:
            want = join_window_oracle(lay, *join_oracle(lay, left, right))
        exp: dict[int, set] = {}
        for w, k, *vals in want[["window", "key", *names]].itertuples(index=False):
            exp.setdefault(int(w), set()).add((tuple(k), *vals))
        wins = set(exp) | set(got)
        wrong = {w for w in wins if exp.get(w, set()) != got.get(w, set())}
        assert wrong, f"{lay.name}: the lost partials were meant to make some join window short"
        assert not wrong - flagged, f"{lay.name}: windows wrong and complete: {sorted(wrong - flagged)[:5]}"
        exact += len(wins - flagged)
    assert exact, "every window flagged: the flags say nothing"


def test_counts_of_the_oracle_are_not_trivial(cfg, traffic) -> None:
    left, right = (feed_oracle(q, traffic) for q in cfg.queries)
    lays = {lay.name: lay for lay in layouts(cfg)}
    inner = rows_oracle(lays["answered"], left, right)
    anti = rows_oracle(lays["silent_servers"], left, right)
    assert len(inner) > 50 and len(anti) > 50 and (inner["rows"] == 1).all()


def test_anti_rows_only_once_both_frontiers_passed_their_window(cfg, traffic) -> None:
    """The right feed is held back: no anti row is emitted; released message by message, a window's rows
    come exactly when the right feed's mark passes the window (the left one already did)."""
    lay = {x.name: x for x in layouts(cfg)}["silent_servers"]
    msgs = feed_messages(cfg, traffic, skew_s=10, punct_s=1, seed=7, replay=0.0)
    lt, rt = JI.closed_topic(cfg.queries[0]), JI.closed_topic(cfg.queries[1])
    settings = Settings(10**12, HOSTS, "drop")
    proc = JoinProcessor(lay, settings, ("left", "right"))
    d = unpack_rows(
        proc.process_packed({0: [v for t, v in msgs if t == lt]}, 0), {lay.name: lay.rollup}
    ).to_pandas()
    assert not (d["kind"] == "final").any()
    rl = lay.rollup
    mark = None
    emitted = 0
    for _, v in [m for m in msgs if m[0] == rt]:
        b = wire.decode(v)
        if isinstance(b, wire.Punctuation):
            mark = b.mark_ns
        d = unpack_rows(proc.process_packed({0: [v]}, 0), {lay.name: lay.rollup}).to_pandas()
        fin = d[d["kind"] == "final"]
        if len(fin):
            assert mark is not None and (rl.window_end_ns(fin["window"].to_numpy()) <= mark).all()
            emitted += len(fin)
        # and no later: every window the right mark passed is out (the first open one ends past it)
        closed = proc.rollup.closed
        if mark is not None and mark < wire.END_OF_STREAM and closed is not None:
            assert rl.window_end_ns(np.array([closed]))[0] > mark
    left, right = (feed_oracle(q, traffic) for q in cfg.queries)
    assert emitted == len(rows_oracle(lay, left, right)) > 0


def test_late_corrections_are_stored_not_joined_and_counted(caplog) -> None:
    """--late-policy correction: a correction of a closed window is not published on the feed (the join's
    frontier passed it; the join keeps the final row's result), counted per query and logged once."""
    from contract import results as R
    from high_level.aggregate.packed import QueryWindows

    cfg = Q.load_text(CONFIG)
    q = cfg.query("syn_dst")
    lay = Layout.of(q)
    rank = np.array([R.ROW_KINDS.index(k) for k in ("final", "correction", "final", "correction")], np.int8)
    n = len(rank)
    w = QueryWindows(
        window=np.array([3, 2, 3, 1], np.int64),
        rank=rank,
        key=np.arange(2 * n).reshape(n, 2),
        state=np.full((n, lay.na), 5, np.int64),
        closed_at_ms=np.zeros(n, np.int64),
        hosts=np.ones(n, np.int32),
        hosts_expected=np.ones(n, np.int32),
        comp=np.zeros((n, 3), np.int64),
    )
    pub = FeedPublisher([q], producer=object())
    with caplog.at_level("WARNING", logger="lowwater.job.feed"):
        for batch in (1, 2):
            msgs = pub.messages(batch, {"syn_dst": w}, {}, 0)
    rows = [wire.decode(v) for _, v in msgs]
    assert [b.n for b in rows if isinstance(b, wire.Rows)] == [2]  # the finals only
    assert pub.corrections_not_joined == {"syn_dst": 4} and pub.published == {"syn_dst": 4}
    assert sum("do not reach the joins" in r.getMessage() for r in caplog.records) == 1


def test_feed_dedup_skips_replayed_rows_batches_only() -> None:
    rows = np.array([[5, 1, 2]])
    a = wire.encode_rows("q", JI.FEED_HOST, 0, 0, 3 << 20, rows)
    b = wire.encode_rows("q", JI.FEED_HOST, 0, 0, (3 << 20) | 1, rows)
    p = wire.encode_punctuation(wire.Punctuation("q", JI.FEED_HOST, 0, 0, 3 << 20, 5, 5, 0))
    other = wire.encode_rows("s", "cap-0", 1, 0, 0, rows)
    d = FeedDedup(["q"])
    assert d.filter([a, b, p, a, other, other, p]) == [a, b, p, other, other, p]
    assert d.filter([b]) == [] and d.skipped == 2
    assert wire.peek(a) == (wire.KIND_ROWS, "q", JI.FEED_HOST, 3 << 20)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (("right: synack_src\n    on", "right: nope\n    on"), "unknown query 'nope'"),
        (
            (
                "on: {left: [dst_ip], right: [server]}\n    within: window\n    type: inner",
                "on: {left: [syns], right: [server]}\n    within: window\n    type: inner",
            ),
            "differ in type or width",
        ),
        (
            (
                "    window: {range: 10s}\n    kafka: {partitions: 2}\n  - name: synack_src",
                "    window: {range: 20s}\n    kafka: {partitions: 2}\n  - name: synack_src",
            ),
            "different windows",
        ),
        (
            ("group_by: [dst_ip]", "group_by: [{field: dst_ip, prefix4: 24, as: dst_ip}]"),
            "differ in type or width",
        ),
        (
            (
                "aggregates: [{fn: count, as: synacks}]",
                "aggregates: [{fn: count, as: synacks}]\n    having: synacks > 2",
            ),
            "has 'having'",
        ),
        (
            (
                "aggregates: [{fn: count, as: synacks}]",
                "aggregates: [{fn: count_distinct, field: dst_ip, as: synacks}]",
            ),
            "holistic",
        ),
        (
            (
                "on: {left: [dst_ip], right: [server]}\n    within: window\n    type: inner",
                "on: {left: [dst_ip], right: [nothing]}\n    within: window\n    type: inner",
            ),
            "not a field of aggregate",
        ),
        (  # an avg is no join key ...
            (
                "aggregates: [{fn: count, as: synacks}]",
                "aggregates: [{fn: count, as: synacks}, {fn: avg, field: length, as: mean_len}]",
            ),
            None,
        ),
        (  # ... nor a value a join adds up
            (
                "{fn: sum, expr: left.syns, as: syns}",
                "{fn: sum, expr: left.mean_len, as: syns}",
            ),
            "'mean_len' is an avg of aggregate query 'syn_dst'",
        ),
    ],
)
def test_bad_joins_of_aggregates_name_file_line_and_reason(
    change: tuple[str, str], where: str | None
) -> None:
    text = CONFIG.replace(*change, 1)
    assert text != CONFIG
    if where is None:  # an avg in synack_src: a join on it fails, a join on its other fields loads
        Q.load_text(text, "x.yaml")
        text = text.replace(
            "on: {left: [dst_ip], right: [server]}\n    within: window\n    type: inner",
            "on: {left: [dst_ip], right: [mean_len]}\n    within: window\n    type: inner",
            1,
        )
        where = "'mean_len' is an avg of aggregate query 'synack_src': an average (sum / count) has no exact value"
    if "left.mean_len" in text:
        text = text.replace(
            "{fn: max, field: src_port, as: max_cport}", "{fn: avg, field: length, as: mean_len}"
        )
    with pytest.raises(Q.ConfigError) as e:
        Q.load_text(text, "x.yaml")
    assert where in str(e.value) and str(e.value).startswith("x.yaml:"), str(e.value)
    assert e.value.line is not None


def test_same_window_needs_aggregate_inputs_and_a_select_mix_needs_one_partition() -> None:
    from lowwater_testing.joins import HANDSHAKE

    text = HANDSHAKE.replace("within: 3s", "within: window", 1)
    assert Q.load_text(text, "x.yaml").joins[0].same_window  # two selects: rows of the same tumbling window
    with pytest.raises(Q.ConfigError, match="tumbling 'window"):
        Q.load_text(text.replace("range: 1m}", "range: 1m, slide: 30s}"), "x.yaml")
    mixed = (
        HANDSHAKE
        + CONFIG.split("queries:\n", 1)[1].split("  - name: answered")[0]
        + """
  - name: syn_vs_window
    kind: join
    left: syn
    right: synack_src
    on: {left: [dst_ip], right: [server]}
    within: 10s
"""
    )
    with pytest.raises(Q.ConfigError, match="Kafka partitions"):
        Q.load_text(mixed, "x.yaml")
    with pytest.raises(Q.ConfigError, match="'within: window' joins two aggregate"):
        Q.load_text(mixed.replace("within: 10s", "within: window"), "x.yaml")
    ok = Q.load_text(mixed.replace("partitions: 4}", "partitions: 1}"), "x.yaml")
    assert [q.name for q in ok.stored_queries][-1] == "syn_vs_window"


def test_raw_rows_schema_and_select_join_rows_equal_the_oracle() -> None:
    """A select x select join without aggregates stores its rows: columns of both sides and both timestamps."""
    from contract import results as R
    from lowwater_testing.joins import HANDSHAKE, rows_of

    text = HANDSHAKE.replace("partitions: 4", "partitions: 2").split("    group_by: [left.dst_port]")[0]
    cfg = Q.load_text(text, "x.yaml")
    sq = cfg.stored_queries[-1]
    names = [f.name for f in R.schema(sq)]
    sl, sr = cfg.selects
    want = (
        [f"left_{f}" for f in sl.fields]
        + ["left_timestamp"]
        + [f"right_{f}" for f in sr.fields]
        + ["right_timestamp"]
    )
    assert names[2 : 2 + len(want)] == want and names[2 + len(want)] == "rows"
    assert (
        R.schema(sq).field("left_src_ip").type == pa.string()
        and R.schema(sq).field("left_timestamp").type == pa.int64()
    )
    lay = layouts(cfg)[0]
    left, right = rows_of(cfg, 600, seed=5)
    from lowwater_testing.joins import handshake_messages

    msgs = handshake_messages(cfg, left, right, hosts=3, skew_s=30, seed=2)
    proc = JoinProcessor(lay, Settings(10**12, HOSTS, "drop"))
    got = []
    for i in range(0, len(msgs), 50):
        by_part: dict[int, list[bytes]] = {}
        for _, p, v in msgs[i : i + 50]:
            by_part.setdefault(p, []).append(v)
        d = unpack_rows(proc.process_packed(by_part, i), {lay.name: lay.rollup}).to_pandas()
        got.append(d[d["kind"] == "final"])
    g = pd.concat(got, ignore_index=True)
    g = pd.DataFrame(
        {"window": g["window"], "key": [tuple(k) for k in g["key"]], "rows": [s[0] for s in g["state"]]}
    )
    pd.testing.assert_frame_equal(
        g.sort_values(["window", "key"]).reset_index(drop=True),
        rows_oracle(lay, left, right),
        check_dtype=False,
    )


def test_closed_windows_join_through_real_kafka_and_spark(spark, kafka, topic_factory, tmp_path) -> None:
    """Partials of 3 skewed hosts in real Kafka -> the real job's aggregate stream -> its closed-window feeds
    -> the join streams -> stored raw rows and aggregated anti windows equal the oracle, served by the API."""
    from fastapi.testclient import TestClient

    from high_level.job import HighLevelJob, JobOptions
    from high_level.join.pipeline import MissingInputTopic
    from high_level.serve.api import create_app
    from lowwater_testing.spark import job_options, read_results
    from lowwater_testing.topics import produce

    t1, t2 = topic_factory(partitions=2), topic_factory(partitions=2)
    text = CONFIG.replace(
        "    kafka: {partitions: 2}\n  - name: synack_src",
        f"    kafka: {{topic: {t1}, partitions: 2}}\n  - name: synack_src",
        1,
    ).replace(
        "    kafka: {partitions: 2}\n  - name: answered",
        f"    kafka: {{topic: {t2}, partitions: 2}}\n  - name: answered",
    )
    cfg = Q.load_text(text)
    traffic = make_handshake_traffic(300, T0, 50 * NS, seed=8, answered=0.5, max_latency_ns=4 * NS)
    rows = traffic.rows()
    hix = simulate.split_hosts(len(rows), 3, seed=1)
    tagged = []
    for q in cfg.queries:
        streams = [
            simulate.host_messages(
                q, rows[hix == i], h, partitions=2, skew_ns=10 * NS * i, seed=i, end_mark=wire.END_OF_STREAM
            )
            for i, h in enumerate(HOSTS)
        ]
        tagged += [(m.t_ns, q.topic, m.partition, m.value) for m in simulate.interleave(streams, seed=2)]
    produce(kafka, [(t, p, v) for _, t, p, v in sorted(tagged, key=lambda x: x[0])])
    opts = job_options(
        kafka.bootstrap_servers,
        tmp_path,
        "t-feed",
        create_topics=True,
        expected_hosts=HOSTS,
    )
    job = HighLevelJob(spark, cfg.queries, opts, config=cfg)
    job.start()
    try:
        for _ in range(4):
            job.process_all_available()
            time.sleep(0.3)
    finally:
        job.stop()
    left, right = (feed_oracle(q, traffic) for q in cfg.queries)
    lays = {lay.name: lay for lay in layouts(cfg)}
    # raw rows of the anti join: one stored row per silent (window, server), typed columns
    got = read_results(tmp_path / "res", "silent_servers")
    want = rows_oracle(lays["silent_servers"], left, right)
    assert len(got) == len(want) > 0 and got["complete"].all() and (got["rows"] == 1).all()
    rl = lays["silent_servers"].rollup
    start_ns = ((got["window_start"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ns")).tolist()
    want_start = rl.window_start_ns(want["window"].to_numpy()).tolist()
    assert sorted(zip(start_ns, got["left_syns"].tolist(), strict=True)) == sorted(
        zip(want_start, [k[2] for k in want["key"]], strict=True)
    )
    assert start_ns == got["left_timestamp"].tolist()  # a closed row's timestamp: its window's start
    inner = read_results(tmp_path / "res", "answered")
    assert len(inner) == len(rows_oracle(lays["answered"], left, right))
    agg = read_results(tmp_path / "res", "unanswered_syns")
    w = join_window_oracle(lays["unanswered_syns"], *join_oracle(lays["unanswered_syns"], left, right))
    assert sorted(agg["syns"].tolist()) == sorted(w["syns"].tolist()) and len(w)
    (tmp_path / "c.yaml").write_text(text)
    client = TestClient(create_app(tmp_path / "c.yaml", tmp_path / "res"))
    r = client.get("/queries/silent_servers/results")
    assert r.status_code == 200 and "left_dst_ip" in r.text and "left_syns" in r.text, r.text
    assert client.get("/queries/answered/latest").status_code == 200
    # the feeds of other aggregate topics do not exist (no job created them): a clear error, nothing started
    t3, t4 = topic_factory(partitions=2), topic_factory(partitions=2)
    bad = Q.load_text(text.replace(t1, t3).replace(t2, t4))
    opts2 = JobOptions(
        bootstrap=kafka.bootstrap_servers,
        results=str(tmp_path / "res2"),
        checkpoint=str(tmp_path / "ck2"),
        name="t-feed2",
        create_topics=False,
    )
    job2 = HighLevelJob(spark, bad.queries, opts2, config=bad)
    with pytest.raises(MissingInputTopic, match="closed-window feed of an aggregate query"):
        job2.start()
    job2.stop()
    assert not job2.streams and not list((tmp_path / "res2").glob("query=*"))
