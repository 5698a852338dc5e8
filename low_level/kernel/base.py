"""What the packet kernel and the flow kernel share: the tables, the block scratch, the networks table,
and the flushes the host loop asks for (``flush_below``, ``min_pane``).

Both compiled passes (``low_level.kernel.fused.Kernel``, ``low_level.flows.kernel.FlowKernel``) fold rows
block by block into the same tables (``low_level.kernel.codegen`` writes both); they differ in what a row
is read from (a frame to parse, or a decoded flow record with its weight) and so in the row stride.
"""

from __future__ import annotations

import numpy as np

from contract import fields as F
from low_level.kernel import codegen, flush, groupclose, lpm
from low_level.kernel.tables import MAXKW, QP_CSIZE, QP_KW, QS_CLOSE_DUE, Tables

NHC = 4  # host-level counters (one int64 array, shared with metrics): HC_PACKETS, HC_PARSED_OK, ...


class KernelBase:
    """Scratch memory, counters and table flushes around one host's compiled pass."""

    def __init__(self, tables: Tables, row_stride: int, nets: np.ndarray | None = None) -> None:
        self.t = tables
        # networks-file lookup table (low_level.kernel.lpm); swap it between calls with set_networks
        self.nets = lpm.build(None) if nets is None else nets
        self.hc = np.zeros(NHC, dtype=np.int64)
        self.row = np.zeros(F.NFIELDS, dtype=np.int64)
        # per-block scratch of the generated pass, allocated once
        nq = max(1, tables.qp.shape[0])
        self.rows = np.zeros(codegen.BLOCK * row_stride, dtype=np.int64)
        self.keys = np.zeros(nq * codegen.BLOCK * MAXKW, dtype=np.int64)
        self.sel = np.zeros((nq, codegen.BLOCK), dtype=np.int64)
        self.hs = np.zeros((nq, codegen.BLOCK), dtype=np.uint64)
        self._close_buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # close_groups' output, scratch

    def set_networks(self, nets: np.ndarray) -> None:
        """Use a new networks table from the next call on (a reload: the tables and their state stay)."""
        self.nets = nets

    def flush_below(self, q: int, bound: int) -> int:
        """Emit every entry of query q older than pane ``bound`` (heartbeats, idle, end of stream)."""
        t = self.t
        return flush.sweep_below(q, bound, t.qp, t.qs, t.tab, t.out, t.pane_counts)

    def min_pane(self, q: int) -> int:
        """The oldest pane query q's table holds (the punctuation's lower bound)."""
        t = self.t
        return flush.min_pane(q, t.qs, t.qp, t.pane_counts)

    def close_groups(self, q: int, clock_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Query q's groups whose TCP close + grace the clock has passed (heartbeat.groups.on tcp_close):
        their entries below the done pane go to the output region (drain it before and after); returns
        (key words, done pane) per group, for Emitter.group_done."""
        t = self.t
        kw, csize = int(t.qp[q, QP_KW]), int(t.qp[q, QP_CSIZE])
        if csize == 0 or int(t.qs[q, QS_CLOSE_DUE]) > clock_ns:
            return np.zeros((0, kw), np.int64), np.zeros(0, np.int64)
        if q not in self._close_buffers:  # allocated once per query, on its first close
            self._close_buffers[q] = (
                np.zeros((csize, 1 + kw), np.int64),
                np.zeros(csize * (2 + kw), np.int64),
            )
        ready, scratch = self._close_buffers[q]
        n = groupclose.close_ready(q, clock_ns, t.qp, t.qs, t.tab, t.out, t.pane_counts, ready, scratch)
        return ready[:n, 1:].copy(), ready[:n, 0].copy()
