"""Time values of the API: exact microseconds since the epoch, and the ISO-8601 text responses carry.

Why integers: window bounds are compared and hashed exactly (a float second loses microseconds), and
DuckDB hands timestamps back as ``epoch_us`` integers, so text is made only at the edge.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us_of(t: datetime) -> int:
    """Aware datetime -> microseconds since the epoch (exact, no float)."""
    d = t - EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def iso_of_us(us: int) -> str:
    """Microseconds since the epoch -> ISO-8601 UTC text with 'Z' (milliseconds only when needed)."""
    t = EPOCH + timedelta(microseconds=us)
    if us % 1_000_000 == 0:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    if us % 1000 == 0:
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
