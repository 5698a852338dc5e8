"""Numba plumbing: the compiled-code cache, reference-count-free calls, huge-page arrays."""
