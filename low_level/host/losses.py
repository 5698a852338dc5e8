"""Charge the host's losses to the panes they may have hit, for the next punctuation to carry.

The agent counts what it loses before anything reaches Kafka: the capture socket's drops
(PACKET_STATISTICS ``tp_drops``), frames a full ring refused, packets below its own mark (late),
and frames the parser rejected (malformed: reported, not a loss of the query's records). Counters
alone would leave the high level blind to which windows are short, so every punctuation carries,
per cause, what the counter grew by since the query's previous punctuation and the pane range it
belongs to (``wire.Punctuation.losses``, wire version 2).

Where a drop cannot be pinned to a pane (the socket and ring drop frames the kernel never parsed,
counted between two reads), the range is every pane the interval spanned: from the mark in force
at its start (a frame below it would have been late anyway) to the host's clock at its end (on a
live clock, the wall clock: a dropped frame is no newer than now). Flag rather than miss. A late
packet's own pane is known: the kernel keeps the oldest (``QS_LATE_MIN``), and the range runs from
it to just below the current mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DROP_CAUSES = ("socket", "ring", "malformed")  # counted per host, charged to the interval's panes


@dataclass
class LossLedger:
    """One query's (or select's) counters at its previous punctuation and the mark then in force."""

    prev: dict[str, int] = field(default_factory=dict)
    since: int | None = None  # the mark sent at the previous punctuation (pane, or ns for a select)

    def charge(
        self,
        counters: dict[str, int],
        late: int,
        late_min: int | None,
        mark: int,
        clock: int | None,
        ring_span: tuple[int, int] | None = None,
    ) -> tuple[tuple[int, int, str, int], ...]:
        """Loss ranges ``(first, last, cause, records)`` since the previous call, in the query's unit.

        ``counters``: the host's cumulative drop counters by cause (:data:`DROP_CAUSES`); ``late``: the
        query's cumulative late count and ``late_min`` the oldest pane (or time) a late packet had since
        the previous call; ``mark``: the mark this punctuation sends; ``clock``: the host's clock now in
        the same unit (None: unknown, then the mark); ``ring_span``: the oldest and newest time of the
        frames the ring dropped in the interval (in the same unit), which widens the ring's range (on a
        replay the dropped frames may be newer than anything the kernel has seen)."""
        lo = mark if self.since is None else self.since
        hi = max(lo, mark, clock if clock is not None else mark)
        out = []
        for cause in DROP_CAUSES:
            n = int(counters.get(cause, 0)) - self.prev.get(cause, 0)
            if n > 0:
                a, b = (
                    (min(lo, ring_span[0]), max(hi, ring_span[1]))
                    if cause == "ring" and ring_span
                    else (lo, hi)
                )
                out.append((int(a), int(b), cause, n))
            self.prev[cause] = int(counters.get(cause, 0))
        n = int(late) - self.prev.get("late", 0)
        if n > 0:
            first = int(late_min) if late_min is not None else int(lo)
            out.append((first, max(first, int(mark) - 1), "late", n))
        self.prev["late"] = int(late)
        self.since = max(int(mark), self.since if self.since is not None else int(mark))
        return tuple(out)
