"""The capture host's backlog, all or nothing: when it overflows it sheds whole (query, pane) units, tells
the high level in its next punctuation (wire kind PUNCT_SHED), and every affected window ends flagged
incomplete in the results and the API, never silently short."""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient

from contract import query as Q
from contract import results as R
from contract import wire
from high_level.aggregate.chunks import MemoryChunks
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.results.store import ResultStore
from high_level.serve.api import create_app
from low_level.host.backlog import Backlog, Block
from lowwater_testing.capture import drain, feed, kafka_agent, pairs_query
from lowwater_testing.queries import config, query
from lowwater_testing.traffic import NS, T0, make_traffic, oracle

OPS = {"a": np.array([Q.MERGE_SUM]), "b": np.array([Q.MERGE_SUM])}


def _v1_frame(kind: int, p: wire.Punctuation, tail: bytes = b"") -> bytes:
    """A version-1 punctuation as an older agent sent it (kind 2 or 6, stats slot 8 'reserved')."""
    import struct
    import zlib

    stats = [int(p.stats.get(k, 0)) for k in wire.PUNCT_STATS]
    body = struct.pack("<qqq8q", p.mark_pane, p.mark_ns, p.sent_wall_ns, *stats) + tail
    msg = b"".join(
        (
            struct.pack("<2sBB", b"LW", 1, kind),
            struct.pack("<H", 1),
            b"q",
            struct.pack("<H", 1),
            b"h",
            struct.pack("<qIq", p.incarnation, p.partition, p.seq),
            body,
        )
    )
    return msg + struct.pack("<I", zlib.crc32(msg))


def test_punctuation_carries_shed_pane_ranges_and_plain_ones_are_unchanged():
    import struct
    import zlib

    p = wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, {"packets": 3}, ((3, 4, 10), (6, 6, 2)))
    got = wire.decode(wire.encode_punctuation(p))
    assert got.shed == ((3, 4, 10), (6, 6, 2)) and got.mark_pane == 10 and got.stats["packets"] == 3
    plain = wire.encode_punctuation(wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, {}))
    assert plain[2] == wire.VERSION == 3 and plain[3] == wire.KIND_PUNCT and wire.decode(plain).shed == ()
    shed = wire.encode_punctuation(p)
    assert shed[3] == wire.KIND_PUNCT_LOSS  # version 2: shed panes are one cause of loss
    # what a version-1 agent sent still decodes: a plain punctuation and one with shed panes (kind 6)
    old_tail = struct.pack("<I", 2) + np.array([[3, 4, 10], [6, 6, 2]], "<i8").tobytes()
    full = dict.fromkeys(wire.PUNCT_STATS, 0) | {"packets": 3}
    assert wire.decode(_v1_frame(wire.KIND_PUNCT_SHED, p, old_tail)) == replace(p, stats=full)
    assert wire.decode(_v1_frame(wire.KIND_PUNCT, p)).shed == ()
    with pytest.raises(wire.WireError, match="first <= last"):
        wire.encode_punctuation(wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, {}, ((5, 4, 1),)))
    # a count that does not match the bytes, a reversed range or an unknown cause is refused (CRC recomputed)
    body = shed[:-4]
    n_at = len(body) - 2 * 32 - 4
    for bad in (
        body[:n_at] + struct.pack("<I", 3) + body[n_at + 4 :],
        body[: n_at + 4] + struct.pack("<qqqq", 9, 8, 0, 1) + body[n_at + 36 :],
        body[: n_at + 4] + struct.pack("<qqqq", 1, 8, 99, 1) + body[n_at + 36 :],
    ):
        with pytest.raises(wire.WireError, match="loss ranges"):
            wire.decode(bad + struct.pack("<I", zlib.crc32(bad)))


def test_punctuation_carries_losses_of_every_cause_and_the_worker_count():
    losses = ((3, 9, "socket", 512), (3, 9, "ring", 7), (1, 2, "late", 4), (3, 9, "malformed", 2))
    p = wire.Punctuation("q", "h/w1", 1, 0, 5, 10, 100, 7, {"workers": 2}, ((4, 4, 1),), losses)
    got = wire.decode(wire.encode_punctuation(p))
    assert (
        got == replace(p, stats=dict.fromkeys(wire.PUNCT_STATS, 0) | {"workers": 2})
        and got.stats["workers"] == 2
    )
    with pytest.raises(wire.WireError, match="unknown loss cause"):
        wire.encode_punctuation(
            wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, {}, (), ((1, 2, "cosmic", 1),))
        )


