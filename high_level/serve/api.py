"""The read-only REST API and results page over the high-level job's results (``lowwater-api``).

Endpoints (all GET; OpenAPI at /docs):

* ``/health``: liveness and how many result files were rejected for breaking the layout; never needs a token.
* ``/queries``, ``/queries/{name}``: query definitions (the original YAML), window spec, key and
  aggregate columns.
* ``/queries/{name}/results``: the windows whose window_start is in [start, end) (default: the hour up to
  the newest closed window, so a replay shows its data; at most 7 days), one row per (window, group).
  Group-key filters ``key.<col>=v`` or ``filter=<col>:v`` (exact value, or an IPv4/IPv6 prefix such as
  10.0.0.0/8 or 2001:db8::/32 for address columns; several filters on one column are OR-ed, different
  columns AND-ed); ``order_by``;
  ``top`` (top-N groups per window, with a ``rank`` column); ``limit`` (<= 10000) and ``offset``
  paging (``paging.total`` / ``next_offset``); ``format=json|csv`` (CSV: total in X-Total-Count);
  ``complete=true|false``: only complete / incomplete rows (with ``top``: ranked among those).
* ``/queries/{name}/latest``: the newest window that has final rows (same filters, top, paging, format,
  complete).
* ``/queries/{name}/series``: per-window totals over all groups (what the page charts), with the
  window's completeness; ``complete=true|false`` keeps the windows whose groups are all complete / not.
  Flagged windows (below) are incomplete here, and one without rows gets a row with no groups and no
  values (``flagged``, ``shed_records``).
* ``/queries/{name}/incomplete``: the flagged windows in a time range: windows the job learned were
  short (panes a capture host's backlog shed, records lost in a sequence gap), *rows or not*: a window
  whose every record was shed has no row to say so. Per window ``incomplete: true``, the shed and
  lost records, the hosts and every short pane range.
* ``/status``: capture hosts (low-water mark, live, lag, late/missing counters), open windows per
  query and partition: the job's status document (:mod:`contract.status`), validated.
* ``/alerts``: alerts fired on closed windows (newest first; ``query``, ``alert``, ``start`` = closed at or
  after, ``limit``), each with its group, aggregate values, labels and whether the webhook accepted it.
* ``/metrics``: Prometheus metrics of the API (``lowwater_api_requests_total``,
  ``lowwater_api_request_duration_seconds``).
* ``/`` and ``/ui``: the results page.

Corrections are folded into the final row of their window and group: count and sum add up, min and
max take the min/max, avg is recomputed exactly as the count-weighted mean when the query also has a
``count`` aggregate. A query with avg but no count cannot be folded exactly: its avg stays the final
row's value (``avg_exact: false`` in /queries); the row's ``corrections`` column says how many
correction rows were folded in. ``late`` rows (late policy drop) are never added to a value: they add
their ``late_partials`` to the group and make it incomplete. Every row carries its completeness
(``hosts_expected``, ``hosts_in_mark``, ``late_partials``, ``missing_records``, ``complete``; what
complete means is :mod:`contract.results`'s).

With a token configured, every endpoint except /health and the static shells that hold no data (the
page, /docs, /openapi.json) needs ``Authorization: Bearer <token>``; that includes /metrics (give
Prometheus the token). The page takes the token from ``/ui#token=<token>`` or asks for it. Invalid
parameters are 400 with a message, unknown queries 404, an unreadable store 503.
"""

from __future__ import annotations

import argparse
import csv
import hmac
import io
import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from contract import aggregates as A
from contract import results as R
from contract.kafka_security import KafkaSecurity
from contract.query import NS, ConfigError, QuerySpec, load
from high_level.live.hub import MAX_SUBSCRIBERS, KafkaLiveSource, LiveHub
from high_level.live.hub import stream as live_stream_body
from high_level.serve import params as P
from high_level.serve.alerts import AlertReader
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import StoreError
from high_level.serve.incomplete import SERIES_COLUMNS, IncompleteReader, merge_series
from high_level.serve.metrics import ApiMetrics, LiveCollector, MetricsMiddleware
from high_level.serve.netnames import NetNames
from high_level.serve.reader import Reader, ResultSet
from high_level.serve.settings import ApiSettings
from high_level.serve.status import read_status
from high_level.serve.timefmt import iso_of_us, us_of

