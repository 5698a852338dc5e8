"""The Numba walkers of a capture file: classic pcap records and pcapng blocks into a ring.

Each call walks up to ``p[P_MAXN]`` records from ``st[S_POS]`` and stops early at the end of the file,
at a damaged record (reason in ``st``, ``format.BAD_REASONS``), on a full ring (fast mode) or at a
packet not yet due (paced mode). Both walkers read their parameters (``_begin``), push a record
(``_emit``), count its outcome (``_tally``) and store their counters (``_end``) the same way; they
differ in how a record is framed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.capture.ring import (
    BYTES,
    CAPTURED,
    HEAD,
    TAIL,
    TRUNCATED,
    RingArrays,
    copy_words,
    load_u64,
    pin_ring,
    prefetch_read,
    ring_full,
    ring_push_from,
)
from low_level.capture.sources.base import count_frames
from low_level.capture.sources.pcap.format import (
    BIG_ENDIAN_HOST,
    BOM_BE,
    BOM_LE,
    BT_EPB,
    BT_IDB,
    BT_PB,
    BT_SHB,
    BT_SPB,
    FOREVER,
    IF_FACTOR,
    IF_LINKTYPE,
    IF_MODE,
    IF_OFFSET_NS,
    IF_SNAPLEN,
    NONE,
    P_BE,
    P_ELAPSED,
    P_END,
    P_IFIDX,
    P_LINKTYPE,
    P_MAXCAP,
    P_MAXN,
    P_OUTBASE,
    P_REBASE,
    P_TSMULT,
    P_WAIT,
    PREFETCH_AHEAD,
    RC_CHUNK,
    RC_EOF,
    RC_FULL,
    RC_LINKTYPE,
    RC_MALFORMED,
    RC_WAIT,
    S_BAD_A,
    S_BAD_B,
    S_BAD_CODE,
    S_BAD_POS,
    S_BASE_IN,
    S_BE,
    S_IFBASE,
    S_LAST_TS,
    S_NEXT_REL,
    S_NIF,
    S_PASS_READ,
    S_POS,
    TSR_BIN,
    TSR_DIV,
    TSR_MUL,
    _rd16,
    _rd32,
)
from low_level.capture.sources.pcap.link import LT_ETHERNET, readable, to_ethernet
from low_level.jit.refcount import pin


@njit(cache=True, nogil=True, inline="always")
def _bad(st, pos, code, a, b):
    st[S_BAD_POS] = pos
    st[S_BAD_CODE] = code
    st[S_BAD_A] = a
    st[S_BAD_B] = b
    return RC_MALFORMED


E_PUSHED, E_DROPPED = 100, 101  # _emit outcomes besides RC_WAIT / RC_FULL


@njit(cache=True, nogil=True)
def _emit(buf, off, cap, wl, ts, ifidx, scratch, base_in, clock, ring):
    """Push one record: returns (E_PUSHED | E_DROPPED | RC_WAIT | RC_FULL, base_in, rel). ``clock`` is
    :func:`_begin`'s (when a record is due, what time it gets).

    RC_WAIT (not due yet, ``rel`` says when) and RC_FULL leave the record to be retried. With ``off`` -1
    the frame is ``scratch[:cap]``: a record of another link layer rewritten as Ethernet by the walker
    (``link.to_ethernet``; called here, it made this function three times slower).
    Counters are kept by the caller in locals: stores to ``st`` on every packet would halve the speed.
    A called function with one exit, every array pinned there (low_level.jit.refcount), rather than an inlined
    one: Numba's inliner rebinds array arguments, an atomic incref/decref each per packet (that cost
    the replay nine tenths of its speed).
    """
    elapsed, wait, rebase, outbase, scale = clock
    rel = np.int64(0)
    out = np.int64(0)
    code = E_PUSHED
    if ts == NONE:  # a Simple Packet Block before any timestamp: due now, time 0 (or the rebase time)
        out = outbase if rebase else np.int64(0)
    else:
        if base_in == NONE:
            base_in = ts
        rel = ts - base_in
        if rel > elapsed:
            code = RC_WAIT
        elif not rebase:
            out = ts
        elif scale == 1.0:
            out = outbase + rel
        else:
            out = outbase + np.int64(rel * scale)
    if code == E_PUSHED:
        if wait and ring_full(ring):
            code = RC_FULL
        elif not ring_push_from(ring, buf, scratch, off, cap, wl, out, ifidx):
            code = E_DROPPED
    pin(buf)
    pin(scratch)
    pin_ring(ring)
    return code, base_in, rel


@njit(cache=True, nogil=True)
def _begin(p, st, scale):
    """Where a walk starts, (end, pos, base_in), and its clock: (elapsed, wait, rebase, outbase, scale), a
    tuple of numbers (no reference counts) that :func:`_emit` takes as one argument."""
    r = (p[P_END], st[S_POS], st[S_BASE_IN])
    clock = (p[P_ELAPSED], p[P_WAIT] != 0, p[P_REBASE] != 0, p[P_OUTBASE], scale)
    pin(p)
    pin(st)
    return r, clock


@njit(cache=True, nogil=True, inline="always")
def _tally(e, wl, npushed, ndrops, nbytes):
    """Count one record's outcome (E_PUSHED or E_DROPPED) in the walker's local counters."""
    if e == E_PUSHED:
        return npushed + 1, ndrops, nbytes + wl
    return npushed, ndrops + 1, nbytes


@njit(cache=True, nogil=True)
def _end(st, pos, base_in, nread, npushed, ndrops, nbytes):
    """Store where a walk stopped and what it counted (once per call: per record would halve the speed)."""
    st[S_POS] = pos
    st[S_BASE_IN] = base_in
    st[S_PASS_READ] += nread
    count_frames(st, nread, npushed, ndrops, nbytes)
    pin(st)


@njit(cache=True, nogil=True)
def pcap_kernel(
    buf: np.ndarray,
    st: np.ndarray,
    p: np.ndarray,
    scale: float,
    scratch: np.ndarray,
    ring: RingArrays,
    offs: np.ndarray,
) -> int:
    """Walk classic pcap records from st[S_POS]: up to p[P_MAXN] of them, stopping early at the end,
    at a damaged record, on a full ring (fast mode) or at a packet not yet due (paced mode).

    A fast replay without rebasing (the common case: a file read as fast as the ring takes it) copies
    each record into the ring right here, checking for room against a cached TAIL and adding the
    ring's counters once per call: the two calls per record of the general path (``_emit``, then
    ``ring_push``, each passing a dozen arrays) cost as much as the kernel that consumes the frames.
    A record header in the host's byte order is read as two 8-byte words: sixteen byte reads shifted
    together were a quarter of the replay's time; it asks for the file PREFETCH_AHEAD bytes ahead. With a
    non-empty ``offs`` (a ring over this file, ``frames is buf``: Ring.over) a frame is not copied at all:
    its slot gets the frame's offset in the file. Only the fast path may fill such a ring (the caller sees to it).
    """
    (end, pos, base_in), clock = _begin(p, st, scale)
    elapsed, wait, rebase, _, _ = clock
    frames, snaplen, caplen, wirelen, tss, iface, ctr = ring
    be = p[P_BE] != 0
    mult = p[P_TSMULT]
    maxcap = p[P_MAXCAP]
    ifidx = p[P_IFIDX]
    linktype = p[P_LINKTYPE]
    nread = npushed = ndrops = nbytes = np.int64(0)
    # never waits for a due time, copies the record as it is
    fast = wait and not rebase and elapsed == FOREVER and linktype == LT_ETHERNET
    zero_copy = offs.shape[0] != 0
    words = be == BIG_ENDIAN_HOST  # the file's byte order is the host's: header fields read two at a time
    nslots = caplen.shape[0]
    head = ctr[HEAD]
    room = np.int64(0)  # free slots known without reading TAIL again
    ntrunc = np.int64(0)
    nfast = np.int64(0)
    fast_bytes = np.int64(0)
    rc = RC_CHUNK
    for _ in range(p[P_MAXN]):
        if pos >= end:
            rc = RC_EOF
            break
        if pos + 16 > end:
            rc = _bad(st, pos, 1, 16, end - pos)
            break
        if words:
            w0 = load_u64(buf, pos)
            w1 = load_u64(buf, pos + 8)
            sec, frac = w0 & 0xFFFFFFFF, (w0 >> 32) & 0xFFFFFFFF
            cap, orig = w1 & 0xFFFFFFFF, (w1 >> 32) & 0xFFFFFFFF
        else:
            sec = _rd32(buf, pos, be)
            frac = _rd32(buf, pos + 4, be)
            cap = _rd32(buf, pos + 8, be)
            orig = _rd32(buf, pos + 12, be)
        if cap > maxcap:
            rc = _bad(st, pos, 2, cap, maxcap)
            break
        if pos + 16 + cap > end:
            rc = _bad(st, pos, 3, cap, end - pos - 16)
            break
        wl = orig if orig >= cap else cap
        if fast:
            prefetch_read(buf, pos + PREFETCH_AHEAD)
            if room <= 0:
                room = nslots - (head - ctr[TAIL])
                if room <= 0:
                    rc = RC_FULL
                    break
            t = sec * 1_000_000_000 + frac * mult
            if base_in == NONE:
                base_in = t
            slot = head & (nslots - 1)
            k = cap if cap < snaplen else snaplen
            if k < cap:
                ntrunc += 1
            if zero_copy:
                offs[slot] = pos + 16
            else:
                copy_words(frames, slot * snaplen, buf, pos + 16, k)
            caplen[slot] = k
            wirelen[slot] = wl
            tss[slot] = t
            iface[slot] = ifidx
            head += 1
            ctr[HEAD] = head  # published after the slot is written (stores stay in order on x86-64)
            room -= 1
            npushed += 1
            nbytes += wl
            nfast += 1
            fast_bytes += wl
            nread += 1
            pos += 16 + cap
            continue
        doff, dcap = pos + 16, cap
        if linktype != LT_ETHERNET:
            doff, dcap = -1, to_ethernet(buf, doff, cap, linktype, scratch)
        e, base_in, rel = _emit(
            buf, doff, dcap, wl, sec * 1_000_000_000 + frac * mult, ifidx, scratch, base_in, clock, ring
        )
        if e != E_PUSHED and e != E_DROPPED:  # not due yet, or the ring is full: retried at the next call
            st[S_NEXT_REL] = rel
            rc = e
            break
        npushed, ndrops, nbytes = _tally(e, wl, npushed, ndrops, nbytes)
        nread += 1
        pos += 16 + cap
    _end(st, pos, base_in, nread, npushed, ndrops, nbytes)
    if nfast > 0:
        ctr[CAPTURED] += nfast
        ctr[BYTES] += fast_bytes
        ctr[TRUNCATED] += ntrunc
    return rc


@njit(cache=True, nogil=True, inline="always")
def _pow10(n):
    r = np.int64(1)
    for _ in range(n):
        r *= 10
    return r


@njit(cache=True, nogil=True, inline="always")
def _units_to_ns(t, mode, factor):
    if mode == TSR_MUL:
        return t * factor
    if mode == TSR_DIV:
        return t // factor
    # binary fraction: factor = number of fractional bits
    sec = t >> factor
    frac = t & ((np.int64(1) << factor) - 1)
    if factor <= 33:
        return sec * 1_000_000_000 + ((frac * 1_000_000_000) >> factor)
    return sec * 1_000_000_000 + np.int64(frac * (1e9 / 2.0**factor))


@njit(cache=True, nogil=True)
def _idb(buf, pos, total, be, st, ifs):
    """Record an Interface Description Block; returns RC_CHUNK, RC_MALFORMED or RC_LINKTYPE."""
    if total < 20:
        return _bad(st, pos, 13, total, 20)
    nif = st[S_NIF]
    if st[S_IFBASE] + nif >= ifs.shape[0]:
        return _bad(st, pos, 12, nif, ifs.shape[0])
    row = st[S_IFBASE] + nif
    linktype = _rd16(buf, pos + 8, be)
    ifs[row, IF_LINKTYPE] = linktype
    ifs[row, IF_MODE] = TSR_MUL
    ifs[row, IF_FACTOR] = 1000  # default resolution: microseconds
    ifs[row, IF_OFFSET_NS] = 0
    ifs[row, IF_SNAPLEN] = _rd32(buf, pos + 12, be)
    o = pos + 16
    oend = pos + total - 4
    while o + 4 <= oend:
        code = _rd16(buf, o, be)
        olen = _rd16(buf, o + 2, be)
        if code == 0 or o + 4 + olen > oend:
            break
        if code == 9 and olen >= 1:  # if_tsresol
            v = np.int64(buf[o + 4])
            if v & 0x80:
                ifs[row, IF_MODE] = TSR_BIN
                ifs[row, IF_FACTOR] = min(v & 0x7F, 62)
            elif v <= 9:
                ifs[row, IF_MODE] = TSR_MUL
                ifs[row, IF_FACTOR] = _pow10(9 - v)
            else:
                ifs[row, IF_MODE] = TSR_DIV
                ifs[row, IF_FACTOR] = _pow10(min(v - 9, 18))
        elif code == 14 and olen >= 8:  # if_tsoffset: seconds, signed
            lo = _rd32(buf, o + 4, be)
            hi = _rd32(buf, o + 8, be)
            if be:
                lo, hi = hi, lo
            ifs[row, IF_OFFSET_NS] = ((hi << 32) | lo) * 1_000_000_000
        o += 4 + ((olen + 3) & ~3)
    st[S_NIF] = nif + 1
    if not readable(linktype):
        st[S_BAD_POS] = pos
        st[S_BAD_A] = linktype
        st[S_BAD_B] = nif
        return RC_LINKTYPE
    return RC_CHUNK


@njit(cache=True, nogil=True)
def pcapng_kernel(
    buf: np.ndarray,
    st: np.ndarray,
    p: np.ndarray,
    scale: float,
    ifs: np.ndarray,
    scratch: np.ndarray,
    ring: RingArrays,
) -> int:
    """Walk pcapng blocks from st[S_POS] (same stopping rules as :func:`pcap_kernel`)."""
    (end, pos, base_in), clock = _begin(p, st, scale)
    ifidx0 = p[P_IFIDX]
    last_ts = st[S_LAST_TS]
    nread = npushed = ndrops = nbytes = np.int64(0)
    rc = RC_CHUNK
    for _ in range(p[P_MAXN]):
        if pos >= end:
            rc = RC_EOF
            break
        if pos + 12 > end:
            rc = _bad(st, pos, 4, 12, end - pos)
            break
        if _rd32(buf, pos, False) == BT_SHB:  # the same bytes in both byte orders
            bom = _rd32(buf, pos + 8, False)
            if bom == BOM_LE:
                st[S_BE] = 0
            elif bom == BOM_BE:
                st[S_BE] = 1
            else:
                rc = _bad(st, pos, 8, bom, 0)
                break
            st[S_IFBASE] += st[S_NIF]
            st[S_NIF] = 0
        be = st[S_BE] != 0
        btype = _rd32(buf, pos, be)
        total = _rd32(buf, pos + 4, be)
        if total < 12 or total & 3:
            rc = _bad(st, pos, 5, total, 0)
            break
        if pos + total > end:
            rc = _bad(st, pos, 6, total, end - pos)
            break
        trailer = _rd32(buf, pos + total - 4, be)
        if trailer != total:
            rc = _bad(st, pos, 7, total, trailer)
            break
        if btype == BT_IDB:
            rc = _idb(buf, pos, total, be, st, ifs)
            if rc != RC_CHUNK:
                break
        elif btype == BT_EPB or btype == BT_PB or btype == BT_SPB:
            if btype == BT_SPB:
                if total < 16:
                    rc = _bad(st, pos, 9, total, 0)
                    break
                ifid = np.int64(0)
                orig = _rd32(buf, pos + 8, be)
                data = pos + 12
                room = total - 16
                cap = orig if orig < room else room
            else:
                if total < 32:
                    rc = _bad(st, pos, 9, total, 0)
                    break
                if btype == BT_EPB:
                    ifid = _rd32(buf, pos + 8, be)
                else:
                    ifid = _rd16(buf, pos + 8, be)
                cap = _rd32(buf, pos + 20, be)
                orig = _rd32(buf, pos + 24, be)
                data = pos + 28
                if 32 + cap > total:
                    rc = _bad(st, pos, 10, cap, 0)
                    break
            if ifid >= st[S_NIF]:
                rc = _bad(st, pos, 11, ifid, st[S_NIF])
                break
            row = st[S_IFBASE] + ifid
            if btype == BT_SPB:
                snap = ifs[row, IF_SNAPLEN]
                if snap > 0 and cap > snap:
                    cap = snap
                ts = last_ts  # SPBs carry no timestamp: reuse the previous packet's
            else:
                hi = _rd32(buf, pos + 12, be)
                lo = _rd32(buf, pos + 16, be)
                ts = (
                    _units_to_ns((hi << 32) | lo, ifs[row, IF_MODE], ifs[row, IF_FACTOR])
                    + ifs[row, IF_OFFSET_NS]
                )
            wl = orig if orig >= cap else cap
            linktype = ifs[row, IF_LINKTYPE]
            if linktype != LT_ETHERNET:
                data, cap = -1, to_ethernet(buf, data, cap, linktype, scratch)
            e, base_in, rel = _emit(buf, data, cap, wl, ts, ifidx0 + row, scratch, base_in, clock, ring)
            if e != E_PUSHED and e != E_DROPPED:
                st[S_NEXT_REL] = rel
                rc = e
                break
            npushed, ndrops, nbytes = _tally(e, wl, npushed, ndrops, nbytes)
            nread += 1
            if ts != NONE:
                last_ts = ts
        pos += total
    st[S_LAST_TS] = last_ts
    _end(st, pos, base_in, nread, npushed, ndrops, nbytes)
    return rc
