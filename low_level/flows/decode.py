"""NetFlow v5, v9 and IPFIX datagrams -> weighted flow rows, in Numba (no Python loop per record).

A flow record becomes one parsed-packet row (``contract.fields`` layout) plus a weight, so it enters
the same sub-aggregation as packets (``low_level.flows.kernel``): ``count`` adds the record's packets
(the weight), ``sum(length)`` its bytes (the row's LEN), both multiplied by the exporter's sampling
rate. TS is the record's **end** time: a record is complete only when the exporter sends it, its end
is the last moment it covers, and the exporter's clock minus its inactive timeout bounds how old the
end time of any record still to come can be (``low_level.flowmark``); spreading a record over its
duration would need the start time to be trustworthy and would put one record's bytes in panes whose
low-water mark may already have passed.

Templates (v9 and IPFIX) are kept per (exporter, observation domain / source id, template id) in one
int64 array: each one compiled to the byte offset and length of every information element lowwater
reads, so a data record is decoded with a few fixed loads. A template expires when its exporter's
clock (the export time of its datagrams) is ``template_timeout_s`` past its last definition; an IPFIX
withdrawal (field count 0) removes it. Options records carry the sampling rate (v9 SAMPLING_INTERVAL
34, IPFIX samplingInterval 34, samplingPacketInterval/Space 305/306, sampler random interval 50) and
IPFIX systemInitTimeMilliseconds (160), both kept per (exporter, domain).

Bad input never raises: a datagram or set that cannot be read is counted under one of
``FLOW_ERROR_NAMES`` and skipped (the rest of the datagram is still read when its framing is intact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from low_level.jit.refcount import pin
from low_level.kernel.parse import parse_frame

# error / event counters (index into FLOW_ERROR_NAMES)
E_OK, E_SHORT, E_VERSION, E_SET_LENGTH, E_UNKNOWN_TEMPLATE, E_BAD_TEMPLATE, E_TABLE_FULL = 0, 1, 2, 3, 4, 5, 6
E_V5_COUNT, E_EXPIRED, E_NO_END_TIME, E_ABSURD = 7, 8, 9, 10
E_SF_SAMPLE, E_SF_NO_HEADER, E_SF_HEADER_PROTO, E_SF_UNKNOWN = 11, 12, 13, 14
FLOW_ERROR_NAMES: tuple[str, ...] = (
    "ok",
    "truncated",
    "wrong_version",
    "bad_set_length",
    "unknown_template",
    "bad_template",
    "template_table_full",
    "bad_v5_count",
    "expired_template",
    "no_end_time",
    "absurd_counter",
    "sflow_bad_sample",
    "sflow_no_header",
    "sflow_header_not_ethernet",
    "sflow_unknown_sample",
)
NFLOWERR = len(FLOW_ERROR_NAMES)

# information elements read (IANA IPFIX ids == NetFlow v9 field types below 128)
IE_BYTES, IE_PKTS, IE_PROTO, IE_TOS, IE_FLAGS, IE_SPORT, IE_SRC4, IE_IN_IF, IE_DPORT, IE_DST4 = range(10)
IE_LAST, IE_FIRST, IE_SRC6, IE_DST6, IE_START_MS, IE_END_MS, IE_START_S, IE_END_S = range(10, 18)
IE_BYTES_TOTAL, IE_PKTS_TOTAL, IE_SAMPLING, IE_SPI, IE_SPS, IE_SYSINIT, IE_RANDOM_INTERVAL = range(18, 25)
IE_OUT_IF, IE_NEXT_HOP4, IE_SRC_AS, IE_DST_AS = range(25, 29)
NIE = 29
_IE_IDS = (1, 2, 4, 5, 6, 7, 8, 10, 11, 12, 21, 22, 27, 28, 152, 153, 150, 151, 85, 86, 34, 305, 306, 160, 50)
_IE_IDS += (14, 15, 16, 17)
IE_INDEX = np.full(512, -1, dtype=np.int64)
for _k, _ie in enumerate(_IE_IDS):
    IE_INDEX[_ie] = _k

# template table: one row per template
T_VALID, T_EXP, T_DOM, T_ID, T_RECLEN, T_SEEN, T_OPT, T_VAR, T_NF = range(9)
T_FIELDS = 9  # then (offset, length) per IE; offset -1 when the template lacks it
# then, for templates with variable-length fields (T_VAR 1), (length, IE index or -1) of each field in
# order: such a record is walked field by field (RFC 7011 7: length 65535, a 1- or 3-byte prefix)
T_LIST = T_FIELDS + 2 * NIE
MAX_VAR_FIELDS = 64
VARLEN = 0xFFFF
TW = T_LIST + 2 * MAX_VAR_FIELDS
# per (exporter, domain) state; an sFlow source (D_KIND 1) is (agent address, sub-agent): D_DOM holds the
# sub-agent id, D_AGENT_HI/LO the agent address (lowwater's 128-bit words), D_EXP the datagrams' sender
D_VALID, D_EXP, D_DOM, D_RATE, D_SYSINIT, D_CLOCK, D_RECORDS, D_KIND, D_AGENT_HI, D_AGENT_LO = range(10)
D_DATAGRAMS = 10
DW = 11
KIND_NETFLOW, KIND_SFLOW = 0, 1
# sFlow interface counter rows (generic interface counters, record 0:1): the latest per (source, ifIndex)
C_TS, C_DOM, C_IFINDEX, C_SPEED, C_STATUS, C_IN_OCTETS, C_IN_PKTS, C_IN_ERRORS, C_IN_DISCARDS = range(9)
C_OUT_OCTETS, C_OUT_PKTS, C_OUT_ERRORS, C_OUT_DISCARDS = range(9, 13)
CW = 13
COUNTER_NAMES: tuple[str, ...] = (
    "in_octets",
    "in_packets",
    "in_errors",
    "in_discards",
    "out_octets",
    "out_packets",
    "out_errors",
    "out_discards",
)

MAX_RECORD_PACKETS = 1 << 40  # a counter above this (after sampling) is absurd: counted and dropped
NS = 1_000_000_000


def new_state(max_templates: int = 1024, max_domains: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Empty template and domain tables."""
    return np.zeros((max_templates, TW), dtype=np.int64), np.zeros((max_domains, DW), dtype=np.int64)


