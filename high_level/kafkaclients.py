"""The one place the job builds its Kafka clients (kafka-python): admin and producers, all from one
bootstrap and one security block (:class:`contract.kafka_security.KafkaSecurity`), so every client of
the job authenticates as its Spark Kafka source does.

Each publisher names its own tuning (``PRODUCER`` beside it: the feed waits for every replica, the
punctuation asker sends at once) and gets its producer from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.kafka_security import KafkaSecurity


@dataclass(frozen=True)
class KafkaClients:
    """Factory of the job's kafka-python clients."""

    bootstrap: str | None
    security: KafkaSecurity = field(default_factory=KafkaSecurity)

    def producer(self, **tuning: Any) -> Any:
        """A ``KafkaProducer`` with the security block and ``tuning`` (``acks``, ``linger_ms``, ...)."""
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.bootstrap, **tuning, **self.security.kafka_python())

    def admin(self, deadline_s: float) -> Any:
        """A ``KafkaAdminClient``, retrying until the broker answers or ``deadline_s`` passes
        (:func:`contract.topics.connect`: RuntimeError then)."""
        from contract.topics import connect

        assert self.bootstrap is not None
        return connect(self.bootstrap, self.security.kafka_python(), deadline_s)
