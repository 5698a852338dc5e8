"""The order-agnostic band join (OOP paper section 5.3, OA-Join) of two select queries, closed by punctuation.

Semantics (``contract.query.JoinSpec``): a left row ``l`` and a right row ``r`` match when their ``on``
words are equal and ``0 <= r.ts - l.ts <= band`` (directional: the SYN-ACK follows its SYN). ``inner``
emits every matching pair, ``left`` the pairs and, once final, every left row without a match,
``anti`` only those. Every output row carries the left row's timestamp: a downstream aggregation
puts it in the left row's window.

Algorithm, per Kafka partition, vectorised per micro-batch (numpy: hash, sort, searchsorted; no
Python per row):

* Each input's low-water mark ``b_left`` / ``b_right`` is the min over its live hosts' punctuation
  (:class:`high_level.meld.Meld`, as the aggregate queries; host timeout and expected hosts alike),
  never decreasing. A row below its own input's mark on arrival is late: counted, never joined
  (the other side may already have purged its partners or emitted it as unmatched).
* New rows probe the other side's stored rows (and the batch's new rows of the other side), in any
  order: the pairs found are the same whatever the arrival order.
* Purge: a left row can meet only right rows with ``r.ts <= l.ts + band``; once ``b_right`` passes
  ``l.ts + band`` none can still come, so it leaves the state, and at that moment, never earlier and
  never by wall clock, it is emitted as unmatched (left/anti join) if it met none. A right row can meet
  only left rows with ``l.ts <= r.ts``: it leaves once ``b_left`` passes ``r.ts``. So each input's
  state is bounded by the *other* input's mark (plus the band for the left side), not by the skew.
* Output punctuation: every future output row comes from a future left row (``ts >= b_left``) or a
  stored one, so the join's output mark is ``min(b_left, oldest stored left row)``, which is at least
  the seed's ``min(b_left, b_right - band)``. The aggregation over the output (:class:`QueryRollup`,
  the same roll-up as aggregate queries) closes its windows by it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import query as Q
from contract import wire
from high_level.meld import Meld
from high_level.rollup import Layout, QueryRollup, Windows, group_reduce

I64 = np.int64
SIDES = ("left", "right")
_AGG_OPS = {"count": (Q.MERGE_SUM,), "sum": (Q.MERGE_SUM,), "min": (Q.MERGE_MIN,), "max": (Q.MERGE_MAX,),
            "avg": (Q.MERGE_SUM, Q.MERGE_SUM)}


def _words(s: Q.SelectSpec, name: str) -> tuple[int, ...]:
    """Row-word indices of a field of select ``s`` (-1: the timestamp)."""
    return (-1,) if name == "timestamp" else tuple(s.word_index(name))


@dataclass(frozen=True)
class JoinLayout:
    """What the join needs to know about a join query and its two inputs (plain data, cheap to ship)."""

    name: str
    left: str
    right: str
    left_topic: str
    right_topic: str
    band_ns: int
    type: str
    lkey: tuple[int, ...]
    rkey: tuple[int, ...]
    lw: int
    rw: int
    group: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (side, words) per group-by item
    group_names: tuple[str, ...] = ()
    aggs: tuple[tuple[str, str, tuple[tuple[int, str, tuple[int, ...]], ...]], ...] = ()  # (fn, alias, terms)
    rollup: Layout | None = None
    partitions: int = 1

    @classmethod
    def of(cls, j: Q.JoinSpec, sl: Q.SelectSpec, sr: Q.SelectSpec) -> JoinLayout:
        sel = {"left": sl, "right": sr}
        lkey = tuple(w for n in j.on.left for w in _words(sl, n))
        rkey = tuple(w for n in j.on.right for w in _words(sr, n))
        group = tuple((g.split(".")[0], _words(sel[g.split(".")[0]], g.split(".")[1])) for g in j.group_by)
        aggs = tuple((a.fn, a.alias, tuple((sign, side, _words(sel[side], f)) for sign, side, f in
                                           (Q.parse_join_expr(a.expr) if a.expr else [])))
                     for a in j.aggregates)  # fmt: skip
        rollup = None
        if j.window is not None:
            w = j.window
            ops = tuple(op for a in j.aggregates for op in _AGG_OPS[a.fn])
            kw = max(1, sum(len(ws) for _, ws in group))
            rollup = Layout(j.name, f"join:{j.name}", w.pane_ns, w.panes_per_window, w.origin_ns, w.range_ns, ops, kw,
                            w.panes_per_slide, w.landmark)  # fmt: skip
        return cls(j.name, sl.name, sr.name, sl.topic, sr.topic, j.within_ns, j.type, lkey, rkey, sl.width, sr.width,
                   group, tuple(g.split(".")[1] for g in j.group_by), aggs, rollup, sl.kafka.partitions)  # fmt: skip

    def side_of(self, query: str) -> str | None:
        return "left" if query == self.left else "right" if query == self.right else None


@dataclass
class Side:
    """Stored rows of one input: timestamps, the select's words and (left) whether a match was found."""

    ts: np.ndarray
    cols: np.ndarray
    matched: np.ndarray

    @classmethod
    def empty(cls, w: int) -> Side:
        return cls(np.empty(0, I64), np.empty((0, w), I64), np.empty(0, bool))

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.ts.nbytes + self.cols.nbytes + self.matched.nbytes)

    def take(self, idx: np.ndarray) -> Side:
        return Side(self.ts[idx], self.cols[idx], self.matched[idx])

    def concat(self, other: Side) -> Side:
        if not len(other):
            return self
        if not len(self):
            return other
        return Side(np.concatenate([self.ts, other.ts]), np.concatenate([self.cols, other.cols]),
                    np.concatenate([self.matched, other.matched]))  # fmt: skip


