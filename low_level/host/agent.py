"""The capture-host agent: source -> ring -> kernel (parse, filter, sub-aggregate, flush) ->
punctuate -> emit, in one loop on one core, with Prometheus metrics on the side.

Run ``lowwater-agent --help``. The loop never blocks on Kafka: what Kafka cannot take waits in the
bounded backlog while capture goes on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from contract import query as Q
from contract import wire
from low_level.capture.ring import Ring
from low_level.host.emit import Emitter
from low_level.host.losses import LossLedger
from low_level.host.punctuate import advance
from low_level.kernel.fused import Kernel
from low_level.kernel.tables import (
    LATE_NONE,
    QS_EVICT,
    QS_LATE,
    QS_LATE_MIN,
    QS_MATCHED,
    QS_MAXTS,
    QS_STARTED,
    Tables,
)

log = logging.getLogger("lowwater.agent")


def parse_source(text: str) -> dict[str, Any]:
    """'generator[:groups=N,rate=R]', 'pcap:PATH[,loop][,paced]' or 'afpacket:IF1+IF2[,promisc]' -> spec."""
    kind, _, rest = text.partition(":")
    if kind == "generator":
        spec: dict[str, Any] = {"type": "generator"}
        for item in filter(None, rest.split(",")):
            k, _, v = item.partition("=")
            try:
                spec[k] = float(v) if "." in v else int(v)
            except ValueError:
                spec[k] = v  # e.g. clock=wall
        spec.setdefault("clock", "wall")
        return spec
    if kind == "pcap":
        path, *flags = rest.split(",")
        if not path:
            raise ValueError("pcap source needs a path: pcap:/path/file.pcap[,loop][,paced]")
        if not os.access(path, os.R_OK) or os.path.isdir(path):  # say so now, not after compiling the kernel
            raise ValueError(f"capture file {path!r} does not exist or cannot be read")
        return {"type": "pcap", "path": path, "loop": "loop" in flags,
                "mode": "paced" if "paced" in flags or "loop" in flags else "fast",
                "rebase_to_now": "loop" in flags}
    if kind == "afpacket":
        ifaces, *flags = rest.split(",")
        if not ifaces:
            raise ValueError("afpacket source needs interfaces: afpacket:eth0[+eth1][,promisc]")
        return {"type": "afpacket", "interfaces": ifaces.split("+"), "promiscuous": "promisc" in flags}
    if kind == "flows":  # NetFlow v5/v9/IPFIX collector (low_level.flows.agent)
        from low_level.flows.agent import parse_flow_source

        return parse_flow_source(rest)
    raise ValueError(f"unknown source {text!r}: use generator, pcap:PATH, afpacket:IFACE or flows:HOST:PORT")


class Agent:
    """One capture host: owns the ring, the tables, the kernel, the emitter and the heartbeat clock."""

    pull_frames = 32768  # frames per pull, and ring slots, when run() drives the source itself (see self.pull)

    def __init__(self, queries: list[Q.QuerySpec], source_spec: dict[str, Any] | None, host: str,
                 bootstrap: str | None, ring_slots: int = 1 << 18, chunk: int = 1 << 16,
                 producer: object | None = None, emitter_opts: dict[str, Any] | None = None,
                 on_demand_gap_s: float = 0.01, idle_after_s: float = 0.005, control: Any = None,
                 selects: list[Q.SelectSpec] | None = None, networks: str | None = None) -> None:
        self.host = host
        self.networks_path = networks  # the networks file of the enrichment fields (contract.networks)
        self.reload_requested = False  # set by SIGHUP; the loop reloads between two kernel calls
        self.networks_reloads = 0
        self.networks_reload_errors = 0
        self.control = control  # low_level.host.ondemand.RequestListener: the high level asks for punctuation
        self.on_demand_gap_s = on_demand_gap_s  # rate limit of on-demand punctuation
        # idle = ring empty and no packet for this long: a ring that a fast replay merely drained is not idle
        self.idle_after_s = idle_after_s
        self.last_packet_at = 0.0
        self.last_pump = 0.0
        # partials go to Kafka every pump_every_s (or at pump_records queued); a punctuation goes at once,
        # with everything queued before it, so batching partials longer delays no window's result
        self.pump_every_s = 0.1
        self.pump_records = 65536
        self.punctuated = False
        self.pending: list[list[np.ndarray]] = [[] for _ in queries]  # drained partials not yet submitted
        self.pending_records = 0
        self.queries = queries
        self.ring = Ring(ring_slots)
        self.selects = list(selects or [])  # select queries: rows per packet, low_level.kernel.selection
        self.kernel = Kernel(Tables.build(queries, chunk=chunk), self.selects, nets=self._networks_table())
        # compile before any source starts: a first packet must not wait seconds for the compiler
        took = self.kernel.warm(self.ring)
        if took > 1.0:
            log.info("compiled the packet kernel for %d queries in %.1f s (cached for this query set from now on)",
                     len(queries), took)
        self.emitter = Emitter(queries, host, bootstrap, producer=producer, selects=self.selects,
                               **(emitter_opts or {}))
        # drained partials wait in ``pending`` for at most a small fraction of the backlog's bound, so the
        # memory the uplink may hold stays what max_records says (a Kafka outage sheds as configured)
        self.pending_max = min(self.pump_records, max(64, self.emitter.backlog.max_records // 8))
        self.select_next_timer = [0.0] * len(self.selects)
        self.select_last_on_demand = [0.0] * len(self.selects)
        self.source = None
        if source_spec is not None:
            from low_level.capture.sources import open_source

            self.source = open_source(source_spec, self.ring)
        # On one CPU, a source that can be pulled (a fast pcap replay) is driven from run()'s loop rather
        # than its own thread, pull_frames at a time into a ring of that size: the two threads only took
        # turns on the core, and frames written a 16 MiB ring ahead of the kernel had left the cache by
        # the time it read them (the reader took 1.7x, the kernel 1.1x their time pulled this way).
        self.pull = (self.source is not None and getattr(self.source, "can_pull", False)
                     and hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1)
        if self.pull:  # a fast classic-pcap replay's ring lies over the file: frames are not even copied
            self.ring = self.source.pull_ring(min(self.ring.nslots, self.pull_frames), self.ring.snaplen)
        nq = len(queries)
        self.heartbeats = np.zeros(nq, dtype=np.int64)
        self.heartbeat_flushed = np.zeros(nq, dtype=np.int64)
        self.last_mark_ns = np.zeros(nq, dtype=np.int64)
        self.last_mark_pane = [None] * nq
        self.next_timer = [0.0] * nq
        self.last_on_demand = [0.0] * nq
        self.stopping = False
        self.finished = False
        self.workers = 0  # worker processes of this capture host (set for a worker H/wI; 0: not one)
        self.ledgers = [LossLedger() for _ in queries]  # losses charged to panes, per query
        self.select_ledgers = [LossLedger() for _ in self.selects]
        # the time span of the frames the ring dropped, not yet charged by each query / select
        self.drop_spans: list[tuple[int, int] | None] = [None] * (len(queries) + len(self.selects))

    def drop_counters(self) -> dict[str, int]:
        """The host's cumulative counters of frames lost before any query saw them (low_level.host.losses)."""
        tail = self.source.stats().get("malformed_tail") if self.source is not None else None
        return {"socket": self.source_stat("kernel_drops"), "ring": int(self.ring.drops),
                "malformed": int(self.kernel.err_counts[1:].sum()) + int(bool(tail))}  # a truncated capture's tail

    def drop_span(self, j: int) -> tuple[int, int] | None:
        """The ns span of the ring's dropped frames not yet charged by query j (selects after queries)."""
        got = self.ring.take_drop_span()
        if got is not None:
            self.drop_spans = [got if s is None else (min(s[0], got[0]), max(s[1], got[1])) for s in self.drop_spans]
        span, self.drop_spans[j] = self.drop_spans[j], None
        return span

    def _losses(self, i: int, mark_pane: int, end_of_stream: bool) -> tuple[tuple[int, int, str, int], ...]:
        """Query i's losses since its previous punctuation, charged to panes (taken: counted once)."""
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
        span = self.drop_span(i)
        pspan = None if span is None else ((span[0] - w.origin_ns) // w.pane_ns, (span[1] - w.origin_ns) // w.pane_ns)
        return self.ledgers[i].charge(self.drop_counters(), int(t.qs[i, QS_LATE]),
                                      None if late_min == LATE_NONE else late_min, mark_pane, clock_pane, pspan)

    def _networks_table(self) -> np.ndarray:
        """The lookup table of the networks file (raises ConfigError with file and line for a bad line)."""
        from contract import networks
        from low_level.kernel import lpm

        return lpm.build(networks.load(self.networks_path) if self.networks_path else None)

    def reload_networks(self) -> bool:
        """Re-read the networks file (SIGHUP) and use it from the next packet on; the tables keep their
        state (partials already folded keep the nets they were matched to). A bad file is logged with its
        line and the previous table stays."""
        from contract.query import ConfigError

        self.reload_requested = False
        try:
            table = self._networks_table()
        except ConfigError as exc:
            self.networks_reload_errors += 1
            log.error("networks file not reloaded, keeping the previous one: %s", exc)
            return False
        self.kernel.set_networks(table)
        self.networks_reloads += 1
        log.info("networks file %s reloaded: %d intervals", self.networks_path, table.shape[1])
        return True

    @property
    def live_clock(self) -> bool:
        return bool(getattr(self.source, "live_clock", False))

    def source_stat(self, name: str) -> int:
        if self.source is None:
            return 0
        return int(self.source.stats().get(name, 0))

    def drain(self) -> None:
        """Move every query's emitted partials out of the kernel's output regions (sized for one kernel
        call), into ``pending`` until the next pump or punctuation hands them to the emitter."""
        t = self.kernel.t
        for i in range(len(self.queries)):
            recs = t.drain(i)
            if len(recs):
                self.pending[i].append(recs)
                self.pending_records += len(recs)
        for k, s in enumerate(self.selects):  # select rows go to their outbox at once (before any mark)
            rows = self.kernel.sel_buf.drain(k)
            if len(rows):
                self.emitter.outbox.submit(s.name, rows)

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

    def punctuate_select(self, k: int, idle: bool, end_of_stream: bool = False, timer: bool = True) -> None:
        """Select k's mark is its clock: drain what the kernel selected, raise the mark, queue it after the rows
        (on demand only when it moved; the timer re-sends it for liveness)."""
        self.drain()
        b = self.kernel.sel_buf
        prev = int(b.sst[k, 1])
        mark = b.advance_mark(k, time.time_ns(), idle, self.live_clock, end_of_stream)
        if mark is None or (not timer and mark == prev):
            return
        from low_level.kernel.selection import SS_LATE, SS_LATE_MIN, SS_MATCHED, SS_MAXTS

        stats = {"packets": int(self.kernel.hc[0]), "matched": int(b.sst[k, SS_MATCHED]),
                 "late": int(b.sst[k, SS_LATE]), "ring_drops": int(self.ring.drops),
                 "backlog_lost": int(self.emitter.outbox.lost),
                 "parse_errors": int(self.kernel.err_counts[1:].sum()), "workers": self.workers}
        late_min = int(b.sst[k, SS_LATE_MIN])
        b.sst[k, SS_LATE_MIN] = np.iinfo(np.int64).max
        clock = max(int(b.sst[k, SS_MAXTS]), time.time_ns() if self.live_clock else np.iinfo(np.int64).min)
        clock = None if clock == np.iinfo(np.int64).min else clock
        at = (clock if clock is not None else mark) if end_of_stream else mark
        losses = self.select_ledgers[k].charge(self.drop_counters(), int(b.sst[k, SS_LATE]),
                                               None if late_min == np.iinfo(np.int64).max else late_min, at, clock,
                                               self.drop_span(len(self.queries) + k))  # fmt: skip
        self.emitter.outbox.punctuate(self.selects[k].name, mark, stats, losses)

    def punctuate(self, i: int, idle: bool, timer: bool, end_of_stream: bool = False) -> None:
        q = self.queries[i]
        hold = -(-q.heartbeat.max_disorder_ns // q.window.pane_ns)  # panes the mark waits for disorder
        m = advance(self.kernel, i, time.time_ns(), idle, self.live_clock, end_of_stream, hold_panes=hold)
        if m is not None and m.flushed:
            self.heartbeat_flushed[i] += m.flushed
        self.drain()  # what the mark covers goes first
        self.submit()
        if m is not None and m.ns:
            self.last_mark_pane[i] = m.pane
            self.last_mark_ns[i] = m.ns
        elif not timer or self.last_mark_pane[i] is None:
            return  # on demand only when the mark moved; the timer re-sends it for liveness
        t = self.kernel.t
        stats = {"packets": int(self.kernel.hc[0]), "matched": int(t.qs[i, QS_MATCHED]),
                 "late": int(t.qs[i, QS_LATE]), "evictions": int(t.qs[i, QS_EVICT]),
                 "ring_drops": int(self.ring.drops), "backlog_lost": int(self.emitter.backlog.lost),
                 "parse_errors": int(self.kernel.err_counts[1:].sum()), "workers": self.workers}
        losses = self._losses(i, int(self.last_mark_pane[i]), end_of_stream)
        self.emitter.punctuate(q.name, int(self.last_mark_pane[i]), int(self.last_mark_ns[i]), stats, losses)
        self.heartbeats[i] += 1
        self.punctuated = True

    def step(self) -> int:
        """One loop turn: process what the ring holds, emit, and punctuate by timer or on demand."""
        if self.reload_requested:
            self.reload_networks()
        n = self.kernel.run_ring(self.ring)
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
                self.punctuate(i, idle, timer=False)
            elif self.control and now - self.last_on_demand[i] >= self.on_demand_gap_s and self.control.take(i):
                self.last_on_demand[i] = now  # asked by the blocked consumer: flush below the clock, punctuate
                self.punctuate(i, idle=True, timer=False)
        for k, s in enumerate(self.selects):
            if now >= self.select_next_timer[k]:
                self.select_next_timer[k] = now + s.heartbeat.interval_ns / 1e9
                self.punctuate_select(k, idle)
            elif idle and s.heartbeat.on_demand and now - self.select_last_on_demand[k] >= self.on_demand_gap_s:
                self.select_last_on_demand[k] = now
                self.punctuate_select(k, idle, timer=False)
        if self.pending_records >= self.pending_max:
            self.submit()  # into the backlog, whose merge and bound (max_records) then apply
        if (self.punctuated or now - self.last_pump >= self.pump_every_s
                or self.emitter.backlog.records >= self.pump_records):
            # fewer, larger Kafka batches: the client's work is per message and per request, on the capture core
            self.last_pump = now
            self.punctuated = False
            self.submit()
            self.emitter.pump()
        return n

    def finish(self) -> None:
        """End of a finite source: flush every table and send a closing punctuation."""
        for i in range(len(self.queries)):
            self.punctuate(i, idle=True, timer=False, end_of_stream=True)
        for k in range(len(self.selects)):
            self.punctuate_select(k, idle=True, end_of_stream=True)
        self.emitter.flush()
        self.finished = True

    def summary(self) -> dict[str, Any]:
        """What this agent saw, for the operator at exit (``--summary``): packets, drops, per query."""
        t = self.kernel.t
        return {
            "host": self.emitter.host, "incarnation": int(self.emitter.incarnation), "finished": self.finished,
            "packets": int(self.kernel.hc[0]), "parse_errors": int(self.kernel.err_counts[1:].sum()),
            "ring_drops": int(self.ring.drops), "backlog_lost": int(self.emitter.backlog.lost),
            "source": {k: v for k, v in (self.source.stats() if self.source is not None else {}).items()
                       if isinstance(v, int | float | str)},
            "queries": {q.name: {"matched": int(t.qs[i, QS_MATCHED]), "late": int(t.qs[i, QS_LATE])}
                        for i, q in enumerate(self.queries)},
        }  # fmt: skip

    def run(self, duration_s: float | None = None, exit_at_end: bool = True) -> None:
        pull = self.pull
        if self.source is not None and not pull:
            self.source.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self.stopping and (deadline is None or time.monotonic() < deadline):
                if pull and self.ring.fill == 0:
                    self.source.pull(self.pull_frames)  # type: ignore[union-attr]
                n = self.step()
                if self.source is not None and self.source.finished and self.ring.fill == 0 and n == 0:
                    if not self.finished:
                        self.finish()
                    if exit_at_end:
                        break
                if n == 0:
                    time.sleep(0.0005)
        finally:
            if self.source is not None:
                self.source.stop()
                self.source.join(5)
                if pull:
                    self.source.close()  # no thread releases its file
                log.info("source stopped: %s", self.source.stats())
            if not self.finished:
                self.step()  # what the ring still holds
                # a graceful stop: nothing more comes from this incarnation, so send everything the
                # tables hold, then a mark at the clock, so the windows this host holds open close now
                # rather than after its host timeout (a restart's packets are newer than the clock)
                for i in range(len(self.queries)):
                    self.kernel.flush_below(i, wire.END_OF_STREAM)
                self.drain()
                self.submit()
                for i in range(len(self.queries)):
                    self.punctuate(i, idle=True, timer=True)
                for k in range(len(self.selects)):
                    self.punctuate_select(k, idle=True)
            self.emitter.flush(10)
            self.emitter.close()


def watch_sighup(agent: Agent) -> None:
    """SIGHUP reloads the networks file at the loop's next turn (never inside a kernel call)."""

    def _hup(*_: object) -> None:
        agent.reload_requested = True

    signal.signal(signal.SIGHUP, _hup)


def parse_args(argv: list[str] | None = None) -> tuple[dict[str, Any], str | None]:
    """The flags the user gave (as settings fields) and the settings file, if any."""
    ap = argparse.ArgumentParser(prog="lowwater-agent", description="lowwater capture-host agent. Every flag can "
                                 "also be set as LOWWATER_AGENT_<FLAG> or in --settings FILE.")  # fmt: skip
    ap.add_argument("--settings", help="YAML file of settings (field names as the flags, with _)")
    ap.add_argument("--config", help="queries YAML (default configs/default.yaml)")
    ap.add_argument("--query", dest="queries", action="append", help="run only these queries (default: all)")
    ap.add_argument("--source", help="generator[:k=v,...] | pcap:PATH[,loop][,paced] | afpacket:IF[+IF][,promisc]")
    ap.add_argument("--host-id", help="this capture host's id (default: the host name)")
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default 127.0.0.1:9092)")
    ap.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default 9101; 0 = off)")
    ap.add_argument("--ring-slots", type=int)
    ap.add_argument("--duration", type=float, help="stop after this many seconds")
    ap.add_argument("--linger", action="store_true", default=None, help="keep running (heartbeats) after a finite source ends")
    ap.add_argument("--kafka-security", metavar="JSON",
                    help="the Kafka security block (protocol, sasl_mechanism, username, password, ca_file, cert_file, "
                         "key_file, check_hostname); see deploy/SECURITY.md")
    ap.add_argument("--control-topic",
                    help="answer punctuation requests of the high level on this topic (e.g. lowwater.control)")
    ap.add_argument("--summary", metavar="FILE",
                    help="write what the agent saw (packets, drops, matches per query) to FILE as JSON at exit")
    ap.add_argument("--workers", type=int, help="worker processes on this host (AF_PACKET fanout or a replay split "
                    "by flow; each punctuates as host H/wI); default: half the cores for afpacket, else 1")
    ap.add_argument("--fanout", choices=("hash", "cpu"), help="AF_PACKET fanout mode of the workers (default hash)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # INDEX/COUNT/GROUP, set by the supervisor
    a = ap.parse_args(argv)
    flags = {k: v for k, v in vars(a).items() if v is not None and k not in ("settings", "kafka_security")}
    if a.kafka_security is not None:
        import json

        try:
            flags["kafka_security"] = json.loads(a.kafka_security)
        except ValueError as exc:
            raise SystemExit(f"lowwater-agent: --kafka-security is not JSON: {exc}") from None
    return flags, a.settings


def main(argv: list[str] | None = None) -> None:
    from contract.settings import SettingsError, load
    from low_level.settings import AgentSettings

    flags, settings_file = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        s = load(AgentSettings, flags, settings_file)
        cfg = Q.load(s.config)
    except (SettingsError, Q.ConfigError) as exc:
        raise SystemExit(f"lowwater-agent: {exc}") from None
    named = [q for q in cfg.queries if not s.queries or q.name in s.queries]
    named_selects = [q for q in cfg.selects if not s.queries or q.name in s.queries]
    if not named and not named_selects:
        raise SystemExit(f"lowwater-agent: no query named {s.queries} in {s.config}")
    from low_level.capture import workers as W

    worker = W.parse_worker(s.worker) if s.worker else None
    nworkers = s.workers or W.default_workers(s.source)
    capture_host = s.host_id.rpartition("/w")[0] if worker else s.host_id
    # a query's `sources` name the hosts that run it; a worker H/wI runs what H runs (and what H/wI does)
    hosts = {s.host_id, capture_host}
    if nworkers > 1 and not worker:
        hosts |= {W.worker_host_id(s.host_id, i) for i in range(nworkers)}
    queries = [q for q in named if any(q.runs_on(h) for h in hosts)]
    selects = [q for q in named_selects if any(q.runs_on(h) for h in hosts)]
    for q in named:
        if q not in queries:
            log.info("query %s does not run on host %s (sources: %s)", q.name, s.host_id, ", ".join(q.sources))
    if not queries and not selects:
        raise SystemExit(f"lowwater-agent: host {s.host_id!r} matches the sources of none of the queries in {s.config}")
    if nworkers > 1 and worker is None:
        try:
            parse_source(s.source)
        except ValueError as exc:
            raise SystemExit(f"lowwater-agent: cannot open source {s.source!r}: {exc}") from None
        raise SystemExit(W.supervise(list(sys.argv[1:] if argv is None else argv), s.host_id, nworkers, s.source,
                                     s.metrics_port, s.summary))  # fmt: skip
    opts: dict[str, Any] = {"producer_config": s.kafka_security.kafka_python()}
    control = None
    if s.control_topic:
        from low_level.host.ondemand import RequestListener

        control = RequestListener(s.host_id, queries, s.bootstrap, topic=s.control_topic,
                                  consumer_config=opts["producer_config"]).start()
    try:
        spec = parse_source(s.source)
        if spec["type"] == "flows":
            from low_level.flows.agent import FlowAgent

            if worker:
                raise SystemExit("lowwater-agent: a flow collector runs as one process (--workers 1)")

            if selects:
                raise SystemExit("lowwater-agent: select queries need packets; a flow source has none "
                                 f"({', '.join(x.name for x in selects)})")
            agent: Any = FlowAgent(queries, spec, s.host_id, s.bootstrap, emitter_opts=opts, networks=cfg.networks)
        else:
            agent = Agent(queries, None if worker else spec, s.host_id, s.bootstrap, ring_slots=s.ring_slots,
                          emitter_opts=opts, control=control, selects=selects, networks=cfg.networks)
            if worker:  # a fanout member (live) or a flow share (replay): low_level/capture/fanout.py
                from low_level.capture.fanout import worker_source

                agent.source = worker_source(spec, agent.ring, *worker, fanout=s.fanout)
                agent.workers = int(worker[1])  # the high level waits for every worker of an expected host
    except Q.ConfigError as exc:  # a bad networks file: file, line and reason
        raise SystemExit(f"lowwater-agent: {exc}") from None
    except (OSError, ValueError) as exc:  # a missing capture file, an unknown interface, a bad source spec
        raise SystemExit(f"lowwater-agent: cannot open source {s.source!r}: {exc}") from None
    if s.metrics_port and isinstance(agent, Agent):  # the flow collector reports in --summary only, for now
        from prometheus_client import REGISTRY, start_http_server

        from low_level.host.metrics import AgentCollector

        REGISTRY.register(AgentCollector(agent))
        start_http_server(s.metrics_port)

    def _stop(*_: object) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watch_sighup(agent)
    log.info("host %s: %d queries, %d select queries, source %s, Kafka %s", s.host_id, len(queries), len(selects),
             s.source, s.bootstrap)
    agent.run(s.duration, exit_at_end=not s.linger)
    if s.summary:
        import json
        from pathlib import Path

        Path(s.summary).write_text(json.dumps(agent.summary(), indent=1))


if __name__ == "__main__":
    main()
