"""Splitting one capture host's traffic over N worker processes, each with its own ring, kernel and tables.

Live capture: every worker opens its own AF_PACKET socket on each interface and joins one fanout group
per interface (``PACKET_FANOUT_HASH``: the kernel's symmetric flow hash, both directions of a flow go to
the same worker; or ``PACKET_FANOUT_CPU``: the worker of the CPU that received the frame). The kernel
delivers each frame to exactly one member of the group, so every packet is counted once over all
workers; when a worker dies, its socket leaves the group and the others get its share.

Replay (pcap, generator): every worker reads the whole input into a small staging ring and keeps the
frames whose symmetric flow hash modulo N is its index (:func:`share_move`, Numba on the ring arrays),
so the same flow always lands in the same worker, as with fanout hash.

Each worker is a capture host of its own to the high level (host id ``H/w<i>``, see
:func:`worker_host_id`): it punctuates per worker, and the meld waits for every worker as for any host.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import numpy as np
from numba import njit

from low_level.capture.ring import HEAD, TAIL, Ring, RingArrays, ring_full, ring_push
from low_level.capture.sources.afpacket import SOL_PACKET, AfPacketSource
from low_level.capture.sources.base import NST_BASE, Backoff, Source
from low_level.jit.splitmix import GOLDEN as _GOLD
from low_level.jit.splitmix import mix64

log = logging.getLogger(__name__)

PACKET_FANOUT = 18
FANOUT_MODES = {"hash": 0, "cpu": 2}  # PACKET_FANOUT_HASH, PACKET_FANOUT_CPU
ST_KEPT, ST_OTHERS = NST_BASE, NST_BASE + 1


def worker_host_id(host: str, index: int) -> str:
    """The host id worker ``index`` of capture host ``host`` punctuates as (``edge-1/w0``)."""
    return f"{host}/w{index}"


@njit(cache=True, nogil=True, inline="always")
def _be(b, o, n):
    v = np.uint64(0)
    for j in range(n):
        v = (v << np.uint64(8)) | np.uint64(b[o + j])
    return v


@njit(cache=True, nogil=True)
def flow_hash(b: np.ndarray, off: int, cap: int) -> np.uint64:
    """Symmetric hash of the frame ``b[off:off+cap]``: the same for both directions of a flow.

    IPv4/IPv6 (behind up to a few VLAN/QinQ tags): addresses, protocol and, for TCP/UDP/SCTP that is not
    an IPv4 fragment, ports (fragments hash on the addresses and protocol only). Other frames: the MAC
    address pair and the ethertype.
    """
    if cap < 14:
        return np.uint64(0)
    et = _be(b, off + 12, 2)
    p = 14
    while (et == 0x8100 or et == 0x88A8 or et == 0x9100) and p + 4 <= cap:
        et = _be(b, off + p + 2, 2)
        p += 4
    a0 = a1 = d0 = d1 = sport = dport = proto = np.uint64(0)
    ip = False
    if et == 0x0800 and p + 20 <= cap:
        ip = True
        ihl = (np.int64(b[off + p]) & 0xF) * 4
        proto = np.uint64(b[off + p + 9])
        frag = _be(b, off + p + 6, 2) & np.uint64(0x3FFF)
        a1 = _be(b, off + p + 12, 4)
        d1 = _be(b, off + p + 16, 4)
        q = p + ihl
        if frag == 0 and (proto == 6 or proto == 17 or proto == 132) and q + 4 <= cap:
            sport = _be(b, off + q, 2)
            dport = _be(b, off + q + 2, 2)
    elif et == 0x86DD and p + 40 <= cap:
        ip = True
        proto = np.uint64(b[off + p + 6])
        a0 = _be(b, off + p + 8, 8)
        a1 = _be(b, off + p + 16, 8)
        d0 = _be(b, off + p + 24, 8)
        d1 = _be(b, off + p + 32, 8)
        q = p + 40
        if (proto == 6 or proto == 17 or proto == 132) and q + 4 <= cap:
            sport = _be(b, off + q, 2)
            dport = _be(b, off + q + 2, 2)
    if not ip:
        a1 = _be(b, off + 6, 6)
        d1 = _be(b, off, 6)
        proto = et
    x = mix64(mix64(a0 ^ _GOLD) ^ a1 ^ (sport << np.uint64(48)))
    y = mix64(mix64(d0 ^ _GOLD) ^ d1 ^ (dport << np.uint64(48)))
    lo = x if x < y else y
    hi = y if x < y else x
    return mix64(mix64(lo ^ proto) + hi)


@njit(cache=True, nogil=True)
def share_of(b: np.ndarray, snaplen: int, caplen: np.ndarray, n: int) -> np.ndarray:
    """The worker (``flow_hash % n``) of each frame of a ring's arrays: for tests and tools."""
    out = np.empty(caplen.shape[0], dtype=np.int64)
    for s in range(caplen.shape[0]):
        out[s] = np.int64(flow_hash(b, s * snaplen, caplen[s]) % np.uint64(n))
    return out


