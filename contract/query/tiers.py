"""Roll-up tiers and retention in a query's config: parsed and validated (the store's side is
high_level/results/tiers.py, the layout contract/results.py)."""

from __future__ import annotations

from typing import Any

from contract import aggregates as A
from contract.query.durations import duration_name, parse_duration_ns


def parse_tiers(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, list | tuple):
        raise ValueError("tiers is a list of widths, e.g. [5m, 1h, 1d]")
    return tuple(parse_duration_ns(x) for x in v)


def check_tiers(v: tuple[int, ...], w: Any, aggs: Any) -> tuple[int, ...]:
    """Each tier a larger multiple of the window and of the tier before it; only exact re-merges."""
    if not v or w is None or aggs is None:
        return v  # no tiers, or the window or aggregates already failed: that error is the one reported
    if w.landmark or not w.tumbling:
        raise ValueError("roll-up tiers need a tumbling window (range = slide, not a landmark)")
    names = [a.fn for a in aggs]
    bad = [a for a in aggs if a.fn not in A.TIER_STATES]
    if bad:
        why = A.TIER_REFUSED.get(bad[0].fn, "no exact re-merge")
        raise ValueError(
            f"aggregates {[a.name for a in bad]} do not re-merge exactly from stored windows ({bad[0].fn}: "
            f"{why}; tiers offer {', '.join(A.TIER_STATES)}): split them into a query without tiers"
        )
    if any(A.TIER_STATES[a.fn].needs_count for a in aggs) and "count" not in names:
        raise ValueError("avg in a tier needs a count aggregate in the query (its weight)")
    prev = w.range_ns
    for t in v:
        if t <= prev or t % prev:
            raise ValueError(
                f"tier {duration_name(t)} must be a larger multiple of "
                f"{'the window' if prev == w.range_ns else 'the tier before it'} ({duration_name(prev)})"
            )
        prev = t
    return v


def parse_retention(v: Any, raw: str) -> dict[str, int]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError("retention maps a tier ('raw', '5m', ...) to a duration, e.g. {raw: 15d, 1h: 400d}")
    out: dict[str, int] = {}
    for k, d in v.items():
        name = raw if k == raw else duration_name(parse_duration_ns(k))
        if name in out:
            raise ValueError(f"retention of tier {name} given twice")
        out[name] = parse_duration_ns(d)
        if out[name] <= 0:
            raise ValueError(f"retention of tier {name} must be positive")
    return out


def check_retention(v: dict[str, int], widths: tuple[int, ...], raw: str) -> dict[str, int]:
    known = [raw, *(duration_name(t) for t in widths)]
    unknown = sorted(set(v) - set(known))
    if unknown:
        raise ValueError(f"retention of {unknown}: not a tier of this query ({', '.join(known)})")
    return v
