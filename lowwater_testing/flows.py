"""Flow-export fixtures: a pcap whose 5-tuples repeat, softflowd's export of it as received datagrams, and
NetFlow v9 datagrams built by hand (header, template and data sets, records of ``FIELDS``)."""

from __future__ import annotations

import socket
import subprocess
from decimal import Decimal
from pathlib import Path

import dpkt

from contract import query as Q
from lowwater_testing.queries import spec
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
    args = [
        "softflowd",
        "-r",
        str(pcap),
        "-n",
        f"127.0.0.1:{rx.getsockname()[1]}",
        "-v",
        version,
        "-d",
        "-a",
        "-c",
        "none",
        "-p",
        str(tmp / f"softflowd{version}.pid"),
    ]
    if version == "10":
        args += ["-A", "milli"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    sent = (
        int(proc.stderr.split("Flows exported: ")[1].split(" ")[0])
        if "Flows exported" in proc.stderr
        else None
    )
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


PAIRS_AGGREGATES = ["count as packets", "sum(length) as bytes"]


def flow_query(size: int = 256, m: int = 2) -> Q.QuerySpec:
    return spec(
        "pairs",
        group_by=["src_ip", "dst_ip"],
        aggregates=PAIRS_AGGREGATES,
        window="2s",
        table=size,
        flush={"policy": "lazy", "m": m},
    )


def v9(domain: int, sets: list[bytes], clock_s: int = 1_700_000_010, uptime_ms: int = 10_000) -> bytes:
    body = b"".join(sets)
    return (
        (9).to_bytes(2, "big")
        + b"\x00\x01"
        + uptime_ms.to_bytes(4, "big")
        + clock_s.to_bytes(4, "big")
        + b"\x00\x00\x00\x01"
        + domain.to_bytes(4, "big")
        + body
    )


def flowset(sid: int, payload: bytes) -> bytes:
    pad = (-len(payload)) % 4
    return sid.to_bytes(2, "big") + (len(payload) + 4 + pad).to_bytes(2, "big") + payload + b"\x00" * pad


def template(tid: int, fields: list[tuple[int, int]]) -> bytes:
    return flowset(
        0,
        tid.to_bytes(2, "big")
        + len(fields).to_bytes(2, "big")
        + b"".join(i.to_bytes(2, "big") + n.to_bytes(2, "big") for i, n in fields),
    )


FIELDS = [(8, 4), (12, 4), (2, 4), (1, 4), (21, 4), (4, 1)]


def flow_record(src: int, dst: int, pkts: int, octets: int, last_ms: int, proto: int = 6) -> bytes:
    return (
        src.to_bytes(4, "big")
        + dst.to_bytes(4, "big")
        + pkts.to_bytes(4, "big")
        + octets.to_bytes(4, "big")
        + last_ms.to_bytes(4, "big")
        + bytes([proto])
    )