def _fill(b: Backlog) -> None:
    rng = np.random.default_rng(0)
    for part in (0, 1):
        for p in range(5):
            b.add_partials(
                "a", part, Block(np.full(6, p), rng.integers(0, 100, (6, 1)), np.ones((6, 1), np.int64))
            )
            b.add_partials(
                "b",
                part,
                Block(np.full(6, p * 10 + 5), rng.integers(0, 100, (6, 1)), np.ones((6, 1), np.int64)),
            )


def test_every_punctuation_states_the_newest_pane_sent_before_it():
    """``sent_upto`` is a running max of the panes the emitter handed to Kafka (or shed) per partition:
    the bound of a sequence gap the job finds at that punctuation, however far the panes led the mark."""
    from low_level.host.emit import Emitter
    from lowwater_testing.capture import RecordingProducer

    q = pairs_query("t-upto", partitions=1)
    lay, prod = Layout.of(q), RecordingProducer()
    em = Emitter([q], "h", None, producer=prod)

    def submit(panes: list[int]) -> None:
        n = len(panes)
        em.submit(q.name, np.array(panes), np.ones((n, lay.kw), np.int64), np.ones((n, lay.na), np.int64))

    em.punctuate(q.name, 3, 0, {})  # nothing sent yet: not said
    submit([5, 40, 6])  # an open pane evicted early leads the mark by far
    em.punctuate(q.name, 7, 0, {})
    submit([8])
    em.punctuate(q.name, 9, 0, {})
    em.pump()
    puncts = [b for b in (wire.decode(v) for _, _, v in prod.sent) if isinstance(b, wire.Punctuation)]
    assert [p.sent_upto for p in puncts] == [None, 40, 40]


def test_backlog_sheds_whole_query_panes_oldest_start_first_in_every_partition():
    # query a: 10-ns panes; query b: 1-ns panes numbered 5, 15, ...: b's pane 5 starts at 5, a's pane 1 at 10
    b = Backlog(OPS, merge_at=10, max_records=20, pane_time={"a": (0, 10), "b": (0, 1)})
    held = {}
    _fill(b)
    for (q, part), fifo in b.fifos.items():
        for x in fifo:
            if isinstance(x, Block):
                held.setdefault((q, part), set()).update(x.pane.tolist())
    assert b.records <= 20 and b.lost > 0 and b.shed_panes > 0
    ranges = {(q, p): b.take_shed(q, p) for q in "ab" for p in (0, 1)}
    shed_units = {
        (q, pane) for (q, _), rs in ranges.items() for lo, hi, _ in rs for pane in range(lo, hi + 1)
    }
    kept_units = {(q, pane) for (q, _), ps in held.items() for pane in ps}
    assert not shed_units & kept_units  # whole units: nothing of a shed pane is left in any partition
    start = {("a", p): p * 10 for p in range(5)} | {("b", p * 10 + 5): p * 10 + 5 for p in range(5)}
    assert max(start[u] for u in shed_units) <= min(start[u] for u in kept_units)  # the oldest went first
    assert sum(r[2] for rs in ranges.values() for r in rs) == b.lost  # every shed record is reported
    assert all(b.take_shed(q, p) == () for q in "ab" for p in (0, 1))  # reported once
    b.give_back_shed("a", 0, ((1, 2, 7),))
    assert b.take_shed("a", 0) == ((1, 2, 7),)


def test_shed_panes_make_exactly_their_windows_incomplete():
    q = pairs_query("t", partitions=1)
    lay = Layout.of(q)
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=("h0", "h1")))
    p0 = 1000
    msgs = []
    for h in ("h0", "h1"):
        msgs.append(
            wire.encode_partials(
                q.name,
                h,
                1,
                0,
                0,
                np.array([p0, p0 + 1, p0 + 2]),
                np.array([[0, 1, 0, 2]] * 3),
                np.array([[1, 60, 60]] * 3),
            )
        )
    msgs.append(wire.encode_punctuation(wire.Punctuation(q.name, "h0", 1, 0, 3, p0 + 3, 0, 0, {})))
    msgs.append(
        wire.encode_punctuation(
            # seq counts the 4 shed records as sent: reported once, at their pane, not again as a gap
            wire.Punctuation(q.name, "h1", 1, 0, 7, p0 + 3, 0, 0, {}, ((p0 + 1, p0 + 1, 4),))
        )
    )
    df = proc.process(msgs, 1000)
    fin = df[df["kind"] == "final"].set_index("window")
    assert fin.loc[p0 + 1, "missing_records"] == 4
    assert fin.loc[p0, "missing_records"] == 0 and fin.loc[p0 + 2, "missing_records"] == 0
    st = [s for s in df["status"] if isinstance(s, str)]
    assert st and proc.queries[q.name].hosts["h1"]["shed"] == 4


