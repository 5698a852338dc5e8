"""One splitmix64: the low level's Numba hash equals the contract's numpy one bit for bit."""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import wire
from low_level.jit.splitmix import GOLDEN, mix64, splitmix64


@njit(cache=True)
def _each(xs: np.ndarray, split: bool) -> np.ndarray:
    """mix64 (or splitmix64 with ``split``) of every element, in Numba."""
    out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        out[i] = splitmix64(xs[i]) if split else mix64(xs[i])
    return out


def test_numba_splitmix_equals_the_contracts() -> None:
    rng = np.random.default_rng(7)
    xs = np.concatenate(
        [
            rng.integers(0, 2**63, 10_000, dtype=np.int64).view(np.uint64) * np.uint64(3),
            np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64),
        ]
    )
    with np.errstate(over="ignore"):
        assert np.array_equal(_each(xs, False), wire.mix64(xs))
        assert np.array_equal(_each(xs, True), wire.mix64(xs + GOLDEN))
    # a known value of the reference splitmix64 (state 0 -> first output), so both cannot drift together
    assert int(_each(np.zeros(1, dtype=np.uint64), True)[0]) == 0xE220A8397B1DCDAF
