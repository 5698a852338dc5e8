"""The capture agent's settings (``lowwater-agent``): flags, ``LOWWATER_AGENT_*`` environment, settings file.

See :mod:`contract.settings` for the precedence. The Kafka security block is the one every role
shares (:class:`contract.kafka_security.KafkaSecurity`); in a container, prefer the environment
(``LOWWATER_AGENT_KAFKA_SECURITY='{"protocol": ...}'``) to the flag: a flag is visible in ``ps``.
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from contract.kafka_security import KafkaSecurity
from contract.settings import RoleSettings


class AgentSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="LOWWATER_AGENT_")

    config: str = "configs/default.yaml"
    queries: list[str] = Field(default_factory=list, description="run only these queries (default: all)")
    source: str = "generator"
    host_id: str = Field(default_factory=socket.gethostname, min_length=1, pattern=r"^[A-Za-z0-9._:/-]+$")
    bootstrap: str = "127.0.0.1:9092"
    metrics_port: int = Field(default=9101, ge=0, le=65535)
    ring_slots: int = Field(default=1 << 18, gt=0)
    duration: float | None = Field(default=None, gt=0)
    linger: bool = False
    summary: str | None = None
    control_topic: str | None = (
        None  # answer the high level's punctuation requests (low_level/host/ondemand.py)
    )
    kafka_security: KafkaSecurity = KafkaSecurity()
    # worker processes of this host (low_level/capture/workers.py); None: low_level.capture.workers.default_workers
    workers: int | None = Field(default=None, ge=1, le=256)
    fanout: Literal["hash", "cpu"] = "hash"  # AF_PACKET fanout mode of the workers
    worker: str | None = None  # set by the supervisor for its workers: INDEX/COUNT/GROUP
