"""Durations in configs: '10s', '1m', '500ms' or seconds, and the short name of a width (5m, 1h, 1d)."""

from __future__ import annotations

import re
from typing import Any

NS = 1_000_000_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|min|h|d)?\s*$")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": NS,
    "m": 60 * NS,
    "min": 60 * NS,
    "h": 3600 * NS,
    "d": 86400 * NS,
}


def parse_duration_ns(value: Any) -> int:
    """'10s', '1m', '500ms', or a number of seconds -> nanoseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '10s', '1m', '500ms'")
    if isinstance(value, int | float):
        ns = int(round(value * NS))
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        ns = int(round(float(m.group(1)) * _UNIT_NS[m.group(2) or "s"]))
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. '10s', '1m', '500ms')")
    return ns


def duration_name(ns: int) -> str:
    """A width as its shortest exact name in the largest unit that divides it: 5m, 1h, 1d, 90s, 1500ms."""
    for unit in ("d", "h", "m", "s", "ms", "us"):
        step = _UNIT_NS[unit]
        if ns > 0 and ns % step == 0:
            return f"{ns // step}{unit}"
    return f"{ns}ns"
