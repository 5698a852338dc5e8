"""The status document (``<results>/_status.json``): written by the high-level job, read by the API.

One validated definition (pydantic) instead of a writer that emits a dict and a reader that guesses
its keys and units. Everything is computed once, by the job: per partition (what each Spark state
group reports), per query and host (summed or min/max over partitions) and per capture host (over
queries). The API validates the file against :class:`StatusDocument` and serves it as it is; a file
that does not validate is reported as unavailable with the reason, never half-read.

Units are in the names: ``*_ns`` nanoseconds since the epoch, ``*_ms`` milliseconds since the epoch,
``*_s`` seconds (durations). A host id of the form ``H/wN`` is worker N of capture host H.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contract.wire import END_OF_STREAM

VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class RestartInfo(_Model):
    """An agent restart seen on one partition: windows from ``incomplete_from_pane`` may miss data."""

    old_incarnation: int
    new_incarnation: int
    incomplete_from_pane: int
    new_mark_pane: int


class HostOnPartition(_Model):
    """One capture host as one (query, Kafka partition) sees it."""

    live: bool
    expected: bool
    mark_pane: int | None
    mark_ns: int | None
    lag_s: float | None
    last_heard_ms: int | None
    silent_s: float | None
    punctuations: int
    incarnation: int | None
    records: int
    sent_records: int
    received_records: int
    missing_records: int
    late_partials: int
    restarts: int = 0
    last_restart: RestartInfo | None = None
    late_batch: int = 0
    # records the host lost before Kafka, by cause (socket, ring, late: wire.LOSS_CAUSES), charged to windows
    losses: dict[str, int] = Field(default_factory=dict)
    malformed: int = 0  # frames the host's parser rejected (reported; not a loss of the query's records)


class PartitionStatus(_Model):
    """What the state group of one (query, Kafka partition) reports after each micro-batch."""

    query: str
    partition: int
    now_ms: int
    low_water_mark_pane: int | None
    low_water_mark_ns: int | None
    closed_before_window: int | None
    blocked_by: list[str]
    live_hosts: int
    open_windows: int
    state_rows: int
    state_bytes: int = 0  # join queries: bytes of the stored input rows (state_rows counts them)
    windows_closed: int
    windows_closed_batch: int = 0
    records: int
    batch: dict[str, int] = Field(default_factory=dict)
    errors: dict[str, int] = Field(default_factory=dict)
    last_error: str = ""
    hosts: dict[str, HostOnPartition]


class _HostTotals(_Model):
    """A capture host's figures folded over several (query, partition) views: dead anywhere is dead,
    the lowest mark, the largest lag, counters summed (restarts: the most seen on one partition)."""

    live: bool = True
    low_water_mark_ns: int | None = None
    lag_s: float | None = None
    late_partials: int = 0
    missing_records: int = 0
    records: int = 0
    restarts: int = 0

    def fold(
        self,
        live: bool,
        mark_ns: int | None,
        lag_s: float | None,
        late: int,
        missing: int,
        records: int,
        restarts: int,
    ) -> None:
        self.live = self.live and live
        if mark_ns is not None:
            self.low_water_mark_ns = (
                mark_ns if self.low_water_mark_ns is None else min(self.low_water_mark_ns, mark_ns)
            )
        if lag_s is not None:
            self.lag_s = lag_s if self.lag_s is None else max(self.lag_s, lag_s)
        self.late_partials += late
        self.missing_records += missing
        self.records += records
        self.restarts = max(self.restarts, restarts)


class HostOnQuery(_HostTotals):
    """One capture host over every partition of one query."""

    partitions: int = 0


class QueryStatus(_Model):
    """One query over its partitions. ``hosts`` counts capture hosts (not partitions)."""

    low_water_mark_ns: int | None
    open_windows: int
    state_rows: int
    windows_closed: int
    partitions_total: int
    hosts_total: int
    hosts_live: int
    blocked_by: list[str]
    hosts: dict[str, HostOnQuery]
    partitions: dict[str, PartitionStatus]


class HostStatus(_HostTotals):
    """One capture host over every query: what the results page's host table shows. A worker ``H/wN``
    of a capture host run with ``--workers`` says which host it belongs to (``capture_host``, ``worker``)."""

    host: str
    queries: list[str] = Field(default_factory=list)
    capture_host: str | None = None
    worker: str | None = None


class CaptureHostStatus(_HostTotals):
    """A capture host with all its workers (a host run without workers is its own single worker):
    dead if any worker is dead, the lowest mark, the largest lag, counters summed."""

    host: str
    workers: list[str] = Field(default_factory=list)
    workers_live: int = 0
    queries: list[str] = Field(default_factory=list)


class JobSettings(_Model):
    trigger_ms: int
    host_timeout_ms: int
    expected_hosts: list[str]
    late_policy: str
    watermark_delay_ms: int
    alert_webhook: bool = False  # alerts are delivered somewhere (else the page says so, not "pending")
    retention_days: int | None = None  # result files of older windows are deleted (None: kept)


class StreamProgress(_Model):
    """Spark's own numbers of the last micro-batch of one streaming query."""

    batch_id: int | None
    input_rows: int | None
    duration_ms: int | None
    state_rows: int
    state_memory_bytes: int
    dropped_by_watermark: int


class CompactionStatus(_Model):
    """What the store's maintenance task (high_level/results/compact.py) did since the job started."""

    runs: int = 0
    last_run_ms: int | None = None
    committed_batch: int | None = None  # Spark's last committed batch: files of older batches are final
    files_merged: int = 0  # micro-batch (or smaller compacted) files merged into larger ones
    files_deleted: int = 0  # covered files deleted after their merged file was in place
    tier_rows: int = 0  # tier rows written
    errors: int = 0
    last_error: str | None = None


