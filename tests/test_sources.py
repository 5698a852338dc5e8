"""Packet sources: pcap/pcapng replay, the synthetic generator, live AF_PACKET capture, the factory.

Capture files are written with dpkt and scapy from frames built with scapy (explicit Ether src/dst);
the ring is consumed here, slot by slot, advancing ``ctr[TAIL]`` like the aggregation kernel does.
The live test only ever sends inside a network namespace of its own, over its own veth pair.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import dpkt
import numpy as np
import pytest
from dpkt import pcapng
from scapy.all import ICMP, IP, TCP, UDP, Dot1Q, Ether, PcapNgWriter, PcapWriter, Raw, rdpcap, wrpcap

from low_level.capture.ring import BYTES, CAPTURED, DROPS, HEAD, TAIL, TRUNCATED, Ring
from low_level.capture.sources import (
    AfPacketSource,
    GeneratorSource,
    PcapSource,
    UnsupportedLinktypeError,
    generate_frames,
    group_tuple,
    group_tuple_nb,
    open_source,
)

T0 = 1_700_000_123  # seconds


# ---------------------------------------------------------------------------------------------------
# helpers


def scapy_frames(n: int, seed: int = 0) -> list[bytes]:
    """Varied Ethernet frames (TCP/UDP/ICMP, 60..1514 bytes, some VLAN-tagged) built with scapy."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        eth = Ether(src=f"02:00:00:00:{i >> 8 & 0xFF:02x}:{i & 0xFF:02x}", dst="02:00:00:00:ff:01")
        ip = IP(src=f"10.1.{i >> 8 & 0xFF}.{i & 0xFF}", dst="10.2.0.1", ttl=64)
        kind = i % 4
        if kind == 0:
            l4 = TCP(sport=1024 + i, dport=443, flags="S")
        elif kind == 1:
            l4 = UDP(sport=1024 + i, dport=53)
        elif kind == 2:
            l4 = ICMP()
        else:
            eth = eth / Dot1Q(vlan=100 + i % 7)
            l4 = UDP(sport=5000, dport=5001)
        size = int(rng.integers(60, 1515))
        pkt = eth / ip / l4
        pad = max(0, size - len(pkt))
        out.append(bytes(pkt / Raw(bytes([i & 0xFF]) * pad)))
    return out


def drain(
    ring: Ring, src, timeout: float = 30.0, until: int | None = None, delay: float = 0.0
) -> list[tuple]:
    """Consume the ring until the source ends (or ``until`` frames): [(bytes, wirelen, ts, iface)]."""
    got: list[tuple] = []
    deadline = time.monotonic() + timeout
    snap = ring.snaplen
    while time.monotonic() < deadline:
        head, tail = int(ring.ctr[HEAD]), int(ring.ctr[TAIL])
        for seq in range(tail, head):
            s = seq & (ring.nslots - 1)
            got.append(
                (
                    bytes(ring.frames[s * snap : s * snap + ring.caplen[s]]),
                    int(ring.wirelen[s]),
                    int(ring.ts[s]),
                    int(ring.iface[s]),
                )
            )
        ring.ctr[TAIL] = head
        if until is not None and len(got) >= until:
            break
        if head == tail:
            if not src.running and int(ring.ctr[HEAD]) == head:
                break
            time.sleep(0.0005)
        elif delay:
            time.sleep(delay)
    return got


def replay(path: Path, nslots: int = 1024, snaplen: int = 2048, **kw) -> tuple[list[tuple], PcapSource]:
    ring = Ring(nslots=nslots, snaplen=snaplen)
    src = PcapSource(path, ring, progress=False, **kw).start()
    got = drain(ring, src)
    assert src.join(5)
    assert src.error is None, src.error
    return got, src


