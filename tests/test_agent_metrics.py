"""The agent's Prometheus metrics report the kernel's real counters (read at scrape time)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from low_level.host.agent import Agent
from low_level.host.metrics import METRIC_NAMES, AgentCollector
from tests.packets import build_frames, make_traffic
from tests.test_subaggregate import RecordingProducer, make_query, push_frames

NS = 1_000_000_000


def scrape(agent: Agent) -> dict[tuple[str, tuple], float]:
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_the_counters() -> None:
    q = make_query("lazy", 64, window="{range: 1s}", partitions=2)
    traffic = make_traffic(5000, 300, 1_700_000_000 * NS, 5 * NS, seed=4)
    agent = Agent([q], None, "hm", None, ring_slots=1 << 13, producer=RecordingProducer())
    frames, cap, wl, ts = build_frames(traffic)
    push_frames(agent.ring, frames, cap, wl, ts)
    cap[:10] = 20  # ten truncated frames: counted as parse errors
    push_frames(agent.ring, frames[:10], cap[:10], wl[:10], ts[:10] + 10 * NS)
    while agent.ring.fill:
        agent.step()
    agent.step()
    m = scrape(agent)
    host = (("host", "hm"),)
    qlab = (("host", "hm"), ("query", "q"))
    assert m[("lowwater_agent_packets_processed_total", host)] == 5010
    assert m[("lowwater_agent_matched_packets_total", qlab)] == 5000
    assert m[("lowwater_agent_evictions_total", qlab)] > 0  # 300 groups in a 64-slot table
    assert m[("lowwater_agent_parse_errors_total", (("host", "hm"), ("reason", "truncated_ipv4")))] == 10
    assert m[("lowwater_agent_heartbeats_total", qlab)] >= 1
    assert m[("lowwater_agent_table_slots", qlab)] == 64
    assert m[("lowwater_agent_kafka_records_sent_total", host)] == agent.emitter.stats.records_sent > 0
    assert ("lowwater_agent_low_water_mark_lag_seconds", qlab) in m
    names = {name for name, _ in m}
    for declared in METRIC_NAMES:
        base = declared.removesuffix("_total")
        assert declared in names or base in names or f"{base}_total" in names, declared
