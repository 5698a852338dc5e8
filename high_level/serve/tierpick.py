"""Which stored granularity answers a stepped request: raw windows or one of the query's roll-up tiers.

One module so the rules live in one place. A stepped series (:func:`choose`): the coarsest tier that is not coarser than the step
(its width divides the step, so every bucket holds whole tier rows) and whose retention still covers
the range's start; raw windows otherwise. A coarser tier reads fewer rows for the same exact answer
(count/sum/min/max/avg re-merge exactly; see :mod:`contract.results`). A sum over a range (a top,
:func:`plan`): the coarsest tier for the whole units of it in the middle, finer ones at the edges.
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


def plan(options: list[TierOption], start_ns: int, end_ns: int, now_ns: int) -> list[tuple[str, int, int]]:
    """A range split into parts, each read from the coarsest tier holding whole rows of it: the
    aligned middle from the coarsest tier, the edges from finer ones, what no tier holds whole from
    raw windows; (tier name or RAW, start_ns, end_ns) in time order. For sums over a range (a top),
    where no step asks for a granularity: a month's top reads ~30 day rows per group, not 43,200."""
    usable = sorted(
        (t for t in options if t.retention_ns is None or start_ns >= now_ns - t.retention_ns),
        key=lambda t: t.width_ns,
        reverse=True,
    )

    def split(s: int, e: int, tiers: list[TierOption]) -> list[tuple[str, int, int]]:
        if s >= e:
            return []
        for i, t in enumerate(tiers):
            a, b = -(-s // t.width_ns) * t.width_ns, e // t.width_ns * t.width_ns
            if a < b:
                return [*split(s, a, tiers[i + 1 :]), (t.name, a, b), *split(b, e, tiers[i + 1 :])]
        return [(RAW, s, e)]

    return split(start_ns, end_ns, usable)
