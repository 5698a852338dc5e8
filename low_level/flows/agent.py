"""A flow-collector host: NetFlow/IPFIX datagrams -> decode -> weighted sub-aggregation -> punctuate -> emit.

The same loop shape, tables, flush policies, wire format and emitter as the packet agent
(``low_level.host.agent``); what differs is the source (``low_level.flows.source``), the kernel (the weighted
variant, ``low_level.flows.kernel``) and the clock of the low-water mark: the exporters' clocks minus the
inactive timeout and slack they promise, not the largest record time seen (records of one exporter come
in end-time order only roughly, and several exporters interleave).

Run it as ``lowwater-agent --source flows:0.0.0.0:2055[,inactive=15,slack=2]`` (seconds).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from contract import query as Q
from contract import wire
from low_level.flows.kernel import FlowKernel
from low_level.flows.source import FlowCollector, FlowTimeouts
from low_level.host.emit import Emitter
from low_level.host.punctuate import advance
from low_level.kernel.tables import QS_EVICT, QS_LATE, QS_MATCHED, Tables

log = logging.getLogger("lowwater.flowagent")


def parse_flow_source(rest: str) -> dict[str, Any]:
    """'HOST:PORT[,inactive=S][,slack=S][,exporter_timeout=S][,template_timeout=S]' -> spec."""
    addr, *opts = rest.split(",")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError("flows source needs an address: flows:0.0.0.0:2055[,inactive=15][,slack=2]")
    spec: dict[str, Any] = {"type": "flows", "host": host.strip("[]"), "port": int(port)}
    for o in opts:
        k, _, v = o.partition("=")
        if k not in ("inactive", "slack", "exporter_timeout", "template_timeout"):
            raise ValueError(f"unknown flows source option {k!r}")
        spec[k] = float(v)
    return spec


class FlowAgent:
    """One flow-collector host: owns the collector, the tables, the weighted kernel and the emitter."""

    def __init__(self, queries: list[Q.QuerySpec], spec: dict[str, Any], host: str, bootstrap: str | None,
                 chunk: int = 1 << 14, producer: object | None = None, emitter_opts: dict[str, Any] | None = None,
                 networks: str | None = None) -> None:  # fmt: skip
        self.host = host
        self.queries = queries
        self.networks_path = networks
        self.reload_requested = False
        t = FlowTimeouts()
        t.inactive_ns = int(spec.get("inactive", t.inactive_ns / 1e9) * 1e9)
        t.slack_ns = int(spec.get("slack", t.slack_ns / 1e9) * 1e9)
        t.exporter_timeout_ns = int(spec.get("exporter_timeout", t.exporter_timeout_ns / 1e9) * 1e9)
        t.template_timeout_s = int(spec.get("template_timeout", t.template_timeout_s))
        self.collector = FlowCollector(spec.get("host", "0.0.0.0"), int(spec.get("port", 2055)), t).open()
        self.kernel = FlowKernel(Tables.build(queries, chunk=chunk), nets=self._networks_table())
        self.kernel.warm()  # compile before the first datagram, as the packet agent does
        self.collector.warm()
        self.emitter = Emitter(queries, host, bootstrap, producer=producer, **(emitter_opts or {}))
        self.next_timer = [0.0] * len(queries)
        self.last_mark_pane: list[int | None] = [None] * len(queries)
        self.last_mark_ns = [0] * len(queries)
        self.stopping = False
        self.finished = False

    def _networks_table(self) -> np.ndarray:
        from contract import networks
        from low_level.kernel import lpm

        return lpm.build(networks.load(self.networks_path) if self.networks_path else None)

    def reload_networks(self) -> bool:
        self.reload_requested = False
        try:
            self.kernel.set_networks(self._networks_table())
        except Q.ConfigError as exc:
            log.error("networks file not reloaded, keeping the previous one: %s", exc)
            return False
        return True

    def drain(self) -> None:
        t = self.kernel.t
        for i, q in enumerate(self.queries):
            recs = t.drain(i)
            if len(recs):
                pane, key, state = t.split(i, recs)
                self.emitter.submit(q.name, pane, key, state)

    def _exporters_now(self) -> int | None:
        """The newest exporter clock: exporters that far behind it by exporter_timeout stop holding the mark."""
        from low_level.flows.decode import D_CLOCK, D_VALID

        d = self.collector.doms
        live = d[:, D_VALID] == 1
        return int(d[live, D_CLOCK].max()) if live.any() else None

    def punctuate(self, i: int, end_of_stream: bool = False) -> None:
        clock = self.collector.clock_mark_ns(self._exporters_now())
        if clock is None and not end_of_stream:
            return
        m = advance(self.kernel, i, time.time_ns(), True, False, end_of_stream, clock_ns=clock)  # type: ignore[arg-type]
        self.drain()
        if m is not None and m.ns:
            self.last_mark_pane[i], self.last_mark_ns[i] = m.pane, m.ns
        if self.last_mark_pane[i] is None:
            return
        t = self.kernel.t
        st = self.collector.stats()
        stats = {"packets": int(self.collector.records), "matched": int(t.qs[i, QS_MATCHED]),
                 "late": int(t.qs[i, QS_LATE]), "evictions": int(t.qs[i, QS_EVICT]), "ring_drops": 0,
                 "backlog_lost": int(self.emitter.backlog.lost), "parse_errors": sum(st["errors"].values())}
        self.emitter.punctuate(self.queries[i].name, int(self.last_mark_pane[i]), int(self.last_mark_ns[i]), stats)

    def step(self) -> int:
        """Receive, decode and fold what the socket holds; punctuate on each query's timer."""
        if self.reload_requested:
            self.reload_networks()
        self.collector.receive()
        n = 0
        chunk = self.kernel.t.chunk
        while self.collector.pending:
            b = self.collector.decode()
            for s in range(0, b.n, chunk):
                e = min(b.n, s + chunk)
                self.kernel.run(b.rows[s:e], b.weights[s:e], e - s)
                self.drain()
            n += b.n
        now = time.monotonic()
        for i, q in enumerate(self.queries):
            if now >= self.next_timer[i]:
                self.next_timer[i] = now + q.heartbeat.interval_ns / 1e9
                self.punctuate(i)
        self.emitter.pump()
        return n

    def summary(self) -> dict[str, Any]:
        t = self.kernel.t
        return {"host": self.emitter.host, "source": self.collector.stats(),
                "queries": {q.name: {"matched": int(t.qs[i, QS_MATCHED]), "late": int(t.qs[i, QS_LATE])}
                            for i, q in enumerate(self.queries)}}  # fmt: skip

    def run(self, duration_s: float | None = None, exit_at_end: bool = True) -> None:
        """Collect until stopped (or for duration_s); a stop sends everything held and a closing mark."""
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while not self.stopping and (deadline is None or time.monotonic() < deadline):
                if self.step() == 0:
                    time.sleep(0.001)
        finally:
            self.step()
            for i in range(len(self.queries)):
                self.kernel.flush_below(i, wire.END_OF_STREAM)
            self.drain()
            for i in range(len(self.queries)):
                self.punctuate(i)
            self.emitter.flush(10)
            self.emitter.close()
            self.collector.close()
            log.info("flow source stopped: %s", self.collector.stats())
