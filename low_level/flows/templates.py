"""NetFlow v9 and IPFIX: templates and the data records they describe -> weighted flow rows, in Numba.

Templates are kept per (exporter, observation domain / source id, template id) in one int64 array: each
one compiled to the byte offset and length of every information element lowwater reads, so a data record
is decoded with a few fixed loads. A template expires when its exporter's clock (the export time of its
datagrams) is ``template_timeout_s`` past its last definition; an IPFIX withdrawal (field count 0)
removes it. Options records carry the sampling rate (v9 SAMPLING_INTERVAL 34, IPFIX samplingInterval 34,
samplingPacketInterval/Space 305/306, sampler random interval 50) and IPFIX systemInitTimeMilliseconds
(160), both kept per (exporter, domain).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from low_level.flows import layout as L
from low_level.flows.layout import heard, uint


@njit(cache=True, nogil=True)
def _find_template(tmpl, exporter, domain, tid):
    for t in range(tmpl.shape[0]):
        if (
            tmpl[t, L.T_VALID] == 1
            and tmpl[t, L.T_ID] == tid
            and tmpl[t, L.T_EXP] == exporter
            and tmpl[t, L.T_DOM] == domain
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
            tid = uint(buf, p, 2)
            nfields = uint(buf, p + 2, 2)
            p += 6  # template id, field count, scope field count (scopes are ordinary fields here)
        else:
            if p + 6 > end:
                return 0
            tid = uint(buf, p, 2)
            nfields = (uint(buf, p + 2, 2) + uint(buf, p + 4, 2)) // 4  # scope and option lengths, bytes
            p += 6
    else:
        if p + 4 > end:
            return 0
        tid = uint(buf, p, 2)
        nfields = uint(buf, p + 2, 2)
        p += 4
    t = _find_template(tmpl, exporter, domain, tid)
    if nfields == 0:  # IPFIX withdrawal
        if t >= 0:
            tmpl[t, L.T_VALID] = 0
        return p
    if tid < 256:
        errs[L.E_BAD_TEMPLATE] += 1
        return -1
    if t < 0:
        for k in range(tmpl.shape[0]):
            if tmpl[k, L.T_VALID] == 0:
                t = k
                break
    ok = t >= 0
    if not ok:
        errs[L.E_TABLE_FULL] += 1
    reclen = np.int64(0)
    var = False
    if ok:
        for k in range(L.NIE):
            tmpl[t, L.T_FIELDS + 2 * k] = -1
            tmpl[t, L.T_FIELDS + 2 * k + 1] = 0
    for f in range(nfields):
        if p + 4 > end:
            return -1
        ie = uint(buf, p, 2)
        flen = uint(buf, p + 2, 2)
        p += 4
        if ipfix and ie & 0x8000:  # enterprise-specific: a 4-byte enterprise number follows
            if p + 4 > end:
                return -1
            p += 4
            ie = -1
        if flen == 0 or (flen == L.VARLEN and not ipfix):
            ok = False
        if flen == L.VARLEN:
            var = True
        if ok:
            k = L.IE_INDEX[ie] if 0 <= ie < 512 else -1
            if k >= 0 and tmpl[t, L.T_FIELDS + 2 * k] < 0:
                tmpl[t, L.T_FIELDS + 2 * k] = (
                    reclen  # meaningful only while no variable-length field precedes
                )
                tmpl[t, L.T_FIELDS + 2 * k + 1] = flen
            if f < L.MAX_VAR_FIELDS:
                tmpl[t, L.T_LIST + 2 * f] = flen
                tmpl[t, L.T_LIST + 2 * f + 1] = k
            reclen += 1 if flen == L.VARLEN else flen  # the shortest record: every prefix, no content
    if var and nfields > L.MAX_VAR_FIELDS:
        ok = False
    if ok and (reclen == 0 or reclen > 65535):
        ok = False
    if t >= 0 and not ok:
        tmpl[t, L.T_VALID] = 0
        errs[L.E_BAD_TEMPLATE] += 1
    elif ok:
        tmpl[t, L.T_VALID] = 1
        tmpl[t, L.T_EXP] = exporter
        tmpl[t, L.T_DOM] = domain
        tmpl[t, L.T_ID] = tid
        tmpl[t, L.T_RECLEN] = reclen
        tmpl[t, L.T_SEEN] = clock
        tmpl[t, L.T_OPT] = 1 if options else 0
        tmpl[t, L.T_VAR] = 1 if var else 0
        tmpl[t, L.T_NF] = nfields
        compile_plan(tmpl, t)
    return p


# the IEs a data record stores in a row column as they are (absent: 0)
_STORED = (
    (L.IE_SPORT, F.SPORT),
    (L.IE_DPORT, F.DPORT),
    (L.IE_FLAGS, F.TCP_FLAGS),
    (L.IE_TOS, F.TOS),
    (L.IE_IN_IF, F.IFACE),
    (L.IE_OUT_IF, F.OUT_IFACE),
    (L.IE_NEXT_HOP4, F.NEXT_HOP),
    (L.IE_SRC_AS, F.SRC_AS),
    (L.IE_DST_AS, F.DST_AS),
)


@njit(cache=True, nogil=True)
def compile_plan(tmpl, t):
    """Template row t's plan (``layout.T_PLAN``): where each IE a data record needs sits and what it feeds,
    so that its records are read by ``_fixed_set`` with no per-record lookups. Fixed-length data templates
    only (P_OK 0 otherwise: options and variable-length records take the generic path)."""
    b = L.T_PLAN
    tmpl[t, b : b + L.P_ENTRIES + 3 * L.P_MAX] = 0
    if tmpl[t, L.T_OPT] == 1 or tmpl[t, L.T_VAR] == 1:
        return
    # P_PKTS, P_PKTS_TOTAL, P_BYTES, P_BYTES_TOTAL, P_END_MS, P_END_S, P_LAST: consecutive (offset, length)
    ies = (L.IE_PKTS, L.IE_PKTS_TOTAL, L.IE_BYTES, L.IE_BYTES_TOTAL, L.IE_END_MS, L.IE_END_S, L.IE_LAST)
    for j, k in enumerate(ies):
        slot = L.P_PKTS + 2 * j
        off, n = _at(tmpl, t, k)
        tmpl[t, b + slot] = off
        tmpl[t, b + slot + 1] = n
    e = 0
    for k, col in _STORED:
        e = _entry(tmpl, t, k, col, e)
    e = _entry(tmpl, t, L.IE_PROTO, L.OP_PROTO, e)
    if tmpl[t, L.T_FIELDS + 2 * L.IE_SRC4] >= 0 or tmpl[t, L.T_FIELDS + 2 * L.IE_DST4] >= 0:
        tmpl[t, b + L.P_IPVER] = 4
        e = _entry(tmpl, t, L.IE_SRC4, L.OP_SRC4, e)
        e = _entry(tmpl, t, L.IE_DST4, L.OP_DST4, e)
    elif tmpl[t, L.T_FIELDS + 2 * L.IE_SRC6] >= 0 or tmpl[t, L.T_FIELDS + 2 * L.IE_DST6] >= 0:
        tmpl[t, b + L.P_IPVER] = 6
        for k, op in ((L.IE_SRC6, L.OP_SRC6), (L.IE_DST6, L.OP_DST6)):
            if tmpl[t, L.T_FIELDS + 2 * k + 1] == 16:  # any other length: the address stays 0
                tmpl[t, b + L.P_ENTRIES + 3 * e] = tmpl[t, L.T_FIELDS + 2 * k]
                tmpl[t, b + L.P_ENTRIES + 3 * e + 1] = 16
                tmpl[t, b + L.P_ENTRIES + 3 * e + 2] = op
                e += 1
    tmpl[t, b + L.P_N] = e
    tmpl[t, b + L.P_OK] = 1


@njit(cache=True, nogil=True)
def _at(tmpl, t, k):
    """(offset, length) of IE k's value as ``_get`` reads it (its last 8 bytes at most); (-1, 0) absent."""
    off = tmpl[t, L.T_FIELDS + 2 * k]
    if off < 0:
        return np.int64(-1), np.int64(0)
    n = tmpl[t, L.T_FIELDS + 2 * k + 1]
    if n > 8:
        return off + n - 8, np.int64(8)
    return off, n


