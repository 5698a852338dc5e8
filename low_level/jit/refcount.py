"""Keeping per-packet Numba calls free of atomic reference counting.

Numba increfs every array argument on entry to a compiled function and decrefs it at its last use.
When that last use sits inside a loop or a branch, or a helper is inlined (which rebinds its array
arguments), the atomic NRT incref/decref pair stays in the code and runs per packet: it has cost
the capture path half or more of its speed. Per-packet helpers therefore have one exit and call
:func:`pin` on every array argument there, which makes the exit the last use; Numba's refcount
pruning then removes the pair.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def pin(a: np.ndarray) -> int:
    """A use of ``a`` that compiles to nothing (see the module docstring)."""
    return a.shape[0]


@njit(cache=True, nogil=True)
def pin_tables(
    qp: np.ndarray, qs: np.ndarray, tab: np.ndarray, out: np.ndarray, pane_counts: np.ndarray
) -> int:
    """:func:`pin` of the five table arrays every flush and emit helper takes (low_level.kernel.tables)."""
    return qp.shape[0] + qs.shape[0] + tab.shape[0] + out.shape[0] + pane_counts.shape[0]
