"""Pure unit tests of the high level (no Spark, no Kafka): meld, roll-up, partition processor, store."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contract import query as Q
from contract import results as R
from contract import status as S
from contract import wire
from high_level import codec
from high_level.aggregate.chunks import ChunkedRollup, MemoryChunks
from high_level.aggregate.meld import Meld
from high_level.aggregate.packed import QueryWindows
from high_level.aggregate.processor import STATE_ZMAGIC, PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout, QueryRollup, assemble, expand_windows, group_reduce
from high_level.results.store import ResultStore, ip_strings, typed_table
from lowwater_testing.hosts import CONFIG, emulated_messages, final_rows, run_offline
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import spec
from lowwater_testing.traffic import make_traffic, merge_partials, oracle

T0 = 1_700_000_000_000_000_000
HOSTS = ("h0", "h1", "h2")


@pytest.fixture(scope="module")
def cfg() -> Q.Config:
    return Q.load_text(CONFIG)


ROLLUPS = {"blob": QueryRollup, "chunked": lambda lay: ChunkedRollup(lay, MemoryChunks())}


@pytest.fixture(scope="module")
def traffic():
    return make_traffic(12000, 200, T0, 120 * 10**9, seed=11)


# -- meld -----------------------------------------------------------------------------------------
def test_meld_min_over_live_hosts_and_timeout():
    m = Meld(host_timeout_ms=5000)
    assert m.low_water_mark() is None
    m.advance(0)
    m.observe("a", 1, 10, 0, 0, 0)
    m.observe("b", 1, 7, 0, 0, 0)
    assert m.low_water_mark() == 7 and m.blocking_hosts() == ["b"]
    for t in range(1000, 5001, 1000):  # b silent for exactly the timeout: still live
        m.advance(t)
        m.observe("a", 1, 10 + t // 1000, 0, 0, t)
    assert m.is_live("b") and m.low_water_mark() == 7
    m.advance(6000)
    m.observe("a", 1, 20, 0, 0, 6000)
    assert not m.is_live("b") and m.low_water_mark() == 20  # dead host leaves the min
    m.advance(7000)
    m.observe("b", 1, 9, 0, 0, 7000)  # re-admitted by punctuating again
    assert m.is_live("b") and m.low_water_mark() == 9


def test_meld_expected_hosts_block_until_heard():
    m = Meld(host_timeout_ms=1000, expected_hosts=["a", "b"])
    m.advance(0)
    m.observe("a", 1, 5, 0, 0, 0)
    assert m.low_water_mark() is None and m.waiting_for() == ["b"] and m.blocking_hosts() == ["b"]
    m.observe("b", 1, 3, 0, 0, 0)
    assert m.low_water_mark() == 3
    # an expected host that was heard once may still time out
    for t in range(100, 1101, 100):
        m.advance(t)
        m.observe("a", 1, 7, 0, 0, t)
    assert not m.is_live("b") and m.low_water_mark() == 7


def test_meld_downtime_is_not_silence():
    """A job that was down for an hour must not declare every host dead on restart."""
    m = Meld(host_timeout_ms=10_000)
    m.advance(0)
    m.observe("a", 1, 5, 0, 0, 0)
    m.advance(3_600_000)
    assert m.is_live("a")
    for t in range(3_601_000, 3_606_000, 1000):  # silence accrues normally again
        m.advance(t)
    assert m.is_live("a")
    m.advance(3_606_000)
    assert not m.is_live("a")
    m2 = Meld(10_000)
    m2.load_dict(json.loads(json.dumps(m.to_dict())))
    assert m2.hosts == m.hosts and m2.clock_ms == m.clock_ms


# -- roll-up --------------------------------------------------------------------------------------
def test_group_reduce_matches_pandas_and_survives_hash_collisions(monkeypatch):
    rng = np.random.default_rng(1)
    keys = rng.integers(-3, 3, (5000, 3))
    state = rng.integers(-(10**12), 10**12, (5000, 3))
    ops = (Q.MERGE_SUM, Q.MERGE_MIN, Q.MERGE_MAX)
    df = pd.DataFrame(np.column_stack([keys, state]), columns=["a", "b", "c", "s", "mn", "mx"])
    exp = df.groupby(["a", "b", "c"], as_index=False).agg(s=("s", "sum"), mn=("mn", "min"), mx=("mx", "max"))
    for _ in range(2):
        k, s = group_reduce(keys, state, ops)
        got = pd.DataFrame(np.column_stack([k, s]), columns=exp.columns).sort_values(["a", "b", "c"])
        assert got.reset_index(drop=True).equals(exp.astype(np.int64))
        # every key hashes alike: the exact fallback must still give the right answer
        monkeypatch.setattr(wire, "key_hash", lambda x: np.zeros(len(x), np.uint64))


def test_expand_windows_wid_ranges():
    # pane p belongs to windows p..p+k-1, clipped to [lo, hi)
    idx, w = expand_windows(np.array([0, 5, -2]), lo=1, hi=7, k=3)
    pairs = sorted(zip(idx.tolist(), w.tolist(), strict=True))
    assert pairs == [(0, 1), (0, 2), (1, 5), (1, 6)]


@pytest.mark.parametrize("name", ["pairs", "ports9x3", "nets"])
@pytest.mark.parametrize("state", ROLLUPS)
def test_rollup_chunks_equal_oracle_and_close_once(cfg, traffic, name, state):
    q = cfg.query(name)
    po = oracle(q, traffic)
    kw = Q.key_width(q)
    pane = po["pane"].to_numpy()
    key = po[[f"k{i}" for i in range(kw)]].to_numpy()
    st = po[[c for c in po.columns if c.startswith("s")]].to_numpy()
    # split every (pane, key) into random pieces (sum pieces add up; min/max pieces bound)
    rng = np.random.default_rng(3)
    r = ROLLUPS[state](Layout.of(q))
    rep = rng.integers(1, 4, len(pane))
    idx = np.repeat(np.arange(len(pane)), rep)
    perm = rng.permutation(len(idx))
    ps, ks, ss = pane[idx][perm], key[idx][perm], st[idx][perm].copy()
    for j, c in enumerate(Q.state_columns(q)):
        if c.merge == Q.MERGE_SUM:  # the first piece of each row carries the whole sum
            first = np.zeros(len(idx), bool)
            first[np.unique(idx[perm], return_index=True)[1]] = True
            ss[~first, j] = 0
    assert merge_partials(q, ps, ks, ss).equals(po)
    for chunk in np.array_split(np.arange(len(ps)), 40):  # enough batches for size-tiered merges
        r.add(ps[chunk], ks[chunk], ss[chunk])
        if state == "chunked":  # the store holds exactly the chunks the index lists (merged ones removed)
            assert set(r.store.data) == {(q.name, p, i) for p, v in r.index.items() for i in range(len(v))}
    # the blob table is unique per (pane, key); the chunks hold each batch's rows until a close reads them
    assert len(r) == len(po) if state == "blob" else len(po) <= len(r) <= len(ps)
    # close in several steps: the union equals the one-shot window oracle, nothing twice
    wo = window_oracle(q, po)
    out = []
    for lwm in np.linspace(pane.min(), pane.max() + q.window.panes_per_window + 1, 9).astype(np.int64):
        got = r.close(int(lwm))
        assert (got.window < lwm).all()
        out.append(got)
        assert (r.panes() >= lwm - q.window.panes_per_window + 1).all()  # purged what no open window needs
    assert r.close(int(lwm)).window.size == 0
    w = np.concatenate([o.window for o in out])
    k = np.concatenate([o.key for o in out])
    s = np.concatenate([o.state for o in out])
    got = pd.DataFrame(
        {
            "window": w,
            **{f"k{i}": k[:, i] for i in range(kw)},
            **{f"s{j}": s[:, j] for j in range(s.shape[1])},
        }
    )
    got = got.sort_values(["window", *[f"k{i}" for i in range(kw)]]).reset_index(drop=True)
    assert got.equals(wo)
    assert len(r) == 0
    if state == "chunked":
        assert r.store.data == {}  # every chunk deleted once no open window needs its pane


@pytest.mark.parametrize("shape", ["equal", "growing", "shrinking", "heavy_tail", "saturated"])
def test_chunk_merge_rule_keeps_few_chunks_and_rewrites_little(shape):
    """The size-tiered rule of high_level/aggregate/chunks.py over 2,000 batches: a pane holds O(F log N) chunks and a
    row is rewritten O(log_F N) times, whatever the batch sizes; 'saturated' dedups like a pane whose
    batches bring groups it already holds (merged size capped at the pane's 50K distinct groups)."""
    from high_level.aggregate.chunks import FANOUT, merge_run

    rng = np.random.default_rng(7)
    batches = {
        "equal": np.full(2000, 1000),
        "growing": np.arange(1, 2001) * 10,
        "shrinking": np.arange(2000, 0, -1) * 10,
        "heavy_tail": (rng.pareto(1.2, 2000) * 100 + 1).astype(int),
        "saturated": np.full(2000, 20_000),
    }[shape]
    cap = 50_000 if shape == "saturated" else None
    sizes: list[int] = []
    written = most = merges = 0
    for b in batches.tolist():
        sizes.append(b)
        written += b
        while run := merge_run(sizes):
            merged = sum(sizes[-run:]) if cap is None else min(cap, sum(sizes[-run:]))
            del sizes[-run:]
            sizes.append(merged)
            written += merged
            merges += 1
        most = max(most, len(sizes))
        assert merge_run(sizes) == 0 and all(n > 0 for n in sizes)
    total = int(batches.sum())
    levels = np.log(total) / np.log(FANOUT) + 2
    assert merges > 0 and most <= FANOUT * levels, (most, levels)
    assert written <= total * levels, (written / total, levels)


def test_sliding_range9_slide3_by_hand():
    q = Q.load_text(CONFIG).query("ports9x3")
    lay = Layout.of(q)
    assert lay.k == 3 and lay.pane_ns == 3 * 10**9
    pane = np.array([10, 11, 12, 13])
    key = np.array([[80], [80], [80], [443]])
    state = np.array([[1, 50], [2, 40], [4, 60], [8, 7]])
    w = assemble(pane, key, state, 10, 16, 3, lay.ops)
    got = {(int(a), int(b[0])): tuple(c) for a, b, c in zip(w.window, w.key, w.state, strict=True)}
    assert got == {
        (10, 80): (1, 50),
        (11, 80): (3, 40),
        (12, 80): (7, 40),
        (13, 80): (6, 40),
        (14, 80): (4, 60),
        (13, 443): (8, 7),
        (14, 443): (8, 7),
        (15, 443): (8, 7),
    }
    assert lay.window_end_ns(np.array([12]))[0] - lay.window_start_ns(np.array([12]))[0] == 9 * 10**9


@pytest.mark.parametrize("state", ROLLUPS)
def test_late_partials_counted_dropped_or_corrected(state):
    q = Q.load_text(CONFIG).query("ports9x3")
    r = ROLLUPS[state](Layout.of(q))
    r.add(np.array([10, 11]), np.array([[80], [80]]), np.array([[1, 9], [1, 9]]))
    assert len(r.close(12)) == 2  # windows 10, 11
    # pane 8 only feeds closed windows (8..10): late. pane 11 feeds 11 (closed) and 12, 13 (open): late too,
    # but its contribution to the open windows is kept.
    res = r.add(
        np.array([8, 11, 12]),
        np.array([[80], [80], [80]]),
        np.array([[5, 1], [7, 3], [1, 9]]),
        host_idx=np.array([0, 1, 1]),
        n_hosts=2,
    )
    assert res.late_per_host.tolist() == [1, 1]
    corr = {int(w): tuple(s) for w, s in zip(res.corrections.window, res.corrections.state, strict=True)}
    assert corr == {8: (5, 1), 9: (5, 1), 10: (5, 1), 11: (7, 3)}
    assert dict(zip(res.corrections.window.tolist(), res.late_records.tolist(), strict=True)) == {
        8: 1,
        9: 1,
        10: 1,
        11: 1,
    }
    final = r.close(100)
    got = {int(w): tuple(s) for w, s in zip(final.window, final.state, strict=True)}
    assert got == {12: (1 + 1 + 7 + 1, 3), 13: (1 + 7 + 1, 3), 14: (1, 9)}


@pytest.mark.parametrize("state", ROLLUPS)
def test_end_of_stream_closes_data_windows_and_leaves_later_windows_open(state):
    """A finished capture (end-of-stream mark) closes every window with data, and no more: the next run
    of the same hosts (later windows) must not find its data late."""
    q = Q.load_text(CONFIG).query("ports9x3")
    r = ROLLUPS[state](Layout.of(q))
    r.add(np.array([10, 11]), np.array([[80], [80]]), np.array([[1, 9], [1, 9]]))
    got = r.close(wire.END_OF_STREAM)
    assert sorted(int(w) for w in got.window) == [10, 11, 12, 13]  # every window that pane 10 or 11 feeds
    assert r.closed == 14 and r.open_windows() == 0
    res = r.add(np.array([20]), np.array([[443]]), np.array([[2, 5]]), host_idx=np.array([0]), n_hosts=1)
    assert res.late_per_host.tolist() == [0]
    assert [int(w) for w in r.close(21).window] == [20]
    assert len(r.close(wire.END_OF_STREAM)) == 2  # windows 21, 22 (pane 20 feeds 20..22)
    empty = ROLLUPS[state](Layout.of(q))
    assert len(empty.close(wire.END_OF_STREAM)) == 0 and empty.closed is None  # nothing to close, no frontier


# -- partition processor (the Spark step, offline) -----------------------------------------------


@pytest.mark.parametrize("state", ["blob", "chunked"])
@pytest.mark.parametrize("name", ["pairs", "ports9x3", "nets"])
def test_processor_exact_under_skew_order_partitions_and_density(cfg, traffic, name, state):
    q = cfg.query(name)
    exp = window_oracle(q, oracle(q, traffic))
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS)
    for partitions, punct, seed in ((1, 1, 0), (2, 1, 1), (4, 10, 2), (2, 1000, 3)):
        msgs = emulated_messages(q, traffic, partitions, punct_every_s=punct, seed=seed)
        df = run_offline([q], msgs, partitions, settings, chunked=state == "chunked")
        assert final_rows(df, q).equals(exp), (partitions, punct)
        st = [json.loads(s) for s in df[df["kind"] == "status"]["status"]]
        last = {s["partition"]: s for s in st}
        assert all(
            h["late_partials"] == 0 and h["missing_records"] == 0
            for s in last.values()
            for h in s["hosts"].values()
        )
        assert all(s["state_rows"] == 0 and s["open_windows"] == 0 for s in last.values())
        fin = df[df["kind"] == "final"]  # the normal case: every row complete, nothing late
        assert (fin["hosts_expected"] == 3).all() and (fin["hosts_in_mark"] == 3).all()
        assert (fin["late_partials"] == 0).all() and (fin["missing_records"] == 0).all()
        assert not (df["kind"] == "late").any()


