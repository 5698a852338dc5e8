"""The sub-aggregation pass for flow records: the packet kernel's generated code with a weight per row.

A flow record (``low_level.flows.layout``) is a parsed-packet row whose LEN is the record's bytes, plus a
weight: its packets. The query shapes, filters, keys, probe windows, folds and flushes are exactly the
packet kernel's (``low_level.kernel.codegen`` writes them); only two things differ, and only in this separately
generated module, so the packet path pays nothing for weights:

* ``count`` (the state columns sourced ``SRC_ONE``) adds the row's weight instead of 1, in the table and
  in the one-record partials of records older than the table's horizon;
* rows come decoded from an array instead of being parsed from frames.

``sum(length)`` is then the records' bytes; ``min``/``max(length)`` are over records' byte counts (a
flow has no per-packet length), which is what a flow collector can know.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from contract import fields as F
from contract.query import SRC_ONE
from low_level.jit import cache as jitcache
from low_level.kernel import codegen
from low_level.kernel.base import KernelBase
from low_level.kernel.tables import Tables

if TYPE_CHECKING:
    from low_level.flows.source import FlowBatch

WCOL = F.NFIELDS  # the weight's slot in the block's copied rows (stride NFIELDS + 1)

_FLOW = '''
@njit(cache=True, nogil=True)
def flow_pass(frows, fw, n, qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys, sel, hs, nets):
    """Records 0 .. n-1 of frows (weights fw), block by block, as fused_pass does for frames."""
    ntab = tab.shape[0]
    use_iface = False
{loop}
    hc[HC_PACKETS] += n
    hc[HC_PARSED_OK] += n
    pin(frows)
    pin(fw)
{pins}
'''

# one record of the flow pass: a decoded row and its weight, then phase 1 of every query
_RECORD = """            r = b0 + i
            for k in range(F.NFIELDS):
                row[k] = frows[r, k]
            ro = i * NF
{copy}
            rows[ro + WCOL] = fw[r]
{select}"""

_OVERDUE = "            emit_packet_at(q, pane, keys, ko, rows, ro, qp, qs, out, scols)\n"


def flow_kernel_source(shapes: list[dict]) -> str:
    """The flow module's text: codegen's aggregate functions with weighted counts, and a pass over rows."""
    packet = codegen.kernel_source(shapes)
    head, _, _ = packet.partition("\n@njit(cache=True, nogil=True)\ndef fused_pass(")
    head = head.replace(f"NF = {min(codegen.EXTRA_COLUMNS)}", "NF = F.NFIELDS + 1")
    head = head.replace("NF = F.NFIELDS  #", "NF = F.NFIELDS + 1  #")
    assert "NF = F.NFIELDS + 1" in head, "codegen's header changed: update flowkernel"
    head = head.replace(
        "from low_level.kernel.tables import (",
        "from low_level.kernel.tables import (QP_OBASE, QP_RW, QS_OUTN, ",
    )
    head += "\nWCOL = F.NFIELDS\n"
    # weighted counts: the fold of every SRC_ONE column, and the overdue one-record partials
    assert head.count(_OVERDUE) == len(shapes), "codegen's overdue path changed: update flowkernel"
    for q, s in enumerate(shapes):
        cols = [c for c, (src, _) in enumerate(s["state"]) if src == SRC_ONE]
        fix = "".join(f"            out[o + {1 + s['kw'] + c}] = rows[ro + WCOL]\n" for c in cols)
        fix = "            o = qp[q, QP_OBASE] + (qs[q, QS_OUTN] - 1) * qp[q, QP_RW]\n" + fix if cols else ""
        start = head.index(f"def aggregate_q{q}(")
        stop = head.find("\n@njit", start)
        stop = len(head) if stop < 0 else stop
        body = (
            head[start:stop]
            .replace("v = np.int64(1)", "v = rows[ro + WCOL]")
            .replace(_OVERDUE, _OVERDUE + fix)
        )
        head = head[:start] + body + head[stop:]
    pins = codegen._pins("qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys, sel, hs, nets")
    return head + _FLOW.format(pins=pins, loop=codegen.block_loop(shapes, " " * 12, _RECORD))


class FlowKernel(KernelBase):
    """Scratch memory and counters around the compiled flow pass for one collector's queries."""

    def __init__(self, tables: Tables, nets: np.ndarray | None = None) -> None:
        super().__init__(tables, F.NFIELDS + 1, nets)
        self.compiled: ModuleType = jitcache.load_generated(
            flow_kernel_source(codegen.shape_of(tables)), "flows"
        )

    def warm(self) -> None:
        """Compile the pass now, on no records: a collector is ready only once it can fold at speed."""
        self.run(np.zeros((0, F.NFIELDS), dtype=np.int64), np.zeros(0, dtype=np.int64), 0)

    def run(self, frows: np.ndarray, weights: np.ndarray, n: int) -> int:
        """Fold records 0..n-1; callers keep n <= tables.chunk and drain between calls (output room)."""
        t = self.t
        tables = (t.qp, t.qs, t.tab, t.out, t.pane_counts, t.scols)
        scratch = (self.hc, self.row, self.rows, self.keys, self.sel, self.hs, self.nets)
        self.compiled.flow_pass(frows, weights, n, *tables, *scratch)
        return n

    def fold(self, batch: FlowBatch, after_chunk: Callable[[], object]) -> int:
        """Fold a decoded batch a chunk at a time (what the tables take in one call), calling after_chunk
        (drain the output) after each; returns the records folded."""
        chunk = self.t.chunk
        for s in range(0, batch.n, chunk):
            e = min(batch.n, s + chunk)
            self.run(batch.rows[s:e], batch.weights[s:e], e - s)
            after_chunk()
        return batch.n
