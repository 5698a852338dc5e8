"""Group-wise punctuation (OOP App. A): a host says "group g is done up to pane t" and the job closes that
group's windows at once, while the global low-water mark still closes the rest. Checked against a
brute-force oracle under disorder, host skew, 1/2/4 partitions, stray late rows of punctuated groups and
a restart of the processor between every micro-batch; and the wire kind, the config and the agent's
emitter (its backlog keeps the group punctuation behind the group's partials, also when it compacts)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from contract import wire
from high_level.aggregate.chunks import chunked_unsupported
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout, QueryRollup
from low_level.host.emit import Emitter
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import config, query

HOSTS = ("h0", "h1", "h2")
SKEW = (0, 3, 9)  # panes each host's clock lags
PANES = 60
AGGS = ["count as packets", "sum(length) as bytes", "min(ttl) as min_ttl", "max(ttl) as max_ttl"]


def _cfg(window: dict, groups: bool = True, partitions: int = 1) -> Q.QuerySpec:
    text = config(
        query(
            "g",
            group_by=["dst_port"],
            aggregates=AGGS,
            window=window,
            heartbeat={"groups": groups},
            partitions=partitions,
        )
    ).text
    return Q.load_text(text).queries[0]


WINDOWS = {
    "tumbling": {"range": "2s"},
    "sliding": {"range": "6s", "slide": "2s"},
    "gcd": {"range": "9s", "slide": "6s"},
}


def _records(seed: int, na: int):
    """Per host its (pane, key, state) records; groups 1000.. are flows seen by one host that end at a
    pane and are punctuated done (their owner, end pane); groups 1..40 are everywhere."""
    rng = np.random.default_rng(seed)
    recs = {h: [] for h in HOSTS}
    for h in HOSTS:
        n = 900
        pane = rng.integers(0, PANES, n)
        key = rng.integers(1, 41, n)
        recs[h].append((pane, key))
    flows = {}
    for g in range(1000, 1060):
        owner = HOSTS[g % 3]
        start = int(rng.integers(0, PANES - 10))
        end = start + int(rng.integers(0, 8))
        pane = rng.integers(start, end + 1, 20)
        recs[owner].append((pane, np.full(20, g)))
        flows[g] = (owner, end + 1)
    out = {}
    for h in HOSTS:
        pane = np.concatenate([p for p, _ in recs[h]]).astype(np.int64)
        key = np.concatenate([k for _, k in recs[h]]).astype(np.int64)[:, None]
        length = rng.integers(40, 1500, len(pane))
        ttl = rng.integers(1, 255, len(pane))
        state = np.column_stack([np.ones(len(pane), np.int64), length, ttl, ttl])[:, :na]
        out[h] = (pane, key, state)
    return out, flows


def _messages(q: Q.QuerySpec, partitions: int, seed: int, strays: int = 6):
    """Every host's batches in send order, interleaved round by round: round r sends a host's records of
    pane r - skew (a tenth of them two rounds late: disorder), then its mark (the oldest unsent pane);
    a flow's owner sends its group punctuation once the flow's last record went. ``strays`` rows of
    punctuated flows come later from another host: late. Returns (partition, bytes) and the strays."""
    rng = np.random.default_rng(seed + 1)
    na = len(Q.state_columns(q))
    recs, flows = _records(seed, na)
    incs = {h: i + 1 for i, h in enumerate(HOSTS)}
    seq = {(h, p): 0 for h in HOSTS for p in range(partitions)}
    send_round = {}
    for h in HOSTS:
        pane = recs[h][0]
        delay = np.where(rng.random(len(pane)) < 0.1, 2, 0)
        send_round[h] = pane + SKEW[HOSTS.index(h)] + delay
    stray_flows = rng.choice(sorted(flows), strays, replace=False)
    rounds = PANES + max(SKEW) + 6
    out: list[tuple[int, bytes]] = []
    sent_flows: set[int] = set()
    stray_rows = []
    for r in range(rounds):
        order = rng.permutation(len(HOSTS))
        for hi in order:
            h = HOSTS[hi]
            pane, key, state = recs[h]
            sel = send_round[h] == r
            part = wire.partition_of(key[sel], partitions)
            for p in range(partitions):
                s = part == p
                if s.any():
                    out.append(
                        (
                            p,
                            wire.encode_partials(
                                "g", h, incs[h], p, seq[(h, p)], pane[sel][s], key[sel][s], state[sel][s]
                            ),
                        )
                    )
                    seq[(h, p)] += int(s.sum())
            # flows whose every record is sent: group punctuation to the group's partition
            for g, (owner, done) in flows.items():
                if owner == h and g not in sent_flows and (send_round[h][key[:, 0] == g] <= r).all():
                    sent_flows.add(g)
                    gk = np.array([[g]], np.int64)
                    p = int(wire.partition_of(gk, partitions)[0])
                    out.append(
                        (
                            p,
                            wire.encode_group_punctuation(
                                wire.GroupPunctuation("g", h, incs[h], p, seq[(h, p)], gk, np.array([done]))
                            ),
                        )
                    )
                    if g in stray_flows and r + 4 < rounds:  # another host sends a row of it later: late
                        stray_rows.append((r + 4, HOSTS[(hi + 1) % 3], done - 1, g))
            for rr, sh, sp, g in stray_rows:
                if rr == r and sh == h:
                    gk = np.array([[g]], np.int64)
                    p = int(wire.partition_of(gk, partitions)[0])
                    st = np.array([[1, 100, 7, 7][:na]], np.int64)
                    out.append(
                        (p, wire.encode_partials("g", h, incs[h], p, seq[(h, p)], np.array([sp]), gk, st))
                    )
                    seq[(h, p)] += 1
            unsent = pane[send_round[h] > r]
            mark = min(int(unsent.min()) if len(unsent) else PANES, r - SKEW[hi] + 1)
            if r == rounds - 1:
                mark = wire.END_OF_STREAM
            for p in range(partitions):
                pu = wire.Punctuation("g", h, incs[h], p, seq[(h, p)], max(mark, 0), 0, 0, {})
                out.append((p, wire.encode_punctuation(pu)))
    strays = [(sp, g, np.array([1, 100, 7, 7][:na])) for _, _, sp, g in stray_rows]
    return out, recs, flows, strays


def _oracle(q: Q.QuerySpec, recs, extra=()) -> pd.DataFrame:
    pane = np.concatenate([recs[h][0] for h in HOSTS] + [np.array([e[0]]) for e in extra])
    key = np.concatenate([recs[h][1][:, 0] for h in HOSTS] + [np.array([e[1]]) for e in extra])
    state = np.vstack([recs[h][2] for h in HOSTS] + [e[2][None, :] for e in extra])
    df = pd.DataFrame({"pane": pane, "k0": key, **{f"s{j}": state[:, j] for j in range(state.shape[1])}})
    ops = {f"s{j}": ["sum", "sum", "min", "max"][j] for j in range(state.shape[1])}
    po = df.groupby(["pane", "k0"], as_index=False).agg(ops)
    return window_oracle(q, po)


def _run(q: Q.QuerySpec, msgs, partitions: int, batches: int = 40, restart: bool = True):
    lay = Layout.of(q)
    settings = Settings(host_timeout_ms=10**9, expected_hosts=HOSTS, late_policy="correction")
    procs = {p: PartitionProcessor([lay], p, settings) for p in range(partitions)}
    frames = []
    for b, chunk in enumerate(np.array_split(np.arange(len(msgs)), batches)):
        for p in range(partitions):
            if restart:
                procs[p] = PartitionProcessor.from_bytes(procs[p].to_bytes(), [lay], settings)
            df = procs[p].process([msgs[i][1] for i in chunk if msgs[i][0] == p], 1_000_000 + b)
            df["batch"] = b
            frames.append(df)
    return pd.concat(frames, ignore_index=True), procs


def _rows(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    f = df[df["kind"] == kind]
    k = np.stack(f["key"].to_numpy()) if len(f) else np.empty((0, 1), np.int64)
    s = np.stack(f["state"].to_numpy()) if len(f) else np.empty((0, 4), np.int64)
    out = pd.DataFrame(
        {
            "window": f["window"].to_numpy(np.int64),
            "k0": k[:, 0],
            **{f"s{j}": s[:, j] for j in range(s.shape[1])},
        }
    )
    out["batch"] = f["batch"].to_numpy()
    return out.sort_values(["window", "k0"]).reset_index(drop=True)


@pytest.mark.parametrize(("shape", "partitions"), [("tumbling", 1), ("sliding", 2), ("gcd", 4)])
def test_group_punctuation_closes_early_and_exactly(shape, partitions):
    q = _cfg(WINDOWS[shape], partitions=partitions)
    msgs, recs, flows, strays = _messages(q, partitions, seed=partitions * 7 + len(shape))
    df, procs = _run(q, msgs, partitions)
    finals = _rows(df, "final")
    cols = ["window", "k0", "s0", "s1", "s2", "s3"]
    # every window exactly once, and exactly what every host sent before its punctuation (a stray row of
    # a punctuated flow may still count in the flow's windows from its done pane on, if they were open
    # when it came: those are checked with the corrections below)
    assert not finals.duplicated(["window", "k0"]).any()
    want = _oracle(q, recs)
    done = {g: flows[g][1] for _, g, _ in strays}
    maybe = lambda d: (d["k0"].map(done).notna() & (d["window"] >= d["k0"].map(done))).to_numpy()  # noqa: E731
    assert len(finals) == len(want)
    assert (
        finals.loc[~maybe(finals), cols]
        .reset_index(drop=True)
        .equals(want[~maybe(want)].reset_index(drop=True))
    )
    # the stray rows of punctuated groups are late: counted, and their windows get correction rows
    corr = _rows(df, "correction")
    assert len(strays) > 0 and len(corr) > 0
    assert set(corr["k0"]) <= {g for _, g, _ in strays}  # a stray in no closed window (gcd) has none
    both = pd.concat([finals[cols], corr[cols]])
    summed = both.groupby(["window", "k0"], as_index=False).agg(
        {"s0": "sum", "s1": "sum", "s2": "min", "s3": "max"}
    )
    assert summed.equals(_oracle(q, recs, strays))
    status = [json.loads(x) for x in df[df["kind"] == "status"]["status"]]
    last = {s["partition"]: s for s in status}
    assert sum(h["late_partials"] for s in last.values() for h in s["hosts"].values()) == len(strays)
    assert all(s["open_windows"] == 0 and s["state_rows"] == 0 for s in last.values())
    # the same batches without group punctuation (heartbeat.groups off): the flows' windows close later,
    # the other groups' at the same batch; nothing early is ever wrong (checked above)
    off, _ = _run(_cfg(WINDOWS[shape], groups=False, partitions=partitions), msgs, partitions)
    base = _rows(off, "final").set_index(["window", "k0"])["batch"]
    got = finals.set_index(["window", "k0"])["batch"]
    k0, w = got.index.get_level_values("k0"), got.index.get_level_values("window")
    ahead = (k0 >= 1000) & (
        w < pd.Series(k0).map({g: d for g, (_, d) in flows.items()}).fillna(-1).to_numpy()
    )
    assert (got[~ahead] == base[got[~ahead].index]).all()  # other groups, and a flow's later windows
    early = got[ahead] < base[got[ahead].index]
    assert early.mean() > 0.5, early.mean()  # the flow's windows below its done pane: mostly batches earlier
    assert (got[ahead] <= base[got[ahead].index]).all()
    ignored = [
        json.loads(x)["errors"].get("group_punctuation_ignored", 0)
        for x in off[off["kind"] == "status"]["status"]
    ]
    assert sum(ignored) > 0  # counted, not silently dropped


def test_the_roll_up_forgets_a_group_frontier_once_the_low_water_mark_passes_it():
    q = _cfg(WINDOWS["sliding"])
    r = QueryRollup(Layout.of(q))
    key = np.array([[5], [6], [5]], np.int64)
    r.add(np.array([0, 0, 1]), key, np.array([[1, 10, 3, 3]] * 3))
    out = r.close_groups(np.array([[5]]), np.array([2]))
    # group 5's windows 0 and 1 (panes [-2, 0] and [-1, 1]); group 6 waits
    assert sorted(out.window.tolist()) == [0, 1] and set(out.key[:, 0]) == {5}
    assert r.close_groups(np.array([[5]]), np.array([2])).window.size == 0  # idempotent
    assert r.frontier(np.array([[5], [6]])).tolist() == [2, np.iinfo(np.int64).min]
    res = r.add(np.array([1]), np.array([[5]]), np.array([[1, 1, 1, 1]]))  # late for group 5 only
    assert res.late_per_host.tolist() == [1] and sorted(res.corrections.window.tolist()) == [1]
    rest = r.close(4)
    assert {(int(w), int(k)) for w, k in zip(rest.window, rest.key[:, 0], strict=True)} == {
        (0, 6),
        (1, 6),
        (2, 6),
        (2, 5),
        (3, 5),
    }
    assert len(r.groups) == 0 and len(r) == 0  # the frontier passed: nothing of group 5 is kept
    arrays = r.group_arrays("g")
    assert arrays == {}


def test_group_frontiers_survive_a_restart():
    q = _cfg(WINDOWS["tumbling"])
    lay = Layout.of(q)
    r = QueryRollup(lay)
    r.add(np.array([3, 3]), np.array([[1], [2]]), np.array([[1, 1, 1, 1]] * 2))
    assert r.close_groups(np.array([[1]]), np.array([9])).window.tolist() == [3]
    r2 = QueryRollup(lay, r.pane.copy(), r.key.copy(), r.state.copy(), r.closed)
    r2.load_groups(r.group_arrays("g"), "g")
    assert r2.frontier(np.array([[1], [2]])).tolist() == [9, np.iinfo(np.int64).min]
    assert r2.add(np.array([8]), np.array([[1]]), np.array([[1, 1, 1, 1]])).late_per_host.tolist() == [1]
    assert r2.close(10).key[:, 0].tolist() == [2]


def test_the_wire_carries_group_punctuation_and_rejects_a_bad_one():
    key = np.array([[1, 2], [3, 4], [5, 6]], np.int64)
    g = wire.GroupPunctuation("q", "h", 7, 2, 99, key, np.array([10, 11, 12]))
    b = wire.decode(wire.encode_group_punctuation(g))
    assert isinstance(b, wire.GroupPunctuation)
    assert (b.query, b.host, b.incarnation, b.partition, b.seq) == ("q", "h", 7, 2, 99)
    assert b.key.tolist() == key.tolist() and b.done_pane.tolist() == [10, 11, 12]
    assert wire.peek(wire.encode_group_punctuation(g))[0] == wire.KIND_PUNCT_GROUPS
    with pytest.raises(wire.WireError):
        wire.encode_group_punctuation(
            wire.GroupPunctuation("q", "h", 7, 2, 99, key[:0], np.array([], np.int64))
        )
    buf = bytearray(wire.encode_group_punctuation(g))
    buf[-5] ^= 1
    with pytest.raises(wire.WireError, match="checksum"):
        wire.decode(bytes(buf))


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("    group_by: []\n", "needs a group_by"),
        ("    group_by: [dst_port]\n    window: {landmark: 1d, update: 1m}\n", "not a landmark"),
    ],
)
def test_config_refuses_group_punctuation_it_cannot_honour(extra, reason):
    doc = "queries:\n  - name: g\n    aggregates: [{fn: count}]\n    heartbeat: {groups: true}\n" + extra
    if "window" not in extra:
        doc += "    window: {range: 10s}\n"
    with pytest.raises(Q.ConfigError) as info:
        Q.load_text(doc, "bad.yaml")
    assert info.value.file == "bad.yaml" and info.value.line == 2 and reason in info.value.reason


def test_a_query_with_group_punctuation_keeps_the_blob_state():
    assert "group-wise" in chunked_unsupported([Layout.of(_cfg(WINDOWS["tumbling"]))])


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes]] = []

    def send(self, topic, value, partition):
        self.sent.append((topic, partition, value))


@pytest.mark.parametrize("compact", [False, True])
def test_the_agent_sends_group_punctuation_after_the_groups_partials(compact):
    q = _cfg(WINDOWS["tumbling"], partitions=4)
    em = Emitter([q], "h", None, producer=_Producer(), ensure_topics=False, merge_at=10**9)
    keys = np.arange(1, 41, dtype=np.int64)[:, None]
    em.submit("g", np.zeros(40, np.int64), keys, np.ones((40, 4), np.int64))
    em.group_done("g", keys[:10], np.full(10, 1))
    em.punctuate("g", 1, 0, {})
    if compact:
        em.backlog.compact()
    em.pump()
    seen: dict[int, set[int]] = {}
    groups = set()
    for _t, p, v in em.producer.sent:
        b = wire.decode(v)
        assert b.partition == p
        if isinstance(b, wire.Partials):
            seen.setdefault(p, set()).update(b.key[:, 0].tolist())
            assert not groups & set(b.key[:, 0].tolist())  # no partial of a group after its punctuation
        elif isinstance(b, wire.GroupPunctuation):
            assert int(wire.partition_of(b.key, 4)[0]) == p and b.seq == len(seen.get(p, ()))
            assert set(b.key[:, 0].tolist()) <= seen[p]
            groups |= set(b.key[:, 0].tolist())
    assert groups == set(range(1, 11))
