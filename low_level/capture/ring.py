"""The capture ring: a fixed-size single-producer/single-consumer buffer of fixed-size frame slots.

Sources copy frames in (from Numba code, without the GIL); the aggregation kernel reads a contiguous
range of sequence numbers out. Slot ``seq % nslots`` holds frame number ``seq``. When the ring is full
the producer drops the frame and counts it: capture never blocks silently.

A ring may also hold no frame bytes of its own (:meth:`Ring.over`): its ``frames`` is then a buffer the
frames already sit in (a memory-mapped capture file) and ``offs[slot]`` says where each slot's frame
starts in it, so a replay hands the kernel the file's own bytes instead of copying every frame.

Counters live in one int64 array ``ctr`` so Numba kernels and Python share them without locks:
``HEAD`` (next sequence the producer writes) is only advanced by the producer, ``TAIL`` (next
sequence the consumer reads) only by the consumer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir as llir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from low_level.jit import hugepage
from low_level.jit.refcount import pin

HEAD, TAIL, DROPS, CAPTURED, BYTES, TRUNCATED, DROP_TS_MIN, DROP_TS_MAX = 0, 1, 2, 3, 4, 5, 6, 7
NCTR = 8
NO_DROP_MIN, NO_DROP_MAX = np.iinfo(np.int64).max, np.iinfo(np.int64).min  # no drop since last taken
DEFAULT_SNAPLEN = 128  # enough for Ethernet + 2 VLAN tags + IPv6 with extension headers + TCP


class RingArrays(NamedTuple):
    """What a Numba producer gets of a ring (:meth:`Ring.arrays`): one argument instead of seven.

    In a loop, take the arrays it reads out first (``ctr = ring.ctr``): each ``ring.ctr`` is a new
    reference, an atomic incref/decref pair where it stands."""

    frames: np.ndarray
    snaplen: int
    caplen: np.ndarray
    wirelen: np.ndarray
    ts: np.ndarray
    iface: np.ndarray
    ctr: np.ndarray


class Ring:
    """Fixed-size frame ring; ``snaplen`` bytes are kept of each frame (the wire length is kept too)."""

    def __init__(self, nslots: int = 1 << 16, snaplen: int = DEFAULT_SNAPLEN) -> None:
        if nslots < 2 or nslots & (nslots - 1):
            raise ValueError("ring slots must be a power of two >= 2")
        self.nslots = nslots
        self.snaplen = snaplen
        # huge pages (where THP is "madvise"): the kernel walks five arrays per frame
        self.frames = hugepage.zeros(nslots * snaplen, np.uint8)
        self.caplen = hugepage.zeros(nslots, np.int64)
        self.wirelen = hugepage.zeros(nslots, np.int64)
        self.ts = hugepage.zeros(nslots, np.int64)
        self.iface = hugepage.zeros(nslots, np.int64)
        self.offs = np.zeros(0, dtype=np.int64)  # empty: slot s's frame is at s * snaplen in frames
        self.ctr = np.zeros(NCTR, dtype=np.int64)
        self.ctr[DROP_TS_MIN], self.ctr[DROP_TS_MAX] = NO_DROP_MIN, NO_DROP_MAX

    @classmethod
    def over(cls, buf: np.ndarray, nslots: int, snaplen: int = DEFAULT_SNAPLEN) -> Ring:
        """A ring whose frames stay where they are in ``buf`` (writable uint8, alive as long as the ring):
        its producer writes ``offs[slot]`` and the usual per-slot fields, never frame bytes (``caplen``
        still stops at ``snaplen``). Only a producer that knows this may fill it; ``ring_push`` may not."""
        ring = cls(2, snaplen)
        if nslots < 2 or nslots & (nslots - 1):
            raise ValueError("ring slots must be a power of two >= 2")
        ring.nslots = nslots
        ring.frames = buf
        ring.caplen = hugepage.zeros(nslots, np.int64)
        ring.wirelen = hugepage.zeros(nslots, np.int64)
        ring.ts = hugepage.zeros(nslots, np.int64)
        ring.iface = hugepage.zeros(nslots, np.int64)
        ring.offs = hugepage.zeros(nslots, np.int64)
        return ring

    @property
    def zero_copy(self) -> bool:
        return self.offs.shape[0] != 0

    @property
    def fill(self) -> int:
        return int(self.ctr[HEAD] - self.ctr[TAIL])

    @property
    def drops(self) -> int:
        return int(self.ctr[DROPS])

    def take_drop_span(self) -> tuple[int, int] | None:
        """(oldest, newest) timestamp of the frames dropped since the last call, None if none; resets it.
        Racy with the producer by design (no lock on the capture path): a drop between the read and the
        reset keeps its count but not its time, so the agent charges the interval's panes as well."""
        lo, hi = int(self.ctr[DROP_TS_MIN]), int(self.ctr[DROP_TS_MAX])
        self.ctr[DROP_TS_MIN], self.ctr[DROP_TS_MAX] = NO_DROP_MIN, NO_DROP_MAX
        return None if lo == NO_DROP_MIN else (lo, hi)

    def arrays(self) -> RingArrays:
        """The arrays a Numba producer needs (:func:`ring_push`'s first argument)."""
        return RingArrays(self.frames, self.snaplen, self.caplen, self.wirelen, self.ts, self.iface, self.ctr)


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, n):
    """memcpy(dst + dst_off, src + src_off, n) on uint8 arrays, as one llvm.memcpy.

    Numba compiles a byte loop or a slice copy with a negative-index check per byte (a scalar
    gather/scatter); the frame copy into the ring was half of a replay's time that way. The caller
    guarantees both ranges are inside their arrays.
    """
    sig = types.void(dst, dst_off, src, src_off, n)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        i64 = llir.IntType(64)
        dp = builder.gep(d.data, [builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]])
        sp = builder.gep(s.data, [builder.sext(args[3], i64) if args[3].type.width < 64 else args[3]])
        cgutils.raw_memcpy(builder, dp, sp, args[4], 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_words(typingctx, dst, dst_off, src, src_off, n):
    """Like :func:`copy_bytes`, but inline: 8-byte words (unaligned loads and stores), then the last
    ``n % 8`` bytes one by one. For short frames in a loop: the call to memcpy with a run-time length
    was half of the pcap reader's time on 64-byte frames. The ranges must not overlap.

    Its loops make Numba's reference-count pruning give up on the function that holds them: use it
    in a function that passes no arrays on per frame (the pcap reader's fast path), not in
    ``ring_push``."""
    sig = types.void(dst, dst_off, src, src_off, n)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        i64 = llir.IntType(64)

        def wide(v):
            return builder.sext(v, i64) if v.type.width < 64 else v

        dp = builder.gep(d.data, [wide(args[1])])
        sp = builder.gep(s.data, [wide(args[3])])
        n = wide(args[4])
        words = builder.lshr(n, llir.Constant(i64, 3))
        dw = builder.bitcast(dp, i64.as_pointer())
        sw = builder.bitcast(sp, i64.as_pointer())
        with cgutils.for_range(builder, words) as loop:
            v = builder.load(builder.gep(sw, [loop.index]), align=1)
            builder.store(v, builder.gep(dw, [loop.index]), align=1)
        done = builder.shl(words, llir.Constant(i64, 3))
        with cgutils.for_range(builder, builder.sub(n, done)) as loop:
            i = builder.add(done, loop.index)
            builder.store(builder.load(builder.gep(sp, [i])), builder.gep(dp, [i]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def load_u64(typingctx, src, off):
    """The 8 bytes at ``src + off`` (uint8 array, any alignment) as one int64 in the host's byte order.

    One load instead of eight byte reads shifted together: the pcap reader takes a record header (two
    32-bit fields per word) this way. The caller guarantees the 8 bytes are inside the array."""
    sig = types.int64(src, off)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = llir.IntType(64)
        o = builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]
        return builder.load(builder.bitcast(builder.gep(a.data, [o]), i64.as_pointer()), align=1)

    return sig, codegen


@intrinsic
def prefetch_read(typingctx, src, off):
    """Hint the CPU to fetch the cache line at ``src + off`` (uint8 array) for reading: llvm.prefetch, which
    never faults, so ``off`` may lie past the end. A replay walking a mapped file asks a few KiB ahead:
    the walk is a chain of dependent loads (each record's length gives the next one's place), and
    the hardware's own prefetching left it waiting on memory (a quarter of its time)."""
    sig = types.void(src, off)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = llir.IntType(64)
        o = builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]
        i8p = llir.IntType(8).as_pointer()
        i32 = llir.IntType(32)
        fnty = llir.FunctionType(llir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.gep(a.data, [o]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def pin_ring(ring: RingArrays) -> int:
    """:func:`~low_level.jit.refcount.pin` of a ring's arrays, for a per-frame helper that passes them on."""
    return ring.caplen.shape[0]


@njit(cache=True, nogil=True)
def ring_full(ring: RingArrays) -> bool:
    """Whether the producer has no free slot (a waiting producer stops here rather than drop)."""
    full = ring.ctr[HEAD] - ring.ctr[TAIL] >= ring.caplen.shape[0]
    pin_ring(ring)
    return full


@njit(cache=True, nogil=True)
def ring_push(ring: RingArrays, src, off, n, orig_len, ts_ns, ifidx) -> bool:
    """Copy one frame (``src[off:off+n]``) into the ring; False (and a counted drop) when full.

    The one push every producer calls (generator, AF_PACKET, fanout share, pcap through
    :func:`ring_push_from`); Numba compiles it into the caller's loop, so the call costs nothing per frame.
    """
    return ring_push_from(ring, src, src, off, n, orig_len, ts_ns, ifidx)


@njit(cache=True, nogil=True)
def ring_push_from(ring: RingArrays, src, alt, off, n, orig_len, ts_ns, ifidx) -> bool:
    """:func:`ring_push` of ``src[off:off+n]``, or with ``off`` -1 of ``alt[0:n]`` (a frame a source rebuilt,
    as the pcap replay does for link layers other than Ethernet): one call site either way.

    One exit, with every array used last there (``pin``): Numba's refcount pruning then drops the
    atomic incref/decref pair per array and call, which otherwise cost sources a quarter of their time.
    """
    frames, snaplen, caplen, wirelen, ts, iface, ctr = ring
    nslots = caplen.shape[0]
    head = ctr[HEAD]
    ok = head - ctr[TAIL] < nslots
    if not ok:
        ctr[DROPS] += 1
        if ts_ns < ctr[DROP_TS_MIN]:  # the dropped frames' time span: the agent charges them to their panes
            ctr[DROP_TS_MIN] = ts_ns
        if ts_ns > ctr[DROP_TS_MAX]:
            ctr[DROP_TS_MAX] = ts_ns
    else:
        slot = head & (nslots - 1)
        k = n if n < snaplen else snaplen
        if k < n:
            ctr[TRUNCATED] += 1
        base = slot * snaplen
        if off >= 0:
            copy_bytes(frames, base, src, off, k)
        else:
            copy_bytes(frames, base, alt, 0, k)
        caplen[slot] = k
        wirelen[slot] = orig_len
        ts[slot] = ts_ns
        iface[slot] = ifidx
        ctr[CAPTURED] += 1
        ctr[BYTES] += orig_len
        ctr[HEAD] = head + 1
    pin(frames)
    pin(caplen)
    pin(wirelen)
    pin(ts)
    pin(iface)
    pin(ctr)
    pin(src)
    pin(alt)
    return ok
