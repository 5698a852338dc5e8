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
from low_level.emit import Emitter
from low_level.kernel import Kernel
from low_level.punctuate import advance
from low_level.ring import Ring
from low_level.tables import QS_EVICT, QS_LATE, QS_MATCHED, Tables

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
    raise ValueError(f"unknown source {text!r}: use generator, pcap:PATH or afpacket:IFACE")


class Agent:
    """One capture host: owns the ring, the tables, the kernel, the emitter and the heartbeat clock."""

    def __init__(self, queries: list[Q.QuerySpec], source_spec: dict[str, Any] | None, host: str,
                 bootstrap: str | None, ring_slots: int = 1 << 18, chunk: int = 1 << 16,
                 producer: object | None = None, emitter_opts: dict[str, Any] | None = None,
                 on_demand_gap_s: float = 0.01, idle_after_s: float = 0.005, control: Any = None) -> None:
        self.host = host
        self.control = control  # low_level.ondemand.RequestListener: the high level asks for punctuation
        self.on_demand_gap_s = on_demand_gap_s  # rate limit of on-demand punctuation
        # idle = ring empty and no packet for this long: a ring that a fast replay merely drained is not idle
        self.idle_after_s = idle_after_s
        self.last_packet_at = 0.0
        self.last_pump = 0.0
        self.pump_every_s = 0.02
        self.queries = queries
        self.ring = Ring(ring_slots)
        self.kernel = Kernel(Tables.build(queries, chunk=chunk))
        # compile before any source starts: a first packet must not wait seconds for the compiler
        took = self.kernel.warm(self.ring)
        if took > 1.0:
            log.info("compiled the packet kernel for %d queries in %.1f s (cached for this query set from now on)",
                     len(queries), took)
        self.emitter = Emitter(queries, host, bootstrap, producer=producer, **(emitter_opts or {}))
        self.source = None
        if source_spec is not None:
            from low_level.sources import open_source

            self.source = open_source(source_spec, self.ring)
        nq = len(queries)
        self.heartbeats = np.zeros(nq, dtype=np.int64)
        self.heartbeat_flushed = np.zeros(nq, dtype=np.int64)
        self.last_mark_ns = np.zeros(nq, dtype=np.int64)
        self.last_mark_pane = [None] * nq
        self.next_timer = [0.0] * nq
        self.last_on_demand = [0.0] * nq
        self.stopping = False
        self.finished = False

    @property
    def live_clock(self) -> bool:
        return bool(getattr(self.source, "live_clock", False))

    def source_stat(self, name: str) -> int:
        if self.source is None:
            return 0
        return int(self.source.stats().get(name, 0))

    def drain(self) -> None:
        """Move every query's emitted partials from the kernel's output regions to the emitter."""
        t = self.kernel.t
        for i, q in enumerate(self.queries):
            recs = t.drain(i)
            if len(recs):
                pane, key, state = t.split(i, recs)
                self.emitter.submit(q.name, pane, key, state)

    def punctuate(self, i: int, idle: bool, timer: bool, end_of_stream: bool = False) -> None:
        q = self.queries[i]
        m = advance(self.kernel, i, time.time_ns(), idle, self.live_clock, end_of_stream)
        if m is not None and m.flushed:
            self.heartbeat_flushed[i] += m.flushed
        self.drain()  # what the mark covers goes first
        if m is not None and m.ns:
            self.last_mark_pane[i] = m.pane
            self.last_mark_ns[i] = m.ns
        elif not timer or self.last_mark_pane[i] is None:
            return  # on demand only when the mark moved; the timer re-sends it for liveness
        t = self.kernel.t
        stats = {"packets": int(self.kernel.hc[0]), "matched": int(t.qs[i, QS_MATCHED]),
                 "late": int(t.qs[i, QS_LATE]), "evictions": int(t.qs[i, QS_EVICT]),
                 "ring_drops": int(self.ring.drops), "backlog_lost": int(self.emitter.backlog.lost),
                 "parse_errors": int(self.kernel.err_counts[1:].sum())}
        self.emitter.punctuate(q.name, int(self.last_mark_pane[i]), int(self.last_mark_ns[i]), stats)
        self.heartbeats[i] += 1

    def step(self) -> int:
        """One loop turn: process what the ring holds, emit, and punctuate by timer or on demand."""
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
        if now - self.last_pump >= self.pump_every_s or self.emitter.backlog.records >= 16384:
            self.last_pump = now  # fewer, larger Kafka batches: less per-message work on the capture core
            self.emitter.pump()
        return n

    def finish(self) -> None:
        """End of a finite source: flush every table and send a closing punctuation."""
        for i in range(len(self.queries)):
            self.punctuate(i, idle=True, timer=False, end_of_stream=True)
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
        if self.source is not None:
            self.source.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self.stopping and (deadline is None or time.monotonic() < deadline):
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
                log.info("source stopped: %s", self.source.stats())
            if not self.finished:
                self.step()  # what the ring still holds
                # a graceful stop: nothing more comes from this incarnation, so send everything the
                # tables hold, then a mark at the clock, so the windows this host holds open close now
                # rather than after its host timeout (a restart's packets are newer than the clock)
                for i in range(len(self.queries)):
                    self.kernel.flush_below(i, wire.END_OF_STREAM)
                self.drain()
                for i in range(len(self.queries)):
                    self.punctuate(i, idle=True, timer=True)
            self.emitter.flush(10)
            self.emitter.close()


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
    if not named:
        raise SystemExit(f"lowwater-agent: no query named {s.queries} in {s.config}")
    from low_level import workers as W

    worker = W.parse_worker(s.worker) if s.worker else None
    nworkers = s.workers or W.default_workers(s.source)
    capture_host = s.host_id.rpartition("/w")[0] if worker else s.host_id
    # a query's `sources` name the hosts that run it; a worker H/wI runs what H runs (and what H/wI does)
    hosts = {s.host_id, capture_host}
    if nworkers > 1 and not worker:
        hosts |= {W.worker_host_id(s.host_id, i) for i in range(nworkers)}
    queries = [q for q in named if any(q.runs_on(h) for h in hosts)]
    for q in named:
        if q not in queries:
            log.info("query %s does not run on host %s (sources: %s)", q.name, s.host_id, ", ".join(q.sources))
    if not queries:
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
        from low_level.ondemand import RequestListener

        control = RequestListener(s.host_id, queries, s.bootstrap, topic=s.control_topic,
                                  consumer_config=opts["producer_config"]).start()
    try:
        spec = parse_source(s.source)
        agent = Agent(queries, None if worker else spec, s.host_id, s.bootstrap,
                      ring_slots=s.ring_slots, emitter_opts=opts, control=control)
        if worker:  # a fanout member (live) or a flow share (replay): low_level/fanout.py
            from low_level.fanout import worker_source

            agent.source = worker_source(spec, agent.ring, *worker, fanout=s.fanout)
    except (OSError, ValueError) as exc:  # a missing capture file, an unknown interface, a bad source spec
        raise SystemExit(f"lowwater-agent: cannot open source {s.source!r}: {exc}") from None
    if s.metrics_port:
        from prometheus_client import REGISTRY, start_http_server

        from low_level.metrics import AgentCollector

        REGISTRY.register(AgentCollector(agent))
        start_http_server(s.metrics_port)

    def _stop(*_: object) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("host %s: %d queries, source %s, Kafka %s", s.host_id, len(queries), s.source, s.bootstrap)
    agent.run(s.duration, exit_at_end=not s.linger)
    if s.summary:
        import json
        from pathlib import Path

        Path(s.summary).write_text(json.dumps(agent.summary(), indent=1))


if __name__ == "__main__":
    main()