@njit(cache=True, nogil=True, inline="always")
def _uint(buf, p, n):
    """Big-endian unsigned integer of n (1..8) bytes at p; caller has bounds-checked."""
    v = np.int64(0)
    for k in range(n):
        v = (v << 8) | np.int64(buf[p + k])
    return v


@njit(cache=True, nogil=True)
def _domain(doms, exporter, domain):
    """Row of (exporter, domain) in doms, created on first sight; -1 when the table is full."""
    free = -1
    for d in range(doms.shape[0]):
        if doms[d, D_VALID] == 1:
            if doms[d, D_KIND] == KIND_NETFLOW and doms[d, D_EXP] == exporter and doms[d, D_DOM] == domain:
                return d
        elif free < 0:
            free = d
    if free >= 0:
        doms[free, D_VALID] = 1
        doms[free, D_EXP] = exporter
        doms[free, D_DOM] = domain
        doms[free, D_RATE] = 1
        doms[free, D_SYSINIT] = -1
        doms[free, D_CLOCK] = 0
        doms[free, D_RECORDS] = 0
        doms[free, D_DATAGRAMS] = 0
        doms[free, D_KIND] = KIND_NETFLOW
        doms[free, D_AGENT_HI] = 0
        doms[free, D_AGENT_LO] = 0
    return free


@njit(cache=True, nogil=True)
def _sflow_source(doms, exporter, agent_hi, agent_lo, sub):
    """Row of the sFlow source (agent address, sub-agent), created on first sight; -1 when full."""
    free = -1
    for d in range(doms.shape[0]):
        if doms[d, D_VALID] == 1:
            if (
                doms[d, D_KIND] == KIND_SFLOW
                and doms[d, D_AGENT_LO] == agent_lo
                and doms[d, D_AGENT_HI] == agent_hi
                and doms[d, D_DOM] == sub
            ):
                return d
        elif free < 0:
            free = d
    if free >= 0:
        doms[free, D_VALID] = 1
        doms[free, D_EXP] = exporter
        doms[free, D_DOM] = sub
        doms[free, D_RATE] = 1
        doms[free, D_SYSINIT] = -1
        doms[free, D_CLOCK] = 0
        doms[free, D_RECORDS] = 0
        doms[free, D_DATAGRAMS] = 0
        doms[free, D_KIND] = KIND_SFLOW
        doms[free, D_AGENT_HI] = agent_hi
        doms[free, D_AGENT_LO] = agent_lo
    return free


@njit(cache=True, nogil=True)
def _find_template(tmpl, exporter, domain, tid):
    for t in range(tmpl.shape[0]):
        if (
            tmpl[t, T_VALID] == 1
            and tmpl[t, T_ID] == tid
            and tmpl[t, T_EXP] == exporter
            and tmpl[t, T_DOM] == domain
        ):
            return t
    return -1