AGGREGATES = ["count as n", "sum(length) as bytes", "max(length) as mx"]  # pairs_query's


def _yaml(q: Q.QuerySpec) -> str:
    return config(
        query(
            q.name,
            group_by=["src_ip", "dst_ip"],
            aggregates=AGGREGATES,
            window="1s",
            table=256,
            flush={"policy": "lazy", "m": 2},
            topic=q.topic,
            partitions=q.kafka.partitions,
        )
    ).text


@pytest.mark.timeout(300)
def test_outage_overflowing_a_small_backlog_ends_as_flagged_windows(kafka, topic_factory, tmp_path) -> None:
    q = pairs_query(topic_factory(partitions=2))
    traffic = make_traffic(60_000, 500, T0, 8 * NS, seed=23)  # 8 one-second panes x 500 groups
    agent = kafka_agent(q, "h-shed", kafka.bootstrap_servers, merge_at=600, max_records=1200)
    feed(agent, traffic, 0, 5_000)
    assert agent.emitter.flush(30)
    kafka.stop()
    try:
        for s in range(5_000, 50_000, 5000):  # capture goes on; the small backlog overflows
            feed(agent, traffic, s, s + 5000)
        assert agent.emitter.backlog.shed_panes > 0 and agent.emitter.backlog.lost > 0
        assert agent.emitter.backlog.records <= 1200 + 5000
    finally:
        kafka.start()
    feed(agent, traffic, 50_000, 60_000)
    drain(agent)
    lost = agent.emitter.backlog.lost
    # the high level, as the Spark step runs it, over what really reached Kafka (offset order per partition)
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False, consumer_timeout_ms=5000
    )
    tps = [TopicPartition(q.topic, p) for p in range(q.kafka.partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    values: dict[int, list[bytes]] = {0: [], 1: []}
    reported = 0
    shed_panes: set[int] = set()
    for m in c:
        values[m.partition].append(m.value)
        b = wire.decode(m.value)
        if isinstance(b, wire.Punctuation):
            reported += sum(r[2] for r in b.shed)
            shed_panes |= {p for lo, hi, _ in b.shed for p in range(lo, hi + 1)}
    c.close()
    assert reported == lost  # every shed record was reported in a punctuation
    lay = Layout.of(q)
    settings = Settings(host_timeout_ms=10**9, expected_hosts=("h-shed",))
    frames = [
        PartitionProcessor([lay], p, settings).process(values[p], int(time.time() * 1000)) for p in (0, 1)
    ]
    df = pd.concat(frames, ignore_index=True)
    fin = df[df["kind"] == "final"]
    exp = oracle(q, traffic)  # per (pane, key): tumbling 1 s windows, a pane is a window
    kcols = [f"k{i}" for i in range(Q.key_width(q))]
    exp_map = {
        (int(p), *map(int, k)): int(n)
        for p, k, n in zip(exp["pane"], exp[kcols].to_numpy(), exp["s0"], strict=True)
    }
    got = {
        (int(w), *map(int, k)): (int(s[0]), int(x))
        for w, k, s, x in zip(fin["window"], fin["key"], fin["state"], fin["missing_records"], strict=True)
    }
    short = {k for k, v in exp_map.items() if got.get(k, (0, 0))[0] != v}
    assert short, "the outage was meant to shed records"
    flagged_rows = {k[0] for k, (_, x) in got.items() if x > 0}
    all_shed = {k[0] for k in exp_map} - {k[0] for k in got}  # windows with traffic and not one row left
    assert all_shed, "the outage was meant to shed every record of some window"
    assert flagged_rows, "windows with rows left were meant to be flagged too"
    # ... and a window with nothing shed is exact and complete
    for k, (n, x) in got.items():
        if k[0] not in flagged_rows:
            assert x == 0 and n == exp_map[k]
    # the results store and the API say so: complete=false rows are exactly the flagged windows with rows, and
    # every short window, with rows or none, is a flagged window in /incomplete and incomplete in /series
    root = tmp_path / "results"
    cfg = tmp_path / "q.yaml"
    cfg.write_text(_yaml(q))
    qq = Q.load(cfg).queries[0]
    ResultStore(root, [qq]).write_batch(0, df[df["kind"] != "status"].reset_index(drop=True))
    with TestClient(create_app(cfg, root)) as api:
        span = {"start": str(T0 // NS - 60), "end": str(T0 // NS + 60)}
        bad = api.get(
            f"/queries/{q.name}/results", params={**span, "complete": "false", "limit": 10000}
        ).json()["rows"]
        good = api.get(
            f"/queries/{q.name}/results", params={**span, "complete": "true", "limit": 10000}
        ).json()["rows"]
        listed = api.get(f"/queries/{q.name}/incomplete", params=span).json()["windows"]
        series = api.get(f"/queries/{q.name}/series", params=span).json()["rows"]
    starts = {r["window_start"] for r in bad}
    assert bad and good and all(r["missing_records"] > 0 and not r["complete"] for r in bad)
    assert len(starts) == len(flagged_rows)
    assert not starts & {r["window_start"] for r in good}
    pane_of = {
        **{r["window_start"]: pd.Timestamp(r["window_start"]).value // NS for r in listed},
        **{r["window_start"]: pd.Timestamp(r["window_start"]).value // NS for r in series},
    }
    flagged = {pane_of[w["window_start"]] for w in listed if w["incomplete"] and w["shed_records"] > 0}
    assert {k[0] for k in short} <= flagged  # never silently short, rows or not
    assert all_shed <= flagged and flagged <= shed_panes  # flagged: exactly windows of shed panes (tumbling)
    assert all(set(w["hosts"]) == {"h-shed"} for w in listed)
    empty = {pane_of[r["window_start"]]: r for r in series if r["groups"] == 0}
    assert set(empty) == all_shed and all(
        r["flagged"] and not r["complete"] and r["shed_records"] > 0 for r in empty.values()
    )


def _q(window: str) -> tuple[Q.QuerySpec, str]:
    doc = config(
        query(
            "pairs",
            group_by=["src_ip", "dst_ip"],
            aggregates=AGGREGATES,
            window=yaml.safe_load(window),
            topic="t-flag",
            partitions=1,
        )
    )
    return doc.load().queries[0], doc.text


@pytest.mark.parametrize("state", ["blob", "chunked"])
@pytest.mark.parametrize("window", ["{range: 1s}", "{range: 3s, slide: 1s}"])
def test_windows_whose_every_record_was_shed_are_flagged_exactly_once_across_restart(
    tmp_path, window, state
) -> None:
    q, text = _q(window)
    lay = Layout.of(q)
    p0 = T0 // NS  # 1-s panes from the epoch: pane numbers are seconds
    settings = Settings(host_timeout_ms=10**9, expected_hosts=("h0", "h1"))

    def partials(host: str, panes: list[int]) -> bytes:
        return wire.encode_partials(
            q.name,
            host,
            1,
            0,
            0,
            np.array(panes),
            np.array([[0, 1, 0, 2]] * len(panes)),
            np.array([[1, 60, 60]] * len(panes)),
        )

    def punct(host: str, seq: int, mark: int, shed: tuple = ()) -> bytes:
        return wire.encode_punctuation(wire.Punctuation(q.name, host, 1, 0, seq, mark, 0, 0, {}, shed))

    # panes p0+1 and p0+2: h0 saw nothing there, h1's backlog shed all it had (10 records): no row at all
    b1 = [
        partials("h0", [p0, p0 + 3]),
        partials("h1", [p0, p0 + 3]),
        punct("h0", 2, p0 + 2),
        punct("h1", 12, p0 + 2, ((p0 + 1, p0 + 2, 10),)),
    ]
    b2 = [punct("h0", 2, p0 + 6), punct("h1", 12, p0 + 6)]
    # a shed range reported after its windows closed (the host's punctuation carrying it came late)
    b3 = [punct("h0", 2, p0 + 7), punct("h1", 15, p0 + 7, ((p0 + 4, p0 + 4, 3),))]
    root = tmp_path / "results"
    store = ResultStore(root, [q])
    chunks = MemoryChunks() if state == "chunked" else None  # the chunked state's store (RocksDB in Spark)
    proc = PartitionProcessor([lay], 0, settings, chunks)
    outs = [proc.process(b1, 1_000)]
    store.write_batch(1, outs[0])
    saved, saved_chunks = proc.to_bytes(), copy.deepcopy(chunks)  # Spark restores the store's version too
    for replay in (False, True):  # a restart from the state after batch 1, then a replay of batches 2 and 3
        proc = PartitionProcessor.from_bytes(saved, [lay], settings, copy.deepcopy(saved_chunks))
        got = [proc.process(b2, 2_000), proc.process(b3, 3_000)]
        for i, df in enumerate(got):
            store.write_batch(2 + i, df)
        if replay:
            assert all(a.equals(b) for a, b in zip(got, outs[1:], strict=True))  # the same, byte for byte
        outs += got
    # the oracle: a window is short where one of its panes was shed; it is flagged once the frontier passes it
    closed = p0 + 7
    panes = {
        w: set(range(w - lay.k + 1, w + 1)) for w in range(p0 - 5, closed) if (w - lay.k + 1) % lay.s == 0
    }
    ranges = ((p0 + 1, p0 + 2, 10), (p0 + 4, p0 + 4, 3))
    want = {
        (w, "h1", "shed", n, w < p0 + 6 and lo == p0 + 4)
        for lo, hi, n in ranges
        for w, ps in panes.items()
        if ps & set(range(lo, hi + 1))
    }
    flagged = pd.read_parquet(R.incomplete_dir(root, q.name))
    assert len(flagged) == len(want)  # exactly once, across the restart and the replay
    ws = flagged["window_start"].astype("int64").to_numpy() * 1000 // lay.pane_ns  # us -> pane (window start)
    got = {
        (int(s) + lay.k - 1, h, c, int(n), bool(a))
        for s, h, c, n, a in zip(
            ws, flagged["host"], flagged["cause"], flagged["records"], flagged["after_close"], strict=True
        )
    }
    assert got == want
    rows = pd.concat(outs[:3])
    with_rows = set(rows.loc[rows["kind"] == "final", "window"].astype(int))
    empty = {w for w, *_ in want} - with_rows
    assert empty and (lay.k > 1 or {p0 + 1, p0 + 2} <= empty)  # no row left, flagged all the same
    # the API: /incomplete lists every flagged window, /series shows the empty ones, incomplete
    cfg = tmp_path / "q.yaml"
    cfg.write_text(text)
    with TestClient(create_app(cfg, root)) as api:
        span = {"start": str(p0 - 60), "end": str(p0 + 60)}
        listed = api.get(f"/queries/{q.name}/incomplete", params=span).json()["windows"]
        series = api.get(f"/queries/{q.name}/series", params=span).json()
        bad = api.get(f"/queries/{q.name}/series", params={**span, "complete": "false"}).json()["rows"]
        good = api.get(f"/queries/{q.name}/series", params={**span, "complete": "true"}).json()["rows"]
        assert api.get(f"/queries/{q.name}/incomplete", params={"start": "x"}).status_code == 400
        assert api.get("/queries/nope/incomplete").status_code == 404

    def wid(iso: str) -> int:  # window start text -> window id (its last pane)
        return pd.Timestamp(iso).value // lay.pane_ns + lay.k - 1

    starts = {wid(w["window_start"]) for w in listed}
    assert starts == {w for w, *_ in want} and all(w["incomplete"] and w["hosts"] == ["h1"] for w in listed)
    for w in listed:
        assert w["shed_records"] == sum(n for x, _, _, n, _ in want if x == wid(w["window_start"]))
    srows = {wid(r["window_start"]): r for r in series["rows"]}
    assert series["columns"][-3:] == ["shed_records", "flagged", "loss_causes"]
    for w in empty:
        assert (
            srows[w]["loss_causes"].startswith("h1 shed")  # which host, which cause, how many (the tooltip)
            and srows[w]["groups"] == 0
            and srows[w]["n"] is None
            and srows[w]["flagged"]
            and not srows[w]["complete"]
        )
    assert {w for w, r in srows.items() if r["flagged"]} == starts
    assert {wid(r["window_start"]) for r in bad} == starts
    assert good and not starts & {wid(r["window_start"]) for r in good}  # nothing shed: complete