STATIC = Path(__file__).parent / "static"
try:  # optional dependency swagger-ui-bundle-v2: Swagger UI assets served locally instead of from a CDN
    from swagger_ui_bundle import swagger_ui_path as SWAGGER_UI
except ImportError:  # pragma: no cover - depends on the environment
    SWAGGER_UI = None
TOKEN_ENV = "LOWWATER_API_TOKEN"
log = logging.getLogger("lowwater.api")
_RESULTS_PARAMS = {"start", "end", "filter", "order_by", "top", "limit", "offset", "format", "complete"}
_LATEST_PARAMS = {"filter", "order_by", "top", "limit", "offset", "format", "complete"}
_SERIES_PARAMS = {"start", "end", "filter", "format", "complete"}
_INCOMPLETE_PARAMS = {"start", "end"}

# --- parameter declarations shared by the endpoints (they also document the OpenAPI schema)
Start = Annotated[str | None, Query(
    description="Start of the range (inclusive, by window_start): ISO-8601 (naive = UTC), epoch seconds, "
                "'now' or 'now-15m'/'-15m'. Default: end minus 1 hour.",
    examples=["2024-05-01T12:00:00Z", "1714564800", "-15m"], max_length=64)]  # fmt: skip
End = Annotated[str | None, Query(
    description="End of the range (exclusive). Default: the end of the query's newest closed window when start "
                "is not given either (a replayed or stopped capture still shows its last hour), else now. The "
                "range may span at most 7 days.", max_length=64)]  # fmt: skip
Filters = Annotated[list[str], Query(
    alias="filter", max_length=P.MAX_FILTERS,
    description="Group-key filter 'column:value', repeatable: exact value, or for address columns a prefix "
                "like 'src_ip:10.0.0.0/8' or 'dst_ip:2001:db8::/32'. Several filters on one column are OR-ed, "
                "on different columns AND-ed. Equivalent: key.<column>=value.")]  # fmt: skip
OrderBy = Annotated[str | None, Query(
    max_length=200,
    description="Comma-separated columns (aggregates, window_start, window_end, key columns), '-' prefix for "
                "descending. Without top: the row order. With top: the first aggregate listed ranks the "
                "groups of each window (default: the query's first aggregate, descending); rows come "
                "grouped by window, ascending unless '-window_start' is listed.")]  # fmt: skip
Top = Annotated[int | None, Query(ge=1, le=P.MAX_TOP, description=f"Top-N groups per window (1..{P.MAX_TOP}).")]
Limit = Annotated[int, Query(ge=1, le=P.MAX_LIMIT, description=f"Page size (1..{P.MAX_LIMIT}).")]
Offset = Annotated[int, Query(ge=0, le=P.MAX_OFFSET, description="Rows to skip (paging).")]
Format = Annotated[Literal["json", "csv"], Query(alias="format", description="json (default) or csv.")]
Complete = Annotated[str | None, Query(max_length=16, description=(
    "true: only complete rows (windows for /series), false: only incomplete ones; default all. Complete: every "
    "known capture host's mark passed the window, no late partial dropped, no records missing."))]
