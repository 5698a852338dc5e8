"""What the packet kernel and the flow kernel share: the tables, the block scratch, the networks table,
and the flushes the host loop asks for (``flush_below``, ``min_pane``).

Both compiled passes (``low_level.kernel.fused.Kernel``, ``low_level.flows.kernel.FlowKernel``) fold rows
block by block into the same tables (``low_level.kernel.codegen`` writes both); they differ in what a row
is read from (a frame to parse, or a decoded flow record with its weight) and so in the row stride.
"""

from __future__ import annotations

import numpy as np

from contract import fields as F
from low_level.kernel import codegen, flush, lpm
from low_level.kernel.tables import MAXKW, Tables

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
