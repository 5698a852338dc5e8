"""Tests for low_level.kernel.parse: every field checked against dpkt's and scapy's view of crafted frames.

Frames are built offline with scapy (``bytes(pkt)``; nothing is sent). Truncation is exercised at every
cut length of several base frames, with the expected reason derived from the frame's layer layout.
"""

from __future__ import annotations

import socket

import dpkt
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit
from scapy.contrib.mpls import MPLS
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import (
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
)
from scapy.layers.l2 import ARP, GRE, Dot1Q, Ether
from scapy.layers.vxlan import VXLAN
from scapy.packet import NoPayload, Padding, Raw

from contract import fields as F
from low_level.kernel.parse import (
    ERR_BAD_IP_VERSION,
    ERR_BAD_IPV4_HEADER,
    ERR_NON_IP,
    ERR_TRUNCATED_ETHERNET,
    ERR_TRUNCATED_IPV4,
    ERR_TRUNCATED_IPV6,
    ERR_TRUNCATED_IPV6_EXT,
    ERR_TRUNCATED_L4,
    ERR_TRUNCATED_MPLS,
    ERR_TRUNCATED_VLAN,
    EXTRA_COLUMNS,
    NERR,
    PARSE_ERROR_NAMES,
    PARSE_OK,
    empty_outputs,
    frames_to_arrays,
    parse_batch,
    parse_frame_lean,
)
from lowwater_testing.frames import AH_TCP, BASE, MAC, V4A, V4B, V6A, V6B, eth

# ---------------------------------------------------------------- reference views


def dpkt_view(frame: bytes) -> dict[int, int]:
    """The fields as dpkt decodes them (the ground truth for complete frames)."""
    e = dpkt.ethernet.Ethernet(frame)
    tags = getattr(e, "vlan_tags", None)
    v: dict[int, int] = {F.VLAN: tags[0].id if tags else 0, F.SPORT: 0, F.DPORT: 0, F.TCP_FLAGS: 0}
    v[F.SRC_MAC], v[F.DST_MAC] = int.from_bytes(e.src, "big"), int.from_bytes(e.dst, "big")
    v[F.ETHERTYPE] = tags[-1].type if tags else e.type  # dpkt keeps the outer TPID in e.type
    v[F.TCP_WINDOW] = v[F.ICMP_TYPE] = v[F.ICMP_CODE] = -1
    labels = getattr(e, "mpls_labels", None)
    v[F.MPLS_LABEL] = labels[0].val if labels else -1
    ip = e.data
    if isinstance(ip, dpkt.ip.IP):
        v[F.IPVER], v[F.TOS], v[F.TTL], v[F.PROTO] = 4, ip.tos, ip.ttl, ip.p
        src, dst = socket.inet_ntop(socket.AF_INET, ip.src), socket.inet_ntop(socket.AF_INET, ip.dst)
        # dpkt leaves every fragment undecoded; decode the first fragment's L4 header ourselves.
        l4 = ip.data
        if ip.offset != 0:
            l4 = b""
        elif isinstance(l4, bytes) and ip.p in (6, 17):
            l4 = (dpkt.tcp.TCP if ip.p == 6 else dpkt.udp.UDP)(l4)
    elif isinstance(ip, dpkt.ip6.IP6):
        v[F.IPVER], v[F.TOS], v[F.TTL], v[F.PROTO] = 6, ip.fc, ip.hlim, ip.p
        src, dst = socket.inet_ntop(socket.AF_INET6, ip.src), socket.inet_ntop(socket.AF_INET6, ip.dst)
        l4 = ip.data
    else:
        raise AssertionError("not an IP frame")
    if isinstance(l4, dpkt.tcp.TCP | dpkt.udp.UDP):
        v[F.SPORT], v[F.DPORT] = l4.sport, l4.dport
    if isinstance(l4, dpkt.tcp.TCP):
        v[F.TCP_FLAGS], v[F.TCP_WINDOW] = l4.flags, l4.win
    if isinstance(l4, dpkt.icmp.ICMP | dpkt.icmp6.ICMP6):
        v[F.ICMP_TYPE], v[F.ICMP_CODE] = l4.type, l4.code
    v[F.INNER_IPVER] = v[F.INNER_SRC_HI] = v[F.INNER_SRC_LO] = v[F.INNER_DST_HI] = v[F.INNER_DST_LO] = 0
    inner = None
    if isinstance(l4, dpkt.gre.GRE):
        inner = l4.data
    elif isinstance(l4, dpkt.udp.UDP) and l4.dport == 4789:  # dpkt has no VXLAN: its 8 bytes, then Ethernet
        inner = dpkt.ethernet.Ethernet(l4.data[8:])
    if isinstance(inner, dpkt.ethernet.Ethernet):
        inner = inner.data
    if isinstance(inner, dpkt.ip.IP | dpkt.ip6.IP6):
        fam = socket.AF_INET if isinstance(inner, dpkt.ip.IP) else socket.AF_INET6
        v[F.INNER_IPVER] = 4 if fam == socket.AF_INET else 6
        v[F.INNER_SRC_HI], v[F.INNER_SRC_LO] = map(
            F.to_int64, F.ip_to_words(socket.inet_ntop(fam, inner.src))
        )
        v[F.INNER_DST_HI], v[F.INNER_DST_LO] = map(
            F.to_int64, F.ip_to_words(socket.inet_ntop(fam, inner.dst))
        )
    v[F.SRC_HI], v[F.SRC_LO] = map(F.to_int64, F.ip_to_words(src))
    v[F.DST_HI], v[F.DST_LO] = map(F.to_int64, F.ip_to_words(dst))
    return v


