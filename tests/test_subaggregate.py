"""Low-level exactness: merged emitted partials equal the offline oracle for every flush policy and
table size, the m-pane delay bound holds, and no punctuation precedes a partial it covers."""

from __future__ import annotations

import numpy as np
import pytest

from contract import fields as F
from contract import query as Q
from contract import wire
from low_level.host.agent import Agent
from low_level.kernel.tables import EMPTY, QS_CUR, QS_LATE, Tables
from lowwater_testing.capture import RecordingProducer, make_query, push_frames, run_kernel
from lowwater_testing.traffic import (
    Traffic,
    build_frames,
    make_mixed_traffic,
    make_traffic,
    merge_partials,
    oracle,
)

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
GROUPS = 2000


@pytest.mark.parametrize("policy", ["lazy", "slow", "iop"])
@pytest.mark.parametrize("ratio", [0.5, 1, 2])
def test_partials_merge_to_exact_aggregate(policy: str, ratio: float) -> None:
    size = int(2 ** round(np.log2(GROUPS * ratio)))
    q = make_query(
        policy,
        size,
        aggs="[{fn: count, as: n}, {fn: sum, field: length, as: b}, "
        "{fn: min, field: ttl, as: lo}, {fn: max, field: length, as: hi}, "
        "{fn: avg, field: length, as: mean}]",
    )
    traffic = make_traffic(60_000, GROUPS, T0, 60 * NS, seed=ratio.__hash__() % 7)
    recs = run_kernel([q], traffic)[0]
    tables = Tables.build([q])
    pane, key, state = tables.split(0, recs)
    got = merge_partials(q, pane, key, state)
    exp = oracle(q, traffic)
    assert len(exp) > GROUPS  # several panes of many groups
    assert got.equals(exp)
    if ratio < 1:
        assert len(recs) > len(exp)  # a small table must have evicted partials


@pytest.mark.parametrize("policy", ["lazy", "slow", "iop"])
def test_m_pane_delay_bound(policy: str) -> None:
    m = 2
    q = make_query(policy, 1024, window="{range: 1s}", m=m)
    traffic = make_traffic(40_000, 500, T0, 20 * NS, seed=3)
    worst = []

    def check(t: Tables) -> None:
        cur = t.qs[0, QS_CUR]
        panes = t.tab[0 : q.table.size * int(t.qp[0, 4]) : int(t.qp[0, 4])]
        live = panes[panes != EMPTY]
        if len(live):
            worst.append(cur - live.min())

    recs = run_kernel([q], traffic, chunk=128, check=check)[0]
    assert worst and max(worst) <= m
    tables = Tables.build([q])
    assert merge_partials(q, *tables.split(0, recs)).equals(oracle(q, traffic))


def test_sliding_panes_and_filters_are_exact() -> None:
    q = make_query(
        "lazy",
        256,
        window="{range: 6s, slide: 2s}",
        group="[dst_port]",
        aggs="[{fn: count, as: syns}]",
        flt="protocol == tcp and tcp_flags & SYN and not tcp_flags & ACK",
    )
    assert q.window.pane_ns == 2 * NS
    traffic = make_traffic(20_000, 300, T0, 30 * NS, seed=5)
    recs = run_kernel([q], traffic)[0]
    got = merge_partials(q, *Tables.build([q]).split(0, recs))
    exp = oracle(q, traffic)
    assert got.equals(exp)
    assert 0 < exp["s0"].sum() < len(traffic)


def test_prefix_group_is_exact() -> None:
    q = make_query("slow", 64, group="[dst_ip/24]", aggs="[{fn: sum, field: length, as: bytes}]")
    traffic = make_traffic(20_000, 3000, T0, 30 * NS, seed=6)
    recs = run_kernel([q], traffic)[0]
    got = merge_partials(q, *Tables.build([q]).split(0, recs))
    assert got.equals(oracle(q, traffic))


