"""Prometheus metrics of the high-level job (served on ``--metrics-port``).

A private registry per job so tests can run several jobs in one process without clashing.
Everything is updated on the driver from the micro-batch's status rows, never from workers.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from contract import status as S
from contract.wire import END_OF_STREAM

# The job's metric families, one a row: attribute, type, name, help, labels (histogram buckets in _BUCKETS).
# A table so every family is declared the same way; the names stay whole here for grep.
# fmt: off
_FAMILIES: tuple[tuple[str, type[Counter | Gauge | Histogram], str, str, tuple[str, ...]], ...] = (
    ("records", Counter, "lowwater_job_records_consumed", "Partial records consumed", ()),
    ("windows", Counter, "lowwater_job_windows_closed", "Final (window, group) rows emitted", ("query",)),
    ("corrections", Counter, "lowwater_job_corrections", "Correction rows emitted", ("query",)),
    ("late", Counter, "lowwater_job_late_partials", "Partial records behind the closed frontier", ("query", "host")),
    ("host_lwm", Gauge, "lowwater_job_host_low_water_mark_timestamp_seconds",
     "Host's punctuation mark (data time as epoch seconds, min over partitions)", ("query", "host")),
    ("host_lag", Gauge, "lowwater_job_host_lag_seconds", "Processing time minus the host's mark", ("query", "host")),
    ("host_up", Gauge, "lowwater_job_host_up", "1 if the host punctuated within host_timeout on every partition",
     ("query", "host")),
    ("missing", Gauge, "lowwater_job_missing_records", "Records a punctuation says were sent but never arrived",
     ("query", "host")),
    ("open_windows", Gauge, "lowwater_job_open_windows", "Windows holding data, not closed yet", ("query",)),
    ("state_rows", Gauge, "lowwater_job_state_rows", "Rows in the pane tables (OOP) or Spark state store", ("query",)),
    ("state_bytes", Gauge, "lowwater_job_state_memory_bytes", "Spark state store memory", ("query",)),
    ("store_tier_bytes", Gauge, "lowwater_job_store_tier_bytes",
     "Bytes of a query's results per tier (raw: the window files; else a roll-up tier)", ("query", "tier")),
    ("join_state_rows", Gauge, "lowwater_job_join_state_rows", "Input rows a join holds (both inputs)",
     ("query", "partition")),
    ("join_state_bytes", Gauge, "lowwater_job_join_state_bytes", "Bytes of the input rows a join holds",
     ("query", "partition")),
    ("dropped", Counter, "lowwater_job_rows_dropped_by_watermark", "Rows Spark's watermark dropped (baseline mode)",
     ("query",)),
    ("batch_duration", Histogram, "lowwater_job_batch_duration_seconds",
     "Micro-batch duration (sink side, includes the stateful step)", ()),
    ("latency", Histogram, "lowwater_job_result_latency_seconds", "Window close time minus window end", ()),
    ("having_dropped", Counter, "lowwater_job_having_dropped", "Final rows not stored: HAVING was false", ("query",)),
    ("total_held", Gauge, "lowwater_job_total_held_rows", "Closed-window rows of a query whose HAVING/alerts read "
     "total(), held until every partition closed the window", ("query",)),
    ("flagged_windows", Counter, "lowwater_job_flagged_windows", "Short windows flagged (rows or not), per window, "
     "host and cause: shed by a backlog, or a sequence gap", ("query", "cause")),
    ("alerts_fired", Counter, "lowwater_job_alerts_fired", "Alerts fired (one per rule, window, group at close)",
     ("query", "alert")),
    ("alerts_delivered", Counter, "lowwater_job_alerts_delivered", "Alerts the webhook accepted", ("query", "alert")),
    ("alerts_failed", Counter, "lowwater_job_alerts_failed", "Failed webhook posts (each is retried)", ()),
    ("alerts_overflow", Counter, "lowwater_job_alerts_overflow",
     "Alerts not queued (queue full; re-read from the alert store later)", ()),
    ("alerts_pending", Gauge, "lowwater_job_alerts_pending", "Alerts queued for delivery", ()),
    ("alert_latency", Histogram, "lowwater_job_alert_delivery_latency_seconds",
     "Webhook accepted an alert, minus its window's close", ()),
)
# fmt: on
_BUCKETS = {
    "batch_duration": (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    "latency": (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 3600),
    "alert_latency": (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
}


class JobMetrics:
    """The job's Prometheus metrics (names are part of the ops contract: README, "Changed metric
    names" lists renames). Names follow the Prometheus naming guide: counters end in ``_total`` (added by the
    client), liveness is ``_up``, marks in epoch seconds are ``_timestamp_seconds``. One attribute per row of
    ``_FAMILIES`` (``self.records``, ``self.windows``, ...)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._dropped_seen: dict[str, int] = {}
        for attr, kind, name, doc, labels in _FAMILIES:
            extra = {"buckets": _BUCKETS[attr]} if attr in _BUCKETS else {}
            setattr(self, attr, kind(name, doc, labels, registry=self.registry, **extra))

    def dropped_so_far(self, query: str, n: int) -> None:
        """Spark reports the rows its watermark dropped since the job started: count what is new."""
        seen = self._dropped_seen.get(query, 0)
        if n > seen:
            self.dropped.labels(query).inc(n - seen)
        self._dropped_seen[query] = n

    def serve(self, port: int) -> None:
        """Expose /metrics on 0.0.0.0:port."""
        start_http_server(port, registry=self.registry)

    def on_status(self, queries: Mapping[str, S.QueryStatus], now_ms: int) -> None:
        """Refresh gauges from the per-query status (:func:`contract.status.summarize_query`)."""
        for qname, qs in queries.items():
            self.open_windows.labels(qname).set(qs.open_windows)
            self.state_rows.labels(qname).set(qs.state_rows)
            for host, hs in qs.hosts.items():
                self.host_up.labels(qname, host).set(1 if hs.live else 0)
                self.missing.labels(qname, host).set(hs.missing_records)
                m = hs.low_water_mark_ns
                if m is not None and m < END_OF_STREAM:
                    self.host_lwm.labels(qname, host).set(m / 1e9)
                    self.host_lag.labels(qname, host).set(now_ms / 1e3 - m / 1e9)

    def on_batch_status(self, statuses: list[S.PartitionStatus]) -> None:
        """Count what one batch's status rows report as new (records, late partials)."""
        for st in statuses:
            if "stored_left" in st.batch:  # a join partition (high_level/join/step.py)
                self.join_state_rows.labels(st.query, str(st.partition)).set(st.state_rows)
                self.join_state_bytes.labels(st.query, str(st.partition)).set(st.state_bytes)
            self.records.inc(int(st.batch.get("records", 0)))
            for host, hs in st.hosts.items():
                if hs.late_batch:
                    self.late.labels(st.query, host).inc(hs.late_batch)