@njit(cache=True, nogil=True)
def share_move(staging: RingArrays, ring: RingArrays, n: int, index: int, st: np.ndarray) -> int:
    """Move the staging ring's frames of worker ``index`` (``flow_hash % n``) into the worker's ring and
    skip the others; stops, without dropping, when the worker's ring is full. Returns frames consumed."""
    sframes, ssnap, scaplen, swirelen, sts, siface, sctr = staging
    nsl = scaplen.shape[0]
    tail = sctr[TAIL]
    head = sctr[HEAD]
    done = kept = others = np.int64(0)
    un = np.uint64(n)
    ui = np.uint64(index)
    while tail < head:
        slot = tail & (nsl - 1)
        base = slot * ssnap
        cap = scaplen[slot]
        if flow_hash(sframes, base, cap) % un == ui:
            if ring_full(ring):
                break
            ring_push(ring, sframes, base, cap, swirelen[slot], sts[slot], siface[slot])
            kept += 1
        else:
            others += 1
        tail += 1
        done += 1
    sctr[TAIL] = tail
    st[ST_KEPT] += kept
    st[ST_OTHERS] += others
    return done


class ShareSource(Source):
    """Worker ``index`` of ``count``'s share of a replayed source (pcap, generator): the whole input is
    read into a staging ring, the frames of this worker's flows move on into its ring (see module doc)."""

    kind = "share"

    def __init__(
        self, inner_spec: dict[str, Any], ring: Ring, index: int, count: int, staging_slots: int = 1 << 14
    ):
        from low_level.capture.sources import open_source

        if not 0 <= index < count:
            raise ValueError(f"worker index {index} not in [0, {count})")
        super().__init__(ring, [], nstats=NST_BASE + 2)
        self.index, self.count = int(index), int(count)
        self.staging = Ring(staging_slots, snaplen=ring.snaplen)
        spec = dict(inner_spec)
        if spec.get("type") == "pcap":
            spec.setdefault("progress", False)  # N progress bars on one terminal help nobody
        self.inner = open_source(spec, self.staging)
        self.interfaces = self.inner.interfaces
        self.live_clock = self.inner.live_clock

    def _run(self) -> None:
        self.inner.start()
        backoff = Backoff()
        src, dst = self.staging.arrays(), self.ring.arrays()
        while not self._stop_evt.is_set():
            ended = not self.inner.running  # read before moving: what it pushed before ending is moved below
            moved = share_move(src, dst, self.count, self.index, self._st)
            if self.staging.fill == 0 and ended:
                if self.inner.error is not None:
                    raise RuntimeError(f"shared {self.inner.kind} source failed: {self.inner.error!r}")
                self._finished = self.inner.finished
                return
            if moved:
                backoff.reset()
            else:
                backoff.wait()

    def stop(self) -> None:
        super().stop()
        self.inner.stop()

    def _cleanup(self) -> None:
        self.inner.stop()
        self.inner.join(5)

    def stats(self) -> dict[str, Any]:
        """The inner source's counters, then this worker's: ``frames_pushed``/``drops``/``bytes`` of its
        own ring, ``frames_kept`` (its share), ``frames_others`` (the other workers' share)."""
        d = dict(self.inner.stats())
        own = super().stats()
        d.update(
            type=f"{self.inner.kind} (share)",
            share=f"{self.index}/{self.count}",
            frames_kept=int(self._st[ST_KEPT]),
            frames_others=int(self._st[ST_OTHERS]),
            running=own["running"],
            finished=own["finished"],
            error=own["error"] or d.get("error"),
        )
        return d


