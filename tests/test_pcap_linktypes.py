"""Replay of Linux cooked (SLL, SLL2) and raw-IP captures, pcap and pcapng, against tshark as oracle.

Each capture is replayed by ``PcapSource`` into a ring and parsed by the parser the capture kernels
inline; per (src, dst) packet and byte totals (LEN: the record's wire length, tshark's ``frame.len``)
must equal tshark's, and so must the count of frames that carry no IP. The pcapng files are written by
``editcap`` / ``mergecap`` from the classic ones, so two independent writers are read.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1Q, Ether
from scapy.packet import Raw

from contract import fields as F
from low_level.capture.ring import HEAD, Ring
from low_level.capture.sources import PcapSource
from low_level.kernel.parse import ERR_NON_IP, ERR_TRUNCATED_ETHERNET, PARSE_OK, empty_outputs, parse_batch

pytestmark = pytest.mark.skipif(
    shutil.which("tshark") is None, reason="tshark missing (./lw setup installs it)"
)

MAC = b"\x02\x00\x00\x00\x00\x07"


def l3_packets(n: int, seed: int, v6: bool | None = None) -> list[bytes]:
    """IPv4 and IPv6 packets (TCP, UDP, ICMP) between a few hosts, payloads of varied size."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        six = bool(rng.integers(2)) if v6 is None else v6
        a, b = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        ip = (
            IPv6(src=f"2001:db8::{a}", dst=f"2001:db8:1::{b}")
            if six
            else IP(src=f"10.0.0.{a}", dst=f"10.1.0.{b}")
        )
        kind = int(rng.integers(3))
        l4 = TCP(sport=1000 + i, dport=443, flags="S") if kind == 0 else UDP(sport=53, dport=2000 + i)
        if kind == 2 and not six:
            l4 = ICMP()
        out.append(bytes(ip / l4 / Raw(b"x" * int(rng.integers(0, 300)))))
    return out


def _et(l3: bytes) -> int:
    return 0x86DD if l3[0] >> 4 == 6 else 0x0800


def sll(l3: bytes, i: int) -> bytes:
    return (
        bytes(
            CookedLinux(
                pkttype=4 if i % 3 == 0 else 0, lladdrtype=1, lladdrlen=6, src=MAC + b"\0\0", proto=_et(l3)
            )
        )
        + l3
    )


def sll2(l3: bytes, i: int) -> bytes:
    hdr = CookedLinuxV2(
        proto=_et(l3), ifindex=2 + i % 2, lladdrtype=1, pkttype=i % 2, lladdrlen=6, src=MAC + b"\0\0"
    )
    return bytes(hdr) + l3


def write_pcap(path: Path, records: list[bytes], linktype: int) -> Path:
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)]
    for i, r in enumerate(records):
        out.append(struct.pack("<IIII", 1_700_000_000 + i, i, len(r), len(r)) + r)
    path.write_bytes(b"".join(out))
    return path


def to_pcapng(path: Path) -> Path:
    ng = path.with_suffix(".pcapng")
    subprocess.run(["editcap", "-F", "pcapng", str(path), str(ng)], check=True, capture_output=True)
    return ng


