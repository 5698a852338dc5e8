"""NetFlow v5 datagrams (a fixed header and fixed 48-byte records) -> weighted flow rows, in Numba."""

from __future__ import annotations

from numba import njit

from contract import fields as F
from low_level.flows.layout import (
    D_RATE,
    D_RECORDS,
    E_SHORT,
    E_V5_COUNT,
    KIND_NETFLOW,
    NS,
    heard,
    uint,
)


@njit(cache=True, nogil=True)
def v5(buf, p0, end, exporter, addr, doms, rows, w, rate_out, r, cap, errs):
    """A NetFlow v5 datagram (fixed 48-byte records); returns the records written."""
    if p0 + 24 > end:
        errs[E_SHORT] += 1
        return 0
    count = uint(buf, p0 + 2, 2)
    if count < 1 or count > 30 or p0 + 24 + count * 48 > end:
        errs[E_V5_COUNT] += 1
        return 0
    if r + count > cap:
        return -1
    uptime = uint(buf, p0 + 4, 4)
    clock = uint(buf, p0 + 8, 4) * NS + uint(buf, p0 + 12, 4)
    d = heard(doms, KIND_NETFLOW, exporter, uint(buf, p0 + 20, 1), 0, 0, clock, errs)
    if d < 0:
        return 0
    rate = uint(buf, p0 + 22, 2) & 0x3FFF  # the sampling interval (its top 2 bits: the mode)
    doms[d, D_RATE] = rate if rate > 0 else 1
    got = 0
    for i in range(count):
        q = p0 + 24 + i * 48
        pk = uint(buf, q + 16, 4)
        by = uint(buf, q + 20, 4)
        last = uint(buf, q + 28, 4)
        back = (uptime - last) & 0xFFFFFFFF
        if back >= 0x80000000:
            back -= 0x100000000
        k = r + got
        for c in range(F.NFIELDS):
            rows[k, c] = 0
        rows[k, F.TS] = clock - back * 1_000_000
        rows[k, F.IPVER] = 4
        rows[k, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | uint(buf, q, 4)
        rows[k, F.DST_LO] = F.IPV4_MAPPED_PREFIX | uint(buf, q + 4, 4)
        rows[k, F.IFACE] = uint(buf, q + 12, 2)
        rows[k, F.OUT_IFACE] = uint(buf, q + 14, 2)
        rows[k, F.NEXT_HOP] = uint(buf, q + 8, 4)
        rows[k, F.SRC_AS] = uint(buf, q + 40, 2)
        rows[k, F.DST_AS] = uint(buf, q + 42, 2)
        rows[k, F.EXPORTER] = addr
        rows[k, F.SAMPLING_RATE] = doms[d, D_RATE]
        rows[k, F.SPORT] = uint(buf, q + 32, 2)
        rows[k, F.DPORT] = uint(buf, q + 34, 2)
        rows[k, F.TCP_FLAGS] = uint(buf, q + 37, 1)
        rows[k, F.PROTO] = uint(buf, q + 38, 1)
        rows[k, F.TOS] = uint(buf, q + 39, 1)
        rows[k, F.LEN] = by * doms[d, D_RATE]
        w[k] = pk * doms[d, D_RATE]
        rate_out[k] = doms[d, D_RATE]
        got += 1
    doms[d, D_RECORDS] += got
    return got
