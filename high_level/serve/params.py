"""Parsing and validating user parameters of the API.

Everything a user sends is checked here and turned into plain values (datetimes, ints, canonical
address text, validated column names) before any SQL is built, so bad input is a 400 with a message
that says what was wrong, never a database error, and nothing a user typed is ever spliced into SQL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from contract.query import parse_duration_ns

DEFAULT_RANGE = timedelta(hours=1)
MAX_RANGE = timedelta(days=7)
MAX_STEPPED_RANGE = timedelta(days=400)  # with a step: months (a year of 1d steps, a month of 1m steps)
MAX_STEPS = 50_000  # buckets of one stepped request
MIN_STEP = timedelta(seconds=1)
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
MAX_TOP = 1000
MAX_OFFSET = 10_000_000
MAX_FILTERS = 64
MAX_ORDER_TERMS = 8
_MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_TIME = datetime(2200, 1, 1, tzinfo=UTC)
_EPOCH = re.compile(r"^\s*\d{1,15}(\.\d{1,9})?\s*$")
_RELATIVE = re.compile(r"^\s*(now)?\s*(?:-\s*(.+))?$")
_INT = re.compile(r"^\s*[+-]?\d{1,20}\s*$")
_I64 = (-(1 << 63), (1 << 63) - 1)


class ParamError(ValueError):
    """A parameter that cannot be used; the API turns it into a 400 carrying this message."""


def parse_time(name: str, value: str, now: datetime) -> datetime:
    """ISO-8601 (naive = UTC), epoch seconds, ``now`` or ``now-15m`` / ``-15m`` -> aware UTC datetime."""
    text = value.strip()
    if not text:
        raise ParamError(f"{name}: empty time")
    try:
        if _EPOCH.match(text):
            us = int(Decimal(text) * 1_000_000)
            if not 0 <= us <= int((_MAX_TIME - _MIN_TIME).total_seconds()) * 1_000_000:
                raise ParamError(f"{name}: {value!r} is outside 1970..2200")
            t = _MIN_TIME + timedelta(microseconds=us)
        elif (m := _RELATIVE.match(text)) and (m.group(1) or m.group(2)):
            back = parse_duration_ns(m.group(2).strip()) if m.group(2) else 0
            t = now - timedelta(microseconds=back // 1000)
        else:
            t = datetime.fromisoformat(text)
            t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    except (ValueError, ArithmeticError, InvalidOperation) as exc:
        raise ParamError(
            f"{name}: {value!r} is not a time (use ISO-8601 like 2024-05-01T12:00:00Z, epoch seconds, "
            f"'now' or 'now-15m'): {exc}"
        ) from None
    if not _MIN_TIME <= t <= _MAX_TIME:
        raise ParamError(f"{name}: {value!r} is outside 1970..2200")
    return t


def _start_end(
    start: str | None, end: str | None, now: datetime, newest: datetime | None
) -> tuple[datetime, datetime]:
    """start and end parsed; without end: ``newest`` (the end of the newest closed window) when start is
    not given either, else now; without start: DEFAULT_RANGE before the end."""
    if end is not None:
        e = parse_time("end", end, now)
    else:
        e = newest if start is None and newest is not None else now
    s = parse_time("start", start, now) if start is not None else e - DEFAULT_RANGE
    if s >= e:
        raise ParamError(f"start ({s.isoformat()}) must be before end ({e.isoformat()})")
    return s, e


def time_range(
    start: str | None, end: str | None, now: datetime, newest: datetime | None = None
) -> tuple[datetime, datetime]:
    """The [start, end) a results request covers, at most MAX_RANGE long. Default: the hour up to ``newest``
    (the end of the newest closed window) when neither bound is given, so a replayed capture or a stopped
    one still shows its last hour; else the hour up to ``end``, or from ``start`` to now."""
    s, e = _start_end(start, end, now, newest)
    if e - s > MAX_RANGE:
        raise ParamError(
            f"time range {e - s} is longer than the maximum {MAX_RANGE} without a step; narrow start/end, "
            f"or add a step (e.g. step=1h) to /series, /top or /percentile, which accept up to {MAX_STEPPED_RANGE}"
        )
    return s, e


def parse_step(value: str | None, slide_ns: int) -> int | None:
    """``step=1h`` -> nanoseconds, a whole multiple of the query's window slide (a bucket holds whole
    windows) and at least a second; None when not given."""
    if value is None:
        return None
    try:
        ns = parse_duration_ns(value.strip())
    except ValueError as exc:
        raise ParamError(f"step: {exc}") from None
    if ns < MIN_STEP.total_seconds() * 1e9 or ns > MAX_STEPPED_RANGE.total_seconds() * 1e9:
        raise ParamError(f"step: {value!r} must be between {MIN_STEP} and {MAX_STEPPED_RANGE}")
    if ns % slide_ns:
        raise ParamError(
            f"step: {value!r} is not a whole multiple of the query's window slide ({slide_ns / 1e9:g}s)"
        )
    return ns


def stepped_range(
    start: str | None, end: str | None, step_ns: int, now: datetime, newest: datetime | None = None
) -> tuple[datetime, datetime]:
    """The [start, end) of a stepped request, widened to whole steps (start down, end up, aligned to the
    epoch), at most MAX_STEPPED_RANGE and MAX_STEPS steps long."""
    s, e = _start_end(start, end, now, newest)
    if e - s > MAX_STEPPED_RANGE:
        raise ParamError(
            f"time range {e - s} is longer than the maximum {MAX_STEPPED_RANGE}; narrow start/end"
        )
    step_us = step_ns // 1000
    s_us = int((s - _MIN_TIME) / timedelta(microseconds=1))
    e_us = int((e - _MIN_TIME) / timedelta(microseconds=1))
    s_us -= s_us % step_us
    e_us += -e_us % step_us
    if (e_us - s_us) // step_us > MAX_STEPS:
        raise ParamError(
            f"{(e_us - s_us) // step_us} steps of {step_ns / 1e9:g}s: at most {MAX_STEPS}; use a larger step"
        )
    return _MIN_TIME + timedelta(microseconds=s_us), _MIN_TIME + timedelta(microseconds=e_us)


def parse_percentile(value: str | None) -> float:
    """``p=95`` -> 95.0 (0 < p <= 100; default 95, the billing percentile)."""
    if value is None:
        return 95.0
    try:
        p = float(value)
    except ValueError:
        raise ParamError(f"p: {value!r} is not a number (e.g. 95)") from None
    if not 0 < p <= 100:
        raise ParamError(f"p: {value!r} must be in (0, 100]")
    return p


def parse_column(name: str, value: str | None, allowed: list[str], default: str) -> str:
    """An aggregate column named by the user, one of ``allowed`` (additive ones, for sums over windows)."""
    if value is None:
        return default
    col = value.strip()
    if col not in allowed:
        raise ParamError(
            f"{name}: {value!r} is not an additive aggregate column of this query (a sum over windows needs "
            f"count or sum); use one of {', '.join(allowed) or '(none)'}"
        )
    return col


# ---- cursor paging: the last row's sort key, tied to the request it pages
def request_fingerprint(*parts: object) -> str:
    """A short hash of what a cursor belongs to (query, resolved range, filters, order)."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def encode_cursor(fingerprint: str, start_us: int, end_us: int, key: list) -> str:
    """An opaque cursor: the resolved range (so 'now-1h' does not move between pages) and the sort key."""
    doc = json.dumps({"f": fingerprint, "s": start_us, "e": end_us, "k": key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode().rstrip("=")


@dataclass(frozen=True)
class Cursor:
    fingerprint: str
    start_us: int
    end_us: int
    key: list


def decode_cursor(value: str) -> Cursor:
    """The cursor of a previous page; anything that is not one is a 400."""
    bad = ParamError("cursor: not a cursor this API returned (take next_cursor of the previous page as is)")
    try:
        raw = base64.urlsafe_b64decode(value.strip() + "=" * (-len(value.strip()) % 4))
        doc = json.loads(raw)
        c = Cursor(str(doc["f"]), int(doc["s"]), int(doc["e"]), list(doc["k"]))
    except (ValueError, binascii.Error, KeyError, TypeError, UnicodeDecodeError):
        raise bad from None
    if not all(v is None or isinstance(v, int | float | str | bool) for v in c.key):
        raise bad
    return c


@dataclass(frozen=True)
class KeyFilter:
    """One condition on a group-key column, already validated.

    ``op``: ``eq`` (value is canonical address text or an int), ``v4prefix`` (value is the
    dotted-text prefix ending in '.'), ``v4range`` / ``v6range`` (value is (lo, hi) inclusive as int /
    32-digit hex), ``v4all`` / ``v6all`` (any address of that family).
    """

    column: str
    op: str
    value: object
    text: str
    bounds: tuple[int, int] | None = None  # prefixes: first/last address in lowwater's 128-bit space


V4_MAPPED = 0xFFFF << 32


def _bounds(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int]:
    lo, hi = int(net.network_address), int(net.broadcast_address)
    return (V4_MAPPED | lo, V4_MAPPED | hi) if net.version == 4 else (lo, hi)


def _ip_filter(column: str, raw: str) -> KeyFilter:
    text = raw.strip()
    try:
        if "/" in text:
            net: ipaddress.IPv4Network | ipaddress.IPv6Network = ipaddress.ip_network(text, strict=False)
            if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
                mapped = net.network_address.ipv4_mapped
                if mapped is not None:  # ::ffff:a.b.c.d/104 is how IPv4 looks in lowwater's 128-bit space
                    net = ipaddress.IPv4Network((mapped, net.prefixlen - 96), strict=False)
        else:
            addr = ipaddress.ip_address(text)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            return KeyFilter(column, "eq", str(addr), raw)
    except ValueError:
        raise ParamError(
            f"filter on {column}: {raw!r} is not an IP address or prefix (e.g. 10.0.0.0/8, 2001:db8::/32)"
        ) from None
    p = net.prefixlen
    if p == net.max_prefixlen:
        return KeyFilter(column, "eq", str(net.network_address), raw)
    b = _bounds(net)
    if isinstance(net, ipaddress.IPv4Network):
        if p == 0:
            return KeyFilter(column, "v4all", None, raw, b)
        if p % 8 == 0:  # whole octets: a string prefix of the dotted text, cheaper than parsing
            octets = str(net.network_address).split(".")[: p // 8]
            return KeyFilter(column, "v4prefix", ".".join(octets) + ".", raw, b)
        return KeyFilter(column, "v4range", (int(net.network_address), int(net.broadcast_address)), raw, b)
    if p == 0:
        return KeyFilter(column, "v6all", None, raw, b)
    lo, hi = int(net.network_address), int(net.broadcast_address)
    return KeyFilter(column, "v6range", (f"{lo:032x}", f"{hi:032x}"), raw, b)


def _int_filter(column: str, raw: str) -> KeyFilter:
    if not _INT.match(raw):
        raise ParamError(f"filter on {column}: {raw!r} is not an integer")
    v = int(raw)
    if not _I64[0] <= v <= _I64[1]:
        raise ParamError(f"filter on {column}: {raw!r} is out of the int64 range")
    return KeyFilter(column, "eq", v, raw)


def parse_filters(pairs: list[tuple[str, str]], key_kinds: dict[str, str]) -> list[KeyFilter]:
    """(column, value) pairs -> filters; the column must be a group-key column of the query."""
    if len(pairs) > MAX_FILTERS:
        raise ParamError(f"at most {MAX_FILTERS} filters")
    out = []
    for column, raw in pairs:
        kind = key_kinds.get(column)
        if kind is None:
            known = ", ".join(key_kinds) or "(none: this query has no group-by)"
            raise ParamError(
                f"cannot filter on {column!r}: not a group-key column of this query; known: {known}"
            )
        out.append(_ip_filter(column, raw) if kind == "ip" else _int_filter(column, raw))
    return out


def split_filter_param(value: str) -> tuple[str, str]:
    """``column:value`` (the ``filter`` parameter; the value may hold ':' as IPv6 does)."""
    column, sep, raw = value.partition(":")
    if not sep or not column.strip():
        raise ParamError(f"filter {value!r}: use column:value, e.g. src_ip:10.0.0.0/8 or dst_port:443")
    return column.strip(), raw


def parse_complete(value: str | None) -> bool | None:
    """``complete=true|false`` -> only complete / only incomplete rows (contract.results says what
    complete means); None: every row. Anything else is a 400, not a silent "every row"."""
    if value is None:
        return None
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ParamError(f"complete: {value!r} is not true or false")
    return text == "true"


@dataclass(frozen=True)
class OrderTerm:
    column: str
    descending: bool


def parse_order(value: str | None, allowed: list[str]) -> list[OrderTerm]:
    """``-packets,window_start`` -> terms; every column must be one of ``allowed``."""
    if value is None or not value.strip():
        return []
    terms = [t.strip() for t in value.split(",")]
    if len(terms) > MAX_ORDER_TERMS:
        raise ParamError(f"order_by: at most {MAX_ORDER_TERMS} columns")
    out = []
    for t in terms:
        desc = t.startswith("-")
        col = t.lstrip("+-").strip()
        if col not in allowed:
            raise ParamError(
                f"order_by: unknown column {col!r}; use one of {', '.join(allowed)} ('-' prefix: descending)"
            )
        out.append(OrderTerm(col, desc))
    return out