def key_words(side: Side, words: tuple[int, ...]) -> np.ndarray:
    """int64[n, len(words)]: the rows' key words (-1 = the timestamp)."""
    return np.column_stack([side.ts if w < 0 else side.cols[:, w] for w in words]) if len(words) else \
        np.zeros((len(side), 1), I64)  # fmt: skip


def match_pairs(lk: np.ndarray, lts: np.ndarray, rk: np.ndarray, rts: np.ndarray, band: int) -> tuple[np.ndarray, ...]:
    """Every (i, j) with lk[i] == rk[j] (all words) and 0 <= rts[j] - lts[i] <= band, vectorised:
    hash the keys, sort the right side, expand equal-hash ranges, then check words and band."""
    if not len(lk) or not len(rk):
        return np.empty(0, I64), np.empty(0, I64)
    lh, rh = wire.key_hash(lk), wire.key_hash(rk)
    order = np.argsort(rh, kind="stable")
    rs = rh[order]
    lo = np.searchsorted(rs, lh, "left")
    cnt = np.searchsorted(rs, lh, "right") - lo
    total = int(cnt.sum())
    if total == 0:
        return np.empty(0, I64), np.empty(0, I64)
    li = np.repeat(np.arange(len(lh), dtype=I64), cnt)
    starts = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
    ri = order[starts + np.arange(total, dtype=I64)]
    d = rts[ri] - lts[li]
    ok = (d >= 0) & (d <= band) & (lk[li] == rk[ri]).all(axis=1)
    return li[ok], ri[ok]


@dataclass
class JoinOutput:
    """What one step produced: matching pairs, left rows final without a match, closed windows, the mark."""

    l_ts: np.ndarray
    l_cols: np.ndarray
    r_ts: np.ndarray
    r_cols: np.ndarray
    u_ts: np.ndarray  # unmatched left rows (left/anti joins), emitted once final
    u_cols: np.ndarray
    windows: Windows | None = None
    mark_ns: int | None = None
    late: dict[str, int] = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        return int(self.l_ts.shape[0])


