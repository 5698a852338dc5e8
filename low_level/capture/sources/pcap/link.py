"""Link layers a capture file may hold, and their normalisation into the Ethernet frame the parser reads.

The parser (``low_level.kernel.parse``) reads Ethernet frames only; a replay of any other link layer
rewrites each record, in the walker's Numba loop, as an Ethernet frame: a 14-byte header (destination
MAC 0, source MAC the link-layer address the record carries when it is 6 bytes long, else 0, and the
record's protocol as ethertype) followed by the record's network-layer bytes. So VLAN tags a Linux
cooked capture kept after its header (protocol 0x8100) are walked as usual.

* Linux cooked, SLL (113): 16-byte header, protocol in its last two bytes.
* Linux cooked v2, SLL2 (276): 20-byte header, protocol in its first two bytes.
* Raw IP (101; 12 and 14 as written on some platforms): the version nibble picks IPv4 or IPv6
  (anything else: ethertype 0, counted as ``non_ip``); raw IPv4 (228) and raw IPv6 (229) are fixed.

A record shorter than its link header becomes an empty frame (``truncated_ethernet``). LEN stays the
record's wire length as the file gives it (tshark's ``frame.len``): the cooked header is counted, an
Ethernet header that was never captured is not.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.capture.ring import copy_bytes
from low_level.jit.refcount import pin

LT_ETHERNET, LT_RAW_BSD, LT_RAW_OPENBSD, LT_RAW, LT_SLL, LT_IPV4, LT_IPV6, LT_SLL2 = (
    1,
    12,
    14,
    101,
    113,
    228,
    229,
    276,
)
READABLE = frozenset((LT_ETHERNET, LT_RAW_BSD, LT_RAW_OPENBSD, LT_RAW, LT_SLL, LT_IPV4, LT_IPV6, LT_SLL2))

LINKTYPE_NAMES = {
    0: "NULL/loopback",
    LT_ETHERNET: "Ethernet",
    LT_RAW_BSD: "raw IP",
    LT_RAW_OPENBSD: "raw IP",
    LT_RAW: "raw IP",
    105: "IEEE 802.11",
    LT_SLL: "Linux cooked (SLL)",
    127: "802.11 radiotap",
    LT_IPV4: "raw IPv4",
    LT_IPV6: "raw IPv6",
    LT_SLL2: "Linux cooked v2 (SLL2)",
}

ETH_HDR = 14
SCRATCH = 512  # bytes of a normalised frame kept (a ring's snaplen is far smaller)


@njit(cache=True, nogil=True)
def readable(linktype: int) -> bool:
    """Whether lowwater reads this link type (``READABLE``; from Python and from the walkers)."""
    return (
        linktype == LT_ETHERNET
        or linktype == LT_SLL
        or linktype == LT_SLL2
        or linktype == LT_RAW
        or linktype == LT_IPV4
        or linktype == LT_IPV6
        or linktype == LT_RAW_BSD
        or linktype == LT_RAW_OPENBSD
    )


def linktype_msg(path: str, linktype: int, where: str = "") -> str:
    """The error for a file whose link layer lowwater cannot read: the file, the linktype, what it can read."""
    name = LINKTYPE_NAMES.get(linktype, "unknown")
    ok = ", ".join(f"{lt} ({LINKTYPE_NAMES[lt]})" for lt in sorted(READABLE))
    return f"{path}: linktype {linktype} ({name}){where} is not supported; lowwater reads linktypes {ok}"


@njit(cache=True, nogil=True)
def to_ethernet(buf, off, cap, linktype, out):
    """Write the record ``buf[off:off+cap]`` of ``linktype`` as an Ethernet frame into ``out`` (its first
    ``len(out)`` bytes at most); returns the normalised frame's full length (0: link header cut).
    ``out[0:6]`` (the destination MAC) is never written: the caller's scratch starts zeroed."""
    et = np.int64(-1)
    hdr = np.int64(0)
    mac = np.int64(-1)
    n = np.int64(0)
    if linktype == LT_SLL:
        hdr = 16
        if cap >= hdr:
            et = (np.int64(buf[off + 14]) << 8) | np.int64(buf[off + 15])
            if buf[off + 4] == 0 and buf[off + 5] == 6:
                mac = off + 6
    elif linktype == LT_SLL2:
        hdr = 20
        if cap >= hdr:
            et = (np.int64(buf[off]) << 8) | np.int64(buf[off + 1])
            if buf[off + 11] == 6:
                mac = off + 12
    elif cap >= 1:  # raw IP
        v = np.int64(buf[off] >> 4)
        if linktype == LT_IPV4:
            et = 0x0800
        elif linktype == LT_IPV6:
            et = 0x86DD
        elif v == 4:
            et = 0x0800
        elif v == 6:
            et = 0x86DD
        else:
            et = 0
    if et >= 0:
        if mac >= 0:
            copy_bytes(out, 6, buf, mac, 6)
        else:
            copy_bytes(out, 6, out, 0, 6)
        out[12] = et >> 8
        out[13] = et & 0xFF
        n = ETH_HDR + cap - hdr
        copy_bytes(out, ETH_HDR, buf, off + hdr, min(n, out.shape[0]) - ETH_HDR)
    pin(buf)
    pin(out)
    return n
