"""The capture agent end to end against the real Kafka broker: a pcap replayed by the real
``lowwater-agent`` process, partials and punctuation read back from Kafka, merged, and compared with
an independent offline aggregate of the same file computed with dpkt."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import dpkt

from contract import fields as F
from contract import query as Q
from contract import wire
from tests.packets import build_frames, make_traffic
from tests.topic_reader import read_topic

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def write_pcap(path: Path, n: int, groups: int, span_s: int, seed: int) -> None:
    t = make_traffic(n, groups, T0, span_s * NS, seed=seed)
    frames, cap, wl, ts = build_frames(t)
    with path.open("wb") as fh:
        w = dpkt.pcap.Writer(fh, nano=True)
        for i in range(n):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / 1_000_000_000)
    # dpkt float timestamps lose ns precision; the oracle below reads the same file back, so it agrees


def dpkt_oracle(path: Path, pane_ns: int) -> Counter:
    """Packets per (pane, src, dst) computed by dpkt from the file: independent of our parser."""
    out: Counter = Counter()
    with path.open("rb") as fh:
        for ts, buf in dpkt.pcap.Reader(fh):
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
            ts_ns = int(Decimal(ts) * 1_000_000_000)  # the nanosecond reader gives exact Decimals
            src = F.ip_to_words(socket.inet_ntoa(ip.src))[1]
            dst = F.ip_to_words(socket.inet_ntoa(ip.dst))[1]
            out[(ts_ns // pane_ns, src, dst)] += 1
    return out


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, wire.Partials | wire.Punctuation]]:
    return [(p, wire.decode(v)) for p, vals in read_topic(bootstrap, topic, partitions).items() for v in vals]


def test_agent_replays_pcap_to_kafka_exactly(kafka, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory(partitions=3)
    cfg = tmp_path / "q.yaml"
    cfg.write_text(f"""
queries:
  - name: pairs
    group_by: [src_ip, dst_ip]
    aggregates: [{{fn: count, as: packets}}]
    window: {{range: 2s}}
    table: {{size: 1024}}
    flush: {{policy: lazy, m: 2}}
    kafka: {{topic: {topic}, partitions: 3}}
""")
    pcap = tmp_path / "t.pcap"
    write_pcap(pcap, 30_000, 3000, 20, seed=11)
    proc = subprocess.run(
        [sys.executable, "-m", "low_level.cli", "--config", str(cfg), "--source", f"pcap:{pcap}",
         "--host-id", "cap-1", "--bootstrap", kafka.bootstrap_servers, "--metrics-port", "0"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    q = Q.load(cfg).queries[0]
    batches = read_all(kafka.bootstrap_servers, topic, 3)
    got: Counter = Counter()
    ends = set()
    seq: dict[int, int] = {}
    mark: dict[int, int] = {}
    for part, b in batches:
        assert b.host == "cap-1" and b.partition == part
        if isinstance(b, wire.Partials):
            assert b.pane.min() >= mark.get(part, -(2**63)), "partial after a punctuation that covers it"
            seq[part] = seq.get(part, 0) + b.n
            for p, k, s in zip(b.pane, b.key, b.state, strict=True):
                got[(int(p), int(k[1]), int(k[3]))] += int(s[0])
        else:
            assert b.seq == seq.get(part, 0)
            mark[part] = b.mark_pane
            if b.mark_pane == wire.END_OF_STREAM:
                ends.add(part)
    assert ends == {0, 1, 2}, "every partition must receive the closing punctuation"
    assert got == dpkt_oracle(pcap, q.window.pane_ns)
