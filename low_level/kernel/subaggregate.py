"""Fixed-size hash-table sub-aggregation primitives in Numba: slot hashing, folding a packet into
state, emitting an entry, prefetching. Key extraction and the probe/insert/evict loop are written
out, per query shape, in the generated kernel (low_level.kernel.codegen), where a call would cost refcounts.

Open addressing over ``probes`` consecutive slots, keyed by (group key, pane). The slot comes from a
hash of the key words only (not the pane), so a group's next-pane entry lands where its
previous-pane entry sits and pushes it out: the natural "lazy" flush of the OOP paper. When every
probed slot is taken the oldest probed entry is the victim.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir as llir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from contract import fields as F
from contract.query import MERGE_MAX, MERGE_MIN, MERGE_SUM, SRC_COMPUTED, SRC_DSCP, SRC_ONE
from low_level.jit.refcount import pin, pin_tables
from low_level.jit.splitmix import mix64
from low_level.kernel.sketchkey import hll_rank, value_hash1, value_hash2
from low_level.kernel.tables import (
    EMPTY,
    PANE_RING,
    QP_KW,
    QP_NA,
    QP_OBASE,
    QP_RW,
    QP_SOFF,
    QS_EMITTED,
    QS_OCC,
    QS_OUTN,
)

PANE_MAX = np.iinfo(np.int64).max


# one odd multiplier per key word (MAXKW = 8): the slot hash's multilinear sum
_SLOT_MUL = np.array(
    [
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53,
        0x87C37B91114253D5,
        0x4CF5AD432745937F,
    ],
    dtype=np.uint64,
)


@njit(cache=True, nogil=True, inline="always")
def slot_hash_at(buf: np.ndarray, off: int, kw: int) -> np.uint64:
    """Table placement hash of the kw key words at buf[off:]: a multilinear sum (independent multiplies
    the CPU overlaps) and one splitmix64 finaliser, a quarter of the serial multiply chain of
    contract.wire.key_hash. Only placement depends on it; the Kafka partition uses wire.key_hash,
    computed vectorised at emit."""
    acc = np.uint64(0)
    for j in range(kw):
        acc += np.uint64(buf[off + j]) * _SLOT_MUL[j]
    return mix64(acc)


@intrinsic
def prefetch_w(typingctx, arr, idx):
    """Hint the CPU to fetch the cache line holding arr[idx] for writing (llvm.prefetch; no fault, no effect)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = llir.IntType(8).as_pointer()
        i32 = llir.IntType(32)
        fnty = llir.FunctionType(llir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def packet_value_at(row: np.ndarray, roff: int, src: int) -> int:
    v = 1
    if src == SRC_DSCP:
        v = row[roff + F.TOS] >> 2
    elif src <= SRC_COMPUTED:  # HLL rank of the value words (contract.query.decode_computed)
        c = SRC_COMPUTED - src
        col, p = c >> 7, c & 31
        if (c >> 5) & 1:
            h = value_hash2(row[roff + col], row[roff + col + 1])
        elif (c >> 6) & 1:
            h = value_hash1(row[roff + col] >> 2)
        else:
            h = value_hash1(row[roff + col])
        v = hll_rank(h, p)
    elif src != SRC_ONE:
        v = row[roff + src]
    pin(row)
    return v


@njit(cache=True, nogil=True, inline="always")
def fold_at(
    tab: np.ndarray, spos: int, na: int, scols: np.ndarray, soff: int, row: np.ndarray, roff: int, fresh: bool
) -> None:
    """Merge the packet at row[roff:] into the state words at tab[spos:spos+na] (fresh = first packet)."""
    for c in range(na):
        v = packet_value_at(row, roff, scols[soff + c, 0])
        if scols[soff + c, 2]:  # the square of the value (contract.aggregates.LIFT_SQUARE)
            v = v * v
        merge = scols[soff + c, 1]
        if fresh:
            tab[spos + c] = v
        elif merge == MERGE_SUM:
            tab[spos + c] += v
        elif merge == MERGE_MIN:
            if v < tab[spos + c]:
                tab[spos + c] = v
        elif merge == MERGE_MAX:
            if v > tab[spos + c]:
                tab[spos + c] = v
    pin(tab)
    pin(scols)
    pin(row)


@njit(cache=True, nogil=True)
def emit_slot(
    q: int,
    pos: int,
    qp: np.ndarray,
    qs: np.ndarray,
    tab: np.ndarray,
    out: np.ndarray,
    pane_counts: np.ndarray,
) -> None:
    """Copy the entry at ``pos`` to query q's output region and free the slot."""
    rw = qp[q, QP_RW]
    o = qp[q, QP_OBASE] + qs[q, QS_OUTN] * rw
    for j in range(rw):
        out[o + j] = tab[pos + j]
    qs[q, QS_OUTN] += 1
    qs[q, QS_EMITTED] += 1
    pane_counts[q, tab[pos] & (PANE_RING - 1)] -= 1
    qs[q, QS_OCC] -= 1
    tab[pos] = EMPTY
    pin_tables(qp, qs, tab, out, pane_counts)


@njit(cache=True, nogil=True)
def emit_packet_at(
    q: int,
    pane: int,
    keys: np.ndarray,
    kofs: int,
    row: np.ndarray,
    roff: int,
    qp: np.ndarray,
    qs: np.ndarray,
    out: np.ndarray,
    scols: np.ndarray,
) -> None:
    """Emit a one-packet partial straight to the output (for packets older than the table's horizon)."""
    kw, na, rw = qp[q, QP_KW], qp[q, QP_NA], qp[q, QP_RW]
    o = qp[q, QP_OBASE] + qs[q, QS_OUTN] * rw
    out[o] = pane
    for j in range(kw):
        out[o + 1 + j] = keys[kofs + j]
    fold_at(out, o + 1 + kw, na, scols, qp[q, QP_SOFF], row, roff, True)
    qs[q, QS_OUTN] += 1
    qs[q, QS_EMITTED] += 1
    pin(keys)
    pin(row)
    pin(qp)
    pin(qs)
    pin(out)
    pin(scols)
