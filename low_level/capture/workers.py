"""The supervisor of a capture host's worker processes (``lowwater-agent --workers N``).

Why processes and not threads: each worker runs a source thread and a Numba kernel loop with its own
ring, kernel and tables; separate processes share no GIL, no allocator and no Kafka client, and a
crash takes one worker only. The supervisor itself captures nothing: it starts the workers (the same
``lowwater-agent`` command line plus ``--worker I/N/GROUP --host-id H/wI``), forwards SIGTERM/SIGINT
(each worker then flushes its tables and punctuates, as a single agent does), serves the workers'
metrics on the agent's metrics port with a ``worker`` label, and watches them.

A worker that dies (non-zero exit, not asked to stop) is logged. With a live source (afpacket) it is
restarted, as a host restart (a new incarnation; its fanout share went to the other workers in the
meantime), at most ``MAX_RESTARTS`` times in ``RESTART_WINDOW_S``; then, or at once with a replayed
source (a replay restarted from the start would send its packets twice), the supervisor stops every
worker and exits 1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from low_level.capture.cpuquota import usable_cpus
from low_level.capture.fanout import fanout_group_base, parse_worker, worker_host_id

__all__ = ["Supervisor", "WorkersCollector", "default_workers", "parse_worker", "supervise", "worker_host_id"]

log = logging.getLogger("lowwater.workers")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
STOP_TIMEOUT_S = 30.0


def default_workers(source: str, cores: int | None = None) -> int:
    """Workers when ``--workers`` is not given: live capture uses half the usable CPUs (each worker runs
    a capture thread and a kernel loop; the rest is left to the kernel's softirq and Kafka), at most 16;
    a replay or the generator keeps one. Usable CPUs honour a container's CPU quota (cpuquota.py)."""
    if not source.startswith("afpacket"):
        return 1
    cores = cores or usable_cpus()
    return max(1, min(16, cores // 2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.metrics_port = 0
        self.restarts: list[float] = []
        self.done = False
        self.rc: int | None = None


class Supervisor:
    """Starts, watches and stops the ``count`` workers of capture host ``host``."""

    def __init__(
        self,
        argv: list[str],
        host: str,
        count: int,
        live: bool,
        metrics: bool,
        summary: str | None,
        group: int | None = None,
    ) -> None:
        self.argv, self.host, self.count, self.live = list(argv), host, count, live
        self.group = fanout_group_base(os.getpid()) if group is None else group
        self.metrics = metrics
        self.summary = summary
        self.tmp = Path(tempfile.mkdtemp(prefix="lowwater-workers-"))
        self.workers = [Worker(i) for i in range(count)]
        self.stopping = False
        self.failed: str | None = None

    def command(self, w: Worker) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "low_level.cli",
            *self.argv,
            "--workers",
            "1",
            "--worker",
            f"{w.index}/{self.count}/{self.group}",
            "--host-id",
            worker_host_id(self.host, w.index),
            "--metrics-port",
            str(w.metrics_port),
            "--summary",
            str(self.tmp / f"w{w.index}.json"),
        ]
        return cmd

    def spawn(self, w: Worker) -> None:
        if self.metrics:
            w.metrics_port = _free_port()
        w.proc = subprocess.Popen(self.command(w))
        log.info("worker %s started (pid %d)", worker_host_id(self.host, w.index), w.proc.pid)

    def stop(self, *_: object) -> None:
        """Ask every running worker to stop gracefully (SIGTERM): each flushes and punctuates."""
        self.stopping = True
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)

    def _on_exit(self, w: Worker, rc: int) -> None:
        name = worker_host_id(self.host, w.index)
        if rc == 0 or self.stopping:
            w.done, w.rc = True, rc
            return
        now = time.monotonic()
        w.restarts = [t for t in w.restarts if now - t < RESTART_WINDOW_S]
        if self.live and len(w.restarts) < MAX_RESTARTS:
            w.restarts.append(now)
            log.error(
                "worker %s died (exit %d): restarting it (%d in the last %.0f s)",
                name,
                rc,
                len(w.restarts),
                RESTART_WINDOW_S,
            )
            self.spawn(w)
            return
        w.done, w.rc = True, rc
        why = (
            "a replay cannot resume without sending packets twice" if not self.live else "restarted too often"
        )
        self.failed = f"worker {name} died (exit {rc}); {why}: stopping every worker"
        log.error("%s", self.failed)
        self.stop()

    def run(self) -> int:
        """Run until every worker has ended; 0 when all ended well, 1 when one failed."""
        for w in self.workers:
            self.spawn(w)
        deadline = None
        while not all(w.done for w in self.workers):
            if self.stopping and deadline is None:
                deadline = time.monotonic() + STOP_TIMEOUT_S
            for w in self.workers:
                if not w.done and w.proc is not None and (rc := w.proc.poll()) is not None:
                    self._on_exit(w, rc)
            if deadline is not None and time.monotonic() > deadline:
                for w in self.workers:
                    if w.proc is not None and w.proc.poll() is None:
                        log.error(
                            "worker %s did not stop in %.0f s: killed",
                            worker_host_id(self.host, w.index),
                            STOP_TIMEOUT_S,
                        )
                        w.proc.kill()
                deadline = float("inf")
            time.sleep(0.1)
        self.write_summary()
        bad = [w for w in self.workers if w.rc not in (0, None)]
        return 1 if self.failed or (bad and not self.stopping) else 0

    def write_summary(self) -> None:
        if not self.summary:
            return
        per = {}
        for w in self.workers:
            f = self.tmp / f"w{w.index}.json"
            per[worker_host_id(self.host, w.index)] = json.loads(f.read_text()) if f.exists() else None
        got = [s for s in per.values() if s]
        total = {
            k: sum(int(s.get(k, 0)) for s in got)
            for k in ("packets", "parse_errors", "ring_drops", "backlog_lost")
        }
        Path(self.summary).write_text(
            json.dumps(
                {
                    "host": self.host,
                    "workers": per,
                    **total,
                    "restarts": {worker_host_id(self.host, w.index): len(w.restarts) for w in self.workers},
                    "failed": self.failed,
                },
                indent=1,
            )
        )


class WorkersCollector:
    """The workers' own ``/metrics``, fetched at scrape time, relabelled ``host=H, worker=wI``, merged by name."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
        from prometheus_client.parser import text_string_to_metric_families

        fams: dict[str, Metric] = {}
        alive = GaugeMetricFamily(
            "lowwater_agent_worker_up", "1 while the worker process runs", labels=["host", "worker"]
        )
        restarts = CounterMetricFamily(
            "lowwater_agent_worker_restarts",
            "Worker processes restarted after dying",
            labels=["host", "worker"],
        )
        for w in self.sup.workers:
            label = f"w{w.index}"
            up = w.proc is not None and w.proc.poll() is None
            alive.add_metric([self.sup.host, label], 1.0 if up else 0.0)
            restarts.add_metric([self.sup.host, label], len(w.restarts))
            if not up or not w.metrics_port:
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue  # starting (compiling) or stopping: its series are absent this scrape
            for fam in text_string_to_metric_families(text):
                if not fam.name.startswith("lowwater_agent_"):
                    continue  # the worker's process/GC collectors: per process, not per capture host
                m = fams.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
                for s in fam.samples:
                    labels = dict(s.labels)
                    if "host" in labels:
                        labels["host"] = self.sup.host
                    labels["worker"] = label
                    m.add_sample(s.name, labels, s.value)
        yield alive
        yield restarts
        yield from fams.values()


def supervise(
    argv: list[str], host: str, count: int, source: str, metrics_port: int, summary: str | None
) -> int:
    """Run ``count`` workers of ``host`` until they end; the exit code of the agent."""
    sup = Supervisor(
        argv, host, count, live=source.startswith("afpacket"), metrics=bool(metrics_port), summary=summary
    )
    if metrics_port:
        from prometheus_client import REGISTRY, start_http_server

        REGISTRY.register(WorkersCollector(sup))
        start_http_server(metrics_port)
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    log.info("host %s: %d workers (fanout group %d)", host, count, sup.group)
    return sup.run()
