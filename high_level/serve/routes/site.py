"""Open routes (no token): liveness and the results page's static shell, which holds no data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from high_level.serve.service import ApiService

STATIC = Path(__file__).resolve().parent.parent / "static"


def router(svc: ApiService) -> APIRouter:
    r = APIRouter()

    @r.get("/health", summary="Liveness (no auth)")
    def health() -> dict[str, Any]:
        results, reader = svc.results, svc.reader
        return {
            "status": "ok",
            "queries": len(svc.infos),
            "results_dir": str(results),
            "results_dir_exists": results.is_dir(),
            "cache": {"warmed": svc.warmed.is_set(), "bytes": reader.cache.nbytes},
            "rejected_files": {"total": reader.index.rejections, "current": len(reader.index.rejected())},
            "rejected_flagged_window_files": len(svc.flagged.rejected),
            "rejected_row_window_files": svc.rows.rejected_count,
        }

    @r.get("/", include_in_schema=False)
    @r.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @r.get("/ui/{asset}", include_in_schema=False)
    def asset(asset: str) -> FileResponse:
        files = {p.name: p for p in STATIC.iterdir() if p.is_file()}
        if asset not in files:
            raise HTTPException(404, f"no asset {asset!r}")
        return FileResponse(files[asset], headers={"Cache-Control": "no-cache"})

    return r
