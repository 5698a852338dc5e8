"""Low level: per-host capture, parsing and pre-aggregation kernels (Numba)."""

from low_level.jit import cache as jitcache

jitcache.configure()  # first, before any module defines a cached Numba function
