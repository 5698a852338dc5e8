"""``/alerts``: the alerts the job fired, read from the alert store (:mod:`contract.results`).

Each file is validated against :data:`contract.results.ALERT_SCHEMA` (a file that does not follow it
is skipped and counted, never cast) and cached by (name, size, mtime): alert files are written once
per micro-batch that fired something, and only a replay rewrites one. ``delivered`` comes from the
job's delivery ledger, so the page shows what the webhook has not accepted yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from contract import results as R
from high_level.serve.sidecar import SidecarReader
from high_level.serve.timefmt import iso_of_us, us_of


class AlertReader(SidecarReader):
    """Reads and caches the alert files of one results directory."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root, R.check_alert_schema, "alert")

    def _table(self) -> pa.Table:
        files = [(f"{f.parent.name}/{f.name}", f) for f in R.alert_files(self.root)]
        tables = self._files.read(files, complete=True)
        return pa.concat_tables(tables) if tables else R.ALERT_SCHEMA.empty_table()

    def _delivered(self) -> set[str]:
        out: set[str] = set()
        try:
            lines = R.delivered_path(self.root).read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                out.update(json.loads(line)["ids"])
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def alerts(
        self, query: str | None, alert: str | None, since_us: int | None, limit: int
    ) -> dict[str, Any]:
        """The newest ``limit`` alerts (by close time, then window), optionally of one query / rule,
        closed at or after ``since_us``."""
        rows = self._table().to_pylist()
        delivered = self._delivered()
        sel = [
            r
            for r in rows
            if (query is None or r["query"] == query)
            and (alert is None or r["alert"] == alert)
            and (since_us is None or us_of(r["closed_at"]) >= since_us)
        ]
        sel.sort(key=lambda r: (r["closed_at"], r["window_start"], r["id"]), reverse=True)
        out = []
        for r in sel[:limit]:
            out.append(
                {
                    "id": r["id"],
                    "query": r["query"],
                    "alert": r["alert"],
                    "severity": r["severity"],
                    "window_start": iso_of_us(us_of(r["window_start"])),
                    "window_end": iso_of_us(us_of(r["window_end"])),
                    "closed_at": iso_of_us(us_of(r["closed_at"])),
                    "group": json.loads(r["group"]),
                    "values": json.loads(r["values"]),
                    "labels": json.loads(r["labels"]),
                    "summary": r["summary"],
                    "delivered": r["id"] in delivered,
                }
            )
        return {"total": len(sel), "returned": len(out), "alerts": out, "rejected_files": len(self.rejected)}
