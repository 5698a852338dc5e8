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
* Row-window queries (``kind: rows``): listed under ``row_queries``; ``/results`` (by ``closed_at``) and
  ``/latest`` (each stream's newest window) return their windows with ``missing_records`` and ``complete``
  (:mod:`high_level.serve.routes.rows`); the endpoints that need a time span are a 400 for them.
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
import hmac
import json
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles

from contract.kafka_security import KafkaSecurity
from contract.query import ConfigError, load
from high_level.live.hub import KafkaLiveSource, LiveHub
from high_level.serve import params as P
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import StoreError
from high_level.serve.metrics import ApiMetrics, LiveCollector, MetricsMiddleware
from high_level.serve.ranges import RangeReader
from high_level.serve.reader import Reader
from high_level.serve.routes import live, ops, queries, site
from high_level.serve.service import ApiService, yaml_fragments
from high_level.serve.settings import ApiSettings

try:  # optional dependency swagger-ui-bundle-v2: Swagger UI assets served locally instead of from a CDN
    from swagger_ui_bundle import swagger_ui_path as SWAGGER_UI
except ImportError:  # pragma: no cover - depends on the environment
    SWAGGER_UI = None
TOKEN_ENV = "LOWWATER_API_TOKEN"
log = logging.getLogger("lowwater.api")

_BEARER = HTTPBearer(
    auto_error=False, description="Needed when the API runs with --token / LOWWATER_API_TOKEN."
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def _warm(
    reader: Reader, ranges: RangeReader, infos: list[QueryInfo], stop: threading.Event, done: threading.Event
) -> None:
    try:
        for qi in infos:
            try:
                reader.warm(qi, timedelta(hours=1), stop)
            except Exception:  # warming is an optimisation; requests report real errors themselves
                log.exception("warming the cache for %s failed", qi.name)
    finally:
        done.set()
    for qi in infos:  # then the tiers' per-file partials (stepped series over months; docs/ranges.md)
        try:
            ranges.warm_tiers(qi, stop)
        except Exception:
            log.exception("warming the tiers of %s failed", qi.name)


def _on_sighup(reload: Callable[[], bool]) -> Any:
    """Reload on SIGHUP (the previous handler is returned); None off the main thread (a test client's
    app), where Python cannot install handlers: the file then reloads through ``reload`` only."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGHUP, lambda *_: reload())


def create_app(
    config_path: str | Path,
    results_dir: str | Path,
    token: str | None = None,
    cache_mb: int = 512,
    live_bootstrap: str | None = None,
    live_source: Callable[[LiveHub], Any] | None = None,
    live_security: KafkaSecurity | None = None,
    interfaces: str | None = None,
) -> FastAPI:
    """Build the API for one config and one results directory.

    ``token`` enables bearer auth; ``cache_mb`` bounds the in-memory copies of result files (requests
    whose files exceed half of it read Parquet directly, slower); ``live_security`` is how the reader of
    the live topics at ``live_bootstrap`` authenticates (the role's Kafka security block); ``interfaces``
    names the ports of results grouped by exporter and interface (re-read on SIGHUP).
    """
    cfg = load(config_path)
    hub = LiveHub(cfg.queries)  # live values of open windows (contract/live.py), when --live-bootstrap is set
    # the reader of the live topics; tests may pass another source (anything with start/stop)
    security = (live_security or KafkaSecurity()).librdkafka()
    live_source = (
        live_source(hub)
        if live_source
        else KafkaLiveSource(hub, live_bootstrap, security)
        if live_bootstrap
        else None
    )
    svc = ApiService(
        cfg,
        yaml_fragments(config_path),
        Path(results_dir),
        Reader(Path(results_dir), cache_mb=cache_mb),
        ApiMetrics(),
        hub,
        live_source,
        interfaces,
    )
    svc.metrics.registry.register(LiveCollector(hub))  # the update queues' staleness on /metrics
    token = token or None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # prepare the newest hour of every query in the background: the first page view is then fast
        stop = threading.Event()
        warm = threading.Thread(
            target=_warm,
            args=(svc.reader, svc.ranges, list(svc.infos.values()), stop, svc.warmed),
            name="lowwater-api-warm",
        )
        warm.start()
        if live_source is not None:
            live_source.start()
        hup = _on_sighup(svc.if_names.reload) if interfaces else None
        try:
            yield
        finally:
            if hup is not None:
                signal.signal(signal.SIGHUP, hup)  # never leave a thread inside DuckDB when the process exits
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
                openapi_url="/openapi.json",
                title="lowwater API",
                swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                swagger_css_url="/docs/assets/swagger-ui.css",
                swagger_favicon_url="/docs/assets/favicon-32x32.png",
            )

    app.state.reader = svc.reader
    app.state.live_source = live_source
    app.state.metrics = svc.metrics
    app.add_middleware(MetricsMiddleware, metrics=svc.metrics, router_app=app)

    def require_token(creds: Credentials) -> None:
        """Constant-time check of the bearer token (only installed when a token is configured)."""
        ok = creds is not None and hmac.compare_digest(creds.credentials.encode(), token.encode())  # type: ignore[union-attr]
        if not ok:
            raise HTTPException(
                401,
                "missing or wrong bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

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

    # the page's shell and /health are open; every route that reads data needs the token (when set)
    app.include_router(site.router(svc))
    guarded = [Depends(require_token)] if token else []
    for r in (
        queries.router(svc),
        ops.status_router(svc),
        ops.alerts_router(svc),
        live.router(svc),
        ops.metrics_router(svc),
    ):
        app.include_router(r, dependencies=guarded)
    return app


def settings_of(argv: list[str] | None = None) -> ApiSettings:
    """``lowwater-api``'s command line (and environment, settings file) -> its settings, or SystemExit saying why."""
    from contract.settings import SettingsError, load

    ap = argparse.ArgumentParser(
        prog="lowwater-api",
        description=__doc__.split("\n\n")[0] + " Every flag can also "
        "be set as LOWWATER_API_<FLAG> or in --settings FILE.",
    )
    ap.add_argument("--settings", help="YAML file of settings (field names as the flags, with _)")
    ap.add_argument("--config", help="query config (YAML; default configs/default.yaml)")
    ap.add_argument("--results", help="results directory written by the high-level job; required")
    ap.add_argument("--host", help="listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, help="listen port (default 8080)")
    ap.add_argument(
        "--token",
        help=f"require 'Authorization: Bearer <token>' (better: env {TOKEN_ENV}); /health stays open",
    )
    ap.add_argument(
        "--cache-mb",
        type=int,
        help="memory for prepared result files (default 512); longer ranges than fit read Parquet directly",
    )
    ap.add_argument("--log-level", help="uvicorn log level (default info)")
    ap.add_argument(
        "--live-bootstrap",
        help="Kafka to read the live topics from (lowwater.live.<query>); "
        "without it /live/{query} serves nothing",
    )
    ap.add_argument(
        "--interfaces",
        help="interfaces file: (exporter, ifIndex) -> name and speed (contract/interfaces.py); "
        "reloaded on SIGHUP",
    )
    ap.add_argument(
        "--kafka-security",
        metavar="JSON",
        help="the Kafka security block of the live reader (protocol, sasl_mechanism, username, password, "
        "ca_file, ...), as every role takes it; better: env LOWWATER_API_KAFKA_SECURITY; "
        "see deploy/SECURITY.md",
    )
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
        app = create_app(
            s.config,
            s.results,
            token,
            cache_mb=s.cache_mb,
            live_bootstrap=s.live_bootstrap,
            live_security=s.kafka_security,
            interfaces=s.interfaces,
        )
    except ConfigError as exc:
        raise SystemExit(f"lowwater-api: {exc}") from None
    uvicorn.run(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False)


if __name__ == "__main__":
    main()