_V6_EXT = (IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment)


def scapy_view(frame: bytes) -> dict[int, int]:
    """The same fields as scapy dissects them (an independent second opinion)."""
    p = Ether(frame)
    first = p.payload
    v: dict[int, int] = {
        F.VLAN: first.vlan if isinstance(first, Dot1Q) else 0,
        F.SPORT: 0,
        F.DPORT: 0,
        F.TCP_FLAGS: 0,
        F.SRC_MAC: F.mac_to_int(p.src),
        F.DST_MAC: F.mac_to_int(p.dst),
        F.TCP_WINDOW: -1,
        F.ICMP_TYPE: -1,
        F.ICMP_CODE: -1,
    }
    inner = p.payload
    while isinstance(inner, Dot1Q):
        inner = inner.payload
    v[F.ETHERTYPE] = inner.underlayer.type
    v[F.MPLS_LABEL] = p[MPLS].label if MPLS in p else -1
    v[F.INNER_IPVER] = v[F.INNER_SRC_HI] = v[F.INNER_SRC_LO] = v[F.INNER_DST_HI] = v[F.INNER_DST_LO] = 0
    tunnel = p.getlayer(GRE) or p.getlayer(VXLAN)
    inner_ip = (tunnel.getlayer(IP) or tunnel.getlayer(IPv6)) if tunnel is not None else None
    if inner_ip is not None:
        v[F.INNER_IPVER] = inner_ip.version
        v[F.INNER_SRC_HI], v[F.INNER_SRC_LO] = map(F.to_int64, F.ip_to_words(inner_ip.src))
        v[F.INNER_DST_HI], v[F.INNER_DST_LO] = map(F.to_int64, F.ip_to_words(inner_ip.dst))
    ip = p.payload
    while not isinstance(ip, IP | IPv6):  # the outer IP header (a tunnel may hold the other family)
        ip = ip.payload
    if isinstance(ip, IP):
        v[F.IPVER], v[F.TOS], v[F.TTL], v[F.PROTO] = 4, ip.tos, ip.ttl, ip.proto
    else:
        v[F.IPVER], v[F.TOS], v[F.TTL] = 6, ip.tc, ip.hlim
        nh, layer = ip.nh, ip.payload
        while isinstance(layer, _V6_EXT):
            nh = layer.nh
            if isinstance(layer, IPv6ExtHdrFragment) and layer.offset != 0:
                break
            layer = layer.payload
        v[F.PROTO] = nh
    outer = p.copy()  # outer L4 only: the tunnel's payload has TCP/UDP/ICMP layers of its own
    if tunnel is not None:
        (outer.getlayer(GRE) or outer.getlayer(VXLAN)).remove_payload()
    for cls in (TCP, UDP):
        if cls in outer:
            v[F.SPORT], v[F.DPORT] = outer[cls].sport, outer[cls].dport
    if TCP in outer:
        v[F.TCP_FLAGS], v[F.TCP_WINDOW] = int(outer[TCP].flags), outer[TCP].window
    if ICMP in outer:
        v[F.ICMP_TYPE], v[F.ICMP_CODE] = outer[ICMP].type, outer[ICMP].code
    elif IPv6 in p and v[F.PROTO] == 58:
        icmp6 = p[IPv6].payload
        while isinstance(icmp6, _V6_EXT):
            icmp6 = icmp6.payload
        v[F.ICMP_TYPE], v[F.ICMP_CODE] = icmp6.type, icmp6.code
    v[F.SRC_HI], v[F.SRC_LO] = map(F.to_int64, F.ip_to_words(ip.src))
    v[F.DST_HI], v[F.DST_LO] = map(F.to_int64, F.ip_to_words(ip.dst))
    return v


# ---------------------------------------------------------------- helpers


