"""The capture agent as a real process: the launcher, a pcap to replay and an independent dpkt count of it."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import urllib.request
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import dpkt
import numpy as np

from contract import fields as F
from local_stack.kafka_broker import free_port
from lowwater_testing.traffic import NS, T0, Traffic, build_frames, make_traffic

REPO = Path(__file__).resolve().parents[1]


def agent_cmd(
    cfg: str | Path,
    source: str,
    *,
    host: str | None = "cap-1",
    bootstrap: str | None = None,
    metrics_port: int = 0,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``lowwater-agent`` (as ``python -m low_level.cli``) with the flags every test passes."""
    cmd = [sys.executable, "-m", "low_level.cli", "--config", str(cfg), "--source", source]
    if host is not None:
        cmd += ["--host-id", host]
    if bootstrap is not None:
        cmd += ["--bootstrap", bootstrap]
    return [*cmd, "--metrics-port", str(metrics_port), *extra]


def spawn_agent(
    cfg: str | Path, source: str, *, text: bool = True, new_session: bool = False, **flags
) -> subprocess.Popen:
    """The agent as a running process, run from the repository, its stdout and stderr in one pipe (``text``
    or bytes); ``new_session`` puts it in a process group of its own. ``flags`` as for :func:`agent_cmd`."""
    return subprocess.Popen(
        agent_cmd(cfg, source, **flags),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=text,
        start_new_session=new_session,
    )


def spawn_workers(
    cfg: str | Path, source: str, host: str, bootstrap: str, workers: int, summary: Path
) -> tuple[subprocess.Popen, int]:
    """A live agent of ``workers`` capture workers on a free metrics port: ``(process, port)``; its
    summary (per worker) goes to ``summary`` at exit."""
    port = free_port()
    extra = ("--workers", str(workers), "--summary", str(summary))
    return spawn_agent(cfg, source, host=host, bootstrap=bootstrap, metrics_port=port, extra=extra), port


def metrics_text(port: int, timeout: float = 5) -> str:
    """The agent's Prometheus text on ``port`` (``--metrics-port``); "" while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return ""


def run_agent(
    cfg: str | Path, source: str, *, check: bool = True, timeout: float = 300, **flags
) -> subprocess.CompletedProcess:
    """Run the agent to its end (a pcap, a counted generator); with ``check``, assert it exited 0 and show
    the tail of its stderr if not. ``flags`` as for :func:`agent_cmd`."""
    proc = subprocess.run(
        agent_cmd(cfg, source, **flags), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def write_pcap(path: Path, n: int, groups: int, span_s: int, seed: int) -> None:
    t = make_traffic(n, groups, T0, span_s * NS, seed=seed)
    frames, cap, wl, ts = build_frames(t)
    with path.open("wb") as fh:
        w = dpkt.pcap.Writer(fh, nano=True)
        for i in range(n):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / 1_000_000_000)


def dpkt_oracle(path: Path, pane_ns: int) -> Counter:
    """Packets per (pane, src, dst) computed by dpkt from the file: independent of our parser."""
    out: Counter = Counter()
    with path.open("rb") as fh:
        for ts, buf in dpkt.pcap.Reader(fh):
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
            ts_ns = int(Decimal(ts) * 1_000_000_000)  # the nanosecond reader gives exact Decimals
            src = F.ip_to_words(socket.inet_ntoa(ip.src))[1]
            dst = F.ip_to_words(socket.inet_ntoa(ip.dst))[1]
            out[(ts_ns // pane_ns, src, dst)] += 1
    return out


def write_traffic_pcap(path: Path, t) -> None:
    """A nanosecond pcap of the traffic's frames (first bytes only, with their wire lengths)."""
    frames, cap, wl, ts = build_frames(t)
    cap = np.minimum(cap, wl)
    out = [struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)]
    for i in range(len(ts)):
        out.append(
            struct.pack("<IIII", ts[i] // NS, ts[i] % NS, cap[i], wl[i]) + frames[i][: cap[i]].tobytes()
        )
    path.write_bytes(b"".join(out))


def traffic_pcap(path: Path, *args: Any, **kw: Any) -> tuple[Traffic, Path]:
    """:func:`make_traffic` (the same arguments) written as the pcap ``path``: ``(traffic, path)``, the
    oracle's input and the agent's."""
    t = make_traffic(*args, **kw)
    write_traffic_pcap(path, t)
    return t, path
