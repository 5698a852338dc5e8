"""Synthetic traffic: valid Ethernet/IPv4/IPv6 TCP/UDP/ICMP frames built by Numba straight into a ring.

Why: benchmarks and end-to-end tests need traffic whose aggregates are known in advance, at rates no
capture file or NIC on a developer machine gives. Every packet is a pure function of
``(seed, packet index)`` (a counter-based splitmix64 hash), so :func:`generate_frames` and a
:class:`GeneratorSource` with the same parameters produce the same frames, however they are chunked.

Traffic model. Packet ``i`` belongs to group ``g`` (uniform over ``groups``, or Zipf-skewed with
exponent ``zipf`` so that group 0 is the most popular). A group fixes the source address, the
destination address and the destination port, see :func:`group_tuple`; the protocol (``proto_mix``),
the size (uniform in ``sizes``), the SYN flag (``syn_fraction`` of TCP packets are pure SYNs, the rest
PSH|ACK), IPv4 vs IPv6 (``ipv6_fraction``) and the source port (random, >= 1024) are drawn per packet.
ICMP packets (echo requests; ICMPv6 for IPv6) carry no ports. Payload bytes are zero, and the IP, TCP,
UDP and ICMP checksums are correct for the whole frame of the chosen size. Only the first
``ring.snaplen`` bytes are written; the wire length is the chosen size (at least the headers' size).

The server side (opt-in, off by default so other runs' packets do not change): with ``synack_fraction``
> 0 that share of the pure SYNs is answered by a SYN-ACK (server -> client: addresses and ports swapped,
ack = the SYN's seq + 1) after a lognormal latency (median ``synack_latency_ms``, log-sd
``synack_latency_sigma``, clipped to 10 us .. 60 s); ``synack_duplicate_fraction`` of the SYN-ACKs are
sent again after 1 s (RFC 6298's initial RTO), and ``syn_retransmit_fraction`` of the unanswered SYNs
are retransmitted (same bytes) after 1 s. Each decision is a hash of ``(seed, index)``; the answers are
kept on a heap and go out in timestamp order between the ordinary packets, so a host's timestamps stay
non-decreasing. A finite run (``count``) ends by sending the answers still scheduled.

Timestamps: ``clock="synthetic"`` spaces packets ``1/synthetic_pps`` s apart from ``start_ns``,
independent of real time (``live_clock`` False); ``clock="wall"`` stamps them with the wall clock (the
scheduled send time when ``rate`` is set). ``skew_ns`` is added to every timestamp, to emulate a host
whose clock or link lags.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from low_level.capture.ring import DEFAULT_SNAPLEN, Ring
from low_level.capture.sources.base import ST_READ, Backoff, Source
from low_level.capture.sources.synth.model import (
    CHUNK,
    CLOCK_GIVEN,
    DEFAULT_MIX,
    DEFAULT_START_NS,
    G_CLOCK,
    G_IFIDX,
    G_REPLIES,
    G_START,
    G_WAIT,
    params,
)
from low_level.capture.sources.synth.schedule import gen_array_kernel, gen_push_kernel

RATE_BATCH_S = 0.002  # a paced generator builds this much traffic per wakeup (20K packets/s: 40 a time)


def generate_frames(
    n: int,
    groups: int = 65536,
    seed: int = 1,
    snaplen: int = DEFAULT_SNAPLEN,
    *,
    zipf: float = 0.0,
    sizes: tuple[int, int] = (64, 1500),
    proto_mix: Mapping[str, float] | None = None,
    syn_fraction: float = 0.1,
    ipv6_fraction: float = 0.0,
    start_ns: int = DEFAULT_START_NS,
    synthetic_pps: int = 1_000_000,
    skew_ns: int = 0,
    start_index: int = 0,
    **answers: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Packets ``start_index .. start_index+n-1`` as arrays, without a ring or a thread.

    Returns ``(frames uint8[rows, snaplen], caplen, wirelen, ts)``, identical to what a synthetic-clock
    :class:`GeneratorSource` with the same parameters and ``count=n`` pushes. For benchmarks and tests.
    ``answers`` (:data:`ANSWER_DEFAULTS`, off by default): the SYN-ACKs, retransmitted SYNs and duplicate
    SYN-ACKs are extra rows, in timestamp order among the n packets, all of them (rows >= n).
    """
    p, cdf = params(
        groups,
        seed,
        snaplen,
        zipf,
        sizes,
        proto_mix or DEFAULT_MIX,
        syn_fraction,
        ipv6_fraction,
        start_ns,
        synthetic_pps,
        skew_ns,
        answers,
    )
    scratch = np.zeros(max(snaplen, 128), dtype=np.uint8)
    heap = np.zeros((n + 1, 3), dtype=np.int64)  # each ordinary packet schedules at most one answer
    hs = np.zeros(1, dtype=np.int64)
    parts = []
    done = 0
    while True:
        rows = n if not p[G_REPLIES] else min(max(n - done, 0) + 1024, 4 * CHUNK)  # with answers: in chunks
        out = (
            np.zeros((rows, snaplen), dtype=np.uint8),
            np.zeros(rows, dtype=np.int64),
            np.zeros(rows, dtype=np.int64),
            np.zeros(rows, dtype=np.int64),
        )
        used, w = gen_array_kernel((p, cdf, scratch, heap, hs), int(start_index) + done, n - done, True, out)
        done += int(used)
        parts.append(tuple(a[:w] for a in out))
        if done >= n and hs[0] == 0:
            break
    if len(parts) == 1:
        return parts[0]
    frames, caplen, wirelen, ts = (np.concatenate([part[k] for part in parts]) for k in range(4))
    return frames, caplen, wirelen, ts


