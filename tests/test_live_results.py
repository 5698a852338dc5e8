"""Provisional results of open windows (high level, offline): exact against what has arrived, never after
the final, through the packed output and the live message contract into the update queue."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from contract import live as L
from contract import query as Q
from contract import results as R
from contract import wire
from high_level.aggregate.chunks import MemoryChunks
from high_level.aggregate.packed import QueryWindows, unpack_windows
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.live.publish import (
    KEEP_CLOSED,
    LIVE_KINDS,
    LivePublisher,
    live_messages,
    split_provisional,
    window_of_key,
)
from high_level.live.queue import Update, UpdateQueue, replay
from lowwater_testing.hosts import CONFIG, HOSTS, emulated_messages, final_rows
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import spec
from lowwater_testing.topics import KeyedRecorder
from lowwater_testing.traffic import T0, make_traffic, oracle

SETTINGS = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS, live=True)


@pytest.fixture(scope="module")
def cfg() -> Q.Config:
    return Q.load_text(CONFIG)


@pytest.fixture(scope="module")
def traffic():
    return make_traffic(6000, 60, T0, 60 * 10**9, seed=3)


class _Received:
    """Every partial record a partition has received so far, for the brute-force provisional oracle."""

    def __init__(self, lay: Layout) -> None:
        self.lay, self.pane, self.key, self.state = lay, [], [], []

    def add(self, value: bytes) -> None:
        b = wire.decode(value)
        if isinstance(b, wire.Partials):
            self.pane.append(b.pane)
            self.key.append(b.key)
            self.state.append(b.state)

    def window(self, w: int, key: np.ndarray) -> np.ndarray:
        pane, k, st = np.concatenate(self.pane), np.concatenate(self.key), np.concatenate(self.state)
        sel = (pane >= w - self.lay.k + 1) & (pane <= w) & (k == key).all(axis=1)
        out = []
        for j, op in enumerate(self.lay.ops):
            col = st[sel, j]
            out.append(col.sum() if op == Q.MERGE_SUM else col.min() if op == Q.MERGE_MIN else col.max())
        return np.array(out, np.int64)


@pytest.mark.parametrize("state", ["blob", "chunked"])
@pytest.mark.parametrize("name", ["pairs", "ports9x3"])
def test_provisional_values_are_exact_so_far_and_never_follow_the_final(cfg, traffic, name, state):
    q = cfg.query(name)
    lay = Layout.of(q)
    msgs = emulated_messages(q, traffic, 2, punct_every_s=1, skew=(0, 7, 20), seed=4)
    stores = {p: MemoryChunks() if state == "chunked" else None for p in range(2)}
    procs = {p: PartitionProcessor([lay], p, SETTINGS, stores[p]) for p in range(2)}
    seen = {p: _Received(lay) for p in range(2)}
    finals, prov_rows, frames = set(), 0, []
    for b, chunk in enumerate(np.array_split(np.arange(len(msgs)), 40)):
        for p in range(2):
            vals = [msgs[i].value for i in chunk if msgs[i].partition == p]
            for v in vals:
                seen[p].add(v)
            procs[p] = PartitionProcessor.from_bytes(procs[p].to_bytes(), [lay], SETTINGS, stores[p])
            df = procs[p].process(vals, 1_000_000 + b * 1000)
            frames.append(df)
            prov = df[df["kind"] == L.PROVISIONAL_KIND]
            for w, key, st, in_mark, exp in zip(
                prov["window"],
                prov["key"],
                prov["state"],
                prov["hosts_in_mark"],
                prov["hosts_expected"],
                strict=True,
            ):
                assert (int(w), tuple(key)) not in finals, "provisional value after the final"
                assert np.array_equal(np.asarray(st), seen[p].window(int(w), np.asarray(key))), (w, key)
                assert 0 <= in_mark < exp == len(HOSTS)  # open: some host's mark is not past it
                prov_rows += 1
            fin = df[df["kind"] == "final"]
            finals |= {(int(w), tuple(k)) for w, k in zip(fin["window"], fin["key"], strict=True)}
    assert prov_rows > 100
    # the finals (and the store's rows) are what they were without live results
    assert final_rows(pd.concat(frames, ignore_index=True), q).equals(window_oracle(q, oracle(q, traffic)))


def test_live_messages_follow_the_contract_and_feed_the_update_queue(cfg, traffic):
    q = cfg.query("pairs")
    lay = Layout.of(q)
    msgs = emulated_messages(q, traffic, 1, punct_every_s=1, skew=(0, 3, 9), seed=2)
    proc = PartitionProcessor([lay], 0, SETTINGS)
    timed, ideal, exact = [], {}, {}
    for b, chunk in enumerate(np.array_split(np.arange(len(msgs)), 60)):
        packed = pa.Table.from_pandas(
            proc.process_packed([msgs[i].value for i in chunk], 1000 * b), preserve_index=False
        )
        prov_packed, rest = split_provisional(packed)
        prov, _ = unpack_windows(prov_packed, {q.name: lay}, LIVE_KINDS)
        wins, _ = unpack_windows(rest, {q.name: lay})
        assert not any(rank_kind == L.PROVISIONAL_KIND for rank_kind in rest["kind"].to_pylist())
        for final, src in ((False, prov), (True, wins)):
            if q.name not in src:
                continue
            for key, value in live_messages(q, lay, src[q.name], final, b):
                u = L.decode(key, value)  # validates: nothing guessed
                L.check_query(u, q)
                assert u.complete == (final and u.hosts_in_mark == u.hosts_expected)
                upd = Update(u.window_start_us, tuple(u.group.values()), u.values, u.final, u.version)
                timed.append((float(b), upd))
                ideal.setdefault(upd.key, []).append(u.version)
                if final:
                    exact[upd.key] = u.values
    assert exact and len(timed) > 2 * len(exact)
    for policy in ("inplace", "linecutting", "fifo"):
        # a consumer at load factor 4 (a quarter of a batch's updates per batch): fewer deliveries,
        # every final delivered and exact, per key an ordered subsequence of the published versions
        per_batch = len(timed) / 60
        q_ = UpdateQueue(policy, service_s=4.0 / per_batch)
        got = {}
        for _, u in replay(q_, [(t, Update(**vars(u))) for t, u in timed]):
            got.setdefault(u.key, []).append(u)
        assert {k: v[-1].value for k, v in got.items() if v[-1].final} == exact
        assert all([x.version for x in v] == sorted({x.version for x in v}) for v in got.values())
        assert all({x.version for x in v} <= set(ideal[k]) for k, v in got.items())
        if policy != "fifo":
            assert q_.stats.delivered < len(timed) / 2 and q_.stats.skipped_windows == 0


def test_contract_refuses_what_does_not_validate(cfg):
    q = cfg.query("pairs")
    good = L.LiveUpdate(
        query="pairs",
        window_start_us=0,
        window_end_us=10,
        group={"src_ip": "10.0.0.1", "dst_ip": "10.0.0.2"},
        values={"packets": 1, "bytes": 2, "avg_len": None, "min_ttl": 3, "max_ttl": 4},
        final=False,
        version=1,
        published_ms=5,
        hosts_in_mark=0,
        hosts_expected=2,
    )
    k, v = L.encode(good)
    assert L.decode(k, v) == good
    L.check_query(good, q)
    with pytest.raises(L.LiveFormatError, match="does not match the value"):
        L.decode(b'[1,["x"]]', v)
    with pytest.raises(L.LiveFormatError, match="not a live update"):
        L.decode(k, v.replace(b'"complete":false', b'"complete":true'))
    with pytest.raises(L.LiveFormatError, match="not a live update"):
        L.decode(k, json.dumps({**json.loads(v), "extra": 1}).encode())
    with pytest.raises(L.LiveFormatError, match="tombstone"):
        L.decode(k, None)
    with pytest.raises(L.LiveFormatError, match="does not match query"):
        L.check_query(good, cfg.query("nets"))


def test_publisher_sends_provisionals_then_finals_per_query_topic(cfg, traffic):
    q = cfg.query("ports9x3")
    lay = Layout.of(q)
    proc = PartitionProcessor([lay], 0, SETTINGS)
    prod = KeyedRecorder()
    pub = LivePublisher([q], producer=prod)
    for b, chunk in enumerate(np.array_split(np.arange(len(msgs := emulated_messages(q, traffic, 1))), 30)):
        packed = pa.Table.from_pandas(
            proc.process_packed([msgs[i].value for i in chunk], 1000 * b), preserve_index=False
        )
        prov_packed, rest = split_provisional(packed)
        pub.publish(
            b,
            unpack_windows(prov_packed, {q.name: lay}, LIVE_KINDS)[0],
            unpack_windows(rest, {q.name: lay})[0],
        )
    assert {t for t, _, _ in prod.sent} == {L.live_topic(q.name)}
    assert pub.published[q.name]["provisional"] > 0 and pub.published[q.name]["final"] > 0
    last, deleted = {}, set()
    for _, k, v in prod.sent:
        assert k not in deleted, "a message after the key's tombstone"
        if v is None:  # a tombstone: only of a key whose final was sent
            assert last[k][1], "a tombstone before the key's final"
            deleted.add(k)
            continue
        u = L.decode(k, v)
        assert not last.get(k, (0, False))[1], "a message after the key's final"
        assert u.version >= last.get(k, (0, False))[0]
        last[k] = (u.version, u.final)
    # every closed window but the newest KEEP_CLOSED is deleted from the topic (compaction shrinks it)
    closed = {window_of_key(k) for k, (_, final) in last.items() if final}
    kept = {window_of_key(k) for k, (_, final) in last.items() if final and k not in deleted}
    assert len(closed) > KEEP_CLOSED and kept == set(sorted(closed)[-KEEP_CLOSED:])
    assert pub.tombstoned[q.name] == len(deleted) > 0


def test_live_messages_of_a_holistic_query_carry_the_second_stage_per_group():
    """A distinct count's rows are per (window, group, value) until the second stage: the live message is
    one per (window, group) with the reduced value, its window and completeness read back in step."""
    q = spec(
        "fanin", group_by=["dst_port"], aggregates=["count_distinct(src_port) as sources", "count as packets"]
    )
    lay = Layout.of(q)
    # window 7: dst_port 80 from src ports 1, 2, 3 (2 packets each), dst_port 443 from 9; window 8: 80 from 5
    key = np.array([[80, 1], [80, 2], [80, 3], [443, 9], [80, 5]], np.int64)
    n = len(key)
    w = QueryWindows(
        window=np.array([7, 7, 7, 7, 8], np.int64),
        rank=np.full(n, R.ROW_KINDS.index("final"), np.int8),
        key=key,
        state=np.full((n, 1), 2, np.int64),
        closed_at_ms=np.array([5, 5, 5, 5, 6], np.int64),
        hosts=np.ones(n, np.int32),
        hosts_expected=np.array([2, 2, 2, 2, 1], np.int32),
        comp=np.array([[1, 0, 0]] * n, np.int64),
    )
    docs = {
        (u.window_end_us, u.group["dst_port"]): u
        for u in (L.decode(k, v) for k, v in live_messages(q, lay, w, True, 3))
    }
    end7, end8 = (lay.window_end_ns(np.array([7, 8])) // 1000).tolist()
    assert set(docs) == {(end7, 80), (end7, 443), (end8, 80)}
    assert docs[(end7, 80)].values == {"sources": 3, "packets": 6}
    assert docs[(end7, 443)].values == {"sources": 1, "packets": 2}
    assert docs[(end8, 80)].values == {"sources": 1, "packets": 2}
    assert docs[(end8, 80)].complete and not docs[(end7, 80)].complete  # 1 of 2 hosts in mark vs 1 of 1
    assert docs[(end7, 80)].hosts_expected == 2 and docs[(end8, 80)].published_ms == 6