@njit(cache=True, nogil=True)
def _define(buf, p, end, tmpl, exporter, domain, clock, ipfix, options, errs):
    """Read one template record at p (template or options template); returns the next record's offset,
    -1 when the rest of the set cannot be read, -2 when what is left is too short for a header (padding)."""
    if options:
        if ipfix:
            if p + 6 > end:
                return 0
            tid = _uint(buf, p, 2)
            nfields = _uint(buf, p + 2, 2)
            p += 6  # template id, field count, scope field count (scopes are ordinary fields here)
        else:
            if p + 6 > end:
                return 0
            tid = _uint(buf, p, 2)
            nfields = (_uint(buf, p + 2, 2) + _uint(buf, p + 4, 2)) // 4  # scope and option lengths, bytes
            p += 6
    else:
        if p + 4 > end:
            return 0
        tid = _uint(buf, p, 2)
        nfields = _uint(buf, p + 2, 2)
        p += 4
    t = _find_template(tmpl, exporter, domain, tid)
    if nfields == 0:  # IPFIX withdrawal
        if t >= 0:
            tmpl[t, T_VALID] = 0
        return p
    if tid < 256:
        errs[E_BAD_TEMPLATE] += 1
        return -1
    if t < 0:
        for k in range(tmpl.shape[0]):
            if tmpl[k, T_VALID] == 0:
                t = k
                break
    ok = t >= 0
    if not ok:
        errs[E_TABLE_FULL] += 1
    reclen = np.int64(0)
    var = False
    if ok:
        for k in range(NIE):
            tmpl[t, T_FIELDS + 2 * k] = -1
            tmpl[t, T_FIELDS + 2 * k + 1] = 0
    for f in range(nfields):
        if p + 4 > end:
            return -1
        ie = _uint(buf, p, 2)
        flen = _uint(buf, p + 2, 2)
        p += 4
        if ipfix and ie & 0x8000:  # enterprise-specific: a 4-byte enterprise number follows
            if p + 4 > end:
                return -1
            p += 4
            ie = -1
        if flen == 0 or (flen == VARLEN and not ipfix):
            ok = False
        if flen == VARLEN:
            var = True
        if ok:
            k = IE_INDEX[ie] if 0 <= ie < 512 else -1
            if k >= 0 and tmpl[t, T_FIELDS + 2 * k] < 0:
                tmpl[t, T_FIELDS + 2 * k] = reclen  # meaningful only while no variable-length field precedes
                tmpl[t, T_FIELDS + 2 * k + 1] = flen
            if f < MAX_VAR_FIELDS:
                tmpl[t, T_LIST + 2 * f] = flen
                tmpl[t, T_LIST + 2 * f + 1] = k
            reclen += 1 if flen == VARLEN else flen  # the shortest record: every prefix, no content
    if var and nfields > MAX_VAR_FIELDS:
        ok = False
    if ok and (reclen == 0 or reclen > 65535):
        ok = False
    if t >= 0 and not ok:
        tmpl[t, T_VALID] = 0
        errs[E_BAD_TEMPLATE] += 1
    elif ok:
        tmpl[t, T_VALID] = 1
        tmpl[t, T_EXP] = exporter
        tmpl[t, T_DOM] = domain
        tmpl[t, T_ID] = tid
        tmpl[t, T_RECLEN] = reclen
        tmpl[t, T_SEEN] = clock
        tmpl[t, T_OPT] = 1 if options else 0
        tmpl[t, T_VAR] = 1 if var else 0
        tmpl[t, T_NF] = nfields
    return p


@njit(cache=True, nogil=True)
def _walk(buf, q, send, tmpl, t, one):
    """A variable-length record at q: its IEs' offsets (from q) and lengths into one[0], a scratch template
    row; returns the record's length, -1 when it overruns its set."""
    for k in range(NIE):
        one[0, T_FIELDS + 2 * k] = -1
        one[0, T_FIELDS + 2 * k + 1] = 0
    p = q
    for f in range(tmpl[t, T_NF]):
        n = tmpl[t, T_LIST + 2 * f]
        k = tmpl[t, T_LIST + 2 * f + 1]
        if n == VARLEN:
            if p + 1 > send:
                return -1
            n = np.int64(buf[p])
            p += 1
            if n == 255:
                if p + 2 > send:
                    return -1
                n = _uint(buf, p, 2)
                p += 2
        if p + n > send:
            return -1
        if k >= 0 and one[0, T_FIELDS + 2 * k] < 0 and 0 < n:
            one[0, T_FIELDS + 2 * k] = p - q
            one[0, T_FIELDS + 2 * k + 1] = n
        p += n
    return p - q


