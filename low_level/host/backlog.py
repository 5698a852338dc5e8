"""The uplink backlog: what the agent has produced but Kafka has not yet accepted.

Per (query, partition) a FIFO of items, each either a block of partial records or a punctuation.
When Kafka is slow or down the backlog grows; past ``merge_at`` records it is compacted in place
(UpStream's IN-PLACE idea for additive aggregates): every pending partial of a (query, partition) is
merged per (pane, key) into one block placed first, and only the newest punctuation is kept after it.
Moving a partial *ahead* of a punctuation never breaks grammar, so compaction loses nothing; memory
is then bounded by the number of distinct (query, pane, key). Only past ``max_records`` after
compaction are panes shed, and then all or nothing: whole (query, pane) units, oldest pane start
first, in every partition at once; every shed record is counted, and each (query, partition) keeps the
pane ranges it shed until its next punctuation carries them to the high level
(``wire.Punctuation.shed``), which marks every window overlapping them incomplete: never silently short.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from contract import aggregates as A
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
        out[:, j] = A.MERGE_UFUNCS[int(op)].reduceat(st[:, j], starts)
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
    pane_time: dict[str, tuple[int, int]] = field(default_factory=dict)  # query -> (origin_ns, pane_ns)
    shed_panes: int = 0  # (query, pane) units shed
    shed: dict[tuple[str, int], dict[int, int]] = field(
        default_factory=dict
    )  # (query, part) -> pane -> records
    unsent_shed: dict[tuple[str, int], tuple[tuple[int, int, int], ...]] = field(default_factory=dict)
    shed_unseq: dict[tuple[str, int], int] = field(default_factory=dict)  # shed records not yet in seq

    def take_shed_records(self, query: str, partition: int) -> int:
        """Records shed for (query, partition) since the last call: the emitter counts them in its sequence
        number as if sent, so a punctuation carrying the shed ranges that is itself lost in flight still
        shows up at the high level as missing records (a sequence gap) and no window ends silently short."""
        return self.shed_unseq.pop((query, partition), 0)

    def take_shed(self, query: str, partition: int) -> tuple[tuple[int, int, int], ...]:
        """The pane ranges (first, last, records) shed for (query, partition) since the last call, for the
        next punctuation of that partition; contiguous panes form one range."""
        back = self.unsent_shed.pop((query, partition), ())
        panes = self.shed.pop((query, partition), None)
        if not panes:
            return back
        out: list[list[int]] = [list(r) for r in back]
        for p in sorted(panes):
            if out and out[-1][1] == p - 1:
                out[-1][1] = p
                out[-1][2] += panes[p]
            else:
                out.append([p, p, panes[p]])
        return tuple((a, b, c) for a, b, c in out)

    def give_back_shed(self, query: str, partition: int, ranges: tuple[tuple[int, int, int], ...]) -> None:
        """Ranges taken for a punctuation that could not be handed to Kafka: the next one carries them."""
        if ranges:
            self.unsent_shed[(query, partition)] = ranges + self.unsent_shed.get((query, partition), ())

    def add_partials(self, query: str, partition: int, block: Block) -> None:
        if block.n:
            self.fifos.setdefault((query, partition), deque()).append(block)
            self.records += block.n
            if self.records > self.merge_at:
                self.compact()

    def add_punctuation(
        self, query: str, partition: int, p: wire.Punctuation | wire.GroupPunctuation
    ) -> None:
        self.fifos.setdefault((query, partition), deque()).append(p)

    def compact(self) -> None:
        """Merge in place; then, if still above max_records, drop the oldest panes (counted)."""
        self.merges += 1
        total = 0
        for (query, _part), fifo in self.fifos.items():
            blocks = [b for b in fifo if isinstance(b, Block)]
            puncts = [p for p in fifo if isinstance(p, wire.Punctuation)]
            groups = [g for g in fifo if isinstance(g, wire.GroupPunctuation)]  # each one says other groups
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
            fifo.extend(groups)  # after every partial, as all punctuation (partials only move ahead)
            if puncts:
                fifo.append(puncts[-1])
        self.records = total
        if self.records > self.max_records:
            self._shed(self.records - self.max_records)

    def _shed(self, excess: int) -> None:
        """Shed whole (query, pane) units, oldest pane start first, until ``excess`` records are gone: a
        unit goes from every partition at once (all or nothing), and what went is recorded per (query,
        partition) for the next punctuation. Pane starts order the units across queries of different
        pane lengths (pane numbers alone do not compare)."""
        per_unit: dict[tuple[str, int], int] = {}
        for (query, _part), fifo in self.fifos.items():
            for b in fifo:
                if isinstance(b, Block) and b.n:
                    u, c = np.unique(b.pane, return_counts=True)
                    for p, n in zip(u.tolist(), c.tolist(), strict=True):
                        per_unit[(query, p)] = per_unit.get((query, p), 0) + n

        def start(unit: tuple[str, int]) -> int:
            origin, pane_ns = self.pane_time.get(unit[0], (0, 1))
            return origin + unit[1] * pane_ns

        drop: dict[str, set[int]] = {}
        gone = 0
        for unit in sorted(per_unit, key=lambda u: (start(u), u[0])):
            if gone >= excess:
                break
            drop.setdefault(unit[0], set()).add(unit[1])
            gone += per_unit[unit]
            self.shed_panes += 1
        for (query, part), fifo in self.fifos.items():
            panes = drop.get(query)
            if not panes:
                continue
            shed_here = self.shed.setdefault((query, part), {})
            sel_panes = np.fromiter(panes, np.int64, len(panes))
            for i, b in enumerate(fifo):
                if isinstance(b, Block):
                    out = np.isin(b.pane, sel_panes)
                    if out.any():
                        u, c = np.unique(b.pane[out], return_counts=True)
                        for p, n in zip(u.tolist(), c.tolist(), strict=True):
                            shed_here[p] = shed_here.get(p, 0) + n
                        dropped = int(out.sum())
                        self.shed_unseq[(query, part)] = self.shed_unseq.get((query, part), 0) + dropped
                        self.lost += dropped
                        self.records -= dropped
                        fifo[i] = Block(b.pane[~out], b.key[~out], b.state[~out])
            if not shed_here:
                del self.shed[(query, part)]