def run(
    frames: list[bytes], wirelens: list[int] | None = None, ifaces: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """parse_batch over frames (caplen = len(frame)); returns (out, status, err_counts, ok)."""
    wl = wirelens or [len(f) for f in frames]
    data, offs, caps, wls, ts = frames_to_arrays(
        [(f, 1_000 + i, w) for i, (f, w) in enumerate(zip(frames, wl, strict=True))]
    )
    n = len(frames)
    ifs = np.array(ifaces if ifaces is not None else [3] * n, dtype=np.int64)
    out, status, errc = empty_outputs(n)
    ok = parse_batch(data, offs, caps, wls, ts, ifs, n, out, status, errc)
    assert ok + int(errc.sum()) == n
    assert ok == int((status == PARSE_OK).sum())
    return out, status, errc, ok


def parse_one(frame: bytes, wirelen: int | None = None) -> tuple[np.ndarray, int]:
    out, status, _, _ = run([frame], [wirelen if wirelen is not None else len(frame)])
    return out[0], int(status[0])


def names(status: np.ndarray) -> list[str]:
    return [PARSE_ERROR_NAMES[s] for s in status]


# ---------------------------------------------------------------- API / constants


def test_error_names_consistent() -> None:
    assert NERR == len(PARSE_ERROR_NAMES) == 11
    assert PARSE_ERROR_NAMES[PARSE_OK] == "ok"
    codes = {
        ERR_TRUNCATED_ETHERNET: "truncated_ethernet",
        ERR_TRUNCATED_VLAN: "truncated_vlan",
        ERR_TRUNCATED_IPV4: "truncated_ipv4",
        ERR_BAD_IPV4_HEADER: "bad_ipv4_header",
        ERR_TRUNCATED_IPV6: "truncated_ipv6",
        ERR_TRUNCATED_IPV6_EXT: "truncated_ipv6_ext",
        ERR_TRUNCATED_L4: "truncated_l4",
        ERR_NON_IP: "non_ip",
        ERR_BAD_IP_VERSION: "bad_ip_version",
        ERR_TRUNCATED_MPLS: "truncated_mpls",
    }
    for code, name in codes.items():
        assert PARSE_ERROR_NAMES[code] == name


def test_frames_to_arrays_layout() -> None:
    data, offs, caps, wls, ts = frames_to_arrays([(b"ab", 5, 60), (b"", 6, 0), (b"cde", 7, 99)])
    assert data.dtype == np.uint8 and data.flags.writeable and bytes(data) == b"abcde"
    assert offs.tolist() == [0, 2, 2] and caps.tolist() == [2, 0, 3]
    assert wls.tolist() == [60, 0, 99] and ts.tolist() == [5, 6, 7]
    assert all(a.dtype == np.int64 for a in (offs, caps, wls, ts))


# ---------------------------------------------------------------- complete frames vs dpkt and scapy


@pytest.mark.parametrize("name", sorted(BASE))
def test_fields_match_dpkt_and_scapy(name: str) -> None:
    frame = BASE[name]
    row, status = parse_one(frame, wirelen=len(frame) + 4)  # e.g. FCS stripped from the capture
    assert PARSE_ERROR_NAMES[status] == "ok"
    assert row[F.TS] == 1_000 and row[F.IFACE] == 3 and row[F.LEN] == len(frame) + 4
    ref = dpkt_view(frame)
    got = {k: int(row[k]) for k in ref}
    assert got == ref
    if name != "v6_ah_tcp":  # scapy leaves AH's payload undecoded
        assert got == scapy_view(frame)


def test_explicit_values() -> None:
    """A few fields spelled out, so a shared misreading by both references would still be caught."""
    row, _ = parse_one(BASE["v4_tcp_syn"])
    assert (
        F.words_to_ip(int(row[F.SRC_HI]), int(row[F.SRC_LO])) == V4A
        and F.words_to_ip(int(row[F.DST_HI]), int(row[F.DST_LO])) == V4B
    )
    assert (
        row[F.SPORT],
        row[F.DPORT],
        row[F.TCP_FLAGS],
        row[F.PROTO],
        row[F.TTL],
        row[F.TOS],
        row[F.IPVER],
    ) == (
        40000,
        443,
        2,
        6,
        17,
        0xB8,
        4,
    )
    assert row[F.SRC_HI] == 0 and row[F.SRC_LO] == 0xFFFF_0A01_0203
    row, _ = parse_one(BASE["v4_tcp_allflags"])
    assert row[F.TCP_FLAGS] == 255
    row, _ = parse_one(BASE["v6_tcp"])
    assert (
        F.words_to_ip(int(row[F.SRC_HI]), int(row[F.SRC_LO])) == V6A
        and F.words_to_ip(int(row[F.DST_HI]), int(row[F.DST_LO])) == V6B
    )
    assert row[F.DST_HI] < 0  # fe80:: high word: unsigned bit pattern in a signed int64
    assert (row[F.TOS], row[F.TTL], row[F.TCP_FLAGS], row[F.IPVER]) == (0xB8, 33, 2 | 64, 6)
    row, _ = parse_one(BASE["v4_qinq_ad"])
    assert row[F.VLAN] == 200
    row, _ = parse_one(BASE["v4_qinq_8100"])
    assert row[F.VLAN] == 4095
    row, _ = parse_one(BASE["v4_dot1q"])
    assert row[F.VLAN] == 100  # priority bits are not part of the id
    for n in ("v4_icmp", "v6_icmp"):  # ICMP: ports mean TCP/UDP only
        row, _ = parse_one(BASE[n])
        assert row[F.SPORT] == row[F.DPORT] == row[F.TCP_FLAGS] == 0
    row, _ = parse_one(BASE["v4_frag_nonfirst"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT]) == (17, 0, 0)
    row, _ = parse_one(BASE["v4_frag_first"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT]) == (17, 4000, 4001)
    row, _ = parse_one(BASE["v6_ext_chain_first"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT], row[F.TCP_FLAGS], row[F.TTL]) == (
        6,
        8080,
        9090,
        0x18,
        9,
    )
    row, _ = parse_one(BASE["v6_ext_chain_nonfirst"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT], row[F.TCP_FLAGS]) == (6, 0, 0, 0)
    row, _ = parse_one(BASE["v6_ah_tcp"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT], row[F.TCP_FLAGS]) == (6, 7000, 22, 16)
    row, _ = parse_one(BASE["v6_no_next"])
    assert (row[F.PROTO], row[F.SPORT], row[F.DPORT]) == (59, 0, 0)


def test_batch_mixed_with_offsets_and_ifaces() -> None:
    frames = [BASE[k] for k in sorted(BASE)]
    out, status, errc, ok = run(frames, ifaces=list(range(len(frames))))
    assert ok == len(frames) and errc.sum() == 0
    for i, f in enumerate(frames):
        assert out[i, F.IFACE] == i and out[i, F.TS] == 1_000 + i and out[i, F.LEN] == len(f)
        assert out[i, F.IPVER] == dpkt_view(f)[F.IPVER]


# ---------------------------------------------------------------- non-IP and malformed headers


def test_arp_is_non_ip() -> None:
    frame = bytes(eth() / ARP(psrc=V4A, pdst=V4B))
    row, status = parse_one(frame)
    assert status == ERR_NON_IP
    assert (
        row[F.IPVER] == 0
        and row[F.PROTO] == -1
        and row[F.SPORT] == row[F.DPORT] == 0
        and row[F.LEN] == len(frame)
    )
    row, status = parse_one(bytes(eth() / Dot1Q(vlan=12) / ARP()))
    assert status == ERR_NON_IP and row[F.VLAN] == 12


def test_too_many_vlan_tags_is_non_ip() -> None:
    frame = bytes(
        eth() / Dot1Q(vlan=1) / Dot1Q(vlan=2) / Dot1Q(vlan=3) / Dot1Q(vlan=4) / Dot1Q(vlan=5) / IP() / TCP()
    )
    row, status = parse_one(frame)
    assert status == ERR_NON_IP and row[F.VLAN] == 1
    frame4 = bytes(
        eth() / Dot1Q(vlan=1) / Dot1Q(vlan=2) / Dot1Q(vlan=3) / Dot1Q(vlan=4) / IP() / TCP(dport=7)
    )
    row, status = parse_one(frame4)
    assert status == PARSE_OK and row[F.VLAN] == 1 and row[F.DPORT] == 7


def _patch(frame: bytes, pos: int, value: bytes) -> bytes:
    return frame[:pos] + value + frame[pos + len(value) :]


def test_bad_ipv4_headers() -> None:
    f = BASE["v4_tcp_syn"]
    assert parse_one(_patch(f, 14, b"\x44"))[1] == ERR_BAD_IPV4_HEADER  # IHL 4 < 5
    assert parse_one(_patch(f, 14, b"\x40"))[1] == ERR_BAD_IPV4_HEADER  # IHL 0
    assert parse_one(_patch(f, 14, b"\x65"))[1] == ERR_BAD_IPV4_HEADER  # version 6 under ethertype 0x0800
    assert parse_one(_patch(f, 16, b"\x00\x13"))[1] == ERR_BAD_IPV4_HEADER  # total length 19 < 20
    # IHL 15 (60 bytes) and total length 60, but only 40 bytes captured after the Ethernet header
    assert parse_one(_patch(_patch(f, 14, b"\x4f"), 16, b"\x00\x3c"))[1] == ERR_TRUNCATED_IPV4


def test_ipv6_ethertype_with_wrong_version() -> None:
    frame = bytes(Ether(type=0x86DD, **MAC) / IP(src=V4A, dst=V4B) / TCP() / Raw(b"\x00" * 40))
    assert parse_one(frame)[1] == ERR_BAD_IP_VERSION


def test_ipv6_esp_and_unknown_protocols_have_no_ports() -> None:
    row, status = parse_one(bytes(eth() / IPv6(src=V6A, dst=V6B, nh=50) / Raw(b"\x00" * 16)))
    assert status == PARSE_OK and (row[F.PROTO], row[F.SPORT], row[F.DPORT]) == (50, 0, 0)
    row, status = parse_one(bytes(eth() / IP(src=V4A, dst=V4B, proto=132) / Raw(b"\x01\x02\x03\x04" * 4)))
    assert status == PARSE_OK and (row[F.PROTO], row[F.SPORT], row[F.DPORT]) == (132, 0, 0)


def test_ipv6_ext_walk_is_bounded() -> None:
    """More than MAX_IPV6_EXT destination-options headers: stops, reports the ext header as F.PROTO."""
    pkt = IPv6(src=V6A, dst=V6B)
    for _ in range(10):
        pkt = pkt / IPv6ExtHdrDestOpt()
    row, status = parse_one(bytes(eth() / pkt / UDP(sport=1, dport=2)))
    assert status == PARSE_OK and row[F.PROTO] == 60 and row[F.SPORT] == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00",
        b"\xff" * 13,
        b"\xff" * 14,
        b"\x00" * 60,
        b"\xff" * 200,
        bytes(range(256)),
        b"\x81\x00" * 40,
    ],
)
def test_garbage(frame: bytes) -> None:
    _, status, _, _ = run([frame])
    assert 0 <= status[0] < NERR


