"""The results of a row-window query (``kind: rows``): its files' exact Arrow schema, beside
:mod:`contract.results`' layout (same directories and file names; a row window has no time span, so its
rows have columns of their own)."""

from __future__ import annotations

import pyarrow as pa

from contract import fields as F
from contract.query.rows import RowQuerySpec
from contract.query.windows import TupleSlideSpec
from contract.results import CLOSING_FIELDS, FLOAT_FNS, ResultsLayoutError

# the aggregate results' completeness columns that apply to a row window (contract.results defines them):
# a row window is one host's rows and closes only when that host's mark passed it, so the host counts do
# not apply, and a late partial cannot reach a closed row window from a live host
ROW_COMPLETENESS = tuple(f for f in CLOSING_FIELDS if f.name in ("missing_records", "complete"))
ROW_WINDOW_FIELDS = (
    pa.field("window", pa.int64(), nullable=False),
    pa.field("first_row", pa.int64(), nullable=False),
    pa.field("end_row", pa.int64(), nullable=False),
)


def row_schema(q: RowQuerySpec) -> pa.Schema:
    """The Arrow schema of a row-window query's result files (``kind: rows``, same directory layout).

    A row window has no time span: a row is one (capture host incarnation, partition value, window of
    rows, group): ``host``, ``incarnation`` (a restarted agent numbers its rows from 0 again), the
    ``partition_by`` fields, ``window`` (its WID), ``first_row`` and ``end_row`` (rows [first, end) of
    that host's numbering), the ``group_by`` fields, the aggregates, then ``closed_at``,
    ``missing_records``, ``complete`` and ``kind`` (``final``). Addresses are text, as in :func:`schema`.
    Filed under the day of ``closed_at``.

    Completeness: a packet the host lost before numbering it (its socket's or ring's drops) never gets a
    row number, so the rows after it move up one slot. The host charges each loss to the row slots it may
    have hit (``contract.wire`` ROW_MARKS losses), and the job adds its records to ``missing_records`` of
    every window of that host holding one of those slots (every partition value's: which one the packet
    had is unknown), as it adds a sequence gap's records (partials sent and never received) to the
    windows of the rows numbered between the host's two row marks around the gap. ``complete`` is
    ``missing_records == 0``: the window holds exactly the rows its numbers say, and no row of the
    capture was lost between them. Malformed frames are no row of any query: reported, not charged.
    """

    if isinstance(q.window, TupleSlideSpec):
        return tuple_schema(q)
    fields = [
        pa.field("host", pa.string(), nullable=False),
        pa.field("incarnation", pa.int64(), nullable=False),
    ]
    fields += [_field(n) for n in q.partition_by]
    fields += list(ROW_WINDOW_FIELDS)
    fields += [_field(n) for n in q.group_by]
    return _with_aggregates(q, fields)


TUPLE_WINDOW_FIELDS = (
    pa.field("window", pa.int64(), nullable=False),
    pa.field("window_end", pa.timestamp("ns", tz="UTC"), nullable=False),
)


def tuple_schema(q: RowQuerySpec) -> pa.Schema:
    """The Arrow schema of a slide-by-tuple query's result files (``window: {range, every}``).

    A row is one window of one capture host incarnation: ``host``, ``incarnation``, ``window`` (the number
    of the row that defines it, in that host's numbering: every ``every``-th row), ``window_end`` (that
    row's timestamp, in ns: the window holds the host's rows with ``window_end - range < ts <=
    window_end``), the ``group_by`` fields (one row per group with rows in the window), the aggregates,
    then ``closed_at`` and ``kind`` (``final``).
    """
    fields = [
        pa.field("host", pa.string(), nullable=False),
        pa.field("incarnation", pa.int64(), nullable=False),
        *TUPLE_WINDOW_FIELDS,
        *(_field(n) for n in q.group_by),
    ]
    return _with_aggregates(q, fields)


def _field(name: str) -> pa.Field:
    """A partition or group column: addresses as text, as in :func:`contract.results.schema`."""
    return pa.field(name, pa.string() if F.CATALOG[name].kind == "ip" else pa.int64())


def _with_aggregates(q: RowQuerySpec, fields: list[pa.Field]) -> pa.Schema:
    """``fields``, then the aggregates, ``closed_at`` and ``kind``; a clash of names is refused."""
    fields = fields + [
        pa.field(n, pa.float64() if fn in FLOAT_FNS else pa.int64())
        for a in q.aggregates
        for n, fn in a.output_columns()
    ]
    fields += [CLOSING_FIELDS[0], *ROW_COMPLETENESS, CLOSING_FIELDS[-1]]
    names = [f.name for f in fields]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ResultsLayoutError(f"query {q.name!r}: result column names {dup} clash with the row layout")
    return pa.schema(fields, metadata={b"lowwater.query": q.name.encode()})
