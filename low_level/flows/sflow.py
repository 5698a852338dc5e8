"""sFlow v5 datagrams -> weighted flow rows and interface counters, in Numba.

A flow sample's raw header is parsed like a captured frame (``low_level.kernel.parse``) and weighted by
its sampling rate; a counter sample's generic interface counters (0:1) become a counter row. sFlow
carries no time: samples are timed by their datagram's arrival.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from low_level.flows import layout as L
from low_level.flows.layout import heard, uint
from low_level.kernel.parse import parse_frame

SFLOW_MAX_SAMPLES = 4096  # per datagram; more than fits in 64 KiB is malformed


@njit(cache=True, nogil=True)
def _record(buf, q, send):
    """The flow or counter record at q (format, length, data): (format, data start, next record), the
    next -1 when it overruns its sample."""
    if q + 8 > send:
        return np.int64(0), np.int64(0), np.int64(-1)
    d = q + 8
    nq = d + uint(buf, q + 4, 4)
    return uint(buf, q, 4), d, nq if nq <= send else np.int64(-1)


@njit(cache=True, nogil=True)
def _sflow_flow(buf, q, send, expanded, arrival, agent, row, rows, w, rate_out, r, errs):
    """One sFlow flow sample (compact 0:1 or expanded 0:3) at q; returns 1 when a row was written."""
    if expanded:
        if q + 44 > send:
            errs[L.E_SF_SAMPLE] += 1
            return 0
        rate = uint(buf, q + 12, 4)
        in_if = uint(buf, q + 28, 4)
        out_if = uint(buf, q + 36, 4) if uint(buf, q + 32, 4) == 0 else 0
        nrec = uint(buf, q + 40, 4)
        q += 44
    else:
        if q + 32 > send:
            errs[L.E_SF_SAMPLE] += 1
            return 0
        rate = uint(buf, q + 8, 4)
        in_if = uint(buf, q + 20, 4) & 0x3FFFFFFF  # top 2 bits: the format (0 = an ifIndex)
        out_if = uint(buf, q + 24, 4)
        out_if = out_if if out_if >> 30 == 0 else 0
        nrec = uint(buf, q + 28, 4)
        q += 32
    if rate < 1:
        rate = 1
    got = 0
    next_hop = np.int64(0)
    src_as = np.int64(0)
    dst_as = np.int64(0)
    for _ in range(nrec):
        fmt, d, q = _record(buf, q, send)
        if q < 0:
            errs[L.E_SF_SAMPLE] += 1
            return 0
        rlen = q - d
        if fmt == 1 and got == 0 and rlen >= 16:  # raw packet header
            proto = uint(buf, d, 4)
            frame_len = uint(buf, d + 4, 4)
            hlen = uint(buf, d + 12, 4)
            if hlen > rlen - 16:
                errs[L.E_SF_SAMPLE] += 1
                return 0
            if proto != 1:
                errs[L.E_SF_HEADER_PROTO] += 1
                return 0
            parse_frame(buf, d + 16, hlen, frame_len, arrival, in_if, row)
            for k in range(F.NFIELDS):
                rows[r, k] = row[k]
            rows[r, F.LEN] = frame_len * rate
            w[r] = rate
            rate_out[r] = rate
            got = 1
        elif (fmt == 1002 or fmt == 1003) and rlen >= 8 and uint(buf, d, 4) == 1:
            next_hop = uint(buf, d + 4, 4)  # extended router / gateway data: an IPv4 next hop first
            if fmt == 1003 and rlen >= 24:  # then router AS, src AS, src peer AS, the AS path to dst
                src_as = uint(buf, d + 12, 4)
                dst_as = _sflow_path_end(buf, d + 20, q)
    if got == 0:
        errs[L.E_SF_NO_HEADER] += 1
    else:
        rows[r, F.EXPORTER] = agent
        rows[r, F.OUT_IFACE] = out_if
        rows[r, F.NEXT_HOP] = next_hop
        rows[r, F.SRC_AS] = src_as
        rows[r, F.DST_AS] = dst_as
        rows[r, F.SAMPLING_RATE] = rate
    return got


@njit(cache=True, nogil=True)
def _sflow_path_end(buf, p, end):
    """The last AS of an extended-gateway AS path (segments of type, count, ASes) at p; 0 if none."""
    if p + 4 > end:
        return np.int64(0)
    nseg = uint(buf, p, 4)
    p += 4
    last = np.int64(0)
    for _ in range(min(nseg, 64)):
        if p + 8 > end:
            return np.int64(0)
        n = uint(buf, p + 4, 4)
        p += 8
        if n > 0:
            if p + 4 * n > end:
                return np.int64(0)
            last = uint(buf, p + 4 * (n - 1), 4)
        p += 4 * n
    return last


@njit(cache=True, nogil=True)
def _sflow_counters(buf, q, send, expanded, arrival, d, ctrs, c, errs):
    """An sFlow counter sample (0:2 or 0:4): its generic interface counters (0:1) into ctrs[c]."""
    nq = q + (16 if expanded else 12)
    if nq > send:
        errs[L.E_SF_SAMPLE] += 1
        return 0
    nrec = uint(buf, nq - 4, 4)
    q = nq
    got = 0
    for _ in range(nrec):
        fmt, p, q = _record(buf, q, send)
        if q < 0:
            errs[L.E_SF_SAMPLE] += 1
            return got
        rlen = q - p
        if fmt == 1 and rlen >= 88 and got == 0 and c < ctrs.shape[0]:
            ctrs[c, L.C_TS] = arrival
            ctrs[c, L.C_DOM] = d
            ctrs[c, L.C_IFINDEX] = uint(buf, p, 4)
            ctrs[c, L.C_SPEED] = uint(buf, p + 8, 8)
            ctrs[c, L.C_STATUS] = uint(buf, p + 20, 4)
            ctrs[c, L.C_IN_OCTETS] = uint(buf, p + 24, 8)
            ctrs[c, L.C_IN_PKTS] = uint(buf, p + 32, 4) + uint(buf, p + 36, 4) + uint(buf, p + 40, 4)
            ctrs[c, L.C_IN_DISCARDS] = uint(buf, p + 44, 4)
            ctrs[c, L.C_IN_ERRORS] = uint(buf, p + 48, 4)
            ctrs[c, L.C_OUT_OCTETS] = uint(buf, p + 56, 8)
            ctrs[c, L.C_OUT_PKTS] = uint(buf, p + 64, 4) + uint(buf, p + 68, 4) + uint(buf, p + 72, 4)
            ctrs[c, L.C_OUT_DISCARDS] = uint(buf, p + 76, 4)
            ctrs[c, L.C_OUT_ERRORS] = uint(buf, p + 80, 4)
            got = 1
    return got


@njit(cache=True, nogil=True)
def sflow(buf, p0, end, exporter, arrival, doms, row, rows, w, rate_out, r, cap, ctrs, res, errs):
    """An sFlow v5 datagram: a row per flow sample (its header parsed like a captured frame, weighted by
    the sampling rate), a counter row per interface counter sample. Returns the rows written, -1 when
    rows or ctrs might not hold this datagram (call again); res[3] says whether it was read whole."""
    res[3] = 1
    if p0 + 12 > end:
        errs[L.E_SHORT] += 1
        return 0
    atype = uint(buf, p0 + 4, 4)
    agent = np.int64(0)  # the exporter field: an IPv4 agent's address, 0 for an IPv6 agent
    if atype == 1:
        hi = np.int64(0)
        agent = uint(buf, p0 + 8, 4)
        lo = F.IPV4_MAPPED_PREFIX | agent
        p = p0 + 12
    elif atype == 2:
        if p0 + 24 > end:
            errs[L.E_SHORT] += 1
            return 0
        hi = uint(buf, p0 + 8, 8)
        lo = uint(buf, p0 + 16, 8)
        p = p0 + 24
    else:
        errs[L.E_SF_SAMPLE] += 1
        return 0
    if p + 16 > end:
        errs[L.E_SHORT] += 1
        return 0
    sub = uint(buf, p, 4)
    nsamples = uint(buf, p + 12, 4)
    p += 16
    if nsamples > SFLOW_MAX_SAMPLES:
        errs[L.E_SF_SAMPLE] += 1
        return 0
    if r + nsamples > cap or res[2] + nsamples > ctrs.shape[0]:
        return -1
    d = heard(doms, L.KIND_SFLOW, exporter, sub, hi, lo, arrival, errs)
    if d < 0:
        return 0
    got = 0
    bad = False
    for _ in range(nsamples):
        if p + 8 > end:
            errs[L.E_SHORT] += 1
            bad = True
            break
        fmt = uint(buf, p, 4)
        slen = uint(buf, p + 4, 4)
        q = p + 8
        send = q + slen
        if send > end:
            errs[L.E_SF_SAMPLE] += 1
            bad = True
            break
        if fmt == 1 or fmt == 3:
            if (
                _sflow_flow(buf, q, send, fmt == 3, arrival, agent, row, rows, w, rate_out, r + got, errs)
                == 1
            ):
                doms[d, L.D_RATE] = rate_out[r + got]  # the source's latest rate, for stats
                got += 1
        elif fmt == 2 or fmt == 4:
            res[2] += _sflow_counters(buf, q, send, fmt == 4, arrival, d, ctrs, res[2], errs)
        else:
            errs[L.E_SF_UNKNOWN] += 1
        p = send
    doms[d, L.D_RECORDS] += got
    res[3] = 1 if bad else 0  # the rows before a bad sample stand; the datagram is not counted ok
    return got