def test_cut_inside_ethernet_header() -> None:
    for c in range(14):
        assert parse_one(BASE["v4_tcp_syn"][:c])[1] == ERR_TRUNCATED_ETHERNET


def test_caplen_beyond_buffer_is_clamped() -> None:
    """A caller's caplen running past the buffer must not read out of bounds."""
    frame = BASE["v4_tcp_syn"]
    data = np.frombuffer(frame[:30], dtype=np.uint8).copy()
    out, status, errc = empty_outputs(1)
    one = np.ones(1, dtype=np.int64)
    ok = parse_batch(data, np.zeros(1, np.int64), one * 10_000, one * 54, one, one, 1, out, status, errc)
    assert ok == 0 and status[0] == ERR_TRUNCATED_IPV4


# ---------------------------------------------------------------- every cut length


_IP_LAYERS = (IP, IPv6)
_L4_MIN = {6: 20, 17: 8, 1: 4, 58: 4}  # fixed header bytes the parser needs for status OK


def _layout(frame: bytes) -> tuple[list[tuple[int, int]], int]:
    """[(end_offset, reason_if_cut_before_it)] from scapy's dissection, and the offset of the L3 header."""
    p = Ether(frame)
    bounds: list[tuple[int, int]] = [(14, ERR_TRUNCATED_ETHERNET)]
    pos, layer, proto, l3 = 14, p.payload, None, -1
    while not isinstance(layer, NoPayload | Raw | Padding):
        hl = len(bytes(layer)) - len(bytes(layer.payload))
        if isinstance(layer, Dot1Q):
            reason = ERR_TRUNCATED_VLAN
        elif isinstance(layer, MPLS):
            reason = ERR_TRUNCATED_MPLS
            if layer.s:  # the parser also needs one byte under the stack to tell IPv4 from IPv6
                bounds.append((pos + hl + 1, reason))
                pos += hl
                layer = layer.payload
                continue
        elif isinstance(layer, IP):
            reason, proto, l3 = ERR_TRUNCATED_IPV4, layer.proto, pos
            if layer.frag != 0:
                proto = None
        elif isinstance(layer, IPv6):
            reason, proto, l3 = ERR_TRUNCATED_IPV6, layer.nh, pos
        elif isinstance(layer, _V6_EXT):
            reason, proto = ERR_TRUNCATED_IPV6_EXT, layer.nh
            if isinstance(layer, IPv6ExtHdrFragment) and layer.offset != 0:
                proto = None
        else:
            break  # the L4 header
        bounds.append((pos + hl, reason))
        pos += hl
        layer = layer.payload
    if proto in _L4_MIN:
        bounds.append((pos + _L4_MIN[proto], ERR_TRUNCATED_L4))
    return bounds, l3


