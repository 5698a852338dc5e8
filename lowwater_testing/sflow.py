"""sFlow v5 fixtures: datagrams built by hand (flow samples compact and expanded, counter samples), and the
pmacct peers: ``pmacctd`` with the ``sfprobe`` plugin exports sFlow from a pcap, ``sfacctd`` collects it."""

from __future__ import annotations

import csv
import datetime
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from lowwater_testing.flows import drain, free_udp_port, udp_receiver, wait_udp


def u32(*v: int) -> bytes:
    return b"".join(struct.pack("!I", x) for x in v)


def frame(src: int, dst: int, sport: int, dport: int, payload: int = 100, proto: int = 17) -> bytes:
    """An Ethernet/IPv4/UDP (or TCP) frame with explicit MACs, ``payload`` bytes after the L4 header."""
    l4 = (
        struct.pack("!HHHH", sport, dport, 8 + payload, 0)
        if proto == 17
        else struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 0x50, 0x12, 1024, 0, 0)
    ) + b"\0" * payload
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, 20 + len(l4), 1, 0, 64, proto, 0, src, dst)
    return bytes.fromhex("020000000002020000000001") + b"\x08\x00" + ip + l4


def header_record(fr: bytes, frame_length: int | None = None, snap: int = 128) -> bytes:
    """Flow record 0:1 (raw packet header, Ethernet): the first ``snap`` bytes of the frame."""
    h = fr[:snap]
    pad = b"\0" * ((-len(h)) % 4)
    body = u32(1, frame_length if frame_length is not None else len(fr) + 4, 4, len(h)) + h + pad
    return u32(1, len(body)) + body


def flow_sample(
    records: list[bytes], rate: int, in_if: int, out_if: int = 0, expanded: bool = False
) -> bytes:
    if expanded:
        body = u32(1, 0, in_if, rate, 1000, 0, 0, in_if, 0, out_if, len(records)) + b"".join(records)
        return u32(3, len(body)) + body
    body = u32(1, in_if, rate, 1000, 0, in_if, out_if, len(records)) + b"".join(records)
    return u32(1, len(body)) + body


def counter_sample(ifindex: int, in_octets: int, out_octets: int, expanded: bool = False) -> bytes:
    """Counter sample with a generic interface counters record (0:1, 88 bytes)."""
    gen = (
        u32(ifindex, 6)
        + struct.pack("!Q", 10_000_000_000)
        + u32(1, 3)
        + struct.pack("!Q", in_octets)
        + u32(100, 2, 1, 5, 7, 0)
        + struct.pack("!Q", out_octets)
        + u32(200, 0, 0, 3, 4, 0)
    )
    rec = u32(1, len(gen)) + gen
    body = (u32(1, 0, ifindex, 1) if expanded else u32(1, ifindex, 1)) + rec
    return u32(4 if expanded else 2, len(body)) + body


def datagram(samples: list[bytes], agent: str = "10.9.9.9", sub_agent: int = 0, seq: int = 1) -> bytes:
    """An sFlow v5 datagram from ``agent`` (IPv4 or IPv6)."""
    a = socket.inet_pton(socket.AF_INET6 if ":" in agent else socket.AF_INET, agent)
    return u32(5, 1 if len(a) == 4 else 2) + a + u32(sub_agent, seq, 10_000, len(samples)) + b"".join(samples)


