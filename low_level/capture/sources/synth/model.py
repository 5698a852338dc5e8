"""The generator's traffic model: group tuples, the kernels' parameter vector, protocol and answer kinds.

See ``low_level.capture.sources.generator`` for what the parameters mean.
"""

from __future__ import annotations

import ipaddress

import numpy as np
from numba import njit

MAX_GROUPS = 1 << 24
DEFAULT_START_NS = 1_700_000_000 * 1_000_000_000  # 2023-11-14T22:13:20Z: synthetic runs are reproducible
DST_PORTS = np.array(
    [80, 443, 53, 22, 25, 123, 161, 3306, 5432, 6379, 8080, 8443, 9092, 11211, 27017, 993], dtype=np.int64
)
ETH_DST = bytes.fromhex("020000000002")  # a locally administered "gateway" MAC
ETH_DST_NB = np.frombuffer(ETH_DST, dtype=np.uint8).copy()
CHUNK = 8192

# int64 parameter vector of the kernels
(G_SEED, G_GROUPS, G_ZIPF, G_SIZE_LO, G_SIZE_HI, G_TCP, G_UDP, G_SYN, G_V6, G_IFIDX, G_SNAP, G_CLOCK,
 G_START, G_PPS, G_SKEW, G_WAIT, G_REPLIES, G_ANSWER, G_LAT_MED, G_LAT_SIG, G_RETX, G_DUP) = range(22)
NG = 22
CLOCK_SYNTHETIC, CLOCK_GIVEN = 0, 1
# what a scheduled packet is (column 2 of the reply heap); 0 is an ordinary packet
K_SYNACK, K_DUP_SYNACK, K_RETX_SYN = 1, 2, 3
RTO_NS = 1_000_000_000  # RFC 6298's initial retransmission timeout: a lost SYN / SYN-ACK is sent again after 1 s
LATENCY_MIN_NS, LATENCY_MAX_NS = 10_000, 60_000_000_000  # the lognormal latency, clipped to 10 us .. 60 s

PROTO_TCP, PROTO_UDP, PROTO_ICMP = 6, 17, 1


# ---------------------------------------------------------------------------------------------------
# groups


@njit(cache=True, nogil=True)
def group_tuple_nb(g: int) -> tuple[int, int, int]:
    """Numba twin of :func:`group_tuple`: (src IPv4 as uint32, dst IPv4 as uint32, dst port)."""
    g = np.int64(g)
    h = (g * np.int64(2654435761)) & np.int64(0xFFFFFFFF)
    src = np.int64(0x0A000000) | (g & np.int64(0xFFFFFF))
    dst = np.int64(0xAC100000) | (h & np.int64(0xFFFFF))
    port = DST_PORTS[(h >> 20) & 15]
    return src, dst, port


def group_tuple(g: int, ipv6: bool = False) -> tuple[str, str, int]:
    """The (src_ip, dst_ip, dst_port) of group ``g``: src = 10.0.0.0 + g, dst in 172.16.0.0/12.

    IPv6 packets of the group use ``fd00:a::<src as uint32>`` and ``fd00:ac10::<dst low 20 bits>``.
    """
    if not 0 <= g < MAX_GROUPS:
        raise ValueError(f"group {g} out of range [0, {MAX_GROUPS})")
    src, dst, port = group_tuple_nb(g)
    if ipv6:
        s6 = ipaddress.IPv6Address((0xFD00000A << 96) | int(src))
        d6 = ipaddress.IPv6Address((0xFD00AC10 << 96) | (int(dst) & 0xFFFFF))
        return str(s6), str(d6), int(port)
    return str(ipaddress.IPv4Address(int(src))), str(ipaddress.IPv4Address(int(dst))), int(port)