def _expected_cut(bounds: list[tuple[int, int]], cut: int) -> int:
    for end, reason in bounds:
        if cut < end:
            return reason
    return PARSE_OK


CUT_FRAMES = [
    "v4_tcp_syn",
    "v4_udp",
    "v4_icmp",
    "v4_options_max",
    "v4_frag_first",
    "v4_frag_nonfirst",
    "v4_qinq_ad",
    "v4_qinq_8100",
    "v6_tcp",
    "v6_icmp",
    "v6_dot1q_tcp",
    "v6_ext_chain_first",
    "v6_ext_chain_nonfirst",
    "v6_frag_nonfirst_off1",
    "v6_dstopt_udp",
    "v4_tcp_zero_window",
    "v4_icmp_unreach",
    "v6_icmp_unreach",
    "v6_dot1q_icmp",
    "mpls_v4_tcp",
    "mpls_v6_udp",
    "mpls_null_v4_icmp",
]
_L3_FIELDS = [
    F.IPVER,
    F.SRC_HI,
    F.SRC_LO,
    F.DST_HI,
    F.DST_LO,
    F.PROTO,
    F.TTL,
    F.TOS,
    F.VLAN,
    F.ETHERTYPE,
    F.SRC_MAC,
    F.DST_MAC,
    F.MPLS_LABEL,
]


@pytest.mark.parametrize("name", CUT_FRAMES)
def test_every_cut_length(name: str) -> None:
    """Cut at every length: right reason per layer; OK cuts equal the full parse; no reads past caplen."""
    frame = BASE[name]
    bounds, _ = _layout(frame)
    full, _ = parse_one(frame)
    cuts = list(range(len(frame) + 1))
    expected = [_expected_cut(bounds, c) for c in cuts]
    assert expected[-1] == PARSE_OK and ERR_TRUNCATED_ETHERNET in expected
    # Each cut frame is followed in the buffer by poison bytes: with caplen = cut they must not matter.
    outs = []
    for poison in (b"\x00", b"\xff"):
        data, offs, caps, wls, ts = frames_to_arrays(
            [(frame[:c] + poison * 64, 1_000, len(frame)) for c in cuts]
        )
        caps[:] = cuts
        n = len(cuts)
        out, status, errc = empty_outputs(n)
        ok = parse_batch(data, offs, caps, wls, ts, np.full(n, 3, np.int64), n, out, status, errc)
        assert ok + errc.sum() == n
        assert names(status) == [PARSE_ERROR_NAMES[e] for e in expected]
        outs.append(out)
    for c, e in zip(cuts, expected, strict=True):
        assert outs[0][c].tolist() == outs[1][c].tolist(), f"cut {c} depends on bytes past caplen"
        if e == PARSE_OK:
            assert outs[0][c].tolist() == full.tolist(), c
        elif e == ERR_TRUNCATED_L4:  # what was parsed is filled in
            assert outs[0][c][_L3_FIELDS].tolist() == full[_L3_FIELDS].tolist(), c


@pytest.mark.parametrize(
    "name",
    [
        "v4_tcp_zero_window",
        "v4_tcp_max_window",
        "v4_icmp_unreach",
        "v6_icmp_unreach",
        "v6_dot1q_icmp",
        "v4_dot1q",
    ],
)
def test_new_fields_at_every_cut(name: str) -> None:
    """MACs need the whole Ethernet header, F.ETHERTYPE every F.VLAN tag too; the TCP window and the ICMP
    type/code appear exactly when their own bytes are captured (also on truncated_l4), else -1."""
    frame = BASE[name]
    bounds, _ = _layout(frame)
    full, _ = parse_one(frame)
    l3_end = [end for end, reason in bounds if reason != ERR_TRUNCATED_L4][-1]
    vlan_end = max([14] + [end for end, reason in bounds if reason == ERR_TRUNCATED_VLAN])
    out, status, _, _ = run([frame[:c] for c in range(len(frame) + 1)])
    for c in range(len(frame) + 1):
        row = out[c]
        assert (row[F.SRC_MAC], row[F.DST_MAC]) == (
            (full[F.SRC_MAC], full[F.DST_MAC]) if c >= 14 else (0, 0)
        ), c
        assert row[F.ETHERTYPE] == (full[F.ETHERTYPE] if c >= vlan_end else 0), c
        tcp = full[F.PROTO] == 6
        assert row[F.TCP_WINDOW] == (full[F.TCP_WINDOW] if tcp and c >= l3_end + 16 else -1), c
        icmp = full[F.PROTO] in (1, 58)
        assert row[F.ICMP_TYPE] == (full[F.ICMP_TYPE] if icmp and c >= l3_end + 2 else -1), c
        assert row[F.ICMP_CODE] == (full[F.ICMP_CODE] if icmp and c >= l3_end + 2 else -1), c


