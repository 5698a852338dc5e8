"""The generator's traffic model: group tuples, protocol and answer kinds, and the kernels' parameter vector
with the checks that fill it from the options (``params``, ``answer_params``).

See ``low_level.capture.sources.generator`` for what the parameters mean.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

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
(
    G_SEED,
    G_GROUPS,
    G_ZIPF,
    G_SIZE_LO,
    G_SIZE_HI,
    G_TCP,
    G_UDP,
    G_SYN,
    G_V6,
    G_IFIDX,
    G_SNAP,
    G_CLOCK,
    G_START,
    G_PPS,
    G_SKEW,
    G_WAIT,
    G_REPLIES,
    G_ANSWER,
    G_LAT_MED,
    G_LAT_SIG,
    G_RETX,
    G_DUP,
) = range(22)
NG = 22
CLOCK_SYNTHETIC, CLOCK_GIVEN = 0, 1
# what a scheduled packet is (column 2 of the reply heap); 0 is an ordinary packet
K_SYNACK, K_DUP_SYNACK, K_RETX_SYN = 1, 2, 3
RTO_NS = (
    1_000_000_000  # RFC 6298's initial retransmission timeout: a lost SYN / SYN-ACK is sent again after 1 s
)
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


def params(
    groups: int,
    seed: int,
    snaplen: int,
    zipf: float,
    sizes: tuple[int, int],
    proto_mix: Mapping[str, float],
    syn_fraction: float,
    ipv6_fraction: float,
    start_ns: int,
    synthetic_pps: int,
    skew_ns: int,
    answers: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' parameter vector and group CDF (empty unless Zipf) for these options, checked."""
    if not 1 <= int(groups) <= MAX_GROUPS:
        raise ValueError(f"groups must be in [1, {MAX_GROUPS}], not {groups!r}")
    lo, hi = (int(v) for v in sizes)
    if not 14 <= lo <= hi <= 65535:
        raise ValueError(f"sizes must be (lo, hi) with 14 <= lo <= hi <= 65535, not {sizes!r}")
    unknown = set(proto_mix) - {"tcp", "udp", "icmp"}
    if unknown:
        raise ValueError(f"proto_mix: unknown protocols {sorted(unknown)} (use tcp, udp, icmp)")
    weights = [float(proto_mix.get(k, 0.0)) for k in ("tcp", "udp", "icmp")]
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"proto_mix weights must be >= 0 with a positive sum, not {dict(proto_mix)!r}")
    for name, frac in (("syn_fraction", syn_fraction), ("ipv6_fraction", ipv6_fraction)):
        if not 0.0 <= float(frac) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], not {frac!r}")
    if not zipf >= 0:
        raise ValueError(f"zipf must be >= 0, not {zipf!r}")
    if int(synthetic_pps) <= 0:
        raise ValueError(f"synthetic_pps must be > 0, not {synthetic_pps!r}")
    total = sum(weights)
    p = np.zeros(NG, dtype=np.int64)
    p[G_SEED] = int(seed) & 0x7FFF_FFFF_FFFF_FFFF
    p[G_GROUPS] = int(groups)
    p[G_ZIPF] = zipf > 0
    p[G_SIZE_LO], p[G_SIZE_HI] = lo, hi
    p[G_TCP] = round(65536 * weights[0] / total)
    p[G_UDP] = round(65536 * (weights[0] + weights[1]) / total)
    p[G_SYN] = round(65536 * float(syn_fraction))
    p[G_V6] = round(65536 * float(ipv6_fraction))
    p[G_SNAP] = int(snaplen)
    p[G_CLOCK] = CLOCK_SYNTHETIC
    p[G_START] = int(start_ns)
    p[G_PPS] = int(synthetic_pps)
    p[G_SKEW] = int(skew_ns)
    answer_params(p, dict(answers or {}))
    if zipf > 0:
        w = 1.0 / np.arange(1, int(groups) + 1, dtype=np.float64) ** float(zipf)
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
    else:
        cdf = np.zeros(1, dtype=np.float64)
    return p, cdf


DEFAULT_MIX = {"tcp": 0.8, "udp": 0.15, "icmp": 0.05}
ANSWER_DEFAULTS = {
    "synack_fraction": 0.0,
    "synack_latency_ms": 20.0,
    "synack_latency_sigma": 0.8,
    "syn_retransmit_fraction": 0.0,
    "synack_duplicate_fraction": 0.0,
}


def answer_params(p: np.ndarray, answers: dict[str, float]) -> None:
    """The server side of the SYNs (:data:`ANSWER_DEFAULTS`): off unless a fraction is > 0, so the
    packets of a run without them are exactly those of earlier versions."""
    unknown = set(answers) - set(ANSWER_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown answer option(s) {sorted(unknown)}; known: {sorted(ANSWER_DEFAULTS)}")
    a = {**ANSWER_DEFAULTS, **answers}
    for name in ("synack_fraction", "syn_retransmit_fraction", "synack_duplicate_fraction"):
        if not 0.0 <= float(a[name]) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], not {a[name]!r}")
    if not 0.0 < float(a["synack_latency_ms"]) <= 10_000.0:
        raise ValueError(
            f"synack_latency_ms (the median latency) must be in (0, 10000], not {a['synack_latency_ms']!r}"
        )
    if not 0.0 <= float(a["synack_latency_sigma"]) <= 5.0:
        raise ValueError(f"synack_latency_sigma must be in [0, 5], not {a['synack_latency_sigma']!r}")
    p[G_ANSWER] = round(65536 * float(a["synack_fraction"]))
    p[G_RETX] = round(65536 * float(a["syn_retransmit_fraction"]))
    p[G_DUP] = round(65536 * float(a["synack_duplicate_fraction"]))
    p[G_LAT_MED] = round(float(a["synack_latency_ms"]) * 1e6)
    p[G_LAT_SIG] = round(float(a["synack_latency_sigma"]) * 1e6)
    p[G_REPLIES] = p[G_ANSWER] > 0 or p[G_RETX] > 0
