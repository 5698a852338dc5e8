"""The sub-aggregation pass for flow records: the packet kernel's generated code with a weight per row.

A flow record (``low_level.flows.decode``) is a parsed-packet row whose LEN is the record's bytes, plus a
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

from types import ModuleType

import numpy as np

from contract import fields as F
from contract.query import SRC_ONE
from low_level.jit import cache as jitcache
from low_level.kernel import codegen, flush, lpm
from low_level.kernel.tables import MAXKW, Tables

WCOL = F.NFIELDS  # the weight's slot in the block's copied rows (stride NFIELDS + 1)

_FLOW = '''
@njit(cache=True, nogil=True)
def flow_pass(frows, fw, n, qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys, sel, hs, nets):
    """Records 0 .. n-1 of frows (weights fw), block by block, as fused_pass does for frames."""
    ntab = tab.shape[0]
    use_iface = False
{bases}
    b0 = 0
    while b0 < n:
        bn = n - b0 if n - b0 < BLOCK else BLOCK
{zero}
        for i in range(bn):
            r = b0 + i
            for k in range(F.NFIELDS):
                row[k] = frows[r, k]
            ro = i * NF
{copy}
            rows[ro + WCOL] = fw[r]
{select}
{fold}
        b0 += bn
    hc[HC_PACKETS] += n
    hc[HC_PARSED_OK] += n
    pin(frows)
    pin(fw)
{pins}
'''

_OVERDUE = "            emit_packet_at(q, pane, keys, ko, rows, ro, qp, qs, out, scols)\n"


def flow_kernel_source(shapes: list[dict]) -> str:
    """The flow module's text: codegen's aggregate functions with weighted counts, and a pass over rows."""
    packet = codegen.kernel_source(shapes)
    head, _, _ = packet.partition("\n@njit(cache=True, nogil=True)\ndef fused_pass(")
    head = head.replace(f"NF = {min(codegen.EXTRA_COLUMNS)}", "NF = F.NFIELDS + 1")
    head = head.replace("NF = F.NFIELDS  #", "NF = F.NFIELDS + 1  #")
    assert "NF = F.NFIELDS + 1" in head, "codegen's header changed: update flowkernel"
    head = head.replace("from low_level.kernel.tables import (", "from low_level.kernel.tables import (QP_OBASE, QP_RW, QS_OUTN, ")
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
        body = head[start:stop].replace("v = np.int64(1)", "v = rows[ro + WCOL]").replace(_OVERDUE, _OVERDUE + fix)
        head = head[:start] + body + head[stop:]
    ind = " " * 12
    select = [line for q, s in enumerate(shapes) for line in codegen._phase1(q, s, ind)] or [ind + "pass"]
    bases = [f"    base{q} = qp[{q}, QP_BASE]\n    umask{q} = np.uint64(qp[{q}, QP_SIZE] - 1)" for q in range(len(shapes))]
    zero = [f"        c{q} = 0" for q in range(len(shapes))] or ["        pass"]
    fold = [f"        if c{q} > 0:\n            aggregate_q{q}(c{q}, rows, keys, sel, hs, qp, qs, tab, out, pane_counts, scols)"
            for q in range(len(shapes))]  # fmt: skip
    needed = {F.TS} | {src for s in shapes for src, _ in s["state"] if src >= 0}
    if any(src == codegen.SRC_DSCP for s in shapes for src, _ in s["state"]):
        needed.add(F.TOS)
    copy = "\n".join(f"{ind}rows[ro + {f}] = row[{f}]" for f in sorted(needed))
    args = "qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys, sel, hs, nets"
    pins = "\n".join(f"    pin({a.strip()})" for a in args.split(","))
    return head + _FLOW.format(bases="\n".join(bases) or "    pass", zero="\n".join(zero), copy=copy,
                               select="\n".join(select), fold="\n".join(fold), pins=pins)


class FlowKernel:
    """Scratch memory and counters around the compiled flow pass for one collector's queries."""

    def __init__(self, tables: Tables, nets: np.ndarray | None = None) -> None:
        self.t = tables
        self.nets = lpm.build(None) if nets is None else nets
        self.hc = np.zeros(4, dtype=np.int64)
        self.row = np.zeros(F.NFIELDS, dtype=np.int64)
        nq = max(1, tables.qp.shape[0])
        self.rows = np.zeros(codegen.BLOCK * (F.NFIELDS + 1), dtype=np.int64)
        self.keys = np.zeros(nq * codegen.BLOCK * MAXKW, dtype=np.int64)
        self.sel = np.zeros((nq, codegen.BLOCK), dtype=np.int64)
        self.hs = np.zeros((nq, codegen.BLOCK), dtype=np.uint64)
        self.compiled: ModuleType = jitcache.load_generated(flow_kernel_source(codegen.shape_of(tables)), "flows")

    def set_networks(self, nets: np.ndarray) -> None:
        self.nets = nets

    def warm(self) -> None:
        """Compile the pass now, on no records: a collector is ready only once it can fold at speed."""
        self.run(np.zeros((0, F.NFIELDS), dtype=np.int64), np.zeros(0, dtype=np.int64), 0)

    def run(self, frows: np.ndarray, weights: np.ndarray, n: int) -> int:
        """Fold records 0..n-1; callers keep n <= tables.chunk and drain between calls (output room)."""
        t = self.t
        self.compiled.flow_pass(frows, weights, n, t.qp, t.qs, t.tab, t.out, t.pane_counts, t.scols, self.hc,
                                self.row, self.rows, self.keys, self.sel, self.hs, self.nets)
        return n

    def flush_below(self, q: int, bound: int) -> int:
        t = self.t
        return flush.sweep_below(q, bound, t.qp, t.qs, t.tab, t.out, t.pane_counts)

    def min_pane(self, q: int) -> int:
        t = self.t
        return flush.min_pane(q, t.qs, t.qp, t.pane_counts)
