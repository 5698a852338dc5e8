"""Group-wise punctuation's state in the roll-up: per group, how far its windows are closed.

OOP App. A: a host may say "group g is done up to pane t" (:class:`contract.wire.GroupPunctuation`).
The roll-up (:meth:`high_level.aggregate.rollup.QueryRollup.close_groups`) emits that group's windows
below t at once and keeps t here, beside its global closed frontier: a row's frontier is the larger of
the two. An entry the global frontier reaches says nothing more and is dropped, so this table holds the
groups punctuated ahead of the low-water mark. Its own module: one concept (the per-group frontier), and
the roll-up module stays one screenful of window arithmetic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contract import wire

I64 = np.int64
NO_FRONT = np.iinfo(I64).min  # a row's frontier while nothing of it is closed


class GroupFrontiers:
    """Unique groups (their first ``gw`` key words) and the pane each one's windows are closed below."""

    def __init__(self, gw: int) -> None:
        self.key = np.empty((0, max(1, gw)), I64)
        self.closed = np.empty(0, I64)

    def __len__(self) -> int:
        return int(self.closed.shape[0])

    def find(self, key: np.ndarray) -> np.ndarray:
        """Per row of ``key`` (its first gw words) its row here, or -1 (exact: a hash hit is verified)."""
        if len(self) == 0 or len(key) == 0:
            return np.full(len(key), -1, I64)
        key = np.asarray(key, I64).reshape(len(key), -1)[:, : self.key.shape[1]]
        pos = pd.Index(wire.key_hash(self.key)).get_indexer(wire.key_hash(key)).astype(I64)
        hit = pos >= 0
        bad = hit.copy()
        bad[hit] = ~np.all(self.key[pos[hit]] == key[hit], axis=1)
        if bad.any():  # a 64-bit hash collision: look those rows up exactly
            exact = {tuple(r): i for i, r in enumerate(self.key.tolist())}
            for i in np.flatnonzero(bad):
                pos[i] = exact.get(tuple(key[i].tolist()), -1)
        return pos

    def frontier(self, key: np.ndarray, closed: int | None) -> np.ndarray:
        """int64[n]: per row of ``key`` every window below this is emitted (the global ``closed``, or its
        group's frontier when further; ``NO_FRONT``: nothing of it is closed)."""
        f = np.full(len(key), NO_FRONT if closed is None else closed, I64)
        pos = self.find(key)
        hit = pos >= 0
        f[hit] = np.maximum(f[hit], self.closed[pos[hit]])
        return f

    def advance(self, key: np.ndarray, done: np.ndarray) -> None:
        """Groups ``key`` (unique) are now closed below ``done`` (each further than before)."""
        pos = self.find(key)
        hit = pos >= 0
        self.closed[pos[hit]] = np.maximum(self.closed[pos[hit]], done[hit])
        self.key = np.ascontiguousarray(np.vstack([self.key, key[~hit]]))
        self.closed = np.r_[self.closed, done[~hit]].astype(I64)

    def drop_reached(self, closed: int | None) -> None:
        """Forget the groups the global frontier ``closed`` has reached."""
        if len(self) and closed is not None:
            keep = self.closed > closed
            self.key, self.closed = np.ascontiguousarray(self.key[keep]), self.closed[keep]

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The table for a saved state ({} when empty)."""
        return {f"{name}/group_key": self.key, f"{name}/group_closed": self.closed} if len(self) else {}

    def load(self, arrays: dict[str, np.ndarray], name: str) -> None:
        """Restore :meth:`arrays` (none saved: no group is closed ahead of the global frontier)."""
        key, closed = arrays.get(f"{name}/group_key"), arrays.get(f"{name}/group_closed")
        if key is not None and closed is not None and key.shape[1:] == self.key.shape[1:]:
            self.key, self.closed = np.ascontiguousarray(key, I64), np.asarray(closed, I64)
