"""Roll-up: merge partial aggregates per (pane, key), assemble windows from panes, close by punctuation.

All operations are vectorised over numpy arrays (no per-record Python). The pane table holds exactly
one row per (pane, key) after every merge. Window ``w`` (a WID) covers panes ``[w-k+1, w]`` with
``k = panes_per_window``; it can be emitted once the low-water mark ``L`` satisfies ``w < L``. With
a range that is not a multiple of the slide (pane = gcd, ``s = slide/pane`` panes per slide), only
every s-th WID is a window: windows start at ``origin + n*slide``, i.e. ``(w - k + 1) % s == 0``.
After closing up to ``L`` only panes ``>= L-k+1`` are still needed, everything older is purged, so the
state is bounded by the open windows, not by the disorder between hosts (the OOP paper's point).

Group-wise punctuation (OOP App. A, :class:`contract.wire.GroupPunctuation`): a host may say "group g
is done up to pane t". The roll-up then emits g's windows ``< t`` at once (:meth:`QueryRollup.close_groups`)
and keeps a per-group frontier beside the global one: a group's windows are closed below the larger of
the two, a later partial below it is late (counted, a correction row), and the global close skips what
a group close emitted. A group frontier the global one passes is dropped, so that state is bounded by
the groups punctuated ahead of the low-water mark.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np

from contract import aggregates as A
from contract import query as Q
from contract import wire
from high_level.aggregate.groups import NO_FRONT, GroupFrontiers
from high_level.aggregate.merge import ERROR_ITEM, error_rows, group_reduce, key_codes, misra_gries  # noqa: F401
from high_level.codec import CodecError

I64 = np.int64
NOTHING_CLOSED = None  # closed frontier before the first close: no window is closed yet


@dataclass(frozen=True)
class Layout:
    """What the roll-up needs to know about a query (plain data, cheap to ship to Spark workers)."""

    name: str
    topic: str
    pane_ns: int
    k: int
    origin_ns: int
    range_ns: int
    ops: tuple[int, ...]
    kw: int
    s: int = 1  # panes per slide
    landmark: bool = False  # emit 'update' rows (totals so far) of the open window at every close
    sources: tuple[str, ...] = ("*",)  # host-id patterns of the hosts that run the query
    gw: int = 0  # group words before the holistic sub-key (used with top_capacity)
    top_capacity: int = 0  # top with capacity c: Misra-Gries bound of c items per (pane, group); 0: exact
    differential: bool = False  # sliding windows kept running: new panes in, expired panes out
    groups: bool = False  # group-wise punctuation closes a group's windows early (heartbeat.groups)
    strategy: str = (
        "lazy"  # window.strategy: lazy (this pane table), eager or adaptive (aggregate/adaptwid.py)
    )

    def runs_on(self, host: str) -> bool:
        return any(fnmatch.fnmatchcase(host, p) for p in self.sources)

    @classmethod
    def of(cls, q: Q.QuerySpec) -> Layout:
        w = q.window
        h = Q.holistic(q)
        cap = h.capacity if h is not None and h.fn == "top" and h.capacity is not None else 0
        return cls(
            q.name,
            q.topic,
            w.pane_ns,
            w.panes_per_window,
            w.origin_ns,
            w.range_ns,
            tuple(int(x) for x in Q.merge_ops(q)),
            Q.key_width(q),
            w.panes_per_slide,
            w.landmark,
            tuple(q.sources),
            Q.group_width(q),
            int(cap),
            Q.differential(q),
            q.heartbeat.groups,
            w.strategy,
        )

    def first_needed_pane(self, closed: int) -> int:
        """The first pane of the first window not emitted yet (every window < ``closed`` is): older
        panes belong only to emitted windows."""
        r = (self.k - 1) % self.s
        w = closed + (r - closed) % self.s  # smallest WID >= closed that is a window
        return w - self.k + 1

    @property
    def na(self) -> int:
        return len(self.ops)

    def needed(self, pane: np.ndarray, front: np.ndarray) -> np.ndarray:
        """bool[n]: pane rows still needed by a window not emitted yet, each row under its own frontier
        (:meth:`first_needed_pane` per row; a row with no frontier, ``NO_FRONT``, is needed)."""
        front = np.asarray(front, I64)
        none = front == NO_FRONT
        c = np.where(none, 0, front)
        r = (self.k - 1) % self.s
        first = c + (r - c) % self.s - self.k + 1
        return none | (np.asarray(pane, I64) >= first)

    def window_end_ns(self, w: np.ndarray) -> np.ndarray:
        return self.origin_ns + (np.asarray(w, I64) + 1) * self.pane_ns

    def window_start_ns(self, w: np.ndarray) -> np.ndarray:
        return self.window_end_ns(w) - self.range_ns


def touched_pairs(
    lay: Layout, closed: int | None, pane: np.ndarray, key: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (window, group) pairs that partial records ``(pane, key)`` touched among the windows not yet
    emitted (``closed``: the frontier), as (window ids, key rows); possibly repeated."""
    pane = np.asarray(pane, I64)
    if len(pane) == 0:
        return np.empty(0, I64), np.empty((0, lay.kw), I64)
    key = np.asarray(key, I64).reshape(len(pane), lay.kw)
    lo = int(pane.min()) if closed is None else closed
    idx, w = expand_windows(pane, lo, int(pane.max()) + lay.k, lay.k, lay.s)
    return w, key[idx]


