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
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contract import aggregates as A
from contract import fields as F
from contract.query.configfile import ConfigError, _line_of, _strip, yaml_with_lines
from contract.query.model import AggregateSpec, QuerySpec, _Strict
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
        return v

    @model_validator(mode="after")
    def _partition(self) -> RowQuerySpec:
        if isinstance(self.window, TupleSlideSpec):
            if self.group_by:
                raise ValueError("group_by: a slide-by-tuple window is per capture host (no groups yet)")
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


def _named(item: dict, loc: tuple, reason: str) -> tuple[tuple, str]:
    """A model-level reason that starts with its field (``slide: ...``) points at that field's line."""
    head, _, rest = reason.partition(": ")
    node: Any = item
    path = (*loc, *head.split("."))
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return loc, reason
        node = node[p]
    return path, rest


def load_rows(text: str, path: str = "<string>") -> list[RowQuerySpec]:
    """The ``kind: rows`` queries of a config document; a problem raises ConfigError(file, line, field, reason)."""
    doc = yaml_with_lines(text, path)
    items = doc.get("queries") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ConfigError(path, None, "queries", "must be a list of queries")
    out: list[RowQuerySpec] = []
    seen: set[str] = set()
    for idx, item in enumerate(items):
        if not isinstance(item, dict) or item.get("kind") != "rows":
            continue
        try:
            spec = RowQuerySpec.model_validate(_strip(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(p for p in err["loc"] if p not in WINDOW_TAGS)
            reason = err["msg"].removeprefix("Value error, ")
            reason = {"extra_forbidden": "unknown field", "missing": "required field is missing"}.get(
                err["type"], reason
            )
            loc, reason = _named(item, loc, reason)
            field = ".".join(str(p) for p in loc) or "query"
            raise ConfigError(
                path, _line_of(item, loc), f"query {item.get('name', f'#{idx}')!r}: {field}", reason
            ) from None
        if spec.name in seen:
            raise ConfigError(
                path, item["__lines__"].get("name"), f"query {spec.name!r}", "duplicate query name"
            )
        seen.add(spec.name)
        out.append(spec)
    return out


def row_query(spec: dict[str, Any]) -> RowQuerySpec:
    """A row query from a plain mapping (tests and benchmarks)."""
    return RowQuerySpec.model_validate({"kind": "rows", **spec})
