"""Prometheus metrics of a capture host (packets or flows), read from the kernel's counter arrays at scrape time.

Nothing is incremented per packet in Python: a custom collector turns the Numba-maintained int64
counters into metric families when Prometheus scrapes. It reads a ``low_level.host.loop.HostLoop``, so
a packet agent and a flow collector export the same families (a flow collector's "ring" is its socket
queue: datagrams waiting, no drops counted there).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from low_level.kernel.tables import (
    EMPTY,
    QS_EMITTED,
    QS_EVICT,
    QS_FLUSH_IOP,
    QS_FLUSH_SLOW,
    QS_FLUSH_SWEEP,
    QS_LATE,
    QS_MARK,
    QS_MATCHED,
    QS_OCC,
    QS_OVERDUE,
)

if TYPE_CHECKING:
    from low_level.host.loop import HostLoop

PREFIX = "lowwater_agent"
# every metric name this module exports (deploy/ tests check Grafana panels against it)
METRIC_NAMES = tuple(
    f"{PREFIX}_{n}"
    for n in (
        "packets_captured_total",
        "packets_processed_total",
        "ring_drops_total",
        "kernel_drops_total",
        "ring_fill",
        "parse_errors_total",
        "matched_packets_total",
        "late_packets_total",
        "evictions_total",
        "flushed_total",
        "emitted_partials_total",
        "table_occupancy",
        "table_slots",
        "heartbeats_total",
        "low_water_mark_timestamp_seconds",
        "low_water_mark_lag_seconds",
        "kafka_records_sent_total",
        "kafka_bytes_sent_total",
        "kafka_batches_sent_total",
        "kafka_send_errors_total",
        "kafka_delivery_failures_total",
        "kafka_connect_errors_total",
        "backlog_records",
        "backlog_merges_total",
        "backlog_merged_records_total",
        "backlog_lost_records_total",
        "networks_reloads_total",
        "networks_reload_errors_total",
    )
)
# flow collectors only (NetFlow/IPFIX/sFlow), labelled per exporter: low cardinality
FLOW_METRIC_NAMES = tuple(
    f"{PREFIX}_{n}"
    for n in (
        "flow_datagrams_total",
        "flow_records_total",
        "flow_templates",
        "flow_sampling_rate",
        "flow_errors_total",
        "flow_late_records_total",
        "flow_interface_octets_total",
    )
)
METRIC_NAMES += FLOW_METRIC_NAMES


class AgentCollector(Collector):
    """The metric families of one host, built at each scrape."""

    def __init__(self, agent: HostLoop) -> None:
        self.agent = agent

    def collect(self):  # noqa: C901 - one flat list of families is the clearest form
        a = self.agent
        host = a.host
        k, t, em = a.kernel, a.kernel.t, a.emitter

        def counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None):
            labels = {"host": host, **(labels or {})}
            fam = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
            fam.add_metric(list(labels.values()), value)
            return fam

        yield counter("packets_captured", "Frames the sources put into the ring", a.records_captured())
        yield counter("packets_processed", "Frames the kernel parsed", k.hc[0])
        yield counter("ring_drops", "Frames dropped because the ring was full", a.ring_drops())
        yield counter("kernel_drops", "Frames the OS capture ring dropped", a.source_stat("kernel_drops"))
        g = GaugeMetricFamily(f"{PREFIX}_ring_fill", "Frames waiting in the ring", labels=["host"])
        g.add_metric([host], a.ring_fill())
        yield g
        pe = CounterMetricFamily(
            f"{PREFIX}_parse_errors", "Frames not parsed, by reason", labels=["host", "reason"]
        )
        for name, value in a.parse_error_counts().items():
            pe.add_metric([host, name], value)
        yield pe
        yield counter(
            "networks_reloads", "Networks-file reloads (SIGHUP) that took effect", a.networks_reloads
        )
        yield counter(
            "networks_reload_errors",
            "Networks-file reloads refused (bad file, previous one kept)",
            a.networks_reload_errors,
        )
        per_query = [
            ("matched_packets", "Packets that passed the query's filter", QS_MATCHED),
            ("late_packets", "Packets below the sent punctuation (dropped, counted)", QS_LATE),
            ("evictions", "Partials evicted by a hash collision", QS_EVICT),
            ("emitted_partials", "Partial aggregates emitted", QS_EMITTED),
        ]
        for name, doc, col in per_query:
            fam = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["host", "query"])
            for i, q in enumerate(t.queries):
                fam.add_metric([host, q.name], t.qs[i, col])
            yield fam
        fl = CounterMetricFamily(
            f"{PREFIX}_flushed",
            "Partials flushed, by policy step",
            labels=["host", "query", "policy", "cause"],
        )
        for i, q in enumerate(t.queries):
            for cause, col in (
                ("slow", QS_FLUSH_SLOW),
                ("sweep", QS_FLUSH_SWEEP),
                ("iop_burst", QS_FLUSH_IOP),
                ("overdue", QS_OVERDUE),
            ):
                fl.add_metric([host, q.name, q.flush.policy, cause], t.qs[i, col])
            fl.add_metric([host, q.name, q.flush.policy, "heartbeat"], a.heartbeat_flushed[i])
        yield fl
        occ = GaugeMetricFamily(f"{PREFIX}_table_occupancy", "Occupied table slots", labels=["host", "query"])
        slots = GaugeMetricFamily(f"{PREFIX}_table_slots", "Table size", labels=["host", "query"])
        hb = CounterMetricFamily(f"{PREFIX}_heartbeats", "Punctuations sent", labels=["host", "query"])
        lwm = GaugeMetricFamily(
            f"{PREFIX}_low_water_mark_timestamp_seconds",
            "Last punctuation (epoch s)",
            labels=["host", "query"],
        )
        lag = GaugeMetricFamily(
            f"{PREFIX}_low_water_mark_lag_seconds",
            "Wall clock minus the last punctuation",
            labels=["host", "query"],
        )
        now = time.time()
        for i, q in enumerate(t.queries):
            occ.add_metric([host, q.name], t.qs[i, QS_OCC])
            slots.add_metric([host, q.name], q.table.size)
            hb.add_metric([host, q.name], a.heartbeats[i])
            mark = int(t.qs[i, QS_MARK])
            if mark != EMPTY and a.last_mark_ns[i]:
                lwm.add_metric([host, q.name], a.last_mark_ns[i] / 1e9)
                lag.add_metric([host, q.name], now - a.last_mark_ns[i] / 1e9)
        yield from (occ, slots, hb, lwm, lag)
        s = em.stats
        yield counter("kafka_records_sent", "Partial records handed to Kafka", s.records_sent)
        yield counter("kafka_bytes_sent", "Bytes handed to Kafka", s.bytes_sent)
        yield counter("kafka_batches_sent", "Partial batches handed to Kafka", s.batches_sent)
        yield counter(
            "kafka_send_errors", "Kafka send calls that failed (data kept in the backlog)", s.send_errors
        )
        yield counter(
            "kafka_delivery_failures", "Batches Kafka finally failed to deliver", s.delivery_failures
        )
        yield counter(
            "kafka_connect_errors", "Failed attempts to reach Kafka (capture goes on)", em.connect_errors
        )
        b = em.backlog
        g = GaugeMetricFamily(
            f"{PREFIX}_backlog_records", "Partial records waiting for Kafka", labels=["host"]
        )
        g.add_metric([host], b.records)
        yield g
        yield counter("backlog_merges", "In-place compactions of the backlog", b.merges)
        yield counter("backlog_merged_records", "Records absorbed by in-place merging", b.merged_away)
        yield counter("backlog_lost_records", "Records dropped beyond the backlog bound", b.lost)
        src = a.source_stats()
        if src.get("type") == "flows":
            yield from _flow_families(host, src)


def _flow_families(host: str, src: dict[str, Any]):
    """A flow collector's families from its stats: per exporter (NetFlow exporter/domain or sFlow
    agent/sub-agent), errors by reason, sFlow interface octets per (agent, ifIndex, direction)."""
    per = [
        ("flow_datagrams", CounterMetricFamily, "Flow datagrams received", "datagrams"),
        ("flow_records", CounterMetricFamily, "Flow records (sFlow: flow samples) decoded", "records"),
        ("flow_templates", GaugeMetricFamily, "Live v9/IPFIX templates", "templates"),
    ]
    for name, kind, doc, key in per:
        fam = kind(f"{PREFIX}_{name}", doc, labels=["host", "exporter"])
        for exp, v in src.get("sources", {}).items():
            fam.add_metric([host, exp], v[key])
        yield fam
    rate = GaugeMetricFamily(
        f"{PREFIX}_flow_sampling_rate", "Sampling rate (1-in-N)", labels=["host", "exporter"]
    )
    for exp, v in src.get("sampling_rate", {}).items():
        rate.add_metric([host, exp], v)
    yield rate
    err = CounterMetricFamily(
        f"{PREFIX}_flow_errors",
        "Flow datagrams/sets/records not decoded, by reason",
        labels=["host", "reason"],
    )
    for reason, v in src.get("errors", {}).items():
        err.add_metric([host, reason], v)
    yield err
    late = CounterMetricFamily(f"{PREFIX}_flow_late_records", "Records below the mark", labels=["host"])
    late.add_metric([host], src.get("late_records", 0))
    yield late
    octets = CounterMetricFamily(
        f"{PREFIX}_flow_interface_octets",
        "sFlow interface counters: octets per (agent, ifIndex, direction)",
        labels=["host", "exporter", "ifindex", "direction"],
    )
    for i in src.get("interfaces", []):
        octets.add_metric([host, i["source"], str(i["ifindex"]), "in"], i["in_octets"])
        octets.add_metric([host, i["source"], str(i["ifindex"]), "out"], i["out_octets"])
    yield octets


def serve_metrics(agent: HostLoop, port: int, registry: CollectorRegistry = REGISTRY) -> Any:
    """Register the host's collector and serve /metrics on ``port`` (a thread of prometheus_client);
    returns the HTTP server (``server_port``, ``shutdown()``)."""
    from prometheus_client import start_http_server

    registry.register(AgentCollector(agent))
    server, _thread = start_http_server(port, registry=registry)
    return server
