"""Per-host table memory and per-query parameters, laid out as flat arrays for one Numba kernel.

Every query gets a fixed-size power-of-two hash table inside one int64 array ``tab``. A slot is
``stride = 1 + kw + na`` words: ``[pane, key words..., state words...]`` (one cache line for the
paper's Q4), ``pane == EMPTY`` marks a free slot. Each query also owns an output region in ``out``
with the same record layout, where the kernel writes evicted/flushed partials; Python reads it as a
2-D view, so emitting needs no per-record Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import query as Q
from low_level.jit import hugepage

EMPTY = np.iinfo(np.int64).min
PANE_RING = 64  # per-query count of table entries per pane, indexed pane & 63 (m <= 32 keeps it exact)
POLICY = {"lazy": 0, "slow": 1, "iop": 2}
MAXKW = 8

# qp columns (parameters, read-only in the kernel)
(
    QP_KW,
    QP_NA,
    QP_SIZE,
    QP_BASE,
    QP_STRIDE,
    QP_PROBES,
    QP_POLICY,
    QP_M,
    QP_I,
    QP_PANE_NS,
    QP_ORIGIN,
    QP_SOFF,
    QP_IFMASK,
    QP_OBASE,
    QP_OCAP,
    QP_RW,
    QP_CBASE,
    QP_CSIZE,
    QP_GRACE,
) = range(19)
NQP = 19
# qs columns (state, updated by the kernel and by the heartbeat)
(
    QS_STARTED,
    QS_CUR,
    QS_MARK,
    QS_OCC,
    QS_MATCHED,
    QS_LATE,
    QS_EVICT,
    QS_FLUSH_SLOW,
    QS_FLUSH_SWEEP,
    QS_FLUSH_IOP,
    QS_OVERDUE,
    QS_CURSOR,
    QS_TICK,
    QS_OUTN,
    QS_EMITTED,
    QS_MAXTS,
    QS_BURST_MAX,
    QS_LATE_MIN,
    QS_CLOSES,
    QS_CLOSE_DUE,
    QS_CLOSE_FULL,
    QS_GROUPS_DONE,
) = range(22)
NQS = 22
QS_NAMES = (
    "started",
    "cur_pane",
    "mark_pane",
    "occupancy",
    "matched",
    "late",
    "evictions",
    "flush_slow",
    "flush_sweep",
    "flush_iop",
    "overdue",
    "cursor",
    "tick",
    "out_n",
    "emitted",
    "max_ts",
    "burst_max",
    "late_min_pane",
    "closes_pending",
    "close_due_ns",
    "close_table_full",
    "groups_done",
)
LATE_NONE = np.iinfo(np.int64).max  # QS_LATE_MIN when no packet was late since the agent last took it
CLOSE_NONE = np.iinfo(np.int64).max  # QS_CLOSE_DUE when no group close is pending


def table_memory(words: int) -> np.ndarray:
    """Zeroed int64 memory for the hash tables, on huge pages where the kernel allows: probes land on
    random slots, and with 4 KiB pages a table of tens of MiB misses the TLB on nearly every packet."""
    return hugepage.zeros(words, np.int64)


def slot_stride(rw: int) -> int:
    """Words per table slot for a record of rw words (the slot holds the record, then padding)."""
    return rw


@dataclass
class Tables:
    """All per-host aggregation memory for a list of queries (allocated once, never per packet)."""

    queries: list[Q.QuerySpec]
    qp: np.ndarray
    qs: np.ndarray
    pane_counts: np.ndarray
    scols: np.ndarray
    tab: np.ndarray
    out: np.ndarray
    chunk: int

    @classmethod
    def build(
        cls, queries: list[Q.QuerySpec], chunk: int = 1 << 16, iface_masks: list[int] | None = None
    ) -> Tables:
        """Lay out tables; ``chunk`` = most packets one kernel call takes (sizes the output regions)."""
        nq = len(queries)
        qp = np.zeros((nq, NQP), dtype=np.int64)
        scols = []
        tab_words = out_words = soff = 0
        for i, q in enumerate(queries):
            kw, cols = Q.key_width(q), Q.state_columns(q)
            na = len(cols)
            rw = 1 + kw + na  # record width: [pane, key words, state words]
            stride = slot_stride(rw)
            size = q.table.size
            # one chunk can emit at most: every entry present at its start plus 4 per packet
            ocap = size + 4 * chunk
            qp[i] = 0
            qp[i, QP_KW], qp[i, QP_NA], qp[i, QP_SIZE], qp[i, QP_BASE] = kw, na, size, tab_words
            qp[i, QP_STRIDE], qp[i, QP_PROBES] = stride, q.table.probes
            qp[i, QP_POLICY], qp[i, QP_M], qp[i, QP_I] = POLICY[q.flush.policy], q.flush.m, q.flush.i
            qp[i, QP_PANE_NS], qp[i, QP_ORIGIN] = q.window.pane_ns, q.window.origin_ns
            qp[i, QP_SOFF] = soff
            qp[i, QP_IFMASK] = -1 if iface_masks is None else iface_masks[i]
            qp[i, QP_OBASE], qp[i, QP_OCAP], qp[i, QP_RW] = out_words, ocap, rw
            scols.extend([c.source, c.merge, int(c.square)] for c in cols)
            tab_words += size * stride
            out_words += ocap * rw
            soff += na
        for i, q in enumerate(queries):  # the group-close tables (low_level.kernel.groupclose) come last
            qp[i, QP_CBASE] = tab_words
            if q.heartbeat.close is not None:
                qp[i, QP_CSIZE], qp[i, QP_GRACE] = q.table.size, q.heartbeat.close.grace_ns
                tab_words += q.table.size * (2 + qp[i, QP_KW])
        tab = table_memory(tab_words)
        for i in range(nq):
            base, size, stride = qp[i, QP_BASE], qp[i, QP_SIZE], qp[i, QP_STRIDE]
            tab[base : base + size * stride : stride] = EMPTY
            cbase, csize, cw = qp[i, QP_CBASE], qp[i, QP_CSIZE], 2 + qp[i, QP_KW]
            tab[cbase : cbase + csize * cw : cw] = EMPTY
        qs = np.zeros((nq, NQS), dtype=np.int64)
        qs[:, QS_MARK] = EMPTY
        qs[:, QS_LATE_MIN] = (
            LATE_NONE  # the oldest pane of a late packet (the agent charges late losses to panes)
        )
        qs[:, QS_CLOSE_DUE] = CLOSE_NONE
        return cls(
            queries=list(queries),
            qp=qp,
            qs=qs,
            pane_counts=np.zeros((nq, PANE_RING), dtype=np.int64),
            scols=np.array(scols, dtype=np.int64).reshape(-1, 3),
            tab=tab,
            out=np.zeros(max(out_words, 1), dtype=np.int64),
            chunk=chunk,
        )

    def arrays(self) -> tuple:
        """The arrays a compiled pass takes after its frames, in its order (qp, qs, tab, out, pane_counts, scols)."""
        return (self.qp, self.qs, self.tab, self.out, self.pane_counts, self.scols)

    def drain(self, q: int) -> np.ndarray:
        """Copy out query q's emitted records (n, stride) and reset its output region."""
        n = int(self.qs[q, QS_OUTN])
        rw, base = int(self.qp[q, QP_RW]), int(self.qp[q, QP_OBASE])
        recs = self.out[base : base + n * rw].reshape(n, rw).copy()
        self.qs[q, QS_OUTN] = 0
        return recs

    def split(self, q: int, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pane, key, state) views of records drained for query q."""
        kw = int(self.qp[q, QP_KW])
        return recs[:, 0], recs[:, 1 : 1 + kw], recs[:, 1 + kw :]

    def stat(self, q: int, name: str) -> int:
        return int(self.qs[q, QS_NAMES.index(name)])