@njit(cache=True, nogil=True, inline="always")
def _get(buf, rec, tmpl, t, k):
    """Value of IE k in the record at rec (-1 when the template lacks it; at most 8 bytes read)."""
    off = tmpl[t, T_FIELDS + 2 * k]
    if off < 0:
        return np.int64(-1)
    n = tmpl[t, T_FIELDS + 2 * k + 1]
    if n > 8:
        return _uint(buf, rec + off + n - 8, 8)
    return _uint(buf, rec + off, n)


@njit(cache=True, nogil=True)
def _options_record(buf, rec, tmpl, t, doms, d):
    """Sampling rate and system init time from an options record."""
    rate = _get(buf, rec, tmpl, t, IE_SAMPLING)
    if rate <= 0:
        rate = _get(buf, rec, tmpl, t, IE_RANDOM_INTERVAL)
    spi = _get(buf, rec, tmpl, t, IE_SPI)
    if spi > 0:
        sps = _get(buf, rec, tmpl, t, IE_SPS)
        rate = (spi + (sps if sps > 0 else 0)) // spi
    if rate > 0:
        doms[d, D_RATE] = rate
    init = _get(buf, rec, tmpl, t, IE_SYSINIT)
    if init > 0:
        doms[d, D_SYSINIT] = init


@njit(cache=True, nogil=True)
def _data_record(buf, rec, tmpl, t, doms, d, uptime_ms, clock_ns, v9, addr, rows, w, rate_out, r, errs):
    """One data record into rows[r]; returns 1 when written, 0 when dropped (counted)."""
    rate = doms[d, D_RATE]
    pk = _get(buf, rec, tmpl, t, IE_PKTS)
    if pk < 0:
        pk = _get(buf, rec, tmpl, t, IE_PKTS_TOTAL)
    by = _get(buf, rec, tmpl, t, IE_BYTES)
    if by < 0:
        by = _get(buf, rec, tmpl, t, IE_BYTES_TOTAL)
    if pk < 0 or by < 0 or pk > MAX_RECORD_PACKETS or by > MAX_RECORD_PACKETS * 65535:
        errs[E_ABSURD] += 1
        return 0
    # end time: absolute fields first, then uptime-relative ones (v9 header uptime, IPFIX system init)
    end = np.int64(-1)
    v = _get(buf, rec, tmpl, t, IE_END_MS)
    if v >= 0:
        end = v * 1_000_000
    else:
        v = _get(buf, rec, tmpl, t, IE_END_S)
        if v >= 0:
            end = v * NS
        else:
            v = _get(buf, rec, tmpl, t, IE_LAST)
            if v >= 0:
                if v9:
                    back = (uptime_ms - v) & 0xFFFFFFFF
                    if back >= 0x80000000:
                        back -= 0x100000000
                    end = clock_ns - back * 1_000_000
                elif doms[d, D_SYSINIT] > 0:
                    end = (doms[d, D_SYSINIT] + v) * 1_000_000
    if end < 0:
        errs[E_NO_END_TIME] += 1
        end = clock_ns  # the export time: no record ends after it
    src4 = _get(buf, rec, tmpl, t, IE_SRC4)
    dst4 = _get(buf, rec, tmpl, t, IE_DST4)
    for k in range(F.NFIELDS):
        rows[r, k] = 0
    rows[r, F.TS] = end
    if src4 >= 0 or dst4 >= 0:
        rows[r, F.IPVER] = 4
        rows[r, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | max(src4, 0)
        rows[r, F.DST_LO] = F.IPV4_MAPPED_PREFIX | max(dst4, 0)
    elif tmpl[t, T_FIELDS + 2 * IE_SRC6] >= 0 or tmpl[t, T_FIELDS + 2 * IE_DST6] >= 0:
        rows[r, F.IPVER] = 6
        for k, hi, lo in ((IE_SRC6, F.SRC_HI, F.SRC_LO), (IE_DST6, F.DST_HI, F.DST_LO)):
            off = tmpl[t, T_FIELDS + 2 * k]
            if off >= 0 and tmpl[t, T_FIELDS + 2 * k + 1] == 16:
                rows[r, hi] = _uint(buf, rec + off, 8)
                rows[r, lo] = _uint(buf, rec + off + 8, 8)
    rows[r, F.PROTO] = _get(buf, rec, tmpl, t, IE_PROTO)
    rows[r, F.SPORT] = max(_get(buf, rec, tmpl, t, IE_SPORT), 0)
    rows[r, F.DPORT] = max(_get(buf, rec, tmpl, t, IE_DPORT), 0)
    rows[r, F.TCP_FLAGS] = max(_get(buf, rec, tmpl, t, IE_FLAGS), 0)
    rows[r, F.TOS] = max(_get(buf, rec, tmpl, t, IE_TOS), 0)
    rows[r, F.IFACE] = max(_get(buf, rec, tmpl, t, IE_IN_IF), 0)
    rows[r, F.EXPORTER] = addr
    rows[r, F.OUT_IFACE] = max(_get(buf, rec, tmpl, t, IE_OUT_IF), 0)
    rows[r, F.NEXT_HOP] = max(_get(buf, rec, tmpl, t, IE_NEXT_HOP4), 0)
    rows[r, F.SRC_AS] = max(_get(buf, rec, tmpl, t, IE_SRC_AS), 0)
    rows[r, F.DST_AS] = max(_get(buf, rec, tmpl, t, IE_DST_AS), 0)
    rows[r, F.SAMPLING_RATE] = rate
    rows[r, F.LEN] = by * rate
    w[r] = pk * rate
    rate_out[r] = rate
    doms[d, D_RECORDS] += 1
    return 1


@njit(cache=True, nogil=True)
def _v5(buf, p0, end, exporter, addr, doms, rows, w, rate_out, r, cap, errs):
    """A NetFlow v5 datagram (fixed 48-byte records); returns the records written."""
    if p0 + 24 > end:
        errs[E_SHORT] += 1
        return 0
    count = _uint(buf, p0 + 2, 2)
    if count < 1 or count > 30 or p0 + 24 + count * 48 > end:
        errs[E_V5_COUNT] += 1
        return 0
    if r + count > cap:
        return -1
    uptime = _uint(buf, p0 + 4, 4)
    clock = _uint(buf, p0 + 8, 4) * NS + _uint(buf, p0 + 12, 4)
    d = _domain(doms, exporter, _uint(buf, p0 + 20, 1))
    if d < 0:
        errs[E_TABLE_FULL] += 1
        return 0
    si = _uint(buf, p0 + 22, 2)
    rate = si & 0x3FFF
    doms[d, D_RATE] = rate if rate > 0 else 1
    doms[d, D_DATAGRAMS] += 1
    if clock > doms[d, D_CLOCK]:
        doms[d, D_CLOCK] = clock
    got = 0
    for i in range(count):
        q = p0 + 24 + i * 48
        pk = _uint(buf, q + 16, 4)
        by = _uint(buf, q + 20, 4)
        last = _uint(buf, q + 28, 4)
        back = (uptime - last) & 0xFFFFFFFF
        if back >= 0x80000000:
            back -= 0x100000000
        k = r + got
        for c in range(F.NFIELDS):
            rows[k, c] = 0
        rows[k, F.TS] = clock - back * 1_000_000
        rows[k, F.IPVER] = 4
        rows[k, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | _uint(buf, q, 4)
        rows[k, F.DST_LO] = F.IPV4_MAPPED_PREFIX | _uint(buf, q + 4, 4)
        rows[k, F.IFACE] = _uint(buf, q + 12, 2)
        rows[k, F.OUT_IFACE] = _uint(buf, q + 14, 2)
        rows[k, F.NEXT_HOP] = _uint(buf, q + 8, 4)
        rows[k, F.SRC_AS] = _uint(buf, q + 40, 2)
        rows[k, F.DST_AS] = _uint(buf, q + 42, 2)
        rows[k, F.EXPORTER] = addr
        rows[k, F.SAMPLING_RATE] = doms[d, D_RATE]
        rows[k, F.SPORT] = _uint(buf, q + 32, 2)
        rows[k, F.DPORT] = _uint(buf, q + 34, 2)
        rows[k, F.TCP_FLAGS] = _uint(buf, q + 37, 1)
        rows[k, F.PROTO] = _uint(buf, q + 38, 1)
        rows[k, F.TOS] = _uint(buf, q + 39, 1)
        rows[k, F.LEN] = by * doms[d, D_RATE]
        w[k] = pk * doms[d, D_RATE]
        rate_out[k] = doms[d, D_RATE]
        got += 1
    doms[d, D_RECORDS] += got
    return got


SFLOW_MAX_SAMPLES = 4096  # per datagram; more than fits in 64 KiB is malformed


@njit(cache=True, nogil=True)
def _sflow_flow(buf, q, send, expanded, arrival, agent, row, rows, w, rate_out, r, errs):
    """One sFlow flow sample (compact 0:1 or expanded 0:3) at q; returns 1 when a row was written."""
    if expanded:
        if q + 44 > send:
            errs[E_SF_SAMPLE] += 1
            return 0
        rate = _uint(buf, q + 12, 4)
        in_if = _uint(buf, q + 28, 4)
        out_if = _uint(buf, q + 36, 4) if _uint(buf, q + 32, 4) == 0 else 0
        nrec = _uint(buf, q + 40, 4)
        q += 44
    else:
        if q + 32 > send:
            errs[E_SF_SAMPLE] += 1
            return 0
        rate = _uint(buf, q + 8, 4)
        in_if = _uint(buf, q + 20, 4) & 0x3FFFFFFF  # top 2 bits: the format (0 = an ifIndex)
        out_if = _uint(buf, q + 24, 4)
        out_if = out_if if out_if >> 30 == 0 else 0
        nrec = _uint(buf, q + 28, 4)
        q += 32
    if rate < 1:
        rate = 1
    got = 0
    next_hop = np.int64(0)
    src_as = np.int64(0)
    dst_as = np.int64(0)
    for _ in range(nrec):
        if q + 8 > send:
            errs[E_SF_SAMPLE] += 1
            return 0
        fmt = _uint(buf, q, 4)
        rlen = _uint(buf, q + 4, 4)
        d = q + 8
        q = d + rlen
        if q > send:
            errs[E_SF_SAMPLE] += 1
            return 0
        if fmt == 1 and got == 0 and rlen >= 16:  # raw packet header
            proto = _uint(buf, d, 4)
            frame_len = _uint(buf, d + 4, 4)
            hlen = _uint(buf, d + 12, 4)
            if hlen > rlen - 16:
                errs[E_SF_SAMPLE] += 1
                return 0
            if proto != 1:
                errs[E_SF_HEADER_PROTO] += 1
                return 0
            parse_frame(buf, d + 16, hlen, frame_len, arrival, in_if, row)
            for k in range(F.NFIELDS):
                rows[r, k] = row[k]
            rows[r, F.LEN] = frame_len * rate
            w[r] = rate
            rate_out[r] = rate
            got = 1
        elif (fmt == 1002 or fmt == 1003) and rlen >= 8 and _uint(buf, d, 4) == 1:
            next_hop = _uint(buf, d + 4, 4)  # extended router / gateway data: an IPv4 next hop first
            if fmt == 1003 and rlen >= 24:  # then router AS, src AS, src peer AS, the AS path to dst
                src_as = _uint(buf, d + 12, 4)
                dst_as = _sflow_path_end(buf, d + 20, q)
    if got == 0:
        errs[E_SF_NO_HEADER] += 1
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
    nseg = _uint(buf, p, 4)
    p += 4
    last = np.int64(0)
    for _ in range(min(nseg, 64)):
        if p + 8 > end:
            return np.int64(0)
        n = _uint(buf, p + 4, 4)
        p += 8
        if n > 0:
            if p + 4 * n > end:
                return np.int64(0)
            last = _uint(buf, p + 4 * (n - 1), 4)
        p += 4 * n
    return last


@njit(cache=True, nogil=True)
def _sflow_counters(buf, q, send, expanded, arrival, d, ctrs, c, errs):
    """An sFlow counter sample (0:2 or 0:4): its generic interface counters (0:1) into ctrs[c]."""
    nq = q + (16 if expanded else 12)
    if nq > send:
        errs[E_SF_SAMPLE] += 1
        return 0
    nrec = _uint(buf, nq - 4, 4)
    q = nq
    got = 0
    for _ in range(nrec):
        if q + 8 > send:
            errs[E_SF_SAMPLE] += 1
            return got
        fmt = _uint(buf, q, 4)
        rlen = _uint(buf, q + 4, 4)
        p = q + 8
        q = p + rlen
        if q > send:
            errs[E_SF_SAMPLE] += 1
            return got
        if fmt == 1 and rlen >= 88 and got == 0 and c < ctrs.shape[0]:
            ctrs[c, C_TS] = arrival
            ctrs[c, C_DOM] = d
            ctrs[c, C_IFINDEX] = _uint(buf, p, 4)
            ctrs[c, C_SPEED] = _uint(buf, p + 8, 8)
            ctrs[c, C_STATUS] = _uint(buf, p + 20, 4)
            ctrs[c, C_IN_OCTETS] = _uint(buf, p + 24, 8)
            ctrs[c, C_IN_PKTS] = _uint(buf, p + 32, 4) + _uint(buf, p + 36, 4) + _uint(buf, p + 40, 4)
            ctrs[c, C_IN_DISCARDS] = _uint(buf, p + 44, 4)
            ctrs[c, C_IN_ERRORS] = _uint(buf, p + 48, 4)
            ctrs[c, C_OUT_OCTETS] = _uint(buf, p + 56, 8)
            ctrs[c, C_OUT_PKTS] = _uint(buf, p + 64, 4) + _uint(buf, p + 68, 4) + _uint(buf, p + 72, 4)
            ctrs[c, C_OUT_DISCARDS] = _uint(buf, p + 76, 4)
            ctrs[c, C_OUT_ERRORS] = _uint(buf, p + 80, 4)
            got = 1
    return got


@njit(cache=True, nogil=True)
def _sflow(buf, p0, end, exporter, arrival, doms, row, rows, w, rate_out, r, cap, ctrs, res, errs):
    """An sFlow v5 datagram: a row per flow sample (its header parsed like a captured frame, weighted by
    the sampling rate), a counter row per interface counter sample. Returns the rows written, -1 when
    rows or ctrs might not hold this datagram (call again); res[3] says whether it was read whole."""
    res[3] = 1
    if p0 + 12 > end:
        errs[E_SHORT] += 1
        return 0
    atype = _uint(buf, p0 + 4, 4)
    agent = np.int64(0)  # the exporter field: an IPv4 agent's address, 0 for an IPv6 agent
    if atype == 1:
        hi = np.int64(0)
        agent = _uint(buf, p0 + 8, 4)
        lo = F.IPV4_MAPPED_PREFIX | agent
        p = p0 + 12
    elif atype == 2:
        if p0 + 24 > end:
            errs[E_SHORT] += 1
            return 0
        hi = _uint(buf, p0 + 8, 8)
        lo = _uint(buf, p0 + 16, 8)
        p = p0 + 24
    else:
        errs[E_SF_SAMPLE] += 1
        return 0
    if p + 16 > end:
        errs[E_SHORT] += 1
        return 0
    sub = _uint(buf, p, 4)
    nsamples = _uint(buf, p + 12, 4)
    p += 16
    if nsamples > SFLOW_MAX_SAMPLES:
        errs[E_SF_SAMPLE] += 1
        return 0
    if r + nsamples > cap or res[2] + nsamples > ctrs.shape[0]:
        return -1
    d = _sflow_source(doms, exporter, hi, lo, sub)
    if d < 0:
        errs[E_TABLE_FULL] += 1
        return 0
    doms[d, D_DATAGRAMS] += 1
    if arrival > doms[d, D_CLOCK]:
        doms[d, D_CLOCK] = arrival
    got = 0
    bad = False
    for _ in range(nsamples):
        if p + 8 > end:
            errs[E_SHORT] += 1
            bad = True
            break
        fmt = _uint(buf, p, 4)
        slen = _uint(buf, p + 4, 4)
        q = p + 8
        send = q + slen
        if send > end:
            errs[E_SF_SAMPLE] += 1
            bad = True
            break
        if fmt == 1 or fmt == 3:
            if (
                _sflow_flow(buf, q, send, fmt == 3, arrival, agent, row, rows, w, rate_out, r + got, errs)
                == 1
            ):
                doms[d, D_RATE] = rate_out[r + got]  # the source's latest rate, for stats
                got += 1
        elif fmt == 2 or fmt == 4:
            res[2] += _sflow_counters(buf, q, send, fmt == 4, arrival, d, ctrs, res[2], errs)
        else:
            errs[E_SF_UNKNOWN] += 1
        p = send
    doms[d, D_RECORDS] += got
    res[3] = 1 if bad else 0  # the rows before a bad sample stand; the datagram is not counted ok
    return got


@njit(cache=True, nogil=True)
def decode(
    buf,
    offs,
    lens,
    exporters,
    arrival,
    n,
    tmpl,
    doms,
    template_timeout_s,
    rows,
    w,
    rate_out,
    ctrs,
    errs,
    res,
    exp_addr,
):
    """Decode datagrams 0..n-1 (datagram i is buf[offs[i]:offs[i]+lens[i]], from exporter id exporters[i]
    whose IPv4 address is exp_addr[exporters[i]] as u32 (0 when not IPv4), received at arrival[i] ns).

    Writes records to rows / w (packets, sampled-up) / rate_out, at most ``rows.shape[0]``, and sFlow
    interface counters to ctrs; res[0] gets the records written, res[1] the datagrams consumed (less
    than n only when rows is full: call again), res[2] the counter rows. errs[E_OK] counts the datagrams
    read whole.
    """
    cap = rows.shape[0]
    r = 0
    i = 0
    res[2] = 0
    row = np.zeros(F.NFIELDS, dtype=np.int64)
    one = np.zeros((1, TW), dtype=np.int64)
    while i < n:
        p0 = offs[i]
        end = p0 + lens[i]
        if end > buf.shape[0] or p0 < 0:
            end = buf.shape[0]
        exporter = exporters[i]
        addr = exp_addr[exporter] if 0 <= exporter < exp_addr.shape[0] else np.int64(0)
        if p0 + 4 > end:
            errs[E_SHORT] += 1
            i += 1
            continue
        version = _uint(buf, p0, 2)
        if version == 0 and _uint(buf, p0, 4) == 5:  # sFlow v5: a 32-bit version word
            got = _sflow(
                buf, p0, end, exporter, arrival[i], doms, row, rows, w, rate_out, r, cap, ctrs, res, errs
            )
            if got < 0:
                if r == 0 and res[2] == 0:  # could never fit: count it rather than loop
                    errs[E_SF_SAMPLE] += 1
                    i += 1
                    continue
                break
            r += got
            if res[3] == 0:
                errs[E_OK] += 1
            i += 1
            continue
        if version == 5:
            got = _v5(buf, p0, end, exporter, addr, doms, rows, w, rate_out, r, cap, errs)
            if got < 0:
                break  # rows full: this datagram goes in the next call
            r += got
            if got > 0:
                errs[E_OK] += 1
            i += 1
            continue
        if version != 9 and version != 10:
            errs[E_VERSION] += 1
            i += 1
            continue
        ipfix = version == 10
        hlen = 16 if ipfix else 20
        if p0 + hlen > end:
            errs[E_SHORT] += 1
            i += 1
            continue
        if ipfix:
            mlen = _uint(buf, p0 + 2, 2)
            if mlen < 16 or p0 + mlen > end:
                errs[E_SET_LENGTH] += 1
                i += 1
                continue
            end = p0 + mlen
            uptime = np.int64(0)
            clock = _uint(buf, p0 + 4, 4) * NS
            domain = _uint(buf, p0 + 12, 4)
        else:
            uptime = _uint(buf, p0 + 4, 4)
            clock = _uint(buf, p0 + 8, 4) * NS
            domain = _uint(buf, p0 + 16, 4)
        # worst case records of this datagram: one per 1 byte... bound by the smallest usable record (1 byte)
        if r + (end - p0) > cap and r > 0:
            break
        d = _domain(doms, exporter, domain)
        if d < 0:
            errs[E_TABLE_FULL] += 1
            i += 1
            continue
        doms[d, D_DATAGRAMS] += 1
        if clock > doms[d, D_CLOCK]:
            doms[d, D_CLOCK] = clock
        clock_s = clock // NS
        p = p0 + hlen
        bad = False
        while p + 4 <= end:
            sid = _uint(buf, p, 2)
            slen = _uint(buf, p + 2, 2)
            if slen < 4 or p + slen > end:
                errs[E_SET_LENGTH] += 1
                bad = True
                break
            q = p + 4
            send = p + slen
            tset = 2 if ipfix else 0
            oset = 3 if ipfix else 1
            if sid == tset or sid == oset:
                while q + 4 <= send:
                    nq = _define(buf, q, send, tmpl, exporter, domain, clock_s, ipfix, sid == oset, errs)
                    if nq < 0:
                        if nq == -1:
                            errs[E_BAD_TEMPLATE] += 1
                        break
                    q = nq
            elif sid >= 256:
                t = _find_template(tmpl, exporter, domain, sid)
                if t < 0:
                    errs[E_UNKNOWN_TEMPLATE] += 1
                elif clock_s - tmpl[t, T_SEEN] > template_timeout_s:
                    errs[E_EXPIRED] += 1
                elif tmpl[t, T_VAR] == 1:
                    while q + tmpl[t, T_RECLEN] <= send and r < cap:
                        rl = _walk(buf, q, send, tmpl, t, one)
                        if rl < 0:
                            errs[E_SET_LENGTH] += 1
                            bad = True
                            break
                        if tmpl[t, T_OPT] == 1:
                            _options_record(buf, q, one, 0, doms, d)
                        else:
                            r += _data_record(
                                buf,
                                q,
                                one,
                                0,
                                doms,
                                d,
                                uptime,
                                clock,
                                not ipfix,
                                addr,
                                rows,
                                w,
                                rate_out,
                                r,
                                errs,
                            )
                        q += rl
                else:
                    rl = tmpl[t, T_RECLEN]
                    while q + rl <= send and r < cap:
                        if tmpl[t, T_OPT] == 1:
                            _options_record(buf, q, tmpl, t, doms, d)
                        else:
                            r += _data_record(
                                buf,
                                q,
                                tmpl,
                                t,
                                doms,
                                d,
                                uptime,
                                clock,
                                not ipfix,
                                addr,
                                rows,
                                w,
                                rate_out,
                                r,
                                errs,
                            )
                        q += rl
            p = send
        if not bad:
            errs[E_OK] += 1
        i += 1
    res[0] = r
    res[1] = i
    pin(buf)
    pin(rows)
    pin(tmpl)
    pin(doms)
    return r
