"""NetFlow v5 / v9 / IPFIX over UDP as a low-level source: datagrams in, weighted flow rows out.

Unlike the packet sources this one does not fill the frame ring: a datagram carries tens of records, so
datagrams are received a batch per system call into one buffer (``low_level.flows.receive``), and the
batch is decoded (``low_level.flows.decode``) and folded into the tables in one compiled call
(``FlowKernel.take``, a thousand records at a time so decoded rows never leave the core's cache): no
Python step per datagram or record. ``decode`` alone (rows out) serves tests and replays.

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
from low_level.flows import layout as L
from low_level.flows.receive import NAME, BatchReceiver, sender, slot_for, socket_drops

S = 1_000_000_000  # ns per second


@dataclass
class FlowTimeouts:
    """What the exporters promise (their configured timeouts), in ns."""

    inactive_ns: int = 15 * S
    active_ns: int = 60 * S
    slack_ns: int = 2 * S
    exporter_timeout_ns: int = 300 * S
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
    capacity: int = 1 << 16  # records per decoded batch
    batch: int = 1024  # datagrams per receive call (recvmmsg's vlen)
    buffer_bytes: int = 1 << 24  # for datagrams given as bytes (feed)

    def __post_init__(self) -> None:
        self.tmpl, self.doms = L.new_state()
        self.errs = np.zeros(L.NFLOWERR, dtype=np.int64)
        self.exporters: dict[Any, int] = {}
        self.exp_addr = np.zeros(64, dtype=np.int64)  # per exporter id: its IPv4 address as u32, else 0
        # per socket sender seen: its key (decode.sender_key) and exporter id, for decode.exporter_ids
        self.exp_keys = np.zeros((64, 4), dtype=np.int64)
        self.nkeys = 0
        self.buf = np.zeros(self.buffer_bytes, dtype=np.uint8)  # fed datagrams (received ones: rx.buf)
        self.qbuf = self.buf  # the buffer the queue's offsets point into
        # the queued datagrams first .. n-1: where in qbuf, how long, which exporter, when received
        self.q = np.zeros((4, self.batch), dtype=np.int64)
        self.take = np.zeros(5, dtype=np.int64)  # decode.take_batch's results
        self.grow_to = 0  # a slot size the next receive call needs (a datagram was longer than its slot)
        self.first = self.n = 0
        self.ctrs = np.zeros((self.capacity, L.CW), dtype=np.int64)
        # latest sFlow interface counters per (source row, ifIndex): {(d, ifindex): ctrs row}
        self.interfaces: dict[tuple[int, int], np.ndarray] = {}
        self.rows = np.zeros((self.capacity, F.NFIELDS), dtype=np.int64)
        self.weights = np.zeros(self.capacity, dtype=np.int64)
        self.rate = np.zeros(self.capacity, dtype=np.int64)
        self.res = np.zeros(4, dtype=np.int64)
        self.res5 = np.zeros(5, dtype=np.int64)  # FlowKernel.take's results
        # rows[carry[0]:carry[1]]: decoded by FlowKernel.take, not yet folded (an output region was full)
        self.carry = np.zeros(2, dtype=np.int64)
        self.datagrams = 0
        self.records = 0
        self.late_records = 0
        self.mark_ns: int | None = None
        self.sock: socket.socket | None = None
        self.rx: BatchReceiver | None = None
        self.rcvbuf = 0
        self.closed_drops = 0  # the socket's drops when it closed (kernel_drops stays readable after)

    # --- receiving
    def open(self) -> FlowCollector:
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        s.bind((self.host, self.port))
        s.setblocking(False)
        self.sock = s
        self.port = s.getsockname()[1]
        self.rcvbuf = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)  # what the kernel granted
        self.rx = BatchReceiver(s, self.batch)
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.closed_drops = socket_drops(self.sock)
            self.sock.close()
            self.sock = None
            self.rx = None

    def receive(self, wait_s: float = 0.0) -> int:
        """Take at most ``batch`` datagrams (one system call) into the receiver's slots: what the socket
        holds, or with ``wait_s`` what arrives until the batch is full, wait_s has passed or the export
        paused (``BatchReceiver.receive``); returns datagrams taken. Takes nothing while datagrams wait to be decoded
        (their slots are in use): decode them first. A datagram longer than its slot is counted
        (``cut_at_receive``) and not decoded; the slots grow to hold the longest datagram seen."""
        rx = self.rx
        assert rx is not None, "open() first"
        if self.pending:
            return 0
        if self.grow_to:
            rx.resize(self.grow_to)
            self.grow_to = 0
        got = rx.receive(wait_s)
        if not got:
            return 0
        # one arrival time per batch (sFlow samples are timed by it)
        D.take_batch(
            got,
            rx.slot,
            rx.lens,
            rx.namelen,
            rx.names,
            self.exp_keys,
            self.nkeys,
            self.q,
            time.time_ns(),
            NAME,
            self.take,
        )
        kept, unknown, cut, longest, _ = self.take.tolist()
        if unknown:
            exps = self.q[2, :kept]
            for j in np.flatnonzero(exps < 0):  # senders not seen before: the slow path, once each
                name = rx.names[int(self.q[0, j]) // rx.slot]
                key = D.sender_key(name)
                hit = np.flatnonzero((self.exp_keys[: self.nkeys, :3] == key).all(axis=1))
                if not len(hit):
                    if self.nkeys == len(self.exp_keys):
                        self.exp_keys = np.concatenate([self.exp_keys, np.zeros_like(self.exp_keys)])
                    self.exp_keys[self.nkeys] = (*key, self._exporter_id(sender(name)))
                    hit = [self.nkeys]
                    self.nkeys += 1
                exps[j] = self.exp_keys[hit[0], 3]
        if longest > rx.slot or cut:
            self.errs[L.E_CUT] += cut
            self.datagrams += cut
            self.grow_to = slot_for(longest)
        self.qbuf = rx.buf
        self.first, self.n = 0, kept
        return got

    @property
    def kernel_drops(self) -> int:
        """Datagrams the socket's buffer overflowed on (the kernel dropped them before any receive)."""
        return socket_drops(self.sock) if self.sock is not None else self.closed_drops

    def _exporter_id(self, exporter: Any) -> int:
        e = self.exporters.get(exporter)
        if e is None:
            e = self.exporters[exporter] = len(self.exporters)
            if e >= len(self.exp_addr):
                self.exp_addr = np.concatenate([self.exp_addr, np.zeros_like(self.exp_addr)])
            self.exp_addr[e] = _ipv4_u32(exporter)
        return e

    def feed(
        self, datagrams: list[bytes], exporter: Any = ("127.0.0.1", 0), arrival_ns: int | None = None
    ) -> None:
        """Queue datagrams given as bytes (tests, replay of a recorded export), from this exporter (its
        address), all received at arrival_ns (now when None), for the next decode."""
        t = time.time_ns() if arrival_ns is None else arrival_ns
        e = self._exporter_id(exporter)
        if self.qbuf is not self.buf:
            if self.pending:
                raise ValueError("feed: received datagrams wait to be decoded: decode them first")
            self.qbuf = self.buf
        for d in datagrams:
            off = int(self.q[0, self.n - 1] + self.q[1, self.n - 1]) if self.n else 0
            if off + len(d) > len(self.buf):
                raise ValueError(f"feed: {off + len(d)} bytes queued exceed the {len(self.buf)}-byte buffer")
            if self.n == self.q.shape[1]:
                self.q = np.concatenate([self.q, np.zeros_like(self.q)], axis=1)
            self.buf[off : off + len(d)] = np.frombuffer(d, dtype=np.uint8)
            self.q[:, self.n] = (off, len(d), e, t)
            self.n += 1

    @property
    def pending(self) -> int:
        """Datagrams queued, plus decoded records not yet folded (FlowKernel.take's carry)."""
        return self.n - self.first + int(self.carry[1] - self.carry[0])

    def taken(self, used: int, records: int, nctr: int, late: int) -> None:
        """Count what one FlowKernel.take call consumed: datagrams, records folded, counter rows, late."""
        for c in self.ctrs[:nctr]:
            self.interfaces[(int(c[L.C_DOM]), int(c[L.C_IFINDEX]))] = c.copy()
        self.first += used
        if self.first == self.n:
            self.first = self.n = 0
        self.datagrams += used
        self.records += records
        self.late_records += late

    # --- decoding
    def warm(self) -> None:
        """Compile the decoder now (no datagrams), before the first export arrives."""
        assert not self.pending
        self.decode()
        if self.rx is not None:
            rx = self.rx
            D.take_batch(
                0, rx.slot, rx.lens, rx.namelen, rx.names, self.exp_keys, 0, self.q, 0, NAME, self.take
            )
        D.sender_key(self.buf[:NAME])

    def decode(self) -> FlowBatch:
        """Decode the queued datagrams (all of them, or as many as fill one batch of records)."""
        assert self.carry[0] == self.carry[1], "decode: FlowKernel.take left records to fold"
        s, n = self.first, self.n
        q = self.q
        D.decode(
            self.qbuf,
            q[0, s:n],
            q[1, s:n],
            q[2, s:n],
            q[3, s:n],
            n - s,
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
            self.capacity,
        )
        for c in self.ctrs[: int(self.res[2])]:
            self.interfaces[(int(c[L.C_DOM]), int(c[L.C_IFINDEX]))] = c.copy()
        nrec, used = int(self.res[0]), int(self.res[1])
        self.first += used
        if self.first == self.n:
            self.first = self.n = 0
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
        live = self.doms[:, L.D_VALID] == 1
        t = self.timeouts
        # a NetFlow record may end up to inactive + slack before its exporter's clock; an sFlow sample is
        # timed by its datagram's arrival, so nothing an agent still sends is older than its last arrival
        lag = np.where(self.doms[live, L.D_KIND] == L.KIND_SFLOW, 0, t.inactive_ns) + t.slack_ns
        clocks = self.doms[live, L.D_CLOCK]
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
        if row[L.D_KIND] == L.KIND_SFLOW:
            return (
                f"sflow:{F.words_to_ip(int(row[L.D_AGENT_HI]), int(row[L.D_AGENT_LO]))}/{int(row[L.D_DOM])}"
            )
        names = {v: k for k, v in self.exporters.items()}
        return f"{names.get(int(row[L.D_EXP]), int(row[L.D_EXP]))}/{int(row[L.D_DOM])}"

    def stats(self) -> dict[str, Any]:
        """Counters for metrics and the agent summary; ``sampling_rate`` per exporter and domain."""
        rates = {
            self.source_name(d): int(self.doms[d, L.D_RATE]) for d in np.flatnonzero(self.doms[:, L.D_VALID])
        }
        interfaces = [
            {
                "source": self.source_name(d),
                "ifindex": i,
                "speed": int(c[L.C_SPEED]),
                "status": int(c[L.C_STATUS]),
            }
            | {k: int(c[L.C_IN_OCTETS + j]) for j, k in enumerate(L.COUNTER_NAMES)}
            for (d, i), c in sorted(self.interfaces.items())
        ]
        per_source = {
            self.source_name(d): {
                "datagrams": int(self.doms[d, L.D_DATAGRAMS]),
                "records": int(self.doms[d, L.D_RECORDS]),
                "templates": int(
                    (
                        (self.tmpl[:, L.T_VALID] == 1)
                        & (self.tmpl[:, L.T_EXP] == self.doms[d, L.D_EXP])
                        & (self.tmpl[:, L.T_DOM] == self.doms[d, L.D_DOM])
                    ).sum()
                )
                if self.doms[d, L.D_KIND] == L.KIND_NETFLOW
                else 0,
            }
            for d in np.flatnonzero(self.doms[:, L.D_VALID])
        }
        return {
            "type": "flows",
            "sources": per_source,
            "datagrams": self.datagrams,
            "datagrams_ok": int(self.errs[L.E_OK]),
            "records": self.records,
            "late_records": self.late_records,
            "kernel_drops": self.kernel_drops,
            "exporters": len(self.exporters),
            "sampling_rate": rates,
            "interfaces": interfaces,
            "errors": {k: int(v) for k, v in zip(L.FLOW_ERROR_NAMES[1:], self.errs[1:], strict=True)},
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
