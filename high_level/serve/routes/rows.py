"""The query routes' answers for a row-window query (``kind: rows``): the same endpoints, its own columns.

``/queries/{name}/results`` takes the closed windows whose ``closed_at`` is in [start, end) (default: the hour
up to the newest one stored), ``/latest`` each stream's newest window (host incarnation and partition
value: every group of it). Filters on the host, partition and group columns, ``order_by``, ``limit`` and
``offset`` paging, ``format``, ``complete`` as for time windows; what needs a time span (``top``,
``cursor``, ``/series``, ``/top``, ``/percentile``, ``/incomplete``) is a 400 saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from fastapi.responses import Response

from contract import results as R
from contract.query.windows import TupleSlideSpec
from high_level.serve import params as P
from high_level.serve import rowreader as RR
from high_level.serve.service import ApiService
from high_level.serve.timefmt import iso_of_us, us_of


def describe(ri: RR.RowInfo, fragment: dict[str, Any] | None) -> dict[str, Any]:
    """A row query as /queries shows it (under ``row_queries``): definition, window, columns, links."""
    spec = ri.spec
    definition = fragment if fragment is not None else spec.model_dump(mode="json", by_alias=True)
    w = spec.window
    return {
        "name": spec.name,
        "kind": "rows",
        "description": spec.description,
        "filter": spec.filter,
        "definition": definition,
        "yaml": yaml.safe_dump(definition, sort_keys=False, default_flow_style=None),
        "window": (
            {"range": f"{w.range_ns / 1e9:g}s", "range_ns": w.range_ns, "every": w.every}
            if isinstance(w, TupleSlideSpec)
            else {"rows": w.rows, "slide": w.step, "partition_by": list(spec.partition_by)}
        ),
        "key_columns": [
            {"name": n, "kind": k, "type": "string" if k != "int" else "int64"}
            for n, k in ri.key_kinds.items()
        ],
        "aggregate_columns": [
            {"name": n, "fn": fn, "field": a.field, "type": "float64" if fn in R.FLOAT_FNS else "int64"}
            for a in spec.aggregates
            for n, fn in a.output_columns()
        ],
        "result_columns": [f.name for f in ri.schema if f.name != "kind"],
        "links": {"results": f"/queries/{spec.name}/results", "latest": f"/queries/{spec.name}/latest"},
    }


def refuse(ri: RR.RowInfo, what: str) -> None:
    """What a row window cannot answer: a 400 that says why and what to ask instead."""
    raise P.ParamError(
        f"{what}: query {ri.name!r} has row windows (kind: rows), which have no time span; "
        f"ask /queries/{ri.name}/results or /latest"
    )


def parse_filters(ri: RR.RowInfo, filters: list[str], keys: list[tuple[str, str]]) -> list[P.KeyFilter]:
    """``filter=column:value`` and ``key.<column>=value`` on the host, partition and group columns."""
    pairs = [*map(P.split_filter_param, filters), *keys]
    host = [P.KeyFilter(c, "eq", v.strip(), v) for c, v in pairs if c == "host"]
    kinds = {c: k for c, k in ri.key_kinds.items() if c != "host"}
    return host + P.parse_filters([(c, v) for c, v in pairs if c != "host"], kinds)


@dataclass(frozen=True)
class RowRequest:
    """The parameters /results and /latest of a row query share, checked before any file is read."""

    filters: list[P.KeyFilter]
    order: list[P.OrderTerm]
    order_by: str | None
    complete: bool | None
    limit: int
    offset: int
    fmt: str

    @classmethod
    def of(
        cls,
        ri: RR.RowInfo,
        keys: list[tuple[str, str]],
        filters: list[str],
        order_by: str | None,
        complete: str | None,
        limit: int,
        offset: int,
        fmt: str,
    ) -> RowRequest:
        order = P.parse_order(order_by, ri.order_columns)
        flt = parse_filters(ri, filters, keys)
        return cls(flt, order, order_by, P.parse_complete(complete), limit, offset, fmt)

    def answer(
        self, svc: ApiService, ri: RR.RowInfo, t: pa.Table, head: dict[str, Any], what: str
    ) -> Response:
        rs = RR.select(ri, t, self.filters, self.order, self.complete, self.limit, self.offset)
        body = {
            "query": ri.name,
            "kind": "rows",
            **head,
            "order_by": self.order_by,
            "filters": [f"{f.column}:{f.text}" for f in self.filters],
            "complete": self.complete,
            "paging": svc.paging(rs, self.limit, self.offset),
        }
        return svc.respond(body, rs, self.fmt, f"{ri.name}-{what}")


def results(svc: ApiService, ri: RR.RowInfo, req: RowRequest, start: str | None, end: str | None) -> Response:
    """The windows whose ``closed_at`` is in the range (default: the hour up to the newest stored)."""
    newest = None
    if start is None and end is None:
        t = svc.rows.newest_day(ri)
        if t.num_rows:
            newest = pc.max(t["closed_at"]).as_py() + timedelta(microseconds=1)
    s, e = P.time_range(start, end, svc.now(), newest)
    head = {"start": iso_of_us(us_of(s)), "end": iso_of_us(us_of(e))}
    return req.answer(svc, ri, svc.rows.table(ri, s, e), head, "results")


def latest(svc: ApiService, ri: RR.RowInfo, req: RowRequest) -> Response:
    """The newest window of each stream (host incarnation, partition value) among the newest day's rows."""
    return req.answer(svc, ri, RR.latest(ri, svc.rows.newest_day(ri)), {}, "latest")
