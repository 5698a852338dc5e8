"""splitmix64 in Numba: the one hash the low level mixes with (table slots, sketch keys, fanout, generator).

The finaliser is the contract's own function (``contract.wire.mix64``, behind ``key_hash``) compiled
here, so a key hashed per packet here lands where the high level's numpy hash puts it;
``tests/test_splitmix.py`` checks the two bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import wire
from contract.wire import MIX_GOLDEN

GOLDEN = MIX_GOLDEN

mix64 = njit(cache=True, nogil=True, inline="always")(wire.mix64)
"""splitmix64's finaliser (uint64 in, uint64 out): ``contract.wire.mix64`` compiled for one value."""


@njit(cache=True, nogil=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """The splitmix64 output for state ``x``: a good 64-bit hash of a counter."""
    return mix64(x + MIX_GOLDEN)
