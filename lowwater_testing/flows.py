"""Flow-export fixtures: a pcap whose 5-tuples repeat, and softflowd's export of it as received datagrams."""

from __future__ import annotations

import socket
import subprocess
from decimal import Decimal
from pathlib import Path

import dpkt

from lowwater_testing.traffic import NS, T0, build_frames, make_traffic


def flow_pcap(path: Path, n: int, seed: int) -> None:
    """A microsecond pcap of n packets over 12 s whose 5-tuples repeat: flows of many packets."""
    t = make_traffic(n, 120, T0, 12 * NS, seed=seed)
    t.sport = 1024 + t.sport % 6
    t.ts = (t.ts // 1000) * 1000
    frames, cap, wl, ts = build_frames(t)
    with path.open("wb") as fh:
        w = dpkt.pcap.Writer(fh)
        for i in range(n):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / NS)


def softflowd_export(pcap: Path, version: str, tmp: Path) -> list[bytes]:
    """softflowd's export of the pcap, every datagram as received (big socket buffer, nothing lost)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    args = ["softflowd", "-r", str(pcap), "-n", f"127.0.0.1:{rx.getsockname()[1]}", "-v", version, "-d", "-a",
            "-c", "none", "-p", str(tmp / f"softflowd{version}.pid")]
    if version == "10":
        args += ["-A", "milli"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    sent = int(proc.stderr.split("Flows exported: ")[1].split(" ")[0]) if "Flows exported" in proc.stderr else None
    out = []
    try:
        while True:
            out.append(rx.recv(65535))
    except TimeoutError:
        pass
    finally:
        rx.close()
    assert out, proc.stderr
    return out, sent
