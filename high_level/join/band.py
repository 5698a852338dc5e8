"""The order-agnostic band join (OOP paper section 5.3, OA-Join) of two select queries, closed by punctuation.

Semantics (``contract.query.JoinSpec``): a left row ``l`` and a right row ``r`` match when their ``on``
words are equal and ``lo <= r.ts - l.ts <= hi`` (``within: w`` is [0, w], directional: the SYN-ACK follows
its SYN; ``band: [lo, hi]`` the paper's RANGE0/RANGE1), or, for ``within: window`` between two selects,
when both fall in the same tumbling window (OOP Q6/Q8). ``inner``
emits every matching pair, ``left`` the pairs and, once final, every left row without a match,
``anti`` only those. Every output row carries both timestamps: a downstream aggregation puts it in the
left row's window, or (inner joins, ``window_on: right``) the right row's.

Algorithm, per Kafka partition, vectorised per micro-batch (numpy: hash, sort, searchsorted; no
Python per row):

* Each input's low-water mark ``b_left`` / ``b_right`` is the min over its live hosts' punctuation
  (:class:`high_level.aggregate.meld.Meld`, as the aggregate queries; host timeout and expected hosts alike),
  never decreasing. A row below its own input's mark on arrival is late: counted, never joined
  (the other side may already have purged its partners or emitted it as unmatched).
* New rows probe the other side's stored rows (and the batch's new rows of the other side), in any
  order: the pairs found are the same whatever the arrival order.
* Purge: a left row can meet only right rows with ``r.ts <= l.ts + hi`` (:meth:`JoinLayout.left_reach`;
  a window join: the window's end); once ``b_right`` passes that none can still come, so it leaves the
  state, and at that moment, never earlier and never by wall clock, it is emitted as unmatched (left/anti
  join) if it met none. A right row can meet only left rows with ``l.ts <= r.ts - lo`` (or its window's
  end): it leaves once ``b_left`` passes that. So each input's state is bounded by the *other* input's
  mark (plus the band), not by the skew.
* Output punctuation is joint (OOP section 7, query Q3): a pair (left ts, right ts) of bounds below which
  no more output comes for either timestamp (:func:`joint_marks`). Every future output row comes from a
  future left row (``ts >= b_left``) or a stored one, so the left component is at least
  ``min(b_left, oldest stored left row)`` (the individual punctuation, itself at least the seed's
  ``min(b_left, b_right - band)``); the right one, symmetrically, ``min(b_right, oldest stored right row)``.
  The aggregation over the output (:class:`QueryRollup`, the same roll-up as aggregate queries) windows
  on the left timestamp, or on the right one (``window_on: right``), and closes its windows by the
  matching component: on the right timestamp that closes a band earlier than the left component carried
  over by the band would when the right input lags (``tests/test_join_joint.py`` measures it).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import aggregates as A
from contract import wire
from high_level import codec
from high_level.aggregate.meld import Meld
from high_level.aggregate.rollup import QueryRollup, Windows, group_reduce
from high_level.join.layout import JoinLayout

I64 = np.int64
SIDES = ("left", "right")


U64 = np.uint64


@dataclass
class Side:
    """Rows of one input: timestamps, the select's words, (left) whether a match was found, and the hash of
    the join key words. A stored side is kept sorted by that hash: new rows probe it with one
    ``searchsorted`` (needles sorted too, so the search walks memory forward) and nothing is re-hashed
    or re-sorted per step; new rows are merged in by position (one copy)."""

    ts: np.ndarray
    cols: np.ndarray
    matched: np.ndarray
    h: np.ndarray

    @classmethod
    def empty(cls, w: int) -> Side:
        return cls(np.empty(0, I64), np.empty((0, w), I64), np.empty(0, bool), np.empty(0, U64))

    @classmethod
    def of(
        cls, ts: np.ndarray, cols: np.ndarray, words: tuple[int, ...], matched: np.ndarray | None = None
    ) -> Side:
        """Rows with their key hash, sorted by it."""
        h = wire.key_hash(_key(ts, cols, words, slice(None)))
        order = np.argsort(h)
        m = np.zeros(len(ts), bool) if matched is None else matched[order]
        return cls(ts[order], cols[order], m, h[order])

    @classmethod
    def gather(cls, parts: list[tuple[np.ndarray, np.ndarray]], w: int, words: tuple[int, ...]) -> Side:
        """One hashed, sorted side from a batch's row blocks, in one copy (pairwise would be quadratic)."""
        if not parts:
            return cls.empty(w)
        ts = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        cols = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        return cls.of(ts, cols, words)

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.ts.nbytes + self.cols.nbytes + self.matched.nbytes + self.h.nbytes)

    def take(self, idx: np.ndarray) -> Side:
        return Side(self.ts[idx], self.cols[idx], self.matched[idx], self.h[idx])

    def merge(self, other: Side) -> Side:
        """Both sorted by hash -> one sorted side (``other`` inserted by position: one copy of each)."""
        if not len(other):
            return self
        if not len(self):
            return other
        pos = np.searchsorted(self.h, other.h, "right")
        return Side(
            np.insert(self.ts, pos, other.ts),
            np.insert(self.cols, pos, other.cols, axis=0),
            np.insert(self.matched, pos, other.matched),
            np.insert(self.h, pos, other.h),
        )


