"""NetFlow v5 / v9 / IPFIX over UDP as a low-level source: datagrams in, weighted flow rows out.

Unlike the packet sources this one does not fill the frame ring: a datagram carries tens of records, so
datagrams are received into one flat buffer (one ``recvfrom_into`` each, never a Python step per record)
and decoded in batches by ``low_level.flows.decode``; the rows go to ``low_level.flows.kernel``.

**Punctuation.** Each exporter (address, observation domain) is a capture host in OOP terms. Its clock
is the export time in its datagram headers. An exporter sends a record at the latest ``inactive``
after the record's last packet (idle flows) and, for long flows, every ``active`` with the end time
near the export time; so once an exporter's clock reads C, every record it still has to send ends
after ``C - inactive - slack`` (slack: the exporter's expiry scan interval and clock granularity). The
collector's low-water mark is the minimum of that over the exporters heard within ``exporter_timeout``
(a silent exporter stops holding the mark back, like a dead capture host). Records that end before the
mark promised when they arrive are ``late_records``; the kernel drops and counts them as late like
late packets.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import fields as F
from low_level.flows import decode as D


@dataclass
class FlowTimeouts:
    """What the exporters promise (their configured timeouts), in ns."""

    inactive_ns: int = 15_000_000_000
    active_ns: int = 60_000_000_000
    slack_ns: int = 2_000_000_000
    exporter_timeout_ns: int = 300_000_000_000
    template_timeout_s: int = 1800


@dataclass
class FlowBatch:
    rows: np.ndarray  # (n, NFIELDS) parsed-packet rows, TS = end time, LEN = bytes (sampled up)
    weights: np.ndarray  # packets (sampled up)
    sampling_rate: np.ndarray
    n: int


@dataclass
class FlowCollector:
    """Receive and decode flow export; the template/domain state lives here across batches."""

    host: str = "127.0.0.1"
    port: int = 0
    timeouts: FlowTimeouts = field(default_factory=FlowTimeouts)
    capacity: int = 1 << 16  # records per batch
    buffer_bytes: int = 1 << 22

    def __post_init__(self) -> None:
        self.tmpl, self.doms = D.new_state()
        self.errs = np.zeros(D.NFLOWERR, dtype=np.int64)
        self.exporters: dict[Any, int] = {}
        self.exp_addr = np.zeros(64, dtype=np.int64)  # per exporter id: its IPv4 address as u32, else 0
        self.buf = np.zeros(self.buffer_bytes, dtype=np.uint8)
        self._offs: list[int] = []
        self._lens: list[int] = []
        self._exps: list[int] = []
        self._arrs: list[int] = []
        self.ctrs = np.zeros((self.capacity, D.CW), dtype=np.int64)
        # latest sFlow interface counters per (source row, ifIndex): {(d, ifindex): ctrs row}
        self.interfaces: dict[tuple[int, int], np.ndarray] = {}
        self.rows = np.zeros((self.capacity, F.NFIELDS), dtype=np.int64)
        self.weights = np.zeros(self.capacity, dtype=np.int64)
        self.rate = np.zeros(self.capacity, dtype=np.int64)
        self.res = np.zeros(4, dtype=np.int64)
        self.datagrams = 0
        self.records = 0
        self.late_records = 0
        self.mark_ns: int | None = None
        self.sock: socket.socket | None = None

    # --- receiving
    def open(self) -> FlowCollector:
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        s.bind((self.host, self.port))
        s.setblocking(False)
        self.sock = s
        self.port = s.getsockname()[1]
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def receive(self, max_datagrams: int = 4096) -> int:
        """Take what the socket holds (without waiting) into the buffer; returns datagrams taken."""
        assert self.sock is not None, "open() first"
        got = 0
        view = memoryview(self.buf)
        while got < max_datagrams:
            off = self._offs[-1] + self._lens[-1] if self._offs else 0
            if off + 65536 > len(self.buf):
                break
            try:
                n, addr = self.sock.recvfrom_into(view[off : off + 65536])
            except (BlockingIOError, InterruptedError):
                break
            self.add(off, n, addr, time.time_ns())
            got += 1
        return got

    def add(self, off: int, n: int, exporter: Any, arrival_ns: int) -> None:
        """Queue the datagram at buf[off:off+n] from this exporter (its address), received at arrival_ns
        (sFlow carries no time: its samples are timed by arrival), for the next decode."""
        self._arrs.append(arrival_ns)
        self._offs.append(off)
        self._lens.append(n)
        e = self.exporters.get(exporter)
        if e is None:
            e = self.exporters[exporter] = len(self.exporters)
            if e >= len(self.exp_addr):
                self.exp_addr = np.concatenate([self.exp_addr, np.zeros_like(self.exp_addr)])
            self.exp_addr[e] = _ipv4_u32(exporter)
        self._exps.append(e)

    def feed(
        self, datagrams: list[bytes], exporter: Any = ("127.0.0.1", 0), arrival_ns: int | None = None
    ) -> None:
        """Queue datagrams given as bytes (tests, replay of a recorded export), all received at arrival_ns
        (now when None)."""
        t = time.time_ns() if arrival_ns is None else arrival_ns
        for d in datagrams:
            off = self._offs[-1] + self._lens[-1] if self._offs else 0
            self.buf[off : off + len(d)] = np.frombuffer(d, dtype=np.uint8)
            self.add(off, len(d), exporter, t)

    @property
    def pending(self) -> int:
        return len(self._offs)

    # --- decoding
    def warm(self) -> None:
        """Compile the decoder now (no datagrams), before the first export arrives."""
        D.decode(
            self.buf,
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            0,
            self.tmpl,
            self.doms,
            1,
            self.rows,
            self.weights,
            self.rate,
            self.ctrs,
            self.errs,
            self.res,
            self.exp_addr,
        )

    def decode(self) -> FlowBatch:
        """Decode the queued datagrams (all of them, or as many as fill one batch of records)."""
        n = len(self._offs)
        offs = np.array(self._offs, dtype=np.int64)
        lens = np.array(self._lens, dtype=np.int64)
        exps = np.array(self._exps, dtype=np.int64)
        arrs = np.array(self._arrs, dtype=np.int64)
        D.decode(
            self.buf,
            offs,
            lens,
            exps,
            arrs,
            n,
            self.tmpl,
            self.doms,
            self.timeouts.template_timeout_s,
            self.rows,
            self.weights,
            self.rate,
            self.ctrs,
            self.errs,
            self.res,
            self.exp_addr,
        )
        for c in self.ctrs[: int(self.res[2])]:
            self.interfaces[(int(c[D.C_DOM]), int(c[D.C_IFINDEX]))] = c.copy()
        nrec, used = int(self.res[0]), int(self.res[1])
        rest = (self._offs[used:], self._lens[used:], self._exps[used:])
        self._arrs = self._arrs[used:]
        if rest[0]:  # keep the undecoded datagrams, moved to the buffer's start
            start = rest[0][0]
            stop = rest[0][-1] + rest[1][-1]
            self.buf[: stop - start] = self.buf[start:stop].copy()
            self._offs = [o - start for o in rest[0]]
            self._lens, self._exps = list(rest[1]), list(rest[2])
        else:
            self._offs, self._lens, self._exps = [], [], []
        self.datagrams += used
        self.records += nrec
        if self.mark_ns is not None and nrec:
            self.late_records += int((self.rows[:nrec, F.TS] < self.mark_ns).sum())
        return FlowBatch(self.rows, self.weights, self.rate, nrec)

    # --- punctuation
    def clock_mark_ns(self, now_ns: int | None = None) -> int | None:
        """The low-water mark the exporters' clocks and timeouts promise (see the module docstring).

        ``now_ns`` (an exporter-clock reading of "now") lets exporters silent for longer than
        ``exporter_timeout`` stop holding the mark; None keeps every exporter ever heard.
        """
        live = self.doms[:, D.D_VALID] == 1
        t = self.timeouts
        # a NetFlow record may end up to inactive + slack before its exporter's clock; an sFlow sample is
        # timed by its datagram's arrival, so nothing an agent still sends is older than its last arrival
        lag = np.where(self.doms[live, D.D_KIND] == D.KIND_SFLOW, 0, t.inactive_ns) + t.slack_ns
        clocks = self.doms[live, D.D_CLOCK]
        if now_ns is not None:
            keep = clocks >= now_ns - t.exporter_timeout_ns
            clocks, lag = clocks[keep], lag[keep]
        if not len(clocks):
            return None
        mark = int((clocks - lag).min())
        if self.mark_ns is None or mark > self.mark_ns:
            self.mark_ns = mark
        return self.mark_ns

    def source_name(self, d: int) -> str:
        """A source row's name: 'exporter/domain' (NetFlow, IPFIX) or 'sflow:agent/sub-agent'."""
        row = self.doms[d]
        if row[D.D_KIND] == D.KIND_SFLOW:
            return (
                f"sflow:{F.words_to_ip(int(row[D.D_AGENT_HI]), int(row[D.D_AGENT_LO]))}/{int(row[D.D_DOM])}"
            )
        names = {v: k for k, v in self.exporters.items()}
        return f"{names.get(int(row[D.D_EXP]), int(row[D.D_EXP]))}/{int(row[D.D_DOM])}"

    def stats(self) -> dict[str, Any]:
        """Counters for metrics and the agent summary; ``sampling_rate`` per exporter and domain."""
        rates = {
            self.source_name(d): int(self.doms[d, D.D_RATE]) for d in np.flatnonzero(self.doms[:, D.D_VALID])
        }
        interfaces = [
            {
                "source": self.source_name(d),
                "ifindex": i,
                "speed": int(c[D.C_SPEED]),
                "status": int(c[D.C_STATUS]),
            }
            | {k: int(c[D.C_IN_OCTETS + j]) for j, k in enumerate(D.COUNTER_NAMES)}
            for (d, i), c in sorted(self.interfaces.items())
        ]
        per_source = {
            self.source_name(d): {
                "datagrams": int(self.doms[d, D.D_DATAGRAMS]),
                "records": int(self.doms[d, D.D_RECORDS]),
                "templates": int(
                    (
                        (self.tmpl[:, D.T_VALID] == 1)
                        & (self.tmpl[:, D.T_EXP] == self.doms[d, D.D_EXP])
                        & (self.tmpl[:, D.T_DOM] == self.doms[d, D.D_DOM])
                    ).sum()
                )
                if self.doms[d, D.D_KIND] == D.KIND_NETFLOW
                else 0,
            }
            for d in np.flatnonzero(self.doms[:, D.D_VALID])
        }
        return {
            "type": "flows",
            "sources": per_source,
            "datagrams": self.datagrams,
            "datagrams_ok": int(self.errs[D.E_OK]),
            "records": self.records,
            "late_records": self.late_records,
            "exporters": len(self.exporters),
            "sampling_rate": rates,
            "interfaces": interfaces,
            "errors": {k: int(v) for k, v in zip(D.FLOW_ERROR_NAMES[1:], self.errs[1:], strict=True)},
        }


def _ipv4_u32(exporter: Any) -> int:
    """The exporter field of a datagram's records: its source's IPv4 address as u32 (0 if not IPv4)."""
    host = exporter[0] if isinstance(exporter, tuple) and exporter else exporter
    try:
        a = ipaddress.ip_address(host)
    except ValueError:
        return 0
    if a.version == 6 and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return int(a) if a.version == 4 else 0
