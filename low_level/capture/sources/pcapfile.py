"""Replay a pcap or pcapng file into a ring.

The file is memory-mapped and walked by Numba kernels, a chunk of records per call, so a replay runs
at memory speed and stop() is still noticed within a few milliseconds.

Formats: classic pcap (microsecond and nanosecond magics, either byte order) and pcapng (sections of
either byte order, several interfaces with ``if_tsresol`` / ``if_tsoffset``, Enhanced, Simple and the
obsolete Packet blocks; other blocks are skipped). Only Ethernet (linktype 1) is accepted: the
parser downstream reads Ethernet frames.

A damaged file never makes the replay crash or read past the end: it stops at the last good record
and reports why in ``stats()`` (``malformed_tail``, ``malformed_offset``, ``reason``).

Modes:

* ``"fast"``: as fast as the ring accepts. When the ring is full the source waits: a file replay must
  not lose packets (so ``drops`` stays 0).
* ``"paced"``: packets are released following the recorded gaps (divided by ``speed``), and when the
  ring is full they are dropped and counted, like a live capture.

Timestamps are the recorded ones, unless ``rebase_to_now``: then each pass is shifted so that its
first packet carries the wall clock at the start of the pass (and, when paced, later packets follow
at ``gap / speed``). Only then is ``live_clock`` True. With ``mode="fast", loop=True,
rebase_to_now=True`` a pass usually takes less wall time than the capture spans, so the next pass's
timestamps may step back: consumers must tolerate out-of-order time (lowwater's do).

In multi-section pcapng files interface ids restart in each section; frames get ``iface_index +``
the interface's ordinal counted over the whole file (== its id for the usual single section).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import sys
import time
from typing import Any

import numpy as np
from numba import njit

from low_level.capture.ring import (
    BYTES,
    CAPTURED,
    HEAD,
    TAIL,
    TRUNCATED,
    Ring,
    copy_words,
    load_u64,
    prefetch_read,
    ring_push,
)
from low_level.capture.sources.base import NST_BASE, ST_BYTES, ST_DROPS, ST_PUSHED, ST_READ, Backoff, Source
from low_level.jit.refcount import pin

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------
# kernel state (int64 array shared with Python) and parameters
S_POS = NST_BASE  # byte offset of the next record/block
S_BASE_IN = S_POS + 1  # timestamp (ns) of the first packet of the current pass, NONE before it
S_NEXT_REL = S_POS + 2  # paced: ns (file time, since the pass's first packet) when the next packet is due
S_BAD_POS = S_POS + 3
S_BAD_CODE = S_POS + 4
S_BAD_A = S_POS + 5
S_BAD_B = S_POS + 6
S_LAST_TS = S_POS + 7  # pcapng: last timestamp seen, for Simple Packet Blocks
S_BE = S_POS + 8  # pcapng: current section is big-endian
S_NIF = S_POS + 9  # pcapng: interfaces defined in the current section
S_IFBASE = S_POS + 10  # pcapng: interfaces defined in the earlier sections
S_PASS_READ = S_POS + 11  # packets read in the current pass
NST = S_POS + 12

P_END, P_BE, P_TSMULT, P_IFIDX, P_MAXN, P_WAIT, P_ELAPSED, P_OUTBASE, P_REBASE, P_MAXCAP = range(10)
NP = 10

BIG_ENDIAN_HOST = sys.byteorder == "big"
NONE = np.iinfo(np.int64).min
FOREVER = np.iinfo(np.int64).max

# kernel return codes
RC_CHUNK, RC_FULL, RC_WAIT, RC_EOF, RC_MALFORMED, RC_LINKTYPE = range(6)

# malformed reasons (S_BAD_CODE); a and b are S_BAD_A / S_BAD_B
BAD_REASONS = {
    1: "truncated record header: needs 16 bytes, {b} left",
    2: "record caplen {a} exceeds the limit {b}",
    3: "truncated record data: caplen {a}, {b} bytes left",
    4: "truncated block header: needs 8 bytes, {b} left",
    5: "bad block length {a}",
    6: "truncated block: length {a}, {b} bytes left",
    7: "block trailer length {b} != header length {a}",
    8: "bad section byte-order magic 0x{a:08x}",
    9: "packet block too short ({a} bytes)",
    10: "packet data ({a} bytes) exceeds its block",
    11: "packet references undefined interface {a} ({b} defined)",
    12: "too many interfaces (max {b})",
    13: "interface block too short ({a} bytes)",
}

BT_SHB = 0x0A0D0D0A
BT_IDB, BT_PB, BT_SPB, BT_EPB = 1, 2, 3, 6
BOM_LE = 0x1A2B3C4D  # the byte-order magic read as little endian
BOM_BE = 0x4D3C2B1A

MAX_IFACES = 4096
IF_LINKTYPE, IF_MODE, IF_FACTOR, IF_OFFSET_NS, IF_SNAPLEN = range(5)
TSR_MUL, TSR_DIV, TSR_BIN = 0, 1, 2

LINKTYPE_NAMES = {
    0: "NULL/loopback",
    1: "Ethernet",
    101: "raw IP",
    105: "IEEE 802.11",
    113: "Linux cooked (SLL)",
    127: "802.11 radiotap",
    228: "raw IPv4",
    229: "raw IPv6",
    276: "Linux cooked v2 (SLL2)",
}

PCAP_MAX_CAPLEN = 262144
CHUNK = 65536
# bytes of file the fast path asks for ahead of the record it reads: 8M 80-byte records took 0.067 s of CPU
# instead of 0.089 (1024 or 16384 bytes: no better)
PREFETCH_AHEAD = 4096


class UnsupportedLinktypeError(ValueError):
    """The capture file holds frames of a link layer other than Ethernet."""


def _linktype_msg(path: str, linktype: int, where: str = "") -> str:
    name = LINKTYPE_NAMES.get(linktype, "unknown")
    return (
        f"{path}: linktype {linktype} ({name}){where} is not supported; "
        "lowwater only reads Ethernet (linktype 1) captures"
    )


# ---------------------------------------------------------------------------------------------------
# Numba helpers


@njit(cache=True, nogil=True, inline="always")
def _rd16(b, o, be):
    if be:
        return (np.int64(b[o]) << 8) | np.int64(b[o + 1])
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8)


@njit(cache=True, nogil=True, inline="always")
def _rd32(b, o, be):
    if be:
        return (np.int64(b[o]) << 24) | (np.int64(b[o + 1]) << 16) | (np.int64(b[o + 2]) << 8) | np.int64(b[o + 3])
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24)


@njit(cache=True, nogil=True, inline="always")
def _bad(st, pos, code, a, b):
    st[S_BAD_POS] = pos
    st[S_BAD_CODE] = code
    st[S_BAD_A] = a
    st[S_BAD_B] = b
    return RC_MALFORMED


E_PUSHED, E_DROPPED = 100, 101  # _emit outcomes besides RC_WAIT / RC_FULL


@njit(cache=True, nogil=True)
def _emit(buf, off, cap, wl, ts, ifidx, base_in, elapsed, wait, rebase, outbase, scale,
          frames, snaplen, caplen, wirelen, tss, iface, ctr):
    """Push one record: returns (E_PUSHED | E_DROPPED | RC_WAIT | RC_FULL, base_in, rel).

    RC_WAIT (not due yet, ``rel`` says when) and RC_FULL leave the record to be retried.
    Counters are kept by the caller in locals: stores to ``st`` on every packet would halve the speed.
    A called function with one exit, every array pinned there (low_level.jit.refcount), rather than an inlined
    one: Numba's inliner rebinds array arguments, an atomic incref/decref each per packet (that cost
    the replay nine tenths of its speed).
    """
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
        if wait and ctr[HEAD] - ctr[TAIL] >= caplen.shape[0]:
            code = RC_FULL
        elif not ring_push(frames, snaplen, caplen, wirelen, tss, iface, ctr, buf, off, cap, wl, out, ifidx):
            code = E_DROPPED
    pin(buf)
    pin(frames)
    pin(caplen)
    pin(wirelen)
    pin(tss)
    pin(iface)
    pin(ctr)
    return code, base_in, rel


@njit(cache=True, nogil=True)
def pcap_kernel(buf: np.ndarray, st: np.ndarray, p: np.ndarray, scale: float, frames: np.ndarray, snaplen: int,
                caplen: np.ndarray, wirelen: np.ndarray, tss: np.ndarray, iface: np.ndarray, ctr: np.ndarray,
                offs: np.ndarray) -> int:
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
    end = p[P_END]
    be = p[P_BE] != 0
    mult = p[P_TSMULT]
    maxcap = p[P_MAXCAP]
    ifidx = p[P_IFIDX]
    elapsed = p[P_ELAPSED]
    wait = p[P_WAIT] != 0
    rebase = p[P_REBASE] != 0
    outbase = p[P_OUTBASE]
    pos = st[S_POS]
    base_in = st[S_BASE_IN]
    nread = npushed = ndrops = nbytes = np.int64(0)
    fast = wait and not rebase and elapsed == FOREVER  # never waits for a due time
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
        e, base_in, rel = _emit(buf, pos + 16, cap, wl, sec * 1_000_000_000 + frac * mult, ifidx, base_in, elapsed,
                                wait, rebase, outbase, scale, frames, snaplen, caplen, wirelen, tss, iface, ctr)
        if e == E_PUSHED:
            npushed += 1
            nbytes += wl
        elif e == E_DROPPED:
            ndrops += 1
        else:
            st[S_NEXT_REL] = rel
            rc = e
            break
        nread += 1
        pos += 16 + cap
    st[S_POS] = pos
    st[S_BASE_IN] = base_in
    st[ST_READ] += nread
    st[S_PASS_READ] += nread
    st[ST_PUSHED] += npushed
    st[ST_DROPS] += ndrops
    st[ST_BYTES] += nbytes
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
    if linktype != 1:
        st[S_BAD_POS] = pos
        st[S_BAD_A] = linktype
        st[S_BAD_B] = nif
        return RC_LINKTYPE
    return RC_CHUNK


@njit(cache=True, nogil=True)
def pcapng_kernel(buf: np.ndarray, st: np.ndarray, p: np.ndarray, scale: float, ifs: np.ndarray, frames: np.ndarray,
                  snaplen: int, caplen: np.ndarray, wirelen: np.ndarray, tss: np.ndarray, iface: np.ndarray,
                  ctr: np.ndarray) -> int:
    """Walk pcapng blocks from st[S_POS] (same stopping rules as :func:`pcap_kernel`)."""
    end = p[P_END]
    ifidx0 = p[P_IFIDX]
    elapsed = p[P_ELAPSED]
    wait = p[P_WAIT] != 0
    rebase = p[P_REBASE] != 0
    outbase = p[P_OUTBASE]
    pos = st[S_POS]
    base_in = st[S_BASE_IN]
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
                ts = _units_to_ns((hi << 32) | lo, ifs[row, IF_MODE], ifs[row, IF_FACTOR]) + ifs[row, IF_OFFSET_NS]
            wl = orig if orig >= cap else cap
            e, base_in, rel = _emit(buf, data, cap, wl, ts, ifidx0 + row, base_in, elapsed, wait, rebase, outbase,
                                    scale, frames, snaplen, caplen, wirelen, tss, iface, ctr)
            if e == E_PUSHED:
                npushed += 1
                nbytes += wl
            elif e == E_DROPPED:
                ndrops += 1
            else:
                st[S_NEXT_REL] = rel
                rc = e
                break
            nread += 1
            if ts != NONE:
                last_ts = ts
        pos += total
    st[S_POS] = pos
    st[S_BASE_IN] = base_in
    st[S_LAST_TS] = last_ts
    st[ST_READ] += nread
    st[S_PASS_READ] += nread
    st[ST_PUSHED] += npushed
    st[ST_DROPS] += ndrops
    st[ST_BYTES] += nbytes
    return rc


# ---------------------------------------------------------------------------------------------------
# Python side


def _pcapng_header_linktypes(buf: np.ndarray, path: str) -> None:
    """Check the interfaces declared before the first packet; raise on a non-Ethernet one.

    Runs at construction so a bad file fails when it is opened, not later in the producer thread.
    """
    data = memoryview(buf)
    pos, n, end, endian = 0, 0, len(buf), "<"
    while pos + 12 <= end and n < 10000:
        n += 1
        (btype,) = struct.unpack_from("<I", data, pos)
        if btype == BT_SHB:
            (bom,) = struct.unpack_from("<I", data, pos + 8)
            endian = "<" if bom == BOM_LE else ">"
        btype, total = struct.unpack_from(endian + "II", data, pos)
        if total < 12 or pos + total > end:
            return  # damaged: the kernel reports it
        if btype == BT_IDB and total >= 20:
            (linktype,) = struct.unpack_from(endian + "H", data, pos + 8)
            if linktype != 1:
                raise UnsupportedLinktypeError(_linktype_msg(path, linktype, f" (interface block at offset {pos})"))
        elif btype in (BT_EPB, BT_PB, BT_SPB):
            return
        pos += total


class PcapSource(Source):
    """Replays a pcap/pcapng capture into a ring (see the module docstring for modes and formats)."""

    kind = "pcap"

    def __init__(
        self,
        path: str | os.PathLike[str],
        ring: Ring,
        iface_index: int = 0,
        mode: str = "fast",
        loop: bool = False,
        rebase_to_now: bool = False,
        progress: bool = True,
        speed: float = 1.0,
    ) -> None:
        if mode not in ("fast", "paced"):
            raise ValueError(f"pcap mode must be 'fast' or 'paced', not {mode!r}")
        if not speed > 0:
            raise ValueError(f"pcap speed must be > 0, not {speed!r}")
        self.path = os.fspath(path)
        super().__init__(ring, [os.path.basename(self.path)], nstats=NST)
        self.iface_index = int(iface_index)
        self.mode = mode
        self.loop = bool(loop)
        self.rebase_to_now = bool(rebase_to_now)
        self.progress = bool(progress)
        self.speed = float(speed)
        self.live_clock = self.rebase_to_now
        self.passes = 0
        self.malformed_tail = False
        self.reason: str | None = None
        self._pulled = False

        size = os.path.getsize(self.path)
        if size < 24:
            raise ValueError(f"{self.path}: not a pcap/pcapng file ({size} bytes)")
        with open(self.path, "rb") as f:
            # a private mapping: writable as numpy sees it (so a ring over it has the type of any ring's
            # frames and the kernels compile once); nothing writes to it
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)
        try:
            self._detect()
        except Exception:
            self._cleanup()
            raise

    def _detect(self) -> None:
        head = bytes(self._buf[:24])
        (magic_le,) = struct.unpack("<I", head[:4])
        self._p = np.zeros(NP, dtype=np.int64)
        self._p[P_END] = len(self._buf)
        self._p[P_IFIDX] = self.iface_index
        self._ifs = np.zeros((MAX_IFACES, 5), dtype=np.int64)
        if magic_le == BT_SHB:
            self.format = "pcapng"
            self._data_start = 0
            _pcapng_header_linktypes(self._buf, self.path)
            return
        formats = {0xA1B2C3D4: 1000, 0xA1B23C4D: 1}
        (magic_be,) = struct.unpack(">I", head[:4])
        if magic_le in formats:
            endian, mult = "<", formats[magic_le]
        elif magic_be in formats:
            endian, mult = ">", formats[magic_be]
        else:
            raise ValueError(f"{self.path}: not a pcap/pcapng file (magic 0x{magic_le:08x})")
        _vmaj, _vmin, _zone, _sigfigs, snaplen, network = struct.unpack(endian + "HHiIII", head[4:24])
        linktype = network & 0xFFFF
        if linktype != 1:
            raise UnsupportedLinktypeError(_linktype_msg(self.path, linktype))
        self.format = "pcap-ns" if mult == 1 else "pcap"
        self._data_start = 24
        self._p[P_BE] = endian == ">"
        self._p[P_TSMULT] = mult
        self._p[P_MAXCAP] = max(snaplen, PCAP_MAX_CAPLEN)

    # --- producer ----------------------------------------------------------------------------
    def _new_pass(self) -> None:
        st = self._st
        st[S_POS] = self._data_start
        st[S_BASE_IN] = NONE
        st[S_LAST_TS] = NONE
        st[S_BE] = 0
        st[S_NIF] = 0
        st[S_IFBASE] = 0
        st[S_PASS_READ] = 0
        self._pass_mono = time.monotonic_ns()
        self._p[P_OUTBASE] = time.time_ns()
        self._p[P_REBASE] = self.rebase_to_now

    def _call(self) -> int:
        ring = self.ring
        if ring.zero_copy and (ring.frames is not self._buf or not self._zero_copy_ok()):
            raise RuntimeError("a ring over the file is only filled by a fast classic-pcap replay of that file")
        if self.format == "pcapng":
            return int(pcapng_kernel(self._buf, self._st, self._p, self._scale, self._ifs, *ring.arrays()))
        return int(pcap_kernel(self._buf, self._st, self._p, self._scale, *ring.arrays(), ring.offs))

    def _run(self) -> None:
        paced = self.mode == "paced"
        p, st = self._p, self._st
        p[P_MAXN] = CHUNK
        p[P_WAIT] = not paced
        p[P_ELAPSED] = FOREVER
        self._scale = 1.0 / self.speed if paced else 1.0
        bar = None
        if self.progress and not paced:
            from tqdm import tqdm

            bar = tqdm(desc=os.path.basename(self.path), unit="pkt", unit_scale=True, mininterval=0.5)
        shown = 0
        backoff = Backoff()
        self._new_pass()
        try:
            while not self._stop_evt.is_set():
                if paced:
                    p[P_ELAPSED] = int((time.monotonic_ns() - self._pass_mono) * self.speed)
                rc = self._call()
                if bar is not None and st[ST_READ] - shown >= 1:
                    bar.update(int(st[ST_READ]) - shown)
                    shown = int(st[ST_READ])
                    bar.set_postfix_str(f"{100.0 * st[S_POS] / max(1, p[P_END]):.0f}% of file", refresh=False)
                if rc == RC_CHUNK:
                    backoff.reset()
                elif rc == RC_FULL:
                    backoff.wait()
                elif rc == RC_WAIT:
                    due_mono = self._pass_mono + int(st[S_NEXT_REL] / self.speed)
                    delay = (due_mono - time.monotonic_ns()) / 1e9
                    if delay > 0:
                        self._stop_evt.wait(min(delay, 0.01))
                elif rc in (RC_EOF, RC_MALFORMED):
                    if self._end_of_pass(rc):
                        return
                elif rc == RC_LINKTYPE:
                    self._linktype_error()
        finally:
            if bar is not None:
                bar.close()

    def _end_of_pass(self, rc: int) -> bool:
        """The kernel reached the end of the file (or a malformed tail): count the pass, start the next
        one when looping over a file that had records, else finish. True when the replay is over."""
        if rc == RC_MALFORMED and not self.malformed_tail:
            self.malformed_tail = True
            self.reason = self._bad_reason()
        self.passes += 1
        if self.loop and self._st[S_PASS_READ] > 0:
            self._new_pass()
            return False
        self._finished = True
        return True

    def _linktype_error(self) -> None:
        """An interface block with a link type lowwater cannot parse: say which, where, and stop."""
        where = f" (interface block at offset {int(self._st[S_BAD_POS])})"
        self.reason = _linktype_msg(self.path, int(self._st[S_BAD_A]), where)
        raise UnsupportedLinktypeError(self.reason)

    # --- pulled by the consumer ---------------------------------------------------------------
    def _zero_copy_ok(self) -> bool:
        """Whether every record takes pcap_kernel's fast path (so none would be copied into the ring)."""
        return self.format != "pcapng" and self.mode == "fast" and not self.rebase_to_now

    def pull_ring(self, nslots: int, snaplen: int) -> Ring:
        """The ring to :meth:`pull` into: for a fast classic-pcap replay one over the mapped file itself
        (Ring.over: the kernel reads each frame where it lies, nothing is copied), else a plain ring.
        Also made this source's ring."""
        if self._zero_copy_ok() and self._buf.size:
            self.ring = Ring.over(self._buf, nslots, snaplen)
        else:
            self.ring = Ring(nslots, snaplen)
        return self.ring

    @property
    def can_pull(self) -> bool:
        """A fast replay can also be driven by its consumer (:meth:`pull`) instead of its own thread."""
        return self.mode == "fast" and self._thread is None

    def pull(self, max_frames: int) -> int:
        """Replay up to ``max_frames`` more records into the ring from the caller's thread; returns the
        frames pushed (0 once the replay is over: see ``finished`` and ``error``).

        For a consumer that has one core to itself and the reader: there a reader thread only adds
        thread switches, and with the ring's whole length between the writer and the reader the frames
        have left the cache when the kernel reads them. Pulled a few thousand at a time, the consumer
        reads them while they are still there. Never start() a source that is pulled."""
        if self._thread is not None or self.mode != "fast":
            raise RuntimeError("pull() is for a fast replay without its own thread")
        if self._finished or self.error is not None or self._stop_evt.is_set() or self._buf.size == 0:
            return 0  # over, failed, stopped or closed
        st, p = self._st, self._p
        if not self._pulled:
            self._pulled = True
            p[P_WAIT] = 1
            p[P_ELAPSED] = FOREVER
            self._scale = 1.0
            self._new_pass()
        p[P_MAXN] = max_frames
        before = int(st[ST_PUSHED])
        try:
            rc = self._call()
            if rc in (RC_EOF, RC_MALFORMED):
                self._end_of_pass(rc)
            elif rc == RC_LINKTYPE:
                self._linktype_error()
        except Exception as exc:  # as a source thread does: reported via .error and the log, never raised
            self.error = exc
            log.exception("%s source failed", self.kind)
        return int(st[ST_PUSHED]) - before

    def _bad_reason(self) -> str:
        st = self._st
        text = BAD_REASONS.get(int(st[S_BAD_CODE]), "code {a} {b}").format(a=int(st[S_BAD_A]), b=int(st[S_BAD_B]))
        return f"{self.path}: stopped at offset {int(st[S_BAD_POS])}: {text}"

    def _cleanup(self) -> None:
        self._buf = np.zeros(0, dtype=np.uint8)
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with it
            pass

    def stats(self) -> dict[str, Any]:
        """Base counters plus the file position, the passes done and why the replay stopped early."""
        d = super().stats()
        st = self._st
        d.update(
            path=self.path,
            format=getattr(self, "format", None),
            mode=self.mode,
            passes=self.passes,
            position=int(st[S_POS]),
            malformed_tail=self.malformed_tail,
            malformed_offset=int(st[S_BAD_POS]) if self.malformed_tail else None,
            reason=self.reason,
        )
        return d