class BandJoin:
    """One join query's state on one Kafka partition (a pure, serialisable object)."""

    def __init__(self, layout: JoinLayout, host_timeout_ms: int, expected_hosts: tuple[str, ...] = (),
                 max_gap_ms: int | None = None) -> None:  # fmt: skip
        self.layout = layout
        self.melds = {s: Meld(host_timeout_ms, expected_hosts, max_gap_ms) for s in SIDES}
        self.b: dict[str, int | None] = {"left": None, "right": None}
        self.store = {"left": Side.empty(layout.lw), "right": Side.empty(layout.rw)}
        self.late = {"left": 0, "right": 0}
        self.rollup = QueryRollup(layout.rollup) if layout.rollup is not None else None
        self.mark_ns: int | None = None
        self._new = {s: [] for s in SIDES}

    # -- input -------------------------------------------------------------------------------------
    def add(self, side: str, ts: np.ndarray, cols: np.ndarray) -> None:
        """Rows of one input (any order, any host); late rows (below the input's mark) are counted, dropped."""
        ts = np.asarray(ts, I64)
        cols = np.asarray(cols, I64).reshape(len(ts), -1)
        b = self.b[side]
        if b is not None:
            ok = ts >= b
            self.late[side] += int((~ok).sum())
            ts, cols = ts[ok], cols[ok]
        if len(ts):
            self._new[side].append(Side(ts, cols, np.zeros(len(ts), bool)))

    def observe(self, side: str, host: str, incarnation: int, mark_ns: int, sent_wall_ns: int, now_ms: int) -> None:
        """A punctuation of one host on one input."""
        self.melds[side].observe(host, incarnation, mark_ns, mark_ns, sent_wall_ns, now_ms)

    def advance(self, now_ms: int) -> None:
        for m in self.melds.values():
            m.advance(now_ms)

    def process(self, values: list[bytes], now_ms: int) -> JoinOutput:
        """One micro-batch of this partition's messages of both input topics (decoded here), then a step."""
        self.advance(now_ms)
        for v in values:
            b = wire.decode(v)
            side = self.layout.side_of(b.query)
            if side is None:
                continue
            if isinstance(b, wire.Rows):
                self.add(side, b.ts, b.cols)
            elif isinstance(b, wire.Punctuation):
                self.observe(side, b.host, b.incarnation, b.mark_ns, b.sent_wall_ns, now_ms)
        return self.step()

    # -- the join ----------------------------------------------------------------------------------
    def step(self) -> JoinOutput:
        """Join what arrived since the last step, apply the marks, emit what became final, purge."""
        lay = self.layout
        new = {s: Side.empty(lay.lw if s == "left" else lay.rw) for s in SIDES}
        for s in SIDES:
            for part in self._new[s]:
                new[s] = new[s].concat(part)
            self._new[s] = []
        L, R = self.store["left"], self.store["right"]
        nl, nr = new["left"], new["right"]
        # new left x (stored right + new right), stored left x new right
        allr = R.concat(nr)
        li1, ri1 = match_pairs(key_words(nl, lay.lkey), nl.ts, key_words(allr, lay.rkey), allr.ts, lay.band_ns)
        li2, ri2 = match_pairs(key_words(L, lay.lkey), L.ts, key_words(nr, lay.rkey), nr.ts, lay.band_ns)
        nl.matched[li1] = True
        L.matched[li2] = True
        pl_ts = np.concatenate([nl.ts[li1], L.ts[li2]])
        pl_cols = np.concatenate([nl.cols[li1], L.cols[li2]])
        pr_ts = np.concatenate([allr.ts[ri1], nr.ts[ri2]])
        pr_cols = np.concatenate([allr.cols[ri1], nr.cols[ri2]])
        L, R = L.concat(nl), allr
        # marks (never decreasing), then what became final
        for s in SIDES:
            lwm = self.melds[s].low_water_mark()
            if lwm is not None and (self.b[s] is None or lwm > self.b[s]):
                self.b[s] = int(lwm)
        u = Side.empty(lay.lw)
        if self.b["right"] is not None and len(L):
            done = L.ts < self.b["right"] - lay.band_ns if self.b["right"] < wire.END_OF_STREAM else \
                np.ones(len(L), bool)  # fmt: skip
            u = L.take(done & ~L.matched)
            L = L.take(~done)
        if self.b["left"] is not None and len(R):
            R = R.take(R.ts >= self.b["left"]) if self.b["left"] < wire.END_OF_STREAM else Side.empty(lay.rw)
        self.store["left"], self.store["right"] = L, R
        bl = self.b["left"]
        self.mark_ns = None if bl is None else min(bl, int(L.ts.min())) if len(L) else bl
        if lay.type == "anti":
            pl_ts, pl_cols = pl_ts[:0], pl_cols[:0]
            pr_ts, pr_cols = pr_ts[:0], pr_cols[:0]
        if lay.type == "inner":
            u = Side.empty(lay.lw)
        out = JoinOutput(pl_ts, pl_cols, pr_ts, pr_cols, u.ts, u.cols, None, self.mark_ns, dict(self.late))
        if self.rollup is not None:
            self._aggregate(out)
        return out

    # -- aggregation over the output ---------------------------------------------------------------
    def _aggregate(self, out: JoinOutput) -> None:
        assert self.rollup is not None
        for pane, key, state in output_partials(self.layout, out):
            self.rollup.add(pane, key, state)
        rl = self.rollup.layout
        if self.mark_ns is None:
            out.windows = Windows.empty(rl.kw, rl.na)
            return
        lwm = wire.END_OF_STREAM if self.mark_ns >= wire.END_OF_STREAM else (self.mark_ns - rl.origin_ns) // rl.pane_ns
        out.windows = self.rollup.close(lwm)

    # -- observability and persistence -------------------------------------------------------------
    @property
    def state_rows(self) -> int:
        return len(self.store["left"]) + len(self.store["right"])

    @property
    def state_bytes(self) -> int:
        return self.store["left"].nbytes + self.store["right"].nbytes

    def to_bytes(self) -> bytes:
        """The state as an .npz of plain int64/bool arrays plus a JSON header (no pickle)."""
        head = {"b": self.b, "late": self.late, "mark_ns": self.mark_ns,
                "melds": {s: m.to_dict() for s, m in self.melds.items()},
                "closed": None if self.rollup is None else self.rollup.closed}  # fmt: skip
        arrays: dict[str, Any] = {"head": np.frombuffer(json.dumps(head).encode(), np.uint8)}
        for s in SIDES:
            st = self.store[s]
            arrays |= {f"{s}_ts": st.ts, f"{s}_cols": st.cols, f"{s}_matched": st.matched}
        if self.rollup is not None:
            arrays |= {"r_pane": self.rollup.pane, "r_key": self.rollup.key, "r_state": self.rollup.state}
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, buf: bytes, layout: JoinLayout, host_timeout_ms: int, expected_hosts: tuple[str, ...] = (),
                   max_gap_ms: int | None = None) -> BandJoin:  # fmt: skip
        j = cls(layout, host_timeout_ms, expected_hosts, max_gap_ms)
        with np.load(io.BytesIO(buf), allow_pickle=False) as z:
            head = json.loads(bytes(z["head"]).decode())
            for s in SIDES:
                j.store[s] = Side(z[f"{s}_ts"], z[f"{s}_cols"], z[f"{s}_matched"])
            if j.rollup is not None:
                j.rollup.pane, j.rollup.key, j.rollup.state = z["r_pane"], z["r_key"], z["r_state"]
                j.rollup.closed = head["closed"]
        j.b, j.late, j.mark_ns = head["b"], head["late"], head["mark_ns"]
        for s in SIDES:
            j.melds[s].load_dict(head["melds"][s])
        return j