def test_new_fields_explicit_values() -> None:
    """The newer fields spelled out, independent of dpkt and scapy."""
    row, _ = parse_one(BASE["v4_tcp_zero_window"])
    assert row[F.SRC_MAC] == 0xFEDC_BA98_7654 and row[F.DST_MAC] == 0xFFFF_FFFF_FFFF
    assert (
        F.int_to_mac(int(row[F.SRC_MAC])) == "fe:dc:ba:98:76:54"
        and F.mac_to_int("FF:ff:ff:ff:ff:ff") == row[F.DST_MAC]
    )
    assert (row[F.ETHERTYPE], row[F.TCP_WINDOW], row[F.ICMP_TYPE], row[F.ICMP_CODE]) == (0x0800, 0, -1, -1)
    row, _ = parse_one(BASE["v4_tcp_max_window"])
    assert row[F.TCP_WINDOW] == 65535
    row, _ = parse_one(BASE["v4_icmp_echo_reply"])
    assert (row[F.ICMP_TYPE], row[F.ICMP_CODE], row[F.TCP_WINDOW], row[F.SPORT]) == (0, 0, -1, 0)
    row, _ = parse_one(BASE["v4_icmp_unreach"])
    assert (row[F.ICMP_TYPE], row[F.ICMP_CODE]) == (3, 13) and row[F.DST_MAC] == 0x3CFD_FE01_0203
    row, _ = parse_one(BASE["v6_icmp_unreach"])
    assert (row[F.ICMP_TYPE], row[F.ICMP_CODE], row[F.ETHERTYPE]) == (1, 4, 0x86DD)
    row, _ = parse_one(BASE["v6_dot1q_icmp"])
    assert (row[F.ICMP_TYPE], row[F.ICMP_CODE], row[F.ETHERTYPE], row[F.VLAN]) == (128, 0, 0x86DD, 9)
    row, _ = parse_one(BASE["v4_udp"])
    assert (row[F.TCP_WINDOW], row[F.ICMP_TYPE], row[F.ICMP_CODE]) == (-1, -1, -1)
    row, _ = parse_one(BASE["v4_frag_nonfirst"])
    assert (row[F.TCP_WINDOW], row[F.ICMP_TYPE]) == (-1, -1)
    row, status = parse_one(bytes(eth() / Dot1Q(vlan=5) / ARP()))
    assert status == ERR_NON_IP and row[F.ETHERTYPE] == 0x0806 and row[F.SRC_MAC] == F.mac_to_int(MAC["src"])
    with pytest.raises(ValueError):
        F.mac_to_int("02:00:00:00:01")


def test_mpls_explicit_values_and_cuts() -> None:
    """Outer label of a stack, labels 0 and 2^20-1, F.VLAN + MPLS (which dpkt does not decode), too deep a
    stack and a pseudowire under it; F.MPLS_LABEL appears once the top entry is captured."""
    row, status = parse_one(BASE["mpls_v4_tcp"])
    assert status == PARSE_OK and (row[F.MPLS_LABEL], row[F.ETHERTYPE], row[F.TTL], row[F.DPORT]) == (
        16000,
        0x8847,
        7,
        40179,
    )
    row, _ = parse_one(BASE["mpls_v6_udp"])
    assert (row[F.MPLS_LABEL], row[F.IPVER], row[F.DPORT]) == (0xFFFFF, 6, 53)
    row, _ = parse_one(BASE["mpls_null_v4_icmp"])
    assert (row[F.MPLS_LABEL], row[F.ICMP_TYPE]) == (0, 11)
    row, _ = parse_one(BASE["v4_tcp_syn"])
    assert row[F.MPLS_LABEL] == -1
    row, status = parse_one(
        bytes(eth() / Dot1Q(vlan=30) / MPLS(label=77, s=1) / IP(src=V4A, dst=V4B) / UDP(dport=9))
    )
    assert status == PARSE_OK and (row[F.VLAN], row[F.MPLS_LABEL], row[F.ETHERTYPE], row[F.DPORT]) == (
        30,
        77,
        0x8847,
        9,
    )
    deep = eth()
    for i in range(9):
        deep = deep / MPLS(label=100 + i, s=int(i == 8))
    row, status = parse_one(bytes(deep / IP(src=V4A, dst=V4B) / TCP()))
    assert status == ERR_NON_IP and row[F.MPLS_LABEL] == 100 and row[F.IPVER] == 0
    pw = bytes(eth() / MPLS(label=5, s=1)) + b"\x00\x00\x00\x00" + bytes(eth() / IP() / TCP())  # control word
    row, status = parse_one(pw)
    assert status == ERR_NON_IP and row[F.MPLS_LABEL] == 5
    frame = BASE["mpls_v4_tcp"]
    out, status, _, _ = run([frame[:c] for c in range(len(frame) + 1)])
    assert [int(v) for v in out[:, F.MPLS_LABEL]] == [-1] * 18 + [16000] * (len(frame) - 17)
    assert names(status[14:23]) == ["truncated_mpls"] * 9 and names(status[23:24]) == ["truncated_ipv4"]


TUNNELS = [
    "gre_v4_in_v4",
    "gre_opts_v6_in_v4",
    "gre_v4_in_v6",
    "gre_teb_v4",
    "vxlan_v4",
    "vxlan_v6_vlan_in_v6",
]