def sfprobe_export(
    pcap: Path, tmp: Path, sampling_rate: int = 1, agent: str = "10.9.9.9", extra: str = ""
) -> list[bytes]:
    """pmacctd's sfprobe export of the pcap, every datagram as received (big socket buffer, nothing lost);
    ``extra``: more pmacctd.conf lines (e.g. a pre_tag_map and ``sfprobe_ifindex: tag``)."""
    rx = udp_receiver()
    conf = tmp / "pmacctd.conf"
    conf.write_text(
        "daemonize: false\n"
        f"pcap_savefile: {pcap}\n"
        "plugins: sfprobe\n"
        f"sfprobe_receiver: 127.0.0.1:{rx.getsockname()[1]}\n"
        f"sfprobe_agentip: {agent}\n"
        f"sampling_rate: {sampling_rate}\n" + extra
    )
    proc = subprocess.Popen(["pmacctd", "-f", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = drain(rx)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        log = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert out, log
    return out


class Sfacctd:
    """sfacctd collecting on a free loopback port, printing (src, dst, arrival second) -> packets, bytes."""

    def __init__(self, tmp: Path, renormalize: bool = True, aggregate: str = "src_host, dst_host") -> None:
        self.port = free_udp_port()
        self.csv = tmp / "sfacctd.csv"
        conf = tmp / "sfacctd.conf"
        conf.write_text(
            "daemonize: false\n"
            "sfacctd_ip: 127.0.0.1\n"
            f"sfacctd_port: {self.port}\n"
            f"sfacctd_renormalize: {'true' if renormalize else 'false'}\n"
            "plugins: print\n"
            f"aggregate: {aggregate}, timestamp_arrival\n"
            "timestamps_secs: true\n"
            "print_output: csv\n"
            f"print_output_file: {self.csv}\n"
            "print_output_file_append: true\n"
            "print_refresh_time: 1\n"
            "sfacctd_pipe_size: 16777216\n"
        )
        self.proc = subprocess.Popen(
            ["sfacctd", "-f", str(conf)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TZ": "UTC"},
        )
        wait_udp(self.port, read=False)  # no ready line: listening once its socket is bound

    def stop(self) -> str:
        """Stop it once it has read every datagram sent (SIGINT flushes its cache to the file); its log."""
        if self.proc.poll() is None:
            wait_udp(self.port)
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.communicate(timeout=30)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.communicate()[0].decode(errors="replace")

    def records(self) -> list[dict[str, str | int]]:
        """Every printed row as a dict of its CSV columns, TIMESTAMP_ARRIVAL as seconds since the epoch."""
        out: list[dict[str, str | int]] = []
        if not self.csv.exists():
            return out
        with self.csv.open() as fh:
            for r in csv.DictReader(fh):
                if r.get("TIMESTAMP_ARRIVAL") in (None, "TIMESTAMP_ARRIVAL"):
                    continue
                t = datetime.datetime.strptime(r["TIMESTAMP_ARRIVAL"], "%Y-%m-%d %H:%M:%S.%f")
                out.append({**r, "TIMESTAMP_ARRIVAL": int(t.replace(tzinfo=datetime.UTC).timestamp())})
        return out

    def rows(self) -> list[tuple[str, str, int, int, int]]:
        """(src, dst, arrival second since the epoch, packets, bytes) as printed."""
        return [
            (r["SRC_IP"], r["DST_IP"], r["TIMESTAMP_ARRIVAL"], int(r["PACKETS"]), int(r["BYTES"]))
            for r in self.records()
        ]


def send_in_bursts(datagrams: list[bytes], ports: list[int], window_s: float, bursts: int = 2) -> list[int]:
    """Send the datagrams to every port in ``bursts`` bursts, each started 0.3 s into its own window of
    ``window_s`` (epoch-aligned) so that two receivers' arrival times cannot fall on either side of a
    window boundary; returns each burst's window start (s)."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    starts = []
    per = -(-len(datagrams) // bursts)
    for b in range(bursts):
        now = time.time()
        start = (int(now // window_s) + 1) * window_s
        time.sleep(max(0.0, start + 0.3 - time.time()))
        starts.append(int(start))
        for x in datagrams[b * per : (b + 1) * per]:
            for p in ports:
                tx.sendto(x, ("127.0.0.1", p))
            time.sleep(0.0005)  # paced like an agent: neither receiver's socket buffer overflows
        assert time.time() < start + window_s - 0.3, "a burst overran its window: machine too loaded"
    tx.close()
    return starts