def dpkt_ts(ts: float, nano: bool) -> int:
    """The ns timestamp dpkt's pcap writer stores for a float ``ts`` (its own rounding)."""
    mult = 10**9 if nano else 10**6
    return int(ts) * 10**9 + int(round(ts % 1 * mult)) * (10**9 // mult)


def write_classic(
    path: Path,
    frames: list[bytes],
    ts_ns: list[int],
    endian: str,
    nano: bool,
    linktype: int = 1,
    cut: int = 0,
) -> None:
    """A classic pcap written with dpkt's header classes, in the requested byte order and precision."""
    big = endian == ">"
    fh_cls = dpkt.pcap.FileHdr if big else dpkt.pcap.LEFileHdr
    ph_cls = dpkt.pcap.PktHdr if big else dpkt.pcap.LEPktHdr
    magic = dpkt.pcap.TCPDUMP_MAGIC_NANO if nano else dpkt.pcap.TCPDUMP_MAGIC
    buf = bytearray(bytes(fh_cls(magic=magic, snaplen=65535, linktype=linktype)))
    for f, t in zip(frames, ts_ns, strict=True):
        frac = t % 10**9 if nano else (t % 10**9) // 1000
        buf += bytes(ph_cls(tv_sec=t // 10**9, tv_usec=frac, caplen=len(f), len=len(f))) + f
    path.write_bytes(bytes(buf[: len(buf) - cut]))


def check(got: list[tuple], frames: list[bytes], ts_ns: list[int], ifaces: list[int]) -> None:
    assert len(got) == len(frames)
    for k, (data, wl, ts, ifx) in enumerate(got):
        assert data == frames[k], k
        assert wl == len(frames[k]), k
        assert ts == ts_ns[k], k
        assert ifx == ifaces[k], k


FRAMES = scapy_frames(120)
TS_NS = [T0 * 10**9 + i * 1_234_567 + (i % 3) * 7 for i in range(len(FRAMES))]


# ---------------------------------------------------------------------------------------------------
# classic pcap


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
def test_classic_pcap_both_endians_and_precisions(tmp_path: Path, endian: str, nano: bool) -> None:
    path = tmp_path / "x.pcap"
    write_classic(path, FRAMES, TS_NS, endian, nano)
    got, src = replay(path, iface_index=3)
    expect_ts = TS_NS if nano else [t // 1000 * 1000 for t in TS_NS]
    check(got, FRAMES, expect_ts, [3] * len(FRAMES))
    st = src.stats()
    assert src.finished and st["finished"]
    assert st["frames_read"] == st["frames_pushed"] == len(FRAMES)
    assert st["drops"] == 0 and not st["malformed_tail"] and st["reason"] is None
    assert st["bytes"] == sum(map(len, FRAMES))
    assert st["format"] == ("pcap-ns" if nano else "pcap")
    assert src.live_clock is False


@pytest.mark.parametrize("nano", [False, True])
def test_pcap_written_by_dpkt_writer(tmp_path: Path, nano: bool) -> None:
    path = tmp_path / "w.pcap"
    floats = [T0 + i * 0.0137 for i in range(len(FRAMES))]
    with open(path, "wb") as f:
        w = dpkt.pcap.Writer(f, snaplen=65535, nano=nano)
        for fr, t in zip(FRAMES, floats, strict=True):
            w.writepkt(fr, ts=t)
    got, _ = replay(path)
    check(got, FRAMES, [dpkt_ts(t, nano) for t in floats], [0] * len(FRAMES))


@pytest.mark.parametrize("nano", [False, True])
def test_pcap_written_by_scapy(tmp_path: Path, nano: bool) -> None:
    path = tmp_path / "s.pcap"
    pkts = [Ether(f) for f in FRAMES]
    for i, p in enumerate(pkts):
        p.time = Decimal(TS_NS[i]) / 10**9
    if nano:
        with PcapWriter(str(path), nano=True) as w:
            w.write(pkts)
    else:
        wrpcap(str(path), pkts)
    expect = [int(Decimal(p.time) * 10**9) for p in rdpcap(str(path))]  # scapy's own reading of the file
    assert abs(expect[5] - TS_NS[5]) < (1 if nano else 1000)  # scapy rounds to µs
    got, _ = replay(path)
    check(got, FRAMES, expect, [0] * len(FRAMES))


# ---------------------------------------------------------------------------------------------------
# pcapng


def _opt(cls, code: int, data: bytes):
    return cls(code=code, data=data)


def _spb(endian: str, frame: bytes) -> bytes:
    padded = frame + b"\0" * (-len(frame) % 4)
    total = 16 + len(padded)
    return (
        struct.pack(endian + "III", pcapng.PCAPNG_BT_SPB, total, len(frame))
        + padded
        + struct.pack(endian + "I", total)
    )


def _unknown_block(endian: str, btype: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack(endian + "II", btype, total) + body + struct.pack(endian + "I", total)


def _section(
    endian: str, ifaces: list[tuple[int | None, int]], packets: list[tuple], snaplen: int = 65535
) -> bytes:
    """One pcapng section written with dpkt's block classes: ``ifaces`` = [(if_tsresol byte or None,
    if_tsoffset s)], ``packets`` = [(iface id, ts in units, frame) | ("spb", frame) | ("skip", type)]."""
    le = endian == "<"
    shb = pcapng.SectionHeaderBlockLE() if le else pcapng.SectionHeaderBlock()
    idb_cls = pcapng.InterfaceDescriptionBlockLE if le else pcapng.InterfaceDescriptionBlock
    opt_cls = pcapng.PcapngOptionLE if le else pcapng.PcapngOption
    epb_cls = pcapng.EnhancedPacketBlockLE if le else pcapng.EnhancedPacketBlock
    out = [bytes(shb)]
    for resol, offset in ifaces:
        opts = [_opt(opt_cls, pcapng.PCAPNG_OPT_IF_NAME, b"eth-test")]
        if resol is not None:
            opts.append(_opt(opt_cls, pcapng.PCAPNG_OPT_IF_TSRESOL, bytes([resol])))
        if offset:
            opts.append(_opt(opt_cls, pcapng.PCAPNG_OPT_IF_TSOFFSET, struct.pack(endian + "q", offset)))
        opts.append(opt_cls(code=pcapng.PCAPNG_OPT_ENDOFOPT))
        out.append(bytes(idb_cls(snaplen=snaplen, linktype=1, opts=opts)))
    for item in packets:
        if item[0] == "spb":
            out.append(_spb(endian, item[1]))
        elif item[0] == "skip":
            out.append(_unknown_block(endian, item[1], b"\x01\x02\x03\x04" * 3))
        else:
            ifid, units, frame = item
            out.append(
                bytes(
                    epb_cls(
                        iface_id=ifid,
                        ts_high=units >> 32,
                        ts_low=units & 0xFFFFFFFF,
                        caplen=len(frame),
                        pkt_len=len(frame),
                        pkt_data=frame,
                    )
                )
            )
    return b"".join(out)


@pytest.mark.parametrize("first", ["<", ">"])
def test_pcapng_sections_interfaces_resolutions(tmp_path: Path, first: str) -> None:
    """Two sections of opposite byte orders; interfaces with µs (default), ns, 2^-20 s and an offset;
    EPBs, an SPB (takes the previous timestamp) and skipped blocks (NRB, ISB, a custom one)."""
    other = ">" if first == "<" else "<"
    fr = FRAMES
    base_s = T0
    sec1 = _section(
        first,
        [(None, 0), (9, 0), (0x80 | 20, 0)],
        [
            (0, base_s * 10**6 + 1, fr[0]),  # µs
            ("skip", 4),  # name resolution block
            (1, base_s * 10**9 + 123_456_789, fr[1]),  # ns
            (2, (base_s << 20) | (1 << 19), fr[2]),  # 2^-20 s: +0.5 s
            ("spb", fr[3]),
            ("skip", 5),  # interface statistics block
            (1, base_s * 10**9 + 999, fr[4]),
            ("skip", 0x0BAD),
        ],
    )
    sec2 = _section(
        other,
        [(6, 100)],
        [  # µs with if_tsoffset = 100 s
            (0, 5_000_001, fr[5]),
            ("spb", fr[6]),
        ],
    )
    path = tmp_path / "x.pcapng"
    path.write_bytes(sec1 + sec2)
    got, src = replay(path, iface_index=10)
    ts1 = base_s * 10**9 + 123_456_789
    expect_ts = [
        base_s * 10**9 + 1000,
        ts1,
        base_s * 10**9 + 500_000_000,
        base_s * 10**9 + 500_000_000,
        base_s * 10**9 + 999,
        105 * 10**9 + 1000,
        105 * 10**9 + 1000,
    ]
    check(got, fr[:7], expect_ts, [10, 11, 12, 10, 11, 13, 13])
    assert src.stats()["format"] == "pcapng" and not src.malformed_tail


def test_pcapng_written_by_dpkt_writer_multi_idb(tmp_path: Path) -> None:
    idbs = [pcapng.InterfaceDescriptionBlockLE(snaplen=65535, linktype=1) for _ in range(3)]
    path = tmp_path / "w.pcapng"
    with open(path, "wb") as f:
        w = pcapng.Writer(f, idb=idbs)
        for i, frame in enumerate(FRAMES):
            epb = pcapng.EnhancedPacketBlockLE(
                iface_id=i % 3, caplen=len(frame), pkt_len=len(frame), pkt_data=frame
            )
            units = T0 * 10**6 + i * 1500
            epb.ts_high, epb.ts_low = units >> 32, units & 0xFFFFFFFF
            w.writepkt(epb)
    got, _ = replay(path, iface_index=1)
    check(
        got,
        FRAMES,
        [(T0 * 10**6 + i * 1500) * 1000 for i in range(len(FRAMES))],
        [1 + i % 3 for i in range(len(FRAMES))],
    )


def test_pcapng_written_by_scapy(tmp_path: Path) -> None:
    path = tmp_path / "s.pcapng"
    pkts = [Ether(f) for f in FRAMES]
    for i, p in enumerate(pkts):
        p.time = Decimal(TS_NS[i]) / 10**9
    with PcapNgWriter(str(path)) as w:
        for p in pkts:
            w.write(p)
    expect = [int(Decimal(p.time) * 10**9) for p in rdpcap(str(path))]
    got, _ = replay(path)
    check(got, FRAMES, expect, [0] * len(FRAMES))


# ---------------------------------------------------------------------------------------------------
# damaged files and unsupported link types


@pytest.mark.parametrize("cut, reason", [(7, "truncated record data"), (0, None)])
def test_truncated_classic_pcap_stops_cleanly(tmp_path: Path, cut: int, reason: str | None) -> None:
    path = tmp_path / "t.pcap"
    write_classic(path, FRAMES[:20], TS_NS[:20], "<", False, cut=cut)
    got, src = replay(path)
    n = 19 if cut else 20
    check(got, FRAMES[:n], [t // 1000 * 1000 for t in TS_NS[:n]], [0] * n)
    st = src.stats()
    assert src.finished
    assert st["malformed_tail"] is bool(cut)
    if reason:
        assert reason in st["reason"] and str(path) in st["reason"]
        assert st["malformed_offset"] == 24 + sum(16 + len(f) for f in FRAMES[:19])


def test_truncated_record_header_and_garbage_caplen(tmp_path: Path) -> None:
    path = tmp_path / "h.pcap"
    write_classic(path, FRAMES[:5], TS_NS[:5], ">", True)
    path.write_bytes(path.read_bytes() + b"\x00" * 9)  # a partial record header
    got, src = replay(path)
    assert len(got) == 5 and src.malformed_tail and "truncated record header" in src.reason

    data = bytearray(path.read_bytes()[:-9])
    second = 24 + 16 + len(FRAMES[0])
    data[second + 8 : second + 12] = struct.pack(">I", 0x7FFF_FFFF)  # absurd caplen of record 2
    path.write_bytes(bytes(data))
    got, src = replay(path)
    assert len(got) == 1 and src.malformed_tail and "exceeds" in src.reason
    assert src.stats()["malformed_offset"] == second


@pytest.mark.parametrize("damage", ["cut", "length", "trailer"])
def test_damaged_pcapng_stops_at_last_good_block(tmp_path: Path, damage: str) -> None:
    body = _section("<", [(9, 0)], [(0, T0 * 10**9 + i, FRAMES[i]) for i in range(10)])
    data = bytearray(body)
    # the last EPB starts where its length says; find it by walking
    pos, starts = 0, []
    while pos < len(data):
        starts.append(pos)
        pos += struct.unpack_from("<I", data, pos + 4)[0]
    last = starts[-1]
    if damage == "cut":
        data = data[:-10]
    elif damage == "length":
        data[last + 4 : last + 8] = struct.pack("<I", 13)  # not a multiple of 4
    else:
        data[-4:] = struct.pack("<I", 12345)
    path = tmp_path / "d.pcapng"
    path.write_bytes(bytes(data))
    got, src = replay(path)
    check(got, FRAMES[:9], [T0 * 10**9 + i for i in range(9)], [0] * 9)
    st = src.stats()
    assert st["malformed_tail"] and st["malformed_offset"] == last
    assert {"cut": "truncated block", "length": "bad block length", "trailer": "trailer"}[damage] in st[
        "reason"
    ]


def test_unreadable_linktype_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "wifi.pcap"
    write_classic(path, FRAMES[:2], TS_NS[:2], "<", False, linktype=105)
    ring = Ring(nslots=16)
    with pytest.raises(
        UnsupportedLinktypeError, match=r"wifi\.pcap.*linktype 105 \(IEEE 802\.11\).*reads linktypes 1 "
    ):
        PcapSource(path, ring)

    ng = tmp_path / "null.pcapng"
    shb = bytes(pcapng.SectionHeaderBlockLE())
    idb = bytes(pcapng.InterfaceDescriptionBlockLE(snaplen=65535, linktype=0))
    ng.write_bytes(shb + idb)
    with pytest.raises(ValueError, match=r"null\.pcapng.*linktype 0 \(NULL/loopback\)"):
        PcapSource(ng, ring)

    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture file at all")
    with pytest.raises(ValueError, match="not a pcap"):
        PcapSource(junk, ring)


# ---------------------------------------------------------------------------------------------------
# modes


def _many(tmp_path: Path, n: int, gap_ns: int) -> tuple[Path, list[bytes]]:
    frames = [
        bytes(
            Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
            / IP(src="10.0.0.1", dst="10.0.0.2")
            / UDP(sport=1000, dport=2000)
            / Raw(struct.pack(">I", i) * 5)
        )
        for i in range(n)
    ]
    path = tmp_path / "many.pcap"
    write_classic(path, frames, [T0 * 10**9 + i * gap_ns for i in range(n)], "<", True)
    return path, frames


def test_fast_mode_with_tiny_ring_waits_and_loses_nothing(tmp_path: Path) -> None:
    path, frames = _many(tmp_path, 2000, 1000)
    ring = Ring(nslots=4, snaplen=128)
    src = PcapSource(path, ring, mode="fast", progress=False).start()
    got = drain(ring, src, delay=0.00002)
    assert src.join(5) and src.finished
    assert [g[0] for g in got] == frames
    assert src.stats()["drops"] == 0 and ring.ctr[DROPS] == 0


def test_fast_replay_keeps_ring_contents_and_counters_of_the_general_path(tmp_path: Path) -> None:
    """A fast replay copies records into the ring itself (not through ring_push): same slots, same counters."""
    frames = scapy_frames(300, seed=3)
    ts = [T0 * 10**9 + i * 1000 for i in range(len(frames))]
    path = tmp_path / "cut.pcap"
    write_classic(path, frames, ts, "<", True)
    for mode in ("fast", "paced"):
        ring = Ring(nslots=512, snaplen=64)
        src = PcapSource(path, ring, mode=mode, progress=False).start()  # paced: 0.3 ms of recorded gaps
        got = drain(ring, src)
        assert src.join(5) and src.finished
        assert [g[0] for g in got] == [f[:64] for f in frames], mode
        assert [g[1] for g in got] == [len(f) for f in frames], mode
        assert [g[2] for g in got] == ts, mode
        assert int(ring.ctr[CAPTURED]) == len(frames), mode
        assert int(ring.ctr[BYTES]) == sum(len(f) for f in frames), mode
        assert int(ring.ctr[TRUNCATED]) == sum(len(f) > 64 for f in frames), mode


@pytest.mark.parametrize("endian", ["<", ">"])
def test_pulled_replay_over_the_file_sees_what_a_copying_ring_sees(tmp_path: Path, endian: str) -> None:
    """A pulled fast replay of a classic pcap gets a ring over the mapped file (offsets, no frame copied):
    the same frames (cut at snaplen), lengths, timestamps and ring counters as a ring the frames are copied
    into, around the ring several times. A pcapng file or a rebased replay still gets a copying ring."""
    frames = scapy_frames(300, seed=5)
    ts = [T0 * 10**9 + i * 1000 for i in range(len(frames))]
    path = tmp_path / "z.pcap"
    write_classic(path, frames, ts, endian, True)
    seen = {}
    for zero_copy in (True, False):
        src = PcapSource(path, Ring(2, 64), mode="fast", progress=False)
        ring = src.pull_ring(64, 64) if zero_copy else Ring(64, 64)
        src.ring = ring
        assert ring.zero_copy == zero_copy and (ring.frames is src._buf) == zero_copy
        got = []
        while n := src.pull(50):
            for seq in range(int(ring.ctr[TAIL]), int(ring.ctr[HEAD])):
                s = seq & (ring.nslots - 1)
                o = int(ring.offs[s]) if zero_copy else s * ring.snaplen
                got.append(
                    (bytes(ring.frames[o : o + ring.caplen[s]]), int(ring.wirelen[s]), int(ring.ts[s]))
                )
            ring.ctr[TAIL] = ring.ctr[HEAD]
            assert n <= 50
        assert src.finished and src.error is None
        seen[zero_copy] = got, ring.ctr[[CAPTURED, BYTES, TRUNCATED, DROPS]].tolist()
        src.close()
    assert seen[True] == seen[False]
    assert seen[True][0] == [(f[:64], len(f), t) for f, t in zip(frames, ts, strict=True)]
    assert seen[True][1] == [len(frames), sum(map(len, frames)), sum(len(f) > 64 for f in frames), 0]
    ng = tmp_path / "z.pcapng"
    ng.write_bytes(_section("<", [(None, 0)], [(0, 0, frames[0])]))
    for p, kw, n in ((ng, {}, 1), (path, {"rebase_to_now": True}, len(frames))):
        src = PcapSource(p, Ring(2, 64), mode="fast", progress=False, **kw)
        ring = src.pull_ring(512, 64)
        assert not ring.zero_copy and src.ring is ring
        assert src.pull(512) == n and src.finished
        assert bytes(ring.frames[: ring.caplen[0]]) == frames[0][:64]
        src.close()


def test_paced_mode_follows_gaps_and_drops_when_full(tmp_path: Path) -> None:
    n = 400
    path, frames = _many(tmp_path, n, 500_000)  # 0.2 s of traffic
    ring = Ring(nslots=4, snaplen=128)
    t = time.monotonic()
    src = PcapSource(path, ring, mode="paced", progress=False).start()
    time.sleep(0.1)  # a slow consumer: the ring stays full meanwhile
    got = drain(ring, src)
    elapsed = time.monotonic() - t
    st = src.stats()
    assert src.finished and elapsed >= 0.15
    assert st["frames_read"] == n and st["drops"] > 50
    assert st["frames_pushed"] + st["drops"] == n == len(got) + st["drops"]
    assert ring.ctr[DROPS] == st["drops"]
    assert [g[2] for g in got] == sorted(g[2] for g in got)  # recorded timestamps, in order

    src2 = PcapSource(path, Ring(nslots=1024), mode="paced", speed=4.0, progress=False).start()
    t = time.monotonic()
    assert src2.join(5) and src2.finished
    assert 0.03 <= time.monotonic() - t < 0.5  # 0.2 s of traffic at 4x
    assert src2.stats()["drops"] == 0


def test_loop_with_rebase_to_now(tmp_path: Path) -> None:
    n = 50
    path, frames = _many(tmp_path, n, 1_000_000)
    ring = Ring(nslots=256, snaplen=128)
    before = time.time_ns()
    src = PcapSource(path, ring, mode="fast", loop=True, rebase_to_now=True, progress=False).start()
    got = drain(ring, src, until=5 * n)
    src.stop()
    assert src.join(2) and not src.finished and src.live_clock
    after = time.time_ns()
    assert src.stats()["passes"] >= 4
    for k in range(4):
        rnd = got[k * n : (k + 1) * n]
        assert [g[0] for g in rnd] == frames
        first = rnd[0][2]
        assert before <= first <= after
        assert [g[2] - first for g in rnd] == [i * 1_000_000 for i in range(n)]


def test_stop_is_prompt_and_progress_bar_runs(tmp_path: Path) -> None:
    path, _ = _many(tmp_path, 200, 1000)
    ring = Ring(nslots=64, snaplen=128)
    src = PcapSource(path, ring, mode="fast", loop=True, progress=True).start()
    drain(ring, src, until=2000)
    t = time.monotonic()
    src.stop()
    assert src.join(2) and time.monotonic() - t < 1.0
    assert src.error is None and src.stats()["frames_read"] >= 2000


# ---------------------------------------------------------------------------------------------------
# generator


def test_generate_frames_is_deterministic_and_valid() -> None:
    a = generate_frames(3000, groups=500, seed=7, snaplen=128, ipv6_fraction=0.3)
    b = generate_frames(3000, groups=500, seed=7, snaplen=128, ipv6_fraction=0.3)
    c = generate_frames(3000, groups=500, seed=8, snaplen=128, ipv6_fraction=0.3)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    # chunking does not matter: packets 1000.. equal the tail of the whole run
    tail = generate_frames(2000, groups=500, seed=7, snaplen=128, ipv6_fraction=0.3, start_index=1000)
    assert np.array_equal(tail[0], a[0][1000:]) and np.array_equal(tail[3], a[3][1000:])


def test_generated_frames_parse_and_match_group_tuple() -> None:
    n = 4000
    frames, caplen, wirelen, ts = generate_frames(
        n, groups=1000, seed=3, snaplen=1600, sizes=(60, 1514), ipv6_fraction=0.25
    )
    protos: Counter = Counter()
    fam: Counter = Counter()
    for k in range(n):
        raw = bytes(frames[k, : caplen[k]])
        assert caplen[k] == wirelen[k] and 60 <= wirelen[k] <= 1514
        eth = dpkt.ethernet.Ethernet(raw)
        ip = eth.data
        if isinstance(ip, dpkt.ip.IP):
            fam[4] += 1
            src, dst = str(ipaddress.IPv4Address(ip.src)), str(ipaddress.IPv4Address(ip.dst))
            g = int(ipaddress.IPv4Address(ip.src)) - int(ipaddress.IPv4Address("10.0.0.0"))
            assert ip.len == wirelen[k] - 14 and dpkt.in_cksum(raw[14:34]) == 0
            want = group_tuple(g)
        else:
            assert isinstance(ip, dpkt.ip6.IP6)
            fam[6] += 1
            src, dst = str(ipaddress.IPv6Address(ip.src)), str(ipaddress.IPv6Address(ip.dst))
            g = int(ipaddress.IPv6Address(ip.src)) & 0xFFFFFF
            want = group_tuple(g, ipv6=True)
        assert 0 <= g < 1000
        assert (src, dst) == want[:2]
        l4 = ip.data
        if isinstance(l4, dpkt.tcp.TCP | dpkt.udp.UDP):
            assert l4.dport == want[2] and l4.sport >= 1024
        protos[type(l4).__name__] += 1
        if isinstance(l4, dpkt.tcp.TCP):
            assert l4.flags in (dpkt.tcp.TH_SYN, dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK)
    assert abs(protos["TCP"] / n - 0.8) < 0.03 and abs(protos["UDP"] / n - 0.15) < 0.03
    assert protos["ICMP"] + protos["ICMP6"] > 0.03 * n
    assert 0.2 < fam[6] / n < 0.3
    assert list(np.diff(ts)) == [1000] * (n - 1)  # synthetic clock, 1 Mpps
    # scapy agrees that every checksum is right (it recomputes them on a copy without them)
    for k in range(0, n, 97):
        raw = bytes(frames[k, : caplen[k]])
        pkt = Ether(raw)
        for layer in pkt.layers():
            for name in ("chksum", "cksum"):
                if name in pkt[layer].fields:
                    del pkt[layer].fields[name]
        assert bytes(pkt) == raw, k


def test_group_tuple_nb_matches_and_zipf_skews() -> None:
    for g in (0, 1, 77, 65535, (1 << 24) - 1):
        s, d, p = group_tuple_nb(g)
        assert group_tuple(g) == (
            str(ipaddress.IPv4Address(int(s))),
            str(ipaddress.IPv4Address(int(d))),
            int(p),
        )
    frames, caplen, _, _ = generate_frames(20000, groups=1000, seed=5, zipf=1.2, proto_mix={"udp": 1.0})
    srcs = Counter(bytes(frames[k, 26:30]) for k in range(20000))
    top = srcs[bytes([10, 0, 0, 0])]
    assert top > 20 * max(srcs[bytes([10, 0, 3, 0xE7])], 1)  # group 0 vs group 999
    assert len(srcs) > 300


def test_generator_source_synthetic_equals_generate_frames() -> None:
    ring = Ring(nslots=8, snaplen=128)  # tiny: the source must wait, never drop
    src = GeneratorSource(
        ring,
        groups=300,
        count=5000,
        clock="synthetic",
        seed=11,
        skew_ns=-5000,
        start_ns=10**18,
        synthetic_pps=250_000,
        ipv6_fraction=0.1,
        iface_index=2,
    )
    assert not src.live_clock
    src.start()
    got = drain(ring, src)
    assert src.join(5) and src.finished
    frames, caplen, wirelen, ts = generate_frames(
        5000, groups=300, seed=11, skew_ns=-5000, start_ns=10**18, synthetic_pps=250_000, ipv6_fraction=0.1
    )
    assert len(got) == 5000
    for k in (0, 1, 999, 4999):
        assert got[k][0] == bytes(frames[k, : caplen[k]])
    assert [g[1] for g in got] == list(wirelen)
    assert [g[2] for g in got] == list(ts) and ts[0] == 10**18 - 5000 and ts[1] - ts[0] == 4000
    assert {g[3] for g in got} == {2}
    st = src.stats()
    assert st["frames_read"] == st["frames_pushed"] == 5000 and st["drops"] == 0
    assert st["bytes"] == int(wirelen.sum())


def test_generator_answers_syns_by_the_handshake_rules() -> None:
    """synack_fraction & co (opt-in): every SYN-ACK answers an earlier SYN of the run (swapped 4-tuple,
    ack = seq + 1); the shares, the lognormal latency, retransmitted SYNs and duplicate SYN-ACKs are as
    asked; timestamps stay non-decreasing; a synthetic-clock source with count=n pushes the same packets."""
    n = 40_000
    kw = dict(
        groups=400,
        seed=21,
        snaplen=128,
        ipv6_fraction=0.2,
        syn_fraction=0.5,
        synthetic_pps=20_000,
        synack_fraction=0.6,
        synack_latency_ms=30.0,
        synack_latency_sigma=0.5,
        syn_retransmit_fraction=0.5,
        synack_duplicate_fraction=0.2,
    )
    frames, caplen, wirelen, ts = generate_frames(n, **kw)
    assert np.all(np.diff(ts) >= 0)
    syns: dict[tuple, list[tuple[int, int]]] = {}
    synacks: list[tuple[tuple, int, int]] = []
    for k in range(len(ts)):
        ip = dpkt.ethernet.Ethernet(bytes(frames[k, : caplen[k]])).data
        tcp = ip.data
        if not isinstance(tcp, dpkt.tcp.TCP) or not tcp.flags & dpkt.tcp.TH_SYN:
            continue
        if tcp.flags & dpkt.tcp.TH_ACK:
            synacks.append(((ip.dst, tcp.dport, ip.src, tcp.sport, (tcp.ack - 1) & 0xFFFFFFFF), int(ts[k])))
        else:  # by 4-tuple and seq: a client port is sometimes reused within the run
            syns.setdefault((ip.src, tcp.sport, ip.dst, tcp.dport, tcp.seq), []).append(int(ts[k]))
    lat, answered = [], set()
    for key, t in synacks:
        sent = syns[key]  # a SYN-ACK never comes out of nowhere: its 4-tuple swapped and ack = seq + 1
        assert t > sent[0]
        answered.add(key)
        lat.append(t - sent[0])
    retx = [v for v in syns.values() if len(v) > 1]
    assert all(len(v) == 2 and v[1] - v[0] == 1_000_000_000 for v in retx)
    assert not answered & {k for k, v in syns.items() if len(v) > 1}  # only unanswered SYNs are retransmitted
    n_syn = len(syns)
    assert abs(len(answered) / n_syn - 0.6) < 0.03
    assert abs(len(retx) / (n_syn - len(answered)) - 0.5) < 0.04
    dups = len(synacks) - len(answered)
    assert abs(dups / len(answered) - 0.2) < 0.03
    first = np.sort(np.array(lat))[: len(answered)]  # the duplicates come 1 s later than any first answer
    assert abs(np.median(first) / 30e6 - 1) < 0.05
    assert abs(np.std(np.log(first)) - 0.5) < 0.03
    # the same packets from the source (a tiny ring: it waits, and sends the scheduled answers at the end)
    ring = Ring(nslots=8, snaplen=128)
    src = GeneratorSource(ring, count=n, clock="synthetic", **{k: v for k, v in kw.items() if k != "snaplen"})
    src.start()
    got = drain(ring, src)
    assert src.join(10) and src.finished
    assert len(got) == len(ts) and [g[2] for g in got] == list(ts)
    assert all(got[k][0] == bytes(frames[k, : caplen[k]]) for k in range(0, len(ts), 37))
    with pytest.raises(ValueError, match="synack_fraction"):
        generate_frames(10, synack_fraction=1.5)


def test_generator_rate_count_and_wall_clock() -> None:
    ring = Ring(nslots=1 << 14, snaplen=128)
    before = time.time_ns()
    src = GeneratorSource(ring, rate=20_000, count=4000, clock="wall", skew_ns=-1_000_000_000)
    assert src.live_clock
    t = time.monotonic()
    src.start()
    got = drain(ring, src)
    elapsed = time.monotonic() - t
    assert src.finished and len(got) == 4000
    assert 0.1 < elapsed < 3.0  # 0.2 s nominal
    ts = np.array([g[2] for g in got])
    assert np.all(np.diff(ts) >= 0)
    assert before - 1.1e9 < ts[0] < before - 0.9e9 + 0.5e9
    assert abs((ts[-1] - ts[0]) - 3999 * 50_000) < 1_000_000  # scheduled 50 µs apart

    # rate limited into a ring nobody drains: drops are counted, like a live source
    ring2 = Ring(nslots=16)
    src2 = GeneratorSource(ring2, rate=100_000, count=2000).start()
    assert src2.join(5) and src2.finished
    st = src2.stats()
    assert st["frames_pushed"] == 16 and st["drops"] == 2000 - 16 == ring2.ctr[DROPS]


def test_generator_unbounded_wall_clock_stops() -> None:
    ring = Ring(nslots=1 << 12, snaplen=128)
    before = time.time_ns()
    src = GeneratorSource(ring, groups=10, sizes=(64, 64)).start()
    got = drain(ring, src, until=50_000)
    src.stop()
    assert src.join(2) and not src.finished
    ts = np.array([g[2] for g in got])
    assert np.all(np.diff(ts) >= 0) and before <= ts[0] <= time.time_ns()
    assert {g[1] for g in got} == {64}


# ---------------------------------------------------------------------------------------------------
# factory


def test_open_source_builds_each_type(tmp_path: Path) -> None:
    path = tmp_path / "f.pcap"
    write_classic(path, FRAMES[:3], TS_NS[:3], "<", True)
    ring = Ring(nslots=16)
    src = open_source(
        {"type": "pcap", "path": str(path), "mode": "paced", "loop": False, "progress": False}, ring
    )
    assert isinstance(src, PcapSource) and src.mode == "paced"
    src.close()
    gen = open_source({"type": "generator", "groups": 10, "sizes": [64, 128], "clock": "synthetic"}, ring)
    assert isinstance(gen, GeneratorSource) and not gen.live_clock


@pytest.mark.parametrize(
    "spec, msg",
    [
        ({"path": "x"}, "unknown type None"),
        ({"type": "kafka"}, "unknown type 'kafka'"),
        ({"type": "pcap"}, "missing required option"),
        ({"type": "pcap", "path": "x", "pace": True}, r"unknown option\(s\) \['pace'\]"),
        ({"type": "pcap", "path": "x", "mode": "slow"}, "mode must be"),
        ({"type": "generator", "clock": "atomic"}, "clock must be"),
        ({"type": "generator", "proto_mix": {"sctp": 1}}, "unknown protocols"),
        ({"type": "afpacket", "interfaces": "eth0"}, "list of names"),
        ({"type": "afpacket"}, "missing required option"),
    ],
)
def test_open_source_rejects_bad_specs(spec: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        open_source(spec, Ring(nslots=16))


# ---------------------------------------------------------------------------------------------------
# live capture (root only, inside a private network namespace)

SENDER = """
import socket, struct, sys
data = open(sys.argv[2], "rb").read()
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
pos = 0
while pos < len(data):
    (n,) = struct.unpack_from(">H", data, pos)
    s.send(data[pos + 2 : pos + 2 + n])
    pos += 2 + n
"""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def _can_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespace + AF_PACKET)"
    if shutil.which("ip") is None:
        return "needs the iproute2 'ip' command"
    return None


@pytest.mark.netns
def test_afpacket_captures_frames_sent_from_a_namespace(veth_pair, tmp_path: Path) -> None:
    ns, host, peer = veth_pair
    n = 300
    frames = []
    for i in range(n):
        # dst MAC is not the host end's: the host stack discards them (PACKET_OTHERHOST), nothing replies
        eth = Ether(src="02:00:00:cc:00:02", dst="02:00:00:cc:00:99")
        if i % 10 == 3:
            eth = eth / Dot1Q(vlan=42, prio=3)
        pkt = (
            eth
            / IP(src="10.203.77.2", dst="10.203.77.1")
            / UDP(sport=40000, dport=9)
            / Raw(struct.pack(">I", i) + b"lowwater" * (i % 150))
        )
        frames.append(bytes(pkt))
    blob = tmp_path / "frames.bin"
    blob.write_bytes(b"".join(struct.pack(">H", len(f)) + f for f in frames))

    ring = Ring(nslots=1024, snaplen=2048)
    src = AfPacketSource(ring, [host], promiscuous=True, block_size=1 << 16, block_count=8, iface_index=5)
    assert src.live_clock and src.interfaces == [host]
    src.start()
    try:
        time.sleep(0.05)
        before = time.time_ns()
        _run("ip", "netns", "exec", ns, sys.executable, "-c", SENDER, peer, str(blob))
        after = time.time_ns()
        got: list[tuple] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len([g for g in got if g[0][6:12] == frames[0][6:12]]) < n:
            got += drain(ring, src, timeout=0.2)
    finally:
        src.stop()
        assert src.join(10)  # returns as soon as the thread ends; a loaded machine may take seconds
    ours = [g for g in got if g[0][6:12] == frames[0][6:12]]
    assert len(ours) == n
    for k, (data, wl, ts, ifx) in enumerate(ours):
        assert data == frames[k], k
        assert wl == len(frames[k]) and ifx == 5
        assert before <= ts <= after + 100_000_000
    st = src.stats()
    assert st["frames_pushed"] >= n and st["drops"] == 0 and st["kernel_drops"] == 0
    assert st["kernel_packets"] >= n and src.error is None


@pytest.mark.netns
def test_afpacket_snaplen_and_errors(veth_pair, tmp_path: Path) -> None:
    ns, host, peer = veth_pair
    frame = bytes(
        Ether(src="02:00:00:cc:00:02", dst="02:00:00:cc:00:99")
        / IP(src="10.203.77.2", dst="10.203.77.1")
        / UDP(sport=40000, dport=9)
        / Raw(b"x" * 1000)
    )
    blob = tmp_path / "one.bin"
    blob.write_bytes((struct.pack(">H", len(frame)) + frame) * 3)
    ring = Ring(nslots=64, snaplen=128)
    src = AfPacketSource(ring, [host], frame_snaplen=96).start()
    try:
        time.sleep(0.05)
        _run("ip", "netns", "exec", ns, sys.executable, "-c", SENDER, peer, str(blob))
        got = drain(ring, src, timeout=2, until=3)
    finally:
        src.stop()
        src.join(2)
    assert len(got) == 3
    assert all(g[0] == frame[:96] and g[1] == len(frame) for g in got)

    with pytest.raises(ValueError, match="no such network interface"):
        AfPacketSource(Ring(nslots=16), ["lw-no-such-if"])


DROP_NET_RAW_AND_OPEN = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} x 2 words
assert libc.capget(hdr, data) == 0
CAP_NET_RAW = 13
for k in (0, 1, 2):  # word 0 of each triple holds capabilities 0..31
    data[k] &= ~(1 << CAP_NET_RAW)
assert libc.capset(hdr, data) == 0, ctypes.get_errno()
from low_level.capture.ring import Ring
from low_level.capture.sources.afpacket import AfPacketSource
try:
    AfPacketSource(Ring(nslots=16), ["lo"])
except PermissionError as e:
    print("PERM", e)
"""


def test_afpacket_without_privileges_is_a_permission_error() -> None:
    if os.geteuid() != 0:
        with pytest.raises(PermissionError, match="CAP_NET_RAW"):
            AfPacketSource(Ring(nslots=16), ["lo"])
        return
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-c", DROP_NET_RAW_AND_OPEN],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    if "PERM" not in res.stdout:
        pytest.skip(f"could not drop CAP_NET_RAW here: {(res.stdout + res.stderr).strip()[-300:]}")
    assert "needs root or the CAP_NET_RAW capability" in res.stdout


def _refcount_calls(fn, *args) -> int:
    """NRT incref/decref calls in the body of an uncached copy of a Numba function, typed from args."""
    import numba
    from numba import njit

    fresh = njit(nogil=True)(fn.py_func)
    sig = tuple(numba.typeof(a) for a in args)
    fresh.compile(sig)
    ir = fresh.inspect_llvm(sig)
    body = ir[ir.index("define") :]
    body = body[: body.index("\n}\n")]  # the function itself, not the CPython wrapper
    return body.count("@NRT_incref(") + body.count("@NRT_decref(")


def test_per_frame_source_helpers_have_no_refcount_calls() -> None:
    """ring_push and the pcap record emitter run once per frame: an atomic refcount pair per array there
    cut replay from 66 to 7 Mframes/s."""
    from low_level.capture.ring import ring_push
    from low_level.capture.sources.pcap.walk import _emit

    ring = Ring(16, snaplen=64)
    buf = np.zeros(128, np.uint8)
    i = np.int64(0)
    assert _refcount_calls(ring_push, ring.arrays(), buf, i, i, i, i, i) == 0
    scratch = np.zeros(512, np.uint8)
    assert _refcount_calls(_emit, buf, i, i, i, i, i, scratch, i, (i, True, True, i, 1.0), ring.arrays()) == 0
    # and it stays a call: Numba's IR inliner would rebind its seven arrays (the 7 Mframes/s version)
    assert _emit.targetoptions.get("inline", "never") == "never"


def test_afpacket_source_text_sets_the_kernel_ring_blocks_and_refuses_other_options() -> None:
    from low_level.cli import parse_source

    spec = parse_source("afpacket:eth1+eth2,promisc,blocks=2")
    assert spec == {"type": "afpacket", "interfaces": ["eth1", "eth2"], "promiscuous": True, "block_count": 2}
    assert "block_count" not in parse_source("afpacket:eth1")
    for bad in ("afpacket:eth1,blocks=0", "afpacket:eth1,blocks=x", "afpacket:eth1,snap=9"):
        with pytest.raises(ValueError, match="blocks=N"):
            parse_source(bad)