@pytest.mark.parametrize("name", TUNNELS)
def test_inner_addresses_at_every_cut(name: str) -> None:
    """Inner fields appear exactly once the inner IP header's fixed part is captured; before that they
    are absent (0) and the status is whatever the outer headers give (a cut tunnel is not an error)."""
    frame = BASE[name]
    p = Ether(frame)
    tunnel = p[GRE] if GRE in p else p[VXLAN]
    inner_ip = tunnel.getlayer(IP) or tunnel.getlayer(IPv6)
    inner_end = len(frame) - len(bytes(inner_ip)) + (20 if inner_ip.version == 4 else 40)
    bounds, _ = _layout(frame)
    full, _ = parse_one(frame)
    assert full[F.INNER_IPVER] == inner_ip.version
    out, status, _, _ = run([frame[:c] for c in range(len(frame) + 1)])
    inner_cols = [F.INNER_IPVER, F.INNER_SRC_HI, F.INNER_SRC_LO, F.INNER_DST_HI, F.INNER_DST_LO]
    for c in range(len(frame) + 1):
        assert status[c] == _expected_cut(bounds, c), c
        want = full[inner_cols].tolist() if c >= inner_end else [0] * 5
        assert out[c][inner_cols].tolist() == want, c


def test_inner_explicit_values_and_non_tunnels() -> None:
    """Inner addresses spelled out; GRE version 1 (PPTP), a cut GRE payload, UDP 4789 without the I
    flag, and plain traffic have none."""
    row, _ = parse_one(BASE["gre_v4_in_v4"])
    assert (row[F.INNER_IPVER], F.words_to_ip(int(row[F.INNER_SRC_HI]), int(row[F.INNER_SRC_LO]))) == (
        4,
        "172.16.0.1",
    )
    assert (
        F.words_to_ip(int(row[F.INNER_DST_HI]), int(row[F.INNER_DST_LO])) == "172.16.9.9"
        and row[F.PROTO] == 47
    )
    row, _ = parse_one(BASE["gre_opts_v6_in_v4"])
    assert (row[F.INNER_IPVER], F.words_to_ip(int(row[F.INNER_DST_HI]), int(row[F.INNER_DST_LO]))) == (
        6,
        "fd00::ff",
    )
    row, _ = parse_one(BASE["vxlan_v6_vlan_in_v6"])
    assert F.words_to_ip(int(row[F.INNER_SRC_HI]), int(row[F.INNER_SRC_LO])) == "2001:db8:beef::7"
    assert (row[F.DPORT], row[F.VLAN], row[F.IPVER]) == (4789, 0, 6)  # outer fields stay the outer packet's
    for frame in (
        BASE["v4_gre"],
        BASE["v4_tcp_syn"],
        bytes(eth() / IP(src=V4A, dst=V4B, proto=47) / GRE(version=1) / IP(src="1.1.1.1", dst="2.2.2.2")),
        bytes(eth() / IP(src=V4A, dst=V4B) / UDP(dport=4789) / VXLAN(flags=0) / Ether() / IP(src="1.1.1.1")),
    ):
        row, status = parse_one(frame)
        assert (
            status == PARSE_OK
            and row[[F.INNER_IPVER, F.INNER_SRC_HI, F.INNER_SRC_LO, F.INNER_DST_HI, F.INNER_DST_LO]].tolist()
            == [0] * 5
        )


def test_every_cut_length_ah() -> None:
    """AH (length in 4-byte units, +2): scapy leaves its payload undecoded, so the layout is spelled out."""
    frame = BASE["v6_ah_tcp"]
    ah_end = 14 + 40 + len(AH_TCP)
    _, status, _, _ = run([frame[:c] for c in range(len(frame) + 1)])
    expected = {c: ERR_TRUNCATED_ETHERNET for c in range(14)}
    expected |= {c: ERR_TRUNCATED_IPV6 for c in range(14, 54)}
    expected |= {c: ERR_TRUNCATED_IPV6_EXT for c in range(54, ah_end)}
    expected |= {c: ERR_TRUNCATED_L4 for c in range(ah_end, ah_end + 20)}
    expected[len(frame)] = PARSE_OK
    assert len(frame) == ah_end + 20
    assert status.tolist() == [expected[c] for c in range(len(frame) + 1)]


def test_truncated_l4_fills_ports_when_present() -> None:
    frame = BASE["v4_tcp_syn"]
    row, status = parse_one(frame[: 14 + 20 + 14])  # ports and flags present, rest of TCP header cut
    assert status == ERR_TRUNCATED_L4 and (row[F.SPORT], row[F.DPORT], row[F.TCP_FLAGS]) == (40000, 443, 2)


# ---------------------------------------------------------------- pcap end to end


def test_pcap_end_to_end(tmp_path) -> None:
    names_ = sorted(BASE)
    frames = [BASE[k] for k in names_] + [bytes(eth() / ARP()), BASE["v4_udp"][:30]]
    path = tmp_path / "mixed.pcap"
    with open(path, "wb") as fh:
        w = dpkt.pcap.Writer(fh, nano=True, snaplen=65535)
        for i, f in enumerate(frames):
            w.writepkt(f, ts=1_700_000_000 + i + 0.5)
    with open(path, "rb") as fh:
        records = [(buf, int(ts * 10**9), len(buf)) for ts, buf in dpkt.pcap.Reader(fh)]
    assert [r[0] for r in records] == frames
    data, offs, caps, wls, ts = frames_to_arrays(records)
    n = len(records)
    out, status, errc = empty_outputs(n)
    ok = parse_batch(data, offs, caps, wls, ts, np.full(n, 2, np.int64), n, out, status, errc)
    assert ok == len(names_)
    assert errc[ERR_NON_IP] == 1 and errc[ERR_TRUNCATED_IPV4] == 1 and errc.sum() == 2
    for i, (buf, t, _) in enumerate(records[: len(names_)]):
        assert out[i, F.TS] == t == 1_700_000_000_500_000_000 + i * 1_000_000_000
        assert {k: int(out[i, k]) for k in dpkt_view(buf)} == dpkt_view(buf)
        assert out[i, F.IFACE] == 2