_BEARER = HTTPBearer(auto_error=False, description="Needed when the API runs with --token / LOWWATER_API_TOKEN.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def _yaml_fragments(path: str | Path) -> dict[str, Any]:
    """The original YAML mapping of each query (what the operator wrote), by name."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        return {q["name"]: q for q in doc.get("queries", []) if isinstance(q, dict) and "name" in q}
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return {}


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
            "range": _fmt_s(w.range_ns), "slide": _fmt_s(w.slide), "pane": _fmt_s(w.pane_ns),
            "range_ns": w.range_ns, "slide_ns": w.slide, "pane_ns": w.pane_ns, "origin_ns": w.origin_ns,
            "tumbling": w.tumbling and not w.landmark, "landmark": w.landmark,
        },  # fmt: skip
        "key_columns": [  # the group-by parts, then a top aggregate's item
            {"name": p.name, "field": p.field.name, "kind": "ip" if p.field.kind == "ip" else "int",
             "type": "string" if p.field.kind == "ip" else "int64", "prefix4": p.prefix4, "prefix6": p.prefix6}
            for p in spec.key_parts
        ] + [{"name": n, "field": n, "kind": k, "type": "string" if k == "ip" else "int64", "prefix4": None,
              "prefix6": None} for n, k in R.key_columns(spec)[len(spec.key_parts):]],  # fmt: skip
        "aggregate_columns": [
            {"name": n, "fn": fn, "field": a.field, "type": "float64" if fn in R.FLOAT_FNS else "int64"}
            for a in spec.aggregates for n, fn in a.output_columns()
        ],
        "result_columns": qi.output_columns,
        "avg_exact": qi.count_col is not None or not any(A.RESULT_KINDS[fn].fold.without_count for _, fn in qi.aggs),
        "links": {
            "results": f"/queries/{spec.name}/results",
            "latest": f"/queries/{spec.name}/latest",
            "series": f"/queries/{spec.name}/series",
        },
    }


def _converters(rs: ResultSet) -> list[Callable[[Any], Any]]:
    cache: dict[int, str] = {}

    def ts(v: Any) -> Any:
        if v is None:
            return None
        s = cache.get(v)
        if s is None:
            s = cache[v] = iso_of_us(int(v))
        return s

    def num(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return [ts if c in rs.time_columns else num for c in rs.columns]


def _rows(rs: ResultSet) -> list[dict[str, Any]]:
    conv = _converters(rs)
    cols = rs.columns
    return [{c: f(v) for c, f, v in zip(cols, conv, r, strict=True)} for r in rs.rows]


def _csv(rs: ResultSet) -> str:
    conv = _converters(rs)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(rs.columns)
    for r in rs.rows:
        w.writerow(["" if v is None else v for v in (f(x) for f, x in zip(conv, r, strict=True))])
    return buf.getvalue()


def _check_params(request: Request, allowed: set[str]) -> list[tuple[str, str]]:
    """Reject unknown parameters (a typo should not silently return everything); return key.* filters."""
    keys: list[tuple[str, str]] = []
    for k, v in request.query_params.multi_items():
        if k.startswith("key."):
            keys.append((k[4:], v))
        elif k not in allowed:
            raise P.ParamError(f"unknown parameter {k!r}; allowed: {', '.join(sorted(allowed))}, key.<column>")
    return keys


def _warm(reader: Reader, infos: list[QueryInfo], stop: threading.Event, done: threading.Event) -> None:
    try:
        for qi in infos:
            try:
                reader.warm(qi, timedelta(hours=1), stop)
            except Exception:  # warming is an optimisation; requests report real errors themselves
                log.exception("warming the cache for %s failed", qi.name)
    finally:
        done.set()


def create_app(config_path: str | Path, results_dir: str | Path, token: str | None = None,
               cache_mb: int = 512, live_bootstrap: str | None = None,
               live_source: Callable[[LiveHub], Any] | None = None,
               live_security: KafkaSecurity | None = None) -> FastAPI:  # fmt: skip
    """Build the API for one config and one results directory.

    ``token`` enables bearer auth; ``cache_mb`` bounds the in-memory copies of result files (requests
    whose files exceed half of it read Parquet directly, slower); ``live_security`` is how the reader of
    the live topics at ``live_bootstrap`` authenticates (the role's Kafka security block).
    """
    cfg = load(config_path)
    infos = {q.name: QueryInfo.of(q) for q in cfg.stored_queries}  # aggregates and windowed joins
    net_names = NetNames(cfg.networks)
    fragments = _yaml_fragments(config_path)
    results = Path(results_dir)
    reader = Reader(results, cache_mb=cache_mb)
    alert_reader = AlertReader(results)
    flagged = IncompleteReader(results)  # windows known short, rows or not (contract.results)
    metrics = ApiMetrics()
    token = token or None
    warmed = threading.Event()
    hub = LiveHub(cfg.queries)  # live values of open windows (contract/live.py), when --live-bootstrap is set
    metrics.registry.register(LiveCollector(hub))  # the update queues' staleness on /metrics
    # the reader of the live topics; tests may pass another source (anything with start/stop)
    security = (live_security or KafkaSecurity()).kafka_python()
    live_source = (live_source(hub) if live_source
                   else KafkaLiveSource(hub, live_bootstrap, security) if live_bootstrap else None)  # fmt: skip

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # prepare the newest hour of every query in the background: the first page view is then fast
        stop = threading.Event()
        warm = threading.Thread(target=_warm, args=(reader, list(infos.values()), stop, warmed), name="lowwater-api-warm")
        warm.start()
        if live_source is not None:
            live_source.start()
        try:
            yield
        finally:  # never leave a thread inside DuckDB when the process exits
            stop.set()
            if live_source is not None:
                live_source.stop()
            warm.join(30)

    app = FastAPI(
        title="lowwater API",
        version="0.1.0",
        description=__doc__,
        docs_url=None if SWAGGER_UI else "/docs",  # without the bundle, FastAPI's default page (CDN assets)
        redoc_url=None,
        lifespan=lifespan,
    )
    if SWAGGER_UI:  # Swagger UI served from the installed bundle: /docs works without internet access
        app.mount("/docs/assets", StaticFiles(directory=SWAGGER_UI), name="swagger-ui")

        @app.get("/docs", include_in_schema=False)
        def docs() -> HTMLResponse:
            return get_swagger_ui_html(
                openapi_url="/openapi.json", title="lowwater API",
                swagger_js_url="/docs/assets/swagger-ui-bundle.js", swagger_css_url="/docs/assets/swagger-ui.css",
                swagger_favicon_url="/docs/assets/favicon-32x32.png",
            )  # fmt: skip
    app.state.reader = reader
    app.state.live_source = live_source
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics, router_app=app)

    def require_token(creds: Credentials) -> None:
        """Constant-time check of the bearer token (only installed when a token is configured)."""
        ok = creds is not None and hmac.compare_digest(creds.credentials.encode(), token.encode())  # type: ignore[union-attr]
        if not ok:
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    guarded = APIRouter(dependencies=[Depends(require_token)] if token else [])
    open_ = APIRouter()

    @app.exception_handler(P.ParamError)
    async def _param_error(_: Request, exc: P.ParamError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ())[1:]) or "request"
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return JSONResponse({"detail": "invalid parameters: " + "; ".join(parts)}, status_code=400)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    def info(name: str) -> QueryInfo:
        qi = infos.get(name)
        if qi is None:
            raise HTTPException(404, f"unknown query {name!r}; known: {', '.join(infos)}")
        return qi

    def now() -> datetime:
        return datetime.now(UTC)

    def newest_end(qi: QueryInfo, start: str | None, end: str | None) -> datetime | None:
        """The end of the query's newest closed window, when a request gives no range (None otherwise)."""
        if start is not None or end is not None:
            return None
        ws = reader.latest_window(qi)
        return None if ws is None else ws + timedelta(microseconds=qi.spec.window.range_ns // 1000)

    def respond(body: dict[str, Any], rs: ResultSet, fmt: str, filename: str, qi: QueryInfo | None = None) -> Response:
        if fmt == "csv":
            headers = {"X-Total-Count": str(rs.total), "Content-Disposition": f'inline; filename="{filename}.csv"'}
            return Response(_csv(rs), media_type="text/csv; charset=utf-8", headers=headers)
        body["columns"] = rs.columns
        body["rows"] = _rows(rs)
        if qi is not None and cfg.networks:  # src_net / dst_net ids -> names (high_level.serve.netnames)
            body["net_names"] = net_names.for_rows(qi.spec, rs.columns, rs.rows)
        return JSONResponse(body)

    def paging(rs: ResultSet, limit: int, offset: int) -> dict[str, Any]:
        nxt = offset + len(rs.rows)
        return {"limit": limit, "offset": offset, "returned": len(rs.rows), "total": rs.total,
                "next_offset": nxt if nxt < rs.total else None}  # fmt: skip

    # ---- open endpoints
    @open_.get("/health", summary="Liveness (no auth)")
    def health() -> dict[str, Any]:
        return {"status": "ok", "queries": len(infos), "results_dir": str(results), "results_dir_exists": results.is_dir(),
                "cache": {"warmed": warmed.is_set(), "bytes": reader.cache.nbytes},
                "rejected_files": {"total": reader.index.rejections, "current": len(reader.index.rejected())},
                "rejected_flagged_window_files": len(flagged.rejected)}  # fmt: skip

    @open_.get("/", include_in_schema=False)
    @open_.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @open_.get("/ui/{asset}", include_in_schema=False)
    def asset(asset: str) -> FileResponse:
        files = {p.name: p for p in STATIC.iterdir() if p.is_file()}
        if asset not in files:
            raise HTTPException(404, f"no asset {asset!r}")
        return FileResponse(files[asset], headers={"Cache-Control": "no-cache"})

    # ---- guarded endpoints
    @guarded.get("/queries", summary="All queries with definition, window and columns")
    def queries() -> dict[str, Any]:
        return {"queries": [describe_query(qi, fragments.get(n)) for n, qi in infos.items()]}

    @guarded.get("/queries/{name}", summary="One query", responses={404: {"description": "unknown query"}})
    def query(name: str) -> dict[str, Any]:
        return describe_query(info(name), fragments.get(name))

    @guarded.get("/queries/{name}/results", summary="Closed windows in a time range, corrections folded",
                 responses={400: {"description": "invalid parameter"}, 404: {"description": "unknown query"}})  # fmt: skip
    def results_(request: Request, name: str, start: Start = None, end: End = None,
                 filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
                 order_by: OrderBy = None, top: Top = None, limit: Limit = P.DEFAULT_LIMIT,
                 offset: Offset = 0, fmt: Format = "json", complete: Complete = None) -> Response:  # fmt: skip
        qi = info(name)
        keys = _check_params(request, _RESULTS_PARAMS)
        s, e = P.time_range(start, end, now(), newest_end(qi, start, end))
        flt = P.parse_filters([*map(P.split_filter_param, filters), *keys], qi.key_kinds)
        order = P.parse_order(order_by, qi.order_columns)
        only = P.parse_complete(complete)
        rs = reader.results(qi, s, e, flt, order, top, limit, offset, only)
        body = {"query": name, "start": iso_of_us(us_of(s)), "end": iso_of_us(us_of(e)), "top": top,
                "order_by": order_by, "filters": [f"{f.column}:{f.text}" for f in flt], "complete": only,
                "paging": paging(rs, limit, offset)}  # fmt: skip
        return respond(body, rs, fmt, f"{name}-results", qi)

    @guarded.get("/queries/{name}/latest", summary="The newest closed window (all groups, or top-N)",
                 responses={400: {"description": "invalid parameter"}, 404: {"description": "unknown query"}})  # fmt: skip
    def latest(request: Request, name: str, filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
               order_by: OrderBy = None, top: Top = None, limit: Limit = P.DEFAULT_LIMIT,
               offset: Offset = 0, fmt: Format = "json", complete: Complete = None) -> Response:  # fmt: skip
        qi = info(name)
        keys = _check_params(request, _LATEST_PARAMS)
        flt = P.parse_filters([*map(P.split_filter_param, filters), *keys], qi.key_kinds)
        order = P.parse_order(order_by, qi.order_columns)
        only = P.parse_complete(complete)
        ws = reader.latest_window(qi)
        body: dict[str, Any] = {"query": name, "window_start": None, "window_end": None, "top": top,
                                "order_by": order_by, "filters": [f"{f.column}:{f.text}" for f in flt],
                                "complete": only}  # fmt: skip
        if ws is None:
            rs = ResultSet(list(qi.output_columns) + (["rank"] if top else []), [], 0, frozenset())
        else:
            rs = reader.results(qi, ws, ws + timedelta(microseconds=1), flt, order, top, limit, offset, only)
            body["window_start"] = iso_of_us(us_of(ws))
            body["window_end"] = iso_of_us(us_of(ws) + qi.spec.window.range_ns // 1000)
        body["paging"] = paging(rs, limit, offset)
        return respond(body, rs, fmt, f"{name}-latest", qi)

    @guarded.get("/queries/{name}/series", summary="Per-window totals over all groups (for charts)",
                 responses={400: {"description": "invalid parameter"}, 404: {"description": "unknown query"}})  # fmt: skip
    def series(request: Request, name: str, start: Start = None, end: End = None,
               filters: Filters = [],  # noqa: B006 - FastAPI copies Query defaults
               fmt: Format = "json", complete: Complete = None) -> Response:  # fmt: skip
        qi = info(name)
        keys = _check_params(request, _SERIES_PARAMS)
        s, e = P.time_range(start, end, now(), newest_end(qi, start, end))
        flt = P.parse_filters([*map(P.split_filter_param, filters), *keys], qi.key_kinds)
        only = P.parse_complete(complete)
        flags = flagged.per_window(name, us_of(s), us_of(e))
        rs = reader.series(qi, s, e, flt, None if flags else only)  # flagged windows: filtered after merging
        rows = merge_series(rs.columns, rs.rows, flags, qi.spec.window.range_ns // 1000, only if flags else None)
        rs = ResultSet([*rs.columns, *SERIES_COLUMNS], rows, len(rows), rs.time_columns)
        body = {"query": name, "start": iso_of_us(us_of(s)), "end": iso_of_us(us_of(e)),
                "filters": [f"{f.column}:{f.text}" for f in flt], "complete": only}  # fmt: skip
        return respond(body, rs, fmt, f"{name}-series")

    @guarded.get("/queries/{name}/incomplete", summary="Windows known short (shed or lost records), rows or not",
                 responses={400: {"description": "invalid parameter"}, 404: {"description": "unknown query"}})  # fmt: skip
    def incomplete(request: Request, name: str, start: Start = None, end: End = None) -> dict[str, Any]:
        qi = info(name)
        _check_params(request, _INCOMPLETE_PARAMS)
        s, e = P.time_range(start, end, now(), newest_end(qi, start, end))
        return {"query": name, "start": iso_of_us(us_of(s)), "end": iso_of_us(us_of(e)),
                "windows": flagged.windows(name, us_of(s), us_of(e))}  # fmt: skip

    @guarded.get("/status", summary="Capture hosts, low-water marks, lag, late counts, open windows")
    def status() -> dict[str, Any]:
        # the job's document, plus what only the API knows: its live consumers' queues (UpStream staleness)
        st = hub.stats()
        live = {"enabled": live_source is not None, "received": st["received"], "consumers": [
            {k: c[k] for k in ("id", "query", "policy", "load_factor", "staleness_now_s", "staleness_avg_s",
                               "overwrites", "skipped_windows", "delivered")} for c in st["consumers"]]}  # fmt: skip
        return {**read_status(results), "live": live}

    @guarded.get("/alerts", summary="Alerts fired on closed windows, newest first")
    def alerts(query: Annotated[str | None, Query(max_length=64, description="only this query")] = None,
               alert: Annotated[str | None, Query(max_length=64, description="only this alert rule")] = None,
               start: Annotated[str | None, Query(max_length=64, description="closed at or after (as /results' start)")] = None,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:  # fmt: skip
        if query is not None:
            info(query)
        since = us_of(P.parse_time("start", start, now())) if start is not None else None
        return alert_reader.alerts(query, alert, since, limit)

    @guarded.get("/live", summary="Live results: the reader of the live topics and every live consumer's queue")
    def live_stats() -> dict[str, Any]:
        return {"enabled": live_source is not None, **hub.stats()}

    @guarded.get("/live/{name}/values", summary="The newest values (provisional or final) of a query's last windows")
    def live_values(name: str) -> dict[str, Any]:
        info(name)
        return {"query": name, "enabled": live_source is not None, "values": hub.snapshot(name)}

    @guarded.get("/live/{name}", summary="Server-Sent Events: a query's live values through an update queue",
                 response_class=StreamingResponse)  # fmt: skip
    async def live_stream(name: str, request: Request,
                          policy: Annotated[Literal["fifo", "inplace", "linecutting"], Query()] = "inplace",
                          rate: Annotated[float, Query(gt=0, le=10_000, description="updates per second")] = 50.0,
                          max_s: Annotated[float | None, Query(gt=0, le=86_400, description="end after")] = None,
                          ) -> StreamingResponse:  # fmt: skip
        info(name)
        if live_source is None:
            raise HTTPException(404, "live results are not enabled (lowwater-api --live-bootstrap, job --live)")
        if len(hub.subs) >= MAX_SUBSCRIBERS:
            raise HTTPException(503, f"{MAX_SUBSCRIBERS} live consumers already")
        body = live_stream_body(hub, name, policy, rate, max_s, request.is_disconnected)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})  # fmt: skip

    @guarded.get("/metrics", summary="Prometheus metrics of the API", response_class=Response)
    def metrics_() -> Response:
        data, ctype = metrics.render()
        return Response(data, media_type=ctype)

    app.include_router(open_)
    app.include_router(guarded)
    return app


def settings_of(argv: list[str] | None = None) -> ApiSettings:
    """``lowwater-api``'s command line (and environment, settings file) -> its settings, or SystemExit saying why."""
    from contract.settings import SettingsError, load

    ap = argparse.ArgumentParser(prog="lowwater-api", description=__doc__.split("\n\n")[0] + " Every flag can also "
                                 "be set as LOWWATER_API_<FLAG> or in --settings FILE.")  # fmt: skip
    ap.add_argument("--settings", help="YAML file of settings (field names as the flags, with _)")
    ap.add_argument("--config", help="query config (YAML; default configs/default.yaml)")
    ap.add_argument("--results", help="results directory written by the high-level job; required")
    ap.add_argument("--host", help="listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, help="listen port (default 8080)")
    ap.add_argument("--token", help=f"require 'Authorization: Bearer <token>' (better: env {TOKEN_ENV}); /health stays open")
    ap.add_argument("--cache-mb", type=int,
                    help="memory for prepared result files (default 512); longer ranges than fit read Parquet directly")
    ap.add_argument("--log-level", help="uvicorn log level (default info)")
    ap.add_argument("--live-bootstrap", help="Kafka to read the live topics from (lowwater.live.<query>); "
                    "without it /live/{query} serves nothing")
    ap.add_argument("--kafka-security", metavar="JSON",
                    help="the Kafka security block of the live reader (protocol, sasl_mechanism, username, password, "
                         "ca_file, ...), as every role takes it; better: env LOWWATER_API_KAFKA_SECURITY; "
                         "see deploy/SECURITY.md")  # fmt: skip
    a = ap.parse_args(argv)
    flags = {k: v for k, v in vars(a).items() if k not in ("settings", "kafka_security")}
    if a.kafka_security is not None:
        try:
            flags["kafka_security"] = json.loads(a.kafka_security)
        except ValueError as exc:
            raise SystemExit(f"lowwater-api: --kafka-security is not JSON: {exc}") from None
    try:
        return load(ApiSettings, flags, a.settings)
    except SettingsError as exc:
        raise SystemExit(f"lowwater-api: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    """``lowwater-api``: serve the API and the results page with uvicorn."""
    import uvicorn

    s = settings_of(argv)
    try:
        token = s.token.get_secret_value() if s.token is not None else None
        app = create_app(s.config, s.results, token, cache_mb=s.cache_mb, live_bootstrap=s.live_bootstrap,
                         live_security=s.kafka_security)  # fmt: skip
    except ConfigError as exc:
        raise SystemExit(f"lowwater-api: {exc}") from None
    uvicorn.run(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False)


if __name__ == "__main__":
    main()
