"""Group-wise punctuation from TCP connection ends (OOP App. A; ``heartbeat: {groups: {on: tcp_close}}``).

A query with the rule owns a second open-addressing table in ``tab`` (at ``QP_CBASE``, ``QP_CSIZE``
slots of ``[close_ts, done_pane, key words...]``, placed by the group table's own key hash). The
per-packet pass calls ``note_close`` only on a TCP packet with FIN or RST: it keeps the group's
earliest such stream time. At a punctuation the agent asks ``close_ready`` for the groups whose
close + grace its clock has passed: their group-table entries below the done pane (the pane holding
close + grace) go to the output region, (done pane, key) go to ``ready`` for ``Emitter.group_done``,
and the close table is rebuilt without them (a later FIN of the group notes a new close).

A full probe window leaves the group unnoted (``QS_CLOSE_FULL``): it then waits for the low-water mark
like any group, so the rule never promises more than it saw.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from low_level.jit.refcount import pin, pin_tables
from low_level.kernel.subaggregate import emit_slot, slot_hash_at
from low_level.kernel.tables import (
    CLOSE_NONE,
    EMPTY,
    QP_BASE,
    QP_CBASE,
    QP_CSIZE,
    QP_GRACE,
    QP_KW,
    QP_ORIGIN,
    QP_PANE_NS,
    QP_SIZE,
    QP_STRIDE,
    QS_CLOSE_DUE,
    QS_CLOSE_FULL,
    QS_CLOSES,
    QS_GROUPS_DONE,
)

PROBES = 16  # close-table slots one key may probe
TCP = 6
FIN_RST = 5  # contract.fields.TCP_FLAG_BITS FIN | RST


@njit(cache=True, nogil=True)
def _find(tab: np.ndarray, cbase: int, csize: int, kw: int, key: np.ndarray, ko: int, h: np.uint64) -> int:
    """The close-table slot of the key at key[ko:] (found or the first free one within PROBES), or -1."""
    cw = 2 + kw
    umask = np.uint64(csize - 1)
    res = -1
    jj = 0
    while jj < PROBES and res < 0:
        pos = cbase + np.int64((h + np.uint64(jj)) & umask) * cw
        if tab[pos] == EMPTY:
            res = pos
        else:
            same = True
            for w in range(kw):
                if tab[pos + 2 + w] != key[ko + w]:
                    same = False
            if same:
                res = pos
        jj += 1
    pin(tab)
    pin(key)
    return res


@njit(cache=True, nogil=True)
def note_close(
    q: int, ts: int, keys: np.ndarray, ko: int, h: np.uint64, qp: np.ndarray, qs: np.ndarray, tab: np.ndarray
) -> None:
    """A FIN or RST of the group at keys[ko:] (slot hash ``h``) at stream time ``ts``: keep the earliest."""
    kw = qp[q, QP_KW]
    pos = _find(tab, qp[q, QP_CBASE], qp[q, QP_CSIZE], kw, keys, ko, h)
    if pos < 0:
        qs[q, QS_CLOSE_FULL] += 1
    else:
        if tab[pos] == EMPTY:
            tab[pos] = ts
            tab[pos + 1] = EMPTY
            for w in range(kw):
                tab[pos + 2 + w] = keys[ko + w]
            qs[q, QS_CLOSES] += 1
        elif ts < tab[pos]:
            tab[pos] = ts
        due = tab[pos] + qp[q, QP_GRACE]
        if due < qs[q, QS_CLOSE_DUE]:
            qs[q, QS_CLOSE_DUE] = due
    pin(keys)
    pin(qp)
    pin(qs)
    pin(tab)


@njit(cache=True, nogil=True)
def close_ready(
    q: int,
    clock: int,
    qp: np.ndarray,
    qs: np.ndarray,
    tab: np.ndarray,
    out: np.ndarray,
    pane_counts: np.ndarray,
    ready: np.ndarray,
    scratch: np.ndarray,
) -> int:
    """Punctuate the groups whose close + grace <= ``clock``: emit their entries below the done pane,
    write (done pane, key words) rows to ``ready`` and forget them; returns how many groups."""
    kw, cbase, csize = qp[q, QP_KW], qp[q, QP_CBASE], qp[q, QP_CSIZE]
    cw = 2 + kw
    grace, origin, pane_ns = qp[q, QP_GRACE], qp[q, QP_ORIGIN], qp[q, QP_PANE_NS]
    n = 0
    due_next = CLOSE_NONE
    for s in range(csize):
        pos = cbase + s * cw
        c = tab[pos]
        if c != EMPTY:
            due = c + grace
            if due <= clock:
                tab[pos + 1] = (due - origin) // pane_ns  # done below the pane holding close + grace
                n += 1
            else:
                tab[pos + 1] = EMPTY
                if due < due_next:
                    due_next = due
    if n > 0:
        base, size, stride = qp[q, QP_BASE], qp[q, QP_SIZE], qp[q, QP_STRIDE]
        for s in range(size):
            pos = base + s * stride
            sp = tab[pos]
            if sp != EMPTY:
                c = _find(tab, cbase, csize, kw, tab, pos + 1, slot_hash_at(tab, pos + 1, kw))
                if c >= 0 and tab[c] != EMPTY and tab[c + 1] != EMPTY and sp < tab[c + 1]:
                    emit_slot(q, pos, qp, qs, tab, out, pane_counts)
        r = 0
        keep = 0
        for s in range(csize):
            pos = cbase + s * cw
            if tab[pos] != EMPTY:
                if tab[pos + 1] != EMPTY:
                    ready[r, 0] = tab[pos + 1]
                    for w in range(kw):
                        ready[r, 1 + w] = tab[pos + 2 + w]
                    r += 1
                else:
                    for w in range(cw):
                        scratch[keep * cw + w] = tab[pos + w]
                    keep += 1
                tab[pos] = EMPTY
        umask = np.uint64(csize - 1)
        kept = 0
        for k in range(keep):  # re-insert the pending closes (linear probing has no deletion)
            h = slot_hash_at(scratch, k * cw + 2, kw)
            jj = 0
            placed = False
            while not placed and jj < PROBES:
                pos = cbase + np.int64((h + np.uint64(jj)) & umask) * cw
                if tab[pos] == EMPTY:
                    for w in range(cw):
                        tab[pos + w] = scratch[k * cw + w]
                    placed = True
                jj += 1
            if placed:
                kept += 1
            else:  # out of reach of its probe window: it waits for the low-water mark instead
                qs[q, QS_CLOSE_FULL] += 1
        qs[q, QS_CLOSES] = kept
        qs[q, QS_GROUPS_DONE] += r
    qs[q, QS_CLOSE_DUE] = due_next
    pin_tables(qp, qs, tab, out, pane_counts)
    pin(ready)
    pin(scratch)
    return n
