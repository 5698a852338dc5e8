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
from low_level.kernel import codegen
from low_level.kernel.base import KernelBase
from low_level.kernel.parse import NERR
from low_level.kernel.selection import SelectBuffers
from low_level.kernel.tables import Tables

# host-level counters (one int64 array, shared with metrics)
(HC_PACKETS, HC_PARSED_OK) = range(2)
BLOCK = codegen.BLOCK


class Kernel(KernelBase):
    """Scratch memory and counters around the compiled pass for one host's queries."""

    def __init__(self, tables: Tables, selects: list | None = None, nets: np.ndarray | None = None) -> None:
        super().__init__(tables, F.NFIELDS, nets)
        self.sel_buf = SelectBuffers(
            selects or [], tables.chunk
        )  # select queries' rows (low_level.kernel.selection)
        self.err_counts = np.zeros(NERR, dtype=np.int64)
        self.compiled = codegen.load(tables, selects)

    def _scratch(self) -> tuple:
        return (
            self.err_counts,
            self.hc,
            self.row,
            self.rows,
            self.keys,
            self.sel,
            self.hs,
            self.sel_buf.sout,
            self.sel_buf.sst,
            self.nets,
        )

    def run_ring(self, ring, ctr=None) -> int:
        """Process what the ring holds, at most one chunk; returns the frames taken. ``ctr``: counters to
        read HEAD from and write TAIL to instead of the ring's (the agent's latent timestamps bound HEAD)."""
        t = self.t
        return self.compiled.process_frames(
            ring.frames,
            ring.offs,
            ring.snaplen,
            ring.caplen,
            ring.wirelen,
            ring.ts,
            ring.iface,
            ring.ctr if ctr is None else ctr,
            t.chunk,
            *t.arrays(),
            *self._scratch(),
        )

    def run_arrays(self, frames2d, caplen, wirelen, ts, start: int, stop: int) -> int:
        """Process frames[start:stop]; callers keep stop - start <= tables.chunk and drain between calls."""
        return self.compiled.process_arrays(
            frames2d,
            caplen,
            wirelen,
            ts,
            start,
            stop,
            *self.t.arrays(),
            *self._scratch(),
        )

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
