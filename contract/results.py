"""The results store: the one definition of what the high-level job writes and the API reads.

The job and the API meet only here (as the two levels meet only in :mod:`contract.wire`): every path,
file name, column name, column type and row kind of the store is spelled in this module, and both
sides call it. The status document that sits next to the Parquet files is :mod:`contract.status`.

Layout::

    <root>/query=<name>/date=YYYY-MM-DD/part-<batch_id:012d>.parquet
    <root>/_status.json
    <root>/_alerts/query=<name>/part-<batch_id:012d>.parquet   alerts that micro-batch fired
    <root>/_alerts/_delivered.jsonl                  ids of alerts the webhook accepted (append-only)
    <root>/_incomplete/query=<name>/date=YYYY-MM-DD/part-<batch_id:012d>.parquet   flagged windows

One Parquet file per (query, day of window_start, micro-batch). Its columns are exactly
:func:`schema` of the query: the window bounds, the key columns, the aggregate columns, when the
window closed, how many hosts were live, how complete the row is, and the row kind. A ``correction``
row adds to the ``final`` row of the same window and key (count/sum add, min/max fold); a ``late``
row (late policy ``drop``) carries what late partials would have added to a closed (window, key) and
is *not* folded into its value: it only says the stored value lacks ``late_partials`` records. Rows go
out ordered by (window, kind).

**Completeness.** A row is ``complete`` when its value is certainly the exact aggregate of every
record that every capture host the job knows for the (query, Kafka partition) captured, i.e. when

* ``hosts_in_mark == hosts_expected``: every known host (configured expected hosts plus every host
  heard from on that partition) had a mark past the window's end when the row was written. A host
  that died *after* its mark passed the window has sent all of it; one that died before (the window
  closed without it, host timeout) or was never heard has not. ``hosts`` stays what it was: the live
  hosts whose min is the low-water mark at close.
* ``late_partials == 0``: no partial record of the (window, key) arrived after the window closed and
  was dropped (``late`` rows carry the count; a ``correction`` row folds the record in, so it counts
  in ``late_partials`` but does not make the folded value incomplete).
* ``missing_records == 0``: no sequence gap (records a host sent that never reached the job) overlaps
  the window. A gap found at a punctuation with mark M, after the host's previous mark P, is
  attributed to every window overlapping panes [P, M] (its keys are unknown: the whole window).

``complete`` is written as ``hosts_in_mark == hosts_expected and late_partials == 0 and
missing_records == 0``; a reader folding a (window, key) group ANDs it over the group's final and
late rows and sums ``late_partials``. Landmark ``update`` rows are provisional, hence never complete;
the watermark baseline (``--mode watermark``) knows no hosts and drops late records silently, so its
rows are never complete either. Every loss a capture host counts before Kafka (its socket's drops,
its ring's, packets below its own mark; wire version 2's ``Punctuation.losses``) counts in
``missing_records`` of every window overlapping the panes it was charged to, like shed panes;
malformed frames are reported per host (status ``malformed``), not as a loss. Shed panes count as missing: a capture host whose uplink backlog
overflowed (Kafka slow or down) sheds whole (query, pane) units and reports them in its next
punctuation (``wire.Punctuation.shed``); every window overlapping a shed pane gets the pane range's
records in ``missing_records`` and is not complete (a pane shed after its windows closed cannot
change rows already written).

**Flagged windows.** A window whose every record was shed (or lost in a sequence gap) has no row to
carry ``missing_records``. So the job also writes, per micro-batch, one row of
:data:`INCOMPLETE_SCHEMA` for every (window, host, cause) it learned was short: when the window
closes for what was known by then, and in the batch that learns it for a window already closed
(``after_close``: its stored rows still say complete). ``first_pane_start``/``last_pane_end`` are the
short panes *of that window*; ``records`` what the gap or shed range held (attributed, as in
``missing_records``, to every window it overlaps). The rows of one window are the union of its files'
rows; a replayed batch rewrites its file with the same rows (exactly once). A gap whose start is
unknown (before a host's first punctuation, or across a restart) flags only the rows.
Files written before these columns existed do not follow the schema and are skipped and counted by
the API as any other file with the wrong layout (no version negotiation: one layout, one reader).
A query with ``having`` stores only the final rows that pass it, and the corrections of those. A
landmark query also writes ``update`` rows: the totals so far of its open window, per group, each
time the low-water mark passes a pane (provisional; the ``final`` row at the landmark's end is exact).

An alert file holds one row per (query, rule, window, group) that fired when its window closed
(:data:`ALERT_SCHEMA`); its ``id`` is a hash of exactly that, so a replayed micro-batch rewrites the
same file with the same ids and the delivery ledger deduplicates across restarts.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import date
from pathlib import Path

import pyarrow as pa

from contract import aggregates as A
from contract import fields as F
from contract import query as Q

STATUS_FILE = "_status.json"
QUERY_DIR = re.compile(r"^query=([a-z][a-z0-9_]*)$")
DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
PART_FILE = re.compile(r"^part-(\d{12})\.parquet$")
ROW_KINDS = (
    "correction",
    "final",
    "late",
    "update",
)  # in text order: the order rows of one window are written in
COMPLETENESS_COLUMNS = ("hosts_expected", "hosts_in_mark", "late_partials", "missing_records", "complete")
FIXED_COLUMNS = ("window_start", "window_end", "closed_at", "hosts", *COMPLETENESS_COLUMNS, "kind")
RESERVED = frozenset(FIXED_COLUMNS) | {"query", "date"}
TIMESTAMP = pa.timestamp("us", tz="UTC")
# the columns after the aggregates in every result file: when and by how many hosts the window closed
CLOSING_FIELDS = (
    pa.field("closed_at", TIMESTAMP, nullable=False),
    pa.field("hosts", pa.int32(), nullable=False),
    pa.field("hosts_expected", pa.int32(), nullable=False),
    pa.field("hosts_in_mark", pa.int32(), nullable=False),
    pa.field("late_partials", pa.int64(), nullable=False),
    pa.field("missing_records", pa.int64(), nullable=False),
    pa.field("complete", pa.bool_(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
)
ALERTS_DIR = "_alerts"
DELIVERED_FILE = "_delivered.jsonl"
ALERT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # alert_id(query, alert, window_start, group)
        pa.field("query", pa.string(), nullable=False),
        pa.field("alert", pa.string(), nullable=False),
        pa.field("severity", pa.string(), nullable=False),
        pa.field("window_start", TIMESTAMP, nullable=False),
        pa.field("window_end", TIMESTAMP, nullable=False),
        pa.field("closed_at", TIMESTAMP, nullable=False),
        pa.field("group", pa.string(), nullable=False),  # JSON object: group-by column -> value
        pa.field("values", pa.string(), nullable=False),  # JSON object: aggregate -> value
        pa.field("labels", pa.string(), nullable=False),  # JSON object: every label the webhook gets
        pa.field("summary", pa.string(), nullable=False),
    ],
    metadata={b"lowwater.kind": b"alerts"},
)
INCOMPLETE_DIR = "_incomplete"
# Why a window is short (see the module docstring): a sequence gap (lost in flight between host and job),
# panes shed by the host's backlog or select outbox, frames the capture socket dropped, frames the host's
# ring refused, packets below the host's own mark, a host that timed out before its mark passed the window,
# and (joins) input rows that reached the job below its mark
INCOMPLETE_CAUSES = ("gap", "shed", "socket_drops", "ring_drops", "host_late", "timeout", "job_late")
WIRE_CAUSES = {
    "shed": "shed",
    "socket": "socket_drops",
    "ring": "ring_drops",
    "late": "host_late",
    "gap": "gap",
    "timeout": "timeout",
    "job_late": "job_late",
}  # wire -> here
INCOMPLETE_SCHEMA = pa.schema(
    [
        pa.field("window_start", TIMESTAMP, nullable=False),
        pa.field("window_end", TIMESTAMP, nullable=False),
        pa.field("flagged_at", TIMESTAMP, nullable=False),  # processing time of the batch that wrote the row
        pa.field("partition", pa.int32(), nullable=False),  # Kafka partition of the query's topic
        pa.field("host", pa.string(), nullable=False),
        pa.field("cause", pa.string(), nullable=False),  # one of INCOMPLETE_CAUSES
        pa.field(
            "first_pane_start", TIMESTAMP, nullable=False
        ),  # the window's short panes: [first start, last end)
        pa.field("last_pane_end", TIMESTAMP, nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("after_close", pa.bool_(), nullable=False),  # learned after the window's rows were written
    ],
    metadata={b"lowwater.kind": b"incomplete"},
)


class ResultsLayoutError(ValueError):
    """A query whose result columns cannot be laid out, or a file that does not follow the layout."""


def status_path(root: str | Path) -> Path:
    return Path(root) / STATUS_FILE


def query_dir(root: str | Path, query: str) -> Path:
    return Path(root) / f"query={query}"


def date_dir(root: str | Path, query: str, day: date) -> Path:
    return query_dir(root, query) / f"date={day.isoformat()}"


def part_name(batch_id: int) -> str:
    if batch_id < 0:
        raise ResultsLayoutError(f"batch id must be >= 0, got {batch_id}")
    return f"part-{batch_id:012d}.parquet"


def part_path(root: str | Path, query: str, day: date, batch_id: int) -> Path:
    return date_dir(root, query, day) / part_name(batch_id)


def _days(base: Path) -> list[tuple[date, Path]]:
    """(day, directory) of the ``date=`` directories in ``base``, oldest first (other names are skipped)."""
    try:
        entries = list(base.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((d, e) for e in entries if e.is_dir() and (d := parse_date_dir(e.name)) is not None)


def date_dirs(root: str | Path, query: str) -> list[tuple[date, Path]]:
    """(day, directory) of a query's ``date=`` directories, oldest first (other names are skipped)."""
    return _days(query_dir(root, query))