def test_processor_never_closes_early(cfg, traffic):
    """Each final window is emitted only when every host's latest mark (as of that batch) exceeds it."""
    q = cfg.query("ports9x3")
    msgs = emulated_messages(q, traffic, 1)
    lay = Layout.of(q)
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=HOSTS))
    marks: dict[str, int] = {}
    for i, m in enumerate(msgs):
        out = proc.process([m.value], 1000 + i)
        if m.is_punctuation:
            marks[m.host] = m.mark_pane
        fin = out[out["kind"] == "final"]
        if len(fin):
            assert set(marks) == set(HOSTS)
            assert fin["window"].max() < min(marks.values())


def test_processor_staggered_start_without_expected_hosts_counts_late(cfg, traffic):
    q = cfg.query("pairs")
    msgs = emulated_messages(q, traffic, 2)
    df = run_offline([q], msgs, 2, Settings(host_timeout_ms=10**9))
    last = {}
    for s in df[df["kind"] == "status"]["status"]:
        s = json.loads(s)
        last[s["partition"]] = s
    late = {h: sum(s["hosts"][h]["late_partials"] for s in last.values()) for h in HOSTS}
    assert late["h0"] == 0 and late["h2"] > 0  # the 40 s-lagging host joined after windows closed


def _complete_windows_are_exact(df: pd.DataFrame, q: Q.QuerySpec, exp: pd.DataFrame) -> tuple[set, set]:
    """(complete windows, incomplete windows) of the output; the complete ones equal the oracle.

    A window counts as complete when every final and late row of it says so (the store writes
    ``complete`` from exactly these columns)."""
    rows = df[(df["query"] == q.name) & df["kind"].isin(["final", "late"])]
    ok = (
        (rows["hosts_in_mark"] == rows["hosts_expected"])
        & (rows["late_partials"] == 0)
        & (rows["missing_records"] == 0)
    )
    by_win = ok.groupby(rows["window"].to_numpy()).all()
    complete = {int(w) for w in by_win[by_win].index}
    got = final_rows(df, q)
    g = got[got["window"].isin(complete)].reset_index(drop=True)
    e = exp[exp["window"].isin(complete)].reset_index(drop=True)
    assert g.equals(e)
    return complete, {int(w) for w in by_win.index} - complete


