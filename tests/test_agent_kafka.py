"""The capture agent end to end against the real Kafka broker: a pcap replayed by the real
``lowwater-agent`` process, partials and punctuation read back from Kafka, merged, and compared with
an independent offline aggregate of the same file computed with dpkt."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from contract import query as Q
from contract import wire
from lowwater_testing.agent import dpkt_oracle, run_agent, write_pcap
from lowwater_testing.queries import config, pairs
from lowwater_testing.topics import read_all

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


# dpkt float timestamps lose ns precision; the oracle below reads the same file back, so it agrees


def test_agent_replays_pcap_to_kafka_exactly(kafka, topic_factory, tmp_path: Path) -> None:
    topic = topic_factory(partitions=3)
    cfg = tmp_path / "q.yaml"
    config(pairs(topic=topic, partitions=3)).write(cfg)
    pcap = tmp_path / "t.pcap"
    write_pcap(pcap, 30_000, 3000, 20, seed=11)
    run_agent(cfg, f"pcap:{pcap}", bootstrap=kafka.bootstrap_servers)
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
