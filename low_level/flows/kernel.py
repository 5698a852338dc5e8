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
    from low_level.flows.source import FlowBatch, FlowCollector

WCOL = F.NFIELDS  # the weight's slot in the block's copied rows (stride NFIELDS + 1)
FOLD_AT = 1024  # records decoded before they are folded: their rows stay in the core's cache
NO_MARK = -(1 << 63)  # no low-water mark yet: no record is late

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


@njit(cache=True, nogil=True)
def _room(qp, qs, m):
    """Whether every query's output region holds what folding m more records can emit (its table's
    entries plus 4 per record, the bound Tables.build sizes a chunk by)."""
    for q in range(qp.shape[0]):
        if qp[q, QP_OCAP] - qs[q, QS_OUTN] < qp[q, QP_SIZE] + 4 * m:
            return False
    return True


@njit(cache=True, nogil=True)
def flow_batch(
    buf, offs, lens, exps, arrival, n, tmpl, doms, tts, frows, fw, frate, ctrs, errs, exp_addr, mark,
    fold_at, carry, res, qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys, sel, hs, nets
):
    """Decode datagrams 0..n-1 and fold their records, fold_at (at most a chunk) records at a time
    (decoded rows stay in cache), in one call. Rows carry[0]..carry[1]-1 of frows, decoded by the previous call, are folded
    first. Stops early when an output region could overflow (res[4] 1: drain, call again, the unfolded
    rows are the carry) or the counter rows are nearly full (res[4] 2: take them, call again).

    res: records folded, datagrams consumed, counter rows, records older than mark (late), stop reason."""
    dres = np.zeros(4, dtype=np.int64)
    a = carry[0]
    r = carry[1]
    i = 0
    folded = 0
    nctr = 0
    late = 0
    stop = 0
    piece = min(fold_at, frows.shape[0])
    while True:
        while a < r:
            m = min(r - a, piece)
            if not _room(qp, qs, m):
                stop = 1
                break
            flow_pass(
                frows[a : a + m], fw[a : a + m], m, qp, qs, tab, out, pane_counts, scols, hc, row, rows, keys,
                sel, hs, nets,
            )
            a += m
            folded += m
        if stop or i >= n:
            break
        if nctr > 0 and ctrs.shape[0] - nctr <= SFLOW_MAX_SAMPLES:
            stop = 2
            break
        decode(
            buf, offs[i:n], lens[i:n], exps[i:n], arrival[i:n], n - i, tmpl, doms, tts, frows, fw, frate,
            ctrs[nctr:], errs, dres, exp_addr, fold_at,
        )
        got = dres[0]
        for k in range(got):
            if frows[k, F.TS] < mark:
                late += 1
        i += dres[1]
        nctr += dres[2]
        a = 0
        r = got
        if dres[1] == 0 and got == 0:
            stop = 2  # the counter rows cannot take the next datagram: take them first
            break
    pin(buf)
    pin(frows)
    res[0], res[1], res[2], res[3], res[4] = folded, i, nctr, late, stop
    pin(ctrs)
    carry[0], carry[1] = a, r
    pin(tmpl)
    pin(doms)
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
        "from low_level.kernel.tables import (QP_OBASE, QP_OCAP, QP_RW, QP_SIZE, QS_OUTN, ",
    )
    head += (
        "\nfrom low_level.flows.decode import decode\nfrom low_level.flows.sflow import SFLOW_MAX_SAMPLES\n"
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

    def take(self, col: FlowCollector, after: Callable[[], object]) -> int:
        """Decode and fold everything the collector has queued, one compiled call (``flow_batch``) per
        stretch the output regions hold, calling after (drain the output) after each; returns the records."""
        total = 0
        while col.pending:
            total += self._batch(col)
            after()
        return total

    def warm_take(self, col: FlowCollector) -> None:
        """Compile ``flow_batch`` now, on no datagrams (the collector's arrays give the types)."""
        assert not col.pending
        self._batch(col)

    def _batch(self, col: FlowCollector) -> int:
        t, c, res = self.t, col, col.res5
        s, n, q = c.first, c.n, c.q
        self.compiled.flow_batch(
            c.qbuf, q[0, s:n], q[1, s:n], q[2, s:n], q[3, s:n], n - s, c.tmpl, c.doms,
            c.timeouts.template_timeout_s, c.rows, c.weights, c.rate, c.ctrs, c.errs, c.exp_addr,
            NO_MARK if c.mark_ns is None else c.mark_ns, min(FOLD_AT, t.chunk), c.carry, res,
            t.qp, t.qs, t.tab, t.out, t.pane_counts, t.scols,
            self.hc, self.row, self.rows, self.keys, self.sel, self.hs, self.nets,
        )  # fmt: skip
        folded, used, nctr, late, _ = res.tolist()
        c.taken(used, folded, nctr, late)
        return folded

    def fold(self, batch: FlowBatch, after_chunk: Callable[[], object]) -> int:
        """Fold a decoded batch a chunk at a time (what the tables take in one call), calling after_chunk
        (drain the output) after each; returns the records folded."""
        chunk = self.t.chunk
        for s in range(0, batch.n, chunk):
            e = min(batch.n, s + chunk)
            self.run(batch.rows[s:e], batch.weights[s:e], e - s)
            after_chunk()
        return batch.n