@njit(cache=True, nogil=True)
def _entry(tmpl, t, k, op, e):
    """Add IE k (when the template has it) as plan entry e with op; returns the next entry."""
    off, n = _at(tmpl, t, k)
    if off < 0:
        return e
    p = L.T_PLAN + L.P_ENTRIES + 3 * e
    tmpl[t, p] = off
    tmpl[t, p + 1] = n
    tmpl[t, p + 2] = op
    return e + 1


@njit(cache=True, nogil=True, inline="always")
def _ld(buf, p, n):
    """Big-endian unsigned value of n (1..8) bytes at p, the common widths without a loop."""
    if n == 4:
        return (
            (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | (np.int64(buf[p + 2]) << 8) | buf[p + 3]
        )
    if n == 2:
        return (np.int64(buf[p]) << 8) | buf[p + 1]
    if n == 1:
        return np.int64(buf[p])
    return uint(buf, p, n)


@njit(cache=True, nogil=True, inline="always")
def _opt(buf, rec, off, n):
    """A plan slot's value in the record at rec; -1 when the template lacks it."""
    if off < 0:
        return np.int64(-1)
    return _ld(buf, rec + off, n)


@njit(cache=True, nogil=True)
def _fixed_set(buf, q, send, tmpl, t, doms, d, uptime_ms, clock_ns, v9, addr, rows, w, rate_out, r, errs):
    """The records of one data set of fixed-length template t (its plan compiled), q to send, into rows
    from r on: what ``_data_record`` does for each, with the template's layout read once per set.
    Returns the rows written."""
    b = L.T_PLAN
    rl = tmpl[t, L.T_RECLEN]
    pk_o, pk_n = tmpl[t, b + L.P_PKTS], tmpl[t, b + L.P_PKTS + 1]
    pt_o, pt_n = tmpl[t, b + L.P_PKTS_TOTAL], tmpl[t, b + L.P_PKTS_TOTAL + 1]
    by_o, by_n = tmpl[t, b + L.P_BYTES], tmpl[t, b + L.P_BYTES + 1]
    bt_o, bt_n = tmpl[t, b + L.P_BYTES_TOTAL], tmpl[t, b + L.P_BYTES_TOTAL + 1]
    ms_o, ms_n = tmpl[t, b + L.P_END_MS], tmpl[t, b + L.P_END_MS + 1]
    s_o, s_n = tmpl[t, b + L.P_END_S], tmpl[t, b + L.P_END_S + 1]
    la_o, la_n = tmpl[t, b + L.P_LAST], tmpl[t, b + L.P_LAST + 1]
    ipver = tmpl[t, b + L.P_IPVER]
    ne = tmpl[t, b + L.P_N]
    plan = tmpl[t, b + L.P_ENTRIES : b + L.P_ENTRIES + 3 * ne]
    rate = doms[d, L.D_RATE]
    sysinit = doms[d, L.D_SYSINIT]
    cap = rows.shape[0]
    r0 = r
    while q + rl <= send and r < cap:
        rec = q
        q += rl
        pk = _opt(buf, rec, pk_o, pk_n)
        if pk < 0:
            pk = _opt(buf, rec, pt_o, pt_n)
        by = _opt(buf, rec, by_o, by_n)
        if by < 0:
            by = _opt(buf, rec, bt_o, bt_n)
        if pk < 0 or by < 0 or pk > L.MAX_RECORD_PACKETS or by > L.MAX_RECORD_PACKETS * 65535:
            errs[L.E_ABSURD] += 1
            continue
        end = _end_ns(
            _opt(buf, rec, ms_o, ms_n),
            _opt(buf, rec, s_o, s_n),
            _opt(buf, rec, la_o, la_n),
            v9,
            uptime_ms,
            clock_ns,
            sysinit,
        )
        if end < 0:
            errs[L.E_NO_END_TIME] += 1
            end = clock_ns
        for k in range(F.NFIELDS):
            rows[r, k] = 0
        rows[r, F.TS] = end
        rows[r, F.PROTO] = -1
        if ipver == 4:
            rows[r, F.IPVER] = 4
            rows[r, F.SRC_LO] = F.IPV4_MAPPED_PREFIX
            rows[r, F.DST_LO] = F.IPV4_MAPPED_PREFIX
        elif ipver == 6:
            rows[r, F.IPVER] = 6
        for e in range(ne):
            p = rec + plan[3 * e]
            op = plan[3 * e + 2]
            if op < F.NFIELDS:
                v = _ld(buf, p, plan[3 * e + 1])
                if v > 0:
                    rows[r, op] = v
            elif op == L.OP_SRC4:
                rows[r, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | max(_ld(buf, p, plan[3 * e + 1]), 0)
            elif op == L.OP_DST4:
                rows[r, F.DST_LO] = F.IPV4_MAPPED_PREFIX | max(_ld(buf, p, plan[3 * e + 1]), 0)
            elif op == L.OP_PROTO:
                rows[r, F.PROTO] = _ld(buf, p, plan[3 * e + 1])
            elif op == L.OP_SRC6:
                rows[r, F.SRC_HI] = uint(buf, p, 8)
                rows[r, F.SRC_LO] = uint(buf, p + 8, 8)
            else:
                rows[r, F.DST_HI] = uint(buf, p, 8)
                rows[r, F.DST_LO] = uint(buf, p + 8, 8)
        rows[r, F.EXPORTER] = addr
        rows[r, F.SAMPLING_RATE] = rate
        rows[r, F.LEN] = by * rate
        w[r] = pk * rate
        rate_out[r] = rate
        r += 1
    doms[d, L.D_RECORDS] += r - r0
    return r - r0


@njit(cache=True, nogil=True)
def _walk(buf, q, send, tmpl, t, one):
    """A variable-length record at q: its IEs' offsets (from q) and lengths into one[0], a scratch template
    row; returns the record's length, -1 when it overruns its set."""
    for k in range(L.NIE):
        one[0, L.T_FIELDS + 2 * k] = -1
        one[0, L.T_FIELDS + 2 * k + 1] = 0
    p = q
    for f in range(tmpl[t, L.T_NF]):
        n = tmpl[t, L.T_LIST + 2 * f]
        k = tmpl[t, L.T_LIST + 2 * f + 1]
        if n == L.VARLEN:
            if p + 1 > send:
                return -1
            n = np.int64(buf[p])
            p += 1
            if n == 255:
                if p + 2 > send:
                    return -1
                n = uint(buf, p, 2)
                p += 2
        if p + n > send:
            return -1
        if k >= 0 and one[0, L.T_FIELDS + 2 * k] < 0 and 0 < n:
            one[0, L.T_FIELDS + 2 * k] = p - q
            one[0, L.T_FIELDS + 2 * k + 1] = n
        p += n
    return p - q


@njit(cache=True, nogil=True, inline="always")
def _get(buf, rec, tmpl, t, k):
    """Value of IE k in the record at rec (-1 when the template lacks it; at most 8 bytes read)."""
    off = tmpl[t, L.T_FIELDS + 2 * k]
    if off < 0:
        return np.int64(-1)
    n = tmpl[t, L.T_FIELDS + 2 * k + 1]
    if n > 8:
        return uint(buf, rec + off + n - 8, 8)
    return uint(buf, rec + off, n)


@njit(cache=True, nogil=True, inline="always")
def _end_ns(end_ms, end_s, last, v9, uptime_ms, clock_ns, sysinit):
    """A record's end time (ns) from its IEs (-1: absent): absolute fields first, then the uptime-relative
    one (v9: the header's uptime; IPFIX: the domain's system init time); -1 when none tells."""
    if end_ms >= 0:
        return end_ms * 1_000_000
    if end_s >= 0:
        return end_s * L.NS
    if last >= 0:
        if v9:
            back = (uptime_ms - last) & 0xFFFFFFFF
            if back >= 0x80000000:
                back -= 0x100000000
            return clock_ns - back * 1_000_000
        if sysinit > 0:
            return (sysinit + last) * 1_000_000
    return np.int64(-1)


@njit(cache=True, nogil=True)
def _options_record(buf, rec, tmpl, t, doms, d):
    """Sampling rate and system init time from an options record."""
    rate = _get(buf, rec, tmpl, t, L.IE_SAMPLING)
    if rate <= 0:
        rate = _get(buf, rec, tmpl, t, L.IE_RANDOM_INTERVAL)
    spi = _get(buf, rec, tmpl, t, L.IE_SPI)
    if spi > 0:
        sps = _get(buf, rec, tmpl, t, L.IE_SPS)
        rate = (spi + (sps if sps > 0 else 0)) // spi
    if rate > 0:
        doms[d, L.D_RATE] = rate
    init = _get(buf, rec, tmpl, t, L.IE_SYSINIT)
    if init > 0:
        doms[d, L.D_SYSINIT] = init


@njit(cache=True, nogil=True)
def _data_record(buf, rec, tmpl, t, doms, d, uptime_ms, clock_ns, v9, addr, rows, w, rate_out, r, errs):
    """One data record into rows[r]; returns 1 when written, 0 when dropped (counted)."""
    rate = doms[d, L.D_RATE]
    pk = _get(buf, rec, tmpl, t, L.IE_PKTS)
    if pk < 0:
        pk = _get(buf, rec, tmpl, t, L.IE_PKTS_TOTAL)
    by = _get(buf, rec, tmpl, t, L.IE_BYTES)
    if by < 0:
        by = _get(buf, rec, tmpl, t, L.IE_BYTES_TOTAL)
    if pk < 0 or by < 0 or pk > L.MAX_RECORD_PACKETS or by > L.MAX_RECORD_PACKETS * 65535:
        errs[L.E_ABSURD] += 1
        return 0
    end = _end_ns(
        _get(buf, rec, tmpl, t, L.IE_END_MS),
        _get(buf, rec, tmpl, t, L.IE_END_S),
        _get(buf, rec, tmpl, t, L.IE_LAST),
        v9,
        uptime_ms,
        clock_ns,
        doms[d, L.D_SYSINIT],
    )
    if end < 0:
        errs[L.E_NO_END_TIME] += 1
        end = clock_ns  # the export time: no record ends after it
    src4 = _get(buf, rec, tmpl, t, L.IE_SRC4)
    dst4 = _get(buf, rec, tmpl, t, L.IE_DST4)
    for k in range(F.NFIELDS):
        rows[r, k] = 0
    rows[r, F.TS] = end
    if src4 >= 0 or dst4 >= 0:
        rows[r, F.IPVER] = 4
        rows[r, F.SRC_LO] = F.IPV4_MAPPED_PREFIX | max(src4, 0)
        rows[r, F.DST_LO] = F.IPV4_MAPPED_PREFIX | max(dst4, 0)
    elif tmpl[t, L.T_FIELDS + 2 * L.IE_SRC6] >= 0 or tmpl[t, L.T_FIELDS + 2 * L.IE_DST6] >= 0:
        rows[r, F.IPVER] = 6
        for k, hi, lo in ((L.IE_SRC6, F.SRC_HI, F.SRC_LO), (L.IE_DST6, F.DST_HI, F.DST_LO)):
            off = tmpl[t, L.T_FIELDS + 2 * k]
            if off >= 0 and tmpl[t, L.T_FIELDS + 2 * k + 1] == 16:
                rows[r, hi] = uint(buf, rec + off, 8)
                rows[r, lo] = uint(buf, rec + off + 8, 8)
    rows[r, F.PROTO] = _get(buf, rec, tmpl, t, L.IE_PROTO)
    rows[r, F.SPORT] = max(_get(buf, rec, tmpl, t, L.IE_SPORT), 0)
    rows[r, F.DPORT] = max(_get(buf, rec, tmpl, t, L.IE_DPORT), 0)
    rows[r, F.TCP_FLAGS] = max(_get(buf, rec, tmpl, t, L.IE_FLAGS), 0)
    rows[r, F.TOS] = max(_get(buf, rec, tmpl, t, L.IE_TOS), 0)
    rows[r, F.IFACE] = max(_get(buf, rec, tmpl, t, L.IE_IN_IF), 0)
    rows[r, F.EXPORTER] = addr
    rows[r, F.OUT_IFACE] = max(_get(buf, rec, tmpl, t, L.IE_OUT_IF), 0)
    rows[r, F.NEXT_HOP] = max(_get(buf, rec, tmpl, t, L.IE_NEXT_HOP4), 0)
    rows[r, F.SRC_AS] = max(_get(buf, rec, tmpl, t, L.IE_SRC_AS), 0)
    rows[r, F.DST_AS] = max(_get(buf, rec, tmpl, t, L.IE_DST_AS), 0)
    rows[r, F.SAMPLING_RATE] = rate
    rows[r, F.LEN] = by * rate
    w[r] = pk * rate
    rate_out[r] = rate
    doms[d, L.D_RECORDS] += 1
    return 1


@njit(cache=True, nogil=True)
def v9_ipfix(
    buf, p0, end, version, exporter, addr, tmpl, doms, template_timeout_s, rows, w, rate_out, r, errs, one
):
    """A NetFlow v9 (version 9) or IPFIX (10) datagram at buf[p0:end]: its template sets define, its data
    sets become rows from r on. Returns the rows written, -1 when rows might not hold it (call again);
    counts the datagram ok when it was read whole."""
    cap = rows.shape[0]
    r0 = r
    ipfix = version == 10
    hlen = 16 if ipfix else 20
    if p0 + hlen > end:
        errs[L.E_SHORT] += 1
        return 0
    if ipfix:
        mlen = uint(buf, p0 + 2, 2)
        if mlen < 16 or p0 + mlen > end:
            errs[L.E_SET_LENGTH] += 1
            return 0
        end = p0 + mlen
        uptime = np.int64(0)
        clock = uint(buf, p0 + 4, 4) * L.NS
        domain = uint(buf, p0 + 12, 4)
    else:
        uptime = uint(buf, p0 + 4, 4)
        clock = uint(buf, p0 + 8, 4) * L.NS
        domain = uint(buf, p0 + 16, 4)
    # worst case records of this datagram: one per 1 byte... bound by the smallest usable record (1 byte)
    if r + (end - p0) > cap and r > 0:
        return -1
    d = heard(doms, L.KIND_NETFLOW, exporter, domain, 0, 0, clock, errs)
    if d < 0:
        return 0
    clock_s = clock // L.NS
    p = p0 + hlen
    bad = False
    while p + 4 <= end:
        sid = uint(buf, p, 2)
        slen = uint(buf, p + 2, 2)
        if slen < 4 or p + slen > end:
            errs[L.E_SET_LENGTH] += 1
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
                        errs[L.E_BAD_TEMPLATE] += 1
                    break
                q = nq
        elif sid >= 256:
            t = _find_template(tmpl, exporter, domain, sid)
            if t < 0:
                errs[L.E_UNKNOWN_TEMPLATE] += 1
            elif clock_s - tmpl[t, L.T_SEEN] > template_timeout_s:
                errs[L.E_EXPIRED] += 1
            elif tmpl[t, L.T_PLAN + L.P_OK] == 1:
                r += _fixed_set(
                    buf, q, send, tmpl, t, doms, d, uptime, clock, not ipfix, addr, rows, w, rate_out, r, errs
                )
            else:
                var = tmpl[t, L.T_VAR] == 1
                rl = tmpl[t, L.T_RECLEN]
                lay, lt = tmpl, t  # the record's IE offsets: the template's, or a walked record's
                while q + tmpl[t, L.T_RECLEN] <= send and r < cap:
                    if var:
                        rl = _walk(buf, q, send, tmpl, t, one)
                        if rl < 0:
                            errs[L.E_SET_LENGTH] += 1
                            bad = True
                            break
                        lay, lt = one, 0
                    if tmpl[t, L.T_OPT] == 1:
                        _options_record(buf, q, lay, lt, doms, d)
                    else:
                        r += _data_record(
                            buf,
                            q,
                            lay,
                            lt,
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
        errs[L.E_OK] += 1
    return r - r0
