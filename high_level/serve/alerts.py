"""``/alerts``: the alerts the job fired, read from the alert store (:mod:`contract.results`).

Each file is validated against :data:`contract.results.ALERT_SCHEMA` (a file that does not follow it
is skipped and counted, never cast) and cached by (name, size, mtime): alert files are written once
per micro-batch that fired something, and only a replay rewrites one. ``delivered`` comes from the
job's delivery ledger, so the page shows what the webhook has not accepted yet.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R
from high_level.serve.timefmt import iso_of_us, us_of

log = logging.getLogger("lowwater.api")


class AlertReader:
    """Reads and caches the alert files of one results directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple[int, int], pa.Table]] = {}
        self.rejected: dict[str, str] = {}

    def _table(self) -> pa.Table:
        files = R.alert_files(self.root)
        names = [f"{f.parent.name}/{f.name}" for f in files]
        tables = []
        with self._lock:
            for name, path in zip(names, files, strict=True):
                try:
                    st = path.stat()
                    sig = (st.st_size, st.st_mtime_ns)
                    hit = self._files.get(name)
                    if hit is None or hit[0] != sig:
                        t = pq.read_table(path)
                        R.check_alert_schema(t.schema, str(path))
                        self._files[name] = hit = (sig, t)
                        self.rejected.pop(name, None)
                    tables.append(hit[1])
                except (OSError, pa.ArrowException, R.ResultsLayoutError) as exc:
                    if name not in self.rejected:
                        log.warning("alert file %s skipped: %s", path, exc)
                    self.rejected[name] = str(exc)
            for gone in set(self._files) - set(names):
                del self._files[gone]
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

    def alerts(self, query: str | None, alert: str | None, since_us: int | None, limit: int) -> dict[str, Any]:
        """The newest ``limit`` alerts (by close time, then window), optionally of one query / rule,
        closed at or after ``since_us``."""
        rows = self._table().to_pylist()
        delivered = self._delivered()
        sel = [r for r in rows if (query is None or r["query"] == query) and (alert is None or r["alert"] == alert)
               and (since_us is None or us_of(r["closed_at"]) >= since_us)]  # fmt: skip
        sel.sort(key=lambda r: (r["closed_at"], r["window_start"], r["id"]), reverse=True)
        out = []
        for r in sel[:limit]:
            out.append({
                "id": r["id"], "query": r["query"], "alert": r["alert"], "severity": r["severity"],
                "window_start": iso_of_us(us_of(r["window_start"])),
                "window_end": iso_of_us(us_of(r["window_end"])),
                "closed_at": iso_of_us(us_of(r["closed_at"])),
                "group": json.loads(r["group"]), "values": json.loads(r["values"]),
                "labels": json.loads(r["labels"]), "summary": r["summary"], "delivered": r["id"] in delivered,
            })  # fmt: skip
        return {"total": len(sel), "returned": len(out), "alerts": out, "rejected_files": len(self.rejected)}
