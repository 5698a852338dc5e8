"""The packet agent: source -> ring -> kernel (parse, filter, sub-aggregate, flush) -> punctuate -> emit,
in one loop on one core (``low_level.host.loop``), with Prometheus metrics on the side.

Run ``lowwater-agent --help`` (``low_level.cli``). The loop never blocks on Kafka: what Kafka cannot take
waits in the bounded backlog while capture goes on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from contract import query as Q
from low_level.capture.ring import CAPTURED, HEAD, TAIL, Ring
from low_level.host.emit import Emitter
from low_level.host.loop import HostLoop
from low_level.host.losses import LossLedger
from low_level.kernel.fused import Kernel
from low_level.kernel.parse import PARSE_ERROR_NAMES
from low_level.kernel.tables import Tables
from low_level.kernel.tuplerows import TupleRows

log = logging.getLogger("lowwater.agent")


class Agent(HostLoop):
    """One capture host: owns the ring, the tables, the kernel, the emitter and the heartbeat clock."""

    pull_frames = (
        32768  # frames per pull, and ring slots, when run() drives the source itself (see self.pull)
    )

    def __init__(
        self,
        queries: list[Q.QuerySpec],
        source_spec: dict[str, Any] | None,
        host: str,
        bootstrap: str | None,
        ring_slots: int = 1 << 18,
        chunk: int = 1 << 16,
        producer: object | None = None,
        emitter_opts: dict[str, Any] | None = None,
        on_demand_gap_s: float = 0.01,
        idle_after_s: float = 0.005,
        control: Any = None,
        selects: list[Q.SelectSpec] | None = None,
        networks: str | None = None,
        latent_timestamps: bool = False,
        rows: list[Q.RowQuerySpec] | None = None,
    ) -> None:
        # latent timestamps (on-demand punctuation paper section 5): the agent stamps every record with its
        # own clock when it reads it from the ring, whatever the source wrote, so no record read later can
        # be older than the clock: an idle host's mark may be "now" (no skew), a busy one's needs no
        # disorder hold, and a punctuation asked for closes everything before the moment it is asked
        self.latent = bool(latent_timestamps)
        self.latent_last = 0  # the newest stamp given (stamps never decrease)
        if self.latent:
            queries, selects = [_latent(q) for q in queries], [_latent(s) for s in selects or []]
        super().__init__(queries, host, networks)
        self.control = control  # low_level.host.ondemand.RequestListener: the high level asks for punctuation
        self.on_demand_gap_s = on_demand_gap_s  # rate limit of on-demand punctuation
        # idle = ring empty and no packet for this long: a ring that a fast replay merely drained is not idle
        self.idle_after_s = idle_after_s
        self.last_packet_at = 0.0
        self.last_pump = 0.0
        self.ring = Ring(ring_slots)
        self.selects = list(selects or [])  # select queries: rows per packet, low_level.kernel.selection
        # row-window queries run as selects after them (the filter and words), numbered on draining
        self.row_queries = list(rows or [])
        self.kernel = Kernel(
            Tables.build(queries, chunk=chunk),
            [*self.selects, *(r.selection for r in self.row_queries)],
            nets=self._networks_table(),
        )
        # compile before any source starts: a first packet must not wait seconds for the compiler
        took = self.kernel.warm(self.ring)
        if took > 1.0:
            log.info(
                "compiled the packet kernel for %d queries in %.1f s (cached for this query set from now on)",
                len(queries),
                took,
            )
        self.emitter = Emitter(
            queries,
            host,
            bootstrap,
            producer=producer,
            selects=self.selects,
            rows=self.row_queries,
            **(emitter_opts or {}),
        )
        self._bound_pending()
        self.select_next_timer = [0.0] * len(self.selects)
        self.row_next_timer = [0.0] * len(self.row_queries)
        self.select_last_on_demand = [0.0] * len(self.selects)
        self.source = None
        if source_spec is not None:
            from low_level.capture.sources import open_source

            self.source = open_source(source_spec, self.ring)
        # On one CPU, a source that can be pulled (a fast pcap replay) is driven from run()'s loop rather
        # than its own thread, pull_frames at a time into a ring of that size: the two threads only took
        # turns on the core, and frames written a 16 MiB ring ahead of the kernel had left the cache by
        # the time it read them (the reader took 1.7x, the kernel 1.1x their time pulled this way).
        self.pull = (
            self.source is not None
            and getattr(self.source, "can_pull", False)
            and hasattr(os, "sched_getaffinity")
            and len(os.sched_getaffinity(0)) == 1
        )
        if self.pull:  # a fast classic-pcap replay's ring lies over the file: frames are not even copied
            self.ring = self.source.pull_ring(min(self.ring.nslots, self.pull_frames), self.ring.snaplen)
        if self.source is not None and not self.pull and getattr(self.source, "wakes_consumer", False):
            self.source.on_records = self.waker.wake  # the loop waits for records, not a short sleep
        if control is not None:
            control.on_request = self.waker.wake
        self.last_on_demand = [0.0] * len(queries)
        self.select_ledgers = [LossLedger() for _ in self.selects]
        self.row_ledgers = [LossLedger() for _ in self.row_queries]  # only their counts: rows have no panes
        # the time span of the frames the ring dropped, not yet charged by each query / select
        # (then one per row query: a slide-by-tuple query charges its losses in ns, as a select)
        self.drop_spans: list[tuple[int, int] | None] = [None] * (
            len(queries) + len(self.selects) + len(self.row_queries)
        )

    def take_drop_span(self, j: int) -> tuple[int, int] | None:
        """The ns span of the ring's dropped frames not yet charged by query j (selects after queries)."""
        got = self.ring.take_drop_span()
        if got is not None and self.latent:  # a dropped frame would have been stamped when read: by now
            got = (self.latent_last, max(self.latent_last, time.time_ns()))
        if got is not None:
            self.drop_spans = [
                got if s is None else (min(s[0], got[0]), max(s[1], got[1])) for s in self.drop_spans
            ]
        span, self.drop_spans[j] = self.drop_spans[j], None
        return span

    @property
    def live_clock(self) -> bool:
        return self.latent or bool(getattr(self.source, "live_clock", False))

    def run_latent(self) -> int:
        """One kernel call over at most a chunk of the ring's frames, each first stamped with the agent's
        clock (one stamp per call, never decreasing). The kernel reads HEAD from a copy of the counters
        that ends at the stamped frames: a frame the source pushes meanwhile waits for the next call."""
        ctr = self.ring.ctr
        tail = int(ctr[TAIL])
        n = min(int(ctr[HEAD]) - tail, self.kernel.t.chunk)
        if n <= 0:
            return 0
        self.latent_last = now = max(self.latent_last, time.time_ns())
        self.ring.ts[(tail + np.arange(n, dtype=np.int64)) & (self.ring.nslots - 1)] = now
        view = ctr.copy()
        view[HEAD] = tail + n
        took = self.kernel.run_ring(self.ring, view)
        ctr[TAIL] = view[TAIL]  # only this consumer writes TAIL
        return took

    def records_captured(self) -> int:
        return int(self.ring.ctr[CAPTURED])

    def ring_drops(self) -> int:
        return int(self.ring.drops)

    def ring_fill(self) -> int:
        return int(self.ring.fill)

    def parse_error_counts(self) -> dict[str, int]:
        return {
            name: int(self.kernel.err_counts[code]) for code, name in enumerate(PARSE_ERROR_NAMES) if code
        }

    def source_stats(self) -> dict[str, Any]:
        if self.source is None:
            return {}
        return {k: v for k, v in self.source.stats().items() if isinstance(v, int | float | str)}

    def source_stat(self, name: str) -> int:
        if self.source is None:
            return 0
        return int(self.source.stats().get(name, 0))

    def drain(self) -> None:
        """The partials (HostLoop.drain), and the select rows, which go to their outbox at once (before any mark)."""
        super().drain()
        for k, s in enumerate(self.selects):
            rows = self.kernel.sel_buf.drain(k)
            if len(rows):
                self.emitter.outbox.submit(s.name, rows)
        for j, rp in enumerate(self.emitter.row_panes):
            rp.submit(self.kernel.sel_buf.drain(len(self.selects) + j))

    def punctuate_select(self, k: int, idle: bool, end_of_stream: bool = False, timer: bool = True) -> None:
        """Select k's mark is its clock: drain what the kernel selected, raise the mark, queue it after the rows
        (on demand only when it moved; the timer re-sends it for liveness)."""
        self.drain()
        b = self.kernel.sel_buf
        prev = int(b.sst[k, 1])
        mark = b.advance_mark(k, time.time_ns(), idle, self.live_clock, end_of_stream)
        if mark is None or (not timer and mark == prev):
            return
        from low_level.kernel.selection import SS_LATE, SS_MATCHED

        stats = {
            "packets": int(self.kernel.hc[0]),
            "matched": int(b.sst[k, SS_MATCHED]),
            "late": int(b.sst[k, SS_LATE]),
            "ring_drops": int(self.ring.drops),
            "backlog_lost": int(self.emitter.outbox.lost),
            "parse_errors": int(self.kernel.err_counts[1:].sum()),
            "workers": self.workers,
        }
        losses = self.charge_rows(k, self.select_ledgers[k], mark, end_of_stream)
        self.emitter.outbox.punctuate(self.selects[k].name, mark, stats, losses)

    def charge_rows(
        self, k: int, ledger: LossLedger, mark: int, end_of_stream: bool
    ) -> tuple[tuple[int, int, str, int], ...]:
        """The losses since selected-rows region k's previous punctuation, in ns (a select's, or a
        slide-by-tuple query's after the selects): the host's drops over the interval's time span (the
        ring's dropped frames' own span included), late rows from the oldest one to below the mark."""
        from low_level.kernel.selection import SS_LATE, SS_LATE_MIN, SS_MAXTS

        b = self.kernel.sel_buf
        none, never = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        late_min = int(b.sst[k, SS_LATE_MIN])
        b.sst[k, SS_LATE_MIN] = none
        clock = max(int(b.sst[k, SS_MAXTS]), time.time_ns() if self.live_clock else never)
        clock = None if clock == never else clock
        at = (clock if clock is not None else mark) if end_of_stream else mark
        return ledger.charge(
            self.drop_counters(),
            int(b.sst[k, SS_LATE]),
            None if late_min == none else late_min,
            at,
            clock,
            self.take_drop_span(len(self.queries) + k),
        )

    def punctuate_all(self, idle: bool, timer: bool, end_of_stream: bool = False) -> None:
        super().punctuate_all(idle, timer, end_of_stream)
        for k in range(len(self.selects)):
            self.punctuate_select(k, idle=True, end_of_stream=end_of_stream)
        self.drain()
        for j in range(len(self.row_queries)):  # a stop or the end: every counter, so every window closes
            self.punctuate_row(j, idle=True, last=True)

    def punctuate_row(self, j: int, idle: bool, last: bool = False) -> None:
        """Row query j's punctuation (after a drain: the counts cover the rows sent). A row window's counters,
        with the host's drops since its previous marks (socket, ring, malformed) charged to row slots (wire
        ROW_MARKS; frames still in the ring are numbered later, so they widen the slots: ``slack``). A
        slide-by-tuple window's timestamp mark, its select's clock as a select query's. ``last``: this
        incarnation sends no more rows: every window closes."""
        rp = self.emitter.row_panes[j]
        if not isinstance(rp, TupleRows):
            got = self.row_ledgers[j].charge(self.drop_counters(), 0, None, 0, None)
            losses = tuple((cause, n) for _, _, cause, n in got)
            rp.punctuate(last, losses, int(self.ring.fill))
            return
        k = len(self.selects) + j
        b = self.kernel.sel_buf
        mark = b.advance_mark(k, time.time_ns(), idle, self.live_clock, end_of_stream=last)
        if mark is None:
            return
        from low_level.kernel.selection import SS_LATE, SS_MATCHED

        losses = self.charge_rows(k, self.row_ledgers[j], mark, last)  # in ns: the job flags the windows
        rp.punctuate(mark, {"matched": int(b.sst[k, SS_MATCHED]), "late": int(b.sst[k, SS_LATE])}, losses)

    def process(self) -> int:
        """One loop turn: process what the ring holds, emit, and punctuate by timer or on demand."""
        n = self.run_latent() if self.latent else self.kernel.run_ring(self.ring)
        self.drain()
        now = time.monotonic()
        if n:
            self.last_packet_at = now
        idle = self.ring.fill == 0 and now - self.last_packet_at >= self.idle_after_s
        for i, q in enumerate(self.queries):
            if now >= self.next_timer[i]:
                self.next_timer[i] = now + q.heartbeat.interval_ns / 1e9
                self.punctuate(i, idle, timer=True)
            elif idle and q.heartbeat.on_demand and now - self.last_on_demand[i] >= self.on_demand_gap_s:
                self.last_on_demand[i] = now
                if self.control:
                    self.control.take(i)  # answered by this punctuation (it flushes below the clock too)
                self.punctuate(i, idle, timer=False)
            elif (
                self.control and now - self.last_on_demand[i] >= self.on_demand_gap_s and self.control.take(i)
            ):
                self.last_on_demand[i] = (
                    now  # asked by the blocked consumer: flush below the clock, punctuate
                )
                self.punctuate(i, idle=True, timer=False)
        for k, s in enumerate(self.selects):
            if now >= self.select_next_timer[k]:
                self.select_next_timer[k] = now + s.heartbeat.interval_ns / 1e9
                self.punctuate_select(k, idle)
            elif (
                idle and s.heartbeat.on_demand and now - self.select_last_on_demand[k] >= self.on_demand_gap_s
            ):
                self.select_last_on_demand[k] = now
                self.punctuate_select(k, idle, timer=False)
            elif (
                self.control
                and now - self.select_last_on_demand[k] >= self.on_demand_gap_s
                and self.control.take_query(s.name)
            ):
                self.select_last_on_demand[k] = now  # asked by a blocked join: punctuate as if idle
                self.punctuate_select(k, idle=True, timer=False)
        for j, r in enumerate(self.row_queries):
            if now >= self.row_next_timer[j]:  # after the drain above: the counts cover the rows sent
                self.row_next_timer[j] = now + r.heartbeat.interval_ns / 1e9
                self.punctuate_row(j, idle)
                self.punctuated = True
        if self.pending_records >= self.pending_max:
            self.submit()  # into the backlog, whose merge and bound (max_records) then apply
        if (
            self.punctuated
            or now - self.last_pump >= self.pump_every_s
            or self.emitter.backlog.records >= self.pump_records
        ):
            # fewer, larger Kafka batches: the client's work is per message and per request, on the capture core
            self.last_pump = now
            self.punctuated = False
            self.submit()
            self.emitter.pump()
        return n

    @property
    def wakes_loop(self) -> bool:
        return self.source is not None and getattr(self.source, "on_records", None) == self.waker.wake

    def next_due(self) -> float:
        """The next time a turn has something to do with no record arriving: a timer punctuation, an
        idle live-clock mark that moves (its clock crosses a pane), a request the rate limit held back,
        a pump of what is queued. Select queries on demand keep the short wait (their mark follows
        the clock itself, not panes)."""
        timers = [*self.select_next_timer, *self.row_next_timer]
        due = min(super().next_due(), *timers) if timers else super().next_due()
        if any(s.heartbeat.on_demand for s in self.selects):
            return min(due, time.monotonic() + self.idle_sleep_max_s)
        now = time.monotonic()
        if self.live_clock:
            wall = time.time_ns()
            for i, q in enumerate(self.queries):
                if q.heartbeat.on_demand:
                    w, skew = q.window, q.heartbeat.skew_ns
                    cross = w.origin_ns + ((wall - skew - w.origin_ns) // w.pane_ns + 1) * w.pane_ns + skew
                    due = min(
                        due, max(now + (cross - wall) / 1e9, self.last_on_demand[i] + self.on_demand_gap_s)
                    )
        if self.control is not None:  # its flags: the queries', then the selects'
            last = [*self.last_on_demand, *self.select_last_on_demand]
            for i, asked in enumerate(self.control.pending):
                if asked and i < len(last):
                    due = min(due, last[i] + self.on_demand_gap_s)
        if (
            self.pending_records
            or not self.emitter.outbox.empty
            or any(self.emitter.backlog.fifos.values())
            or not all(rp.empty for rp in self.emitter.row_panes)
        ):
            due = min(due, self.last_pump + self.pump_every_s)
        return due

    def turn(self) -> int:
        if self.pull and self.ring.fill == 0:
            self.source.pull(self.pull_frames)  # type: ignore[union-attr]
        return self.step()

    def source_done(self) -> bool:
        return self.source is not None and self.source.finished and self.ring.fill == 0

    def start_source(self) -> None:
        if self.source is not None and not self.pull:
            self.source.start()

    def stop_source(self) -> None:
        if self.source is not None:
            self.source.stop()
            self.source.join(5)
            if self.pull:
                self.source.close()  # no thread releases its file
            log.info("source stopped: %s", self.source.stats())


def _latent(q: Any) -> Any:
    """A query or select as a latent-timestamp host runs it: its records are stamped on reading, so they
    come neither skewed nor out of order (heartbeat skew and max_disorder 0)."""
    hb = q.heartbeat.model_copy(update={"skew_ns": 0, "max_disorder_ns": 0})
    return q.model_copy(update={"heartbeat": hb})
