"""A local KRaft Kafka cluster of N combined broker+controller nodes (tests of broker failure).

Each node is a :class:`~local_stack.kafka_broker.KafkaBroker` (same JVM options, logs, kill/restart)
with its own node id and ports, one static controller quorum (``controller.quorum.voters``) shared by
all, storage formatted with one cluster id, and replication settings for N nodes: internal topics
and new topics get ``min(N, 3)`` replicas and ``min.insync.replicas`` = replicas - 1, so one node may
die without refusing writes acknowledged by all in-sync replicas (``acks=all``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from local_stack.kafka_broker import KafkaBroker, KafkaBrokerError, _kafka_uuid


class ClusterNode(KafkaBroker):
    """Node ``node_id`` of a :class:`KafkaCluster`."""

    def __init__(self, cluster: KafkaCluster, node_id: int, state: Path, heap: str) -> None:
        super().__init__(f"{cluster.name}-{node_id}", port=0, state=state, heap=heap)
        self.cluster = cluster
        self.node_id = node_id

    def _config(self) -> dict[str, str]:
        cfg = super()._config()
        cfg.pop("controller.quorum.bootstrap.servers", None)
        rf = str(self.cluster.replication)
        isr = str(max(1, self.cluster.replication - 1))
        cfg.update(
            {
                "node.id": str(self.node_id),
                "controller.quorum.voters": self.cluster.voters,
                "default.replication.factor": rf,
                "min.insync.replicas": isr,
                "unclean.leader.election.enable": "false",
                "offsets.topic.replication.factor": rf,
                "transaction.state.log.replication.factor": rf,
                "transaction.state.log.min.isr": isr,
                "share.coordinator.state.topic.replication.factor": rf,
                "share.coordinator.state.topic.min.isr": isr,
            }
        )
        return cfg

    def _quorum(self) -> tuple[str, list[str]]:
        """The cluster's id, and no ``--standalone``: a static quorum."""
        return self.cluster.cluster_id, []

    def wait_ready(self, timeout: float = 90.0) -> None:
        if not self.cluster.launching:  # a lone node cannot serve before a quorum of controllers runs
            super().wait_ready(timeout)


class KafkaCluster:
    """``size`` local KRaft nodes; ``bootstrap_servers`` names them all."""

    def __init__(
        self, name: str = "cluster", size: int = 3, *, state: Path | str, heap: str = "384m"
    ) -> None:
        self.name = name
        self.cluster_id = _kafka_uuid()
        self.replication = min(size, 3)
        self.launching = False
        self.nodes = [ClusterNode(self, i + 1, Path(state), heap) for i in range(size)]
        self.voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Launch every node, then wait until each serves and the metadata lists them all."""
        from kafka import KafkaAdminClient

        self.launching = True
        try:
            for n in self.nodes:
                n.start(timeout)
        finally:
            self.launching = False
        try:
            for n in self.nodes:
                n.wait_ready(timeout)
            deadline = time.monotonic() + timeout
            while True:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=5000)
                try:
                    brokers = admin.describe_cluster().get("brokers", [])
                finally:
                    admin.close()
                if len(brokers) == len(self.nodes):
                    return self
                if time.monotonic() > deadline:
                    raise KafkaBrokerError(
                        f"cluster {self.name}: {len(brokers)} of {len(self.nodes)} brokers registered"
                    )
                time.sleep(0.3)
        except BaseException:
            self.stop()
            raise

    def create_topic(
        self, name: str, partitions: int, config: Mapping[str, str] | None = None, timeout: float = 30.0
    ) -> str:
        """Topic ``name`` with ``partitions`` partitions of ``replication`` replicas each."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, request_timeout_ms=int(timeout * 1000)
        )
        try:
            spec: dict[str, Any] = {
                "num_partitions": partitions,
                "replication_factor": self.replication,
                "configs": dict(config or {}),
            }
            admin.create_topics({name: spec}, timeout_ms=int(timeout * 1000))
            admin.wait_for_topics([name], timeout_ms=int(timeout * 1000))
        finally:
            admin.close()
        return name

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every node at once (one by one, the last ones wait for a quorum that is gone), then
        SIGKILL what is left after ``timeout``."""
        import signal

        pids = [(n, n.pid) for n in self.nodes]
        for n, pid in pids:
            if pid is not None:
                n._signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for n, pid in pids:
            if pid is not None and not n._wait_exit(pid, max(0.1, deadline - time.monotonic())):
                n._signal(pid, signal.SIGKILL)
                n._wait_exit(pid, 10.0)
            n._forget()
