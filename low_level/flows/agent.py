"""A flow-collector host: NetFlow/IPFIX datagrams -> decode -> weighted sub-aggregation -> punctuate -> emit.

The same loop (``low_level.host.loop``: drain, punctuation, reload, stop, summary, metrics), tables, flush
policies, wire format and emitter as the packet agent (``low_level.host.agent``); what differs is the
source (``low_level.flows.source``), the kernel (the weighted variant, ``low_level.flows.kernel``) and the
clock of the low-water mark: the exporters' clocks minus the inactive timeout and slack they promise, not
the largest record time seen (records of one exporter come in end-time order only roughly, and several
exporters interleave).

Run it as ``lowwater-agent --source flows:0.0.0.0:2055[,inactive=15,slack=2]`` (seconds).
"""

from __future__ import annotations

import logging
import select
import time
from typing import Any

from contract import query as Q
from low_level.flows.kernel import FlowKernel
from low_level.flows.layout import D_CLOCK, D_VALID
from low_level.flows.source import FlowCollector, FlowTimeouts
from low_level.host.emit import Emitter
from low_level.host.loop import HostLoop
from low_level.host.punctuate import Mark
from low_level.kernel.tables import Tables

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


class FlowAgent(HostLoop):
    """One flow-collector host: owns the collector, the tables, the weighted kernel and the emitter."""

    idle_sleep_s = 0.001
    batch_wait_s = 0.05  # the longest a receive gathers a batch while export flows (see process)

    def __init__(
        self,
        queries: list[Q.QuerySpec],
        spec: dict[str, Any],
        host: str,
        bootstrap: str | None,
        chunk: int = 1 << 14,
        producer: object | None = None,
        emitter_opts: dict[str, Any] | None = None,
        networks: str | None = None,
    ) -> None:
        super().__init__(queries, host, networks)
        t = FlowTimeouts()
        t.inactive_ns = int(spec.get("inactive", t.inactive_ns / 1e9) * 1e9)
        t.slack_ns = int(spec.get("slack", t.slack_ns / 1e9) * 1e9)
        t.exporter_timeout_ns = int(spec.get("exporter_timeout", t.exporter_timeout_ns / 1e9) * 1e9)
        t.template_timeout_s = int(spec.get("template_timeout", t.template_timeout_s))
        self.collector = FlowCollector(spec.get("host", "0.0.0.0"), int(spec.get("port", 2055)), t).open()
        self.kernel = FlowKernel(Tables.build(queries, chunk=chunk), nets=self._networks_table())
        self.kernel.warm()  # compile before the first datagram, as the packet agent does
        self.collector.warm()
        self.kernel.warm_take(self.collector)
        self._flowing = False  # the last turn's receive took datagrams: the next one waits for a batch
        self._due = 0.0  # the earliest query timer (next_due), so a turn with none due skips them
        self.emitter = Emitter(queries, host, bootstrap, producer=producer, **(emitter_opts or {}))
        self._bound_pending()

    def records_in(self) -> int:
        return int(self.collector.records)

    def records_captured(self) -> int:
        return int(self.collector.records)

    def ring_fill(self) -> int:
        return int(self.collector.pending)

    def parse_error_counts(self) -> dict[str, int]:
        return dict(self.collector.stats()["errors"])

    def source_stats(self) -> dict[str, Any]:
        return self.collector.stats()

    def _exporters_now(self) -> int | None:
        """The newest exporter clock: exporters that far behind it by exporter_timeout stop holding the mark."""
        d = self.collector.doms
        live = d[:, D_VALID] == 1
        return int(d[live, D_CLOCK].max()) if live.any() else None

    def punctuate(
        self,
        i: int,
        idle: bool = True,
        timer: bool = True,
        end_of_stream: bool = False,
        clock_ns: int | None = None,
    ) -> Mark | None:
        """The mark follows the exporters' clocks (minus what they promise), never the records' times; no
        mark before the first exporter spoke."""
        clock = self.collector.clock_mark_ns(self._exporters_now())
        if clock is None and not end_of_stream:
            return None
        return super().punctuate(i, idle=True, timer=True, end_of_stream=end_of_stream, clock_ns=clock)

    def process(self) -> int:
        """Receive, decode and fold a batch; punctuate on each query's timer; emit.

        While export flows (the previous turn took datagrams) the receive gathers a batch until it is full,
        the export pauses or ``batch_wait_s`` passes (never past the next timer), so a slow export costs
        one Python turn per batch, not one per short sleep (``low_level.flows.receive``). After an empty
        turn it only looks (``idle_wait`` waits on the socket)."""
        c = self.collector
        wait = 0.0
        if self._flowing:
            wait = min(self.batch_wait_s, self.next_due() - time.monotonic())
        got = c.receive(wait)
        self._flowing = got > 0
        n = self.kernel.take(c, self._after_chunk) if c.pending else 0
        now = time.monotonic()
        if now >= self._due:
            for i, q in enumerate(self.queries):
                if now >= self.next_timer[i]:
                    self.next_timer[i] = now + q.heartbeat.interval_ns / 1e9
                    self.punctuate(i)
            self._due = self.next_due()
        if self.pending_records:
            self.submit()
        self.emitter.pump()
        return n

    def idle_wait(self, empty: int) -> float:
        """An empty turn waits on the socket itself (at most the loop's idle wait) rather than sleeping:
        export after a quiet spell is taken at once, before a burst can overflow the socket's buffer."""
        wait = super().idle_wait(empty)
        if wait > 0 and self.collector.sock is not None:
            select.select([self.collector.sock], [], [], wait)
        return 0.0

    def _after_chunk(self) -> None:
        self.drain()
        if self.pending_records >= self.pending_max:
            self.submit()

    def close_source(self) -> None:
        self.collector.close()
        log.info("flow source stopped: %s", self.collector.stats())
