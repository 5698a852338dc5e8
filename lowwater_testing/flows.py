"""Flow-export fixtures: a pcap whose 5-tuples repeat, softflowd's export of it as received datagrams,
NetFlow v9 datagrams built by hand (header, template and data sets, records of ``FIELDS``), and the
send/collect loop every end-to-end flow test shares (:func:`flow_agent`, :func:`partials_counts`)."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import dpkt

from contract import query as Q
from contract import wire
from lowwater_testing.agent import REPO, agent_cmd
from lowwater_testing.queries import config, query, spec
from lowwater_testing.topics import read_all
from lowwater_testing.traffic import NS, T0, build_frames, make_traffic


def flow_pcap(path: Path, n: int, seed: int, t0_ns: int = T0, span_ns: int = 12 * NS) -> None:
    """A microsecond pcap of n packets in [t0, t0 + span) whose 5-tuples repeat: flows of many packets."""
    t = make_traffic(n, 120, t0_ns, span_ns, seed=seed)
    t.sport = 1024 + t.sport % 6
    t.ts = (t.ts // 1000) * 1000
    frames, cap, wl, ts = build_frames(t)
    with path.open("wb") as fh:
        w = dpkt.pcap.Writer(fh)
        for i in range(n):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / NS)


def nfdump_records(fmt: str, *source: str) -> list[list[str]]:
    """nfdump's listing (``-q -N -o fmt:...`` in UTC) of nfcapd files (``-r FILE`` / ``-R DIR``): the
    comma-separated fields of each record."""
    out = subprocess.run(
        ["nfdump", "-q", "-N", "-o", f"fmt:{fmt}", *source],
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": "UTC"},
        check=True,
    ).stdout
    return [[x.strip() for x in line.split(",")] for line in out.splitlines()]


def nfdump_ms(te: str) -> int:
    """An nfdump time (``%te``, UTC) in ms since the epoch; 0 for nfdump's "no time" (1970)."""
    t = datetime.datetime.strptime(te, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.UTC)
    return 0 if t.year < 1980 else int(t.timestamp() * 1000 + 0.5)


def softflowd_export(pcap: Path, version: str, tmp: Path) -> list[bytes]:
    """softflowd's export of the pcap, every datagram as received (big socket buffer, nothing lost)."""
    rx = udp_receiver()
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
    out = drain(rx)
    assert out, proc.stderr
    return out, sent


def udp_receiver() -> socket.socket:
    """A loopback UDP socket with a big buffer (an exporter's burst is not lost) and a 5-s quiet timeout."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    return rx


def drain(rx: socket.socket) -> list[bytes]:
    """Every datagram ``rx`` receives until it stays quiet for its timeout; closes it."""
    out = []
    try:
        while True:
            out.append(rx.recv(65535))
    except TimeoutError:
        pass
    finally:
        rx.close()
    return out


def send_datagrams(datagrams: list[bytes], port: int, gap_s: float = 0.0, source: str | None = None) -> None:
    """Send each datagram to 127.0.0.1:``port``, ``gap_s`` apart, from ``source`` (an exporter's address)
    when given."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if source is not None:
        tx.bind((source, 0))
    for x in datagrams:
        tx.sendto(x, ("127.0.0.1", port))
        if gap_s:
            time.sleep(gap_s)
    tx.close()


def free_udp_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def udp_backlog(port: int) -> int | None:
    """Bytes waiting unread in the receive queues of this namespace's UDP sockets bound to local ``port``
    (/proc/net/udp, udp6), or None while no socket is bound to it."""
    total = None
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port:
                    total = (total or 0) + int(cols[4].split(":")[1], 16)
    return total


def wait_udp(port: int, read: bool = True, timeout: float = 60.0) -> None:
    """Wait until a socket is bound to ``port`` (a peer without a ready line is listening) and, with
    ``read``, until it has read every datagram sent to it (so a stop loses none of them)."""
    deadline = time.monotonic() + timeout
    while (left := udp_backlog(port)) is None or (read and left > 0):
        assert time.monotonic() < deadline, (
            f"UDP port {port}: {'not bound' if left is None else left} bytes unread"
        )
        time.sleep(0.02)


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


def write_flow_config(
    path: Path, name: str, group_by: list[str], window: str, topic: str, partitions: int
) -> None:
    """The end-to-end flow tests' query file: packets and bytes per ``group_by``, a 256-slot table."""
    config(
        query(
            name,
            group_by=group_by,
            aggregates=PAIRS_AGGREGATES,
            window=window,
            table=256,
            topic=topic,
            partitions=partitions,
        )
    ).write(path)


@dataclass
class RunningAgent:
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def log_tail(self) -> str:
        return "".join(self.lines)[-3000:]


@contextmanager
def flow_agent(
    cfg: Path, source: str, bootstrap: str, *, host: str = "router-1", summary: Path | None = None
) -> Iterator[RunningAgent]:
    """``lowwater-agent --source flows:...`` running, ready (it said which source it runs), its log read on
    (a full pipe would block it); stopped with SIGTERM on leaving. The test asserts ``returncode == 0``."""
    extra = ("--summary", str(summary)) if summary is not None else ()
    proc = subprocess.Popen(
        agent_cmd(cfg, source, host=host, bootstrap=bootstrap, extra=extra),
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    run = RunningAgent(proc)
    reader = None
    try:
        for line in proc.stderr:
            run.lines.append(line)
            if "queries, source" in line:
                break
        reader = threading.Thread(target=lambda: run.lines.extend(proc.stderr), daemon=True)
        reader.start()
        if (port := _flows_port(source)) is not None:
            wait_udp(port, read=False)  # bound: nothing sent from here on is refused
        yield run
    finally:
        if proc.poll() is None and (port := _flows_port(source)) is not None:
            wait_udp(port)  # a stop closes the socket: every datagram sent must have been read by then
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if reader is not None:
            reader.join(10)


def _flows_port(source: str) -> int | None:
    """The UDP port of a ``flows:ADDR:PORT[,opt=...]`` source, None for another one."""
    kind, _, rest = source.partition(":")
    return int(rest.split(",", 1)[0].rsplit(":", 1)[1]) if kind == "flows" else None


def partials_counts(
    bootstrap: str, topic: str, partitions: int, key_cols: tuple[int, int]
) -> tuple[Counter, dict[int, int]]:
    """Packets and bytes per (pane, key[a], key[b]) summed over every Partials batch in the topic, and the
    last mark per partition."""
    a, b = key_cols
    got: Counter = Counter()
    marks = {}
    for part, batch in read_all(bootstrap, topic, partitions):
        if isinstance(batch, wire.Partials):
            for p, k, s in zip(batch.pane, batch.key, batch.state, strict=True):
                got[(int(p), int(k[a]), int(k[b]), "packets")] += int(s[0])
                got[(int(p), int(k[a]), int(k[b]), "bytes")] += int(s[1])
        else:
            marks[part] = batch.mark_pane
    return got, marks


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
