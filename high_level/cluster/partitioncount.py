"""The job's guard against a Kafka partition count that changes under open windows.

Capture hosts place a group's partials on ``hash(group) mod kafka.partitions`` and the job keeps one
state group per (topic, partition), so a count that changes while a window is open splits that
window's groups over two state groups: each closes on its own and the window is reported twice,
each row short. Growing a topic is safe only at a clean cut (agents stopped, every window closed);
this module makes the job check that at start instead of trusting it:

* the checkpoint records each query's topic and partition count (``lowwater-partitions.json``), written
  once the job has started;
* at the next start, a query whose count differs from the record is accepted only if the job's last
  status document (``<results>/_status.json``, written by the same job) shows no open window of that
  query; otherwise the start is refused with the numbers and the procedure. No status at all is
  refused too: nothing says the windows closed;
* a topic whose partition count differs from the config, either way, is refused
  (:func:`check_topics`: the agents refuse the same, so every role uses the topic's own count).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from contract import query as Q
from contract import results as R
from contract import status as S
from contract.topics import PROCEDURE, PartitionChangeRefused, existing_partitions

log = logging.getLogger("lowwater.partitioncount")

RECORD = "lowwater-partitions.json"


def _local(checkpoint: str | Path) -> Path | None:
    """The checkpoint as a local directory; None for a URI (hdfs://, s3a://: not checked, see the log)."""
    text = str(checkpoint)
    if text.startswith("file:"):
        return Path("/" + text[5:].lstrip("/"))
    return None if "://" in text else Path(text)


def recorded(checkpoint: str | Path) -> dict[str, dict[str, Any]]:
    """query -> {"topic", "partitions"} as the checkpoint last ran; {} for a new (or non-local) checkpoint."""
    d = _local(checkpoint)
    p = None if d is None else d / RECORD
    return json.loads(p.read_text()) if p is not None and p.exists() else {}


def record(checkpoint: str | Path, queries: Iterable[Q.QuerySpec]) -> None:
    """Note the queries' partition counts in the checkpoint (kept for queries not running now)."""
    d = _local(checkpoint)
    if d is None:
        log.warning(
            "checkpoint %s is not a local directory: partition count changes are not checked at start",
            checkpoint,
        )
        return
    p = d / RECORD
    doc = recorded(checkpoint)
    doc.update({q.name: {"topic": q.topic, "partitions": q.kafka.partitions} for q in queries})
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    tmp.replace(p)


def check_change(checkpoint: str | Path, results: str | Path, queries: Iterable[Q.QuerySpec]) -> list[str]:
    """Refuse (PartitionChangeRefused) a changed count while the job's last status has open windows of
    that query; return what changed at a clean cut, one line per query, for the log."""
    before = recorded(checkpoint)
    changed = [
        (q, before[q.name]["partitions"])
        for q in queries
        if q.name in before and before[q.name]["partitions"] != q.kafka.partitions
    ]
    if not changed:
        return []
    try:
        doc = S.read(R.status_path(results))
    except S.StatusUnavailable as exc:
        names = ", ".join(f"{q.name} ({old} -> {q.kafka.partitions})" for q, old in changed)
        raise PartitionChangeRefused(
            f"the Kafka partition count changed for {names} since this checkpoint last ran, and the job's last "
            f"status cannot show that every window had closed ({exc}). Restart with the old kafka.partitions, "
            f"let the windows close with the agents stopped, then change it ({PROCEDURE})"
        ) from None
    out, refuse = [], []
    for q, old in changed:
        st = doc.queries.get(q.name)
        open_windows = None if st is None else st.open_windows
        if open_windows:
            refuse.append(
                f"query {q.name!r}: the checkpoint ran with {old} partitions of {q.topic}, the config now "
                f"has {q.kafka.partitions}, and {open_windows} windows were still open at the job's last "
                "status"
            )
        else:
            out.append(
                f"query {q.name!r}: {old} -> {q.kafka.partitions} partitions of {q.topic} at a clean cut "
                "(no open window at the job's last status)"
            )
    if refuse:
        raise PartitionChangeRefused(
            "; ".join(refuse)
            + ". Their groups would be split over two partitions and reported twice, each short. "
            "Restart with the old kafka.partitions, stop the agents (a graceful stop punctuates), wait until "
            f"/status shows open_windows 0, then change it ({PROCEDURE})"
        )
    return out


def check_topics(admin: Any, queries: Iterable[Q.QuerySpec]) -> None:
    """Refuse a topic whose partition count is not the config's (absent topics are provisioned later)."""
    wanted: Mapping[str, int] = {q.topic: q.kafka.partitions for q in queries}
    have = existing_partitions(admin, sorted(wanted))
    off = {t: (have[t], n) for t, n in wanted.items() if t in have and have[t] != n}
    if off:
        raise PartitionChangeRefused(
            ", ".join(
                f"topic {t} has {h} partitions, the config asks for {n}" for t, (h, n) in sorted(off.items())
            )
            + ": the job reads by the topic's count and the capture hosts place by the config's; they must be "
            f"equal. Grow the topic or set kafka.partitions, at a clean cut ({PROCEDURE})"
        )
