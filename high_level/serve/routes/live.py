"""Live results (:mod:`contract.live`): the reader of the live topics, a query's newest values, and its
Server-Sent Events through an update queue (:mod:`high_level.live.hub`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from high_level.live.hub import MAX_SUBSCRIBERS
from high_level.live.hub import stream as live_stream_body
from high_level.serve.service import ApiService


def router(svc: ApiService) -> APIRouter:
    r = APIRouter()
    hub = svc.hub

    @r.get("/live", summary="Live results: the reader of the live topics and every live consumer's queue")
    def live_stats() -> dict[str, Any]:
        return {"enabled": svc.live_source is not None, **hub.stats()}

    @r.get(
        "/live/{name}/values", summary="The newest values (provisional or final) of a query's last windows"
    )
    def live_values(name: str) -> dict[str, Any]:
        svc.info(name)
        return {"query": name, "enabled": svc.live_source is not None, "values": hub.snapshot(name)}

    @r.get(
        "/live/{name}",
        summary="Server-Sent Events: a query's live values through an update queue",
        response_class=StreamingResponse,
    )
    async def live_stream(
        name: str,
        request: Request,
        policy: Annotated[Literal["fifo", "inplace", "linecutting"], Query()] = "inplace",
        rate: Annotated[float, Query(gt=0, le=10_000, description="updates per second")] = 50.0,
        max_s: Annotated[float | None, Query(gt=0, le=86_400, description="end after")] = None,
    ) -> StreamingResponse:
        svc.info(name)
        if svc.live_source is None:
            raise HTTPException(
                404, "live results are not enabled (lowwater-api --live-bootstrap, job --live)"
            )
        if len(hub.subs) >= MAX_SUBSCRIBERS:
            raise HTTPException(503, f"{MAX_SUBSCRIBERS} live consumers already")
        body = live_stream_body(hub, name, policy, rate, max_s, request.is_disconnected)
        return StreamingResponse(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return r
