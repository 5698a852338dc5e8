"""Which stored granularity answers a stepped request: raw windows or one of the query's roll-up tiers.

One function so the rule lives in one place: the coarsest tier that is not coarser than the step
(its width divides the step, so every bucket holds whole tier rows) and whose retention still covers
the range's start; raw windows otherwise. A coarser tier reads fewer rows for the same exact answer
(count/sum/min/max/avg re-merge exactly; see :mod:`contract.results`).
"""

from __future__ import annotations

from dataclasses import dataclass

RAW = "raw"


@dataclass(frozen=True)
class TierOption:
    """A tier a query keeps: its width and how far back it reaches (None: forever)."""

    name: str
    width_ns: int
    retention_ns: int | None


def choose(options: list[TierOption], start_ns: int, step_ns: int | None, now_ns: int) -> TierOption | None:
    """The tier answering a request starting at ``start_ns`` with ``step_ns`` buckets; None: raw."""
    if not step_ns:
        return None
    fits = [
        t
        for t in options
        if t.width_ns <= step_ns
        and step_ns % t.width_ns == 0
        and start_ns % t.width_ns == 0
        and (t.retention_ns is None or start_ns >= now_ns - t.retention_ns)
    ]
    return max(fits, key=lambda t: t.width_ns, default=None)
