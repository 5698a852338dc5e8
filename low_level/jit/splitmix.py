"""splitmix64 in Numba: the one hash the low level mixes with (table slots, sketch keys, fanout, generator).

The constants and the vectorised numpy twin are the contract's (``contract.wire._mix``, behind
``key_hash``), so a key hashed per packet here lands where the high level's numpy hash puts it;
``tests/test_splitmix.py`` checks the two bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract.wire import MIX_GOLDEN, MIX_M1, MIX_M2

GOLDEN = MIX_GOLDEN


@njit(cache=True, nogil=True, inline="always")
def mix64(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser (uint64 in, uint64 out; the arithmetic wraps by design)."""
    x = x ^ (x >> np.uint64(30))
    x = x * MIX_M1
    x = x ^ (x >> np.uint64(27))
    x = x * MIX_M2
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """The splitmix64 output for state ``x``: a good 64-bit hash of a counter."""
    return mix64(x + MIX_GOLDEN)