# ---------------------------------------------------------------- properties


_BASE_LIST = [BASE[k] for k in sorted(BASE)]
_HYP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_batch(frames: list[bytes], wirelens: list[int] | None = None) -> None:
    out, status, errc, ok = run(frames, wirelens)
    assert ((status >= 0) & (status < NERR)).all()
    assert out.shape == (len(frames), F.NFIELDS)


@_HYP
@given(st.lists(st.binary(max_size=160), max_size=8))
def test_random_bytes_never_crash(frames: list[bytes]) -> None:
    _check_batch(frames)


@_HYP
@given(
    st.lists(st.binary(min_size=0, max_size=120), min_size=1, max_size=4),
    st.sampled_from([b"\x08\x00", b"\x86\xdd", b"\x81\x00", b"\x88\xa8"]),
)
def test_random_payload_after_ip_ethertype(tails: list[bytes], et: bytes) -> None:
    """Random bytes behind an IP/F.VLAN ethertype reach the deep branches of the parser."""
    _check_batch([b"\x02" * 12 + et + t for t in tails])


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(_BASE_LIST)))
    for _ in range(draw(st.integers(0, 6))):
        pos = draw(st.integers(0, len(frame) - 1))
        frame[pos] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(frame)))
    return bytes(frame[:cut])


@_HYP
@given(st.lists(mutated_frames(), min_size=1, max_size=8), st.integers(0, 2000))
def test_mutated_truncated_frames_never_crash(frames: list[bytes], wirelen: int) -> None:
    _check_batch(frames, [wirelen] * len(frames))


# ---------------------------------------------------------------- performance guard


@njit(cache=True)
def _lean_batch(data, offsets, caplens, wirelens, ts, out, status):
    row = np.full(F.NFIELDS, -77, np.int64)  # columns the lean parser must not write keep this
    for i in range(offsets.shape[0]):
        row[:] = -77
        status[i] = parse_frame_lean(data, offsets[i], caplens[i], wirelens[i], ts[i], 3, row)
        out[i, :] = row


def test_lean_parser_differs_only_in_extra_columns() -> None:
    """Kernels whose queries read none of EXTRA_COLUMNS call parse_frame_lean: same status and same
    other columns as parse_frame on every base frame and every cut of it; the extra columns untouched."""
    frames = [f[:c] for f in _BASE_LIST for c in range(0, len(f) + 1, 3)]
    full, st_full, _, _ = run(frames)
    data, offs, caps, wls, ts = frames_to_arrays([(f, 1_000 + i, len(f)) for i, f in enumerate(frames)])
    lean, st_lean = np.zeros_like(full), np.zeros(len(frames), np.int64)
    _lean_batch(data, offs, caps, wls, ts, lean, st_lean)
    assert st_lean.tolist() == st_full.tolist()
    other = [k for k in range(F.NFIELDS) if k not in EXTRA_COLUMNS]
    assert lean[:, other].tolist() == full[:, other].tolist()
    assert (lean[:, list(EXTRA_COLUMNS)] == -77).all()
    assert set(EXTRA_COLUMNS) == {
        F.ETHERTYPE,
        F.SRC_MAC,
        F.DST_MAC,
        F.TCP_WINDOW,
        F.ICMP_TYPE,
        F.ICMP_CODE,
        F.MPLS_LABEL,
        F.INNER_IPVER,
        F.INNER_SRC_HI,
        F.INNER_SRC_LO,
        F.INNER_DST_HI,
        F.INNER_DST_LO,
        F.EXPORTER,  # flow-record columns: the full parser zeroes them for packets
        F.OUT_IFACE,
        F.NEXT_HOP,
        F.SRC_AS,
        F.DST_AS,
        F.SAMPLING_RATE,
    }
    zeroed = [F.EXPORTER, F.OUT_IFACE, F.NEXT_HOP, F.SRC_AS, F.DST_AS, F.SAMPLING_RATE]
    assert (full[:, zeroed] == 0).all()


@pytest.mark.parametrize("lean", [False, True])
def test_parse_frame_has_no_refcount_calls(lean: bool) -> None:
    """parse_frame must compile without NRT incref/decref (they cost ~3x throughput in the hot loop)."""
    from numba import njit, types

    from low_level.kernel.parse import parse_frame, parse_frame_lean

    fresh = njit(nogil=True)(
        (parse_frame_lean if lean else parse_frame).py_func
    )  # uncached copy, so its LLVM IR can be inspected
    sig = (
        types.uint8[::1],
        types.int64,
        types.int64,
        types.int64,
        types.int64,
        types.int64,
        types.int64[::1],
    )
    fresh.compile(sig)
    ir = fresh.inspect_llvm(sig)
    body = ir[ir.index("define") :]
    body = body[: body.index("\n}\n")]  # the parse_frame function itself, not the CPython wrapper
    assert "@NRT_incref(" not in body and "@NRT_decref(" not in body