def touched_windows(
    lay: Layout, pane: np.ndarray, key: np.ndarray, state: np.ndarray, w: np.ndarray, wkey: np.ndarray
) -> Windows:
    """The (window, group) pairs ``(w, wkey)`` assembled from pane rows that hold (at least) every row of
    those groups, in (window, group) order; for :meth:`QueryRollup.provisional` of either state layout.
    A hash collision in the caller's row selection only adds rows that are dropped here."""
    out = assemble(pane, key, state, int(w.min()), int(w.max()) + 1, lay.k, lay.ops, lay.s)
    keep = np.isin(
        wire.key_hash(np.column_stack([out.window, out.key])), wire.key_hash(np.column_stack([w, wkey]))
    )
    order = np.lexsort([*(out.key[:, j] for j in reversed(range(lay.kw))), out.window])  # by window, group
    o = order[keep[order]]
    return Windows(out.window[o], np.ascontiguousarray(out.key[o]), np.ascontiguousarray(out.state[o]))


def expand_windows(pane: np.ndarray, lo: int, hi: int, k: int, s: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """For pane rows, the (row index, window) pairs with window in ``[lo, hi)`` each pane belongs to.

    Pane p belongs to windows ``[p, p+k-1]`` that are windows at all (``(w-k+1) % s == 0``); rows
    outside every requested window are skipped.
    """
    if s == k and k > 1:  # non-overlapping (landmark): one window per pane, no expansion
        pane = np.asarray(pane, I64)
        w = pane + (k - 1 - pane % k)
        idx = np.flatnonzero((w >= lo) & (w < hi))
        return idx, w[idx]
    if s > 1:
        idx, w = expand_windows(pane, lo, hi, k)
        ok = (w - (k - 1)) % s == 0
        return idx[ok], w[ok]
    pane = np.asarray(pane, I64)
    if len(pane) == 0 or hi <= lo:
        return np.empty(0, I64), np.empty(0, I64)
    hi_m1 = hi - 1
    sel = np.flatnonzero((pane <= hi_m1) & (pane >= lo - (k - 1)))
    p = pane[sel]
    ws = np.maximum(p, lo)
    we = np.minimum(p + (k - 1), hi_m1)
    cnt = we - ws + 1
    if k == 1:
        return sel, ws
    idx = np.repeat(np.arange(len(p)), cnt)
    offs = np.arange(int(cnt.sum()), dtype=I64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return sel[idx], ws[idx] + offs


@dataclass
class Windows:
    """Closed windows (or corrections): one row per (window, key)."""

    window: np.ndarray  # int64[n]
    key: np.ndarray  # int64[n, kw]
    state: np.ndarray  # int64[n, na]

    def __len__(self) -> int:
        return int(self.window.shape[0])

    @classmethod
    def empty(cls, kw: int, na: int) -> Windows:
        return cls(np.empty(0, I64), np.empty((0, kw), I64), np.empty((0, na), I64))


def assemble(
    pane: np.ndarray,
    key: np.ndarray,
    state: np.ndarray,
    lo: int,
    hi: int,
    k: int,
    ops: tuple[int, ...],
    s: int = 1,
) -> Windows:
    """Windows ``[lo, hi)`` from a (pane, key)-unique table; sliding windows merge their k panes."""
    idx, w = expand_windows(pane, lo, hi, k, s)
    if k == 1:  # tumbling: a pane is a window, the table is already unique per (pane, key)
        return Windows(w, key[idx], state[idx])
    keys, st = group_reduce(np.column_stack([w, key[idx]]), state[idx], ops)
    return Windows(keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st)


def slide_windows(
    run: Windows,
    enter: tuple[np.ndarray, np.ndarray, np.ndarray],
    leave: tuple[np.ndarray, np.ndarray, np.ndarray],
    lo: int,
    hi: int,
    k: int,
    s: int = 1,
) -> tuple[Windows, Windows]:
    """Windows ``[lo, hi)`` kept running (differential aggregates, dissertation §6.2.2.2-3): every window
    is its group's previous window plus the panes that entered minus the panes that expired, so a pane
    row is read twice (in, out) whatever the number of panes per window, instead of once per window.

    ``run`` is, per key, the sum of panes ``[first_needed_pane(lo), lo)`` with one more column: the
    number of pane rows behind it (a group is in a window while that is positive, whatever its sums);
    ``enter`` the pane rows ``(pane, key, state)`` of ``[lo, hi)`` and ``leave`` those of
    ``[first_needed_pane(lo), first_needed_pane(hi))``. Returns the windows and the new ``run`` for
    ``hi``. Vectorised as a per-group running sum over (key, time)-sorted +/- events; every state merges
    by sum (exact on int64: the sums wrap modulo 2^64 and cancel exactly)."""
    kw = run.key.shape[1]
    ep, ek, es = enter
    lp, lk, ls = leave
    one = np.ones((len(ep), 1), I64)
    ev_t = np.concatenate([np.full(len(run), lo - 1, I64), np.asarray(ep, I64), np.asarray(lp, I64) + k])
    ev_k = np.concatenate([run.key, ek.reshape(-1, kw), lk.reshape(-1, kw)])
    ev_s = np.concatenate([run.state, np.hstack([es, one]), -np.hstack([ls, np.ones((len(lp), 1), I64)])])
    na = ev_s.shape[1] - 1
    if len(ev_t) == 0:
        return Windows.empty(kw, na), Windows.empty(kw, na + 1)
    codes = key_codes(ev_k)
    span = ev_t - ev_t.min()
    order = np.argsort(codes * (int(span.max()) + 1) + span, kind="stable")  # by key, then time
    t, key, d = ev_t[order], ev_k[order], ev_s[order]
    first = np.ones(len(t), bool)
    first[1:] = codes[order][1:] != codes[order][:-1]
    starts = np.flatnonzero(first)
    counts = np.diff(np.r_[starts, len(t)])
    cs = np.cumsum(d, axis=0)
    val = cs - np.repeat(cs[starts] - d[starts], counts, axis=0)  # per-key running sums
    # the new running sums: a key's total over every event (the panes in, those no open window needs out)
    last = np.r_[starts[1:] - 1, len(t) - 1]
    live = last[val[last, -1] > 0]
    new_run = Windows(np.zeros(len(live), I64), np.ascontiguousarray(key[live]), val[live])
    t_next = np.r_[t[1:], hi]
    t_next[last] = hi  # a key's last value holds to the end of the range
    a = np.maximum(t, lo)
    b = np.minimum(t_next, hi)
    r = (k - 1) % s
    w0 = a + (r - a) % s  # the first window id >= a (windows are the WIDs w with (w - r) % s == 0)
    n = np.where((b > w0) & (val[:, -1] > 0), (b - 1 - w0) // s + 1, 0)
    idx = np.repeat(np.arange(len(t)), n)
    offs = np.arange(int(n.sum()), dtype=I64) - np.repeat(np.cumsum(n) - n, n)
    w = w0[idx] + offs * s
    return Windows(w, np.ascontiguousarray(key[idx]), np.ascontiguousarray(val[idx, :na])), new_run


def running_sums(key: np.ndarray, state: np.ndarray, lay: Layout) -> Windows:
    """Pane rows summed per key, with their row count as one more column (:func:`slide_windows`' ``run``)."""
    st = np.column_stack([state, np.ones(len(key), I64)])
    keys, rs = group_reduce(
        key.reshape(-1, lay.kw), st.reshape(-1, lay.na + 1), (A.MERGE_SUM,) * (lay.na + 1)
    )
    return Windows(np.zeros(len(keys), I64), keys, rs)


@dataclass
class AddResult:
    """What happened to one batch of partials: how many were late, per host index, and per closed
    (window, key) they touch: the correction rows and how many late records each one folds."""

    late_per_host: np.ndarray  # int64[hosts]
    corrections: Windows | None = None  # the late contribution per closed (window, key)
    late_records: np.ndarray | None = None  # int64[len(corrections)]: late partial records per row


@dataclass
class QueryRollup:
    """One query's pane table on one partition plus its closed frontier (all windows < closed are out)."""

    layout: Layout
    pane: np.ndarray = field(default_factory=lambda: np.empty(0, I64))
    key: np.ndarray | None = None
    state: np.ndarray | None = None
    closed: int | None = NOTHING_CLOSED
    # differential layouts: per key, the sum of panes [first_needed_pane(closed), closed) and their row
    # count (see slide_windows); None: not known, summed from those panes at the next close
    run: Windows | None = None
    # group-wise punctuation: groups (their first gw key words) closed further than ``closed``, and how far
    groups: GroupFrontiers = field(
        init=False
    )  # group-wise punctuation: groups closed further than ``closed``
    pending_groups: list = field(init=False, default_factory=list)  # (key, done) offered, closed at close()
    group_rows: int = field(init=False, default=0)  # rows of the last close() closed by group punctuation

    def __post_init__(self) -> None:
        if self.key is None:
            self.key = np.empty((0, self.layout.kw), I64)
        if self.state is None:
            self.state = np.empty((0, self.layout.na), I64)
        self.groups = GroupFrontiers(self.layout.gw)

    def frontier(self, key: np.ndarray) -> np.ndarray:
        """int64[n]: per row of ``key``, every window below this is emitted (its group's frontier when a
        group punctuation took it past the global one; ``NO_FRONT``: nothing of it is closed)."""
        return self.groups.frontier(key, self.closed)

    def offer_groups(self, b: wire.GroupPunctuation, errors: dict[str, int]) -> None:
        """A group punctuation of this query: closed with the batch (:meth:`close`), or counted in ``errors``
        when the query does not take it (``heartbeat.groups``) or its key is not the query's group words."""
        why = None if self.layout.groups else "group_punctuation_ignored"
        why = why or (None if b.key.shape[1] == self.groups.key.shape[1] else "bad_layout")
        if why:
            errors[why] = errors.get(why, 0) + 1
        else:
            self.pending_groups.append((b.key, b.done_pane))

    def close_groups(self, key: np.ndarray, done: np.ndarray) -> Windows:
        """Group-wise punctuation: emit the windows ``< done[i]`` of group ``key[i]`` (its first gw words)
        not emitted yet, then purge that group's panes no open window needs. Other groups wait for the
        global low-water mark (:meth:`close`)."""
        lay, g = self.layout, self.groups
        done = np.minimum(np.asarray(done, I64).ravel(), wire.END_OF_STREAM - 2 * lay.k)
        gw = g.key.shape[1]
        gk, gd = group_reduce(
            np.asarray(key, I64).reshape(len(done), -1)[:, :gw], done[:, None], (A.MERGE_MAX,)
        )
        old = self.frontier(gk)
        adv = gd[:, 0] > old
        gk, gd, old = gk[adv], gd[adv, 0], old[adv]
        out = Windows.empty(lay.kw, lay.na)
        if len(gd) == 0:
            return out
        sel = np.isin(wire.key_hash(self.key[:, :gw]), wire.key_hash(gk))
        before = self.frontier(self.key[sel])
        g.advance(gk, gd)
        if sel.any():
            p, k, st = self.pane[sel], self.key[sel], self.state[sel]
            after = self.frontier(k)
            w = assemble(p, k, st, int(np.maximum(before, p).min()), int(after.max()), lay.k, lay.ops, lay.s)
            # each window between its group's old and new frontier (a hash collision only adds rows of
            # groups whose frontier did not move: fb == fa, none of their windows)
            new = GroupFrontiers(gw)
            new.advance(gk, old)
            pos, fa = new.find(w.key), self.frontier(w.key)
            fb = np.where(pos >= 0, old[np.maximum(pos, 0)], fa)
            ok = (w.window >= fb) & (w.window < fa)
            out = Windows(w.window[ok], np.ascontiguousarray(w.key[ok]), np.ascontiguousarray(w.state[ok]))
            keep = lay.needed(self.pane, self.frontier(self.key))
            if not keep.all():
                self.pane, self.key, self.state = self.pane[keep], self.key[keep], self.state[keep]
        self.forget_run()
        return out

    def __len__(self) -> int:
        return int(self.pane.shape[0])

    def add(
        self,
        pane: np.ndarray,
        key: np.ndarray,
        state: np.ndarray,
        host_idx: np.ndarray | None = None,
        n_hosts: int = 1,
    ) -> AddResult:
        """Merge partial records into the pane table.

        A record with ``pane < closed`` touches a window already emitted: it is late (counted per
        host). Its contribution to still-open windows (sliding) is kept. Its contribution to closed
        windows is always returned per (window, key) with the number of late records in it (so the
        caller can mark exactly those rows incomplete, or store them as correction rows); an
        emitted window itself never changes.
        """
        lay = self.layout
        pane = np.asarray(pane, I64)
        key = np.asarray(key, I64).reshape(len(pane), lay.kw)
        state = np.asarray(state, I64).reshape(len(pane), lay.na)
        hidx = np.zeros(len(pane), I64) if host_idx is None else np.asarray(host_idx, I64)
        late_per_host = np.zeros(n_hosts, I64)
        corr, n_late = None, None
        grouped = len(self.groups) > 0
        if (self.closed is not None or grouped) and len(pane):
            front = self.frontier(key) if grouped else np.full(len(pane), self.closed, I64)
            late = pane < front
            if late.any():
                late_per_host = np.bincount(hidx[late], minlength=n_hosts).astype(I64)
                # one extra summed column counts the late records behind each (window, key)
                ops = (*lay.ops, Q.MERGE_SUM)
                st1 = np.column_stack([state[late], np.ones(int(late.sum()), I64)])
                keys, lst = group_reduce(np.column_stack([pane[late], key[late]]), st1, ops)
                lp, lk = keys[:, 0], keys[:, 1:]
                both = assemble(lp, lk, lst, int(lp.min()), int(front[late].max()), lay.k, ops, lay.s)
                if grouped:  # only the windows each group had emitted (its own frontier)
                    ok = both.window < self.frontier(both.key)
                    both = Windows(both.window[ok], both.key[ok], both.state[ok])
                corr = Windows(both.window, both.key, np.ascontiguousarray(both.state[:, :-1]))
                n_late = np.ascontiguousarray(both.state[:, -1])
                keep = lay.needed(pane, front)  # still needed by an open window
                pane, key, state, front = pane[keep], key[keep], state[keep], front[keep]
                if len(pane) and (pane < front).any():
                    self.forget_run()  # a kept late pane row below the frontier: the running sums are stale
        if len(pane):
            self.merge(pane, key, state)
        return AddResult(late_per_host, corr, n_late)

    def merge(self, pane: np.ndarray, key: np.ndarray, state: np.ndarray) -> None:
        """Fold partial records of open windows into the pane table (one row per (pane, key) after)."""
        lay = self.layout
        if len(pane):
            keys, st = group_reduce(
                np.column_stack([np.concatenate([self.pane, pane]), np.concatenate([self.key, key])]),
                np.concatenate([self.state, state]),
                lay.ops,
            )
            self.pane, self.key, self.state = keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st
            if lay.top_capacity:
                self.pane, self.key, self.state = misra_gries(
                    self.pane, self.key, self.state, lay.gw, lay.top_capacity, lay.ops
                )

    def close(self, lwm: int | None, through_pane: int | None = None) -> Windows:
        """The group punctuation offered since the last close first (its windows: the first
        ``group_rows`` rows, complete by the host's promise), then :meth:`close_global`."""
        out = Windows.empty(self.layout.kw, self.layout.na)
        if self.pending_groups:
            keys, done = zip(*self.pending_groups, strict=True)
            self.pending_groups = []
            out = self.close_groups(np.concatenate(keys), np.concatenate(done))
        self.group_rows = len(out)
        rest = self.close_global(lwm, through_pane)
        if not len(out):
            return rest
        return Windows(
            np.r_[out.window, rest.window], np.vstack([out.key, rest.key]), np.vstack([out.state, rest.state])
        )

    def close_global(self, lwm: int | None, through_pane: int | None = None) -> Windows:
        """Emit every window ``w < lwm`` not emitted before, then purge panes no open window needs.

        An end-of-stream mark (every live host finished a finite capture) closes every window that
        holds data, or holds ``through_pane`` (the newest pane a host shed: its windows must close to
        be flagged, rows or not), and moves the frontier no further than that: a later run of the same
        hosts (a generator after a pcap replay, say) sends data for later windows, which must not be late.
        """
        lay = self.layout
        if lwm is not None and lwm >= wire.END_OF_STREAM:
            tops = [int(self.pane.max())] if len(self.pane) else []
            tops += [through_pane] if through_pane is not None else []
            lwm = max(tops) + lay.k if tops else None
        if lwm is None or (self.closed is not None and lwm <= self.closed):
            return Windows.empty(lay.kw, lay.na)
        if len(self.pane) == 0:
            self.closed = int(lwm)
            self.groups.drop_reached(self.closed)
            self.forget_run()
            return Windows.empty(lay.kw, lay.na)
        lo = int(self.pane.min()) if self.closed is None else self.closed
        grouped = len(self.groups) > 0
        if lay.differential and not grouped:
            out = self._slide(lo, int(lwm))
        else:
            out = assemble(self.pane, self.key, self.state, lo, int(lwm), lay.k, lay.ops, lay.s)
        if grouped:  # windows a group punctuation emitted already
            ok = out.window >= self.frontier(out.key)
            out = Windows(
                out.window[ok], np.ascontiguousarray(out.key[ok]), np.ascontiguousarray(out.state[ok])
            )
            self.forget_run()
        self.closed = int(lwm)
        self.groups.drop_reached(self.closed)
        keep = lay.needed(self.pane, self.frontier(self.key))
        if not keep.all():
            self.pane, self.key, self.state = self.pane[keep], self.key[keep], self.state[keep]
        if lay.s == lay.k > 1 and len(np.unique(self.pane[self.pane < self.closed])) > 1:
            # non-overlapping windows (landmark): the open window's closed panes are only ever needed
            # as a total, so they fold into one row per key (state: one day's groups, not x1440 panes)
            pane = np.where(self.pane < self.closed, self.closed - 1, self.pane)
            keys, st = group_reduce(np.column_stack([pane, self.key]), self.state, lay.ops)
            self.pane, self.key, self.state = keys[:, 0].copy(), np.ascontiguousarray(keys[:, 1:]), st
            if lay.top_capacity:  # merged summaries: bound the folded pane again
                self.pane, self.key, self.state = misra_gries(
                    self.pane, self.key, self.state, lay.gw, lay.top_capacity, lay.ops
                )
        return out

    def _slide(self, lo: int, hi: int) -> Windows:
        """Windows ``[lo, hi)`` of a differential layout from the running sums (:func:`slide_windows`)."""
        lay, p = self.layout, self.pane
        f0, f1 = lay.first_needed_pane(lo), lay.first_needed_pane(hi)
        run = self.run
        if run is None:
            sel = (p >= f0) & (p < lo)
            run = running_sums(self.key[sel], self.state[sel], lay)
        ent, lv = (p >= lo) & (p < hi), (p >= f0) & (p < f1)
        out, self.run = slide_windows(
            run,
            (p[ent], self.key[ent], self.state[ent]),
            (p[lv], self.key[lv], self.state[lv]),
            lo,
            hi,
            lay.k,
            lay.s,
        )
        return out

    def forget_run(self) -> None:
        """Drop the running sums (they are summed again from the panes at the next close)."""
        self.run = None

    def run_arrays(self, name: str) -> dict[str, np.ndarray]:
        """The running sums as arrays for the processor's saved state ({} when there are none)."""
        if self.run is None:
            return {}
        return {f"{name}/run_key": self.run.key, f"{name}/run_state": self.run.state}

    def load_run(self, arrays: dict[str, np.ndarray], name: str) -> None:
        """Restore :meth:`run_arrays` (a state saved without them sums them again at the next close)."""
        lay, key, state = self.layout, arrays.get(f"{name}/run_key"), arrays.get(f"{name}/run_state")
        if len(arrays.get(f"{name}/eager_window", ())):  # saved by window.strategy eager/adaptive
            raise CodecError(f"query {lay.name!r} holds eager window aggregates: keep its window.strategy")
        ok = key is not None and state is not None and lay.differential
        if ok and key.shape[1:] == (lay.kw,) and state.shape[1:] == (lay.na + 1,):
            self.run = Windows(np.zeros(len(key), I64), key, state)
        else:
            self.run = None

    def group_arrays(self, name: str) -> dict[str, np.ndarray]:
        """The group frontiers as arrays for the processor's saved state ({} when there are none)."""
        return self.groups.arrays(name)

    def load_groups(self, arrays: dict[str, np.ndarray], name: str) -> None:
        """Restore :meth:`group_arrays`."""
        self.groups.load(arrays, name)
        self.groups.drop_reached(self.closed)

    def landmark_update(self) -> Windows:
        """'update' rows of a landmark query: per group, the totals so far of the open window holding
        the newest closed pane (panes ``< closed``), or nothing when that window is closed. Provisional:
        a late partial of those panes still reaches the final row."""
        lay = self.layout
        if self.closed is None or len(self.pane) == 0:
            return Windows.empty(lay.kw, lay.na)
        last = self.closed - 1
        w = last + (lay.k - 1 - last % lay.k)
        sel = (self.pane <= last) & (self.pane >= w - lay.k + 1)
        if w < self.closed or not sel.any():
            return Windows.empty(lay.kw, lay.na)
        keys, st = group_reduce(self.key[sel], self.state[sel], lay.ops)
        return Windows(np.full(len(keys), w, I64), keys, st)

    def provisional(self, pane: np.ndarray, key: np.ndarray) -> Windows:
        """The current value of every open (not emitted) window and group that the partial records
        ``(pane, key)`` touched: provisional, a later partial or a host behind the mark still changes it.

        Call after :meth:`add` and :meth:`close` of the batch; cost is the touched groups' panes, not
        the whole table (a 64-bit hash selects the touched groups and (window, group) pairs: a collision
        only adds an unchanged row, never loses one).
        """
        lay = self.layout
        w, wkey = touched_pairs(lay, self.closed, pane, key)
        if len(w) == 0 or len(self.pane) == 0:
            return Windows.empty(lay.kw, lay.na)
        if len(self.groups):  # a group punctuation closed some of them already
            ok = w >= self.frontier(wkey)
            w, wkey = w[ok], wkey[ok]
            if len(w) == 0:
                return Windows.empty(lay.kw, lay.na)
        sel = np.isin(wire.key_hash(self.key), wire.key_hash(wkey))
        return touched_windows(lay, self.pane[sel], self.key[sel], self.state[sel], w, wkey)

    def panes(self) -> np.ndarray:
        """The distinct panes held, ascending."""
        return np.unique(self.pane)

    def open_windows(self) -> int:
        """Windows that hold data and are not emitted yet."""
        u = self.panes()
        if len(u) == 0:
            return 0
        lo = u if self.closed is None else np.maximum(u, self.closed)
        hi = u + self.layout.k  # exclusive
        # union of the intervals [lo, hi) over sorted u
        starts = np.maximum(lo, np.r_[np.iinfo(I64).min, np.maximum.accumulate(hi)[:-1]])
        ends = np.maximum(hi, starts)
        s, r = self.layout.s, (self.layout.k - 1) % self.layout.s
        # windows in [starts, ends) whose WID w has (w - r) % s == 0
        return int(((ends - 1 - r) // s - (starts - 1 - r) // s).sum())
