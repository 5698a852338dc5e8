"""The uplink backlog: what the agent has produced but Kafka has not yet accepted.

Per (query, partition) a FIFO of items, each either a block of partial records or a punctuation.
When Kafka is slow or down the backlog grows; past ``merge_at`` records it is compacted in place
(UpStream's IN-PLACE idea for additive aggregates): every pending partial of a (query, partition) is
merged per (pane, key) into one block placed first, and only the newest punctuation is kept after it.
Moving a partial *ahead* of a punctuation never breaks grammar, so compaction loses nothing; memory
is then bounded by the number of distinct (query, pane, key). Only past ``max_records`` after
compaction are the oldest panes dropped, and every dropped record is counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from contract import query as Q
from contract import wire


@dataclass
class Block:
    pane: np.ndarray
    key: np.ndarray
    state: np.ndarray

    @property
    def n(self) -> int:
        return int(self.pane.shape[0])


def merge_records(pane: np.ndarray, key: np.ndarray, state: np.ndarray, merge: np.ndarray) -> Block:
    """Merge records with equal (pane, key) using each state column's merge op, vectorised."""
    if pane.shape[0] == 0:
        return Block(pane, key, state)
    cols = np.column_stack([pane, key])
    order = np.lexsort(cols.T[::-1])
    cols, st = cols[order], state[order]
    new = np.ones(len(cols), dtype=bool)
    new[1:] = np.any(cols[1:] != cols[:-1], axis=1)
    starts = np.flatnonzero(new)
    out = np.empty((len(starts), st.shape[1]), dtype=np.int64)
    for j, op in enumerate(merge):
        if op == Q.MERGE_SUM:
            out[:, j] = np.add.reduceat(st[:, j], starts)
        elif op == Q.MERGE_MIN:
            out[:, j] = np.minimum.reduceat(st[:, j], starts)
        else:
            out[:, j] = np.maximum.reduceat(st[:, j], starts)
    return Block(cols[starts, 0].copy(), cols[starts, 1:].copy(), out)


@dataclass
class Backlog:
    merge_ops: dict[str, np.ndarray]  # per query name
    merge_at: int = 2_000_000
    max_records: int = 8_000_000
    fifos: dict[tuple[str, int], deque] = field(default_factory=dict)
    records: int = 0
    merges: int = 0  # compactions done
    merged_away: int = 0  # records absorbed by in-place merging
    lost: int = 0  # records dropped beyond max_records (counted, never silent)

    def add_partials(self, query: str, partition: int, block: Block) -> None:
        if block.n:
            self.fifos.setdefault((query, partition), deque()).append(block)
            self.records += block.n
            if self.records > self.merge_at:
                self.compact()

    def add_punctuation(self, query: str, partition: int, p: wire.Punctuation) -> None:
        self.fifos.setdefault((query, partition), deque()).append(p)

    def compact(self) -> None:
        """Merge in place; then, if still above max_records, drop the oldest panes (counted)."""
        self.merges += 1
        total = 0
        for (query, _part), fifo in self.fifos.items():
            blocks = [b for b in fifo if isinstance(b, Block)]
            puncts = [p for p in fifo if isinstance(p, wire.Punctuation)]
            fifo.clear()
            if blocks:
                before = sum(b.n for b in blocks)
                merged = merge_records(
                    np.concatenate([b.pane for b in blocks]),
                    np.concatenate([b.key for b in blocks]),
                    np.concatenate([b.state for b in blocks]),
                    self.merge_ops[query],
                )
                self.merged_away += before - merged.n
                fifo.append(merged)
                total += merged.n
            if puncts:
                fifo.append(puncts[-1])
        self.records = total
        if self.records > self.max_records:
            self._shed(self.records - self.max_records)

    def _shed(self, excess: int) -> None:
        """Drop the oldest panes' records first: the ones whose windows are most likely already late."""
        allpanes = np.concatenate([b.pane for f in self.fifos.values() for b in f if isinstance(b, Block)])
        cutoff = np.partition(allpanes, excess - 1)[excess - 1]
        for fifo in self.fifos.values():
            for i, b in enumerate(fifo):
                if isinstance(b, Block):
                    keep = b.pane > cutoff
                    dropped = int(b.n - keep.sum())
                    if dropped:
                        self.lost += dropped
                        self.records -= dropped
                        fifo[i] = Block(b.pane[keep], b.key[keep], b.state[keep])
