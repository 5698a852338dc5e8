"""Longest-prefix match of packet addresses against the networks file, in Numba, at line rate.

Why intervals rather than a trie: prefixes of a networks file are either nested or disjoint, so they cut
the 128-bit address space (IPv4 as ``::ffff:0:0/96``, one space for both families) into at most
``2n + 1`` intervals on each of which the most specific prefix is the same. :func:`build` computes
those intervals once per (re)load with one sweep over the sorted prefixes; a lookup is then a single
binary search over the interval starts (about ``log2(2n)`` probes of two words, no per-length loop, no
pointer chasing), and the whole table is one ``(4, k)`` int64 array: rows are the start's high and low
words (sign bit flipped, so that signed comparison orders them as unsigned), the net id and the ASN.

The array's type never changes with its content, so a reload (SIGHUP) swaps the array between two
kernel calls without recompiling anything and without touching the aggregation tables.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract.fields import IPVER, to_int64
from contract.networks import Networks

_SIGN = np.int64(-(1 << 63))
ROW_HI, ROW_LO = 0, 1  # rows 2 and 3 are contract.fields.LPM_NET / LPM_ASN


def build(networks: Networks | None) -> np.ndarray:
    """The ``(4, k)`` lookup table of these networks (k >= 1; no networks: everything maps to 0)."""
    items = sorted(networks.networks if networks else (), key=lambda n: (n.value, n.length))
    segs: list[list[int]] = [[0, -1]]  # [start, index into items or -1]

    def emit(start: int, idx: int) -> None:
        if segs[-1][0] == start:
            segs[-1][1] = idx
        else:
            segs.append([start, idx])

    stack: list[tuple[int, int]] = []  # (last address, index) of the prefixes holding the sweep point
    for idx, n in enumerate(items):
        while stack and stack[-1][0] < n.value:
            last, _ = stack.pop()
            emit(last + 1, stack[-1][1] if stack else -1)
        emit(n.value, idx)
        stack.append((n.last, idx))
    while stack:
        last, _ = stack.pop()
        if last + 1 < 1 << 128:
            emit(last + 1, stack[-1][1] if stack else -1)
    merged = [s for i, s in enumerate(segs) if i == 0 or s[1] != segs[i - 1][1]]
    table = np.zeros((4, len(merged)), dtype=np.int64)
    for j, (start, idx) in enumerate(merged):
        table[ROW_HI, j] = to_int64(start >> 64) ^ int(_SIGN)
        table[ROW_LO, j] = to_int64(start) ^ int(_SIGN)
        if idx >= 0:
            table[2, j] = items[idx].id
            table[3, j] = items[idx].asn
    return table


@njit(cache=True, nogil=True, inline="always")
def search(nets, hi, lo):
    """Index of the interval holding the address (hi, lo) (int64 words of the unsigned address)."""
    ah = hi ^ _SIGN
    al = lo ^ _SIGN
    a = 0
    b = nets.shape[1] - 1  # interval 0 starts at address 0: a always holds the answer's lower bound
    while a < b:
        mid = (a + b + 1) >> 1
        sh = nets[ROW_HI, mid]
        if sh < ah or (sh == ah and nets[ROW_LO, mid] <= al):
            a = mid
        else:
            b = mid - 1
    return a


@njit(cache=True, nogil=True, inline="always")
def enrich(nets, row, col, which):
    """The net id (which = LPM_NET) or ASN (LPM_ASN) of the address at row[col], row[col + 1]; 0 without IP."""
    if row[IPVER] == 0:
        return np.int64(0)
    return nets[which, search(nets, row[col], row[col + 1])]


@njit(cache=True, nogil=True)
def lookup_batch(nets, hi, lo, which, out):
    """out[i] = the ``which`` row of the interval of address i (tests, benchmarks)."""
    for i in range(hi.shape[0]):
        out[i] = nets[which, search(nets, hi[i], lo[i])]
