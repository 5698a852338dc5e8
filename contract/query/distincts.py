"""Duplicate elimination (``kind: distinct``, the OOP paper's Dupelim, section 5.4) over a select's rows.

Why here: the config loader checks it, the job runs it (:mod:`high_level.distinct`) and the store and API
serve its rows, so the definition of a duplicate and the stored columns are written once.

**What is a duplicate.** Two rows of the input are copies when every ``fields`` word is equal and their
timestamps are at most ``within`` apart (``within: 0``, the default: the same timestamp too, SELECT
DISTINCT). A row is kept when no copy of it has a timestamp in ``[ts - within, ts]`` before it (the earlier
of two equal rows is kept once). That is a property of the set of rows, not of their arrival order, so
the output is the same under any disorder: the two copies of a packet seen by two taps (``within`` above
the taps' clock difference) are one row, stamped with the earlier copy's timestamp.

**When it is decided, and purged.** A row at ``ts`` is decided once the input's punctuation passes ``ts``
(every row that could precede it has arrived); a row stays in the state while the mark is below
``ts + within`` (a later row could still be its copy). The output's punctuation is the input's: it is
passed through, and the stored rows' windows close by it.

**Stored rows.** One column per field (as the select names them), ``timestamp`` (ns) and ``rows`` (always
1: each distinct row once), filed in the window of their timestamp (``window``, tumbling, by default
:data:`contract.query.joins.DEFAULT_ROWS_WINDOW`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from contract.query import model as M
from contract.query.joins import DEFAULT_ROWS_WINDOW, ROWS_COLUMN
from contract.query.selects import SelectSpec


class DistinctSpec(M._Strict):
    """Order-insensitive duplicate elimination of a select's rows, its state purged by punctuation."""

    kind: Literal["distinct"]
    name: str
    description: str = ""
    input: str
    fields: list[str] | None = None  # the row's identity; default: every field of the input
    within_ns: Annotated[int, BeforeValidator(M.parse_duration_ns)] = Field(default=0, alias="within")
    window: M.WindowSpec | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return M.QuerySpec._name(v)

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError(f"fields must be a non-empty list of distinct names, not {v}")
        return v

    @field_validator("window")
    @classmethod
    def _tumbling(cls, v: M.WindowSpec | None) -> M.WindowSpec | None:
        if v is not None and (v.landmark or v.slide != v.range_ns):
            raise ValueError("a distinct's rows are filed in one window each: give a tumbling {range: ...}")
        return v

    def identity(self, sel: SelectSpec) -> list[str]:
        """The fields that make two rows copies."""
        return list(sel.fields) if self.fields is None else list(self.fields)

    def rows_window(self) -> M.WindowSpec:
        return self.window or M.WindowSpec.model_validate(DEFAULT_ROWS_WINDOW)


def check_distinct(d: DistinctSpec, selects: dict[str, SelectSpec]) -> tuple[str, str] | None:
    """Checks of a distinct against its input: (field, reason) of the first problem, or None."""
    sel = selects.get(d.input)
    if sel is None:
        return "input", f"unknown select {d.input!r} (a distinct reads a select: {sorted(selects) or 'none'})"
    for f in d.identity(sel):
        if f not in sel.fields:
            return "fields", f"{f!r} is not a field of select {sel.name!r} ({sel.fields})"
    if d.within_ns > sel.retain_ns:
        return "within", (
            f"within {d.within_ns / M.NS:g}s is larger than what select {sel.name!r} can hold "
            f"(retain {sel.retain_ns / M.NS:g}s)"
        )
    if sel.kafka.partitions > 1 and (
        not sel.partition_by or any(f not in d.identity(sel) for f in sel.partition_by)
    ):
        return "fields", (
            f"select {sel.name!r} has {sel.kafka.partitions} Kafka partitions: its partition_by "
            f"({sel.partition_by}) must be among the distinct's fields, so that copies meet in one partition"
        )
    return None


def distinct_query(d: DistinctSpec, sel: SelectSpec) -> M.QuerySpec:
    """The stored shape of a distinct as an aggregate query (as :func:`contract.query.joins.rows_query`):
    every field and the timestamp a group-by column, ``rows`` a count; never sent to a capture host."""
    group = [{"field": f, "as": f} for f in d.identity(sel)] + [{"field": "length", "as": "timestamp"}]
    return M.QuerySpec.model_construct(
        name=d.name,
        description=d.description or f"distinct rows of {sel.name}",
        sources=["*"],
        filter=None,
        group_by=group,
        aggregates=[M.AggregateSpec.model_construct(fn="count", field=None, alias=ROWS_COLUMN)],
        having=None,
        alerts=[],
        export=None,
        window=d.rows_window(),
        table=M.TableSpec(),
        flush=M.FlushSpec(),
        heartbeat=M.HeartbeatSpec(),
        kafka=M.KafkaSpec(topic=f"lowwater.distinct.{d.name}", partitions=1),
    )
