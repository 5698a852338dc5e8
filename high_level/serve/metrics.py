"""Prometheus metrics of the API itself, served at ``/metrics`` of the API.

``lowwater_api_requests_total{method,route,status}`` and
``lowwater_api_request_duration_seconds{route}`` (histogram). ``route`` is the route template
(``/queries/{name}/results``), never the raw path, so label cardinality stays bounded whatever
clients request; paths that match no route are counted as ``<unmatched>``.

Each app gets its own registry so several apps in one process (tests) do not collide. When the API
has a token, ``/metrics`` needs it too (configure Prometheus with ``authorization: {credentials: ...}``).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "<unmatched>"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """The API's metric families on a private registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "lowwater_api_requests",
            "HTTP requests handled by the lowwater API",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "lowwater_api_request_duration_seconds",
            "Time to handle a request of the lowwater API",
            ["route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _route_of(app: Any, scope: Scope) -> str:
    route = scope.get("route")
    if route is not None and hasattr(route, "path"):
        return str(route.path)
    for r in getattr(app, "routes", ()):  # e.g. a 401/404 raised before routing recorded the route
        try:
            match, _ = r.matches(scope)
        except Exception:  # a route that cannot match is simply not this one
            continue
        if match == Match.FULL:
            return str(r.path)
    return UNMATCHED


class MetricsMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware overhead) that counts and times every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, router_app: Any = None) -> None:
        self.app = app
        self.metrics = metrics
        self.router_app = router_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = _route_of(self.router_app, scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(method if method in _METHODS else "other", route, str(status)).inc()
            self.metrics.duration.labels(route).observe(time.perf_counter() - t0)


class LiveCollector:
    """The live results' update queues as Prometheus series, read from the hub at each scrape.

    Per consumer (at most ``hub.MAX_SUBSCRIBERS``, so the labels stay bounded): staleness now and averaged
    over the stream as the UpStream seed defines them, load factor, queued cells, and the counters of what
    the policy did (delivered, overwritten, superseded, dropped, windows skipped whole). Hub totals:
    updates received, ignored (not newer), rejected (did not validate).
    """

    _GAUGES = (
        ("staleness_now_s", "staleness_seconds", "mean staleness of the keys queued now"),
        ("staleness_max_now_s", "staleness_max_seconds", "largest staleness of a key queued now"),
        ("staleness_avg_s", "staleness_stream_avg_seconds", "time-averaged staleness of the stream"),
        ("load_factor", "load_factor", "offered updates per service time"),
        ("queued", "queued", "updates held in the queue"),
    )
    _COUNTERS = (
        ("offered", "offered"),
        ("delivered", "delivered"),
        ("overwrites", "overwrites"),
        ("superseded", "superseded"),
        ("dropped", "dropped"),
        ("skipped_windows", "skipped_windows"),
    )

    def __init__(self, hub: Any) -> None:
        self.hub = hub

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.hub.stats(read=False)  # a scrape decodes nothing (LiveHub.stats)
        for k in ("received", "ignored", "rejected", "coalesced"):  # coalesced: replaced before it was read
            yield CounterMetricFamily(
                f"lowwater_api_live_updates_{k}", f"live updates {k} by the API's hub", value=st[k]
            )
        labels = ["consumer", "query", "policy"]
        cons = st["consumers"]
        yield GaugeMetricFamily("lowwater_api_live_consumers", "live consumers connected", value=len(cons))
        yield GaugeMetricFamily(
            "lowwater_api_live_unread_values",
            "live values waiting unread (no consumer asked)",
            value=st["unread"],
        )
        for key, name, doc in self._GAUGES:
            g = GaugeMetricFamily(f"lowwater_api_live_{name}", f"live consumer: {doc}", labels=labels)
            for c in cons:
                g.add_metric([str(c["id"]), c["query"], c["policy"]], float(c[key]))
            yield g
        for key, name in self._COUNTERS:
            m = CounterMetricFamily(
                f"lowwater_api_live_{name}", f"live consumer: updates {name}", labels=labels
            )
            for c in cons:
                m.add_metric([str(c["id"]), c["query"], c["policy"]], float(c[key]))
            yield m
