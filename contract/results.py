"""The results store: the one definition of what the high-level job writes and the API reads.

The job and the API meet only here (as the two levels meet only in :mod:`contract.wire`): every path,
file name, column name, column type and row kind of the store is spelled in this module, and both
sides call it. The status document that sits next to the Parquet files is :mod:`contract.status`.

Layout::

    <root>/query=<name>/date=YYYY-MM-DD/part-<batch_id:012d>.parquet
    <root>/query=<name>/date=YYYY-MM-DD/compact-<first_batch:012d>-<last_batch:012d>.parquet  merged parts
    <root>/query=<name>/tier=<tier>/date=YYYY-MM-DD/part-<first:012d>-<last:012d>.parquet  roll-up tiers
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

**Compaction.** Once no replay can rewrite them (their batch is below Spark's last committed one), a
directory's micro-batch files are merged into ``compact-<first_batch:012d>-<last_batch:012d>.parquet``
(same schema, the same rows). A file whose batch range lies inside a compacted file's range in the same
directory is *covered*: readers skip it (:func:`visible_files`, the one definition of the rule), so with
the compacted file renamed into place before any covered file is deleted, a reader sees every row once
whatever the moment. Covered files are deleted afterwards; a compacted file may itself be covered by a
larger one (the hours of a day merged into the day).

**Roll-up tiers.** A query with ``tiers: [5m, 1h, 1d]`` also keeps its windows folded into those widths::

    <root>/query=<name>/tier=<tier>/date=YYYY-MM-DD/part-<first_batch:012d>-<last_batch:012d>.parquet

A tier file holds the raw rows of batches [first, last] (final and correction rows; ``late`` rows only
count in ``late_partials``) folded per (tier window, key) with :data:`contract.aggregates.TIER_STATES`;
its columns are :func:`tier_schema`. The rows of one (tier window, key) may be spread over several
files (batches that closed its windows at different times, corrections): a reader folds them with the
same merge ops (``count``/``sum`` and every state part add, ``min``/``max`` fold, avg = its sum / its
count). Covered tier files (a range inside another file's range, same directory) are skipped exactly as
raw files are. A tier row's completeness: ``complete`` is the AND of its rows', ``late_partials`` their
sum, ``missing_records`` their max (a loss is charged to every window it overlaps, so a sum would count
it again per window), ``hosts``/``hosts_in_mark`` the min, ``hosts_expected`` the max, ``closed_at`` the
latest, ``kind`` always ``final``; ``windows`` says how many stored windows had a row of that key.
Exact per tier: count, sum, min, max, avg (avg needs the query's count, validated), variance and
stddev: in a query with tiers the raw layout keeps their window's state next to the value
(``<name>.count``, ``<name>.sum``, ``<name>.sumsq``, int64, :func:`raw_state_columns`; a correction's
is its late packets'), and the tier adds them up. count_distinct and quantiles keep, in a query with
tiers, each stored row's sub-keys with their state (:func:`subkey_columns`: exact values, HLL registers
or quantile buckets, list<int64>); a tier merges them per sub-key (union, max of ranks, sum of counts)
and reduces them as the window's second stage does: exact when the window is, else within the same
bound (the HLL of the union, the buckets of every packet). Not offered (refused in the config): top
(``contract.aggregates.TIER_REFUSED`` says why).

**Executors write, the driver commits.** The aggregate stream's files are written by the Spark tasks
that hold the rows, one per (query, day, batch, task): ``part-<batch_id:012d>-<task:05d>.parquet``, so a
replayed batch rewrites the same names. Such a file is invisible until its batch is committed: the
driver writes the batch's manifest (``<root>/_manifests/<batch_id:012d>.json``: files, rows,
per-partition marks) and then each written query's ``query=<q>/_committed.json`` (``{"batch": b}``);
a reader shows a task file of batch b only when b <= that batch (:func:`visible_files` with
:func:`committed_batch`). A batch is therefore seen whole or not at all, and a kill between the
tasks' writes and the commit leaves nothing visible: Spark replays the batch, which rewrites the same
files and commits. Files without a task suffix (written by the driver) are visible once renamed in.

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
PART_FILE = re.compile(r"^part-(\d{12})(-\d{5})?\.parquet$")  # the suffix: a task's file (uncommitted)
COMMITTED_FILE = "_committed.json"
MANIFESTS_DIR = "_manifests"
LIVE_KEYS_DIR = "_live_keys"  # per (query, task): keys of its recent closed windows (the live tombstones)
COMPACT_FILE = re.compile(r"^compact-(\d{12})-(\d{12})\.parquet$")
TIER_DIR = re.compile(r"^tier=([0-9]+(?:d|h|m|s|ms|us|ns))$")
TIER_FILE = re.compile(r"^part-(\d{12})-(\d{12})\.parquet$")
RAW_TIER = Q.RAW_TIER
TIER_EXTRA = ("windows",)  # int64: how many stored windows the tier row folds (of that key)
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


def part_name(batch_id: int, task: int | None = None) -> str:
    """A batch's file name; with ``task``, the file one Spark task wrote (visible once committed)."""
    if batch_id < 0:
        raise ResultsLayoutError(f"batch id must be >= 0, got {batch_id}")
    if task is None:
        return f"part-{batch_id:012d}.parquet"
    if not 0 <= task < 100_000:
        raise ResultsLayoutError(f"task must be in [0, 100000), got {task}")
    return f"part-{batch_id:012d}-{task:05d}.parquet"


