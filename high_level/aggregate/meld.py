"""Meld: the union of many capture hosts' punctuation into one low-water mark per Kafka partition.

The OOP paper's union keeps only the latest punctuation of each input and forwards min over inputs.
Here the inputs are capture hosts, learned from their punctuation. A host silent for longer than
``host_timeout`` is dead: it leaves the min (so one crashed host does not stall every window) and
comes back when it punctuates again. ``expected_hosts`` makes start-up exact: until every expected
host has punctuated a partition at least once, nothing closes there.

An expected host may name a capture host ``H`` run with ``--workers N``: its workers punctuate as
``H/w0`` .. ``H/wN-1`` and say N in their punctuation (stats ``workers``), so once one of them is
heard the meld waits for all N of them in ``H``'s place (:meth:`expected_ids`).

Silence is counted in processing time, but at most ``max_gap_ms`` per evaluation: a job that was
down (or stuck in one long batch) for a minute has not *observed* a minute of silence, it simply has
not read the punctuation waiting in Kafka yet. Without that cap a restart would declare every host
dead and close windows early.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class HostMark:
    """The latest punctuation of one host on one partition and how long it has been silent."""

    mark_pane: int
    mark_ns: int
    incarnation: int
    sent_wall_ns: int
    last_heard_ms: int
    silent_ms: int = 0
    punctuations: int = 1


class Meld:
    """Per-(query, partition) host marks, liveness and the low-water mark (a pure, serialisable object)."""

    def __init__(
        self, host_timeout_ms: int, expected_hosts: Iterable[str] = (), max_gap_ms: int | None = None
    ) -> None:
        if host_timeout_ms <= 0:
            raise ValueError("host_timeout_ms must be positive")
        self.host_timeout_ms = int(host_timeout_ms)
        self.expected = tuple(sorted(set(expected_hosts)))
        self.max_gap_ms = int(max_gap_ms if max_gap_ms is not None else max(1, host_timeout_ms // 2))
        self.hosts: dict[str, HostMark] = {}
        self.clock_ms: int | None = None
        self.workers: dict[str, int] = {}  # capture host -> its worker count, as its workers said

    def workers_of(self, host: str, count: int) -> None:
        """A punctuation of ``host`` said its capture host runs ``count`` workers (``H/wI`` ids)."""
        cap, sep, _ = host.rpartition("/w")
        if sep and count > 0:
            self.workers[cap] = int(count)

    def expected_ids(self) -> tuple[str, ...]:
        """The host ids the meld waits for: each expected host, or its workers once their count is known."""
        out: list[str] = []
        for h in self.expected:
            n = self.workers.get(h, 0)
            out += [f"{h}/w{i}" for i in range(n)] if n and h not in self.hosts else [h]
        return tuple(out)

    # -- events ---------------------------------------------------------------------------------
    def advance(self, now_ms: int) -> None:
        """Let processing time pass: every host accrues silence (capped per step, see module doc)."""
        if self.clock_ms is not None and now_ms > self.clock_ms:
            step = min(now_ms - self.clock_ms, self.max_gap_ms)
            for h in self.hosts.values():
                h.silent_ms += step
        if self.clock_ms is None or now_ms > self.clock_ms:
            self.clock_ms = now_ms

    def observe(
        self, host: str, incarnation: int, mark_pane: int, mark_ns: int, sent_wall_ns: int, now_ms: int
    ) -> None:
        """A punctuation arrived: it replaces the host's mark and makes the host live again."""
        prev = self.hosts.get(host)
        self.hosts[host] = HostMark(
            mark_pane=int(mark_pane),
            mark_ns=int(mark_ns),
            incarnation=int(incarnation),
            sent_wall_ns=int(sent_wall_ns),
            last_heard_ms=int(now_ms),
            silent_ms=0,
            punctuations=(prev.punctuations + 1) if prev else 1,
        )

    # -- queries --------------------------------------------------------------------------------
    def is_live(self, host: str) -> bool:
        h = self.hosts.get(host)
        return h is not None and h.silent_ms <= self.host_timeout_ms

    def live_hosts(self) -> list[str]:
        return sorted(h for h in self.hosts if self.is_live(h))

    def waiting_for(self) -> list[str]:
        """Expected hosts that have never punctuated this partition (they block every close)."""
        return [h for h in self.expected_ids() if h not in self.hosts]

    def low_water_mark(self) -> int | None:
        """min over live hosts of their latest mark; None when nothing may close (no live host, or an
        expected host not heard yet)."""
        if self.waiting_for():
            return None
        live = self.live_hosts()
        if not live:
            return None
        return min(self.hosts[h].mark_pane for h in live)

    def blocking_hosts(self) -> list[str]:
        """The live hosts whose mark equals the low-water mark (what a user waits for)."""
        lwm = self.low_water_mark()
        if lwm is None:
            return self.waiting_for()
        return [h for h in self.live_hosts() if self.hosts[h].mark_pane == lwm]

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "clock_ms": self.clock_ms,
            "hosts": {k: asdict(v) for k, v in self.hosts.items()},
            "workers": dict(self.workers),
        }

    def load_dict(self, d: dict[str, Any]) -> None:
        """Restore marks saved by :meth:`to_dict` (timeout and expected hosts come from the config)."""
        self.clock_ms = d.get("clock_ms")
        self.hosts = {k: HostMark(**v) for k, v in d.get("hosts", {}).items()}
        self.workers = {k: int(v) for k, v in d.get("workers", {}).items()}
