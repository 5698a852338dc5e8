"""Row-window queries (``kind: rows``): an aggregate over the last N rows of each capture host, every M rows.

Its own module because a row window's progressing attribute is a row number, not the timestamp: the
capture host numbers the rows that pass the filter (per ``partition_by`` value when given), both levels
derive pane arithmetic from :class:`contract.query.windows.RowWindowSpec`, and the results carry the
host (and the partition). Aggregates are the registry's bounded ones, merged with its merge ops.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract import aggregates as A
from contract import fields as F
from contract.query.model import AggregateSpec, HeartbeatSpec, KafkaSpec, QuerySpec, _Strict
from contract.query.selects import SelectSpec
from contract.query.windows import RowWindowSpec, TupleSlideSpec


def _plain_field(name: str, what: str) -> F.Field:
    fld = F.CATALOG.get(name)
    if fld is None:
        raise ValueError(f"{what}: unknown field {name!r}; known: {', '.join(sorted(F.CATALOG))}")
    if fld.kind not in ("int", "ip"):
        raise ValueError(f"{what}: {name!r} is a {fld.kind} field; a row window takes packet fields")
    return fld


def _window_kind(v: Any) -> str:
    """``{range, every}`` is slide-by-tuple; anything else a row window (its errors say what is missing)."""
    if isinstance(v, dict):
        return "by_tuple" if "every" in v or "range" in v else "row_window"
    return "by_tuple" if isinstance(v, TupleSlideSpec) else "row_window"


WINDOW_TAGS = ("row_window", "by_tuple")
Window = Annotated[
    Annotated[RowWindowSpec, Tag("row_window")] | Annotated[TupleSlideSpec, Tag("by_tuple")],
    Discriminator(_window_kind),
]


class RowQuerySpec(_Strict):
    """``window: {rows: N, slide: M, partition_by: [...]}`` or ``{range: 5m, every: M}`` (slide-by-tuple),
    ``group_by`` fields, bounded aggregates."""

    kind: Literal["rows"]
    name: str
    window: Window
    aggregates: list[AggregateSpec]
    group_by: list[str] = Field(default_factory=list)
    filter: str | None = None
    sources: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    description: str = ""
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    kafka: KafkaSpec = KafkaSpec()

    @field_validator("name", "filter", "sources")
    @classmethod
    def _as_aggregate(cls, v: Any, info: ValidationInfo) -> Any:
        """Named, filtered and placed by the aggregate queries' rules."""
        return getattr(QuerySpec, f"_{info.field_name}")(v)

    @field_validator("group_by")
    @classmethod
    def _group(cls, v: list[str]) -> list[str]:
        for n in v:
            _plain_field(n, "group_by")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate group-by fields {v}")
        return v

    @field_validator("aggregates")
    @classmethod
    def _aggs(cls, v: list[AggregateSpec]) -> list[AggregateSpec]:
        v = QuerySpec._aggs(v)
        hol = [a.name for a in v if a.holistic]
        if hol:
            raise ValueError(f"{', '.join(hol)}: a row window takes bounded aggregates (no second stage yet)")
        for a in v:
            if a.field == "dscp":
                raise ValueError(f"{a.name}: a row window aggregates packet columns (use tos, not dscp)")
        return v

    @model_validator(mode="after")
    def _partition(self) -> RowQuerySpec:
        if isinstance(self.window, TupleSlideSpec):
            return self
        for n in self.window.partition_by:
            _plain_field(n, "window.partition_by")
        both = set(self.window.partition_by) & set(self.group_by)
        if both:
            raise ValueError(
                f"window.partition_by: {sorted(both)} also in group_by (a field is one or the other)"
            )
        return self

    @property
    def ops(self) -> tuple[int, ...]:
        """Merge op of every state column, aggregates in order (the registry's)."""
        return tuple(p.merge for a in self.aggregates for p in A.REGISTRY[a.fn].parts(a))

    @property
    def aggs(self) -> list[tuple[str, str]]:
        """(fn, result name) in state order, as :func:`contract.aggregates.finalize` takes them."""
        return [(a.fn, a.name) for a in self.aggregates]

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"lowwater.{self.name}"

    @property
    def partition_by(self) -> list[str]:
        return self.window.partition_by if isinstance(self.window, RowWindowSpec) else []

    def runs_on(self, host: str) -> bool:
        return self.selection.runs_on(host)

    @property
    def selection(self) -> SelectSpec:
        """The select the capture host's compiled kernel runs for this query: the rows that pass the
        filter, in capture order, with the words numbering (partition), grouping and aggregating need
        (``length`` alone when none: a count over the whole host still needs one word)."""
        names = [*self.partition_by, *self.group_by]
        names += [a.field for a in self.aggregates if a.field and F.CATALOG[a.field].kind != "time"]
        fields = list(dict.fromkeys(names)) or ["length"]
        return SelectSpec.model_validate(
            {
                "kind": "select",
                "name": self.name,
                "sources": self.sources,
                "filter": self.filter,
                "fields": fields,
                "heartbeat": self.heartbeat,
                "kafka": self.kafka,
            }
        )

    def words(self, names: list[str]) -> list[int]:
        """Row-block columns (0 = timestamp) of these fields in the selection's rows."""
        sel = self.selection
        return [1 + i for n in names for i in sel.word_index(n)]

    @property
    def lift_columns(self) -> list[tuple[int, A.StatePart]]:
        """(row-block column, state part) of every state column, in state order: ``contract.aggregates.lift``
        of that column is what one row adds (the timestamp column for a field-less count)."""
        out = []
        for a in self.aggregates:
            timed = a.field is None or F.CATALOG[a.field].kind == "time"
            col = 0 if timed else self.words([a.field])[0]
            out += [(col, p) for p in A.REGISTRY[a.fn].parts(a)]
        return out


def row_query(spec: dict[str, Any]) -> RowQuerySpec:
    """A row query from a plain mapping (tests and benchmarks)."""
    return RowQuerySpec.model_validate({"kind": "rows", **spec})