def part_path(root: str | Path, query: str, day: date, batch_id: int, task: int | None = None) -> Path:
    return date_dir(root, query, day) / part_name(batch_id, task)


def committed_path(root: str | Path, query: str) -> Path:
    return query_dir(root, query) / COMMITTED_FILE


def manifest_path(root: str | Path, batch_id: int) -> Path:
    return Path(root) / MANIFESTS_DIR / f"{batch_id:012d}.json"


def live_keys_dir(root: str | Path, query: str, task: int) -> Path:
    """Where a Spark task keeps the live keys of its recent closed windows of ``query``, until their
    tombstones (``high_level.live.publish``): beside the store, which every executor shares."""
    return Path(root) / LIVE_KEYS_DIR / f"query={query}" / f"task={task:05d}"


def committed_batch(root: str | Path, query: str) -> int | None:
    """The newest batch the job committed for ``query`` (its task files up to it are visible), None if
    none. An unreadable marker raises: guessing would show uncommitted rows or hide committed ones."""
    path = committed_path(root, query)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        b = json.loads(text)["batch"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResultsLayoutError(f"{path}: not a commit marker ({exc})") from None
    if not isinstance(b, int) or b < 0:
        raise ResultsLayoutError(f"{path}: batch must be an int >= 0, got {b!r}")
    return b


def is_task_part(name: str) -> bool:
    """True for a file one task wrote (``part-<batch>-<task>.parquet``): visible only once committed."""
    m = PART_FILE.match(name)
    return bool(m and m.group(2))


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


def compact_name(first_batch: int, last_batch: int) -> str:
    if not 0 <= first_batch <= last_batch:
        raise ResultsLayoutError(f"batch range must be 0 <= first <= last, got {first_batch}..{last_batch}")
    return f"compact-{first_batch:012d}-{last_batch:012d}.parquet"


def batch_range(name: str) -> tuple[int, int] | None:
    """(first, last) batch of a raw store file (a part is its own range, a compacted file its range),
    None for anything else (tmp files, ...)."""
    b = parse_part_name(name)
    if b is not None:
        return b, b
    m = COMPACT_FILE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def visible_files(named: dict[str, tuple[int, int]], committed: int | None = None) -> list[str]:
    """The files of one directory a reader reads: every name (mapped to its batch range) except the
    covered ones, whose range lies inside another file's larger range (or equals a compacted file's),
    and the task files of batches after ``committed`` (:func:`committed_batch`; None: none committed).
    Ranges are nested or disjoint (the compactor never writes a partial overlap). Sorted by range.

    Why ranges inside ranges: compaction renames the merged file into place before it deletes what it
    merged, so from the rename on the merged file hides them and no row is read twice or missed.
    """
    upto = -1 if committed is None else committed
    named = {n: r for n, r in named.items() if r[1] <= upto or not is_task_part(n)}
    order = sorted(
        named.items(), key=lambda kv: (kv[1][0], -kv[1][1], not kv[0].startswith("compact-"), kv[0])
    )
    out: list[str] = []
    reach = -1  # the largest last batch of the files before: they all start at or before this one
    taken: tuple[int, int] | None = None  # the range of the last raw part taken (a batch's task files)
    for name, rng in order:
        if rng[1] > reach:  # not inside an earlier (larger, or equal and compacted) range
            out.append(name)
            reach = rng[1]
            taken = None if name.startswith("compact-") else rng
        elif rng == taken:  # another task's file of the same batch
            out.append(name)
    return out


def tier_name(width_ns: int) -> str:
    """A tier's name, as in ``tier=<name>`` and the ``retention`` keys: 5m, 1h, 1d."""
    return Q.duration_name(width_ns)


def tier_dir(root: str | Path, query: str, tier: str | int) -> Path:
    name = tier if isinstance(tier, str) else tier_name(tier)
    return query_dir(root, query) / f"tier={name}"


def tier_date_dirs(root: str | Path, query: str, tier: str | int) -> list[tuple[date, Path]]:
    """(day, directory) of one tier's ``date=`` directories, oldest first."""
    return _days(tier_dir(root, query, tier))


def tier_part_name(first_batch: int, last_batch: int) -> str:
    return "part" + compact_name(first_batch, last_batch)[len("compact") :]


def tier_part_path(root: str | Path, query: str, tier: str | int, day: date, first: int, last: int) -> Path:
    """A tier file: the rows of raw batches [first, last] folded into the tier's windows starting on ``day``."""
    return tier_dir(root, query, tier) / f"date={day.isoformat()}" / tier_part_name(first, last)


def tier_batch_range(name: str) -> tuple[int, int] | None:
    m = TIER_FILE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def tier_parts(q: Q.QuerySpec, stored: bool | None = None) -> list[tuple[str, str, int]]:
    """(column, aggregate name, merge) of every state column a tier folds (registry: TIER_STATES);
    ``stored``: only those the raw layout keeps (True) or only those the tier files add (False)."""
    return [
        (c, a.name, m)
        for a in q.aggregates
        if (ts := A.TIER_STATES.get(a.fn)) is not None and (stored is None or ts.stored == stored)
        for c, m in ts.columns(a.name)
    ]


def tier_state_columns(q: Q.QuerySpec) -> list[tuple[str, str, int]]:
    """(column, aggregate name, merge) of the state columns a tier file adds to :func:`schema`'s."""
    return tier_parts(q, stored=False)


def subkey_columns(q: Q.QuerySpec) -> list[str]:
    """The list<int64> columns a query with tiers keeps for its holistic aggregate (TierState.subkeys):
    per stored row its sub-keys, one list per sub-key word (``<name>.sub0`` ...), and their merged
    state (``<name>.state``, aligned); empty for a ``late`` row's values in a tier."""
    h = Q.holistic(q)
    if not q.tiers or h is None or not (ts := A.TIER_STATES.get(h.fn)) or not ts.subkeys:
        return []
    return [*(f"{h.name}.sub{j}" for j in range(Q.subkey_width(q))), f"{h.name}.state"]


SUBKEY_TYPE = pa.list_(pa.int64())


def raw_state_columns(q: Q.QuerySpec) -> list[tuple[str, str, int]]:
    """(column, aggregate name, merge) of the state columns the raw layout of a query with tiers keeps
    next to the values (variance/stddev: count, sum, sum of squares), so its tiers merge them exactly."""
    return tier_parts(q, stored=True) if q.tiers else []


def tier_schema(q: Q.QuerySpec, tier: str | int) -> pa.Schema:
    """The exact Arrow schema of every file of one tier of ``q``: :func:`schema` (the window bounds are
    the tier's), then the aggregates' tier state columns (int64), then ``windows``."""
    base = schema(q)
    name = tier if isinstance(tier, str) else tier_name(tier)
    if name not in q.tier_names:
        raise ResultsLayoutError(f"query {q.name!r} has no tier {name!r} (tiers: {q.tier_names})")
    fields = list(base)
    fields += [pa.field(c, pa.int64(), nullable=False) for c, _, _ in tier_state_columns(q)]
    fields.append(pa.field("windows", pa.int64(), nullable=False))
    return pa.schema(fields, metadata={b"lowwater.query": q.name.encode(), b"lowwater.tier": name.encode()})


def check_tier_schema(q: Q.QuerySpec, tier: str | int, found: pa.Schema, where: str = "") -> None:
    """Raise :class:`ResultsLayoutError` unless a tier file's columns are exactly :func:`tier_schema`'s."""
    got = [(f.name, f.type) for f in found]
    exp = [(f.name, f.type) for f in tier_schema(q, tier)]
    if got != exp:
        raise ResultsLayoutError(
            f"{where or 'tier file'} of query {q.name!r} does not follow the layout: {got} != {exp}"
        )


def retention_ns(q: Q.QuerySpec, tier: str, raw_default_days: int | None = None) -> int | None:
    """How long ``tier``'s windows are kept (ns), None: kept. ``raw`` defaults to ``--retention-days``."""
    if tier in q.retention:
        return q.retention[tier]
    if tier == RAW_TIER and raw_default_days:
        return raw_default_days * 86_400 * Q.NS
    return None


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
    fields += [pa.field(c, pa.int64()) for c, _, _ in raw_state_columns(q)]
    fields += [pa.field(c, SUBKEY_TYPE) for c in subkey_columns(q)]
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