def test_oracle_cuts_ipv6_prefixes_and_reads_dscp_by_hand() -> None:
    """The reference itself, on four hand-written packets: IPv6 keys cut at /48 and /64 (IPv4 at /24),
    dscp = tos >> 2 both as a key and as an aggregate, tos min/max over the raw byte."""
    q = make_query(
        "lazy",
        64,
        group="[dst_ip/24/48, dscp]",
        aggs="[{fn: count, as: n}, {fn: sum, field: dscp, as: d}, {fn: min, field: tos, as: lo}, "
        "{fn: max, field: tos, as: hi}]",
    )
    q64 = make_query("lazy", 64, group="[dst_ip/24]", aggs="[{fn: max, field: dscp, as: d}]")
    dst = ["2001:db8:1:2:aaaa::1", "2001:db8:1:2:bbbb::2", "2001:db8:1:3::1", "192.168.7.9"]
    tos = np.array([0xB8, 0xBB, 0xB8, 0x28])  # EF (46) with ECN 0 and 3, EF again, AF11 (10)
    n = len(dst)
    words = np.array([F.ip_to_words(a) for a in dst], dtype=object)
    t = Traffic(
        ts=np.full(n, T0),
        src=np.full(n, 0x0A000001, np.uint32),
        dst=np.full(n, 0xC0A80709, np.uint32),
        sport=np.full(n, 1000),
        dport=np.full(n, 80),
        proto=np.full(n, 17),
        flags=np.zeros(n, np.int64),
        length=np.array([100, 200, 300, 400]),
        ttl=np.full(n, 64),
        tos=tos,
        v6=np.array([True, True, True, False]),
        src6=np.zeros((n, 2), np.int64),
        dst6=np.array([[F.to_int64(h), F.to_int64(lo)] for h, lo in words], np.int64),
    )
    pane = (T0 - q.window.origin_ns) // q.window.pane_ns

    def k(a: str) -> tuple[int, int]:
        return F.ip_to_words(a)

    got = {tuple(r[1:4]): tuple(r[4:]) for r in oracle(q, t).itertuples(index=False)}
    assert got == {
        (*k("2001:db8:1::"), 46): (3, 138, 0xB8, 0xBB),
        (*k("192.168.7.0"), 10): (1, 10, 0x28, 0x28),
    }
    got64 = {tuple(r[1:3]): r[3] for r in oracle(q64, t).itertuples(index=False)}
    assert got64 == {k("2001:db8:1:2::"): 46, k("2001:db8:1:3::"): 46, k("192.168.7.0"): 10}
    assert (oracle(q, t)["pane"] == pane).all()


MIXED_QUERIES = {  # name: (group_by, aggregates, filter)
    "v6_64": (
        "[dst_ip/24]",
        "[{fn: count, as: n}, {fn: sum, field: length, as: b}, "
        "{fn: min, field: tos, as: lo}, {fn: max, field: tos, as: hi}]",
        "",
    ),
    "mixed_prefixes": (
        "[src_ip/16/48, dst_ip/24/56]",
        "[{fn: count, as: n}, {fn: max, field: dscp, as: d}]",
        "",
    ),
    "by_dscp": (
        "[dscp]",
        "[{fn: count, as: n}, {fn: sum, field: dscp, as: sd}, {fn: avg, field: dscp, as: ad}, "
        "{fn: min, field: tos, as: lo}, {fn: max, field: tos, as: hi}]",
        "",
    ),
    "full_v6_and_port": (
        "[dst_ip, dst_port]",
        "[{fn: sum, field: length, as: b}, {fn: min, field: dscp, as: d}]",
        "dscp >= 32 or dst_ip in [2001:db8:1::/48]",
    ),
    "no_group": (
        "[]",
        "[{fn: count, as: n}, {fn: min, field: dscp, as: lo}, {fn: max, field: tos, as: hi}]",
        "ip_version == 6",
    ),
}


