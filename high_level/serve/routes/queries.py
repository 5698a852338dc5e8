"""The query routes: definitions, closed windows in a range, the newest window, per-window series and
the flagged windows, with their parameters (which also document the OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from contract import aggregates as A
from contract import results as R
from contract.query import NS, QuerySpec
from high_level.serve import params as P
from high_level.serve import tierpick
from high_level.serve.columns import QueryInfo
from high_level.serve.incomplete import SERIES_COLUMNS, merge_series
from high_level.serve.ranges import nearest_rank_over_steps
from high_level.serve.reader import ResultSet, sort_terms
from high_level.serve.routes import rows
from high_level.serve.service import ApiService
from high_level.serve.timefmt import EPOCH, iso_of_us, us_of

_LATEST_PARAMS = {"filter", "order_by", "top", "limit", "offset", "format", "complete"}
_RESULTS_PARAMS = {*_LATEST_PARAMS, "start", "end", "cursor"}  # /latest's, over a range, with cursor paging
_SERIES_PARAMS = {"start", "end", "filter", "format", "complete", "step"}
_TOP_PARAMS = {"start", "end", "filter", "format", "step", "by", "n"}
_PERCENTILE_PARAMS = {"start", "end", "filter", "step", "column", "p"}
_INCOMPLETE_PARAMS = {"start", "end"}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "invalid parameter"},
    404: {"description": "unknown query"},
}

# --- parameter declarations shared by the endpoints (they also document the OpenAPI schema)
Start = Annotated[
    str | None,
    Query(
        description="Start of the range (inclusive, by window_start): ISO-8601 (naive = UTC), epoch seconds, "
        "'now' or 'now-15m'/'-15m'. Default: end minus 1 hour.",
        examples=["2024-05-01T12:00:00Z", "1714564800", "-15m"],
        max_length=64,
    ),
]
End = Annotated[
    str | None,
    Query(
        description="End of the range (exclusive). Default: the end of the query's newest closed window when start "
        "is not given either (a replayed or stopped capture still shows its last hour), else now. The "
        "range may span at most 7 days without a step, 400 days with one (series, top, percentile).",
        max_length=64,
    ),
]
Filters = Annotated[
    list[str],
    Query(
        alias="filter",
        max_length=P.MAX_FILTERS,
        description="Group-key filter 'column:value', repeatable: exact value, or for address columns a prefix "
        "like 'src_ip:10.0.0.0/8' or 'dst_ip:2001:db8::/32'. Several filters on one column are OR-ed, "
        "on different columns AND-ed. Equivalent: key.<column>=value.",
    ),
]
OrderBy = Annotated[
    str | None,
    Query(
        max_length=200,
        description="Comma-separated columns (aggregates, window_start, window_end, key columns), '-' prefix for "
        "descending. Without top: the row order. With top: the first aggregate listed ranks the "
        "groups of each window (default: the query's first aggregate, descending); rows come "
        "grouped by window, ascending unless '-window_start' is listed.",
    ),
]
Top = Annotated[
    int | None, Query(ge=1, le=P.MAX_TOP, description=f"Top-N groups per window (1..{P.MAX_TOP}).")
]
Limit = Annotated[int, Query(ge=1, le=P.MAX_LIMIT, description=f"Page size (1..{P.MAX_LIMIT}).")]
Offset = Annotated[
    int,
    Query(
        ge=0,
        le=P.MAX_OFFSET,
        description="Rows to skip (offset paging, kept for compatibility; prefer cursor for large results).",
    ),
]
Cursor = Annotated[
    str | None,
    Query(
        max_length=4096,
        description="Cursor paging (without top): paging.next_cursor of the previous page, as is. The page "
        "starts after that page's last row; the cursor pins the range the first page resolved, so "
        "relative times do not move. Not with offset.",
    ),
]
Step = Annotated[
    str | None,
    Query(
        max_length=32,
        description="Bucket width ('5m', '1h', '1d'), a multiple of the query's slide. Allows ranges of up "
        f"to {P.MAX_STEPPED_RANGE.days} days; start/end widen to whole steps; picks the stored tier "
        "(the coarsest not coarser than the step that still covers the range; else raw windows).",
    ),
]
Format = Annotated[Literal["json", "csv"], Query(alias="format", description="json (default) or csv.")]
Complete = Annotated[
    str | None,
    Query(
        max_length=16,
        description=(
            "true: only complete rows (windows for /series), false: only incomplete ones; default all. Complete: every "
            "known capture host's mark passed the window, no late partial dropped, no records missing."
        ),
    ),
]


def _fmt_s(ns: int) -> str:
    s = ns / NS
    return f"{s:g}s"


def describe_query(qi: QueryInfo, fragment: dict[str, Any] | None) -> dict[str, Any]:
    """One query as /queries shows it: definition, window, columns and where to read results."""
    spec: QuerySpec = qi.spec
    w = spec.window
    definition = fragment if fragment is not None else spec.model_dump(mode="json", by_alias=True)
    return {
        "name": spec.name,
        "description": spec.description,
        "filter": spec.filter,
        "definition": definition,
        "yaml": yaml.safe_dump(definition, sort_keys=False, default_flow_style=None),
        "window": {
            "range": _fmt_s(w.range_ns),
            "slide": _fmt_s(w.slide),
            "pane": _fmt_s(w.pane_ns),
            "range_ns": w.range_ns,
            "slide_ns": w.slide,
            "pane_ns": w.pane_ns,
            "origin_ns": w.origin_ns,
            "tumbling": w.tumbling and not w.landmark,
            "landmark": w.landmark,
        },
        "key_columns": [  # the group-by parts, then a top aggregate's item
            {
                "name": p.name,
                "field": p.field.name,
                "kind": "ip" if p.field.kind == "ip" else "int",
                "type": "string" if p.field.kind == "ip" else "int64",
                "prefix4": p.prefix4,
                "prefix6": p.prefix6,
            }
            for p in spec.key_parts
        ]
        + [
            {
                "name": n,
                "field": n,
                "kind": k,
                "type": "string" if k == "ip" else "int64",
                "prefix4": None,
                "prefix6": None,
            }
            for n, k in R.key_columns(spec)[len(spec.key_parts) :]
        ],
        "aggregate_columns": [
            {"name": n, "fn": fn, "field": a.field, "type": "float64" if fn in R.FLOAT_FNS else "int64"}
            for a in spec.aggregates
            for n, fn in a.output_columns()
        ],
        "result_columns": qi.output_columns,
        "avg_exact": qi.count_col is not None
        or not any(A.RESULT_KINDS[fn].fold.without_count for _, fn in qi.aggs),
        "links": {
            "results": f"/queries/{spec.name}/results",
            "latest": f"/queries/{spec.name}/latest",
            "series": f"/queries/{spec.name}/series",
        },
    }


def _check_params(request: Request, allowed: set[str]) -> list[tuple[str, str]]:
    """Reject unknown parameters (a typo should not silently return everything); return key.* filters."""
    keys: list[tuple[str, str]] = []
    for k, v in request.query_params.multi_items():
        if k.startswith("key."):
            keys.append((k[4:], v))
        elif k not in allowed:
            raise P.ParamError(
                f"unknown parameter {k!r}; allowed: {', '.join(sorted(allowed))}, key.<column>"
            )
    return keys


def _check_cursor_key(qi: QueryInfo, order: list[P.OrderTerm], key: list) -> None:
    """A cursor's sort key must fit the request's sort columns (one value each, of the column's type)."""
    terms = sort_terms(qi, order)
    kinds = qi.key_kinds
    ok = len(key) == len(terms)
    for (col, _), v in zip(terms, key, strict=False):
        if v is None:
            continue
        if kinds.get(col) == "ip":
            ok = ok and isinstance(v, str)
        elif col in kinds or col in ("window_start", "window_end"):
            ok = ok and isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = ok and isinstance(v, int | float) and not isinstance(v, bool)
    if not ok:
        raise P.ParamError(
            "cursor: not a cursor this API returned (take next_cursor of the previous page as is)"
        )


def _parse_filters(qi: QueryInfo, filters: list[str], keys: list[tuple[str, str]]) -> list[P.KeyFilter]:
    """The ``filter=column:value`` parameters and the ``key.<column>=value`` ones, as one list."""
    return P.parse_filters([*map(P.split_filter_param, filters), *keys], qi.key_kinds)


def _filter_texts(flt: list[P.KeyFilter]) -> list[str]:
    """The filters as the response echoes them (and a cursor's fingerprint holds them)."""
    return [f"{f.column}:{f.text}" for f in flt]


def _range_body(name: str, s: datetime, e: datetime) -> dict[str, Any]:
    """The head every range response starts with: the query and the range it resolved."""
    return {"query": name, "start": iso_of_us(us_of(s)), "end": iso_of_us(us_of(e))}


def _additive(qi: QueryInfo) -> list[str]:
    """The aggregate columns that add up over windows (count, sum): what a range sum or percentile takes."""
    return [a for a, fn in qi.aggs if A.RESULT_KINDS[fn].total == "sum"]


def router(svc: ApiService) -> APIRouter:
    r = APIRouter()

    @r.get("/queries", summary="All queries with definition, window and columns")
    def queries() -> dict[str, Any]:
        return {
            "queries": [describe_query(qi, svc.fragments.get(n)) for n, qi in svc.infos.items()],
            "row_queries": [rows.describe(ri, svc.fragments.get(n)) for n, ri in svc.row_infos.items()],
        }

    @r.get("/queries/{name}", summary="One query", responses={404: {"description": "unknown query"}})
    def query(name: str) -> dict[str, Any]:
        if name in svc.row_infos:
            return rows.describe(svc.row_infos[name], svc.fragments.get(name))
        return describe_query(svc.info(name), svc.fragments.get(name))

    @r.get(
        "/queries/{name}/results",
        summary="Closed windows in a time range, corrections folded",
        responses=_ERRORS,
    )
    def results_(
        request: Request,
        name: str,
        start: Start = None,
        end: End = None,
        filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
        order_by: OrderBy = None,
        top: Top = None,
        limit: Limit = P.DEFAULT_LIMIT,
        offset: Offset = 0,
        fmt: Format = "json",
        complete: Complete = None,
        cursor: Cursor = None,
    ) -> Response:
        keys = _check_params(request, _RESULTS_PARAMS)
        if (ri := svc.row_infos.get(name)) is not None:
            if top is not None or cursor is not None:
                rows.refuse(ri, "top" if top is not None else "cursor")
            req = rows.RowRequest.of(ri, keys, filters, order_by, complete, limit, offset, fmt)
            return rows.results(svc, ri, req, start, end)
        qi = svc.info(name)
        flt = _parse_filters(qi, filters, keys)
        order = P.parse_order(order_by, qi.order_columns)
        only = P.parse_complete(complete)
        fp = P.request_fingerprint(name, _filter_texts(flt), order_by, only)
        after = None
        if cursor is not None:
            if top is not None or offset:
                raise P.ParamError("cursor: not with top or offset (cursor paging pages rows without top)")
            cur = P.decode_cursor(cursor)
            if cur.fingerprint != fp:
                raise P.ParamError(
                    "cursor: it belongs to another request (query, filter, order_by, complete)"
                )
            _check_cursor_key(qi, order, cur.key)
            s, e, after = (
                EPOCH + timedelta(microseconds=cur.start_us),
                EPOCH + timedelta(microseconds=cur.end_us),
                cur.key,
            )
        else:
            s, e = P.time_range(start, end, svc.now(), svc.newest_end(qi, start, end))
        rs = svc.reader.results(qi, s, e, flt, order, top, limit, offset, only, after)
        paging = svc.paging(rs, limit, offset)
        paging["next_cursor"] = (
            None if rs.next_key is None else P.encode_cursor(fp, us_of(s), us_of(e), rs.next_key)
        )
        body = {
            **_range_body(name, s, e),
            "top": top,
            "order_by": order_by,
            "filters": _filter_texts(flt),
            "complete": only,
            "paging": paging,
        }
        return svc.respond(body, rs, fmt, f"{name}-results", qi)

    @r.get(
        "/queries/{name}/latest",
        summary="The newest closed window (all groups, or top-N)",
        responses=_ERRORS,
    )
    def latest(
        request: Request,
        name: str,
        filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
        order_by: OrderBy = None,
        top: Top = None,
        limit: Limit = P.DEFAULT_LIMIT,
        offset: Offset = 0,
        fmt: Format = "json",
        complete: Complete = None,
    ) -> Response:
        keys = _check_params(request, _LATEST_PARAMS)
        if (ri := svc.row_infos.get(name)) is not None:
            if top is not None:
                rows.refuse(ri, "top")
            req = rows.RowRequest.of(ri, keys, filters, order_by, complete, limit, offset, fmt)
            return rows.latest(svc, ri, req)
        qi = svc.info(name)
        flt = _parse_filters(qi, filters, keys)
        order = P.parse_order(order_by, qi.order_columns)
        only = P.parse_complete(complete)
        ws = svc.reader.latest_window(qi)
        body: dict[str, Any] = {
            "query": name,
            "window_start": None,
            "window_end": None,
            "top": top,
            "order_by": order_by,
            "filters": _filter_texts(flt),
            "complete": only,
        }
        if ws is None:
            rs = ResultSet(list(qi.output_columns) + (["rank"] if top else []), [], 0, frozenset())
        else:
            rs = svc.reader.results(
                qi, ws, ws + timedelta(microseconds=1), flt, order, top, limit, offset, only
            )
            body["window_start"] = iso_of_us(us_of(ws))
            body["window_end"] = iso_of_us(us_of(ws) + qi.spec.window.range_ns // 1000)
        body["paging"] = svc.paging(rs, limit, offset)
        return svc.respond(body, rs, fmt, f"{name}-latest", qi)

    @r.get(
        "/queries/{name}/series",
        summary="Per-window totals over all groups (for charts)",
        responses=_ERRORS,
    )
    def series(
        request: Request,
        name: str,
        start: Start = None,
        end: End = None,
        filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
        fmt: Format = "json",
        complete: Complete = None,
        step: Step = None,
    ) -> Response:
        qi = svc.info(name)
        keys = _check_params(request, _SERIES_PARAMS)
        step_ns = P.parse_step(step, qi.spec.window.slide)
        if step_ns:
            return _stepped_series(request, qi, start, end, filters, keys, fmt, complete, step_ns)
        s, e = P.time_range(start, end, svc.now(), svc.newest_end(qi, start, end))
        flt = _parse_filters(qi, filters, keys)
        only = P.parse_complete(complete)
        flags = svc.flagged.per_window(name, us_of(s), us_of(e))
        rs = svc.reader.series(
            qi, s, e, flt, None if flags else only
        )  # flagged windows: filtered after merging
        rows = merge_series(
            rs.columns, rs.rows, flags, qi.spec.window.range_ns // 1000, only if flags else None
        )
        rs = ResultSet([*rs.columns, *SERIES_COLUMNS], rows, len(rows), rs.time_columns)
        body = {
            **_range_body(name, s, e),
            "filters": _filter_texts(flt),
            "complete": only,
        }
        return svc.respond(body, rs, fmt, f"{name}-series")

    def _stepped(qi: QueryInfo, start: str | None, end: str | None, step_ns: int) -> tuple:
        s, e = P.stepped_range(start, end, step_ns, svc.now(), svc.newest_end(qi, start, end))
        tier = tierpick.choose(svc.tier_options(qi), us_of(s) * 1000, step_ns, us_of(svc.now()) * 1000)
        return s, e, tierpick.RAW if tier is None else tier.name

    def _stepped_series(
        request: Request,
        qi: QueryInfo,
        start: str | None,
        end: str | None,
        filters: list[str],
        keys: list[tuple[str, str]],
        fmt: str,
        complete: str | None,
        step_ns: int,
    ) -> Response:
        """/series with a step: one row per bucket; a bucket holding a flagged window is incomplete."""
        s, e, tier = _stepped(qi, start, end, step_ns)
        flt = _parse_filters(qi, filters, keys)
        only = P.parse_complete(complete)
        step_us = step_ns // 1000
        rs = svc.ranges.series(qi, s, e, flt, step_us, tier)
        flagged = {(w - us_of(s)) // step_us for w in svc.flagged.per_window(qi.name, us_of(s), us_of(e))}
        ic = rs.columns.index("complete")
        rows = []
        for r in rs.rows:
            row = list(r)
            if (row[0] - us_of(s)) // step_us in flagged:
                row[ic] = False
            if only is None or row[ic] == only:
                rows.append(tuple(row))
        rs = ResultSet(rs.columns, rows, len(rows), rs.time_columns)
        body = {
            **_range_body(qi.name, s, e),
            "step": _fmt_s(step_ns),
            "step_ns": step_ns,
            "tier": tier,
            "filters": _filter_texts(flt),
            "complete": only,
        }
        return svc.respond(body, rs, fmt, f"{qi.name}-series")

    @r.get(
        "/queries/{name}/top",
        summary="Top-N groups over a range: the sum of an additive column over its windows",
        responses=_ERRORS,
    )
    def top_(
        request: Request,
        name: str,
        start: Start = None,
        end: End = None,
        filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
        step: Step = None,
        by: Annotated[
            str | None,
            Query(
                max_length=200,
                description="The additive (count or sum) column to rank by; default the first.",
            ),
        ] = None,
        n: Annotated[int, Query(ge=1, le=P.MAX_TOP, description=f"How many groups (1..{P.MAX_TOP}).")] = 10,
        fmt: Format = "json",
    ) -> Response:
        qi = svc.info(name)
        keys = _check_params(request, _TOP_PARAMS)
        adds = _additive(qi)
        col = P.parse_column("by", by, adds, adds[0] if adds else "")
        if not col:
            raise P.ParamError(f"query {name!r} has no count or sum aggregate to rank by over a range")
        step_ns = P.parse_step(step, qi.spec.window.slide)
        if step_ns:
            s, e = P.stepped_range(start, end, step_ns, svc.now(), svc.newest_end(qi, start, end))
        else:
            s, e = P.time_range(start, end, svc.now(), svc.newest_end(qi, start, end))
        flt = _parse_filters(qi, filters, keys)
        # a sum over the range needs no granularity: whole days from the 1d tier, the edges finer
        plan = tierpick.plan(svc.tier_options(qi), us_of(s) * 1000, us_of(e) * 1000, us_of(svc.now()) * 1000)
        rs = svc.ranges.range_top(qi, s, e, flt, col, n, tuple((t, a // 1000, b // 1000) for t, a, b in plan))
        coarsest = max(plan, key=lambda p: p[2] - p[1])[0] if plan else tierpick.RAW
        body = {
            **_range_body(name, s, e),
            "step": None if step_ns is None else _fmt_s(step_ns),
            "tier": coarsest,
            "tiers": [
                {"tier": t, "start": iso_of_us(a // 1000), "end": iso_of_us(b // 1000)} for t, a, b in plan
            ],
            "by": col,
            "n": n,
            "filters": _filter_texts(flt),
        }
        return svc.respond(body, rs, fmt, f"{name}-top", qi)

    @r.get(
        "/queries/{name}/percentile",
        summary="Billing-style percentile of a series: per step, then the p-th percentile over the steps",
        responses=_ERRORS,
    )
    def percentile(
        request: Request,
        name: str,
        start: Start = None,
        end: End = None,
        filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
        step: Annotated[
            str,
            Query(
                max_length=32, description="The sampling step, e.g. '5m' (billing); a multiple of the slide."
            ),
        ] = "5m",
        column: Annotated[
            str | None, Query(max_length=200, description="The additive column; default the first.")
        ] = None,
        p: Annotated[
            str | None, Query(max_length=32, description="Percentile in (0, 100]; default 95.")
        ] = None,
    ) -> dict[str, Any]:
        qi = svc.info(name)
        keys = _check_params(request, _PERCENTILE_PARAMS)
        adds = _additive(qi)
        col = P.parse_column("column", column, adds, adds[0] if adds else "")
        if not col:
            raise P.ParamError(f"query {name!r} has no count or sum aggregate to take a percentile of")
        pct = P.parse_percentile(p)
        step_ns = P.parse_step(step, qi.spec.window.slide)
        assert step_ns is not None
        s, e, tier = _stepped(qi, start, end, step_ns)
        flt = _parse_filters(qi, filters, keys)
        step_us = step_ns // 1000
        rs = svc.ranges.series(qi, s, e, flt, step_us, tier)
        ci = rs.columns.index(col)
        got = nearest_rank_over_steps(
            {int(r[0]): int(r[ci]) for r in rs.rows if r[ci] is not None}, us_of(s), us_of(e), step_us, pct
        )
        return {
            **_range_body(name, s, e),
            "step": _fmt_s(step_ns),
            "tier": tier,
            "column": col,
            "p": pct,
            "method": "nearest-rank",
            "filters": _filter_texts(flt),
            "value": got.value,
            "at": None if got.at_us is None else iso_of_us(got.at_us),
            "steps": got.steps,
            "empty_steps": got.empty,
            "max": got.max,
        }

    @r.get(
        "/queries/{name}/incomplete",
        summary="Windows known short (shed or lost records), rows or not",
        responses=_ERRORS,
    )
    def incomplete(request: Request, name: str, start: Start = None, end: End = None) -> dict[str, Any]:
        qi = svc.info(name)
        _check_params(request, _INCOMPLETE_PARAMS)
        s, e = P.time_range(start, end, svc.now(), svc.newest_end(qi, start, end))
        return {
            **_range_body(name, s, e),
            "windows": svc.flagged.windows(name, us_of(s), us_of(e)),
        }

    return r
