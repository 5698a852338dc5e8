"""Create the Kafka topics of a lowwater config, one per query with its configured partition count.

Why: an agent sends each partial to ``hash(group key) mod kafka.partitions`` of its query's topic, so
a topic that Kafka auto-created with one partition would make those sends fail. Compose runs this
once (service ``kafka-init``) before the job and the agents start; it is idempotent.

* missing topic -> created with the config's partitions and ``--replication-factor``;
* existing topic with fewer partitions -> refused, unless ``--grow``: adding partitions moves groups
  to other partitions, so do it only as deploy/README.md says (agents stopped, no window open);
* existing topic with more partitions -> left alone (extra partitions stay empty), reported.

Usage: ``python /app/deploy/docker/create_topics.py --config Q.yaml --bootstrap kafka:9092
[--replication-factor N] [--kafka-security JSON]`` (the Kafka security block every lowwater role takes,
for SASL/TLS: :class:`contract.kafka_security.KafkaSecurity`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from contract import query as Q
from contract.kafka_security import KafkaSecurity
from contract.topics import (  # noqa: F401 - re-exported for the tests
    PartitionChangeRefused,
    connect,
    ensure_topics,
    existing_partitions,
    wait_partitions,
    wanted_topics,
)

__all__ = ["connect", "ensure_topics", "existing_partitions", "main", "wait_partitions", "wanted_topics"]
log = logging.getLogger("lowwater.create_topics")


def read_hosts(path: str) -> list[str]:
    """Capture host ids of a file, one a line (blank lines and # comments skipped)."""
    with open(path) as fh:
        return [ln.strip() for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]


def capture_host_grants(
    config: Q.Config, hosts: Sequence[str], control_topic: str | None
) -> dict[str, dict[str, set[str]]]:
    """host -> {topic: operations}: WRITE on the topics of the queries (and selects) the host runs, READ
    on the control topic (on-request punctuation), DESCRIBE on both (partition counts, metadata)."""
    out: dict[str, dict[str, set[str]]] = {}
    for h in hosts:
        topics: dict[str, set[str]] = {}
        for q in [*config.queries, *config.selects]:
            if q.runs_on(h):
                topics[q.topic] = {"WRITE", "DESCRIBE"}
        if control_topic:
            topics[control_topic] = {"READ", "DESCRIBE"}
        out[h] = topics
    return out


def apply_grants(admin: Any, grants: dict[str, dict[str, set[str]]]) -> None:
    """Create the ACLs (idempotent: Kafka keeps one copy of an ACL created twice)."""
    from kafka import admin as ka

    acls = [
        ka.ACL(
            f"User:{h}",
            "*",
            ka.ACLOperation[op],
            ka.ACLPermissionType.ALLOW,
            ka.ResourcePattern(ka.ResourceType.TOPIC, topic, ka.ACLResourcePatternType.LITERAL),
        )
        for h, topics in sorted(grants.items())
        for topic, ops in sorted(topics.items())
        for op in sorted(ops)
    ]
    result = admin.create_acls(acls)
    if result.get("failed"):
        raise RuntimeError(f"creating ACLs failed: {result['failed']}")
    for h, topics in sorted(grants.items()):
        log.info(
            "ACLs of User:%s: %s",
            h,
            ", ".join(f"{t} {'+'.join(sorted(o))}" for t, o in sorted(topics.items())),
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="create_topics.py", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config", default="/etc/lowwater/queries.yaml", help="queries YAML (same as agents and job)"
    )
    ap.add_argument("--bootstrap", default="kafka:9092", help="Kafka bootstrap servers")
    ap.add_argument("--replication-factor", type=int, default=1)
    ap.add_argument(
        "--grow",
        action="store_true",
        help="add partitions to topics that have fewer than the config (only with the agents stopped and "
        "no window open: deploy/README.md, 'Changing a query's partition count')",
    )
    ap.add_argument(
        "--kafka-security",
        default=None,
        help="the Kafka security block as JSON (protocol, sasl_mechanism, username, password, ca_file, ...; "
        "the same block every lowwater role takes, deploy/SECURITY.md)",
    )
    ap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the broker")
    ap.add_argument(
        "--capture-hosts",
        metavar="FILE",
        default=None,
        help="capture host ids, one a line (deploy/kafka_secrets.py writes it): give each principal "
        "User:<host> WRITE on its queries' topics and READ on the control topic (Kafka ACLs)",
    )
    ap.add_argument(
        "--control-topic",
        default=None,
        help="also create this one-partition topic: the job's punctuation requests to the agents "
        "(lowwater-job/lowwater-agent --control-topic; the broker does not auto-create topics)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        wanted = wanted_topics(Q.load(args.config).queries)
        if args.control_topic:
            wanted[args.control_topic] = 1
        block = (
            KafkaSecurity.model_validate_json(args.kafka_security) if args.kafka_security else KafkaSecurity()
        )
        security = block.kafka_python()
    except (Q.ConfigError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"create_topics: {exc}", file=sys.stderr)
        return 2
    try:
        config = Q.load(args.config)
        grants = (
            capture_host_grants(config, read_hosts(args.capture_hosts), args.control_topic)
            if args.capture_hosts
            else {}
        )
    except (Q.ConfigError, OSError, ValueError) as exc:
        print(f"create_topics: {exc}", file=sys.stderr)
        return 2
    try:
        admin = connect(args.bootstrap, security, args.wait)
    except RuntimeError as exc:
        print(f"create_topics: {exc}", file=sys.stderr)
        return 1
    try:
        for topic, action in ensure_topics(admin, wanted, args.replication_factor, grow=args.grow).items():
            log.info("%s: %s", topic, action)
        if grants:
            apply_grants(admin, grants)
    except RuntimeError as exc:
        print(f"create_topics: {exc}", file=sys.stderr)
        return 1
    finally:
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
