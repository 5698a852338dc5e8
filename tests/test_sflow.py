"""sFlow v5 collection on the ``flows:`` source: flow samples (compact and expanded) go through the packet
parser and count ``sampling_rate`` packets and ``sampling_rate x frame_length`` bytes at their datagram's
arrival time; counter samples become per (agent, ifIndex) interface counters; each (agent, sub-agent)
holds the low-water mark; pmacct's sfprobe export of a pcap decodes to the pcap's packets, and through a
real agent and Kafka rolls up to sfacctd's per-window totals per (src, dst)."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

import dpkt
import numpy as np
import pytest

from contract import fields as F
from contract import query as Q
from low_level.flows import layout as D
from low_level.flows.source import FlowCollector
from lowwater_testing.flows import flow_agent, flow_pcap, partials_counts, write_flow_config
from lowwater_testing.sflow import (
    Sfacctd,
    counter_sample,
    datagram,
    flow_sample,
    frame,
    free_udp_port,
    header_record,
    send_in_bursts,
    sfprobe_export,
    u32,
)

NS = 1_000_000_000
T = 1_700_000_123 * NS
PEERS = shutil.which("pmacctd") and shutil.which("sfacctd")
needs_peers = pytest.mark.skipif(not PEERS, reason="pmacct not installed (./lw setup installs it)")
A, B = 0x0A000001, 0xC0A80002


def test_flow_and_counter_samples_decode_weighted_by_the_sampling_rate() -> None:
    fr1 = frame(A, B, 1234, 53, payload=200)
    fr2 = frame(B, A, 443, 5555, payload=40, proto=6)
    switch = u32(1001, 16, 7, 0, 7, 0)  # an extended switch record before the header: skipped
    col = FlowCollector()
    col.feed(
        [
            datagram(
                [
                    flow_sample([header_record(fr1)], rate=100, in_if=3),
                    flow_sample([switch, header_record(fr2, snap=60)], rate=7, in_if=9, expanded=True),
                    counter_sample(3, in_octets=10**12, out_octets=5),
                ],
                agent="10.9.9.9",
            ),
            datagram([counter_sample(3, 77, 88, expanded=True)], agent="2001:db8::1", sub_agent=2),
        ],
        arrival_ns=T,
    )
    b = col.decode()
    assert b.n == 2 and col.errs[1:].sum() == 0, col.stats()
    r = b.rows
    assert r[0, F.IPVER] == 4 and r[0, F.SRC_LO] == F.IPV4_MAPPED_PREFIX | A
    assert (r[0, F.SPORT], r[0, F.DPORT], r[0, F.PROTO], r[0, F.IFACE], r[0, F.TS]) == (1234, 53, 17, 3, T)
    assert (b.weights[0], r[0, F.LEN], b.sampling_rate[0]) == (100, 100 * (len(fr1) + 4), 100)
    assert (r[1, F.SPORT], r[1, F.DPORT], r[1, F.PROTO], r[1, F.TCP_FLAGS], r[1, F.IFACE]) == (
        443,
        5555,
        6,
        0x12,
        9,
    )
    assert (b.weights[1], r[1, F.LEN]) == (7, 7 * (len(fr2) + 4))
    st = col.stats()
    assert st["datagrams_ok"] == 2
    ifs = {(x["source"], x["ifindex"]): x for x in st["interfaces"]}
    assert ifs[("sflow:10.9.9.9/0", 3)]["in_octets"] == 10**12
    assert (
        ifs[("sflow:10.9.9.9/0", 3)]["in_packets"] == 103 and ifs[("sflow:10.9.9.9/0", 3)]["speed"] == 10**10
    )
    assert ifs[("sflow:2001:db8::1/2", 3)]["out_octets"] == 88
    assert set(st["sampling_rate"]) == {"sflow:10.9.9.9/0", "sflow:2001:db8::1/2"}


def test_each_agent_and_sub_agent_holds_the_mark() -> None:
    """The mark is the oldest (agent, sub-agent) arrival minus slack; NetFlow exporters add inactive."""
    col = FlowCollector()
    col.timeouts.slack_ns, col.timeouts.inactive_ns = 1 * NS, 15 * NS
    s = [flow_sample([header_record(frame(A, B, 1, 2))], rate=1, in_if=1)]
    col.feed([datagram(s, agent="10.0.0.1", sub_agent=0)], arrival_ns=T)
    col.feed([datagram(s, agent="10.0.0.1", sub_agent=1)], arrival_ns=T + 5 * NS)
    col.feed([datagram(s, agent="10.0.0.1", sub_agent=0)], arrival_ns=T + 8 * NS)
    col.decode()
    assert col.clock_mark_ns() == T + 4 * NS  # sub-agent 1 (last heard at T+5) holds it
    live = col.doms[:, D.D_VALID] == 1
    assert live.sum() == 2 and set(col.doms[live, D.D_KIND]) == {D.KIND_SFLOW}


def test_bad_sflow_is_counted_by_reason_never_crashes() -> None:
    rng = np.random.default_rng(5)
    good = datagram(
        [
            flow_sample([header_record(frame(A, B, 1, 2))], rate=3, in_if=1),
            flow_sample([header_record(frame(A, B, 3, 4))], rate=3, in_if=1, expanded=True),
            counter_sample(1, 5, 6),
        ]
    )
    # a header of another protocol (IPv4, 11), a sample with no header record, an unknown sample format
    odd = datagram(
        [
            u32(1, 32 + 8 + 16 + 4, 1, 1, 1, 0, 0, 1, 0, 1) + u32(1, 20, 11, 60, 0, 4) + b"\x45\0\0\0",
            flow_sample([], rate=1, in_if=1),
            u32(7, 4, 0),
        ]
    )
    col = FlowCollector(buffer_bytes=1 << 23)
    col.feed([odd])
    col.decode()
    e = col.stats()["errors"]
    assert (
        e["sflow_header_not_ethernet"] == 1 and e["sflow_no_header"] == 1 and e["sflow_unknown_sample"] == 1
    )
    total = 1
    for _ in range(20):
        grams = []
        for _ in range(400):
            x = bytearray(good)
            for _ in range(int(rng.integers(1, 6))):
                x[int(rng.integers(0, len(x)))] = int(rng.integers(0, 256))
            if rng.random() < 0.3:
                x = x[: int(rng.integers(0, len(x) + 1))]
            grams.append(bytes(x))
        col.feed(grams)
        while col.pending:
            col.decode()
        total += len(grams)
    st = col.stats()
    assert col.datagrams == total and col.records > 0
    assert st["errors"]["sflow_bad_sample"] > 0 and st["errors"]["truncated"] > 0


def _flow_samples(gram: bytes) -> int:
    """Flow samples (formats 1 and 3) in an sFlow datagram from an IPv4 agent, walked in Python."""
    n, p, got = int.from_bytes(gram[24:28], "big"), 28, 0
    for _ in range(n):
        fmt, length = int.from_bytes(gram[p : p + 4], "big"), int.from_bytes(gram[p + 4 : p + 8], "big")
        got += fmt in (1, 3)
        p += 8 + length
    return got


def _pcap_packets(pcap: Path) -> Counter:
    got: Counter = Counter()
    with pcap.open("rb") as fh:
        for _ts, buf in dpkt.pcap.Reader(fh):
            ip = dpkt.ethernet.Ethernet(buf).data
            got[
                (int.from_bytes(ip.src, "big"), int.from_bytes(ip.dst, "big"), ip.data.sport, ip.data.dport)
            ] += 1
    return got


@needs_peers
def test_sfprobe_export_decodes_to_the_pcaps_packets(tmp_path: Path) -> None:
    """pmacctd/sfprobe at 1-in-1 samples every packet: one weight-1 row per sample, each a pcap packet."""
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 3000, seed=4)
    grams = sfprobe_export(pcap, tmp_path)
    col = FlowCollector()
    col.feed(grams, arrival_ns=T)
    b = col.decode()
    assert col.errs[1:].sum() == 0, col.stats()
    r = b.rows[: b.n]
    got = Counter(
        (int(x[F.SRC_LO]) & 0xFFFFFFFF, int(x[F.DST_LO]) & 0xFFFFFFFF, int(x[F.SPORT]), int(x[F.DPORT]))
        for x in r
    )
    samples = sum(_flow_samples(x) for x in grams)
    want = _pcap_packets(pcap)
    assert b.n == samples >= 0.99 * sum(want.values())  # sfprobe may leave its last datagram unsent
    assert got <= want
    assert (b.weights[: b.n] == 1).all()


@needs_peers
@pytest.mark.parametrize("rate", [1, 10])
def test_sflow_agent_to_kafka_matches_sfacctd(rate: int, kafka, topic_factory, tmp_path: Path) -> None:
    """pmacctd/sfprobe's export of a pcap (1-in-``rate``), sent in two bursts to ``lowwater-agent --source
    flows:...`` and to sfacctd (renormalising): the partials in Kafka roll up to sfacctd's totals per
    window (by arrival) and (src, dst); the closing punctuation covers them."""
    topic = topic_factory(partitions=2)
    cfg = tmp_path / "q.yaml"
    write_flow_config(cfg, "pairs", ["src_ip", "dst_ip"], "4s", topic, 2)
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 4000, seed=12)
    grams = sfprobe_export(pcap, tmp_path, sampling_rate=rate)
    port = free_udp_port()
    peer = Sfacctd(tmp_path, renormalize=False)
    try:
        source = f"flows:127.0.0.1:{port},slack=1"
        with flow_agent(cfg, source, kafka.bootstrap_servers, summary=tmp_path / "summary.json") as agent:
            q = Q.load(cfg).queries[0]
            starts = send_in_bursts(grams, [port, peer.port], q.window.pane_ns / NS * 1)
            time.sleep(1.5)
            stop_ns = time.time_ns()
    finally:
        log = peer.stop()
    assert agent.returncode == 0, agent.log_tail()
    got, marks = partials_counts(kafka.bootstrap_servers, topic, 2, (1, 3))
    want: Counter = Counter()
    for sa, da, sec, pk, by in peer.rows():
        pane = (sec * NS - q.window.origin_ns) // q.window.pane_ns
        src, dst = F.to_int64(F.ip_to_words(sa)[1]), F.to_int64(F.ip_to_words(da)[1])
        want[(pane, src, dst, "packets")] += pk * rate
        want[(pane, src, dst, "bytes")] += by * rate
    assert want, log[-2000:]
    panes = {k[0] for k in want}
    assert panes == {(s * NS - q.window.origin_ns) // q.window.pane_ns for s in starts}  # two windows
    assert got == want
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["source"]["late_records"] == 0 and summary["source"]["datagrams_ok"] == len(grams)
    assert set(summary["source"]["sampling_rate"]) == {"sflow:10.9.9.9/0"}

    # the closing mark is the agent's last arrival minus slack (1 s): an arrival in the second burst
    def pane(t: int) -> int:
        return (t - q.window.origin_ns) // q.window.pane_ns

    lo, hi = pane(starts[-1] * NS + 3 * NS // 10 - NS), pane(stop_ns - NS)
    assert len(marks) == 2 and all(lo <= m <= hi for m in marks.values()), (marks, lo, hi)


def test_collector_metrics_per_exporter_and_reason() -> None:
    """The flow families (low_level.host.metrics) from a collector's stats: per exporter datagrams,
    records, templates and sampling rate; errors by reason; sFlow interface octets per (agent, ifIndex)."""
    from low_level.host.metrics import METRIC_NAMES, _flow_families
    from lowwater_testing.flows import FIELDS, flow_record, flowset, template, v9

    col = FlowCollector()
    col.feed(
        [v9(1, [template(256, FIELDS), flowset(256, flow_record(1, 2, 3, 4, 5) * 2)])],
        exporter=("10.0.0.1", 9),
    )
    col.feed([v9(1, [flowset(999, b"\0" * 8)])], exporter=("10.0.0.1", 9))
    s = [flow_sample([header_record(frame(A, B, 1, 2))], rate=4, in_if=1), counter_sample(7, 1000, 2000)]
    col.feed([datagram(s, agent="10.9.9.9", sub_agent=3)] * 3, arrival_ns=T)
    col.decode()
    fams = {f.name: f for f in _flow_families("r1", col.stats())}
    assert {f"{n}_total" if f.type == "counter" else n for n, f in fams.items()} <= set(METRIC_NAMES)

    def val(name: str, **labels: str) -> float:
        return next(
            x.value
            for x in fams[name].samples
            if not x.name.endswith("_created") and all(x.labels.get(k) == v for k, v in labels.items())
        )

    nf, sf = "('10.0.0.1', 9)/1", "sflow:10.9.9.9/3"
    assert (
        val("lowwater_agent_flow_datagrams", exporter=nf) == 2
        and val("lowwater_agent_flow_records", exporter=nf) == 2
    )
    assert val("lowwater_agent_flow_templates", exporter=nf) == 1
    assert (
        val("lowwater_agent_flow_datagrams", exporter=sf) == 3
        and val("lowwater_agent_flow_records", exporter=sf) == 3
    )
    assert val("lowwater_agent_flow_sampling_rate", exporter=sf) == 4
    assert val("lowwater_agent_flow_errors", reason="unknown_template") == 1
    assert val("lowwater_agent_flow_interface_octets", exporter=sf, ifindex="7", direction="out") == 2000
