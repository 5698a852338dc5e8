"""The host loop that packet agents and flow collectors share: drain, punctuate, reload, stop, report.

A capture host of either record kind owns a kernel (tables plus a compiled pass), an emitter and a
clock per query. What one loop turn reads differs (frames from a ring, or datagrams from a socket:
``low_level.host.agent.Agent``, ``low_level.flows.agent.FlowAgent``); the rest is here, once:

* partials leave the kernel's output regions after every call (``drain``) and reach the emitter in
  blocks (``submit``), always before the punctuation that covers them;
* a punctuation (``punctuate``) advances the mark (``low_level.host.punctuate``), sends it with the
  host's counters, and counts itself for the metrics;
* SIGHUP reloads the networks file between two kernel calls (``reload_networks``), counted;
* a stop, graceful or at the deadline, sends everything the tables hold and a closing mark (``run``);
* ``summary`` and the Prometheus collector (``low_level.host.metrics``) read the same counters.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from typing import Any

import numpy as np

from contract import query as Q
from contract import wire
from low_level.host.emit import Emitter
from low_level.host.losses import LossLedger
from low_level.host.punctuate import Mark, advance
from low_level.kernel.tables import (
    LATE_NONE,
    QS_CLOSE_DUE,
    QS_EVICT,
    QS_LATE,
    QS_LATE_MIN,
    QS_MATCHED,
    QS_MAXTS,
    QS_STARTED,
)

log = logging.getLogger("lowwater.agent")


class Waker:
    """What an idle loop waits on: a pipe that a source's thread (records in the ring), the control
    listener (a punctuation request) or a signal handler writes a byte to. Why a pipe, not an Event: a
    signal handler runs in the waiting thread itself, where taking the Event's lock may deadlock, and
    ``os.write`` takes none."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        # a byte is in the pipe and the loop has not woken since: a busy source writes once per wait,
        # not once per batch of records (the loop reads the ring after clearing it, so nothing is missed)
        self.pending = False
        self.wakes = 0  # waits cut short by wake()

    def wake(self) -> None:
        """Cut the current (or next) wait short; from any thread or a signal handler."""
        if self.pending:
            return
        self.pending = True
        try:
            os.write(self._w, b"w")
        except OSError:  # full (a wake is pending anyway) or closed (the loop is gone)
            pass

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a wake; True when woken (what was written is consumed)."""
        if timeout_s <= 0 or not select.select([self._r], [], [], timeout_s)[0]:
            return False
        self.pending = False  # before reading: a wake from now on writes again
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass
        self.wakes += 1
        return True

    def __del__(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class HostLoop:
    """One host's queries, kernel, emitter and marks; subclasses say how records come in (``step``)."""

    kernel: Any  # low_level.kernel.fused.Kernel or low_level.flows.kernel.FlowKernel (both a KernelBase)
    emitter: Emitter
    # an empty turn waits idle_sleep_s, the next one twice that, ... up to idle_sleep_max_s, and never past
    # the next punctuation timer: an idle interface costs ~20 turns a second, not 2,000 (13% of a core
    # on an idle veth, with the default queries' on-demand checks per turn), while a busy one (a turn finds
    # records) stays at the shortest wait. The ring holds what arrives meanwhile (50 ms at 1M packets/s
    # is 50K of its 256K slots); a request for punctuation from the job waits at most as long.
    idle_sleep_s = 0.0005
    idle_sleep_max_s = 0.05
    # a source that wakes the loop when records arrive (``wakes_loop``) lets an empty turn wait until
    # the next deadline (timer punctuation, on-demand mark, pump) instead: ~2 turns a second on an idle
    # interface, not 20; this bounds the wait all the same (a deadline nothing computed)
    idle_wait_max_s = 1.0

    def __init__(self, queries: list[Q.QuerySpec], host: str, networks: str | None) -> None:
        self.host = host
        self.queries = queries
        self.networks_path = networks  # the networks file of the enrichment fields (contract.networks)
        self.reload_requested = False  # set by SIGHUP; the loop reloads between two kernel calls
        self.networks_reloads = 0
        self.networks_reload_errors = 0
        # partials go to Kafka every pump_every_s (or at pump_records queued); a punctuation goes at once,
        # with everything queued before it, so batching partials longer delays no window's result
        self.pump_every_s = 0.1
        self.pump_records = 65536
        self.punctuated = False
        self.pending: list[list[np.ndarray]] = [[] for _ in queries]  # drained partials not yet submitted
        self.pending_records = 0
        nq = len(queries)
        self.heartbeats = np.zeros(nq, dtype=np.int64)
        self.heartbeat_flushed = np.zeros(nq, dtype=np.int64)
        self.last_mark_ns = np.zeros(nq, dtype=np.int64)
        self.last_mark_pane: list[int | None] = [None] * nq
        self.next_timer = [0.0] * nq
        self.stopping = False
        self.finished = False
        self.workers = 0  # worker processes of this capture host (set for a worker H/wI; 0: not one)
        self.ledgers = [
            LossLedger() for _ in queries
        ]  # losses charged to panes, per query (low_level.host.losses)
        self.waker = Waker()

    def take_drop_span(self, j: int) -> tuple[int, int] | None:
        """The ns span of the frames the ring dropped not yet charged by query j (a source without a ring: None)."""
        return None

    def drop_counters(self) -> dict[str, int]:
        """The host's cumulative counters of records lost before any query saw them (low_level.host.losses):
        the capture socket's drops, the ring's, and malformed frames (a truncated capture's cut record too)."""
        src = self.source_stats()
        return {
            "socket": int(src.get("kernel_drops", 0)),
            "ring": self.ring_drops(),
            "malformed": sum(self.parse_error_counts().values()) + int(bool(src.get("malformed_tail"))),
        }

    def losses(self, i: int, mark_pane: int, end_of_stream: bool) -> tuple[tuple[int, int, str, int], ...]:
        """Query i's losses since its previous punctuation, charged to panes (taken: each counted once)."""
        t = self.kernel.t
        w = self.queries[i].window
        clock = [int(t.qs[i, QS_MAXTS])] if t.qs[i, QS_STARTED] else []
        if self.live_clock:
            clock.append(time.time_ns())
        clock_pane = (max(clock) - w.origin_ns) // w.pane_ns if clock else None
        late_min = int(t.qs[i, QS_LATE_MIN])
        t.qs[i, QS_LATE_MIN] = LATE_NONE
        if end_of_stream:  # the interval ends at the data, not at the end-of-stream mark
            mark_pane = clock_pane if clock_pane is not None else (self.ledgers[i].since or 0)
        span = self.take_drop_span(i)
        pspan = (
            None
            if span is None
            else ((span[0] - w.origin_ns) // w.pane_ns, (span[1] - w.origin_ns) // w.pane_ns)
        )
        return self.ledgers[i].charge(
            self.drop_counters(),
            int(t.qs[i, QS_LATE]),
            None if late_min == LATE_NONE else late_min,
            mark_pane,
            clock_pane,
            pspan,
        )

    def _bound_pending(self) -> None:
        """Drained partials wait in ``pending`` for at most a small fraction of the backlog's bound, so the
        memory the uplink may hold stays what max_records says (a Kafka outage sheds as configured)."""
        self.pending_max = min(self.pump_records, max(64, self.emitter.backlog.max_records // 8))

    # -- what subclasses tell about their source --------------------------------------------------

    @property
    def live_clock(self) -> bool:
        """True when the source's clock is the wall clock (an idle host's mark then follows it)."""
        return False

    def records_in(self) -> int:
        """Records handed to the kernel so far (packets, or flow records)."""
        return int(self.kernel.hc[0])

    def records_captured(self) -> int:
        """Records the source delivered (before the ring, if any)."""
        return self.records_in()

    def ring_drops(self) -> int:
        return 0

    def ring_fill(self) -> int:
        return 0

    def parse_error_counts(self) -> dict[str, int]:
        """Records not decoded, by reason."""
        return {}

    def source_stats(self) -> dict[str, Any]:
        return {}

    def source_stat(self, name: str) -> int:
        return int(self.source_stats().get(name, 0))

    # -- networks file ----------------------------------------------------------------------------

    def _networks_table(self) -> np.ndarray:
        """The lookup table of the networks file (raises ConfigError with file and line for a bad line)."""
        from contract import networks
        from low_level.kernel import lpm

        return lpm.build(networks.load(self.networks_path) if self.networks_path else None)

    def reload_networks(self) -> bool:
        """Re-read the networks file (SIGHUP) and use it from the next record on; the tables keep their
        state (partials already folded keep the nets they were matched to). A bad file is logged with its
        line and the previous table stays."""
        self.reload_requested = False
        try:
            table = self._networks_table()
        except Q.ConfigError as exc:
            self.networks_reload_errors += 1
            log.error("networks file not reloaded, keeping the previous one: %s", exc)
            return False
        self.kernel.set_networks(table)
        self.networks_reloads += 1
        log.info("networks file %s reloaded: %d intervals", self.networks_path, table.shape[1])
        return True

    def watch_signals(self) -> None:
        """SIGTERM/SIGINT stop the loop gracefully; SIGHUP reloads the networks file at the next turn."""

        def _stop(*_: object) -> None:
            self.stopping = True
            self.waker.wake()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        watch_sighup(self)

    # -- partials and marks -----------------------------------------------------------------------

    def drain(self) -> None:
        """Move every query's emitted partials out of the kernel's output regions (sized for one kernel
        call), into ``pending`` until the next pump or punctuation hands them to the emitter."""
        t = self.kernel.t
        for i in range(len(self.queries)):
            recs = t.drain(i)
            if len(recs):
                self.pending[i].append(recs)
                self.pending_records += len(recs)

    def submit(self) -> None:
        """Hand the pending partials to the emitter, one block per query: its per-call work (partition
        hash, split, queueing) done on a few hundred records per kernel call was a tenth of the capture
        core's time on a fast replay."""
        if not self.pending_records:
            return
        t = self.kernel.t
        for i, q in enumerate(self.queries):
            if self.pending[i]:
                recs = self.pending[i][0] if len(self.pending[i]) == 1 else np.concatenate(self.pending[i])
                self.pending[i] = []
                pane, key, state = t.split(i, recs)
                self.emitter.submit(q.name, pane, key, state)
        self.pending_records = 0

    def punctuate(
        self, i: int, idle: bool, timer: bool, end_of_stream: bool = False, clock_ns: int | None = None
    ) -> Mark | None:
        """Advance query i's mark, send what it covers, then the mark with the host's counters (on demand
        only when it moved; the timer re-sends it for liveness)."""
        q = self.queries[i]
        if q.heartbeat.close is not None:
            self.punctuate_groups(i, idle)
        hold = -(-q.heartbeat.max_disorder_ns // q.window.pane_ns)  # panes the mark waits for disorder
        m = advance(
            self.kernel,
            i,
            time.time_ns(),
            idle,
            self.live_clock,
            end_of_stream,
            hold_panes=hold,
            clock_ns=clock_ns,
        )
        if m is None and not timer:  # nothing flushed, the mark did not move: nothing to send (an idle
            return None  # host asks this every turn for every query; draining each time was most of its cost)
        if m is not None and m.flushed:
            self.heartbeat_flushed[i] += m.flushed
        self.drain()  # what the mark covers goes first
        self.submit()
        if m is not None and m.ns:
            self.last_mark_pane[i] = m.pane
            self.last_mark_ns[i] = m.ns
        elif not timer or self.last_mark_pane[i] is None:
            return m
        t = self.kernel.t
        stats = {
            "packets": self.records_in(),
            "matched": int(t.qs[i, QS_MATCHED]),
            "late": int(t.qs[i, QS_LATE]),
            "evictions": int(t.qs[i, QS_EVICT]),
            "ring_drops": self.ring_drops(),
            "backlog_lost": int(self.emitter.backlog.lost),
            "parse_errors": sum(self.parse_error_counts().values()),
            "workers": self.workers,
        }
        losses = self.losses(i, int(self.last_mark_pane[i]), end_of_stream)
        self.emitter.punctuate(q.name, int(self.last_mark_pane[i]), int(self.last_mark_ns[i]), stats, losses)
        self.heartbeats[i] += 1
        self.punctuated = True
        return m

    def punctuate_groups(self, i: int, idle: bool) -> int:
        """The built-in group-wise punctuation (``heartbeat.groups: {on: tcp_close}``): the groups whose
        FIN/RST + grace the host's clock has passed leave the table, then go to the emitter as done below
        their pane (behind their partials). Returns the groups punctuated."""
        t = self.kernel.t
        if not t.qs[i, QS_STARTED]:
            return 0
        clock = int(t.qs[i, QS_MAXTS])
        if self.live_clock and idle:  # an idle live host's clock is the wall clock, as for its mark
            clock = max(clock, time.time_ns() - self.queries[i].heartbeat.skew_ns)
        if int(t.qs[i, QS_CLOSE_DUE]) > clock:  # the earliest noted close + grace (none: never)
            return 0
        self.drain()  # room in the output region for the groups' entries
        key, done = self.kernel.close_groups(i, clock)
        if len(done) == 0:
            return 0
        self.drain()
        self.submit()
        # sent even below this host's own mark: the promise is for every host (the job's mark is the
        # slowest host's), which is what closes the group's windows early
        self.emitter.group_done(self.queries[i].name, key, done)
        return len(done)

    def close_tables(self) -> None:
        """A graceful stop: nothing more comes from this incarnation, so send everything the tables hold,
        then a mark at the clock, so the windows this host holds open close now rather than after its
        host timeout (a restart's records are newer than the clock)."""
        for i in range(len(self.queries)):
            self.kernel.flush_below(i, wire.END_OF_STREAM)
        self.drain()
        self.submit()
        self.punctuate_all(idle=True, timer=True)

    def punctuate_all(self, idle: bool, timer: bool, end_of_stream: bool = False) -> None:
        for i in range(len(self.queries)):
            self.punctuate(i, idle=idle, timer=timer, end_of_stream=end_of_stream)

    # -- the loop ---------------------------------------------------------------------------------

    def step(self) -> int:
        """One loop turn (a pending reload first, between two kernel calls); returns the records it took."""
        if self.reload_requested:
            self.reload_networks()
        return self.process()

    def process(self) -> int:
        """Take what the source holds through the kernel, punctuate what is due, emit; returns the records."""
        raise NotImplementedError

    def turn(self) -> int:
        """What run() does per turn (a pulled source is read here first)."""
        return self.step()

    def source_done(self) -> bool:
        """True when a finite source has nothing more to give."""
        return False

    def finish(self) -> None:
        """End of a finite source: flush every table and send a closing punctuation."""
        self.punctuate_all(idle=True, timer=False, end_of_stream=True)
        self.emitter.flush()
        self.finished = True

    def start_source(self) -> None:
        pass

    def stop_source(self) -> None:
        """Stop taking records (before the last turn)."""

    def close_source(self) -> None:
        """Release what the source holds (after the emitter closed)."""

    def run(self, duration_s: float | None = None, exit_at_end: bool = True) -> None:
        """Turn until stopped, at the deadline or (with exit_at_end) at the end of a finite source; a stop
        sends everything held and a closing mark."""
        self.start_source()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        empty = 0  # turns in a row that found nothing
        try:
            while not self.stopping and (deadline is None or time.monotonic() < deadline):
                n = self.turn()
                if n == 0 and self.source_done():
                    if not self.finished:
                        self.finish()
                    if exit_at_end:
                        break
                if n == 0:
                    self.waker.wait(self.idle_wait(empty))
                    empty += 1
                else:
                    empty = 0
        finally:
            self.stop_source()
            if not self.finished:
                self.step()  # what the source still holds
                self.close_tables()
            self.emitter.flush(10)
            self.emitter.close()
            self.close_source()

    @property
    def wakes_loop(self) -> bool:
        """True when the source wakes the loop (``waker``) as records arrive, so an empty turn may wait
        for the next deadline rather than look again after idle_sleep_max_s."""
        return False

    def next_due(self) -> float:
        """The monotonic time of the next timer punctuation (the earliest over the queries)."""
        return min(self.next_timer, default=float("inf"))

    def idle_wait(self, empty: int) -> float:
        """How long an empty turn waits: doubling with the empty turns before it, bounded by
        idle_sleep_max_s (idle_wait_max_s when the source wakes the loop) and by the next timer
        punctuation (whose timing stays as configured)."""
        cap = self.idle_wait_max_s if self.wakes_loop else self.idle_sleep_max_s
        wait = min(self.idle_sleep_s * (1 << min(empty, 16)), cap)
        return max(0.0, min(wait, self.next_due() - time.monotonic()))

    def summary(self) -> dict[str, Any]:
        """What this host saw, for the operator at exit (``--summary``): records, drops, per query."""
        t = self.kernel.t
        return {
            "host": self.emitter.host,
            "incarnation": int(self.emitter.incarnation),
            "finished": self.finished,
            "packets": self.records_in(),
            "parse_errors": sum(self.parse_error_counts().values()),
            "ring_drops": self.ring_drops(),
            "backlog_lost": int(self.emitter.backlog.lost),
            "networks_reloads": self.networks_reloads,
            "networks_reload_errors": self.networks_reload_errors,
            "source": self.source_stats(),
            "queries": {
                q.name: {"matched": int(t.qs[i, QS_MATCHED]), "late": int(t.qs[i, QS_LATE])}
                for i, q in enumerate(self.queries)
            },
        }


def watch_sighup(loop: HostLoop) -> None:
    """SIGHUP reloads the networks file at the loop's next turn (never inside a kernel call)."""

    def _hup(*_: object) -> None:
        loop.reload_requested = True

    signal.signal(signal.SIGHUP, _hup)