def test_completeness_host_dead_at_close(cfg, traffic):
    """h2 crashes: windows that closed after its last mark (without it) are incomplete, the ones its
    mark had passed are complete and exact."""
    q = cfg.query("pairs")
    exp = window_oracle(q, oracle(q, traffic))
    msgs = emulated_messages(q, traffic, 1, end=False)
    own = [i for i, m in enumerate(msgs) if m.host == "h2"]
    cut = own[len(own) // 2]
    last_mark = max(m.mark_pane for m in msgs[:cut] if m.host == "h2" and m.is_punctuation)
    df = run_offline(
        [q], msgs, 1, Settings(host_timeout_ms=1500, expected_hosts=HOSTS), drop={i for i in own if i >= cut}
    )
    complete, incomplete = _complete_windows_are_exact(df, q, exp)
    assert complete and incomplete
    assert all(w < last_mark for w in complete) and all(w >= last_mark for w in incomplete)
    fin = df[(df["kind"] == "final") & (df["window"] >= last_mark)]
    assert (fin["hosts_in_mark"] == 2).all() and (fin["hosts_expected"] == 3).all()


def test_completeness_late_partials_dropped(cfg, traffic):
    """Policy drop: a host that joins after windows closed sends late partials; 'late' rows name the
    (window, key) rows that lack them and how many records, and those windows are incomplete."""
    q = cfg.query("pairs")
    exp = window_oracle(q, oracle(q, traffic))
    df = run_offline([q], emulated_messages(q, traffic, 1), 1, Settings(host_timeout_ms=10**9))
    late = df[df["kind"] == "late"]
    st = json.loads(df[df["kind"] == "status"]["status"].iloc[-1])
    n_late = sum(h["late_partials"] for h in st["hosts"].values())
    assert n_late > 0 and int(late["late_partials"].sum()) == n_late  # tumbling: one window per record
    complete, incomplete = _complete_windows_are_exact(df, q, exp)
    assert set(late["window"].astype(int)) <= incomplete and complete
    diff = final_rows(df, q).merge(exp, how="outer", indicator=True)
    assert set(diff[diff["_merge"] != "both"]["window"].astype(int)) <= incomplete


def test_completeness_missing_records(cfg, traffic):
    """A partial message lost between h1 and the job: the windows it fed are incomplete (missing
    records), every complete window is exact."""
    q = cfg.query("ports9x3")
    exp = window_oracle(q, oracle(q, traffic))
    msgs = emulated_messages(q, traffic, 1)
    victim = next(
        i for i, m in enumerate(msgs) if not m.is_punctuation and m.host == "h1" and i > len(msgs) // 3
    )
    lost = wire.decode(msgs[victim].value)
    df = run_offline([q], msgs, 1, Settings(host_timeout_ms=10**9, expected_hosts=HOSTS), drop={victim})
    complete, incomplete = _complete_windows_are_exact(df, q, exp)
    lay = Layout.of(q)
    fed = {int(p) + d for p in lost.pane for d in range(lay.k)}  # the windows the lost panes feed
    assert fed <= incomplete and complete
    fin = df[df["kind"] == "final"]
    assert set(fin[fin["missing_records"] > 0]["missing_records"]) == {lost.n}


def test_processor_missing_records_and_bad_messages(cfg, traffic):
    q = cfg.query("pairs")
    msgs = emulated_messages(q, traffic, 1)
    victim = next(i for i, m in enumerate(msgs) if not m.is_punctuation and m.host == "h1")
    n_lost = wire.decode(msgs[victim].value).n
    msgs = msgs[:victim] + msgs[victim + 1 :]  # lost between the host and us
    lay = Layout.of(q)
    p = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=HOSTS))
    p.process([m.value for m in msgs] + [b"garbage", msgs[-1].value[:-1]], 1000)
    st = p.status(p.queries["pairs"], 1000)
    assert st.hosts["h1"].missing_records == n_lost
    assert st.hosts["h0"].missing_records == 0
    assert st.errors["bad_messages"] == 2


