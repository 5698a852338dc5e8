"""HAVING and alerts over the window total (``total(bytes)``, dissertation Q6-4): hold a query's closed
rows until every Kafka partition has closed their window, then release them all in one batch.

Why a gate and not a sum in the stateful step: each Kafka partition holds a share of the groups (the
agents place a partial by its group key) and closes a window on its own, perhaps micro-batches apart.
A window's total over all groups is therefore exact only when every partition of the query has closed
it (``closed_before_window`` of each partition's status past it, or every partition at end of stream).
Until then its rows (finals, and corrections or late rows of a window not yet released) wait here;
once released, the store evaluates the condition with the window's total beside every row
(:func:`contract.aggregates.window_total`), and a correction that comes after the release is judged
by its stored final, as every HAVING is (decided once, at close).

Exactly once: the held rows are a snapshot file per micro-batch, ``<results>/_pending/query=<q>/
held-<batch>.npz``, written before the batch's rows reach the store. A batch reads the newest
snapshot of an earlier batch (Spark runs batch b only after committing b-1, so older ones are
dropped), so a batch that Spark replays reads the same snapshot, holds and releases the same rows
and rewrites the same files. What it costs: a query without ``total()`` never passes through here;
one with it holds at most the rows of the windows some partition has not closed yet (the metric
``lowwater_job_total_held_rows``), which is what the slowest partition's lag bounds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from contract import query as Q
from contract import status as S
from contract import wire
from high_level.aggregate.packed import QUERY_WINDOW_FIELDS, QueryWindows

_FIELDS = QUERY_WINDOW_FIELDS
_NAME = re.compile(r"held-(\d{12})\.npz")


def closed_everywhere(partitions: int, statuses: Mapping[int, S.PartitionStatus]) -> int | None:
    """The first window not closed on every partition (None: some partition has closed none or not
    reported); when every partition's hosts reached end of stream, past every window."""
    if len(statuses) >= partitions and all(
        (statuses[p].low_water_mark_pane or 0) >= wire.END_OF_STREAM
        for p in range(partitions)
        if p in statuses
    ):
        return np.iinfo(np.int64).max
    closed = [statuses[p].closed_before_window if p in statuses else None for p in range(partitions)]
    if any(c is None for c in closed):
        return None
    return int(min(closed))  # type: ignore[type-var]


def _take(w: QueryWindows, sel: np.ndarray) -> QueryWindows:
    return QueryWindows(*(getattr(w, f)[sel] for f in _FIELDS))


def _concat(a: QueryWindows, b: QueryWindows) -> QueryWindows:
    return QueryWindows(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in _FIELDS))


class TotalGate:
    """The held rows of every query whose HAVING or alerts read a window total."""

    def __init__(self, root: str | Path, queries: Sequence[Q.QuerySpec]) -> None:
        self.dir = Path(root) / "_pending"
        self.held: dict[str, int] = {}  # rows held after the last batch, per query (for the metric)
        # a query that reads a total, and one that no longer does but still has rows held by an earlier
        # run (its config changed): those drain when their windows close everywhere, never lost
        self.queries = {q.name: q for q in queries if Q.window_totals(q) or self._still_held(q.name)}

    def _folder(self, name: str) -> Path:
        return self.dir / f"query={name}"

    def _snapshots(self, name: str) -> list[tuple[int, Path]]:
        folder = self._folder(name)
        if not folder.is_dir():
            return []
        found = [(int(m.group(1)), f) for f in folder.iterdir() if (m := _NAME.fullmatch(f.name))]
        return sorted(found)

    def _still_held(self, name: str) -> bool:
        snaps = self._snapshots(name)
        if not snaps:
            return False
        with np.load(snaps[-1][1]) as z:
            return len(z["window"]) > 0

    def admit(
        self, batch_id: int, q: Q.QuerySpec, w: QueryWindows | None, statuses: Mapping[int, S.PartitionStatus]
    ) -> QueryWindows | None:
        """The rows of ``q`` to write in this batch: this batch's and the held ones whose window every
        partition has closed (``statuses``: each partition's status after this batch). Holds the rest."""
        earlier = [(b, f) for b, f in self._snapshots(q.name) if b < batch_id]
        for _, f in earlier[:-1]:  # committed long ago: the newest earlier snapshot supersedes them
            f.unlink(missing_ok=True)
        prev = None
        if earlier:
            with np.load(earlier[-1][1]) as z:
                prev = QueryWindows(*(z[f] for f in _FIELDS))
        rows = prev if w is None else w if prev is None else _concat(prev, w)
        if rows is None:
            self.held[q.name] = 0
            return None
        closed = closed_everywhere(q.kafka.partitions, statuses)
        ready = np.zeros(len(rows.window), bool) if closed is None else rows.window < closed
        keep = _take(rows, ~ready)
        if len(keep.window) or (prev is not None and len(prev.window)):
            self._write(q.name, batch_id, keep)
        self.held[q.name] = len(keep.window)
        return _take(rows, ready)

    def _write(self, name: str, batch_id: int, rows: QueryWindows) -> None:
        path = self._folder(name) / f"held-{batch_id:012d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **{f: getattr(rows, f) for f in _FIELDS})
        os.replace(tmp, path)
