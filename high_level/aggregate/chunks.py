"""A pane table kept as per-batch chunks in a keyed store: a micro-batch writes only what it brings.

Why: the blob state (a :class:`high_level.aggregate.rollup.QueryRollup` saved whole every micro-batch) makes every
batch pay for the whole open state (restore, re-merge, rewrite), so the rate falls as open groups grow.
Here a batch's partials, merged within the batch, are appended as one chunk per (query, pane) to a
store kept per key (a MapState of Spark's RocksDB state store, :mod:`high_level.aggregate.chunkstep`, or a dict
offline). A pane's chunks are read, merged and assembled only when a window that needs it closes, and
deleted when no open window needs it any more; untouched panes cost nothing per batch. The small part
(closed frontier, pane index: chunks and rows per pane) travels with the processor's own state.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from contract import wire
from high_level import codec
from high_level.aggregate.rollup import (
    I64,
    QueryRollup,
    Windows,
    assemble,
    group_reduce,
    running_sums,
    slide_windows,
    touched_pairs,
    touched_windows,
)

# Size-tiered merging of a pane's chunks: when the newest FANOUT chunks (or more) are each at most FANOUT
# times the size of the newest one, they are merged into one (repeatedly). A pane then holds O(FANOUT log N)
# chunks, and a record is rewritten O(log_FANOUT N) times over the pane's life, so the cost per batch stays
# proportional to the batch (amortised). A lazier rule than merging every new chunk into the previous one:
# a long-open pane of many groups (whose batches each bring mostly groups it already holds) is rewritten
# once every ~FANOUT batches, not every second one (benchmarks/results/rollup_scale.json).
FANOUT = 16
RUN_PANE = -(2**62)  # where a differential query's running sums live in the chunk store (no real pane)


def merge_run(sizes: list[int], fanout: int = FANOUT) -> int:
    """How many of the newest chunks to merge now (0: none): the longest run of newest chunks each at most
    ``fanout`` times the newest, if it holds ``fanout`` or more."""
    if len(sizes) < fanout:
        return 0
    cap = fanout * max(1, sizes[-1])
    run = 0
    for n in reversed(sizes):
        if n > cap:
            break
        run += 1
    return run if run >= fanout else 0


class ChunkStore(Protocol):
    """Where chunks live: bytes per (query, pane, seq)."""

    def put(self, query: str, pane: int, seq: int, data: bytes) -> None: ...

    def get(self, query: str, pane: int, seq: int) -> bytes: ...

    def remove(self, query: str, pane: int, seq: int) -> None: ...


class MemoryChunks:
    """A dict as the chunk store: for tests and the offline processor."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, int, int], bytes] = {}

    def put(self, query: str, pane: int, seq: int, data: bytes) -> None:
        self.data[(query, int(pane), int(seq))] = bytes(data)

    def get(self, query: str, pane: int, seq: int) -> bytes:
        return self.data[(query, int(pane), int(seq))]

    def remove(self, query: str, pane: int, seq: int) -> None:
        self.data.pop((query, int(pane), int(seq)), None)


CHUNK_ZMAGIC = b"LWCZ"  # a zstd-compressed chunk follows (chunks of earlier builds are uncompressed)


def encode_chunk(key: np.ndarray, state: np.ndarray) -> bytes:
    """A chunk's bytes, compressed: a pane of millions of groups is tens of MB raw, and every byte is paid
    again on each hop to the state store (:func:`high_level.codec.compress`)."""
    return codec.compress(codec.pack({}, {"key": key, "state": state}), CHUNK_ZMAGIC)


def decode_chunk(data: bytes, kw: int, na: int) -> tuple[np.ndarray, np.ndarray]:
    _, arrays = codec.unpack(codec.decompress(data, CHUNK_ZMAGIC))
    key, state = arrays["key"], arrays["state"]
    if key.shape[1:] != (kw,) or state.shape[1:] != (na,) or len(key) != len(state):
        raise codec.CodecError(f"chunk of {key.shape}/{state.shape} does not fit {kw}/{na} key/state columns")
    return key, state