def parse_date_dir(name: str) -> date | None:
    """The day of a ``date=YYYY-MM-DD`` directory name, None for anything else."""
    m = DATE_DIR.match(name)
    if not m:
        return None
    try:
        return date.fromisoformat(m.group(1))
    except ValueError:
        return None


def parse_part_name(name: str) -> int | None:
    """The micro-batch id of a ``part-<id>.parquet`` file name, None for anything else (tmp files...)."""
    m = PART_FILE.match(name)
    return int(m.group(1)) if m else None


def key_columns(q: Q.QuerySpec) -> list[tuple[str, str]]:
    """(column, 'ip' | 'int') of the query's group-by parts, in key order; a top aggregate's item
    (named as its field) follows them: the stored rows of a top query are one per (group, item)."""
    cols = [(p.name, "ip" if p.field.kind == "ip" else "int") for p in q.key_parts]
    h = Q.holistic(q)
    if h is not None and h.fn == "top":
        cols.append((h.field or "", "ip" if F.CATALOG[h.field or ""].kind == "ip" else "int"))
    return cols


def aggregate_columns(q: Q.QuerySpec) -> list[tuple[str, str]]:
    """(column, fn) of the query's aggregate results, in config order. Holistic aggregates write their
    final values (the sub-key is gone after the second stage): count_distinct one int64 column,
    quantiles one float64 column per q (fn 'quantile'), top its weight (fn 'top') and rank (fn 'rank'),
    with a capacity also ``<name>_error`` (fn 'top_error', the Misra-Gries bound: true - error <= weight <= true)."""
    return [c for a in q.aggregates for c in a.output_columns()]


