"""The capture ring: a fixed-size single-producer/single-consumer buffer of fixed-size frame slots.

Sources copy frames in (from Numba code, without the GIL); the aggregation kernel reads a contiguous
range of sequence numbers out. Slot ``seq % nslots`` holds frame number ``seq``. When the ring is full
the producer drops the frame and counts it: capture never blocks silently.

Counters live in one int64 array ``ctr`` so Numba kernels and Python share them without locks:
``HEAD`` (next sequence the producer writes) is only advanced by the producer, ``TAIL`` (next
sequence the consumer reads) only by the consumer.
"""

from __future__ import annotations

import numpy as np
from numba import njit

HEAD, TAIL, DROPS, CAPTURED, BYTES, TRUNCATED = 0, 1, 2, 3, 4, 5
NCTR = 8
DEFAULT_SNAPLEN = 128  # enough for Ethernet + 2 VLAN tags + IPv6 with extension headers + TCP


class Ring:
    """Fixed-size frame ring; ``snaplen`` bytes are kept of each frame (the wire length is kept too)."""

    def __init__(self, nslots: int = 1 << 16, snaplen: int = DEFAULT_SNAPLEN) -> None:
        if nslots < 2 or nslots & (nslots - 1):
            raise ValueError("ring slots must be a power of two >= 2")
        self.nslots = nslots
        self.snaplen = snaplen
        self.frames = np.zeros(nslots * snaplen, dtype=np.uint8)
        self.caplen = np.zeros(nslots, dtype=np.int64)
        self.wirelen = np.zeros(nslots, dtype=np.int64)
        self.ts = np.zeros(nslots, dtype=np.int64)
        self.iface = np.zeros(nslots, dtype=np.int64)
        self.ctr = np.zeros(NCTR, dtype=np.int64)

    @property
    def fill(self) -> int:
        return int(self.ctr[HEAD] - self.ctr[TAIL])

    @property
    def drops(self) -> int:
        return int(self.ctr[DROPS])

    def arrays(self) -> tuple:
        """The arrays a Numba producer needs, in the order of :func:`ring_push`."""
        return (self.frames, self.snaplen, self.caplen, self.wirelen, self.ts, self.iface, self.ctr)


@njit(cache=True, nogil=True)
def ring_push(frames, snaplen, caplen, wirelen, ts, iface, ctr, src, off, n, orig_len, ts_ns, ifidx) -> bool:
    """Copy one frame (``src[off:off+n]``) into the ring; False (and a counted drop) when full."""
    nslots = caplen.shape[0]
    head = ctr[HEAD]
    if head - ctr[TAIL] >= nslots:
        ctr[DROPS] += 1
        return False
    slot = head & (nslots - 1)
    k = n if n < snaplen else snaplen
    if k < n:
        ctr[TRUNCATED] += 1
    base = slot * snaplen
    for j in range(k):
        frames[base + j] = src[off + j]
    caplen[slot] = k
    wirelen[slot] = orig_len
    ts[slot] = ts_ns
    iface[slot] = ifidx
    ctr[CAPTURED] += 1
    ctr[BYTES] += orig_len
    ctr[HEAD] = head + 1
    return True