class ChunkedRollup(QueryRollup):
    """:class:`QueryRollup` whose pane table is in a :class:`ChunkStore` (its own arrays stay empty).

    Same results: closing assembles the windows from the merged chunks of exactly the panes they
    cover, and live provisional rows from the panes of the windows a batch touched. Not for queries that
    need the open table every close or merge (landmark 'update' rows and folds, a bounded top): see
    :func:`chunked_unsupported`.
    """

    def __init__(self, layout, store: ChunkStore | None = None) -> None:  # noqa: ANN001 - Layout
        super().__init__(layout)
        self.store = store
        self.index: dict[int, list[int]] = {}  # pane -> rows of each chunk (seq = position)
        self.has_run = False  # differential layouts: the running sums are in the store (pane RUN_PANE)

    def __len__(self) -> int:
        return sum(sum(v) for v in self.index.values())

    def panes(self) -> np.ndarray:
        return np.array(sorted(self.index), I64)

    def index_dict(self) -> dict[str, list[int]]:
        return {str(p): list(v) for p, v in self.index.items()} | ({"run": [1]} if self.has_run else {})

    def load_index(self, d: dict[str, list[int]]) -> None:
        self.has_run = "run" in d
        self.index = {int(p): [int(n) for n in v] for p, v in d.items() if p != "run"}

    def _store(self) -> ChunkStore:
        if self.store is None:
            raise RuntimeError("chunked roll-up without a chunk store")
        return self.store

    def merge(self, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Append the batch's partials, merged per (pane, key), as one chunk per pane."""
        lay, store = self.layout, self._store()
        if not len(pane):
            return
        keys, st = group_reduce(np.column_stack([pane, key]), state, lay.ops)
        order = np.argsort(keys[:, 0], kind="stable")
        keys, st = keys[order], st[order]
        p = keys[:, 0]
        cuts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        for s, e in zip(cuts.tolist(), [*cuts[1:].tolist(), len(p)], strict=True):
            pn = int(p[s])
            sizes = self.index.setdefault(pn, [])
            had = held = len(sizes)  # chunks in the store before this batch; `held` of them still valid
            key, state = np.ascontiguousarray(keys[s:e, 1:]), st[s:e]
            sizes.append(len(key))
            while run := merge_run(sizes):  # size-tiered: the newest run of similar chunks becomes one
                first = len(sizes) - run
                parts = [decode_chunk(store.get(lay.name, pn, q), lay.kw, lay.na) for q in range(first, held)]
                parts.append((key, state))
                key, state = group_reduce(
                    np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts]), lay.ops
                )
                del sizes[first:]
                sizes.append(len(key))
                held = min(held, first)  # chunks from `first` on are rewritten below or removed
            store.put(lay.name, pn, len(sizes) - 1, encode_chunk(key, state))
            for seq in range(len(sizes), had):  # chunks merged into a lower seq
                store.remove(lay.name, pn, seq)

    def _read(self, pane: int) -> tuple[np.ndarray, np.ndarray]:
        """One pane's rows, unique per key."""
        lay, store = self.layout, self._store()
        n = len(self.index[pane])
        parts = [decode_chunk(store.get(lay.name, pane, s), lay.kw, lay.na) for s in range(n)]
        if n == 1:
            return parts[0]
        return group_reduce(
            np.concatenate([k for k, _ in parts]), np.concatenate([s for _, s in parts]), lay.ops
        )

    def _compact(self, pane: int, key: np.ndarray, state: np.ndarray) -> None:
        """Replace a pane's chunks by one (its merged rows)."""
        lay, store = self.layout, self._store()
        n = len(self.index[pane])
        store.put(lay.name, pane, 0, encode_chunk(key, state))
        for s in range(1, n):
            store.remove(lay.name, pane, s)
        self.index[pane] = [len(key)]

    def _drop(self, pane: int) -> None:
        for s in range(len(self.index.pop(pane))):
            self._store().remove(self.layout.name, pane, s)

    def close(self, lwm: int | None, through_pane: int | None = None) -> Windows:
        """As :meth:`QueryRollup.close`, reading only the panes of the windows that close."""
        lay = self.layout
        if lwm is not None and lwm >= wire.END_OF_STREAM:
            tops = [max(self.index)] if self.index else []
            tops += [through_pane] if through_pane is not None else []
            lwm = max(tops) + lay.k if tops else None
        if lwm is None or (self.closed is not None and lwm <= self.closed):
            return Windows.empty(lay.kw, lay.na)
        if not self.index:
            self.closed = int(lwm)
            self.forget_run()
            return Windows.empty(lay.kw, lay.na)
        lo = min(self.index) if self.closed is None else self.closed
        hi, f0, f1 = int(lwm), lay.first_needed_pane(lo), lay.first_needed_pane(int(lwm))
        run = self._get_run() if lay.differential else None
        if not lay.differential:
            need = [p for p in sorted(self.index) if lo - lay.k + 1 <= p < hi]
        else:  # the panes that enter and expire (and, without running sums, those they start from)
            need = [
                p
                for p in sorted(self.index)
                if lo <= p < hi or f0 <= p < (f1 if run is not None else max(f1, lo))
            ]
        self.closed = hi
        first = lay.first_needed_pane(self.closed)
        rows = []
        for p in need:
            key, state = self._read(p)
            rows.append((p, key, state))
            if p >= first and len(self.index[p]) > 1:  # still needed: keep it merged for the next close
                self._compact(p, key, state)
        for p in [p for p in self.index if p < first]:
            self._drop(p)
        pane = np.concatenate([np.full(len(k), p, I64) for p, k, _ in rows]) if rows else np.empty(0, I64)
        key = np.concatenate([k for _, k, _ in rows]) if rows else np.empty((0, lay.kw), I64)
        state = np.concatenate([s for *_, s in rows]) if rows else np.empty((0, lay.na), I64)
        if not lay.differential:
            self.forget_run()  # running sums of an earlier config that kept them: no longer kept
            return assemble(pane, key, state, lo, hi, lay.k, lay.ops, lay.s)
        if run is None:
            sel = (pane >= f0) & (pane < lo)
            run = running_sums(key[sel], state[sel], lay)
        ent, lv = (pane >= lo) & (pane < hi), (pane >= f0) & (pane < f1)
        out, run = slide_windows(
            run, (pane[ent], key[ent], state[ent]), (pane[lv], key[lv], state[lv]), lo, hi, lay.k, lay.s
        )
        self._put_run(run)
        return out

    def _get_run(self) -> Windows | None:
        """The running sums kept in the chunk store (a pane of their own), or None."""
        if not self.has_run:
            return None
        key, state = decode_chunk(
            self._store().get(self.layout.name, RUN_PANE, 0), self.layout.kw, self.layout.na + 1
        )
        return Windows(np.zeros(len(key), I64), key, state)

    def _put_run(self, run: Windows) -> None:
        self._store().put(self.layout.name, RUN_PANE, 0, encode_chunk(run.key, run.state))
        self.has_run = True

    def forget_run(self) -> None:
        if self.has_run:
            self._store().remove(self.layout.name, RUN_PANE, 0)
        self.has_run = False
        self.run = None

    def run_arrays(self, name: str) -> dict[str, np.ndarray]:
        return {}  # kept in the chunk store, not in the processor's small state

    def landmark_update(self) -> Windows:
        raise NotImplementedError("landmark queries keep the blob state")

    def provisional(self, pane: np.ndarray, key: np.ndarray) -> Windows:
        """As :meth:`QueryRollup.provisional`: reads the panes of the windows the batch touched (their chunks
        merged, the touched groups' rows kept), not the rest of the open state."""
        lay = self.layout
        w, wkey = touched_pairs(lay, self.closed, pane, key)
        if len(w) == 0 or not self.index:
            return Windows.empty(lay.kw, lay.na)
        touched = wire.key_hash(wkey)
        rows = []
        for p in sorted(self.index):
            if int(w.min()) - lay.k + 1 <= p <= int(w.max()):
                k, s = self._read(p)
                sel = np.isin(wire.key_hash(k), touched)
                rows.append((np.full(int(sel.sum()), p, I64), k[sel], s[sel]))
        if not rows:
            return Windows.empty(lay.kw, lay.na)
        return touched_windows(lay, *(np.concatenate(c) for c in zip(*rows, strict=True)), w, wkey)


def chunked_unsupported(layouts) -> str | None:  # noqa: ANN001 - Sequence[Layout]
    """Why the chunked state cannot run these queries (None: it can).

    Each reason is a feature that reads the whole open table every batch or every close, which the
    chunked state exists to avoid; those jobs keep the blob state.
    """
    for lay in layouts:
        if lay.landmark:
            return f"query {lay.name!r} is a landmark (its open window is folded and reported at every close)"
        if lay.top_capacity:
            return f"query {lay.name!r} bounds its top per pane after every merge (Misra-Gries)"
        if lay.groups:
            return f"query {lay.name!r} takes group-wise punctuation (per-group frontiers, heartbeat.groups)"
        if lay.strategy != "lazy":
            return f"query {lay.name!r} keeps window aggregates (window.strategy {lay.strategy})"
    return None
