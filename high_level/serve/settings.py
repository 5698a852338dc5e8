"""The REST API's settings (``lowwater-api``): flags, ``LOWWATER_API_*`` environment, settings file.

See :mod:`contract.settings` for the precedence. The bearer token is best given as
``LOWWATER_API_TOKEN`` (compose sets it from a secret file): a flag is visible in ``ps``. The reader
of the live topics authenticates with the Kafka security block every role shares
(:class:`contract.kafka_security.KafkaSecurity`), best given as ``LOWWATER_API_KAFKA_SECURITY``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from contract.kafka_security import KafkaSecurity
from contract.settings import RoleSettings


class ApiSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="LOWWATER_API_")

    config: str = "configs/default.yaml"
    results: str
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    token: SecretStr | None = None
    cache_mb: int = Field(default=512, ge=0, description="memory for prepared result files")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    live_bootstrap: str | None = Field(
        default=None, description="Kafka of the live topics (contract/live.py)"
    )
    interfaces: str | None = Field(
        default=None, description="interfaces file (contract/interfaces.py), reloaded on SIGHUP"
    )
    kafka_security: KafkaSecurity = KafkaSecurity()  # of the live reader (a consumer of the live topics)