FLOAT_FNS = A.FLOAT_KINDS  # aggregate result kinds stored as float64 (the rest int64)


def check_names(q: Q.QuerySpec) -> None:
    """Key and aggregate names become columns: they must be unique and not clash with the fixed ones."""
    names = [n for n, _ in key_columns(q)] + [n for n, _ in aggregate_columns(q)]
    clash = sorted(set(names) & RESERVED)
    dup = sorted({n for n in names if names.count(n) > 1})
    if clash or dup:
        raise ResultsLayoutError(
            f"query {q.name!r}: result column names {clash or dup} clash with the result layout "
            f"(reserved: {sorted(RESERVED)})"
        )


def schema(q: Q.QuerySpec) -> pa.Schema:
    """The exact Arrow schema of every result file of ``q`` (what the job writes, what the API expects).

    Addresses are text (IPv4 dotted, IPv6 compressed); integers int64; avg float64 (NaN for an empty
    group); times microseconds UTC; ``hosts`` the live hosts when the window closed; then the
    completeness columns (module docstring).
    """
    check_names(q)
    fields = [
        pa.field("window_start", TIMESTAMP, nullable=False),
        pa.field("window_end", TIMESTAMP, nullable=False),
    ]
    fields += [pa.field(n, pa.string() if kind == "ip" else pa.int64()) for n, kind in key_columns(q)]
    fields += [pa.field(n, pa.float64() if fn in FLOAT_FNS else pa.int64()) for n, fn in aggregate_columns(q)]
    fields += CLOSING_FIELDS
    return pa.schema(fields, metadata={b"lowwater.query": q.name.encode()})


