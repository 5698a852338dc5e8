"""Heartbeat punctuation: the host's low-water mark per query, sent only after what it covers.

Rules (OOP paper section 5; Gigascope heartbeats; on-demand punctuation paper):

* The mark is a pane number P meaning "every partial of this host with pane < P has been emitted".
  It is min(oldest pane still in the table, pane of the host's current time), never decreasing.
* Current time is data time (the largest packet timestamp seen). On a live clock during a lull
  (ring empty) it advances to wall clock − skew, so an idle host does not hold windows open.
* When the ring is empty the host is idle: it flushes every entry below the target pane at once
  (it has the time) and punctuates immediately (on demand) instead of waiting for the timer.
* After the mark is sent, packets with pane < P are late and are dropped and counted by the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import wire
from low_level.kernel.base import KernelBase as Kernel
from low_level.kernel.tables import EMPTY, QS_MARK, QS_MAXTS, QS_OCC, QS_STARTED


@dataclass
class Mark:
    pane: int
    ns: int
    flushed: int


def target_pane(
    kernel: Kernel,
    q: int,
    now_ns: int,
    idle: bool,
    live_clock: bool,
    skew_ns: int,
    clock_ns: int | None = None,
) -> int | None:
    """The pane the host's clock has reached (everything before it may be closed), or None if unknown.

    ``clock_ns`` replaces the data clock where the source itself promises how far it got (a flow
    collector: its exporters' clocks minus their timeouts, low_level.flows.source)."""
    t = kernel.t
    qp = t.queries[q].window
    data_ns = int(t.qs[q, QS_MAXTS]) if t.qs[q, QS_STARTED] else None
    if clock_ns is not None:
        return (clock_ns - qp.origin_ns) // qp.pane_ns
    clock_ns = data_ns
    if live_clock and idle:
        wall = now_ns - skew_ns
        clock_ns = wall if clock_ns is None else max(clock_ns, wall)
    if clock_ns is None:
        return None
    return (clock_ns - qp.origin_ns) // qp.pane_ns


def _oldest_held(kernel: Kernel, q: int, target: int) -> int:
    """Oldest pane the table still holds; with an empty table nothing holds the mark below the target
    (not the last data pane + 1: an idle host's mark must follow its clock)."""
    if kernel.t.qs[q, QS_OCC] == 0:
        return target
    return kernel.min_pane(q)


def advance(
    kernel: Kernel,
    q: int,
    now_ns: int,
    idle: bool,
    live_clock: bool,
    end_of_stream: bool = False,
    hold_panes: int = 0,
    clock_ns: int | None = None,
) -> Mark | None:
    """Flush what the new mark needs and return it (the caller drains, queues, then sends it).

    Returns None when the mark does not advance. Sets the kernel's mark, so later packets below it
    count as late. ``hold_panes`` keeps a busy host's mark that many panes behind its data clock:
    the oldest pane in the table says nothing about packets still to come when the capture itself
    is out of order (a group's older panes are evicted from its probe window as its newer ones
    arrive), so a stream with up to D of disorder needs ``hold_panes = ceil(D / pane)`` to lose
    nothing (benchmarks/bench_disorder.py measures both). The agent passes the query's
    ``heartbeat.max_disorder`` in panes (rounded up).
    """
    t = kernel.t
    spec = t.queries[q]
    prev = int(t.qs[q, QS_MARK])
    if end_of_stream:
        flushed = kernel.flush_below(q, wire.END_OF_STREAM)
        mark = wire.END_OF_STREAM
    else:
        target = target_pane(kernel, q, now_ns, idle, live_clock, spec.heartbeat.skew_ns, clock_ns)
        if target is None:
            return None
        if not idle:
            target -= hold_panes
        oldest = _oldest_held(kernel, q, target)
        flushed = 0
        if idle and oldest < target:  # the per-pane counters say a sweep has something to flush
            flushed = kernel.flush_below(q, target)
            oldest = _oldest_held(kernel, q, target)
        mark = min(oldest, target)
    if prev != EMPTY and mark <= prev:
        return Mark(prev, 0, flushed) if flushed else None
    t.qs[q, QS_MARK] = mark
    w = spec.window
    mark_ns = wire.END_OF_STREAM if mark == wire.END_OF_STREAM else w.origin_ns + mark * w.pane_ns
    return Mark(mark, mark_ns, flushed)