def _key(ts: np.ndarray, cols: np.ndarray, words: tuple[int, ...], idx: np.ndarray | slice) -> np.ndarray:
    """int64[n, len(words)]: the key words of rows ``idx`` (-1 = the timestamp)."""
    n = len(ts[idx])
    if not words:
        return np.zeros((n, 1), I64)
    return np.column_stack([ts[idx] if w < 0 else cols[idx, w] for w in words]).reshape(n, len(words))


def key_words(side: Side, words: tuple[int, ...]) -> np.ndarray:
    """int64[n, len(words)]: the rows' key words (-1 = the timestamp)."""
    return _key(side.ts, side.cols, words, slice(None))


def _equal_hash(nh: np.ndarray, hh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with nh[i] == hh[j]; ``hh`` sorted (``nh`` sorted too for a forward-walking search)."""
    lo = np.searchsorted(hh, nh, "left")
    cnt = np.searchsorted(hh, nh, "right") - lo
    total = int(cnt.sum())
    if total == 0:
        return np.empty(0, I64), np.empty(0, I64)
    ni = np.repeat(np.arange(len(nh), dtype=I64), cnt)
    hi = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(total, dtype=I64)
    return ni, hi


def probe(lay: JoinLayout, left: Side, right: Side, left_is_needle: bool) -> tuple[np.ndarray, np.ndarray]:
    """Every matching (left index, right index) of two hash-sorted sides: equal hash, then the band,
    then every key word (a hash collision never joins)."""
    if not len(left) or not len(right):
        return np.empty(0, I64), np.empty(0, I64)
    if left_is_needle:
        li, ri = _equal_hash(left.h, right.h)
    else:
        ri, li = _equal_hash(right.h, left.h)
    ok = lay.matches(left.ts[li], right.ts[ri])
    li, ri = li[ok], ri[ok]
    same = (_key(left.ts, left.cols, lay.lkey, li) == _key(right.ts, right.cols, lay.rkey, ri)).all(axis=1)
    return li[same], ri[same]


def match_pairs(
    lk: np.ndarray, lts: np.ndarray, rk: np.ndarray, rts: np.ndarray, band: int
) -> tuple[np.ndarray, ...]:
    """Every (i, j) with lk[i] == rk[j] (all words) and 0 <= rts[j] - lts[i] <= band, vectorised (hash,
    sort, ``searchsorted``, then check band and words); indices into the arrays as given."""
    if not len(lk) or not len(rk):
        return np.empty(0, I64), np.empty(0, I64)
    lk, rk = np.asarray(lk, I64).reshape(len(lk), -1), np.asarray(rk, I64).reshape(len(rk), -1)
    lo, ro = np.argsort(wire.key_hash(lk), kind="stable"), np.argsort(wire.key_hash(rk), kind="stable")
    words = tuple(range(lk.shape[1]))
    lay = JoinLayout("", "", "", "", "", band, "inner", words, words, lk.shape[1], rk.shape[1])
    left = Side(np.asarray(lts, I64)[lo], lk[lo], np.zeros(len(lo), bool), wire.key_hash(lk[lo]))
    right = Side(np.asarray(rts, I64)[ro], rk[ro], np.zeros(len(ro), bool), wire.key_hash(rk[ro]))
    li, ri = probe(lay, left, right, True)
    return lo[li], ro[ri]


def joint_marks(
    lay: JoinLayout, bl: int | None, br: int | None, L: Side, R: Side
) -> tuple[int | None, int | None]:
    """The joint output punctuation (OOP section 7): a pair (ml, mr) such that no future output row has a
    left timestamp below ml, nor a right timestamp below mr (None: unknown yet).

    A future pair takes a future left row (``>= bl``) or a stored one, so its left ts is ``>= min(bl, oldest
    stored left)``; it takes a future right row (``>= br``) or a stored one, so its right ts is ``>= min(br,
    oldest stored right)``. Each bound also follows from the other through the band (a left ts ``>= ml``
    pairs only with a right ts ``>= ml + lo``), so each component is the larger of the two: the right one
    needs no band-wide wait for the left input's rows to leave the state, which individual punctuation
    (the left component carried over by the band) does. The second derivation holds for pairs only: a
    left/anti join's unmatched rows keep the left component as is."""
    ml = individual_mark(bl, L)
    mr = None if br is None else min(br, int(R.ts.min())) if len(R) else br
    jl = ml
    if lay.type == "inner" and mr is not None and ml is not None:
        jl = max(ml, lay.left_floor(mr))
    jr = mr if ml is None else lay.right_floor(ml) if mr is None else max(mr, lay.right_floor(ml))
    return jl, jr


def individual_mark(bl: int | None, L: Side) -> int | None:
    """The join's individual output punctuation on the left timestamp: ``min(b_left, oldest stored left)``."""
    return None if bl is None else min(bl, int(L.ts.min())) if len(L) else bl


def individual_right_mark(lay: JoinLayout, ml: int | None) -> int | None:
    """The right-timestamp bound that individual punctuation alone (the join's left output mark, carried
    over by the band) gives an aggregation on the right timestamp: what joint punctuation improves on."""
    return None if ml is None else lay.right_floor(ml)


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
    joint: tuple[int | None, int | None] = (None, None)  # the joint punctuation (left ts, right ts)

    @property
    def pairs(self) -> int:
        return int(self.l_ts.shape[0])


class BandJoin:
    """One join query's state on one Kafka partition (a pure, serialisable object)."""

    def __init__(
        self,
        layout: JoinLayout,
        host_timeout_ms: int,
        expected_hosts: tuple[str, ...] = (),
        max_gap_ms: int | None = None,
    ) -> None:
        self.layout = layout
        self.melds = {s: Meld(host_timeout_ms, expected_hosts, max_gap_ms) for s in SIDES}
        self.b: dict[str, int | None] = {"left": None, "right": None}
        self.store = {"left": Side.empty(layout.lw), "right": Side.empty(layout.rw)}
        self.late = {"left": 0, "right": 0}
        self.rollup = QueryRollup(layout.rollup) if layout.rollup is not None else None
        self.mark_ns: int | None = None  # the output mark on the timestamp the windows are on (window_on)
        self.joint: tuple[int | None, int | None] = (None, None)
        self._new: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in SIDES}
        # what an input lost on the way, learned since the last take_losses(): [first ns, last ns, rows,
        # host, cause] (shed by the host's outbox, lost before Kafka, a sequence gap, late at the job)
        self.losses: list[list[Any]] = []
        # "side|host" -> [incarnation, rows received, missing rows known, last mark ns]: sequence gaps
        self.recv: dict[str, list[Any]] = {}
        self.check_seq = {s: True for s in SIDES}  # False for a closed-window feed (its seq is a batch id)

    # -- input -------------------------------------------------------------------------------------
    def add(self, side: str, ts: np.ndarray, cols: np.ndarray) -> None:
        """Rows of one input (any order, any host); late rows (below the input's mark) are counted, dropped."""
        ts = np.asarray(ts, I64)
        cols = np.asarray(cols, I64).reshape(len(ts), -1)
        b = self.b[side]
        if b is not None:
            ok = ts >= b
            if not ok.all():
                self.late[side] += int((~ok).sum())
                lt = ts[~ok]
                self.losses.append([int(lt.min()), int(lt.max()), int((~ok).sum()), "", "job_late"])
            ts, cols = ts[ok], cols[ok]
        if len(ts):
            self._new[side].append((ts, cols))

    def observe(
        self, side: str, host: str, incarnation: int, mark_ns: int, sent_wall_ns: int, now_ms: int
    ) -> None:
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
                self._count(side, b.host, b.incarnation, b.n)
                self.add(side, b.ts, b.cols)
            elif isinstance(b, wire.Punctuation):
                self._punctuated(side, b)
                self.observe(side, b.host, b.incarnation, b.mark_ns, b.sent_wall_ns, now_ms)
                if b.stats.get("workers", 0) > 0:
                    self.melds[side].workers_of(b.host, int(b.stats["workers"]))
        return self.step()

    def _count(self, side: str, host: str, incarnation: int, n: int) -> list[Any]:
        r = self.recv.get(f"{side}|{host}")
        if r is None or r[0] != incarnation:
            r = self.recv[f"{side}|{host}"] = [int(incarnation), 0, 0, None]
        r[1] += int(n)
        return r

    def _punctuated(self, side: str, p: wire.Punctuation) -> None:
        """Learn an input's losses from its punctuation: shed rows and rows lost before Kafka (their time
        ranges), and rows sent (``seq``) that never arrived, between the host's previous mark and this."""
        for lo, hi, n in p.shed:
            self.losses.append([int(lo), int(hi), int(n), p.host, "shed"])
        for lo, hi, cause, n in p.losses:
            if cause != "malformed":
                self.losses.append([int(lo), int(hi), int(n), p.host, cause])
        r = self._count(side, p.host, p.incarnation, 0)
        if self.check_seq[side]:
            missing = int(p.seq) - r[1]
            shed = sum(int(x[2]) for x in p.shed)
            if missing > r[2] + shed:
                lo = r[3] if r[3] is not None else -(2**62)
                hi = p.mark_ns if p.sent_upto is None else max(p.sent_upto, lo)  # newest row sent: a bound
                self.losses.append([int(lo), int(hi), missing - r[2] - shed, p.host, "gap"])
            r[2] = max(missing, 0)
        r[3] = int(p.mark_ns)

    def take_losses(self) -> list[list[Any]]:
        """The losses learned since the last call (the join processor charges them to output windows)."""
        out, self.losses = self.losses, []
        return out

    # -- the join ----------------------------------------------------------------------------------
    def step(self) -> JoinOutput:
        """Join what arrived since the last step, apply the marks, emit what became final, purge."""
        lay = self.layout
        nl = Side.gather(self._new["left"], lay.lw, lay.lkey)
        nr = Side.gather(self._new["right"], lay.rw, lay.rkey)
        self._new = {s: [] for s in SIDES}
        L, R = self.store["left"], self.store["right"]
        # new left x stored right, new left x new right, stored left x new right: the stored side is the
        # one searched (sorted), the batch's rows are the needles
        li1, ri1 = probe(lay, nl, R, True)
        li2, ri2 = probe(lay, nl, nr, True)
        li3, ri3 = probe(lay, L, nr, False)
        nl.matched[li1] = True
        nl.matched[li2] = True
        L.matched[li3] = True
        pl_ts = np.concatenate([nl.ts[li1], nl.ts[li2], L.ts[li3]])
        pl_cols = np.concatenate([nl.cols[li1], nl.cols[li2], L.cols[li3]])
        pr_ts = np.concatenate([R.ts[ri1], nr.ts[ri2], nr.ts[ri3]])
        pr_cols = np.concatenate([R.cols[ri1], nr.cols[ri2], nr.cols[ri3]])
        # marks (never decreasing), then what became final
        for s in SIDES:
            lwm = self.melds[s].low_water_mark()
            if lwm is not None and (self.b[s] is None or lwm > self.b[s]):
                self.b[s] = int(lwm)
        u_ts, u_cols = np.empty(0, I64), np.empty((0, lay.lw), I64)
        br, bl = self.b["right"], self.b["left"]
        if br is not None:  # a left row is final once the right mark passes its band end
            parts = []
            for side in (L, nl):
                done = lay.left_reach(side.ts) < br if br < wire.END_OF_STREAM else np.ones(len(side), bool)
                parts.append((side.take(done & ~side.matched), side.take(~done)))
            u_ts = np.concatenate([parts[0][0].ts, parts[1][0].ts])
            u_cols = np.concatenate([parts[0][0].cols, parts[1][0].cols])
            L, nl = parts[0][1], parts[1][1]
        if bl is not None:  # a right row can meet no left row once the left mark passes it
            if bl >= wire.END_OF_STREAM:
                R, nr = Side.empty(lay.rw), Side.empty(lay.rw)
            else:
                R, nr = R.take(lay.right_reach(R.ts) >= bl), nr.take(lay.right_reach(nr.ts) >= bl)
        L, R = L.merge(nl), R.merge(nr)
        self.store["left"], self.store["right"] = L, R
        self.joint = joint_marks(lay, bl, br, L, R)
        self.mark_ns = self.joint[0] if lay.window_on == "left" else self.joint[1]
        if lay.type == "anti":
            pl_ts, pl_cols = pl_ts[:0], pl_cols[:0]
            pr_ts, pr_cols = pr_ts[:0], pr_cols[:0]
        if lay.type == "inner":
            u_ts, u_cols = u_ts[:0], u_cols[:0]
        out = JoinOutput(
            pl_ts, pl_cols, pr_ts, pr_cols, u_ts, u_cols, None, self.mark_ns, dict(self.late), self.joint
        )
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
        lwm = (
            wire.END_OF_STREAM
            if self.mark_ns >= wire.END_OF_STREAM
            else (self.mark_ns - rl.origin_ns) // rl.pane_ns
        )
        out.windows = self.rollup.close(lwm)

    # -- observability and persistence -------------------------------------------------------------
    @property
    def state_rows(self) -> int:
        return len(self.store["left"]) + len(self.store["right"])

    @property
    def state_bytes(self) -> int:
        return self.store["left"].nbytes + self.store["right"].nbytes

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The state as a JSON-able header and plain int64/uint64/bool arrays (no pickle)."""
        head = {
            "b": self.b,
            "late": self.late,
            "mark_ns": self.mark_ns,
            "melds": {s: m.to_dict() for s, m in self.melds.items()},
            "recv": self.recv,
            "closed": None if self.rollup is None else self.rollup.closed,
        }
        arrays: dict[str, np.ndarray] = {}
        for s in SIDES:
            st = self.store[s]
            arrays |= {f"{s}_ts": st.ts, f"{s}_cols": st.cols, f"{s}_matched": st.matched, f"{s}_h": st.h}
        if self.rollup is not None:
            arrays |= {"r_pane": self.rollup.pane, "r_key": self.rollup.key, "r_state": self.rollup.state}
        return head, arrays

    def to_bytes(self) -> bytes:
        """:mod:`high_level.codec` bytes (raw buffers: the job saves the state every micro-batch, a zip costs)."""
        return codec.pack(*self.state())

    @classmethod
    def from_state(
        cls,
        head: dict[str, Any],
        z: Mapping[str, np.ndarray],
        layout: JoinLayout,
        host_timeout_ms: int,
        expected_hosts: tuple[str, ...] = (),
        max_gap_ms: int | None = None,
    ) -> BandJoin:
        j = cls(layout, host_timeout_ms, expected_hosts, max_gap_ms)
        for s in SIDES:
            if f"{s}_h" in z:  # stored sorted by hash
                j.store[s] = Side(z[f"{s}_ts"], z[f"{s}_cols"], z[f"{s}_matched"], z[f"{s}_h"])
            else:  # saved before the hash was kept: hash and sort once
                j.store[s] = Side.of(
                    z[f"{s}_ts"],
                    z[f"{s}_cols"],
                    layout.lkey if s == "left" else layout.rkey,
                    z[f"{s}_matched"],
                )
        if j.rollup is not None:
            j.rollup.pane, j.rollup.key, j.rollup.state = z["r_pane"], z["r_key"], z["r_state"]
            j.rollup.closed = head["closed"]
        j.b, j.late, j.mark_ns = head["b"], head["late"], head["mark_ns"]
        j.recv = {k: list(v) for k, v in head.get("recv", {}).items()}
        for s in SIDES:
            j.melds[s].load_dict(head["melds"][s])
        return j

    @classmethod
    def from_bytes(
        cls,
        buf: bytes,
        layout: JoinLayout,
        host_timeout_ms: int,
        expected_hosts: tuple[str, ...] = (),
        max_gap_ms: int | None = None,
    ) -> BandJoin:
        head, arrays = unpack_state(buf)
        return cls.from_state(head, arrays, layout, host_timeout_ms, expected_hosts, max_gap_ms)


def unpack_state(buf: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Codec bytes, or the .npz (JSON header in array ``head``) that earlier builds saved."""
    if bytes(buf[:2]) != b"PK":
        return codec.unpack(buf)
    with np.load(io.BytesIO(buf), allow_pickle=False) as z:
        return json.loads(bytes(z["head"]).decode()), {k: z[k] for k in z.files if k != "head"}


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
            t, c = (
                (out.u_ts, out.u_cols)
                if unmatched
                else (out.l_ts, out.l_cols)
                if side == "left"
                else (out.r_ts, out.r_cols)
            )
            return np.column_stack([t if w < 0 else c[:, w] for w in words]).reshape(n, len(words))

        key = (
            np.concatenate([vals(side, ws) for side, ws in layout.group], axis=1)
            if layout.group
            else np.zeros((n, 1), I64)
        )
        state = []
        for fn, _, terms in layout.aggs:
            v = np.zeros(n, I64)
            for sign, side, ws in terms:
                v = v + sign * vals(side, ws)[:, 0]
            state += [A.lift(p, v) for p in A.REGISTRY[fn].parts()]
        wts = out.r_ts if layout.window_on == "right" and not unmatched else ts
        res.append(
            (
                (wts - rl.origin_ns) // rl.pane_ns,
                key.reshape(n, rl.kw),
                np.column_stack(state).reshape(n, rl.na),
            )
        )
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
    keys, st = group_reduce(
        np.concatenate([np.column_stack([w.window, w.key]) for w in parts]),
        np.concatenate([w.state for w in parts]),
        rl.ops,
    )
    return Windows(keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st)


def finalize(layout: JoinLayout, state: np.ndarray) -> dict[str, np.ndarray]:
    """Rolled-up state columns -> the join's aggregates (contract.aggregates), vectorised."""
    return A.finalize([(fn, alias) for fn, alias, _ in layout.aggs], state)