class StatusDocument(_Model):
    """``updated_ms`` is when the job last wrote it (it rewrites it while idle: freshness = the job is up);
    the per-partition ``now_ms`` is when each partition last processed data."""

    version: Literal[1] = VERSION
    mode: Literal["oop", "watermark"]
    updated_ms: int
    batch_id: int | None
    settings: JobSettings
    queries: dict[str, QueryStatus]
    hosts: list[HostStatus]
    progress: dict[str, StreamProgress] = Field(default_factory=dict)
    store_bytes: int | None = None  # size of the results directory at the last retention check
    # per query, per tier ("raw": the window files, then each roll-up tier): bytes at the last check
    tier_bytes: dict[str, dict[str, int]] = Field(default_factory=dict)
    compaction: CompactionStatus | None = None  # the store's background compaction and tier builder
    # the hosts grouped per capture host (workers H/wN under H): derived from ``hosts`` when not given
    capture_hosts: list[CaptureHostStatus] = Field(default_factory=list)

    @model_validator(mode="after")
    def _group_workers(self) -> StatusDocument:
        if self.hosts and not self.capture_hosts:
            self.capture_hosts = group_workers(self.hosts)
        return self

    def stream_ended(self, host: str, incarnation: int) -> bool:
        """``host`` (this ``incarnation`` of its agent, not an earlier run's) has sent its end-of-stream
        mark on every partition of every query and no window is open: the results of its finite capture
        are complete (what ``lowwater-stack`` waits for)."""
        if not self.queries:
            return False
        for q in self.queries.values():
            if not q.partitions:
                return False
            for p in q.partitions.values():
                h = p.hosts.get(host)
                if (
                    p.open_windows
                    or h is None
                    or h.incarnation != incarnation
                    or h.mark_pane is None
                    or h.mark_pane < END_OF_STREAM
                ):
                    return False
        return True


class StatusUnavailable(RuntimeError):
    """No status document, or one that does not validate (the reason says which)."""


def summarize_query(parts: Mapping[int, PartitionStatus]) -> QueryStatus:
    """Per-query roll-up of per-partition status: min marks, host liveness, late/missing totals."""
    hosts: dict[str, HostOnQuery] = {}
    for p in parts.values():
        for name, h in p.hosts.items():
            agg = hosts.setdefault(name, HostOnQuery())
            agg.partitions += 1
            agg.fold(h.live, h.mark_ns, h.lag_s, h.late_partials, h.missing_records, h.records, h.restarts)
    marks = [p.low_water_mark_ns for p in parts.values()]
    blocked: list[str] = []
    for p in parts.values():
        blocked += [h for h in p.blocked_by if h not in blocked]
    return QueryStatus(
        low_water_mark_ns=min(marks) if marks and all(m is not None for m in marks) else None,  # type: ignore[type-var]
        open_windows=sum(p.open_windows for p in parts.values()),
        state_rows=sum(p.state_rows for p in parts.values()),
        windows_closed=sum(p.windows_closed for p in parts.values()),
        partitions_total=len(parts),
        hosts_total=len(hosts),
        hosts_live=sum(1 for h in hosts.values() if h.live),
        blocked_by=blocked,
        hosts=dict(sorted(hosts.items())),
        partitions={str(k): v for k, v in sorted(parts.items())},
    )


_WORKER = re.compile(r"(?P<host>.+)/(?P<worker>w[0-9]+)")


def split_worker(host_id: str) -> tuple[str, str | None]:
    """``edge-1/w3`` -> (``edge-1``, ``w3``); a host id without a worker suffix -> (itself, None)."""
    m = _WORKER.fullmatch(host_id)
    return (m["host"], m["worker"]) if m else (host_id, None)


def group_workers(hosts: list[HostStatus]) -> list[CaptureHostStatus]:
    """The hosts' workers folded per capture host (sorted by host; workers in worker order)."""
    out: dict[str, CaptureHostStatus] = {}
    for h in hosts:
        cap, worker = split_worker(h.host)
        g = out.setdefault(cap, CaptureHostStatus(host=cap))
        g.workers.append(h.host)
        g.workers_live += int(h.live)
        g.queries += [q for q in h.queries if q not in g.queries]
        g.fold(
            h.live, h.low_water_mark_ns, h.lag_s, h.late_partials, h.missing_records, h.records, h.restarts
        )
    for g in out.values():
        g.workers.sort(key=lambda w: (len(w), w))
    return [out[k] for k in sorted(out)]


def summarize_hosts(queries: Mapping[str, QueryStatus]) -> list[HostStatus]:
    """Per capture host over every query (dead anywhere is dead; lowest mark, largest lag, sums)."""
    out: dict[str, HostStatus] = {}
    for qname, q in sorted(queries.items()):
        for name, h in q.hosts.items():
            cap, worker = split_worker(name)
            worker_of = {"capture_host": cap, "worker": worker} if worker else {}
            agg = out.setdefault(name, HostStatus(host=name, **worker_of))
            agg.queries.append(qname)
            agg.fold(
                h.live,
                h.low_water_mark_ns,
                h.lag_s,
                h.late_partials,
                h.missing_records,
                h.records,
                h.restarts,
            )
    return [out[k] for k in sorted(out)]


def read(path: str | Path) -> StatusDocument:
    """The validated document at ``path``; :class:`StatusUnavailable` with the reason otherwise."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise StatusUnavailable(f"no {Path(path).name} yet (is the high-level job running?)") from None
    except OSError as exc:
        raise StatusUnavailable(f"{path}: {exc.strerror}") from None
    try:
        return StatusDocument.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise StatusUnavailable(
            f"{Path(path).name} does not follow the status contract ({exc.error_count()} errors; "
            f"first at {where or 'top level'}: {first.get('msg')})"
        ) from None
