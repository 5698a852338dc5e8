"""Low level: per-host capture, parsing and pre-aggregation kernels (Numba)."""
