"""Staleness as UpStream defines it (the seed's Definitions 8-10), measured from events, not modelled.

Per key ``k`` at time ``t``: ``S_k(t) = t - a_k(t)`` where ``a_k(t)`` is the arrival of the earliest
input for ``k`` that the last delivered result of ``k`` does not reflect, and ``S_k(t) = 0`` when
there is none (the delivered result is the freshest). A result delivered at ``d`` has staleness
``S(o) = d - a`` with ``a`` the arrival of the first newer input (0 if none had arrived). The stream's
staleness over ``[t0, t1]`` is the average over keys of each key's time-average (Definition 10 with
F = mean). Inputs are identified per key by an increasing version number; a delivery says which version
it reflects, so an overwritten (skipped) version is simply never delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class _Key:
    pending: deque = field(default_factory=deque)  # (version, arrival) of inputs not yet reflected
    anchor: float | None = None  # a_k: arrival of the earliest unreflected input (None: fresh)
    since: float = 0.0  # last time the area was brought up to date
    area: float = 0.0  # integral of S_k over [first seen, since]
    first: float = 0.0


class StalenessMeter:
    """Integrates ``S_k(t)`` per key from arrival and delivery events (times in seconds, non-decreasing)."""

    def __init__(self) -> None:
        self.keys: dict[Hashable, _Key] = {}
        self.results = 0
        self.result_staleness_sum = 0.0  # sum of S(o) over delivered results
        self.max_key_staleness = 0.0
        self.finished = 0
        self.finished_sum = 0.0

    def _advance(self, st: _Key, t: float) -> None:
        if st.anchor is not None and t > st.since:
            a = st.anchor
            st.area += ((t - a) ** 2 - (st.since - a) ** 2) / 2
            self.max_key_staleness = max(self.max_key_staleness, t - a)
        st.since = max(st.since, t)

    def arrive(self, key: Hashable, version: int, t: float) -> None:
        """An input for ``key`` (its ``version``) arrived at ``t``."""
        st = self.keys.get(key)
        if st is None:
            st = self.keys[key] = _Key(since=t, first=t)
        self._advance(st, t)
        st.pending.append((version, t))
        if st.anchor is None:
            st.anchor = t

    def deliver(self, key: Hashable, version: int, t: float) -> float:
        """The result reflecting inputs of ``key`` up to ``version`` was delivered at ``t``; returns S(o)."""
        st = self.keys.get(key)
        if st is None:
            return 0.0
        self._advance(st, t)
        while st.pending and st.pending[0][0] <= version:
            st.pending.popleft()
        st.anchor = st.pending[0][1] if st.pending else None
        s = 0.0 if st.anchor is None else t - st.anchor
        self.results += 1
        self.result_staleness_sum += s
        return s

    def finish(self, key: Hashable, t: float) -> None:
        """``key`` will change no more (its final value is delivered): its time-average is taken over its
        life, from its first input to ``t``, and only that number is kept (memory stays per open key)."""
        st = self.keys.pop(key, None)
        if st is not None:
            self._advance(st, t)
            self.finished_sum += st.area / (t - st.first) if t > st.first else 0.0
            self.finished += 1

    def key_average(self, key: Hashable, t: float) -> float:
        """Time-average of ``S_k`` from the key's first input to ``t``."""
        st = self.keys[key]
        self._advance(st, t)
        return st.area / (t - st.first) if t > st.first else 0.0

    def stream_average(self, t: float) -> float:
        """Average over keys of each key's time-average staleness (the seed's S-bar): finished keys over
        their life, open ones up to ``t`` (a key whose window was skipped stays open: it keeps ageing)."""
        n = len(self.keys) + self.finished
        if not n:
            return 0.0
        return (self.finished_sum + sum(self.key_average(k, t) for k in self.keys)) / n

    def current(self, t: float) -> tuple[float, float]:
        """(mean, max) over keys of ``S_k(t)`` now."""
        vals = [t - st.anchor if st.anchor is not None else 0.0 for st in self.keys.values()]
        return (sum(vals) / len(vals), max(vals)) if vals else (0.0, 0.0)

    @property
    def mean_result_staleness(self) -> float:
        return self.result_staleness_sum / self.results if self.results else 0.0
