"""A catalogue of crafted frames (scapy, offline: nothing is sent), one per layer layout the parser knows.

Every frame is a complete, valid IP frame; the parser tests cut them at every length and the fuzz test
starts from them.
"""

from __future__ import annotations

import struct

from scapy.contrib.mpls import MPLS
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import (
    ICMPv6DestUnreach,
    ICMPv6EchoRequest,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
    RouterAlert,
)
from scapy.layers.l2 import GRE, Dot1AD, Dot1Q, Ether
from scapy.layers.vxlan import VXLAN
from scapy.packet import Raw

MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
V4A, V4B = "10.1.2.3", "192.168.200.17"
V6A, V6B = "2001:db8:dead:beef::1", "fe80::8000:0:0:ff"  # high bits set in both words -> negative int64
AH_TCP = bytes([6, 4, 0, 0]) + struct.pack("!II", 0x1234, 7) + b"\xaa" * 12  # AH: nh=TCP, (4+2)*4 = 24 bytes


def eth() -> Ether:
    return Ether(**MAC)


def _ah_frame() -> bytes:
    return bytes(
        eth() / IPv6(src=V6A, dst=V6B, nh=51) / Raw(AH_TCP + bytes(TCP(sport=7000, dport=22, flags="A")))
    )


# name -> frame bytes; every one of these is a complete, valid IP frame (status OK).
BASE: dict[str, bytes] = {
    "v4_tcp_syn": bytes(
        eth() / IP(src=V4A, dst=V4B, ttl=17, tos=0xB8) / TCP(sport=40000, dport=443, flags="S")
    ),
    "v4_tcp_allflags": bytes(eth() / IP(src=V4B, dst=V4A) / TCP(sport=1, dport=65535, flags="FSRPAUEC")),
    "v4_tcp_payload": bytes(
        eth() / IP(src=V4A, dst=V4B) / TCP(sport=5, dport=6, flags="PA") / Raw(b"x" * 300)
    ),
    "v4_udp": bytes(eth() / IP(src=V4A, dst=V4B, ttl=1) / UDP(sport=5353, dport=53) / Raw(b"q" * 12)),
    "v4_icmp": bytes(eth() / IP(src=V4A, dst=V4B) / ICMP(type=8, code=0) / Raw(b"ping")),
    "v4_options": bytes(
        eth()
        / IP(src=V4A, dst=V4B, options=[IPOption_RR(routers=["1.2.3.4", "5.6.7.8"])])
        / UDP(sport=9, dport=10)
    ),
    "v4_options_max": bytes(
        eth()
        / IP(src=V4A, dst=V4B, options=[IPOption_RR(routers=[f"9.9.9.{i}" for i in range(9)])])
        / TCP(sport=11, dport=12, flags="R")
    ),
    "v4_frag_first": bytes(
        eth() / IP(src=V4A, dst=V4B, flags="MF", frag=0, id=99) / UDP(sport=4000, dport=4001) / Raw(b"a" * 40)
    ),
    "v4_frag_nonfirst": bytes(eth() / IP(src=V4A, dst=V4B, frag=6, id=99, proto=17) / Raw(b"a" * 40)),
    "v4_frag_nonfirst_tiny": bytes(
        eth() / IP(src=V4A, dst=V4B, frag=1, proto=6)
    ),  # no payload at all, still OK
    "v4_df_tcp": bytes(eth() / IP(src=V4A, dst=V4B, flags="DF") / TCP(sport=22, dport=50022, flags="PA")),
    "v4_gre": bytes(eth() / IP(src=V4A, dst=V4B, proto=47) / Raw(b"\x00\x00\x08\x00")),
    "v4_dot1q": bytes(
        eth() / Dot1Q(vlan=100, prio=5) / IP(src=V4A, dst=V4B) / TCP(sport=80, dport=1025, flags="SA")
    ),
    "v4_qinq_ad": bytes(
        eth() / Dot1AD(vlan=200) / Dot1Q(vlan=300) / IP(src=V4A, dst=V4B) / UDP(sport=67, dport=68)
    ),
    "v4_qinq_8100": bytes(
        eth() / Dot1Q(vlan=4095) / Dot1Q(vlan=7) / IP(src=V4B, dst=V4A) / TCP(sport=2, dport=3, flags="F")
    ),
    "v6_tcp": bytes(
        eth() / IPv6(src=V6A, dst=V6B, tc=0xB8, hlim=33) / TCP(sport=50000, dport=443, flags="SE")
    ),
    "v6_udp": bytes(
        eth() / IPv6(src=V6B, dst=V6A, hlim=255, tc=1) / UDP(sport=546, dport=547) / Raw(b"d" * 20)
    ),
    "v6_icmp": bytes(eth() / IPv6(src=V6A, dst=V6B) / ICMPv6EchoRequest(id=1, seq=2)),
    "v6_dot1q_tcp": bytes(
        eth() / Dot1Q(vlan=42) / IPv6(src=V6A, dst=V6B) / TCP(sport=1234, dport=5678, flags="A")
    ),
    "v6_ext_chain_first": bytes(
        eth()
        / IPv6(src=V6A, dst=V6B, hlim=9)
        / IPv6ExtHdrHopByHop(options=[RouterAlert()])
        / IPv6ExtHdrRouting(addresses=["2001:db8::1", "2001:db8::2"])
        / IPv6ExtHdrDestOpt()
        / IPv6ExtHdrFragment(offset=0, m=1, id=77)
        / TCP(sport=8080, dport=9090, flags="PA")
        / Raw(b"z" * 16)
    ),
    "v6_ext_chain_nonfirst": bytes(
        eth()
        / IPv6(src=V6A, dst=V6B)
        / IPv6ExtHdrHopByHop()
        / IPv6ExtHdrRouting(addresses=["2001:db8::1"])
        / IPv6ExtHdrDestOpt()
        / IPv6ExtHdrFragment(offset=100, m=0, id=77, nh=6)
        / Raw(b"\x01\x02\x03\x04" * 8)  # would look like ports if wrongly parsed
    ),
    "v6_frag_nonfirst_off1": bytes(
        eth() / IPv6(src=V6A, dst=V6B) / IPv6ExtHdrFragment(offset=1, m=1, nh=17) / Raw(b"\x00\x35" * 8)
    ),
    "v6_frag_udp_first": bytes(
        eth()
        / IPv6(src=V6A, dst=V6B)
        / IPv6ExtHdrFragment(offset=0, m=1)
        / UDP(sport=1111, dport=2222)
        / Raw(b"u" * 32)
    ),
    "v6_ah_tcp": _ah_frame(),
    "v6_no_next": bytes(eth() / IPv6(src=V6A, dst=V6B, nh=59) / Raw(b"\x00" * 8)),
    "v6_dstopt_udp": bytes(eth() / IPv6(src=V6A, dst=V6B) / IPv6ExtHdrDestOpt() / UDP(sport=3, dport=4)),
    # the newer fields: MACs with the top bit set, zero / full TCP windows, ICMP type 0 and code != 0
    "v4_tcp_zero_window": bytes(
        Ether(src="fe:dc:ba:98:76:54", dst="ff:ff:ff:ff:ff:ff")
        / IP(src=V4A, dst=V4B)
        / TCP(sport=80, dport=5000, flags="A", window=0)
    ),
    "v4_tcp_max_window": bytes(
        eth() / IP(src=V4A, dst=V4B) / TCP(sport=81, dport=5001, flags="A", window=65535)
    ),
    "v4_icmp_echo_reply": bytes(eth() / IP(src=V4B, dst=V4A) / ICMP(type=0, code=0) / Raw(b"pong")),
    "v4_icmp_unreach": bytes(
        Ether(src="00:1b:21:0a:0b:0c", dst="3c:fd:fe:01:02:03") / IP(src=V4B, dst=V4A) / ICMP(type=3, code=13)
    ),
    "v6_icmp_unreach": bytes(eth() / IPv6(src=V6B, dst=V6A) / ICMPv6DestUnreach(code=4) / Raw(b"\x00" * 8)),
    "mpls_v4_tcp": bytes(
        eth()
        / MPLS(label=16000, s=0, ttl=64)
        / MPLS(label=3, s=1, ttl=64)
        / IP(src=V4A, dst=V4B, ttl=7)
        / TCP(sport=179, dport=40179, flags="PA", window=1000)
    ),
    "mpls_v6_udp": bytes(
        eth() / MPLS(label=0xFFFFF, s=1) / IPv6(src=V6A, dst=V6B) / UDP(sport=4000, dport=53) / Raw(b"m" * 8)
    ),
    "mpls_null_v4_icmp": bytes(eth() / MPLS(label=0, s=1) / IP(src=V4B, dst=V4A) / ICMP(type=11, code=0)),
    # tunnels: inner addresses (GRE with every optional word, GRE over IPv6, NVGRE-style Ethernet, VXLAN)
    "gre_v4_in_v4": bytes(
        eth() / IP(src=V4A, dst=V4B, proto=47) / GRE() / IP(src="172.16.0.1", dst="172.16.9.9") / UDP(dport=7)
    ),
    "gre_opts_v6_in_v4": bytes(
        eth()
        / IP(src=V4A, dst=V4B, proto=47)
        / GRE(chksum_present=1, key_present=1, key=0xABCD, seqnum_present=1, sequence_number=5)
        / IPv6(src="2001:db8:a::1", dst="fd00::ff")
        / TCP(sport=1, dport=2)
    ),
    "gre_v4_in_v6": bytes(
        eth() / IPv6(src=V6A, dst=V6B, nh=47) / GRE() / IP(src="100.64.0.5", dst="8.8.8.8") / ICMP()
    ),
    "gre_teb_v4": bytes(
        eth()
        / IP(src=V4A, dst=V4B, proto=47)
        / GRE(proto=0x6558)
        / Ether(src="0a:00:00:00:00:01", dst="0a:00:00:00:00:02")
        / IP(src="192.0.2.1", dst="192.0.2.2")
        / UDP()
    ),
    "vxlan_v4": bytes(
        eth()
        / IP(src=V4A, dst=V4B)
        / UDP(sport=51000, dport=4789)
        / VXLAN(flags=0x08, vni=4242)
        / Ether(src="0a:00:00:00:00:03", dst="0a:00:00:00:00:04")
        / IP(src="10.200.0.1", dst="10.200.0.2")
        / TCP(sport=3, dport=4)
    ),
    "vxlan_v6_vlan_in_v6": bytes(
        eth()
        / IPv6(src=V6A, dst=V6B)
        / UDP(sport=51001, dport=4789)
        / VXLAN(flags=0x08, vni=1)
        / Ether(src="0a:00:00:00:00:05", dst="0a:00:00:00:00:06")
        / Dot1Q(vlan=77)
        / IPv6(src="2001:db8:beef::7", dst="2001:db8:beef::8")
        / UDP(sport=5, dport=6)
    ),
    "v6_dot1q_icmp": bytes(eth() / Dot1Q(vlan=9) / IPv6(src=V6A, dst=V6B) / ICMPv6EchoRequest(id=3, seq=4)),
}