def tshark_totals(path: Path) -> tuple[Counter, int]:
    """{(src, dst): [packets, bytes]} of the IP frames, and the number of frames without IP, per tshark."""
    cmd = ["tshark", "-n", "-r", str(path), "-T", "fields", "-E", "separator=/t"]
    cmd += ["-e", "ip.src", "-e", "ipv6.src", "-e", "ip.dst", "-e", "ipv6.dst", "-e", "frame.len"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    tot: Counter = Counter()
    non_ip = 0
    for line in text.splitlines():
        s4, s6, d4, d6, flen = line.split("\t")
        src, dst = (s4 or s6).split(",")[0], (d4 or d6).split(",")[0]  # the outer header's
        if not src:
            non_ip += 1
            continue
        tot[(src, dst, "p")] += 1
        tot[(src, dst, "b")] += int(flen)
    return tot, non_ip


def lowwater_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The file replayed into a ring (pulled, as the agent does) and parsed: (rows, status)."""
    src = PcapSource(path, Ring(2, 128), progress=False)
    ring = src.pull_ring(1 << 12, 128)
    while src.pull(1 << 12):
        pass
    assert src.error is None and src.finished and not src.malformed_tail, src.stats()
    n = int(ring.ctr[HEAD])
    slots = np.arange(n, dtype=np.int64)
    offs = ring.offs[slots] if ring.zero_copy else slots * ring.snaplen
    out, status, errs = empty_outputs(n)
    parse_batch(ring.frames, offs, ring.caplen, ring.wirelen, ring.ts, ring.iface, n, out, status, errs)
    src.close()
    return out, status


def lowwater_totals(path: Path) -> tuple[Counter, int]:
    out, status = lowwater_rows(path)
    tot: Counter = Counter()
    for row in out[status == PARSE_OK]:
        key = (
            F.words_to_ip(int(row[F.SRC_HI]), int(row[F.SRC_LO])),
            F.words_to_ip(int(row[F.DST_HI]), int(row[F.DST_LO])),
        )
        tot[(*key, "p")] += 1
        tot[(*key, "b")] += int(row[F.LEN])
    assert set(np.unique(status)) <= {PARSE_OK, ERR_NON_IP}
    return tot, int((status == ERR_NON_IP).sum())


def agree(path: Path, n_ip: int, n_non_ip: int) -> None:
    want, want_non_ip = tshark_totals(path)
    got, got_non_ip = lowwater_totals(path)
    assert sum(v for k, v in want.items() if k[2] == "p") == n_ip  # the oracle saw every frame as meant
    assert want_non_ip == n_non_ip
    assert got == want
    assert got_non_ip == want_non_ip


def _sll_records() -> tuple[list[bytes], int, int]:
    l3 = l3_packets(300, seed=1)
    recs = [sll(p, i) for i, p in enumerate(l3)]
    for i, p in enumerate(l3_packets(40, seed=2)):  # VLAN tag kept after the cooked header (tcpdump -i any)
        tagged = bytes(Dot1Q(vlan=100 + i % 3, type=_et(p))) + p
        recs.append(
            bytes(CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6, src=MAC + b"\0\0", proto=0x8100)) + tagged
        )
    arp = bytes(ARP(psrc="10.0.0.1", pdst="10.0.0.2"))
    recs += [
        bytes(CookedLinux(pkttype=1, lladdrtype=1, lladdrlen=6, src=MAC + b"\0\0", proto=0x0806)) + arp
    ] * 5
    return recs, 340, 5


@pytest.mark.parametrize("ng", [False, True], ids=["pcap", "pcapng"])
def test_sll_with_vlan_matches_tshark(tmp_path: Path, ng: bool) -> None:
    recs, n_ip, n_non_ip = _sll_records()
    path = write_pcap(tmp_path / "sll.pcap", recs, 113)
    agree(to_pcapng(path) if ng else path, n_ip, n_non_ip)


@pytest.mark.parametrize("ng", [False, True], ids=["pcap", "pcapng"])
def test_sll2_ipv4_and_ipv6_match_tshark(tmp_path: Path, ng: bool) -> None:
    recs = [sll2(p, i) for i, p in enumerate(l3_packets(300, seed=3))]
    arp = bytes(ARP(psrc="10.0.0.1", pdst="10.0.0.2"))
    recs += [bytes(CookedLinuxV2(proto=0x0806, lladdrtype=1, lladdrlen=6, src=MAC + b"\0\0")) + arp] * 3
    path = write_pcap(tmp_path / "sll2.pcap", recs, 276)
    agree(to_pcapng(path) if ng else path, 300, 3)


@pytest.mark.parametrize(
    ("linktype", "v6"),
    [(101, None), (12, None), (228, False), (229, True)],
    ids=["raw", "raw12", "ipv4", "ipv6"],
)
@pytest.mark.parametrize("ng", [False, True], ids=["pcap", "pcapng"])
def test_raw_ip_matches_tshark(tmp_path: Path, linktype: int, v6: bool | None, ng: bool) -> None:
    path = write_pcap(tmp_path / "raw.pcap", l3_packets(200, seed=linktype, v6=v6), linktype)
    agree(to_pcapng(path) if ng else path, 200, 0)


def test_mixed_link_layers_in_one_pcapng_match_tshark(tmp_path: Path) -> None:
    """mergecap puts each input's link type on its own interface: Ethernet, SLL, SLL2 and raw in one file."""
    l3 = l3_packets(400, seed=9)
    eth = [bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=_et(p))) + p for p in l3[:100]]
    parts = [
        write_pcap(tmp_path / "a.pcap", eth, 1),
        write_pcap(tmp_path / "b.pcap", [sll(p, i) for i, p in enumerate(l3[100:200])], 113),
        write_pcap(tmp_path / "c.pcap", [sll2(p, i) for i, p in enumerate(l3[200:300])], 276),
        write_pcap(tmp_path / "d.pcap", l3[300:], 101),
    ]
    merged = tmp_path / "mixed.pcapng"
    subprocess.run(
        ["mergecap", "-F", "pcapng", "-w", str(merged), *map(str, parts)], check=True, capture_output=True
    )
    agree(merged, 400, 0)
    out, _ = lowwater_rows(merged)
    assert sorted(np.unique(out[:, F.IFACE]).tolist()) == [0, 1, 2, 3]


def test_cut_cooked_header_is_counted_not_lost(tmp_path: Path) -> None:
    """A record shorter than its SLL header becomes an empty frame: parsed as truncated_ethernet with its LEN."""
    good = sll(l3_packets(1, seed=4)[0], 1)
    path = write_pcap(tmp_path / "cut.pcap", [good, good[:10], b""], 113)
    out, status = lowwater_rows(path)
    assert status.tolist() == [PARSE_OK, ERR_TRUNCATED_ETHERNET, ERR_TRUNCATED_ETHERNET]
    assert out[:, F.LEN].tolist() == [len(good), 10, 0]
    assert out[0, F.SRC_MAC] == F.mac_to_int("02:00:00:00:00:07") and out[0, F.DST_MAC] == 0
