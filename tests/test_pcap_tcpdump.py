"""``tcpdump -i any`` captures of real traffic replay exactly: SLL2 (current tcpdump) and SLL (``-y LINUX_SLL``).

Two network namespaces joined by a veth pair carry real IPv4 and IPv6 traffic (TCP answered by RST, UDP by ICMP
port unreachable, ARP and neighbour discovery); tcpdump captures it on ``any`` inside one namespace. The
file then goes through the agent's pcap source and the capture kernel (a real ``Agent``, a producer that
records what it sends), and the per-(src, dst) packets and bytes summed over every partial must equal
tshark's over the same file (tshark is the oracle; LEN is the record's wire length, tshark's frame.len).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from contract import fields as F
from contract import wire
from low_level.host.agent import Agent
from lowwater_testing.capture import RecordingProducer, make_query
from tests.test_pcap_linktypes import tshark_totals

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("tcpdump", "tshark", "ip")),
    reason="needs root, tcpdump, tshark and ip (./lw setup installs them)",
)

A4, B4, A6, B6 = "10.229.0.1", "10.229.0.2", "fd29::1", "fd29::2"
LINKTYPE = {"LINUX_SLL": 113, "LINUX_SLL2": 276}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def netns_pair():
    """Namespaces a and b, a veth between them with an IPv4 and an IPv6 address on each end."""
    a, b = f"lwtd{os.getpid()}a", f"lwtd{os.getpid()}b"
    _ip("netns", "add", a)
    _ip("netns", "add", b)
    try:
        _ip("link", "add", "va", "netns", a, "type", "veth", "peer", "name", "vb", "netns", b)
        for ns, dev, v4, v6 in ((a, "va", A4, A6), (b, "vb", B4, B6)):
            _ip("-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            _ip("-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


END = b"lowwater-tcpdump-end"  # the last datagram sent: once it is in the file, every earlier frame is too


def capture(ns: str, path: Path, link: str | None) -> str:
    """tcpdump -i any in namespace ns while real traffic crosses the veth; its closing statistics.

    ``-s 4096``: in immediate mode libpcap uses a TPACKET_V2 ring whose slots are sized by the snapshot length,
    so the default 262144 leaves ~8 slots in the 2 MB buffer, and a tcpdump starved for CPU drops the rest
    ("dropped by kernel": CI kept ~32 of ~95). Stopped once the END datagram is written (-U: frame by frame).
    """
    cmd = ["ip", "netns", "exec", ns, "tcpdump", "-i", "any", "-n", "-U", "--immediate-mode", "-s", "4096"]
    cmd += ["-w", str(path), *(["-y", link] if link else [])]
    td = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert td.stderr is not None
        seen = [td.stderr.readline()]
        while "listening on any" not in seen[-1] and seen[-1] and len(seen) < 5:
            seen.append(td.stderr.readline())  # "listening on any, link-type ...": capturing from here on
        assert "listening on any" in seen[-1], seen
        traffic = (
            "import socket\n"
            f"for fam, dst in ((socket.AF_INET, {B4!r}), (socket.AF_INET6, {B6!r})):\n"
            "    for i in range(15):\n"  # UDP to closed ports: ICMP port unreachable comes back (rate-limited)
            "        u = socket.socket(fam, socket.SOCK_DGRAM)\n"
            "        u.sendto(b'x' * (20 + 97 * i), (dst, 9 + i))\n"
            "    for i in range(10):\n"  # TCP to a closed port: SYN, then RST back
            "        t = socket.socket(fam, socket.SOCK_STREAM)\n"
            "        try:\n"
            "            t.connect((dst, 7 + i))\n"
            "        except ConnectionRefusedError:\n"
            "            pass\n"
            f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto({END!r}, ({B4!r}, 5))\n"
        )
        subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", traffic], check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while END not in (path.read_bytes() if path.exists() else b""):
            assert time.monotonic() < deadline, "tcpdump never wrote the last datagram"
            time.sleep(0.05)
    finally:
        td.send_signal(signal.SIGINT)
        _, stats = td.communicate(timeout=30)
    return stats


def replay(path: Path) -> Counter:
    """The file through the agent's pcap source and the capture kernel: packets and bytes per (src, dst)."""
    q = make_query("lazy", 256, window="{range: 1s}")
    prod = RecordingProducer()
    spec = {"type": "pcap", "path": str(path), "mode": "fast", "progress": False}
    agent = Agent([q], spec, "td", None, ring_slots=1 << 12, producer=prod)
    agent.run()
    assert agent.source.finished and agent.source.error is None
    got: Counter = Counter()
    for _, _, value in prod.sent:
        b = wire.decode(value)
        if isinstance(b, wire.Partials):
            for k, s in zip(b.key, b.state, strict=True):
                src = F.words_to_ip(int(k[0]), int(k[1]))
                dst = F.words_to_ip(int(k[2]), int(k[3]))
                got[(src, dst, "p")] += int(s[0])
                got[(src, dst, "b")] += int(s[1])
    return got


@pytest.mark.parametrize("link", [None, "LINUX_SLL"], ids=["sll2", "sll"])
def test_tcpdump_any_capture_replays_like_tshark(netns_pair, tmp_path: Path, link: str | None) -> None:
    a, _ = netns_pair
    path = tmp_path / "any.pcap"
    stats = capture(a, path, link)
    dropped = re.search(r"^(\d+) packets dropped by kernel$", stats, re.M)
    assert dropped is not None and dropped[1] == "0", stats  # tcpdump kept every frame it was handed
    raw = path.read_bytes()
    assert int.from_bytes(raw[20:24], "little") == LINKTYPE[link or "LINUX_SLL2"]
    want, _ = tshark_totals(path)
    # every datagram and SYN sent (15 + 10 per family, the END one) and every RST back; ICMP errors are
    # rate-limited (~6 per family) and neighbour discovery may add a probe, hence floors
    assert want[(A4, B4, "p")] >= 26 and want[(A6, B6, "p")] >= 25, want
    assert want[(B4, A4, "p")] >= 10 and want[(B6, A6, "p")] >= 10, want
    got = replay(path)
    assert got == want
