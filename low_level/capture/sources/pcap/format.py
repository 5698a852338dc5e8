"""The capture-file formats the replay reads: classic pcap and pcapng layouts, the replay kernels' state
and parameter slots, malformed-record reasons, link types, and the byte readers the walkers share.

Python-side checks that must fail when a file is opened (a link type lowwater cannot read declared before
the first packet, ``link``) live here too; the per-record walk is ``low_level.capture.sources.pcap.walk``.
"""

from __future__ import annotations

import struct
import sys

import numpy as np
from numba import njit

from low_level.capture.sources.base import NST_BASE
from low_level.capture.sources.pcap.link import linktype_msg, readable

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

P_END, P_BE, P_TSMULT, P_IFIDX, P_MAXN, P_WAIT, P_ELAPSED, P_OUTBASE, P_REBASE, P_MAXCAP, P_LINKTYPE = range(
    11
)
NP = 11

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

PCAP_MAX_CAPLEN = 262144
CHUNK = 65536
# bytes of file the fast path asks for ahead of the record it reads: 8M 80-byte records took 0.067 s of CPU
# instead of 0.089 (1024 or 16384 bytes: no better)
PREFETCH_AHEAD = 4096


class UnsupportedLinktypeError(ValueError):
    """The capture file holds frames of a link layer lowwater cannot read (``link.READABLE``)."""


@njit(cache=True, nogil=True, inline="always")
def _rd16(b, o, be):
    if be:
        return (np.int64(b[o]) << 8) | np.int64(b[o + 1])
    return np.int64(b[o]) | (np.int64(b[o + 1]) << 8)


@njit(cache=True, nogil=True, inline="always")
def _rd32(b, o, be):
    if be:
        return (
            (np.int64(b[o]) << 24)
            | (np.int64(b[o + 1]) << 16)
            | (np.int64(b[o + 2]) << 8)
            | np.int64(b[o + 3])
        )
    return (
        np.int64(b[o]) | (np.int64(b[o + 1]) << 8) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24)
    )


def _pcapng_header_linktypes(buf: np.ndarray, path: str) -> None:
    """Check the interfaces declared before the first packet; raise on one lowwater cannot read.

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
            if not readable(linktype):
                raise UnsupportedLinktypeError(
                    linktype_msg(path, linktype, f" (interface block at offset {pos})")
                )
        elif btype in (BT_EPB, BT_PB, BT_SPB):
            return
        pos += total
