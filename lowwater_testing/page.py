"""The real API in a subprocess and the results page in a real headless Chromium (the page and live-page tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from local_stack.kafka_broker import free_port
from lowwater_testing.store import Store

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def serve_api(store: Store, token: str | None = None, *extra: str) -> tuple[subprocess.Popen, str]:
    """``lowwater-api`` over the store on a free port, once ``/health`` answers -> (process, base URL).
    ``extra``: more flags (``--live-bootstrap``...)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-c",
        "from high_level.serve.api import main; main()",
        "--config",
        str(store.config),
        "--results",
        str(store.root),
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOWWATER_API_TOKEN", None)
    if token:
        cmd += ["--token", token]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the API did not come up")
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def chromium(url: str, profile: Path, *extra: str, budget_ms: int = 5000) -> subprocess.CompletedProcess:
    """Headless Chromium on ``url`` (``--dump-dom``, ``--screenshot=...`` in ``extra``), the page's
    timers run for ``budget_ms`` of virtual time."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        f"--virtual-time-budget={budget_ms}",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
