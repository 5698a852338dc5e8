"""Packet field catalog: the columns the low level's parser produces for every frame.

A parsed packet is a row of ``NFIELDS`` int64 values. IP addresses of both families live in one
128-bit space as two int64 words holding the unsigned bit pattern (high word, low word): IPv6 as is,
IPv4 as the IPv4-mapped address ``::ffff:a.b.c.d`` (high word 0, low word ``0xffff_0000_0000 | addr``).

Absent values: fields where 0 is meaningful say "absent" with -1 (TCP_WINDOW, ICMP_TYPE/CODE,
MPLS_LABEL, and PROTO without IP); the others use 0 (ports, VLAN, ETHERTYPE and MACs of a cut header,
the inner addresses with INNER_IPVER 0, which print as ``::`` and match no IPv4 prefix). MACs are
48-bit integers (result columns are int64; :func:`int_to_mac` formats one). Columns from ETHERTYPE on
are filled only by the full parser, which a host's kernel uses when one of its queries reads them
(``low_level.kernel.parse.EXTRA_COLUMNS``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

# Column indices of a parsed packet row. The numbers are part of the contract: kernels index by them.
TS = 0  # capture timestamp, ns since the Unix epoch
IPVER = 1  # 0 when the frame carries no IP packet, else 4 or 6
SRC_HI = 2
SRC_LO = 3
DST_HI = 4
DST_LO = 5
SPORT = 6  # 0 when absent (non-TCP/UDP, or an IPv4/IPv6 non-first fragment)
DPORT = 7
PROTO = 8  # IP protocol number (IPv6: the upper-layer header after the extension headers); -1 if no IP
LEN = 9  # original frame length on the wire, bytes
TCP_FLAGS = (
    10  # the TCP flags byte (FIN=1, SYN=2, RST=4, PSH=8, ACK=16, URG=32, ECE=64, CWR=128); 0 if not TCP
)
VLAN = 11  # outer 802.1Q VLAN id, 0 when untagged
TTL = 12  # IPv4 TTL or IPv6 hop limit
TOS = 13  # IPv4 TOS byte or IPv6 traffic class
IFACE = 14  # capture interface index within the host's configured interface list
ETHERTYPE = 15  # the ethertype after any VLAN tags (0x0800, 0x86dd, 0x0806, 0x8847 for MPLS ...); 0 if cut
SRC_MAC = 16  # Ethernet source address as a 48-bit unsigned int; 0 if the Ethernet header is cut
DST_MAC = 17
TCP_WINDOW = 18  # TCP window field (unscaled); -1 when not TCP or not captured (0 is a real zero window)
ICMP_TYPE = 19  # ICMP / ICMPv6 type; -1 when not ICMP (0 is echo reply)
ICMP_CODE = 20  # ICMP / ICMPv6 code; -1 when not ICMP
MPLS_LABEL = 21  # outer (top) MPLS label, 20 bits; -1 when the frame has no MPLS stack (label 0 is IPv4 null)
INNER_IPVER = 22  # 4 or 6: the IP header inside a GRE or VXLAN tunnel; 0 when there is none
INNER_SRC_HI = 23  # inner addresses, same 128-bit layout as SRC_HI..DST_LO; all 0 when INNER_IPVER is 0
INNER_SRC_LO = 24
INNER_DST_HI = 25
INNER_DST_LO = 26
# Flow-record identity (low_level.flows): who exported the record and what it says about routing. Packets
# get 0 in all of them (the full parser writes the zeros); IFACE is the record's input ifIndex.
EXPORTER = 27  # IPv4 address of the exporter as u32 (NetFlow/IPFIX: the datagram's source; sFlow: the agent)
OUT_IFACE = 28  # output ifIndex
NEXT_HOP = 29  # IPv4 next hop as u32
SRC_AS = 30  # source AS as the exporter reports it (the record's, not the networks file's)
DST_AS = 31
SAMPLING_RATE = 32  # the exporter's 1-in-N packet sampling rate applied to this record (1 = unsampled)
NFIELDS = 33

# Column holding the address family (4 / 6) of each address field's first column: group-by prefixes
# cut an address by its own header's family (an IPv4 tunnel may carry IPv6 and vice versa).
FAMILY_COLUMN = {SRC_HI: IPVER, DST_HI: IPVER, INNER_SRC_HI: INNER_IPVER, INNER_DST_HI: INNER_IPVER}

IPV4_MAPPED_PREFIX = 0xFFFF_0000_0000

# Enrichment fields (kind "enrich", see contract.networks): no parsed column of their own, but the
# longest-prefix match of an address in the networks file. Their group-by/filter source codes (packet
# columns are >= 0, contract.query's SRC_ONE -1 and SRC_DSCP -2) -> (the address's first column, the
# lookup table row to read: LPM_NET the net id, LPM_ASN the AS number).
LPM_NET, LPM_ASN = 2, 3
SRC_NET, DST_NET, SRC_ASN, DST_ASN = -3, -4, -5, -6
ENRICH_SOURCES: dict[int, tuple[int, int]] = {
    SRC_NET: (SRC_HI, LPM_NET),
    DST_NET: (DST_HI, LPM_NET),
    SRC_ASN: (SRC_HI, LPM_ASN),
    DST_ASN: (DST_HI, LPM_ASN),
}
ENRICH_FIELDS: dict[str, int] = {
    "src_net": SRC_NET,
    "dst_net": DST_NET,
    "src_asn": SRC_ASN,
    "dst_asn": DST_ASN,
}

TCP_FLAG_BITS = {"FIN": 1, "SYN": 2, "RST": 4, "PSH": 8, "ACK": 16, "URG": 32, "ECE": 64, "CWR": 128}
PROTOCOL_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "gre": 47, "esp": 50, "sctp": 132}


@dataclass(frozen=True)
class Field:
    """A field users can name in a filter or a group-by."""

    name: str
    kind: str  # "int" | "ip" | "time" | "enrich" (an int looked up from an address, contract.networks)
    columns: tuple[int, ...]  # parsed-packet columns it occupies (2 for an IP address)
    doc: str


def _f(name: str, kind: str, cols: tuple[int, ...], doc: str) -> Field:
    return Field(name, kind, cols, doc)


CATALOG: dict[str, Field] = {
    f.name: f
    for f in (
        _f("timestamp", "time", (TS,), "capture time (ns since the epoch)"),
        _f("ip_version", "int", (IPVER,), "4, 6, or 0 for non-IP frames"),
        _f("src_ip", "ip", (SRC_HI, SRC_LO), "source address, IPv4 or IPv6"),
        _f("dst_ip", "ip", (DST_HI, DST_LO), "destination address, IPv4 or IPv6"),
        _f("src_port", "int", (SPORT,), "TCP/UDP source port (0 if none)"),
        _f("dst_port", "int", (DPORT,), "TCP/UDP destination port (0 if none)"),
        _f("protocol", "int", (PROTO,), "IP protocol number"),
        _f("length", "int", (LEN,), "frame length on the wire, bytes"),
        _f("tcp_flags", "int", (TCP_FLAGS,), "TCP flags byte"),
        _f("vlan", "int", (VLAN,), "outer VLAN id (0 if untagged)"),
        _f("ttl", "int", (TTL,), "IPv4 TTL / IPv6 hop limit"),
        _f("tos", "int", (TOS,), "IPv4 TOS / IPv6 traffic class byte"),
        _f("dscp", "int", (TOS,), "DSCP = tos >> 2"),
        _f("interface", "int", (IFACE,), "capture interface index; a flow record's input ifIndex"),
        _f("in_iface", "int", (IFACE,), "alias of interface: a flow record's input ifIndex"),
        _f(
            "exporter",
            "int",
            (EXPORTER,),
            "flow exporter's IPv4 address as u32 (sFlow: agent); 0 for packets",
        ),
        _f("out_iface", "int", (OUT_IFACE,), "a flow record's output ifIndex (0 for packets)"),
        _f("next_hop", "int", (NEXT_HOP,), "a flow record's IPv4 next hop as u32 (0 for packets)"),
        _f("src_as", "int", (SRC_AS,), "source AS from the flow record (0 for packets or when absent)"),
        _f("dst_as", "int", (DST_AS,), "destination AS from the flow record (0 for packets or when absent)"),
        _f("sampling_rate", "int", (SAMPLING_RATE,), "a flow record's 1-in-N sampling rate (0 for packets)"),
        _f("ethertype", "int", (ETHERTYPE,), "ethertype after VLAN tags (0x0800 IPv4, 0x86dd IPv6, ...)"),
        _f("src_mac", "int", (SRC_MAC,), "Ethernet source address as a 48-bit integer (0x0200000000ff)"),
        _f("dst_mac", "int", (DST_MAC,), "Ethernet destination address as a 48-bit integer"),
        _f("tcp_window", "int", (TCP_WINDOW,), "TCP window field, unscaled (-1 if not TCP)"),
        _f("icmp_type", "int", (ICMP_TYPE,), "ICMP / ICMPv6 type (-1 if not ICMP)"),
        _f("icmp_code", "int", (ICMP_CODE,), "ICMP / ICMPv6 code (-1 if not ICMP)"),
        _f("mpls_label", "int", (MPLS_LABEL,), "outer MPLS label (-1 if no MPLS)"),
        _f("inner_ip_version", "int", (INNER_IPVER,), "4 / 6 inside a GRE or VXLAN tunnel, 0 if none"),
        _f("inner_src_ip", "ip", (INNER_SRC_HI, INNER_SRC_LO), "source address inside a GRE/VXLAN tunnel"),
        _f(
            "inner_dst_ip",
            "ip",
            (INNER_DST_HI, INNER_DST_LO),
            "destination address inside a GRE/VXLAN tunnel",
        ),
        _f("src_net", "enrich", (SRC_HI, SRC_LO), "id of the networks-file net holding src_ip (0 if none)"),
        _f("dst_net", "enrich", (DST_HI, DST_LO), "id of the networks-file net holding dst_ip (0 if none)"),
        _f(
            "src_asn",
            "enrich",
            (SRC_HI, SRC_LO),
            "AS number of the networks-file net holding src_ip (0 if none)",
        ),
        _f(
            "dst_asn",
            "enrich",
            (DST_HI, DST_LO),
            "AS number of the networks-file net holding dst_ip (0 if none)",
        ),
    )
}


def ip_to_words(text: str) -> tuple[int, int]:
    """An address as (high, low) unsigned 64-bit words in lowwater's 128-bit space."""
    addr = ipaddress.ip_address(text)
    if addr.version == 4:
        return 0, IPV4_MAPPED_PREFIX | int(addr)
    v = int(addr)
    return v >> 64, v & 0xFFFF_FFFF_FFFF_FFFF


