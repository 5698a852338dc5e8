"""``<results>/_status.json`` read defensively and normalised for operators.

The job rewrites the file as it runs and its exact shape may grow, so the raw document is passed
through unchanged and, next to it, a normalised view is derived from whatever keys are present:
one row per capture host (low-water mark = the lowest over partitions, live = live everywhere, lag =
the largest, and the additive counters such as late_partials / missing_records / records / drops
summed over queries and partitions) and per query the low-water mark, open windows, the hosts holding
the mark back (``blocked_by``), per-partition marks and counter totals. Both the agreed shape
(``updated_at``, partition ``low_water_mark``) and the job's (``updated_ms``, ``low_water_mark_ns``)
are understood. Unknown or malformed parts are skipped, never an error.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from high_level.serve.timefmt import iso_of_us

STALE_AFTER_S = 60.0
_MARK_KEYS = ("mark_ns", "low_water_mark_ns", "low_water_mark", "mark")
_LAG_KEYS = ("lag_s", "lag_seconds", "lag")
# additive per-host counters summed over queries and partitions (plus any key about drops/late/missing)
COUNTERS = ("late_partials", "missing_records", "records", "drops", "dropped", "dropped_records", "late_records")


def to_ns(value: Any) -> int | None:
    """A time as ns since the epoch from ns/us/ms/s numbers (by magnitude) or ISO-8601 text."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        v = float(value)
        if not math.isfinite(v):
            return None
        a = abs(v)
        scale = 1 if a >= 1e17 else 1_000 if a >= 1e14 else 1_000_000 if a >= 1e11 else 1_000_000_000
        return int(value) * scale if isinstance(value, int) else int(v * scale)
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.strip())
        except ValueError:
            try:
                return to_ns(float(value))
            except ValueError:
                return None
        t = t.replace(tzinfo=UTC) if t.tzinfo is None else t
        return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000
    return None


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    try:
        return iso_of_us(ns // 1000)
    except (OverflowError, ValueError):
        return None


def _num(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def finite(value: Any) -> Any:
    """The document with NaN/inf replaced by None (JSON has no such numbers; the job might write them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def _first(d: dict, keys: tuple[str, ...]) -> Any:
    return next((d[k] for k in keys if k in d), None)


def _dicts(value: Any) -> list[tuple[str, dict]]:
    return [(str(k), v) for k, v in value.items() if isinstance(v, dict)] if isinstance(value, dict) else []


def _counters(hdoc: dict) -> dict[str, int | float]:
    """The additive per-host counters (late partials, missing records, drops ...) of a host entry."""
    out = {}
    for k, v in hdoc.items():
        if _num(v) is None or k.endswith(("_ms", "_ns", "_s", "_batch", "_pane")):
            continue
        if k in COUNTERS or any(w in k for w in ("drop", "late", "missing", "lost")):
            out[k] = v
    return out


def normalise(raw: Any, now_s: float | None = None) -> dict[str, Any]:
    """The normalised view of a status document (see the module docstring)."""
    now_s = time.time() if now_s is None else now_s
    doc = raw if isinstance(raw, dict) else {}
    updated_ns = to_ns(_first(doc, ("updated_at", "updated_ms", "updated_ns", "now_ms")))
    details: list[dict[str, Any]] = []
    queries: dict[str, Any] = {}
    for qname, qdoc in _dicts(doc.get("queries")):
        qsum: dict[str, Any] = {"low_water_mark": None, "low_water_mark_ns": None, "open_windows": 0, "hosts": 0,
                                "live_hosts": 0, "blocked_by": [], "counters": {}, "partitions": {}}  # fmt: skip
        parts = _dicts(qdoc.get("partitions"))
        if not parts and isinstance(qdoc.get("hosts"), dict):  # hosts given per query only
            parts = [("*", qdoc)]
        marks = []
        for pname, pdoc in parts:
            lwm = to_ns(_first(pdoc, ("low_water_mark", "low_water_mark_ns")))
            marks.append(lwm)
            ow = _num(pdoc.get("open_windows"))
            if ow is not None:
                qsum["open_windows"] += ow
            blocked = [str(h) for h in pdoc.get("blocked_by", []) or []] if isinstance(pdoc.get("blocked_by"), list) else []
            qsum["blocked_by"] += [h for h in blocked if h not in qsum["blocked_by"]]
            qsum["partitions"][pname] = {"low_water_mark": _iso(lwm), "low_water_mark_ns": lwm, "open_windows": ow,
                                         "blocked_by": blocked}  # fmt: skip
            for host, hdoc in _dicts(pdoc.get("hosts")):
                mark = to_ns(_first(hdoc, _MARK_KEYS))
                live = _first(hdoc, ("live", "alive"))
                counters = _counters(hdoc)
                row = {
                    "query": qname, "partition": pname, "host": host,
                    "low_water_mark": _iso(mark), "low_water_mark_ns": mark,
                    "live": live if isinstance(live, bool) else None,
                    "lag_s": _num(_first(hdoc, _LAG_KEYS)), **counters,
                }  # fmt: skip
                details.append(row)
                qsum["hosts"] += 1
                qsum["live_hosts"] += 1 if live is True else 0
                for k, v in counters.items():
                    qsum["counters"][k] = qsum["counters"].get(k, 0) + v
        top = to_ns(qdoc.get("low_water_mark_ns"))
        known = [m for m in marks if m is not None]
        lwm = top if top is not None else (min(known) if known and len(known) == len(marks) else None)
        qsum["low_water_mark"], qsum["low_water_mark_ns"] = _iso(lwm), lwm
        queries[qname] = qsum
    hosts: dict[str, dict[str, Any]] = {}
    for row in details:
        h = hosts.setdefault(row["host"], {"host": row["host"], "live": None, "low_water_mark_ns": None,
                                           "lag_s": None, "queries": []})  # fmt: skip
        if row["query"] not in h["queries"]:
            h["queries"].append(row["query"])
        if row["live"] is not None:  # dead anywhere -> dead
            h["live"] = row["live"] if h["live"] is None else (h["live"] and row["live"])
        m = row["low_water_mark_ns"]
        if m is not None:
            h["low_water_mark_ns"] = m if h["low_water_mark_ns"] is None else min(h["low_water_mark_ns"], m)
        if row["lag_s"] is not None:
            h["lag_s"] = row["lag_s"] if h["lag_s"] is None else max(h["lag_s"], row["lag_s"])
        for k, v in row.items():
            if k not in ("query", "partition", "host", "low_water_mark", "low_water_mark_ns", "live", "lag_s"):
                h[k] = h.get(k, 0) + v
    for h in hosts.values():
        h["low_water_mark"] = _iso(h["low_water_mark_ns"])
    age = None if updated_ns is None else max(0.0, now_s - updated_ns / 1e9)
    return {
        "updated_at": _iso(updated_ns),
        "age_s": age,
        "stale": age is None or age > STALE_AFTER_S,
        "hosts": sorted(hosts.values(), key=lambda h: h["host"]),
        "host_details": details,
        "queries": queries,
    }


def read_status(results_dir: Path) -> dict[str, Any]:
    """The API's /status body: availability, the normalised view and the raw document."""
    path = results_dir / "_status.json"
    raw: Any = None
    error = None
    for _ in range(3):  # the job may be replacing the file right now
        try:
            raw = finite(json.loads(path.read_text()))
            error = None
            break
        except FileNotFoundError:
            error = "no _status.json yet (is the high-level job running?)"
            break
        except (OSError, ValueError) as exc:
            error = f"_status.json unreadable: {exc}"
            time.sleep(0.02)
    body = {"available": error is None, "error": error, **normalise(raw), "raw": raw}
    return body
