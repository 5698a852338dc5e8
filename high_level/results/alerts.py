"""Alert delivery: fired alerts to an Alertmanager-compatible webhook, off the micro-batch path.

The job writes fired alerts durably first (``<results>/_alerts/query=<q>/part-<batch>.parquet``, see
:mod:`contract.results`); this module only delivers them. Why a thread with a bounded queue: a
webhook that is down or slow must never block or slow a micro-batch, so the sink only does a
non-blocking ``put``; the thread posts, retries with exponential backoff, and appends the ids the
receiver accepted to the delivered ledger (``_alerts/_delivered.jsonl``). On start, and whenever the
queue overflowed, the thread re-reads the alert files and queues every id not in the ledger, so an
alert fires once per (query, rule, window, group) across job restarts and replays: at least once
to the receiver, exactly once unless the job dies between the receiver's 200 and the ledger append
(Alertmanager deduplicates by labels anyway).

Payload: Alertmanager v2 ``POST /api/v2/alerts``, a JSON list of ``{labels, annotations, startsAt,
endsAt, generatorURL}``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R
from high_level.metrics import JobMetrics

log = logging.getLogger("lowwater.alerts")


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def payload(row: dict[str, Any], generator_url: str, hold_s: float) -> dict[str, Any]:
    """One alert row (:data:`contract.results.ALERT_SCHEMA`, as a dict) -> one Alertmanager v2 alert.

    startsAt is the window's close; endsAt close + max(range, hold): the alert is an event about one
    closed window, so it resolves by itself instead of staying active forever.
    """
    closed: datetime = row["closed_at"]
    span = (row["window_end"] - row["window_start"]).total_seconds()
    ann = {
        "summary": row["summary"],
        "values": row["values"],
        "group": row["group"],
        "lowwater_id": row["id"],
    }
    return {
        "labels": json.loads(row["labels"]),
        "annotations": ann,
        "startsAt": _iso(closed),
        "endsAt": _iso(closed + timedelta(seconds=max(span, hold_s))),
        "generatorURL": f"{generator_url.rstrip('/')}#query={row['query']}",
    }


class AlertDelivery:
    """Background delivery of fired alerts with a bounded queue, backoff and a delivered ledger."""

    def __init__(
        self,
        root: str | Path,
        url: str,
        metrics: JobMetrics,
        *,
        timeout_s: float = 2.0,
        queue_size: int = 10_000,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        batch_size: int = 100,
        generator_url: str = "http://127.0.0.1:8080/ui",
        hold_s: float = 300.0,
    ) -> None:
        self.root = Path(root)
        self.url = url
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch_size = batch_size
        self.generator_url = generator_url
        self.hold_s = hold_s
        self.queue: deque[dict[str, Any]] = deque()
        self.queue_size = queue_size
        self.delivered: set[str] = set()
        self.queued: set[str] = set()
        self.rescan = True  # read the alert store once at start: alerts a previous run did not deliver
        self.failures = 0
        self.last_error = ""
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._load_ledger()

    # -- ledger -----------------------------------------------------------------------------------
    def _load_ledger(self) -> None:
        path = R.delivered_path(self.root)
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                self.delivered.update(json.loads(line)["ids"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: those alerts are simply delivered again

    def _append_ledger(self, ids: list[str]) -> None:
        path = R.delivered_path(self.root)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"at": _iso(datetime.now(UTC)), "ids": ids}, separators=(",", ":")) + "\n"
        with open(path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    # -- feeding (called by the sink: never blocks) -----------------------------------------------
    def submit(self, alerts: pa.Table) -> None:
        """Queue a batch's fired alerts; on overflow drop from the queue (they stay in the store and
        are re-read once the queue drains), never wait."""
        rows = alerts.to_pylist()
        with self._cv:
            for row in rows:
                if row["id"] in self.delivered or row["id"] in self.queued:
                    continue
                if len(self.queue) >= self.queue_size:
                    self.rescan = True
                    self.metrics.alerts_overflow.inc()
                    continue
                self.queue.append(row)
                self.queued.add(row["id"])
            self.metrics.alerts_pending.set(len(self.queue))
            self._cv.notify()

    def _scan_store(self) -> None:
        """Queue every stored alert that is neither delivered nor queued (start-up, after overflow)."""
        for f in R.alert_files(self.root):
            try:
                t = pq.read_table(f)
                R.check_alert_schema(t.schema, str(f))
            except (OSError, pa.ArrowException, R.ResultsLayoutError) as exc:
                log.warning("skipping alert file %s: %s", f, exc)
                continue
            self.submit(t)

    # -- the thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lowwater-alerts", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is queued (tests, shutdown)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._cv:
                if not self.queue and not self.rescan:
                    return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        delay = self.backoff_s
        while True:
            with self._cv:
                while not self._stop and not self.queue and not self.rescan:
                    self._cv.wait(1.0)
                if self._stop:
                    return
                # re-read the store only with room in the queue (a receiver that is down and a full
                # queue must not turn into a scan of every alert file per retry)
                rescan = self.rescan and len(self.queue) <= self.queue_size // 2
                if rescan:
                    self.rescan = False
            if rescan:
                self._scan_store()
                continue
            with self._cv:
                batch = [self.queue[i] for i in range(min(self.batch_size, len(self.queue)))]
            if self._post(batch):
                ids = [r["id"] for r in batch]
                try:
                    self._append_ledger(ids)
                except OSError as exc:  # the alerts went out; a lost ledger line means a re-send later
                    log.warning("cannot append to the delivered ledger: %s", exc)
                now = time.time()
                with self._cv:
                    for _ in batch:
                        self.queue.popleft()
                    self.delivered.update(ids)
                    self.queued.difference_update(ids)
                    self.metrics.alerts_pending.set(len(self.queue))
                for r in batch:
                    self.metrics.alerts_delivered.labels(r["query"], r["alert"]).inc()
                    self.metrics.alert_latency.observe(max(0.0, now - r["closed_at"].timestamp()))
                delay = self.backoff_s
            else:
                with self._cv:  # back off, but wake at once to stop
                    self._cv.wait_for(lambda: self._stop, delay)
                delay = min(self.max_backoff_s, delay * 2)

    def _post(self, batch: list[dict[str, Any]]) -> bool:
        body = json.dumps([payload(r, self.generator_url, self.hold_s) for r in batch]).encode()
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - http(s) only, checked in settings
                ok = 200 <= resp.status < 300
                if not ok:
                    self.last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            ok = False
            self.last_error = str(exc)
        if not ok:
            self.failures += 1
            self.metrics.alerts_failed.inc()
            log.warning(
                "alert webhook %s failed (%d alerts queued): %s", self.url, len(self.queue), self.last_error
            )
        return ok
