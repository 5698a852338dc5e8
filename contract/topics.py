"""The Kafka topics a lowwater config needs, and making them exist with the right partition counts.

Agents send each partial to ``hash(group key) mod kafka.partitions`` of its query's topic, so a topic
that Kafka auto-created with one partition would make those sends fail. The agent, the job and the
deployment's init step all call :func:`ensure_topics`; it is idempotent.

* missing topic -> created with the config's partitions;
* existing topic with fewer partitions -> refused (:class:`PartitionChangeRefused`), unless the
  caller passes ``grow=True`` (``create_topics.py --grow``, run by an operator following the
  procedure in deploy/README.md): adding partitions moves groups to other partitions, so a window
  open across the change would be split over two state groups;
* existing topic with more partitions -> left alone (extra partitions stay empty), reported; refused
  with ``exact=True``, which the agents and the job pass: every role must place and read by the
  topic's own count, or a capture host whose config is stale would send a group to another partition
  than the hosts already on the new count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from contract import query as Q

log = logging.getLogger("lowwater.topics")


def wanted_topics(queries: Iterable[Q.QuerySpec]) -> dict[str, int]:
    """topic -> partitions of every query; two queries sharing a topic must agree on the count."""
    out: dict[str, int] = {}
    owner: dict[str, str] = {}
    for q in queries:
        n = q.kafka.partitions
        if q.topic in out and out[q.topic] != n:
            raise ValueError(
                f"queries {owner[q.topic]!r} and {q.name!r} share topic {q.topic!r} "
                f"but ask for {out[q.topic]} and {n} partitions"
            )
        out[q.topic] = n
        owner.setdefault(q.topic, q.name)
    return out


def existing_partitions(admin: Any, topics: Sequence[str]) -> dict[str, int]:
    """Partition count of each of ``topics`` that exists (absent ones are left out)."""
    present = set(admin.list_topics())
    names = [t for t in topics if t in present]
    if not names:
        return {}
    out = {}
    for d in admin.describe_topics(names):
        name = d.get("name", d.get("topic"))  # kafka-python 3.x says "name", 2.x said "topic"
        if d.get("error_code", 0) == 0 and name in names:
            out[name] = len(d["partitions"])
    return out


class PartitionChangeRefused(RuntimeError):
    """A topic has fewer partitions than the config asks for, and growing it was not asked for."""


PROCEDURE = "deploy/README.md, 'Changing a query's partition count'"


def _mismatch(have: Mapping[str, int], wanted: Mapping[str, int]) -> str:
    return ", ".join(
        f"topic {t} has {have[t]} partitions, the config asks for {n}" for t, n in sorted(wanted.items())
    )


def ensure_topics(
    admin: Any,
    wanted: Mapping[str, int],
    replication: int = 1,
    grow: bool = False,
    timeout_ms: int = 30_000,
    exact: bool = False,
) -> dict[str, str]:
    """Make every topic of ``wanted`` exist with at least its partitions; return topic -> action.

    ``exact``: a topic with more partitions than wanted is refused too (agents, job), not reported."""
    have = existing_partitions(admin, sorted(wanted))
    actions: dict[str, str] = {}
    more = {t: n for t, n in wanted.items() if t in have and have[t] > n}
    if more and exact:
        raise PartitionChangeRefused(
            _mismatch(have, more)
            + ": the config's kafka.partitions must equal the topic's (partials are placed by hash mod partitions;"
            " hosts on two counts would split a group over two partitions). Set kafka.partitions to the topic's"
            f" count on every capture host and the job, at a clean cut ({PROCEDURE})"
        )
    grow_to = {t: n for t, n in wanted.items() if t in have and have[t] < n}
    if grow_to and not grow:
        raise PartitionChangeRefused(
            _mismatch(have, grow_to)
            + ": lowwater does not add partitions by itself (a group's partials would move to another partition,"
            " splitting the windows open across the change). To change it: stop the agents, wait until /status"
            " shows no open windows, run create_topics.py --grow, restart the job and the agents"
            f" ({PROCEDURE})"
        )
    create = {t: n for t, n in wanted.items() if t not in have}
    if create:
        admin.create_topics(
            {t: {"num_partitions": n, "replication_factor": replication} for t, n in sorted(create.items())},
            timeout_ms=timeout_ms,
        )
        actions.update({t: f"created with {n} partitions" for t, n in create.items()})
    if grow_to:
        admin.create_partitions(dict(sorted(grow_to.items())), timeout_ms=timeout_ms)
        actions.update({t: f"grown from {have[t]} to {n} partitions" for t, n in grow_to.items()})
    for t, n in wanted.items():
        if t in have and have[t] >= n:
            actions[t] = "exists" if have[t] == n else f"exists with {have[t]} partitions (config: {n})"
    admin.wait_for_topics(sorted(wanted), timeout_ms=timeout_ms)
    if create or grow_to:
        wait_partitions(admin, wanted, timeout_ms / 1000)
    return dict(sorted(actions.items()))


def wait_partitions(admin: Any, wanted: Mapping[str, int], timeout_s: float) -> None:
    """Block until the metadata shows every topic with at least its wanted partitions.

    wait_for_topics only waits for leaders of the partitions the metadata already lists; added
    partitions show up in the metadata a little later (seen on a real KRaft broker).
    """
    end = time.monotonic() + timeout_s
    while True:
        have = existing_partitions(admin, sorted(wanted))
        short = {t: n for t, n in wanted.items() if have.get(t, 0) < n}
        if not short:
            return
        if time.monotonic() >= end:
            raise RuntimeError(f"partitions not visible after {timeout_s:.0f}s: {short} (have {have})")
        time.sleep(0.2)


def connect(bootstrap: str, security: Mapping[str, Any], deadline_s: float) -> Any:
    """A KafkaAdminClient, retrying until the broker answers or the deadline passes."""
    from kafka import KafkaAdminClient

    end = time.monotonic() + deadline_s
    while True:
        try:
            return KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="lowwater-create-topics",
                bootstrap_timeout_ms=int(min(deadline_s, 10) * 1000),
                request_timeout_ms=30_000,
                **security,
            )
        except Exception as exc:  # noqa: BLE001 - NoBrokersAvailable, connection errors: retry
            if time.monotonic() >= end:
                raise RuntimeError(
                    f"Kafka at {bootstrap} not reachable after {deadline_s:.0f}s: {exc}"
                ) from exc
            log.info("waiting for Kafka at %s (%s)", bootstrap, exc)
            time.sleep(2)
