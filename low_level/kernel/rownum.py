"""Row numbers of a capture host for row-window queries (OOP §5.2: the sequence number is assigned at the
point of entry).

A host numbers the rows that pass a row query's filter in its capture order, one counter per value of the
query's ``partition_by`` (one counter when it has none). The counters are also the host's punctuation:
"every row of partition v below this number has been sent", so the high level closes a row window when
the counter passes its end. The per-row step is a compiled loop; the partition lookup is vectorised per
batch (one ``np.unique`` over the known values and the batch's).
"""

from __future__ import annotations

import numpy as np
from numba import njit

I64 = np.int64


@njit(cache=True, nogil=True)
def _number(codes: np.ndarray, counters: np.ndarray, out: np.ndarray) -> None:
    for i in range(codes.shape[0]):
        c = codes[i]
        out[i] = counters[c]
        counters[c] += 1


class RowCounter:
    """One row query's counters on one capture host: partition value (int64 words) -> rows numbered."""

    def __init__(self, part_words: int) -> None:
        self.keys = np.zeros((0 if part_words else 1, part_words), I64)
        self.count = np.zeros(len(self.keys), I64)
        self.touched = np.zeros(len(self.keys), bool)

    def number(self, part: np.ndarray) -> np.ndarray:
        """Row numbers (int64[n]) of a batch's rows in capture order; ``part`` is int64[n, part_words]."""
        part = np.asarray(part, I64)
        part = part.reshape(len(part), self.keys.shape[1])
        if self.keys.shape[1] == 0:
            codes = np.zeros(len(part), I64)
        else:
            known = len(self.keys)
            uniq, inv = np.unique(np.vstack([self.keys, part]), axis=0, return_inverse=True)
            inv = inv.ravel()
            count = np.zeros(len(uniq), I64)
            touched = np.zeros(len(uniq), bool)
            count[inv[:known]] = self.count
            touched[inv[:known]] = self.touched
            self.keys, self.count, self.touched = uniq, count, touched
            codes = inv[known:].astype(I64)
        out = np.empty(len(codes), I64)
        _number(codes, self.count, out)
        self.touched[codes] = True
        return out

    def punctuation(self) -> tuple[np.ndarray, np.ndarray]:
        """(partition values, row counts) of the partitions numbered since the last punctuation."""
        sel = np.flatnonzero(self.touched)
        self.touched[:] = False
        return self.keys[sel], self.count[sel]
