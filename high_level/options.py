"""The job's run-time options (:class:`JobOptions`), and the Kafka clients they imply.

Its own module so that the pipelines (:mod:`high_level.pipeline`) read the options without importing the
job that conducts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract import status as S
from contract.kafka_security import KafkaSecurity
from high_level.aggregate.processor import LATE_POLICIES, Settings
from high_level.kafkaclients import KafkaClients

MODES = (
    "oop",
    "watermark",
)  # oop: punctuation (the pipelines of high_level.job.PIPELINES); watermark: baseline
# State layout of the OOP step: "blob" (the processor saved whole every micro-batch), "chunked" (pane tables
# as per-batch chunks in RocksDB, high_level/aggregate/chunks.py: a batch pays for what it brings, not for the open
# groups), "auto" (chunked unless a query needs the blob: high_level.aggregate.chunks.chunked_unsupported).
STATES = ("auto", "blob", "chunked")

# Failover of Spark's Kafka source when a partition leader dies. The driver asks for the partitions' ends
# with Kafka's Admin.listOffsets; after a leader's SIGKILL that call stays on the dead leader until
# default.api.timeout.ms (60 s by default) runs out, and only then does Spark retry with a new admin client
# that sees the new leader (KafkaOffsetReaderAdmin.withRetries: fetchOffset.numRetries attempts,
# fetchOffset.retryIntervalMs apart). A 10 s call timeout bounds that wait (a new leader is elected after
# the brokers' broker.session.timeout.ms, 9 s by default). Trade-off: a broker slower than 10 s per call costs
# a retry, not the query: 17 attempts x (10 + 1) s give up after ~187 s, as long as the default 3 x 61 s.
# The executors' consumers get the same timeouts (their fetches wait fetch.max.wait.ms = 50 ms). Flags
# (--kafka-option) override the kafka.* ones. Measured in benchmarks/bench_recovery.py (broker_recovery_s).
FAILOVER_OPTIONS = {
    "kafka.request.timeout.ms": "10000",
    "kafka.default.api.timeout.ms": "10000",  # must not be below request.timeout.ms (the admin refuses)
    "fetchOffset.numRetries": "17",
    "fetchOffset.retryIntervalMs": "1000",
}

# Amortising the driver. A micro-batch costs the driver a fixed F CPU-s (Spark's planning of the stateful
# stream and of the task writers, the commit), whatever its records, plus v CPU-s per million records
# (benchmarks/bench_scaling.py: driver_fixed_cpu_s_per_batch, driver_cpu_s_per_million_records_beyond_fixed).
# While the job keeps up a batch holds what arrived in one trigger, B = rate x trigger, so the driver's cost
# per million records is F / B + v. With --expected-rate the trigger is at least RATE_BATCH_RECORDS / rate:
# batches of about that many records. Measured F = 0.318 CPU-s and v = 0.012 (scaling.json, 2026-11-29) need
# B >= 8.4M for the goal of 0.05 CPU-s per million; 10M gives 0.044 (a driver core's ceiling ~23M records/s),
# where 5M gave 0.076. The price is latency: a window closes up to one trigger after its last punctuation,
# so the trigger is capped at MAX_RATE_TRIGGER_MS (a rate under 1M records/s gets smaller batches, and a
# driver that needs at most F / 10 s = 3 % of a core for them; a rate above 10M/s keeps the 1-s trigger).
RATE_BATCH_RECORDS = 10_000_000
MAX_RATE_TRIGGER_MS = 10_000


def rate_trigger_ms(trigger_ms: int, expected_rate: float | None) -> int:
    """The trigger for ``expected_rate`` partial records/s: at least ``trigger_ms``, and at least the time a
    batch of :data:`RATE_BATCH_RECORDS` takes to arrive, up to :data:`MAX_RATE_TRIGGER_MS`."""
    if not expected_rate:
        return trigger_ms
    want = min(MAX_RATE_TRIGGER_MS, round(1000 * RATE_BATCH_RECORDS / expected_rate))
    return max(trigger_ms, want)


@dataclass(frozen=True)
class JobOptions:
    """Everything the job needs besides the Spark session and the queries."""

    bootstrap: str
    results: str
    checkpoint: str
    mode: str = "oop"
    trigger_ms: int = 1000
    # at rest (no window open after a batch), the next batch waits for a partial or this long (0: every
    # trigger; high_level/aggregate/pacer.py). The CLI's default is 5 s; tests that drive the job keep 0
    idle_trigger_ms: int = 0
    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    watermark_delay_ms: int = 10_000
    max_offsets_per_trigger: int | None = None
    shuffle_partitions: int | None = None  # None: the session's setting (fixed per checkpoint)
    name: str = "lowwater"
    create_topics: bool = True
    kafka_options: dict[str, str] = field(default_factory=dict)  # extra kafka.* source options
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    control_topic: str | None = None  # ask blocking hosts for punctuation on this topic (oop mode)
    retention_days: int | None = None  # delete result files of windows older than this
    compact_every_s: float = 3600.0  # store maintenance passes (high_level/results/compact.py); 0: off
    alert_webhook: str | None = None  # Alertmanager v2 endpoint, e.g. http://am:9093/api/v2/alerts
    alert_timeout_ms: int = 2000
    alert_queue: int = 10_000
    alert_generator_url: str = "http://127.0.0.1:8080/ui"
    live: bool = False  # publish provisional and final values to lowwater.live.<query> (contract/live.py)
    state: str = "auto"  # STATES (see README, "High-level state")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}")
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}")
        if self.trigger_ms <= 0 or self.host_timeout_ms <= 0:
            raise ValueError("trigger and host timeout must be positive")
        if self.idle_trigger_ms < 0:
            raise ValueError("idle trigger must be 0 (off) or positive")

    @property
    def settings(self) -> Settings:
        """The punctuation pipelines' processor settings (the watermark baseline has none)."""
        return Settings(self.host_timeout_ms, tuple(self.expected_hosts), self.late_policy, live=self.live)

    @property
    def kafka(self) -> KafkaClients:
        """The job's Kafka clients (admin, producers), all from the one bootstrap and security block."""
        return KafkaClients(self.bootstrap, self.kafka_security)

    @property
    def source_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source: :data:`FAILOVER_OPTIONS`, the security block's, the extra ones."""
        out = {**FAILOVER_OPTIONS, **self.kafka_security.spark_options(), **self.kafka_options}
        api, req = "kafka.default.api.timeout.ms", "kafka.request.timeout.ms"
        if int(out[api]) < int(out[req]):  # a longer request timeout given alone: the call's follows it
            out[api] = out[req]
        return out

    @property
    def status_settings(self) -> S.JobSettings:
        """The settings as the status document reports them."""
        return S.JobSettings(
            trigger_ms=self.trigger_ms,
            host_timeout_ms=self.host_timeout_ms,
            expected_hosts=list(self.expected_hosts),
            late_policy=self.late_policy,
            watermark_delay_ms=self.watermark_delay_ms,
            alert_webhook=bool(self.alert_webhook),
            retention_days=self.retention_days,
        )