def check_file_schema(q: Q.QuerySpec, found: pa.Schema, where: str = "") -> None:
    """Raise :class:`ResultsLayoutError` unless a file's columns and types are exactly :func:`schema`'s."""
    want = schema(q)
    got = [(f.name, f.type) for f in found]
    exp = [(f.name, f.type) for f in want]
    if got != exp:
        missing = [n for n, _ in exp if n not in dict(got)]
        extra = [n for n, _ in got if n not in dict(exp)]
        typed = [f"{n}: {t} (want {dict(exp)[n]})" for n, t in got if n in dict(exp) and dict(exp)[n] != t]
        detail = "; ".join(
            s
            for s in (
                f"missing {missing}" if missing else "",
                f"unexpected {extra}" if extra else "",
                ", ".join(typed),
                "" if missing or extra or typed else "columns out of order",
            )
            if s
        )
        raise ResultsLayoutError(
            f"{where or 'result file'} of query {q.name!r} does not follow the layout: {detail}"
        )


def alerts_dir(root: str | Path) -> Path:
    return Path(root) / ALERTS_DIR


def alert_part_path(root: str | Path, query: str, batch_id: int) -> Path:
    """Per query: in watermark mode each query is its own stream with its own batch ids."""
    return alerts_dir(root) / f"query={query}" / part_name(batch_id)


def alert_files(root: str | Path) -> list[Path]:
    """Every alert file of the store (tmp files and anything else are not alert files)."""
    folder = alerts_dir(root)
    if not folder.is_dir():
        return []
    return sorted(
        f
        for d in folder.iterdir()
        if d.is_dir() and QUERY_DIR.match(d.name)
        for f in d.iterdir()
        if parse_part_name(f.name) is not None
    )


def incomplete_dir(root: str | Path, query: str) -> Path:
    return Path(root) / INCOMPLETE_DIR / f"query={query}"


def incomplete_part_path(root: str | Path, query: str, day: date, batch_id: int) -> Path:
    """Per query and day of window_start, like the result files (retention deletes whole days)."""
    return incomplete_dir(root, query) / f"date={day.isoformat()}" / part_name(batch_id)


def incomplete_date_dirs(root: str | Path, query: str) -> list[tuple[date, Path]]:
    """(day, directory) of a query's flagged-window days, oldest first."""
    return _days(incomplete_dir(root, query))


def check_incomplete_schema(found: pa.Schema, where: str = "") -> None:
    """Raise :class:`ResultsLayoutError` unless a flagged-window file's columns are :data:`INCOMPLETE_SCHEMA`'s."""
    got = [(f.name, f.type) for f in found]
    exp = [(f.name, f.type) for f in INCOMPLETE_SCHEMA]
    if got != exp:
        raise ResultsLayoutError(
            f"{where or 'flagged-window file'} does not follow the layout: {got} != {exp}"
        )


def delivered_path(root: str | Path) -> Path:
    return alerts_dir(root) / DELIVERED_FILE


def alert_id(query: str, alert: str, window_start_us: int, group: str) -> str:
    """The identity of a fired alert: (query, rule, window, group), stable across replays and restarts."""
    text = json.dumps([query, alert, int(window_start_us), group], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_alert_schema(found: pa.Schema, where: str = "") -> None:
    """Raise :class:`ResultsLayoutError` unless an alert file's columns are exactly :data:`ALERT_SCHEMA`'s."""
    got = [(f.name, f.type) for f in found]
    exp = [(f.name, f.type) for f in ALERT_SCHEMA]
    if got != exp:
        raise ResultsLayoutError(f"{where or 'alert file'} does not follow the alert layout: {got} != {exp}")
