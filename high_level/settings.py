"""The high-level job's settings (``lowwater-job``): flags, ``LOWWATER_JOB_*`` environment, settings file.

See :mod:`contract.settings` for the precedence. Cluster settings are settings here, not a wrapper's
patches: ``spark_conf``, ``driver_host`` (the address executors connect back to on a non-local
master), ``spark_jars``, and the Kafka security block shared with the other roles
(:class:`contract.kafka_security.KafkaSecurity`), which both the Kafka source and the topic
provisioning use.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from contract import query as Q
from contract.kafka_security import KafkaSecurity
from contract.settings import RoleSettings
from high_level.job import JobOptions
from high_level.options import rate_trigger_ms

_SECURITY_KEYS = ("kafka.security.", "kafka.sasl.", "kafka.ssl.")


class JobSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="LOWWATER_JOB_")

    config: str = "configs/default.yaml"
    queries: list[str] = Field(default_factory=list, description="run only these queries (default: all)")
    bootstrap: str = "127.0.0.1:9092"
    results: str
    checkpoint: str
    mode: Literal["oop", "watermark"] = "oop"
    watermark_delay: str = "10s"
    trigger: str = "1s"
    idle_trigger: str = Field(
        default="5s",
        description="at rest (no window open), wait for a partial or this long between batches; 0s: off",
    )
    host_timeout: str = "10s"
    # NoDecode: the environment's value is taken as written, a comma list or a JSON list (see _hosts)
    expected_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    late_policy: Literal["drop", "correction"] = "drop"
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    expected_rate: float | None = Field(
        default=None,
        gt=0,
        description="partial records/s at peak over all queries: the trigger grows to batches of about "
        "10M records (high_level.options.rate_trigger_ms), up to 10 s",
    )
    master: str = "local[2]"
    shuffle_partitions: int | None = Field(default=None, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    kafka_security: KafkaSecurity = KafkaSecurity()
    kafka_options: dict[str, str] = Field(default_factory=dict)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    driver_host: str | None = None
    spark_jars: list[str] = Field(default_factory=list)
    control_topic: str | None = None
    retention_days: int | None = Field(
        default=None, ge=1, description="delete results of windows older than this"
    )
    compact_every: float = Field(
        default=600.0,
        ge=0,
        description="seconds between store maintenance passes (compaction, roll-up tiers, retention); 0: off",
    )
    alert_webhook: str | None = Field(
        default=None, description="Alertmanager v2 URL, e.g. http://am:9093/api/v2/alerts"
    )
    alert_timeout: str = "2s"
    alert_queue: int = Field(default=10_000, ge=1)
    alert_generator_url: str = "http://127.0.0.1:8080/ui"
    live: bool = Field(
        default=False, description="publish provisional values of open windows to lowwater.live.<query>"
    )
    state: Literal["auto", "blob", "chunked"] = Field(
        default="auto",
        description="OOP state layout: chunked (batch-proportional cost, RocksDB), blob, auto (default)",
    )

    @field_validator("alert_webhook", "alert_generator_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(
                f"{v!r} is not an http(s) URL with a host (e.g. http://alertmanager:9093/api/v2/alerts)"
            )
        try:
            u.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"{v!r}: {exc}") from None
        return v

    @field_validator("watermark_delay", "trigger", "host_timeout", "alert_timeout")
    @classmethod
    def _duration(cls, v: str) -> str:
        if Q.parse_duration_ns(v) <= 0:
            raise ValueError(f"{v!r} is not a positive duration such as 500ms, 1s, 2m")
        return v

    @field_validator("expected_hosts", mode="before")
    @classmethod
    def _hosts(cls, v: object) -> object:
        """``capture-01,capture-02`` (as deploy/README.md and env.example write it) or a JSON list."""
        if isinstance(v, str):
            text = v.strip()
            return (
                json.loads(text)
                if text.startswith("[")
                else [h.strip() for h in text.split(",") if h.strip()]
            )
        return v

    @field_validator("idle_trigger")
    @classmethod
    def _idle(cls, v: str) -> str:
        if Q.parse_duration_ns(v) < 0:
            raise ValueError(f"{v!r} is not a duration such as 0s (off), 5s")
        return v

    @field_validator("kafka_options")
    @classmethod
    def _kafka_options(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in v if not k.startswith("kafka.") or k.startswith(_SECURITY_KEYS))
        if bad:
            raise ValueError(
                f"{bad}: kafka_options take kafka.* source options other than security "
                "(security goes in kafka_security, shared with the topic provisioning)"
            )
        return v

    @field_validator("spark_conf")
    @classmethod
    def _spark_conf(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in v if not k.startswith("spark."))
        if bad:
            raise ValueError(f"{bad}: Spark settings start with 'spark.'")
        return v

    def options(self) -> JobOptions:
        """The job's run-time options."""
        ms = lambda text: Q.parse_duration_ns(text) // 1_000_000  # noqa: E731
        m = re.fullmatch(r"local\[(\d+)\]", self.master.strip())
        return JobOptions(
            bootstrap=self.bootstrap,
            results=self.results,
            checkpoint=self.checkpoint,
            mode=self.mode,
            trigger_ms=rate_trigger_ms(ms(self.trigger), self.expected_rate),
            idle_trigger_ms=ms(self.idle_trigger),
            host_timeout_ms=ms(self.host_timeout),
            expected_hosts=tuple(self.expected_hosts),
            late_policy=self.late_policy,
            watermark_delay_ms=ms(self.watermark_delay),
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            shuffle_partitions=self.shuffle_partitions or (int(m.group(1)) if m else None),
            kafka_security=self.kafka_security,
            kafka_options=dict(self.kafka_options),
            alert_webhook=self.alert_webhook,
            alert_timeout_ms=ms(self.alert_timeout),
            alert_queue=self.alert_queue,
            alert_generator_url=self.alert_generator_url,
            control_topic=self.control_topic,
            retention_days=self.retention_days,
            compact_every_s=self.compact_every,
            live=self.live,
            state=self.state,
        )
