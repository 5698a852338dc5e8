"""The fused per-packet pass around one host's queries: parse once, then filter, key and sub-aggregate.

The pass itself is generated per query-set shape (see low_level.kernel.codegen); this module owns its
scratch memory and counters. One call consumes a run of frames from the ring (or from plain arrays
in benchmarks) and leaves evicted/flushed partials in each query's output region. It stops early only
when ``limit`` packets were taken, so the output regions (sized for one chunk) can never overflow.
"""

from __future__ import annotations

import time

import numpy as np

from contract import fields as F
from low_level.kernel import codegen, flush, lpm
from low_level.kernel.parse import NERR
from low_level.kernel.selection import SelectBuffers
from low_level.kernel.tables import MAXKW, Tables

# host-level counters (one int64 array, shared with metrics)
(HC_PACKETS, HC_PARSED_OK) = range(2)
NHC = 4
BLOCK = codegen.BLOCK


class Kernel:
    """Scratch memory and counters around the compiled pass for one host's queries."""

    def __init__(self, tables: Tables, selects: list | None = None, nets: np.ndarray | None = None) -> None:
        self.t = tables
        self.sel_buf = SelectBuffers(selects or [], tables.chunk)  # select queries' rows (low_level.kernel.selection)
        # networks-file lookup table (low_level.kernel.lpm); swap it between calls with set_networks
        self.nets = lpm.build(None) if nets is None else nets
        self.err_counts = np.zeros(NERR, dtype=np.int64)
        self.hc = np.zeros(NHC, dtype=np.int64)
        self.row = np.zeros(F.NFIELDS, dtype=np.int64)
        # per-block scratch of the generated pass, allocated once
        nq = max(1, tables.qp.shape[0])
        self.rows = np.zeros(BLOCK * F.NFIELDS, dtype=np.int64)
        self.keys = np.zeros(nq * BLOCK * MAXKW, dtype=np.int64)
        self.sel = np.zeros((nq, BLOCK), dtype=np.int64)
        self.hs = np.zeros((nq, BLOCK), dtype=np.uint64)
        self.compiled = codegen.load(tables, selects)

    def _scratch(self) -> tuple:
        return (self.err_counts, self.hc, self.row, self.rows, self.keys, self.sel, self.hs, self.sel_buf.sout,
                self.sel_buf.sst, self.nets)

    def set_networks(self, nets: np.ndarray) -> None:
        """Use a new networks table from the next call on (a reload: the tables and their state stay)."""
        self.nets = nets

    def run_ring(self, ring) -> int:
        """Process what the ring holds, at most one chunk; returns the frames taken."""
        t = self.t
        return self.compiled.process_frames(ring.frames, ring.offs, ring.snaplen, ring.caplen, ring.wirelen, ring.ts,
                                            ring.iface, ring.ctr, t.chunk, t.qp, t.qs, t.tab, t.out,
                                            t.pane_counts, t.scols, *self._scratch())

    def run_arrays(self, frames2d, caplen, wirelen, ts, start: int, stop: int) -> int:
        """Process frames[start:stop]; callers keep stop - start <= tables.chunk and drain between calls."""
        t = self.t
        return self.compiled.process_arrays(frames2d, caplen, wirelen, ts, start, stop, t.qp, t.qs, t.tab,
                                            t.out, t.pane_counts, t.scols, *self._scratch())

    def warm(self, ring) -> float:
        """Compile both entry points now, on empty input (nothing is consumed); returns the seconds taken.

        A new query shape compiles for several seconds (generated kernel, parser, flush): done on the
        first packet, a live capture would drop what arrives meanwhile. Cached shapes load in well
        under a second.
        """
        t0 = time.perf_counter()
        if ring.fill == 0:
            self.run_ring(ring)
        empty = np.zeros(0, dtype=np.int64)
        self.run_arrays(np.zeros((0, ring.snaplen), dtype=np.uint8), empty, empty, empty, 0, 0)
        return time.perf_counter() - t0

    def flush_below(self, q: int, bound: int) -> int:
        """Emit every entry of query q older than pane ``bound`` (heartbeats, idle, end of stream)."""
        t = self.t
        return flush.sweep_below(q, bound, t.qp, t.qs, t.tab, t.out, t.pane_counts)

    def min_pane(self, q: int) -> int:
        t = self.t
        return flush.min_pane(q, t.qs, t.qp, t.pane_counts)