class GeneratorSource(Source):
    """Pushes synthetic packets into a ring (traffic model in the module docstring).

    ``rate`` None: as fast as the ring accepts, waiting when it is full (nothing is lost). With a rate
    (packets/s) packets are released on schedule and dropped+counted when the ring is full, like a
    live source. ``count`` None runs until stop(); otherwise the source finishes after ``count`` packets.
    """

    kind = "generator"

    def __init__(
        self,
        ring: Ring,
        groups: int = 65536,
        rate: float | None = None,
        count: int | None = None,
        clock: str = "wall",
        start_ns: int | None = None,
        synthetic_pps: int = 1_000_000,
        skew_ns: int = 0,
        zipf: float = 0.0,
        sizes: tuple[int, int] = (64, 1500),
        proto_mix: Mapping[str, float] | None = None,
        syn_fraction: float = 0.1,
        seed: int = 1,
        ipv6_fraction: float = 0.0,
        iface_index: int = 0,
        synack_fraction: float = 0.0,
        synack_latency_ms: float = 20.0,
        synack_latency_sigma: float = 0.8,
        syn_retransmit_fraction: float = 0.0,
        synack_duplicate_fraction: float = 0.0,
    ) -> None:
        super().__init__(ring, ["generator"])
        if clock not in ("wall", "synthetic"):
            raise ValueError(f"generator clock must be 'wall' or 'synthetic', not {clock!r}")
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"generator rate must be a positive number of packets/s or None, not {rate!r}")
        if count is not None and int(count) < 0:
            raise ValueError(f"generator count must be >= 0 or None, not {count!r}")
        self.groups = int(groups)
        self.rate = None if rate is None else float(rate)
        self.count = None if count is None else int(count)
        self.clock = clock
        self.live_clock = clock == "wall"
        self.seed = int(seed)
        self._p, self._cdf = params(
            groups,
            seed,
            ring.snaplen,
            zipf,
            sizes,
            proto_mix or DEFAULT_MIX,
            syn_fraction,
            ipv6_fraction,
            DEFAULT_START_NS if start_ns is None else start_ns,
            synthetic_pps,
            skew_ns,
            {
                "synack_fraction": synack_fraction,
                "synack_latency_ms": synack_latency_ms,
                "synack_latency_sigma": synack_latency_sigma,
                "syn_retransmit_fraction": syn_retransmit_fraction,
                "synack_duplicate_fraction": synack_duplicate_fraction,
            },
        )
        self.synack_fraction = float(synack_fraction)
        self._p[G_IFIDX] = int(iface_index)
        self._p[G_WAIT] = self.rate is None
        if clock == "wall":
            self._p[G_CLOCK] = CLOCK_GIVEN
            self._p[G_START] = 0  # the packet index the wall-clock interpolation starts from (per chunk)
        self._scratch = np.zeros(max(ring.snaplen, 128), dtype=np.uint8)
        self._next = 0  # index of the next packet to build
        self._heap = np.zeros((CHUNK + 1, 3), dtype=np.int64)  # answers scheduled: (ts, packet index, kind)
        self._heap_n = np.zeros(1, dtype=np.int64)

    def _push(self, n: int, t0: int, per_ns: float, flush: bool = False) -> int:
        p = self._p
        if p[G_CLOCK] == CLOCK_GIVEN:
            p[G_START] = self._next
        need = int(self._heap_n[0]) + n + 1
        if need > len(self._heap):  # each ordinary packet schedules at most one answer
            grown = np.zeros((max(need, 2 * len(self._heap)), 3), dtype=np.int64)
            grown[: len(self._heap)] = self._heap
            self._heap = grown
        done = int(
            gen_push_kernel(
                (p, self._cdf, self._scratch, self._heap, self._heap_n),
                self._next,
                n,
                flush,
                t0,
                per_ns,
                self._st,
                self.ring.arrays(),
            )
        )
        self._next += done
        return done

    def _flush_answers(self) -> None:
        """A finite run's end: the answers still scheduled go out (their own timestamps), as
        :func:`generate_frames` has them."""
        backoff = Backoff()
        while self._heap_n[0] > 0 and not self._stop_evt.is_set():
            before = int(self._st[ST_READ])
            self._push(0, 0, 0.0, flush=True)
            if int(self._st[ST_READ]) == before:
                backoff.wait()
            else:
                backoff.reset()

    def _left(self) -> int:
        return CHUNK if self.count is None else min(CHUNK, self.count - self._next)

    def _run(self) -> None:
        if self.rate is None:
            self._run_fast()
        else:
            self._run_rate()
        if self.count is not None and self._next >= self.count:
            self._flush_answers()
            self._finished = bool(self._heap_n[0] == 0)

    def _run_fast(self) -> None:
        backoff = Backoff()
        per_ns = 0.0
        last_ts = -1
        prev_now, prev_n = 0, 0
        while not self._stop_evt.is_set():
            n = self._left()
            if n <= 0:
                return
            now = time.time_ns()
            if prev_n:  # spread a chunk's wall timestamps at the rate the previous chunk ran
                per_ns = min((now - prev_now) / prev_n, 1e9 / CHUNK)
            t0 = max(now, last_ts + 1)
            done = self._push(n, t0, per_ns)
            if done:
                backoff.reset()
                last_ts = t0 + int(per_ns * (done - 1))
                prev_now, prev_n = now, done
            else:
                backoff.wait()
                prev_n = 0

    def _run_rate(self) -> None:
        assert self.rate is not None
        rate = self.rate
        per_ns = 1e9 / rate
        batch = max(1, int(rate * RATE_BATCH_S))
        start_mono = time.monotonic_ns()
        start_wall = time.time_ns()
        while not self._stop_evt.is_set():
            left = self._left()
            if left <= 0:
                return
            due = int((time.monotonic_ns() - start_mono) * rate / 1e9) + 1
            n = min(due - self._next, left)
            need = min(batch, left)  # wake per RATE_BATCH_S of traffic, not per packet (each keeps its time)
            if n < need:
                wait = (start_mono + (self._next + need - 1) * per_ns - time.monotonic_ns()) / 1e9
                self._stop_evt.wait(min(max(wait, 0.0), 0.01))
                continue
            self._push(n, start_wall + int(self._next * per_ns), per_ns)

    def stats(self) -> dict[str, Any]:
        """Base counters plus the configuration that shapes the traffic."""
        shape = ("groups", "rate", "count", "clock", "seed", "synack_fraction")
        return super().stats() | {k: getattr(self, k) for k in shape}