@pytest.mark.parametrize("policy", ["lazy", "slow"])
def test_ipv6_prefixes_and_dscp_tos_are_exact(policy: str) -> None:
    """Mixed IPv4/IPv6 traffic with every TOS byte through the kernel, one generated pass for all the
    query shapes, small tables (evictions): equal to the reference per (pane, key)."""
    qs = [
        make_query(policy, 256, name=name, group=g, aggs=a, flt=f)
        for name, (g, a, f) in MIXED_QUERIES.items()
    ]
    traffic = make_mixed_traffic(40_000, 1500, T0, 40 * NS, seed=8)
    assert 0.4 < traffic.v6.mean() < 0.6 and len(np.unique(traffic.tos)) == 256
    out = run_kernel(qs, traffic)
    tables = Tables.build(qs)
    for i, q in enumerate(qs):
        exp = oracle(q, traffic)
        got = merge_partials(q, *tables.split(i, out[i]))
        assert got.equals(exp), q.name
        assert len(out[i]) >= len(exp) > 0
    rows = traffic.rows()
    v6 = rows[:, F.IPVER] == 6
    by64 = oracle(qs[0], traffic)
    # the data exercises the cut: fewer /64 keys than IPv6 destinations, and both families present
    assert len(np.unique(rows[v6, F.DST_HI])) < len(np.unique(rows[v6][:, [F.DST_HI, F.DST_LO]], axis=0))
    assert (by64["k1"] == 0).sum() > 0 and (by64["k0"] == 0).sum() > 0
    assert len(oracle(qs[2], traffic)) == 64 * len(np.unique(rows[:, F.TS] // (10 * NS)))


def test_agent_punctuation_is_grammatical_and_exact() -> None:
    q = make_query("lazy", 512, window="{range: 1s}", partitions=3)
    traffic = make_traffic(30_000, 900, T0, 12 * NS, seed=8)
    frames, cap, wl, ts = build_frames(traffic)
    prod = RecordingProducer()
    agent = Agent(
        [q],
        None,
        "h1",
        None,
        ring_slots=1 << 12,
        chunk=1024,
        producer=prod,
        on_demand_gap_s=0,
        idle_after_s=0,
    )
    for s in range(0, len(ts), 2000):  # feed in bursts; empty ring between bursts => on-demand marks
        e = min(len(ts), s + 2000)
        push_frames(agent.ring, frames[s:e], cap[s:e], wl[s:e], ts[s:e])
        while agent.ring.fill:
            agent.step()
        agent.step()
    agent.finish()
    marks: dict[int, int] = {}
    seqs: dict[int, int] = {}
    panes, keys, states = [], [], []
    npunct = 0
    for _topic, part, value in prod.sent:
        b = wire.decode(value)
        assert b.partition == part
        if isinstance(b, wire.Punctuation):
            npunct += 1
            assert b.mark_pane >= marks.get(part, -(2**63))  # monotonic
            marks[part] = b.mark_pane
            assert b.seq == seqs.get(part, 0)  # counts every record sent before it
        else:
            assert b.pane.min() >= marks.get(part, -(2**63)), "partial below an already sent mark"
            assert np.all(wire.partition_of(b.key, 3) == part)
            seqs[part] = seqs.get(part, 0) + b.n
            panes.append(b.pane)
            keys.append(b.key)
            states.append(b.state)
    assert npunct > 3 * 3  # on-demand marks between bursts, on every partition
    assert all(m == wire.END_OF_STREAM for m in marks.values())
    got = merge_partials(q, np.concatenate(panes), np.concatenate(keys), np.concatenate(states))
    assert got.equals(oracle(q, traffic))


def test_late_packets_are_counted_not_merged() -> None:
    q = make_query("lazy", 256, window="{range: 1s}")
    traffic = make_traffic(4000, 50, T0, 4 * NS, seed=9)
    frames, cap, wl, ts = build_frames(traffic)
    prod = RecordingProducer()
    agent = Agent([q], None, "h1", None, ring_slots=1 << 13, producer=prod)
    push_frames(agent.ring, frames, cap, wl, ts)
    agent.step()
    agent.punctuate(0, idle=True, timer=True)  # mark = pane of the newest packet
    late = traffic.take(np.arange(100))  # replay the first 100 packets: far below the mark
    push_frames(agent.ring, *build_frames(late))
    agent.step()
    assert agent.kernel.t.qs[0, QS_LATE] == 100


class _LiveSource:
    live_clock = True

    def stats(self) -> dict:
        return {}


def test_idle_live_host_mark_follows_the_wall_clock() -> None:
    """A sparse host whose table is empty must punctuate wall clock - skew, not its last packet's pane."""
    import time

    q = make_query("lazy", 256, window="{range: 1s}")
    now = time.time_ns()
    old = make_traffic(1, 1, now - 30 * NS, 1, seed=1)  # one packet, 30 s ago
    agent = Agent([q], None, "sparse", None, producer=RecordingProducer(), idle_after_s=0)
    agent.source = _LiveSource()
    push_frames(agent.ring, *build_frames(old))
    agent.step()
    agent.punctuate(0, idle=True, timer=True)
    skew_panes = q.heartbeat.skew_ns // q.window.pane_ns
    expected = (time.time_ns() // q.window.pane_ns) - skew_panes
    assert agent.last_mark_pane[0] >= expected - 1, "the mark stayed at the old packet's pane"


class _StoppedLiveSource:
    """A live source that was asked to stop: nothing more comes from it."""

    live_clock = True
    finished = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def join(self, timeout: float) -> None:
        pass

    def stats(self) -> dict:
        return {}


def test_graceful_stop_flushes_and_punctuates_the_clock() -> None:
    """An agent stopped gracefully sends what it holds and then a mark at its clock on every partition,
    so the windows it held open close now, not after its host timeout."""
    import time

    q = make_query("lazy", 256, window="{range: 1s}", partitions=2)
    now = time.time_ns()
    traffic = make_traffic(500, 20, now - 3 * NS, 2 * NS, seed=4)  # the last seconds of traffic
    prod = RecordingProducer()
    agent = Agent([q], None, "stopping", None, producer=prod, idle_after_s=0)
    agent.source = _StoppedLiveSource()
    push_frames(agent.ring, *build_frames(traffic))
    agent.stopping = True  # SIGTERM before the loop ran: the ring still holds every packet
    agent.run()
    sent = [wire.decode(v) for _t, _p, v in prod.sent]
    partials = [b for b in sent if isinstance(b, wire.Partials)]
    last = {b.partition: b for b in sent if isinstance(b, wire.Punctuation)}
    assert sum(int(b.state[:, 0].sum()) for b in partials) == 500  # everything it held was sent
    expected = time.time_ns() // q.window.pane_ns - q.heartbeat.skew_ns // q.window.pane_ns
    assert set(last) == {0, 1} and min(b.mark_pane for b in last.values()) >= expected - 1
    for p, b in last.items():  # the last mark of each partition comes after every partial sent there
        assert b.seq == sum(x.n for x in partials if x.partition == p)


def traffic_with_link_and_icmp(n: int, seed: int) -> Traffic:
    """Mixed IPv4/IPv6 traffic whose newer fields vary: a handful of MAC pairs, TCP windows including
    zero, and a share of ICMP / ICMPv6 packets (type and code from the source-port bytes)."""
    t = make_mixed_traffic(n, 800, T0, 20 * NS, seed=seed)
    rng = np.random.default_rng(seed + 7)
    macs = np.array([0x0200_0000_0001, 0xFEDC_BA98_7654, 0xFFFF_FFFF_FFFF, 0x001B_210A_0B0C], np.int64)
    t.src_mac = macs[rng.integers(0, 4, n)]
    t.dst_mac = macs[rng.integers(0, 3, n)]
    t.window = rng.choice(np.array([0, 1, 512, 29200, 65535]), n).astype(np.int64)
    icmp = rng.random(n) < 0.2
    t.proto = np.where(icmp, np.where(t.v6, 58, 1), t.proto)
    icmp_tc = rng.choice(np.array([0x0000, 0x0303, 0x0800, 0x0B01, 0x8000, 0x8700, 0x0104]), n)
    t.sport = np.where(icmp, icmp_tc, t.sport).astype(np.int64)
    return t


def _each_exact(queries: dict[str, tuple[str, str, str]], traffic: Traffic) -> list:
    """Queries (name: (group_by, aggregates, filter)) through one kernel pass: each non-empty and equal
    to the oracle; returns them in order."""
    qs = [make_query("lazy", 256, name=name, group=g, aggs=a, flt=f) for name, (g, a, f) in queries.items()]
    out = run_kernel(qs, traffic)
    tables = Tables.build(qs)
    for i, q in enumerate(qs):
        exp = oracle(q, traffic)
        assert len(exp) > 0, q.name
        assert merge_partials(q, *tables.split(i, out[i])).equals(exp), q.name
    return qs


NEW_FIELD_QUERIES = {
    "macs": ("[src_mac, dst_mac]", "[{fn: count, as: n}, {fn: sum, field: length, as: b}]", ""),
    "icmp": ("[ip_version, icmp_type, icmp_code]", "[{fn: count, as: n}]", "icmp_type >= 0"),
    "windows": (
        "[tcp_window, ethertype]",
        "[{fn: count, as: n}, {fn: min, field: tcp_window, as: w}]",
        "tcp_window == 0 or ethertype == 0x86dd",
    ),
    "by_mac_filter": (
        "[dst_port]",
        "[{fn: count, as: n}, {fn: max, field: icmp_code, as: c}]",
        "src_mac == 0xfedcba987654 and dst_mac != 0xffffffffffff",
    ),
}


def test_new_fields_group_and_filter_are_exact() -> None:
    """Group-by and filters on MACs, ethertype, TCP window and ICMP type/code through one generated
    pass equal the reference (lowwater_testing.oracle.pane_oracle over the traffic's own description)."""
    traffic = traffic_with_link_and_icmp(30_000, seed=21)
    qs = _each_exact(NEW_FIELD_QUERIES, traffic)
    icmp = oracle(qs[1], traffic)
    assert set(zip(icmp["k1"], icmp["k2"], strict=True)) >= {(0, 0), (3, 3), (128, 0), (135, 0), (1, 4)}
    windows = oracle(qs[2], traffic)
    assert {0, 65535} <= set(windows["k0"]) and -1 in set(windows["k0"])  # IPv6 ICMP/UDP: no window
    macs = oracle(qs[0], traffic)
    assert len(macs) >= 12 * len(np.unique(traffic.ts // (10 * NS)))


def traffic_with_gre(n: int, seed: int) -> Traffic:
    """Mixed IPv4/IPv6 outer traffic, a third of it GRE carrying IPv4 between a few hundred hosts."""
    t = make_mixed_traffic(n, 800, T0, 20 * NS, seed=seed)
    rng = np.random.default_rng(seed + 9)
    t.gre = rng.random(n) < 0.35
    t.proto = np.where(t.gre, 47, t.proto)
    t.inner_src = (0x0A320000 + rng.integers(0, 3, n) * 0x10000 + rng.integers(0, 40, n)).astype(np.uint32)
    t.inner_dst = (0xAC100000 + rng.integers(0, 600, n)).astype(np.uint32)
    return t


# fmt: off
GRE_QUERIES = {  # name: (group_by, aggregates, filter), one a line
    "inner_pairs": ("[inner_src_ip/16, inner_dst_ip]", "[{fn: count, as: n}]", "inner_ip_version == 4"),
    "inner_nets": ("[inner_dst_ip/24, ip_version]", "[{fn: sum, field: length, as: b}]", ""),
    "inner_filter": ("[dst_ip/24, protocol]", "[{fn: count, as: n}]", "inner_src_ip in [10.51.0.0/16] or inner_dst_ip == 172.16.1.1"),
}
# fmt: on


def test_inner_addresses_group_and_filter_are_exact() -> None:
    """GRE inner addresses through the kernel (prefixes cut by the inner header's family, also under
    IPv6 outer headers; absent inner addresses group as '::') equal the reference."""
    traffic = traffic_with_gre(30_000, seed=23)
    qs = _each_exact(GRE_QUERIES, traffic)
    nets = oracle(qs[1], traffic)
    absent = (nets["k0"] == 0) & (nets["k1"] == 0)
    assert absent.any() and (~absent).any() and set(nets["k2"]) == {4, 6}
    assert Q.decode_key(qs[1], np.array([0, 0, 4]))[qs[1].key_parts[0].name] == "::"


def _write_pcap_ns(path, frames, cap, wl, ts) -> None:
    import struct

    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
        for i in range(len(ts)):  # a test fixture's writer: a few thousand records
            t, k = int(ts[i]), min(int(cap[i]), int(wl[i]))  # frames shorter than 64 bytes come padded
            fh.write(struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, k, int(wl[i])))
            fh.write(bytes(frames[i, :k]))


@pytest.mark.parametrize("one_cpu", [True, False])
def test_agent_on_one_cpu_pulls_a_pcap_replay_exactly(tmp_path, monkeypatch, one_cpu: bool) -> None:
    """Pinned to one CPU the agent drives a fast pcap replay from its own loop (no reader thread, a ring of
    pull_frames slots); with more CPUs the reader has its thread. Both must give the exact aggregate and
    close every partition at the end."""
    import os

    q = make_query("lazy", 512, window="{range: 1s}", partitions=2)
    traffic = make_traffic(20_000, 900, T0, 12 * NS, seed=12)
    path = tmp_path / "t.pcap"
    _write_pcap_ns(path, *build_frames(traffic))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0} if one_cpu else {0, 1})
    monkeypatch.setattr(Agent, "pull_frames", 4096)  # several pulls, around the ring several times
    prod = RecordingProducer()
    agent = Agent(
        [q],
        {"type": "pcap", "path": str(path), "mode": "fast", "progress": False},
        "h1",
        None,
        ring_slots=1 << 16,
        producer=prod,
    )
    assert agent.pull == one_cpu
    assert agent.ring.nslots == (4096 if one_cpu else 1 << 16)
    assert agent.ring.zero_copy == one_cpu  # pulled: the kernel reads the frames where they lie in the file
    agent.run()
    assert agent.source.finished and agent.source.error is None
    assert (agent.source._thread is None) == one_cpu
    panes, keys, states, closed = [], [], [], set()
    for _topic, part, value in prod.sent:
        b = wire.decode(value)
        if isinstance(b, wire.Punctuation):
            if b.mark_pane == wire.END_OF_STREAM:
                closed.add(part)
        else:
            panes.append(b.pane)
            keys.append(b.key)
            states.append(b.state)
    assert closed == {0, 1}
    got = merge_partials(q, np.concatenate(panes), np.concatenate(keys), np.concatenate(states))
    assert got.equals(oracle(q, traffic))
