"""``/status``: the job's status document (:mod:`contract.status`), validated, plus its freshness.

Nothing is derived or guessed here: the job computes every per-partition, per-query and per-host
figure once and writes them in the contract's shape. A document that does not validate is reported
as unavailable with the reason (and the page says so), never half-read.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contract import results as R
from contract import status as S

STALE_AFTER_S = 60.0


def read_status(results_dir: Path, now_s: float | None = None) -> dict[str, Any]:
    """The API's /status body: availability, freshness and the validated document's fields."""
    now_s = time.time() if now_s is None else now_s
    try:  # the job replaces the file atomically (write + rename): a read sees one whole document
        doc: S.StatusDocument | None = S.read(R.status_path(results_dir))
        error = None
    except S.StatusUnavailable as exc:
        doc, error = None, str(exc)
    if doc is None:
        return {"available": False, "error": error, "updated_at": None, "age_s": None, "stale": True}
    age = max(0.0, now_s - doc.updated_ms / 1e3)
    return {
        "available": True,
        "error": None,
        "updated_at": datetime.fromtimestamp(doc.updated_ms / 1e3, UTC).isoformat().replace("+00:00", "Z"),
        "age_s": age,
        "stale": age > STALE_AFTER_S,
        **doc.model_dump(mode="json"),
    }
