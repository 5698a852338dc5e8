"""The operator's routes besides the results: the job's status, fired alerts, the API's own metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from high_level.serve import params as P
from high_level.serve.service import ApiService
from high_level.serve.status import read_status
from high_level.serve.timefmt import us_of


def status_router(svc: ApiService) -> APIRouter:
    r = APIRouter()

    @r.get("/status", summary="Capture hosts, low-water marks, lag, late counts, open windows")
    def status() -> dict[str, Any]:
        # the job's document, plus what only the API knows: its live consumers' queues (UpStream staleness)
        st = svc.hub.stats(read=False)  # polled: decodes nothing (LiveHub.stats)
        live = {
            "enabled": svc.live_source is not None,
            "received": st["received"],
            "consumers": [
                {
                    k: c[k]
                    for k in (
                        "id",
                        "query",
                        "policy",
                        "load_factor",
                        "staleness_now_s",
                        "staleness_avg_s",
                        "overwrites",
                        "skipped_windows",
                        "delivered",
                    )
                }
                for c in st["consumers"]
            ],
        }
        return {**read_status(svc.results), "live": live}

    return r


def alerts_router(svc: ApiService) -> APIRouter:
    r = APIRouter()

    @r.get("/alerts", summary="Alerts fired on closed windows, newest first")
    def alerts(
        query: Annotated[str | None, Query(max_length=64, description="only this query")] = None,
        alert: Annotated[str | None, Query(max_length=64, description="only this alert rule")] = None,
        start: Annotated[
            str | None, Query(max_length=64, description="closed at or after (as /results' start)")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        if query is not None:
            svc.info(query)
        since = us_of(P.parse_time("start", start, svc.now())) if start is not None else None
        return svc.alert_reader.alerts(query, alert, since, limit)

    return r


def metrics_router(svc: ApiService) -> APIRouter:
    r = APIRouter()

    @r.get("/metrics", summary="Prometheus metrics of the API", response_class=Response)
    def metrics_() -> Response:
        data, ctype = svc.metrics.render()
        return Response(data, media_type=ctype)

    return r
