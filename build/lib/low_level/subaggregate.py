"""Fixed-size hash-table sub-aggregation: lookup, insert, evict and emit, all in Numba.

Open addressing over ``probes`` consecutive slots, keyed by (group key, pane). The slot comes from
the low bits of a splitmix64 hash of the key words only (the Kafka partition uses the high bits), so a
group's next-pane entry lands where its previous-pane entry sits and pushes it out: the natural
"lazy" flush of the OOP paper. When every probed slot is taken the oldest probed entry is the victim.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from contract.query import MERGE_MAX, MERGE_MIN, MERGE_SUM, SRC_DSCP, SRC_ONE
from low_level.tables import (
    EMPTY,
    PANE_RING,
    QP_BASE,
    QP_KW,
    QP_NA,
    QP_OBASE,
    QP_PROBES,
    QP_SIZE,
    QP_SOFF,
    QP_STRIDE,
    QS_EMITTED,
    QS_OCC,
    QS_OUTN,
)

PANE_MAX = np.iinfo(np.int64).max
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _mix(x: np.uint64) -> np.uint64:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def key_hash(key: np.ndarray, kw: int) -> np.uint64:
    """Same function as contract.wire.key_hash (tested equal), on one key."""
    h = _GOLDEN
    for j in range(kw):
        h = _mix(h ^ np.uint64(key[j])) + _GOLDEN
    return h


@njit(cache=True, nogil=True, inline="always")
def extract_key(kprog: np.ndarray, koff: int, klen: int, row: np.ndarray, key: np.ndarray) -> None:
    """Fill key words from a parsed row: plain fields, or addresses masked to a prefix per family."""
    if klen == 0:
        key[0] = 0
        return
    w = 0
    for r in range(koff, koff + klen):
        col = kprog[r, 0]
        if kprog[r, 1] == 1:
            if row[F.IPVER] == 4:
                key[w] = row[col] & kprog[r, 2]
                key[w + 1] = row[col + 1] & kprog[r, 3]
            else:
                key[w] = row[col] & kprog[r, 4]
                key[w + 1] = row[col + 1] & kprog[r, 5]
            w += 2
        else:
            key[w] = row[F.TOS] >> 2 if col == SRC_DSCP else row[col]
            w += 1


@njit(cache=True, nogil=True, inline="always")
def packet_value(row: np.ndarray, src: int) -> int:
    if src == SRC_ONE:
        return 1
    if src == SRC_DSCP:
        return row[F.TOS] >> 2
    return row[src]


@njit(cache=True, nogil=True, inline="always")
def fold_packet(tab: np.ndarray, spos: int, na: int, scols: np.ndarray, soff: int, row: np.ndarray, fresh: bool) -> None:
    """Merge one packet into the state words at tab[spos:spos+na] (fresh = first packet of the entry)."""
    for c in range(na):
        v = packet_value(row, scols[soff + c, 0])
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


@njit(cache=True, nogil=True)
def emit_slot(q: int, pos: int, qp: np.ndarray, qs: np.ndarray, tab: np.ndarray, out: np.ndarray,
              pane_counts: np.ndarray) -> None:
    """Copy the entry at ``pos`` to query q's output region and free the slot."""
    stride = qp[q, QP_STRIDE]
    o = qp[q, QP_OBASE] + qs[q, QS_OUTN] * stride
    for j in range(stride):
        out[o + j] = tab[pos + j]
    qs[q, QS_OUTN] += 1
    qs[q, QS_EMITTED] += 1
    pane_counts[q, tab[pos] & (PANE_RING - 1)] -= 1
    qs[q, QS_OCC] -= 1
    tab[pos] = EMPTY


@njit(cache=True, nogil=True)
def emit_packet(q: int, pane: int, key: np.ndarray, row: np.ndarray, qp: np.ndarray, qs: np.ndarray,
                out: np.ndarray, scols: np.ndarray) -> None:
    """Emit a one-packet partial straight to the output (for packets older than the table's horizon)."""
    kw, na, stride = qp[q, QP_KW], qp[q, QP_NA], qp[q, QP_STRIDE]
    o = qp[q, QP_OBASE] + qs[q, QS_OUTN] * stride
    out[o] = pane
    for j in range(kw):
        out[o + 1 + j] = key[j]
    fold_packet(out, o + 1 + kw, na, scols, qp[q, QP_SOFF], row, True)
    qs[q, QS_OUTN] += 1
    qs[q, QS_EMITTED] += 1


@njit(cache=True, nogil=True, inline="always")
def probe(q: int, pane: int, key: np.ndarray, h: np.uint64, qp: np.ndarray, tab: np.ndarray) -> tuple:
    """Probe for (key, pane): returns (match_pos, empty_pos, victim_pos, victim_pane), -1 when absent."""
    kw, stride, size = qp[q, QP_KW], qp[q, QP_STRIDE], qp[q, QP_SIZE]
    base, probes = qp[q, QP_BASE], qp[q, QP_PROBES]
    mask = np.uint64(size - 1)
    s0 = h & mask
    empty = -1
    victim = -1
    victim_pane = PANE_MAX
    for j in range(probes):
        pos = base + np.int64((s0 + np.uint64(j)) & mask) * stride
        sp = tab[pos]
        if sp == EMPTY:
            if empty < 0:
                empty = pos
            continue
        if sp == pane:
            same = True
            for w in range(kw):
                if tab[pos + 1 + w] != key[w]:
                    same = False
                    break
            if same:
                return pos, empty, victim, victim_pane
        if sp < victim_pane:
            victim_pane = sp
            victim = pos
    return -1, empty, victim, victim_pane


@njit(cache=True, nogil=True, inline="always")
def insert_at(q: int, pos: int, pane: int, key: np.ndarray, row: np.ndarray, qp: np.ndarray, qs: np.ndarray,
              tab: np.ndarray, scols: np.ndarray, pane_counts: np.ndarray) -> None:
    kw, na = qp[q, QP_KW], qp[q, QP_NA]
    tab[pos] = pane
    for w in range(kw):
        tab[pos + 1 + w] = key[w]
    fold_packet(tab, pos + 1 + kw, na, scols, qp[q, QP_SOFF], row, True)
    pane_counts[q, pane & (PANE_RING - 1)] += 1
    qs[q, QS_OCC] += 1