class FanoutAfPacketSource(AfPacketSource):
    """An AF_PACKET source whose sockets join the fanout group ``group + k`` of interface ``k``.

    A socket must be bound to join a group, and a bound socket outside the group gets every frame: it
    drops everything (a ``ret #0`` filter) from bind until it has joined, then takes the snap filter.
    """

    kind = "afpacket"

    def __init__(self, ring: Ring, interfaces: list[str], group: int, mode: str = "hash", **kw: Any) -> None:
        if mode not in FANOUT_MODES:
            raise ValueError(f"fanout mode must be one of {sorted(FANOUT_MODES)}, not {mode!r}")
        if not 0 <= group <= 0xFFFF:  # interface k joins (group + k) mod 2^16
            raise ValueError(f"fanout group {group} out of range")
        super().__init__(ring, interfaces, **kw)
        self.group, self.mode = int(group), mode

    def start(self) -> FanoutAfPacketSource:
        if self._thread is not None:
            raise RuntimeError("afpacket source already started")
        for c in self._caps:
            c._attach_snap_filter(0)  # ret #0: nothing reaches this socket until it is in the group
            c.bind()
        for k, c in enumerate(self._caps):
            arg = ((self.group + k) & 0xFFFF) | (FANOUT_MODES[self.mode] << 16)
            try:
                c.sock.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", arg))
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot join fanout group {self.group + k} on {c.name}: {exc.strerror}"
                    " (another program uses this group id with another mode?)",
                ) from None
            c._attach_snap_filter(self.frame_snaplen)
        Source.start(self)  # AfPacketSource.start would bind again
        return self

    def stats(self) -> dict[str, Any]:
        d = super().stats()
        d.update(fanout_group=self.group, fanout_mode=self.mode)
        return d


def parse_worker(text: str) -> tuple[int, int, int]:
    """``I/N[/GROUP]`` (the agent's hidden ``--worker`` flag, set by the supervisor) -> (index, count, group)."""
    try:
        parts = [int(x) for x in text.split("/")]
    except ValueError:
        parts = []
    if len(parts) == 2:
        parts.append(0)
    if len(parts) != 3 or not 0 <= parts[0] < parts[1]:
        raise ValueError(f"--worker {text!r}: expected INDEX/COUNT[/GROUP] with 0 <= INDEX < COUNT")
    return parts[0], parts[1], parts[2]


def worker_source(
    spec: dict[str, Any], ring: Ring, index: int, count: int, group: int, fanout: str = "hash"
) -> Source:
    """The source of worker ``index`` of ``count``: a fanout member for live capture, a share otherwise."""
    if spec.get("type") == "afpacket":
        opts = {k: v for k, v in spec.items() if k != "type"}
        return FanoutAfPacketSource(ring, group=group, mode=fanout, **opts)
    return ShareSource(spec, ring, index, count)


def fanout_group_base(pid: int) -> int:
    """The fanout group id of an agent: its supervisor's pid (mod 2^16). Groups are per network
    namespace; a socket joining an existing id on the same interface joins that group silently, so two
    agents must not share one: ids of concurrently running processes differ unless their pids are
    equal mod 65536. Interface k of the agent uses ``id + k``; the same id on another interface is
    refused by the kernel (the worker then fails to start and says so)."""
    return pid & 0xFFFF
