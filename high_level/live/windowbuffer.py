"""UpStream's window buffers (the seed's §5.3): which sliding window of one update key a slow query
commits to at a scheduling point, so that every delivered result is a whole window ("all or nothing")
and a window once started is finished ("no undo").

One buffer per update key. Tuples of the key arrive in timestamp order (integers; tuple-based windows:
consecutive per-key sequence numbers, as in the seed's traces); windows are ``[a, a + w - 1]`` with
``a = origin + k*s``. The buffer holds the tuples only as long as a window it may still deliver needs them,
and two intervals: the enqueue buffer ``eb`` (a window it may commit to next) and the dequeue buffer ``db``
(the committed window the query is consuming, up to ``pos``).

* :class:`LazyWindowBuffer` (LAZY-WB, §5.3.1, Fig. 10): a window becomes a candidate only when it has
  fully arrived (``eb`` = the most recently closed window, overwriting an older one; the open windows
  wait in ``wins``). The query gets a whole window and consumes it at once. Per-key memory
  ``<= 2w + s`` tuples (the committed window, the newest closed one and the open ones; §7.3.2).
* :class:`EagerWindowBuffer` (EAGER-WB, §5.3.2, Fig. 11): the commit is taken at a window's start
  (``eb`` = the most recently started window; a new starter empties it). The query consumes the
  committed window as its tuples arrive and may meet gaps. Per-key memory ``<= w + s``.

Correctness class: both give the seed's subset-based output (nSCS, §2.2/§5.1): some windows are never
delivered (they are overwritten in ``eb``), but every delivered result is the exact result of a whole,
original window, and a committed window is never abandoned, so neither buffer ever undoes a result.
They differ in staleness (which window is committed, and when), not in correctness. Pure logic: the
caller drives time (``benchmarks/bench_windowbuffer.py`` on a virtual clock).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

POLICIES = ("lazy", "eager")


class WindowBuffer:
    """One key's window buffer (the common part; see the module docstring)."""

    policy = ""

    def __init__(self, w: int, s: int, origin: int = 0) -> None:
        if w < 1 or s < 1:
            raise ValueError(f"window size and slide must be >= 1, got w={w}, s={s}")
        self.w, self.s, self.origin = int(w), int(s), int(origin)
        self.ts: list[int] = []  # held tuples' timestamps (sorted)
        self.vals: list[float] = []
        self.last: int | None = None  # newest timestamp seen
        self.eb: int | None = None  # candidate window start
        self.db: int | None = None  # committed window start
        self.pos = 0  # newest timestamp of ``db`` consumed
        self.overwritten = 0  # candidate windows replaced before a commit (never delivered)
        self.max_held = 0

    @property
    def bound(self) -> int:
        """The per-key memory bound the seed states (§7.3.2), in tuples."""
        raise NotImplementedError

    def end(self, a: int) -> int:
        return a + self.w - 1

    def _starts(self, lo: int, hi: int) -> range:
        """Window starts ``a`` with ``lo < a <= hi`` (``a >= origin``)."""
        first = max(lo + 1, self.origin)
        k = -(-(first - self.origin) // self.s)
        return range(self.origin + k * self.s, hi + 1, self.s)

    def arrive(self, ts: int, value: float) -> list[int]:
        """A tuple of the key; returns the starts of the windows it closed (for staleness accounting)."""
        if self.last is not None and ts <= self.last:
            raise ValueError(f"tuples of a key must arrive in timestamp order: {ts} after {self.last}")
        if ts < self.origin:
            raise ValueError(f"timestamp {ts} before the windows' origin {self.origin}")
        prev = self.origin - 1 if self.last is None else self.last
        closed = self._arrive(ts, value, prev)
        self.last = ts
        self._collect()
        return closed

    def _arrive(self, ts: int, value: float, prev: int) -> list[int]:
        raise NotImplementedError

    def _needed(self, t: int) -> bool:
        raise NotImplementedError

    def _keep(self, ts: int, value: float) -> None:
        self.ts.append(ts)
        self.vals.append(value)

    def _collect(self) -> None:
        keep = [i for i, t in enumerate(self.ts) if self._needed(t)]
        if len(keep) != len(self.ts):
            self.ts = [self.ts[i] for i in keep]
            self.vals = [self.vals[i] for i in keep]
        self.max_held = max(self.max_held, len(self.ts))

    @property
    def held(self) -> int:
        return len(self.ts)

    def in_db(self, t: int) -> bool:
        return self.db is not None and self.pos < t <= self.end(self.db)

    # -- the query's side -----------------------------------------------------------------------
    def commit(self) -> int | None:
        """A scheduling point: the dequeue buffer takes the candidate (None: nothing, or a committed
        window is still being consumed: no undo)."""
        if self.db is not None or self.eb is None:
            return None
        self.db, self.eb = self.eb, None
        self.pos = self.db - 1
        self._collect()
        return self.db

    def ready(self) -> bool:
        """Would serving this key now do work (commit a window or consume a tuple)?"""
        if self.db is None:
            return self.eb is not None
        return self._next() is not None or self.done()

    def _next(self) -> int | None:
        i = bisect_right(self.ts, self.pos)
        if i < len(self.ts) and self.db is not None and self.ts[i] <= self.end(self.db):
            return i
        return None

    def take(self) -> tuple[int, float] | None:
        """The committed window's next tuple, if it has arrived (None: a gap, or the window is consumed)."""
        i = self._next()
        if i is None:
            return None
        t, v = self.ts[i], self.vals[i]
        self.pos = t
        self._collect()
        return t, v

    def done(self) -> bool:
        """The committed window is closed and consumed: :meth:`release` it and deliver its result."""
        return (
            self.db is not None
            and self.last is not None
            and self.last >= self.end(self.db)
            and (self._next() is None)
        )

    def release(self) -> int:
        """The query delivered the committed window; returns its start."""
        if not self.done():
            raise RuntimeError("release before the committed window is consumed (no undo)")
        a, self.db = self.db, None
        self._collect()
        return a  # type: ignore[return-value]


class LazyWindowBuffer(WindowBuffer):
    """LAZY-WB: commit at the window's end (§5.3.1)."""

    policy = "lazy"

    def __init__(self, w: int, s: int, origin: int = 0) -> None:
        super().__init__(w, s, origin)
        self.wins: deque[int] = deque()  # open windows' starts, oldest first

    @property
    def bound(self) -> int:
        return 2 * self.w + self.s

    def _close(self, upto: int, closed: list[int]) -> None:
        while self.wins and self.end(self.wins[0]) <= upto:
            a = self.wins.popleft()
            if self.eb is not None:
                self.overwritten += 1
            self.eb = a
            closed.append(a)

    def _arrive(self, ts: int, value: float, prev: int) -> list[int]:
        closed: list[int] = []
        self._close(ts - 1, closed)  # windows ended in a gap before ts
        self.wins.extend(a for a in self._starts(prev, ts) if self.end(a) >= ts)
        self._keep(ts, value)
        self._close(ts, closed)
        return closed

    def _needed(self, t: int) -> bool:
        if self.in_db(t):
            return True
        if self.eb is not None and self.eb <= t <= self.end(self.eb):
            return True
        return bool(self.wins) and t >= self.wins[0]


class EagerWindowBuffer(WindowBuffer):
    """EAGER-WB: commit at the window's start (§5.3.2)."""

    policy = "eager"

    @property
    def bound(self) -> int:
        return self.w + self.s

    def _arrive(self, ts: int, value: float, prev: int) -> list[int]:
        started = [a for a in self._starts(prev, ts) if self.end(a) >= ts]
        if started:
            if self.eb is not None:
                self.overwritten += 1
            self.eb = started[-1]  # a new starter empties the enqueue buffer
        ends_now = self._starts(prev - self.w + 1, ts - self.w + 1)  # windows ending in (prev, ts]
        closed = [a for a in ends_now if a <= prev or self.end(a) == ts]  # non-empty ones, as lazy's
        self._keep(ts, value)
        return closed

    def _needed(self, t: int) -> bool:
        if self.in_db(t):
            return True
        return self.eb is not None and self.eb <= t <= self.end(self.eb)


def make(policy: str, w: int, s: int, origin: int = 0) -> WindowBuffer:
    """A window buffer of ``policy`` (``lazy`` or ``eager``)."""
    if policy == "lazy":
        return LazyWindowBuffer(w, s, origin)
    if policy == "eager":
        return EagerWindowBuffer(w, s, origin)
    raise ValueError(f"window buffer must be one of {POLICIES}, got {policy!r}")