def output_partials(layout: JoinLayout, out: JoinOutput) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(pane, key, state) partial records of one step's output rows (pairs and/or unmatched left rows)."""
    rl = layout.rollup
    assert rl is not None
    res = []
    for unmatched in (False, True):
        ts = out.u_ts if unmatched else out.l_ts
        if not len(ts):
            continue
        n = len(ts)

        def vals(side: str, words: tuple[int, ...], unmatched: bool = unmatched, n: int = n) -> np.ndarray:
            t, c = (out.u_ts, out.u_cols) if unmatched else (out.l_ts, out.l_cols) if side == "left" else \
                (out.r_ts, out.r_cols)  # fmt: skip
            return np.column_stack([t if w < 0 else c[:, w] for w in words]).reshape(n, len(words))

        key = np.concatenate([vals(side, ws) for side, ws in layout.group], axis=1) if layout.group else \
            np.zeros((n, 1), I64)  # fmt: skip
        state = []
        for fn, _, terms in layout.aggs:
            v = np.zeros(n, I64)
            for sign, side, ws in terms:
                v = v + sign * vals(side, ws)[:, 0]
            state += [np.ones(n, I64)] if fn == "count" else [v, np.ones(n, I64)] if fn == "avg" else [v]
        res.append(((ts - rl.origin_ns) // rl.pane_ns, key.reshape(n, rl.kw), np.column_stack(state).reshape(n, rl.na)))
    return res


def merge_partitions(layout: JoinLayout, parts: list[Windows]) -> Windows:
    """One row per (window, group) from the partitions' closed windows of a join aggregate.

    The join is partitioned by its key (the 4-tuple), the aggregation groups by something else (the
    port), so one group's window is closed on every partition, each holding exact partial state that
    merges like partials (sum, min, max; avg as sum and count). A window is final once every partition
    closed it.
    """
    rl = layout.rollup
    assert rl is not None
    parts = [w for w in parts if len(w)]
    if not parts:
        return Windows.empty(rl.kw, rl.na)
    keys, st = group_reduce(np.concatenate([np.column_stack([w.window, w.key]) for w in parts]),
                            np.concatenate([w.state for w in parts]), rl.ops)  # fmt: skip
    return Windows(keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st)


def finalize(layout: JoinLayout, state: np.ndarray) -> dict[str, np.ndarray]:
    """Rolled-up state columns -> the join's aggregates (avg = sum / count), vectorised."""
    out: dict[str, np.ndarray] = {}
    j = 0
    for fn, alias, _ in layout.aggs:
        if fn == "avg":
            c = state[:, j + 1]
            out[alias] = np.where(c > 0, state[:, j] / np.maximum(c, 1), np.nan)
            j += 2
        else:
            out[alias] = state[:, j]
            j += 1
    return out
