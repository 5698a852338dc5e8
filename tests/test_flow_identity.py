"""Exporter identity in flow records: ``exporter`` (the datagram's source, sFlow's agent), ``in_iface``,
``out_iface``, ``next_hop``, ``src_as``/``dst_as`` and ``sampling_rate`` come from NetFlow v5, v9/IPFIX and
sFlow records; two routers sending the same ifIndex group apart by (exporter, in_iface) through the real
agent and real Kafka."""

from __future__ import annotations

import ipaddress
import struct
from collections import Counter
from pathlib import Path

import numpy as np

from contract import fields as F
from contract import query as Q
from low_level.flows.source import FlowCollector
from low_level.kernel.parse import parse_frame
from lowwater_testing import sflow as S
from lowwater_testing.flows import (
    flow_agent,
    flowset,
    free_udp_port,
    partials_counts,
    send_datagrams,
    template,
    v9,
    write_flow_config,
)

NS = 1_000_000_000
CLOCK_S = 1_700_000_010
# src, dst, packets, bytes, last (ms of uptime), proto, in ifIndex, out ifIndex, next hop, src AS, dst AS
IDENTITY_FIELDS = [
    (8, 4),
    (12, 4),
    (2, 4),
    (1, 4),
    (21, 4),
    (4, 1),
    (10, 2),
    (14, 2),
    (15, 4),
    (16, 4),
    (17, 4),
]


def _u32(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def _record(
    src: int, dst: int, pk: int, by: int, last: int, in_if: int, out_if: int, nh: int, sas: int, das: int
):
    return struct.pack("!IIIIIBHHIII", src, dst, pk, by, last, 6, in_if, out_if, nh, sas, das)


def _one(col: FlowCollector) -> np.ndarray:
    b = col.decode()
    assert b.n >= 1
    return b.rows[: b.n].copy()


def _identity(r: np.ndarray) -> tuple[int, ...]:
    """Exporter, in and out interface, next hop, source and destination AS, sampling rate of one row."""
    cols = (F.EXPORTER, F.IFACE, F.OUT_IFACE, F.NEXT_HOP, F.SRC_AS, F.DST_AS, F.SAMPLING_RATE)
    return tuple(int(r[c]) for c in cols)


def test_v5_v9_and_sflow_records_carry_exporter_interfaces_next_hop_as_and_rate() -> None:
    col = FlowCollector()
    # NetFlow v5: one record, sampling 1 in 10 in the header
    rec = struct.pack(
        "!IIIHHIIIIHHBBBBHHBBH",
        _u32("10.0.0.1"),
        _u32("10.0.0.2"),
        _u32("192.0.2.9"),
        7,
        9,
        3,
        300,
        9000,
        9500,
        1234,
        80,
        0,
        2,
        6,
        0,
        64500,
        64501,
        24,
        24,
        0,
    )
    hdr = struct.pack("!HHIIIIBBH", 5, 1, 10_000, CLOCK_S, 0, 1, 0, 0, 10)
    col.feed([hdr + rec], exporter=("127.0.0.2", 2055))
    r = _one(col)[0]
    assert _identity(r) == (_u32("127.0.0.2"), 7, 9, _u32("192.0.2.9"), 64500, 64501, 10)
    # NetFlow v9 with IEs 10, 14, 15, 16, 17
    tpl = template(300, IDENTITY_FIELDS)
    data = flowset(300, _record(1, 2, 4, 400, 9000, 5, 6, _u32("198.51.100.1"), 65001, 65002))
    col.feed([v9(3, [tpl, data])], exporter=("127.0.0.3", 9999))
    r = _one(col)[0]
    assert _identity(r) == (_u32("127.0.0.3"), 5, 6, _u32("198.51.100.1"), 65001, 65002, 1)
    # sFlow: the agent address, not the sender; extended router and gateway data for next hop and ASes
    fr = S.frame(_u32("10.1.1.1"), _u32("10.2.2.2"), 1000, 53)
    router = S.u32(1, _u32("203.0.113.7"), 24, 24)
    gateway = S.u32(1, _u32("203.0.113.7"), 65100, 65200, 65300, 1, 2, 3, 65400, 65500, 65600, 0, 100)
    recs = [S.header_record(fr), S.u32(1002, len(router)) + router, S.u32(1003, len(gateway)) + gateway]
    for expanded in (False, True):
        col.feed(
            [S.datagram([S.flow_sample(recs, 64, 11, 12, expanded)], agent="10.9.9.9")],
            exporter=("127.0.0.1", 1),
        )
        r = _one(col)[0]
        assert _identity(r) == (_u32("10.9.9.9"), 11, 12, _u32("203.0.113.7"), 65200, 65600, 64)
    # packets: 0 in every flow-only column (the full parser writes them)
    row = np.full(F.NFIELDS, -77, np.int64)
    buf = np.frombuffer(fr, np.uint8).copy()
    assert parse_frame(buf, 0, len(fr), len(fr), 1, 0, row) == 0
    assert all(
        row[c] == 0 for c in (F.EXPORTER, F.OUT_IFACE, F.NEXT_HOP, F.SRC_AS, F.DST_AS, F.SAMPLING_RATE)
    )


def test_two_exporters_same_ifindex_group_apart_through_agent_and_kafka(
    kafka, topic_factory, tmp_path: Path
) -> None:
    """127.0.0.2 and 127.0.0.3 both export records of ifIndex 5 (and 6) to ``lowwater-agent --source flows:``:
    the partials in Kafka grouped by (exporter, in_iface) are four groups, per window exactly what was sent."""
    topic = topic_factory(partitions=1)
    cfg = tmp_path / "q.yaml"
    write_flow_config(cfg, "by_iface", ["exporter", "in_iface"], "2s", topic, 1)
    rng = np.random.default_rng(29)
    sent: dict[str, list[bytes]] = {}
    want: Counter = Counter()
    q = Q.load(cfg).queries[0]
    for exp in ("127.0.0.2", "127.0.0.3"):
        grams = []
        for g in range(20):
            recs = []
            for _ in range(10):
                in_if, pk, by, last = (
                    int(rng.integers(5, 7)),
                    int(rng.integers(1, 50)),
                    0,
                    int(rng.integers(2000, 10_000)),
                )
                by = pk * int(rng.integers(40, 1500))
                recs.append(_record(1, 2, pk, by, last, in_if, 1, 0, 0, 0))
                end_ns = CLOCK_S * NS - (10_000 - last) * 1_000_000
                pane = (end_ns - q.window.origin_ns) // q.window.pane_ns
                want[(pane, _u32(exp), in_if, "packets")] += pk
                want[(pane, _u32(exp), in_if, "bytes")] += by
            sets = ([template(300, IDENTITY_FIELDS)] if g == 0 else []) + [flowset(300, b"".join(recs))]
            grams.append(v9(0, sets))
        sent[exp] = grams
    port = free_udp_port()
    source = f"flows:127.0.0.1:{port},inactive=15"
    with flow_agent(cfg, source, kafka.bootstrap_servers, host="routers") as agent:
        for exp, grams in sent.items():
            send_datagrams(grams, port, source=exp)
    assert agent.returncode == 0, agent.log_tail()
    got, _ = partials_counts(kafka.bootstrap_servers, topic, 1, (0, 1))
    assert got == want
    assert {(e, i) for _, e, i, _ in got} == {(_u32(e), i) for e in sent for i in (5, 6)}
