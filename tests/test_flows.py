"""Flow collection: NetFlow v5/v9/IPFIX exported by softflowd from a pcap decodes to the records nfdump
(nfcapd) decodes from the same datagrams; their weighted sub-aggregation gives nfdump's per-window
totals per (src, dst); sampling renormalises; bad datagrams are counted by reason and never crash."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from contract import fields as F
from contract import query as Q
from contract import wire
from low_level.flows.kernel import FlowKernel
from low_level.flows.source import FlowCollector
from low_level.kernel.tables import Tables
from lowwater_testing.flows import (
    FIELDS,
    flow_agent,
    flow_pcap,
    flow_query,
    flow_record,
    flowset,
    free_udp_port,
    nfdump_ms,
    nfdump_records,
    partials_counts,
    send_datagrams,
    softflowd_export,
    template,
    v9,
    wait_udp,
    write_flow_config,
)

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
PEERS = shutil.which("softflowd") and shutil.which("nfcapd") and shutil.which("nfdump")
needs_peers = pytest.mark.skipif(
    not PEERS, reason="softflowd / nfdump not installed (./lw setup installs them)"
)


def _nfdump(datagrams: list[bytes], tmp: Path) -> list[tuple]:
    """nfcapd collects the datagrams, nfdump lists the records: (end ms, src, dst, sport, dport, pkts, bytes)."""
    d = tmp / "nfcapd"
    d.mkdir(exist_ok=True)
    port = free_udp_port()
    cap = subprocess.Popen(
        ["nfcapd", "-p", str(port), "-b", "127.0.0.1", "-w", str(d), "-t", "3600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_udp(port, read=False)  # nfcapd has no ready line: listening once its socket is bound
        send_datagrams(datagrams, port, gap_s=0.0005)
        wait_udp(port)  # every datagram read before the stop
    finally:
        cap.terminate()
        cap.wait(10)
    files = sorted(str(p) for p in d.iterdir() if p.name.startswith("nfcapd."))
    assert files
    # %te, not %ter: nfdump 1.7.1 prints %ter's milliseconds without their leading digit
    return [
        (nfdump_ms(te), sa, da, int(sp), int(dp), int(pk), int(by))
        for te, sa, da, sp, dp, pk, by in nfdump_records("%te,%sa,%da,%sp,%dp,%pkt,%byt", "-r", files[-1])
    ]


def _records(col: FlowCollector) -> list[tuple]:
    b = col.decode()
    r = b.rows[: b.n]
    return [
        (
            int(x[F.TS]) // 1_000_000,
            F.words_to_ip(int(x[F.SRC_HI]), int(x[F.SRC_LO])),
            F.words_to_ip(int(x[F.DST_HI]), int(x[F.DST_LO])),
            int(x[F.SPORT]),
            int(x[F.DPORT]),
            int(w),
            int(x[F.LEN]),
        )
        for x, w in zip(r, b.weights[: b.n], strict=True)
    ]


def _aggregate(q: Q.QuerySpec, rows: np.ndarray, weights: np.ndarray, chunk: int = 512) -> Counter:
    """The flow kernel over the records: merged (pane, src, dst) -> [packets, bytes]."""
    tables = Tables.build([q], chunk=chunk)
    k = FlowKernel(tables)
    parts = []
    for s in range(0, len(rows), chunk):
        e = min(len(rows), s + chunk)
        k.run(np.ascontiguousarray(rows[s:e]), np.ascontiguousarray(weights[s:e]), e - s)
        parts.append(tables.drain(0))
    return _merged(k, tables, parts)


def _merged(k: FlowKernel, tables: Tables, parts: list[np.ndarray]) -> Counter:
    """Flush the table, then the drained partials merged: (pane, src, dst) -> [packets, bytes]."""
    k.flush_below(0, wire.END_OF_STREAM)
    parts.append(tables.drain(0))
    pane, key, state = tables.split(0, np.concatenate(parts))
    got: Counter = Counter()
    for p, kk, st in zip(pane, key, state, strict=True):
        got[(int(p), int(kk[1]), int(kk[3]), "packets")] += int(st[0])
        got[(int(p), int(kk[1]), int(kk[3]), "bytes")] += int(st[1])
    return got


@needs_peers
@pytest.mark.parametrize("version", ["5", "9", "10"])
def test_softflowd_export_decodes_as_nfdump_decodes_it(version: str, tmp_path: Path) -> None:
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 6000, seed=4)
    datagrams, sent = softflowd_export(pcap, version, tmp_path)
    col = FlowCollector()
    col.feed(datagrams)
    mine = sorted(_records(col))
    assert col.errs[1:].sum() == 0, col.stats()
    theirs = sorted(_nfdump(datagrams, tmp_path))
    assert sent is None or len(mine) == sent  # every record softflowd sent was received and decoded
    assert len(mine) == len(theirs) > 100
    # nfdump leaves a v9/v5 end time at 0 when it precedes the exporter's boot (uptime wrap); we do not
    timed = [r for r in theirs if r[0]]
    assert len(timed) >= 0.95 * len(theirs)
    assert Counter(r[1:] for r in mine) == Counter(r[1:] for r in theirs)
    assert Counter(timed) <= Counter(mine)
    assert max(r[5] for r in mine) > 1  # flows of several packets: weights matter


@needs_peers
def test_per_window_totals_per_pair_equal_nfdumps(tmp_path: Path) -> None:
    """pcap -> softflowd (IPFIX) -> lowwater's decoder and weighted kernel, and -> nfcapd/nfdump: per 1 s
    pane (by end time) and (src, dst), packets and bytes agree."""
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 8000, seed=7)
    datagrams, _ = softflowd_export(pcap, "10", tmp_path)
    col = FlowCollector()
    col.feed(datagrams)
    b = col.decode()
    q = flow_query(size=64)  # small table: evictions and overdue one-record partials happen too
    got = _aggregate(q, b.rows[: b.n].copy(), b.weights[: b.n].copy())
    want: Counter = Counter()
    for ms, sa, da, _sp, _dp, pk, by in _nfdump(datagrams, tmp_path):
        pane = (ms * 1_000_000 - q.window.origin_ns) // q.window.pane_ns
        src, dst = F.ip_to_words(sa)[1], F.ip_to_words(da)[1]
        want[(pane, F.to_int64(src), F.to_int64(dst), "packets")] += pk
        want[(pane, F.to_int64(src), F.to_int64(dst), "bytes")] += by
    assert got == want
    assert sum(v for k, v in want.items() if k[3] == "packets") == 8000


@needs_peers
def test_fused_decode_and_fold_equals_decode_then_fold_and_carries_rows_past_a_full_output(
    tmp_path: Path,
) -> None:
    """The agent's path (FlowKernel.take: decode and fold in one compiled call) gives exactly the partials
    of decoding then folding; with a 64-record chunk its output regions fill mid-batch, so decoded rows
    wait (the carry) for a drain and are folded by the next call, none lost or folded twice."""
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 8000, seed=7)
    datagrams, _ = softflowd_export(pcap, "10", tmp_path)
    q = flow_query(size=64)
    ref = FlowCollector()
    ref.feed(datagrams)
    b = ref.decode()
    want = _aggregate(q, b.rows[: b.n].copy(), b.weights[: b.n].copy())
    tables = Tables.build([q], chunk=64)
    k = FlowKernel(tables)
    col = FlowCollector()
    parts, carried = [], []

    def after() -> None:
        parts.append(tables.drain(0))
        carried.append(int(col.carry[1] - col.carry[0]))

    col.feed(datagrams)
    assert k.take(col, after) == b.n == col.records
    assert _merged(k, tables, parts) == want
    assert max(carried) > 0 and carried[-1] == 0  # rows did wait for a drain; none are left
    assert col.pending == 0 and col.datagrams == len(datagrams) and col.errs[0] == ref.errs[0]


def test_weighted_kernel_is_exact_under_disorder() -> None:
    """Synthetic records, shuffled: count adds the weight (in the table and in overdue partials)."""
    rng = np.random.default_rng(3)
    n = 20_000
    rows = np.zeros((n, F.NFIELDS), np.int64)
    rows[:, F.TS] = T0 + np.sort(rng.integers(0, 30 * NS, n))
    rows[:, F.TS] += rng.integers(-3 * NS, 1, n)  # records end up to 3 s out of order
    rows[:, F.IPVER] = 4
    rows[:, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | (0x0A000000 + rng.integers(0, 40, n))
    rows[:, F.DST_LO] = F.IPV4_MAPPED_PREFIX | (0xC0A80000 + rng.integers(0, 30, n))
    rows[:, F.LEN] = rng.integers(40, 100_000, n)
    w = rng.integers(1, 500, n).astype(np.int64)
    q = flow_query(size=128, m=1)
    got = _aggregate(q, rows, w)
    want: Counter = Counter()
    pane = (rows[:, F.TS] - q.window.origin_ns) // q.window.pane_ns
    for p, r, wi in zip(pane, rows, w, strict=True):
        want[(int(p), int(r[F.SRC_LO]), int(r[F.DST_LO]), "packets")] += int(wi)
        want[(int(p), int(r[F.SRC_LO]), int(r[F.DST_LO]), "bytes")] += int(r[F.LEN])
    assert got == want


def test_sampling_options_renormalise_and_templates_are_per_domain() -> None:
    """A v9 options record says 1-in-100: records count 100x, per (exporter, domain); the same template
    id means different layouts in two domains; an unknown or expired template is counted, not guessed."""
    opts = flowset(
        1,
        (300).to_bytes(2, "big")
        + (4).to_bytes(2, "big")
        + (8).to_bytes(2, "big")
        + b"\x00\x01\x00\x04"
        + b"\x00\x22\x00\x04"
        + b"\x00\x23\x00\x01",
    )
    opt_data = flowset(300, b"\x00\x00\x00\x00" + (100).to_bytes(4, "big") + b"\x02")
    col = FlowCollector()
    col.feed(
        [
            v9(1, [template(256, FIELDS), opts, opt_data]),
            v9(1, [flowset(256, flow_record(0x0A000001, 0x0A000002, 3, 300, 9_000))]),
            v9(2, [template(256, list(reversed(FIELDS)))]),
            v9(
                2,
                [
                    flowset(
                        256,
                        bytes([17])
                        + (9_500).to_bytes(4, "big")
                        + (70).to_bytes(4, "big")
                        + (1).to_bytes(4, "big")
                        + (0x0A000009).to_bytes(4, "big")
                        + (0x0A000003).to_bytes(4, "big"),
                    )
                ],
            ),
            v9(3, [flowset(256, flow_record(1, 2, 3, 4, 5))]),  # domain 3 never defined template 256
            v9(
                1, [flowset(256, flow_record(1, 2, 3, 4, 5))], clock_s=1_700_000_010 + 4000
            ),  # template too old
        ]
    )
    b = col.decode()
    assert b.n == 2
    r = b.rows
    assert (b.weights[0], r[0, F.LEN], b.sampling_rate[0]) == (300, 30_000, 100)
    assert r[0, F.TS] == 1_700_000_010 * NS - 1_000 * 1_000_000  # end = export clock - (uptime - last)
    assert (b.weights[1], r[1, F.LEN], b.sampling_rate[1], r[1, F.PROTO]) == (1, 70, 1, 17)
    assert (
        r[1, F.DST_LO] == F.IPV4_MAPPED_PREFIX | 0x0A000009
        and r[1, F.SRC_LO] == F.IPV4_MAPPED_PREFIX | 0x0A000003
    )
    st = col.stats()
    assert st["errors"]["unknown_template"] == 1 and st["errors"]["expired_template"] == 1
    assert st["sampling_rate"] == {
        "('127.0.0.1', 0)/1": 100,
        "('127.0.0.1', 0)/2": 1,
        "('127.0.0.1', 0)/3": 1,
    }


def test_low_water_mark_follows_the_slowest_exporter_and_late_records_are_counted() -> None:
    col = FlowCollector()
    col.timeouts.inactive_ns, col.timeouts.slack_ns = 15 * NS, 1 * NS
    col.feed([v9(1, [template(256, FIELDS)], clock_s=1_700_000_100)], exporter=("10.0.0.1", 2055))
    col.feed([v9(1, [template(256, FIELDS)], clock_s=1_700_000_060)], exporter=("10.0.0.2", 2055))
    col.decode()
    assert col.clock_mark_ns() == (1_700_000_060 - 16) * NS  # the slower exporter holds the mark
    # exporter 2 silent for longer than exporter_timeout: it stops holding the mark
    assert col.clock_mark_ns(now_ns=(1_700_000_060 + 301) * NS) == (1_700_000_100 - 16) * NS
    # a record ending before the promised mark is late
    col.feed(
        [v9(1, [flowset(256, flow_record(1, 2, 1, 60, 1_000))], clock_s=1_700_000_100, uptime_ms=100_000)],
        exporter=("10.0.0.1", 2055),
    )
    col.decode()
    assert col.late_records == 1


def test_fuzzed_datagrams_are_counted_never_crash() -> None:
    """Random bytes and mutated real-looking datagrams (v5, v9, IPFIX): every datagram is counted once
    (read whole, or under one reason), nothing is read outside its bytes."""
    rng = np.random.default_rng(0)
    base = [v9(1, [template(256, FIELDS), flowset(256, flow_record(1, 2, 3, 4, 5) * 20)])]
    v5 = bytearray(24 + 48 * 2)
    v5[0:2] = (5).to_bytes(2, "big")
    v5[2:4] = (2).to_bytes(2, "big")
    base.append(bytes(v5))
    ipfix = bytearray(v9(7, [template(256, FIELDS), flowset(256, flow_record(1, 2, 3, 4, 5) * 20)]))
    ipfix[0:2] = (10).to_bytes(2, "big")
    del ipfix[4:8]  # IPFIX has no uptime word
    ipfix[2:4] = len(ipfix).to_bytes(2, "big")
    ipfix[16:18] = (2).to_bytes(2, "big")  # template set id
    base.append(bytes(ipfix))
    vt = [(8, 4), (82, 0xFFFF), (12, 4), (2, 4), (1, 0xFFFF), (153, 8)]
    vtmpl = flowset(
        2, b"\x01\x2c\x00\x06" + b"".join(i.to_bytes(2, "big") + n.to_bytes(2, "big") for i, n in vt)
    )
    vrec = bytes(4) + _varlen(b"eth0") + bytes(8) + _varlen(b"\x05", True) + bytes(8)
    base.append(_ipfix(5, [vtmpl, flowset(300, vrec * 10)]))  # variable-length fields (RFC 7011 7)
    col = FlowCollector(capacity=1 << 16, buffer_bytes=1 << 23)
    total = 0
    for rnd in range(40):
        grams = []
        for _ in range(500):
            x = bytearray(base[int(rng.integers(0, len(base)))])
            if rng.random() < 0.2:
                x = bytearray(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes())
            else:
                for _ in range(int(rng.integers(1, 6))):
                    if len(x):
                        x[int(rng.integers(0, len(x)))] = int(rng.integers(0, 256))
                x = x[: int(rng.integers(0, len(x) + 1))] if rng.random() < 0.3 else x
            grams.append(bytes(x))
        col.feed(grams, exporter=("fuzz", rnd % 3))
        while col.pending:
            col.decode()
        total += len(grams)
    st = col.stats()
    assert col.datagrams == total
    assert col.records > 0 and sum(st["errors"].values()) > 0
    assert {"truncated", "wrong_version", "bad_set_length", "unknown_template"} <= {
        k for k, v in st["errors"].items() if v
    }


@needs_peers
def test_flow_agent_to_kafka_matches_nfdump(kafka, topic_factory, tmp_path: Path) -> None:
    """softflowd's IPFIX export of a pcap, sent to ``lowwater-agent --source flows:...`` and to nfcapd:
    the partials in Kafka roll up to nfdump's per-window packets and bytes per (src, dst), and the
    closing punctuation covers them."""
    topic = topic_factory(partitions=2)
    cfg = tmp_path / "q.yaml"
    write_flow_config(cfg, "pairs", ["src_ip", "dst_ip"], "2s", topic, 2)
    pcap = tmp_path / "t.pcap"
    flow_pcap(pcap, 5000, seed=12)
    datagrams, _ = softflowd_export(pcap, "10", tmp_path)
    port = free_udp_port()
    source = f"flows:127.0.0.1:{port},inactive=15"
    with flow_agent(cfg, source, kafka.bootstrap_servers, summary=tmp_path / "summary.json") as agent:
        send_datagrams(datagrams, port, gap_s=0.0005)  # all read before the agent stops (flow_agent)
    assert agent.returncode == 0, agent.log_tail()
    q = Q.load(cfg).queries[0]
    got, marks = partials_counts(kafka.bootstrap_servers, topic, 2, (1, 3))
    want: Counter = Counter()
    for ms, sa, da, _sp, _dp, pk, by in _nfdump(datagrams, tmp_path):
        pane = (ms * 1_000_000 - q.window.origin_ns) // q.window.pane_ns
        src, dst = F.to_int64(F.ip_to_words(sa)[1]), F.to_int64(F.ip_to_words(da)[1])
        want[(pane, src, dst, "packets")] += pk
        want[(pane, src, dst, "bytes")] += by
    assert got == want
    # the mark is what the exporter promised (its clock - inactive - slack), not the stop: it may still send
    clock_ns = max(int.from_bytes(x[4:8], "big") for x in datagrams) * NS
    assert marks == {p: (clock_ns - 17 * NS - q.window.origin_ns) // q.window.pane_ns for p in (0, 1)}
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["source"]["records"] > 0 and summary["source"]["late_records"] == 0


def _ipfix(domain: int, sets: list[bytes], clock_s: int = 1_700_000_010) -> bytes:
    body = b"".join(sets)
    return (
        (10).to_bytes(2, "big")
        + (16 + len(body)).to_bytes(2, "big")
        + clock_s.to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + domain.to_bytes(4, "big")
        + body
    )


def _varlen(value: bytes, long: bool = False) -> bytes:
    """RFC 7011 7: a 1-byte length prefix, or 255 and a 2-byte length (the 3-byte form)."""
    return (b"\xff" + len(value).to_bytes(2, "big") if long else bytes([len(value)])) + value


def test_ipfix_variable_length_fields_are_skipped_or_read() -> None:
    """Templates with length-65535 fields: records walk the 1- and 3-byte prefixes, a variable-length IE
    lowwater reads (octetDeltaCount) is decoded from its own length, later fixed fields are found."""
    var = 0xFFFF
    fields = [(8, 4), (82, var), (12, 4), (2, 4), (1, var), (153, 8), (96, var), (4, 1)]
    tmpl = flowset(
        2,
        (300).to_bytes(2, "big")
        + len(fields).to_bytes(2, "big")
        + b"".join(i.to_bytes(2, "big") + n.to_bytes(2, "big") for i, n in fields),
    )

    def rec(src: int, name: bytes, pkts: int, octets: bytes, app: bytes, long: bool) -> bytes:
        return (
            src.to_bytes(4, "big")
            + _varlen(name)
            + (0x0A000002).to_bytes(4, "big")
            + pkts.to_bytes(4, "big")
            + _varlen(octets)
            + (1_700_000_009_500).to_bytes(8, "big")
            + _varlen(app, long)
            + bytes([17])
        )

    data = flowset(
        300,
        rec(0x0A000001, b"eth0", 3, (900).to_bytes(4, "big"), b"dns", False)
        + rec(0x0A000003, b"", 5, (70_000).to_bytes(8, "big"), b"x" * 300, True)
        + rec(0x0A000004, b"a" * 254, 1, (60).to_bytes(2, "big"), b"", True),
    )
    col = FlowCollector()
    col.feed([_ipfix(1, [tmpl, data])])
    b = col.decode()
    assert col.errs[1:].sum() == 0, col.stats()
    r = b.rows
    assert b.n == 3
    assert [int(r[i, F.SRC_LO]) & 0xFFFFFFFF for i in range(3)] == [0x0A000001, 0x0A000003, 0x0A000004]
    assert list(b.weights[:3]) == [3, 5, 1] and list(r[:3, F.LEN]) == [900, 70_000, 60]
    assert (r[:3, F.PROTO] == 17).all() and (r[:3, F.TS] == 1_700_000_009_500 * 1_000_000).all()
    assert (r[:3, F.DST_LO] == F.IPV4_MAPPED_PREFIX | 0x0A000002).all()
    # a record whose prefix overruns its set is counted, the records before it stand
    cut = flowset(300, rec(0x0A000001, b"eth0", 3, b"\x01", b"", False) + b"\x05\x00\x00\x00\xc8" + bytes(24))
    col.feed([_ipfix(1, [cut])])
    b = col.decode()
    assert b.n == 1 and col.stats()["errors"]["bad_set_length"] == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_batched_receive_keeps_each_senders_datagrams_exact(host: str) -> None:
    """Datagrams from two senders over loopback (IPv4, IPv6), taken many per recvmmsg call (here at most
    4: a 4-slot buffer) and decoded a batch per call: every datagram lands under its own sender, in full,
    and the per-exporter counts are exact however the batches cut the stream."""
    col = FlowCollector(host=host, batch=4).open()
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    txs = [socket.socket(fam, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for tx in txs:
            tx.bind((host, 0))
            tx.sendto(v9(1, [template(256, FIELDS)]), (host, col.port))
        recs = {0: 0, 1: 0}
        for i in range(30):  # alternating senders; sender 1's datagrams carry 3 records, sender 0's 1
            s = i % 2
            body = b"".join(flow_record(0x0A000001 + i, 0x0A000002, 1, 60, 9_000) for _ in range(1 + 2 * s))
            txs[s].sendto(v9(1, [flowset(256, body)]), (host, col.port))
            recs[s] += 1 + 2 * s
        takes = []
        deadline = time.monotonic() + 30
        while col.datagrams < 32 and time.monotonic() < deadline:
            got = col.receive()
            if got:
                takes.append(got)
            while col.pending:
                col.decode()
        assert col.datagrams == 32 and max(takes) <= 4 and col.records == recs[0] + recs[1]
        st = col.stats()
        for s, tx in enumerate(txs):
            name = f"{tx.getsockname()}/1"  # the sender as recvfrom names it
            assert st["sources"][name] == {"datagrams": 16, "records": recs[s], "templates": 1}
        assert st["datagrams_ok"] == 32 and not any(st["errors"].values())
    finally:
        col.close()
        for tx in txs:
            tx.close()


def test_a_datagram_longer_than_its_slot_is_counted_and_the_slots_grow() -> None:
    """Receive slots are dense (2 KiB first, not 64 KiB): a longer datagram is cut by the kernel, which
    MSG_TRUNC reports. It is counted under ``cut_at_receive``, never decoded short; the slots grow to it,
    so the next datagram as long is taken whole, and a datagram that fits is never cut."""
    from low_level.flows.receive import MIN_SLOT

    col = FlowCollector(batch=8).open()
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        small = v9(
            1, [template(256, FIELDS), flowset(256, flow_record(0x0A000001, 0x0A000002, 1, 60, 9_000))]
        )
        body = b"".join(flow_record(0x0A000001 + i, 0x0A000002, 1, 60, 9_000) for i in range(150))
        big = v9(1, [flowset(256, body)])
        assert len(small) < MIN_SLOT < len(big) < 2 * MIN_SLOT
        deadline = time.monotonic() + 30

        def take(datagrams: int) -> None:
            while col.datagrams < datagrams and time.monotonic() < deadline:
                col.receive()
                while col.pending:
                    col.decode()

        tx.sendto(small, ("127.0.0.1", col.port))
        tx.sendto(big, ("127.0.0.1", col.port))
        take(2)
        st = col.stats()
        assert col.datagrams == 2 and col.records == 1 and st["errors"]["cut_at_receive"] == 1
        tx.sendto(big, ("127.0.0.1", col.port))
        take(3)
        assert col.rx is not None and col.rx.slot == 2 * MIN_SLOT
        assert col.records == 151 and col.stats()["errors"]["cut_at_receive"] == 1
        assert col.stats()["datagrams_ok"] == 2
    finally:
        col.close()
        tx.close()