def words_to_ip(hi: int, lo: int) -> str:
    """Inverse of :func:`ip_to_words` (accepts signed int64 bit patterns too)."""
    hi &= 0xFFFF_FFFF_FFFF_FFFF
    lo &= 0xFFFF_FFFF_FFFF_FFFF
    if hi == 0 and (lo >> 32) == 0xFFFF:
        return str(ipaddress.IPv4Address(lo & 0xFFFF_FFFF))
    return str(ipaddress.IPv6Address((hi << 64) | lo))


def mac_to_int(text: str) -> int:
    """``aa:bb:cc:dd:ee:ff`` -> the 48-bit integer the parser stores in SRC_MAC / DST_MAC (and filters compare)."""
    parts = text.split(":")
    if len(parts) != 6 or not all(len(x) == 2 for x in parts):
        raise ValueError(f"not a MAC address: {text!r}")
    return int("".join(parts), 16)


def int_to_mac(v: int) -> str:
    """Inverse of :func:`mac_to_int`, for printing a MAC column of results."""
    return ":".join(f"{(v >> s) & 0xFF:02x}" for s in range(40, -8, -8))


def to_int64(u: int) -> int:
    """Reinterpret an unsigned 64-bit value as the signed int64 the kernels store."""
    u &= 0xFFFF_FFFF_FFFF_FFFF
    return u - (1 << 64) if u >= (1 << 63) else u
