"""The update queue of one live consumer (UpStream): what to send next when the consumer is slower than
the updates, so that what it shows is as fresh as possible and never a half window.

Updates are keyed by (window, group). The consumer is served at a bounded rate (one :meth:`take` per
service slot); between two slots any number of updates may arrive. Policies:

* ``fifo``: an append queue, every update in arrival order (baseline; staleness grows with the backlog);
* ``random``: ``fifo`` that drops each arriving provisional update with probability ``drop_p``
  (random load shedding, the baseline of the seed);
* ``inplace``: one cell per key; a newer update overwrites the key's cell and keeps its position, keys
  are served in order of first enqueue (optimal for equal key rates);
* ``linecutting``: the ``inplace`` cells, but the key served is the one with the largest
  ``s(k) + W(k)``: ``W`` the time its cell has waited, ``s(k) = 1/r_k - C*pos(k)`` when positive (else 0),
  ``r_k`` the key's update rate, ``C`` the service time per update and ``pos`` the zero-offset position
  in the ``inplace`` order. Slow updaters cut the line; with equal rates it serves the ``inplace`` order.

Window-aware delivery ("all or nothing", "no undo"):

* a final value supersedes every provisional one of its key (``inplace``/``linecutting`` overwrite
  the cell; ``fifo``/``random`` drop the key's queued provisionals, unless ``supersede=False``: the
  seed's plain append baseline, which still delivers them, before the final), and a provisional value
  offered after its key's final is refused and counted: none is ever delivered after its final;
* a window whose final values cannot all be delivered (a final would be shed by random drop, or the
  queue is full) is skipped whole: its queued updates are dropped, later ones refused, a
  :class:`Skipped` notice is served so the consumer can drop what it shows, and it is counted. A window
  one of whose finals has been delivered is committed and is never skipped (no undo).

Memory: ``inplace``/``linecutting`` hold at most one cell per key (the seed's bound for tuple-based
updates; per group at most the windows open at once plus those closing); ``max_cells`` caps the total.
Pure: the caller passes the time, so the benchmark and the tests run it on a simulated clock and the
live endpoint on the wall clock.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from high_level.live.staleness import StalenessMeter

POLICIES = ("fifo", "random", "inplace", "linecutting")
RATE_SMOOTHING = 0.3  # weight of the newest inter-arrival time in a group's rate estimate
REMEMBER_WINDOWS = 256  # finals/skips remembered per queue (refuse stale provisionals), newest windows


@dataclass
class Update:
    """One value of one (window, group): provisional while the window is open, final when it closed."""

    window: int
    group: Hashable
    value: Any
    final: bool = False
    version: int = 0  # increasing per (window, group): which inputs the value reflects
    arrived: float = 0.0  # set by :meth:`UpdateQueue.offer`

    @property
    def key(self) -> tuple[int, Hashable]:
        return (self.window, self.group)


@dataclass(frozen=True)
class Skipped:
    """Window ``window`` will not be delivered in full: the consumer drops what it shows of it."""

    window: int


@dataclass
class _Cell:
    update: Update
    first: float  # first enqueue since the key was last served (its waiting time starts here)


@dataclass
class QueueStats:
    offered: int = 0
    delivered: int = 0
    overwrites: int = 0  # an update replaced a queued one of its key (inplace/linecutting)
    superseded: int = 0  # queued provisionals dropped by their final (fifo/random)
    dropped: int = 0  # provisionals shed (random drop, full queue)
    refused_after_final: int = 0  # provisionals offered after their key's final
    skipped_windows: int = 0
    skipped_updates: int = 0  # updates dropped or refused because their window was skipped
    max_cells: int = 0  # most updates held at once
    extra: dict[str, float] = field(default_factory=dict)


class UpdateQueue:
    """The update queue of one consumer (module docstring)."""

    def __init__(
        self,
        policy: str = "inplace",
        service_s: float = 0.01,
        max_cells: int = 100_000,
        drop_p: float = 0.0,
        seed: int = 0,
        meter: StalenessMeter | None = None,
        supersede: bool = True,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if service_s <= 0 or max_cells < 1 or not 0 <= drop_p < 1:
            raise ValueError("service time must be > 0, max_cells >= 1, 0 <= drop_p < 1")
        self.policy, self.service_s, self.max_cells, self.drop_p = (
            policy,
            float(service_s),
            int(max_cells),
            drop_p,
        )
        self.supersede = supersede
        self.rng = random.Random(seed)
        self.meter = meter if meter is not None else StalenessMeter()
        self.stats = QueueStats()
        self.cells: OrderedDict[tuple, _Cell] = OrderedDict()  # inplace / linecutting
        self.fifo: deque[Update] = deque()  # fifo / random
        self.notices: deque[Skipped] = deque()
        self.final_keys: dict[int, set] = {}  # window -> groups whose final was offered
        self.finals_queued: dict[int, int] = {}  # window -> finals queued, not delivered
        self.committed: set[int] = set()  # windows with a final delivered
        self.skipped: set[int] = set()
        self.last_arrival: dict[Hashable, float] = {}  # group -> last update time (rate estimate)
        self.interval: dict[Hashable, float] = {}  # group -> smoothed time between its updates
        self.first_offer: float | None = None
        self.last_time = 0.0

    # -- enqueue --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.cells) + len(self.fifo) + len(self.notices)

    def offer(self, u: Update, now: float) -> None:
        """An update arrives at ``now``."""
        st = self.stats
        st.offered += 1
        self.last_time = now
        if self.first_offer is None:
            self.first_offer = now
        u.arrived = now
        self._observe_rate(u.group, now)
        if u.window in self.skipped:
            st.skipped_updates += 1
            return
        if not u.final and u.group in self.final_keys.get(u.window, ()):
            st.refused_after_final += 1
            return
        self.meter.arrive(u.key, u.version, now)
        if self.policy in ("fifo", "random"):
            self._offer_append(u)
        else:
            self._offer_inplace(u, now)
        if u.final:
            self.final_keys.setdefault(u.window, set()).add(u.group)
            self._forget_old()
        st.max_cells = max(st.max_cells, len(self.cells) + len(self.fifo))

    def _observe_rate(self, group: Hashable, now: float) -> None:
        prev = self.last_arrival.get(group)
        self.last_arrival[group] = now
        if prev is not None and now > prev:
            old = self.interval.get(group)
            gap = now - prev
            self.interval[group] = gap if old is None else (1 - RATE_SMOOTHING) * old + RATE_SMOOTHING * gap

    def _offer_append(self, u: Update) -> None:
        st = self.stats
        if u.final:
            if self.policy == "random" and self.rng.random() < self.drop_p and u.window not in self.committed:
                self._skip(u.window)  # shedding a final would leave the window short: all or nothing
                st.skipped_updates += 1
                return
            if self.supersede:
                before = len(self.fifo)
                self.fifo = deque(x for x in self.fifo if x.final or x.key != u.key)
                st.superseded += before - len(self.fifo)
        elif self.policy == "random" and self.rng.random() < self.drop_p:
            st.dropped += 1
            return
        if not self._room(u):
            return
        self.fifo.append(u)
        if u.final:
            self.finals_queued[u.window] = self.finals_queued.get(u.window, 0) + 1

    def _offer_inplace(self, u: Update, now: float) -> None:
        st = self.stats
        cell = self.cells.get(u.key)
        if cell is not None:
            st.overwrites += 1
            if u.final and not cell.update.final:
                self.finals_queued[u.window] = self.finals_queued.get(u.window, 0) + 1
            cell.update = u  # overwrite in place: the key keeps its position and its waiting time
            return
        if not self._room(u):
            return
        self.cells[u.key] = _Cell(u, now)
        if u.final:
            self.finals_queued[u.window] = self.finals_queued.get(u.window, 0) + 1

    def _room(self, u: Update) -> bool:
        """Make room for one more update; False when ``u`` is shed instead (counted)."""
        if len(self.cells) + len(self.fifo) < self.max_cells:
            return True
        victim = self._oldest_uncommitted()
        if victim is not None and (u.window > victim or u.window in self.committed):
            self._skip(victim)
            return True
        if u.final and u.window in self.committed:
            return True  # no undo: a committed window is delivered in full, even over the cap
        if u.final:
            self._skip(u.window)
            self.stats.skipped_updates += 1
        else:
            self.stats.dropped += 1
        return False

    def _oldest_uncommitted(self) -> int | None:
        held = {k[0] for k in self.cells} | {x.window for x in self.fifo}
        cands = [w for w in held if w not in self.committed]
        return min(cands) if cands else None

    def _skip(self, window: int) -> None:
        if window in self.committed or window in self.skipped:
            return
        st = self.stats
        gone = [k for k in self.cells if k[0] == window]
        for k in gone:
            del self.cells[k]
        n = len(gone)
        if self.fifo:
            before = len(self.fifo)
            self.fifo = deque(x for x in self.fifo if x.window != window)
            n += before - len(self.fifo)
        st.skipped_updates += n
        st.skipped_windows += 1
        self.skipped.add(window)
        self.finals_queued.pop(window, None)
        self.notices.append(Skipped(window))

    def _forget_old(self) -> None:
        """Keep the per-window memory bounded: the newest REMEMBER_WINDOWS windows with a final."""
        if len(self.final_keys) > REMEMBER_WINDOWS:
            for w in sorted(self.final_keys)[: len(self.final_keys) - REMEMBER_WINDOWS]:
                del self.final_keys[w]
                self.committed.discard(w)
        if len(self.skipped) > REMEMBER_WINDOWS:
            for w in sorted(self.skipped)[: len(self.skipped) - REMEMBER_WINDOWS]:
                self.skipped.discard(w)

    # -- dequeue --------------------------------------------------------------------------------
    def take(self, now: float) -> Update | Skipped | None:
        """The next thing to send at ``now`` (one service slot), None when there is nothing."""
        self.last_time = now
        if self.notices:
            return self.notices.popleft()
        if self.policy in ("fifo", "random"):
            if not self.fifo:
                return None
            u = self.fifo.popleft()
        else:
            if not self.cells:
                return None
            key = next(iter(self.cells)) if self.policy == "inplace" else self._line_cutter(now)
            u = self.cells.pop(key).update
        self._delivered(u, now)
        return u

    def _line_cutter(self, now: float) -> tuple:
        """The key with the largest s(k) + W(k) (ties: the earliest in ``inplace`` order)."""
        best, best_p = None, -1.0
        c = self.service_s
        for pos, (key, cell) in enumerate(self.cells.items()):
            gap = self.interval.get(cell.update.group)
            slow = 0.0 if gap is None else max(0.0, gap - c * pos)  # 1/r_k = the key's time between updates
            p = slow + (now - cell.first)
            if p > best_p:
                best, best_p = key, p
        return best

    def _delivered(self, u: Update, now: float) -> None:
        st = self.stats
        st.delivered += 1
        self.meter.deliver(u.key, u.version, now)
        if u.final:
            self.committed.add(u.window)
            left = self.finals_queued.get(u.window, 0) - 1
            if left > 0:
                self.finals_queued[u.window] = left
            else:
                self.finals_queued.pop(u.window, None)
            self.meter.finish(u.key, now)

    # -- figures --------------------------------------------------------------------------------
    def load_factor(self, now: float) -> float:
        """Arrival rate x service time since the first offer (> 1: the consumer cannot keep up)."""
        if self.first_offer is None or now <= self.first_offer:
            return 0.0
        return self.stats.offered / (now - self.first_offer) * self.service_s

    def snapshot(self, now: float) -> dict[str, Any]:
        """Counters and staleness (seconds) for metrics and status."""
        st = self.stats
        mean, mx = self.meter.current(now)
        return {
            "policy": self.policy,
            "service_s": self.service_s,
            "queued": len(self.cells) + len(self.fifo),
            "offered": st.offered,
            "delivered": st.delivered,
            "overwrites": st.overwrites,
            "superseded": st.superseded,
            "dropped": st.dropped,
            "refused_after_final": st.refused_after_final,
            "skipped_windows": st.skipped_windows,
            "skipped_updates": st.skipped_updates,
            "max_cells": st.max_cells,
            "load_factor": round(self.load_factor(now), 4),
            "staleness_now_s": round(mean, 6),
            "staleness_max_now_s": round(mx, 6),
            "staleness_avg_s": round(self.meter.stream_average(now), 6),
            "result_staleness_avg_s": round(self.meter.mean_result_staleness, 6),
        }


def replay(
    queue: UpdateQueue,
    timed: list[tuple[float, Update]],
    until: float | None = None,
    charge_cpu: bool = False,
) -> list[tuple[float, Update | Skipped]]:
    """Serve ``(arrival time, update)`` pairs (time order) through ``queue`` at its service rate on a
    simulated clock: a work-conserving server takes the next item whenever it is free and the queue
    holds one, each take occupying ``service_s``. Returns (delivery time, item); stops at ``until``
    (default: when everything is served). ``charge_cpu`` adds the measured CPU time of each ``take``
    (the policy's decision) to its service time, so a costlier policy serves fewer updates."""
    out: list[tuple[float, Update | Skipped]] = []
    c = queue.service_s
    i, n, free = 0, len(timed), 0.0
    while True:
        nxt = timed[i][0] if i < n else None
        if len(queue) and (nxt is None or free <= nxt):
            t = max(free, queue.last_time)
            if until is not None and t > until:
                break
            t0 = time.process_time() if charge_cpu else 0.0
            item = queue.take(t)
            spent = time.process_time() - t0 if charge_cpu else 0.0
            if item is not None:
                out.append((t, item))
            free = t + c + spent
        elif nxt is not None:
            if until is not None and nxt > until:
                break
            queue.offer(timed[i][1], nxt)
            i += 1
        else:
            break
    return out