def test_state_bytes_are_compact_and_not_pickle(cfg, traffic):
    q = cfg.query("pairs")
    msgs = emulated_messages(q, traffic, 1, end=False)
    lay = Layout.of(q)
    p = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9))
    p.process([m.value for m in msgs[: len(msgs) // 2]], 1000)
    b = p.to_bytes()
    assert b[:4] == STATE_ZMAGIC and b"\x80\x04" not in b[:8]
    raw = codec.decompress(b, STATE_ZMAGIC)
    assert raw[:4] == codec.MAGIC
    rows = len(p.queries["pairs"].rollup)
    assert rows > 0 and len(b) < len(raw) < 8 * rows * (1 + lay.kw + lay.na) + 4096
    q2 = PartitionProcessor.from_bytes(b, [lay], p.settings)
    assert q2.to_bytes() == b
    assert (
        PartitionProcessor.from_bytes(raw, [lay], p.settings).to_bytes() == b
    )  # state saved uncompressed earlier
    with pytest.raises(codec.CodecError):
        codec.unpack(b"\x80\x04junk")


def test_chunks_are_compressed_and_old_chunks_still_load():
    """A chunk travels zstd-compressed (several times smaller for real key columns); a chunk an earlier
    build wrote uncompressed still decodes; damaged bytes are a CodecError, never a wrong table."""
    from high_level.aggregate.chunks import CHUNK_ZMAGIC, decode_chunk, encode_chunk

    g = np.arange(100_000, dtype=np.int64)
    key = np.column_stack(
        [np.zeros_like(g), 0xFFFF_0A00_0000 + g // 256, np.zeros_like(g), 0xFFFF_C0A8_0000 + g % 65536]
    )
    state = (g % 7 + 1).reshape(-1, 1)
    b = encode_chunk(key, state)
    assert b.startswith(CHUNK_ZMAGIC) and len(b) * 3 < key.nbytes + state.nbytes
    for data in (b, codec.pack({}, {"key": key, "state": state})):  # new and earlier (uncompressed) bytes
        k, s = decode_chunk(data, 4, 1)
        assert np.array_equal(k, key) and np.array_equal(s, state)
    for bad in (b[:10], b[:-20], b[:16] + bytes(len(b) - 16)):
        with pytest.raises(codec.CodecError):
            decode_chunk(bad, 4, 1)


# -- store ----------------------------------------------------------------------------------------
def test_ip_strings_vectorised_equals_contract():
    from contract import fields as F

    addrs = ["10.0.0.1", "192.168.3.0", "255.255.255.255", "0.0.0.0", "2001:db8::1", "::1", "fe80::"]
    words = np.array([F.ip_to_words(a) for a in addrs], dtype=object)
    hi = np.array([F.to_int64(w[0]) for w in words], np.int64)
    lo = np.array([F.to_int64(w[1]) for w in words], np.int64)
    assert ip_strings(hi, lo).tolist() == [
        F.words_to_ip(int(h), int(lw)) for h, lw in zip(hi, lo, strict=True)
    ]


def test_store_typed_layout_and_replay_overwrites(cfg, tmp_path):
    q = cfg.query("pairs")
    lay = Layout.of(q)
    rng = np.random.default_rng(0)
    n = 50
    w = np.array([T0 // lay.pane_ns + i % 3 for i in range(n)]) + np.where(
        np.arange(n) > 40, 8640, 0
    )  # two days
    src = 0xFFFF_0A00_0000 + rng.integers(0, 99, n)
    key = np.column_stack([np.zeros(n, np.int64), src, np.zeros(n, np.int64), src + 256])
    state = np.column_stack(
        [
            rng.integers(1, 9, (n, 1)),
            rng.integers(60, 1500, (n, 1)),
            rng.integers(60, 1500, (n, 1)),
            rng.integers(1, 5, (n, 1)),
            rng.integers(1, 255, (n, 2)),
        ]
    )
    rows = pd.DataFrame(
        {
            "query": "pairs",
            "partition": 0,
            "window": w,
            "window_start_ns": lay.window_start_ns(w),
            "window_end_ns": lay.window_end_ns(w),
            "key": list(key),
            "state": list(state),
            "kind": "final",
            "closed_at_ms": 1_700_000_100_000,
            "hosts": 3,
            "hosts_expected": 3,
            "hosts_in_mark": 3,
            "late_partials": 0,
            "missing_records": np.where(np.arange(n) == 0, 5, 0),
            "status": None,
        }
    )
    store = ResultStore(tmp_path, [q])
    assert store.write_batch(7, rows) == {"pairs": n}
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert files == [
        "query=pairs/date=2023-11-14/part-000000000007.parquet",
        "query=pairs/date=2023-11-15/part-000000000007.parquet",
    ]
    before = {f: (tmp_path / f).read_bytes() for f in files}
    store.write_batch(7, rows)  # a replayed batch rewrites the same files with the same bytes
    assert {f: (tmp_path / f).read_bytes() for f in files} == before
    got = duckdb.sql(
        f"select * from read_parquet('{tmp_path}/query=pairs/**/*.parquet', hive_partitioning=true)"
    ).df()
    assert len(got) == n and set(got["query"]) == {"pairs"}
    tbl = typed_table(q, rows)
    assert str(tbl.schema.field("window_start").type) == "timestamp[us, tz=UTC]"
    assert str(tbl.schema.field("hosts").type) == "int32"
    assert tbl["complete"].to_pylist() == [i != 0 for i in range(n)]  # row 0: a sequence gap overlaps it
    d = tbl.to_pandas()
    for i in range(n):
        assert d.loc[i, "src_ip"] == Q.decode_key(q, key[i])["src_ip"]
        assert d.loc[i, "dst_ip"] == Q.decode_key(q, key[i])["dst_ip"]
        fin = Q.finalize(q, state[i])
        for a in q.aggregates:
            assert d.loc[i, a.name] == pytest.approx(fin[a.name], rel=1e-15)


def test_store_and_api_columns_of_the_newer_fields(tmp_path):
    """MACs and ICMP/MPLS fields are int64 key columns (absent -1 stays -1), inner addresses are text
    like outer ones (absent prints '::'): through the store to Parquet and in the API's key kinds."""
    from contract import fields as F
    from high_level.serve.columns import QueryInfo

    q = spec(
        "tun",
        group_by=["src_mac", "inner_src_ip/16", "icmp_type", "mpls_label"],
        aggregates=["count as n"],
        table=64,
    )
    lay = Layout.of(q)
    mac, inner = 0xFEDC_BA98_7654, F.IPV4_MAPPED_PREFIX | 0x0A32_0000
    key = np.array([[mac, 0, inner, 3, -1], [0x0200_0000_0001, 0, 0, -1, 16000]], np.int64)
    w = np.array([T0 // lay.pane_ns] * 2)
    rows = pd.DataFrame(
        {
            "query": "tun",
            "partition": 0,
            "window": w,
            "window_start_ns": lay.window_start_ns(w),
            "window_end_ns": lay.window_end_ns(w),
            "key": list(key),
            "state": [np.array([5]), np.array([2])],
            "kind": "final",
            "closed_at_ms": 1_700_000_100_000,
            "hosts": 1,
            "hosts_expected": 1,
            "hosts_in_mark": 1,
            "late_partials": 0,
            "missing_records": 0,
            "status": None,
        }
    )
    assert ResultStore(tmp_path, [q]).write_batch(1, rows) == {"tun": 2}
    got = duckdb.sql(
        f"select * from read_parquet('{tmp_path}/query=tun/**/*.parquet', hive_partitioning=true)"
    ).df()
    names = [p.name for p in q.key_parts]
    assert [got[c].dtype.kind for c in names] == ["i", "O", "i", "i"]
    assert got[names[0]].tolist() == [mac, 0x0200_0000_0001]
    assert F.int_to_mac(int(got[names[0]][0])) == "fe:dc:ba:98:76:54"
    assert got[names[1]].tolist() == ["10.50.0.0", "::"]
    assert got[names[2]].tolist() == [3, -1] and got[names[3]].tolist() == [-1, 16000]
    assert QueryInfo.of(q).key_kinds == dict(zip(names, ["int", "ip", "int", "int"], strict=True))


def test_sink_fast_path_writes_what_generic_rows_write(cfg, traffic, tmp_path):
    """The OOP sink's packed path (``handle_packed``) writes the same Parquet bytes, status and metrics
    as the generic-rows path, for tumbling/sliding queries with finals and corrections in one batch;
    a watcher of the sink (``on_rows``) still gets generic rows."""
    from prometheus_client import generate_latest

    from high_level.aggregate.packed import unpack_rows
    from high_level.job import HighLevelJob, JobOptions

    qs = [cfg.query("pairs"), cfg.query("ports9x3")]
    lays = [Layout.of(q) for q in qs]
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS, late_policy="correction")
    msgs = [m for q in qs for m in emulated_messages(q, traffic, 2, punct_every_s=10, seed=4)]
    outs = []
    for p in range(2):
        proc = PartitionProcessor(lays, p, settings)
        vals = [m.value for m in msgs if m.partition == p]
        outs.append(proc.process_packed(vals[: len(vals) // 2], 1000))
        outs.append(proc.process_packed(vals[len(vals) // 2 :], 2000))
        # a late partial after everything closed: a correction row
        late = wire.encode_partials(
            "ports9x3",
            "h0",
            1,
            p,
            10**6,
            np.array([T0 // lays[1].pane_ns]),
            np.array([[80]]),
            np.array([[1, 64]]),
        )
        outs.append(proc.process_packed([late], 3000))
        # panes a host shed, reported after their windows closed: flagged-window rows
        pane = T0 // lays[0].pane_ns
        shed = wire.Punctuation("pairs", "h0", 1, p, 10**6, pane + 10**6, 0, 0, {}, ((pane, pane + 2, 5),))
        outs.append(proc.process_packed([wire.encode_punctuation(shed)], 4000))
    packed = pa.Table.from_pandas(pd.concat(outs, ignore_index=True), preserve_index=False)
    assert set(packed["kind"].to_pylist()) == {"final", "correction", "status", "incomplete"}

    def job(root):
        return HighLevelJob(
            None, qs, JobOptions(bootstrap="x", results=str(root), checkpoint=str(tmp_path / "ck"))
        )

    a, b = job(tmp_path / "a"), job(tmp_path / "b")
    wa = a.handle_rows(unpack_rows(packed, a.layouts), 3)
    wb = b.handle_packed(packed, 3)
    assert wa == wb and sum(wb.values()) > 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.parquet"))
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    flagged = pd.read_parquet(tmp_path / "b" / "_incomplete")  # one file: query pairs, one day, batch 3
    assert sum(str(f).startswith("_incomplete") for f in files) == 1
    assert (
        sorted(set(flagged["partition"])) == [0, 1]
        and flagged["after_close"].all()
        and set(flagged["host"]) == {"h0"}
    )
    assert S.read(a.store.status_path).queries == S.read(b.store.status_path).queries

    def samples(j):
        return [s for m in j.metrics.registry.collect() for s in m.samples if not s.name.endswith("_created")]

    assert samples(a) == samples(b)
    assert b"lowwater_job_corrections_total" in generate_latest(b.metrics.registry)
    assert (
        f'lowwater_job_flagged_windows_total{{cause="shed",query="pairs"}} {len(flagged)}.0'.encode()
        in generate_latest(b.metrics.registry)
    )

    class Batch:
        def toArrow(self):  # noqa: N802 - Spark's DataFrame method name
            return packed

    r = HighLevelJob(
        None, qs, JobOptions(bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "ck"))
    )
    seen: list = []
    r.sink.on_rows.append(lambda rows, batch_id: seen.append(rows))
    r.sink.foreach_packed(Batch(), 3)
    assert len(seen) == 1 and seen[0].num_rows == unpack_rows(packed, r.layouts).num_rows
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "r" / f).read_bytes() for f in files)


def test_idle_job_keeps_its_status_fresh(tmp_path):
    """A job with nothing to read (a finished capture) rewrites its status document now and then, so the
    page does not call a running job stale; it does not while batches write it anyway."""
    from high_level.job import HighLevelJob, JobOptions

    q = Q.load_text(CONFIG).query("pairs")
    job = HighLevelJob(
        None, [q], JobOptions(bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "c"))
    )
    p = PartitionProcessor([Layout.of(q)], 0, Settings(host_timeout_ms=10**9))
    st = p.status(p.queries["pairs"], 1_000_000)
    job.sink.fold_status([st], 7, {})
    first = S.read(job.store.status_path)
    job.sink.touch(first.updated_ms + 5_000)  # a batch wrote it 5 s ago: leave it
    assert S.read(job.store.status_path).updated_ms == first.updated_ms
    job.sink.touch(first.updated_ms + 30_000)
    again = S.read(job.store.status_path)
    assert (
        again.updated_ms == first.updated_ms + 30_000
        and again.batch_id == 7
        and again.queries == first.queries
    )
    assert again.settings.alert_webhook is False


def test_retention_deletes_old_days_and_the_status_reports_the_store(tmp_path):
    """Retention removes whole days of windows older than the setting (and nothing newer); the status
    document carries the store's size and the setting."""
    from high_level.job import HighLevelJob, JobOptions

    q = Q.load_text(CONFIG).query("pairs")
    opts = JobOptions(
        bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "c"), retention_days=2
    )
    job = HighLevelJob(None, [q], opts)
    lay = Layout.of(q)
    day_ns = 86_400 * 10**9
    now_ms = 1_700_000_000_000 + 10 * 86_400_000
    for days_ago in (5, 3, 1, 0):  # one final window per day, each in its own batch
        start = now_ms * 10**6 - days_ago * day_ns
        w = np.array([(start - lay.origin_ns) // lay.pane_ns - lay.k + 1], np.int64)
        job.store.write_query(
            10 - days_ago,
            q,
            QueryWindows(
                w,
                np.array([1], np.int8),
                np.zeros((1, Q.key_width(q)), np.int64),
                np.ones((1, lay.na), np.int64),
                np.array([now_ms]),
                np.array([1], np.int32),
                np.array([1], np.int32),
                np.array([[1, 0, 0]], np.int64),
            ),
        )
    days = [d for d, _ in R.date_dirs(job.store.root, q.name)]
    assert len(days) == 4
    p = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9))
    job.sink.fold_status([p.status(p.queries["pairs"], now_ms)], 11, {})
    job.sink.maintain(now_ms, opts.retention_days)
    assert [d for d, _ in R.date_dirs(job.store.root, q.name)] == days[2:]  # 5 and 3 days ago are gone
    job.sink.touch(now_ms + 60_000)
    doc = S.read(job.store.status_path)
    assert doc.settings.retention_days == 2 and doc.store_bytes is not None and doc.store_bytes > 0
    assert (
        abs(doc.store_bytes - job.store.size_bytes()) < 4096
    )  # measured just before the status was rewritten
    job.sink.maintain(now_ms + 1000, opts.retention_days)  # within the check interval: nothing to do
    assert len(R.date_dirs(job.store.root, q.name)) == 2


def test_state_layout_auto_chunked_unless_a_query_or_the_checkpoint_needs_the_blob(tmp_path):
    """--state auto (the default) runs the chunked state (with --live too), but the blob one for a landmark
    query or a checkpoint written by the blob state; --state chunked refuses what it cannot run, and an explicit layout
    refuses a checkpoint written by the other one (no migration)."""
    from high_level.aggregate.chunks import chunked_unsupported
    from high_level.aggregate.pipeline import AggregatePipeline
    from high_level.job import JobOptions

    plain = Q.load_text(CONFIG).query("pairs")
    landmark = spec(
        "day", group_by=["dst_port"], aggregates=["count as n"], window={"landmark": "20s", "update": "5s"}
    )

    def layout(qs, state, ckpt="c"):
        opts = JobOptions(
            bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / ckpt), state=state
        )
        return AggregatePipeline(qs).state_layout(opts)

    assert layout([plain], "auto") == "chunked" and layout([plain], "blob") == "blob"
    assert layout([plain, landmark], "auto") == "blob"
    with pytest.raises(ValueError, match="landmark"):
        layout([landmark], "chunked")
    assert chunked_unsupported([Layout.of(plain)]) is None and "landmark" in chunked_unsupported(
        [Layout.of(landmark)]
    )
    assert JobOptions(bootstrap="x", results="r", checkpoint="c").state == "auto"  # the default
    # a checkpoint is resumed by the layout that wrote it: auto follows it, another layout is refused
    (tmp_path / "old" / "oop").mkdir(parents=True)
    assert layout([plain], "auto", "old") == "blob" and layout([plain], "blob", "old") == "blob"
    with pytest.raises(ValueError, match="holds the blob state: --state chunked cannot resume it"):
        layout([plain], "chunked", "old")
    (tmp_path / "new" / "oop-chunked").mkdir(parents=True)
    assert layout([plain], "auto", "new") == "chunked" and layout([plain], "chunked", "new") == "chunked"
    with pytest.raises(ValueError, match="holds the chunked state: --state blob cannot resume it"):
        layout([plain], "blob", "new")
    with pytest.raises(ValueError, match="holds the chunked state, but .*landmark"):
        layout([plain, landmark], "auto", "new")
    with pytest.raises(ValueError, match="state"):
        JobOptions(bootstrap="x", results="r", checkpoint="c", state="rocks")


def test_an_operators_stop_waits_for_the_running_batch_within_its_grace():
    """HighLevelJob.stop(grace_s) stops a stream between micro-batches when the running one ends in time
    (no cancelled Spark job), and stops it anyway at the deadline or when the stream cannot say."""
    import time

    from high_level.job import wait_for_batch_end

    class Stream:
        def __init__(self, triggers: list[bool], active: bool = True) -> None:
            self.triggers, self.isActive, self.asked = triggers, active, 0

        @property
        def status(self) -> dict:
            self.asked += 1
            if self.triggers and self.triggers[0] is None:
                raise RuntimeError("py4j gone")
            return {"isTriggerActive": self.triggers.pop(0) if len(self.triggers) > 1 else self.triggers[0]}

    busy = Stream([True, True, True, False])
    assert wait_for_batch_end(busy, time.monotonic() + 5, poll_s=0.001) and busy.asked == 4
    stuck = Stream([True])
    t0 = time.monotonic()
    assert not wait_for_batch_end(stuck, t0 + 0.05, poll_s=0.001) and stuck.asked > 1
    assert wait_for_batch_end(Stream([True], active=False), t0 + 5)  # stopped already
    assert wait_for_batch_end(Stream([None]), t0 + 5)  # cannot tell: stop as before
    assert not wait_for_batch_end(Stream([True]), time.monotonic())  # no grace: at once


def test_a_gap_whose_records_lead_the_mark_flags_their_windows(cfg):
    """The lost records are the only ones far ahead of the host's mark (open panes evicted early): the lead
    the job observed says nothing of them, the punctuation's ``sent_upto`` bounds them. Every window they
    feed reports the missing record; none is complete and wrong."""
    lay = Layout.of(cfg.query("pairs"))
    b, far = 1_000, 1_020

    def part(seq: int, panes: list[int], key: int) -> bytes:
        n = len(panes)
        key_ = np.full((n, lay.kw), key, dtype=np.int64)
        return wire.encode_partials(
            "pairs", "h0", 1, 0, seq, np.array(panes), key_, np.ones((n, lay.na), dtype=np.int64)
        )

    def punct(seq: int, mark: int, upto: int) -> bytes:
        return wire.encode_punctuation(
            wire.Punctuation("pairs", "h0", 1, 0, seq, mark, mark, 0, sent_upto=upto)
        )

    stream = [
        part(0, [b, b + 1], 7),
        punct(2, b + 2, b + 1),
        part(2, [far], 7),  # lost between the host and the job
        part(3, [b + 2], 7),
        punct(4, b + 3, far),  # reveals the gap: one record, sent with panes up to `far`
        part(4, [far], 8),  # the windows the lost record fed have rows of their own
        punct(5, far + 1, far),
        punct(5, wire.END_OF_STREAM, far),
    ]
    p = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=("h0",)))
    df = p.process([m for i, m in enumerate(stream) if i != 2], 1000)
    fin = df[df["kind"] == "final"]
    fed = fin[fin["window"].isin([far + d for d in range(lay.k)])]
    assert len(fed) == lay.k and (fed["missing_records"] == 1).all()
