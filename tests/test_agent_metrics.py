"""The agent's Prometheus metrics report the kernel's real counters (read at scrape time)."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from low_level.host.agent import Agent
from low_level.host.loop import HostLoop
from low_level.host.metrics import FLOW_METRIC_NAMES, METRIC_NAMES, AgentCollector, serve_metrics
from lowwater_testing.capture import RecordingProducer, make_query, push_frames
from lowwater_testing.traffic import build_frames, make_traffic

NS = 1_000_000_000


def scrape(agent: HostLoop) -> dict[tuple[str, tuple], float]:
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent))
    return parse(generate_latest(reg).decode())


def parse(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
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
    for declared in set(METRIC_NAMES) - set(FLOW_METRIC_NAMES):  # flow families: flow collectors only
        base = declared.removesuffix("_total")
        assert declared in names or base in names or f"{base}_total" in names, declared


def test_flow_collector_serves_its_metrics_and_counts_reloads(tmp_path: Path) -> None:
    """The flow collector runs the packet agent's loop: /metrics over HTTP reports its records, marks and
    networks-file reloads (good and refused) as the packet agent's do."""
    from low_level.flows.agent import FlowAgent
    from lowwater_testing.flows import FIELDS, flow_query, flow_record, flowset, template, v9

    nets = tmp_path / "nets.txt"
    nets.write_text("64497,10.0.0.0/8\n")
    agent = FlowAgent(
        [flow_query()],
        {"type": "flows", "host": "127.0.0.1", "port": 0},
        "router-m",
        None,
        producer=RecordingProducer(),
        networks=str(nets),
    )
    reg = CollectorRegistry()
    server = serve_metrics(agent, 0, registry=reg)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for d in (
            v9(1, [template(256, FIELDS)]),
            v9(
                1,
                [
                    flowset(
                        256,
                        flow_record(0x0A000001, 0x0A000002, 3, 300, 9_000)
                        + flow_record(0x0A000003, 0x0A000004, 5, 500, 9_500),
                    )
                ],
            ),
        ):
            tx.sendto(d, ("127.0.0.1", agent.collector.port))
        from lowwater_testing.sflow import counter_sample, datagram

        tx.sendto(datagram([counter_sample(7, 10, 20)]), ("127.0.0.1", agent.collector.port))  # sFlow too
        sport = tx.getsockname()[1]
        tx.close()
        deadline = time.monotonic() + 10
        while (agent.collector.records < 2 or not agent.collector.interfaces) and time.monotonic() < deadline:
            agent.step()
        nets.write_text("65001,10.0.0.0/8\n")
        agent.reload_requested = True  # what SIGHUP sets (low_level.host.loop.watch_sighup)
        agent.step()
        nets.write_text("bad line\n")
        agent.reload_requested = True
        agent.step()
        m = parse(urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        server.shutdown()
        agent.emitter.close()
        agent.collector.close()
    host = (("host", "router-m"),)
    qlab = (("host", "router-m"), ("query", "pairs"))
    assert m[("lowwater_agent_packets_processed_total", host)] == 2
    assert m[("lowwater_agent_packets_captured_total", host)] == 2
    assert m[("lowwater_agent_matched_packets_total", qlab)] == 2
    assert m[("lowwater_agent_heartbeats_total", qlab)] >= 1
    assert m[("lowwater_agent_networks_reloads_total", host)] == 1
    assert m[("lowwater_agent_networks_reload_errors_total", host)] == 1
    assert m[("lowwater_agent_table_slots", qlab)] == 256
    assert ("lowwater_agent_low_water_mark_timestamp_seconds", qlab) in m
    exp = (("exporter", f"('127.0.0.1', {sport})/1"), ("host", "router-m"))
    assert m[("lowwater_agent_flow_records_total", exp)] == 2
    assert m[("lowwater_agent_flow_templates", exp)] == 1
    names = {name for name, _ in m}
    for declared in METRIC_NAMES:
        base = declared.removesuffix("_total")
        assert declared in names or base in names or f"{base}_total" in names, declared
