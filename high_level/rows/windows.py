"""The high level of a row-window query: merge row-pane partials, close windows by each host's row count.

A *stream* is one capture host, or one (host, ``partition_by`` value) of a partitioned row window; each
numbers its own rows (``low_level.kernel.rownum``). Its partials are keyed by (stream, pane, group), pane
= row number // gcd(rows, slide), and its punctuation is its row count. Window ``w`` of a stream covers
panes ``[w-k+1, w]`` (``k`` panes per window; only every ``s``-th WID is a window when the slide is not a
pane) and closes when the count reaches its end row ``(w+1)*pane``: the same WID arithmetic as the time
windows (``high_level.aggregate.rollup``), so arrival order does not matter and the state is the open
panes, never the rows (the dissertation's WID against buffering, Fig. 6-10). Vectorised over numpy
arrays; every merge is the registry's (``contract.aggregates``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import aggregates as A
from contract.query.rows import RowQuerySpec
from contract.query.windows import RowWindowSpec
from high_level.aggregate.merge import group_reduce, key_codes
from high_level.rows import saved

I64 = np.int64


@dataclass
class RowResults:
    """Closed row windows: one row per (stream, window, group)."""

    host: np.ndarray  # object[n] capture host ids
    part: np.ndarray  # int64[n, pw] partition value (pw = 0 when the window is not partitioned)
    window: np.ndarray  # int64[n] WID
    first_row: np.ndarray  # int64[n] the window's first row number (0 for the short first windows)
    end_row: np.ndarray  # int64[n] one past its last row
    key: np.ndarray  # int64[n, kw]
    state: np.ndarray  # int64[n, ns] merged state (the registry's columns)
    values: dict[str, np.ndarray]  # result columns by aggregate name

    def __len__(self) -> int:
        return int(self.window.shape[0])


class RowWindows:
    """One row query's open panes on one partition processor (several hosts, any arrival order)."""

    def __init__(self, spec: RowQuerySpec, part_words: int, key_words: int) -> None:
        self.spec = spec
        w = spec.window
        if not isinstance(w, RowWindowSpec):
            raise ValueError(f"query {spec.name!r} has a slide-by-tuple window (high_level.rows.bytuple)")
        self.pane, (self.k, self.s) = w.pane_rows, w.panes
        self.ops = spec.ops
        self.pw, self.kw, self.ns = part_words, key_words, len(self.ops)
        self.hosts: list[str] = []
        self.streams = np.zeros((0, 1 + part_words), I64)  # (host index, partition words)
        self.mark = np.zeros(0, I64)  # rows the stream has punctuated
        self.front = np.zeros(0, I64)  # windows below it are emitted
        self.t_stream = np.zeros(0, I64)
        self.t_pane = np.zeros(0, I64)
        self.t_key = np.zeros((0, key_words), I64)
        self.t_state = np.zeros((0, self.ns), I64)
        self.late = 0  # partial rows of panes whose first window was already emitted (counted, dropped)

    def _codes(self, host: str, part: np.ndarray) -> np.ndarray:
        """Stream index of each row's (host, partition), new streams added (vectorised per batch)."""
        if host not in self.hosts:
            self.hosts.append(host)
        part = np.asarray(part, I64)
        part = part.reshape(len(part), self.pw)
        words = np.column_stack([np.full(len(part), self.hosts.index(host), I64), part])
        known = len(self.streams)
        uniq, inv = np.unique(np.vstack([self.streams, words]), axis=0, return_inverse=True)
        inv = inv.ravel().astype(I64)
        if len(uniq) != known:
            old = inv[:known]
            mark, front = np.zeros(len(uniq), I64), np.zeros(len(uniq), I64)
            mark[old], front[old] = self.mark, self.front
            self.streams, self.mark, self.front = uniq, mark, front
            self.t_stream = old[self.t_stream]
        return inv[known:]

    def add(self, host: str, part: np.ndarray, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Merge one message of ``host``'s partials (int64 arrays, one row per (partition, pane, group))."""
        codes = self._codes(host, part)
        pane = np.asarray(pane, I64)
        ok = pane >= self.front[codes]
        self.late += int(len(ok) - ok.sum())
        stream = np.concatenate([self.t_stream, codes[ok]])
        keys = np.column_stack(
            [stream, np.concatenate([self.t_pane, pane[ok]]), np.vstack([self.t_key, key[ok]])]
        )
        keys, st = group_reduce(keys, np.vstack([self.t_state, np.asarray(state, I64)[ok]]), self.ops)
        self.t_stream, self.t_pane = keys[:, 0].copy(), keys[:, 1].copy()
        self.t_key, self.t_state = np.ascontiguousarray(keys[:, 2:]), st

    def punctuate(self, host: str, part: np.ndarray, rows: np.ndarray) -> None:
        """``host`` has sent every row of these partitions below ``rows`` (its row counters)."""
        codes = self._codes(host, part)
        np.maximum.at(self.mark, codes, np.asarray(rows, I64))

    def counts(self, host: str, part: np.ndarray) -> np.ndarray:
        """The row marks so far of ``host``'s streams of these partition values (0: not punctuated yet)."""
        return self.mark[self._codes(host, part)].copy()

    def close(self) -> RowResults:
        """Emit every window whose stream's row count passed its end; purge the panes no window needs."""
        hi = self.mark // self.pane  # windows w < hi have ended
        lo = self.front
        out_keys = np.zeros((0, 2 + self.kw), I64)
        st = np.zeros((0, self.ns), I64)
        if len(self.t_pane) and np.any(hi > lo):
            out_keys, st = self._windows(lo, hi)
            order = np.lexsort(out_keys[:, ::-1].T)
            out_keys, st = out_keys[order], st[order]
        self.front = np.maximum(self.front, hi)
        keep = self.t_pane >= self.front[self.t_stream] - self.k + 1
        self.t_stream, self.t_pane, self.t_key, self.t_state = (
            self.t_stream[keep],
            self.t_pane[keep],
            self.t_key[keep],
            self.t_state[keep],
        )
        sid, w = out_keys[:, 0], out_keys[:, 1]
        end = (w + 1) * self.pane
        return RowResults(
            host=np.array([self.hosts[h] for h in self.streams[sid, 0]], dtype=object),
            part=self.streams[sid, 1:],
            window=w,
            first_row=np.maximum(end - self.spec.window.rows, 0),
            end_row=end,
            key=np.ascontiguousarray(out_keys[:, 2:]),
            state=st,
            values=A.finalize(self.spec.aggs, st),
        )

    def _windows(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows (stream, window, key) and merged state of every window in ``[lo, hi)`` of its stream.

        Sorted by (stream, key, pane), a window is a run of consecutive table rows; every run is merged
        at once by ``ufunc.reduceat`` over interleaved (start, end) indexes, so a close reads each
        window's panes once at C speed (k per window), with no (pane, window) pairs to materialise.
        """
        k, s = self.k, self.s
        g = key_codes(np.column_stack([self.t_stream, self.t_key]))
        ng = int(g.max()) + 1
        gmin = np.full(ng, np.iinfo(I64).max, I64)
        np.minimum.at(gmin, g, self.t_pane)
        rel = self.t_pane - gmin[g] + k  # >= k: room for a window's first pane below the group's first
        span = int(rel.max()) + k + 2
        comb = g * span + rel
        order = np.argsort(comb, kind="stable")
        comb, gs = comb[order], g[order]
        starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
        last = np.r_[starts[1:], len(gs)] - 1
        sid = self.t_stream[order][starts]
        pmin, pmax = self.t_pane[order][starts], self.t_pane[order][last]
        wlo = np.maximum(lo[sid], pmin)
        whi = np.minimum(hi[sid] - 1, pmax + k - 1)
        w0 = wlo + (k - 1 - wlo) % s  # the first window at or after wlo (windows: w = k-1 mod s)
        cnt = np.where(whi >= w0, (whi - w0) // s + 1, 0)
        rep = np.repeat(np.arange(len(starts)), cnt)
        w = w0[rep] + (np.arange(int(cnt.sum()), dtype=I64) - np.repeat(np.cumsum(cnt) - cnt, cnt)) * s
        gbase = gs[starts][rep] * span - pmin[rep] + k
        a = np.searchsorted(comb, gbase + w - k + 1, "left")
        b = np.searchsorted(comb, gbase + w, "right")
        ok = a < b
        a, b, w, rep = a[ok], b[ok], w[ok], rep[ok]
        idx = np.column_stack([a, b]).ravel()
        state = self.t_state[order]
        st = np.empty((len(a), self.ns), I64)
        for j, op in enumerate(self.ops):
            col = np.r_[state[:, j], A.MERGE_IDENTITY[op]]
            st[:, j] = A.MERGE_UFUNCS[op].reduceat(col, idx)[::2] if len(idx) else col[:0]
        keys = np.column_stack([sid[rep], w, self.t_key[order][starts][rep]])
        return keys, st

    @property
    def state_rows(self) -> int:
        """Pane rows held: bounded by the open panes of each stream, not by its rows."""
        return int(len(self.t_pane))

    def snapshot(self) -> bytes:
        """The whole state (restart: :meth:`restore` into a fresh operator of the same query)."""
        return saved.snapshot(self, _ARRAYS, ("hosts", "late"))

    def restore(self, blob: bytes) -> None:
        saved.restore(self, blob, _ARRAYS)


_ARRAYS = ("streams", "mark", "front", "t_stream", "t_pane", "t_key", "t_state")
