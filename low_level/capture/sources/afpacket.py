"""Live capture with Linux AF_PACKET and a TPACKET_V3 memory-mapped RX ring per interface.

Why TPACKET_V3: the kernel fills whole blocks of frames in shared memory and hands over a block at
a time, so there is no system call per packet; a Numba kernel walks each ready block, copies its
frames into the lowwater ring and gives the block back. The capture thread only sleeps in poll().

Choices worth knowing:

* Both directions are captured, like tcpdump: frames the host sends (PACKET_OUTGOING) as well as
  the ones it receives. On ``lo`` every packet therefore shows up twice.
* A one-instruction classic BPF program (``ret #frame_snaplen``) makes the kernel store only the
  first ``frame_snaplen`` bytes of each frame, so blocks hold many more frames; the wire length is
  still reported (``tp_len``).
* VLAN tags the NIC/kernel stripped (``tp_vlan_tci``) are put back into the frame, as libpcap does,
  so the parser sees the tag.
* Timestamps are the kernel's receive time in ns (``live_clock`` True).
* The thread sleeps in poll() until a block is ready (the kernel retires a partly filled one after
  RETIRE_TOV_MS), a socket error, or stop() (a pipe in the same poll); after pushing frames it wakes
  the consumer (``on_records``). An idle interface thus costs a wake-up a second (the kernel counters),
  not one per POLL_MS.
* A full lowwater ring drops the frame and counts it (``drops``); frames the kernel could not fit in
  its own ring are counted by the kernel (``kernel_drops``, from PACKET_STATISTICS).

Needs root or CAP_NET_RAW.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import select
import socket
import struct
import threading
import time
from typing import Any

import numpy as np
from numba import njit

from low_level.capture.ring import Ring, RingArrays, ring_push_from
from low_level.capture.sources.base import Source, count_frames
from low_level.jit.refcount import pin

SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
TPACKET_V3 = 2
PACKET_MR_PROMISC = 1
ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
BPF_RET_K = 0x06  # BPF_RET | BPF_K

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
ETH_P_8021Q = 0x8100

log = logging.getLogger(__name__)

TPACKET3_HDR_MIN = 48  # sizeof(struct tpacket3_hdr)
RETIRE_TOV_MS = 50
POLL_MS = 50  # the pause after a POLLHUP without an error
STATS_EVERY_S = 1.0  # the kernel's 32-bit counters are read (and reset) at least this often


# Per-frame readers are single-exit calls with the buffer pinned, not inlined helpers: Numba's
# inliner rebinds array arguments, an atomic incref/decref pair per read (see low_level.jit.refcount).
@njit(cache=True, nogil=True)
def _le32(b, o):
    v = np.int64(b[o]) | (np.int64(b[o + 1]) << 8) | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24)
    pin(b)
    return v


@njit(cache=True, nogil=True)
def _le16(b, o):
    v = np.int64(b[o]) | (np.int64(b[o + 1]) << 8)
    pin(b)
    return v


@njit(cache=True, nogil=True)
def tpacket_v3_kernel(
    blk8: np.ndarray,
    blk32: np.ndarray,
    block_size: int,
    cur: np.ndarray,
    ifidx: int,
    scratch: np.ndarray,
    st: np.ndarray,
    ring: RingArrays,
) -> int:
    """Drain every ready block from block ``cur[0]`` on, in order; returns the number of blocks drained.

    Frames go to the ring (``ring_push_from``: a full ring drops and counts); each block is then handed back
    to the kernel by writing TP_STATUS_KERNEL into its ``block_status`` (an aligned 32-bit store).
    """
    nblocks = blk8.shape[0] // block_size
    b = cur[0]
    done = 0
    nread = npushed = ndrops = nbytes = np.int64(0)
    while done < nblocks:
        base = b * block_size
        status = np.int64(blk32[(base + 8) >> 2])
        if (status & TP_STATUS_USER) == 0:
            break
        num = np.int64(blk32[(base + 12) >> 2])
        p = base + np.int64(blk32[(base + 16) >> 2])
        lim = base + block_size
        for _ in range(num):
            if p < base or p + TPACKET3_HDR_MIN > lim:
                break
            nxt = _le32(blk8, p)
            ts = _le32(blk8, p + 4) * 1_000_000_000 + _le32(blk8, p + 8)
            snap = _le32(blk8, p + 12)
            wl = _le32(blk8, p + 16)
            fstat = _le32(blk8, p + 20)
            data = p + _le16(blk8, p + 24)
            if data + snap > lim:
                break
            tci = _le32(blk8, p + 32)
            nread += 1
            off, n = data, snap  # off -1: the frame is in scratch (ring_push_from)
            if (tci != 0 or (fstat & TP_STATUS_VLAN_VALID) != 0) and snap >= 12:
                # put the stripped 802.1Q tag back between the MAC addresses and the ethertype
                tpid = _le16(blk8, p + 36) if (fstat & TP_STATUS_VLAN_TPID_VALID) != 0 else ETH_P_8021Q
                k = snap + 4
                if k > scratch.shape[0]:
                    k = scratch.shape[0]
                for j in range(12):
                    scratch[j] = blk8[data + j]
                scratch[12] = (tpid >> 8) & 0xFF
                scratch[13] = tpid & 0xFF
                scratch[14] = (tci >> 8) & 0xFF
                scratch[15] = tci & 0xFF
                for j in range(16, k):
                    scratch[j] = blk8[data + j - 4]
                off, n = -1, snap + 4
                wl += 4
            ok = ring_push_from(ring, blk8, scratch, off, n, wl, ts, ifidx)
            if ok:
                npushed += 1
                nbytes += wl
            else:
                ndrops += 1
            if nxt == 0:
                break
            p += nxt
        blk32[(base + 8) >> 2] = TP_STATUS_KERNEL
        b += 1
        if b == nblocks:
            b = 0
        done += 1
    cur[0] = b
    count_frames(st, nread, npushed, ndrops, nbytes)
    return done


class _Capture:
    """One interface: its socket, its mmap'ed RX ring and where the next block to read is."""

    def __init__(
        self, name: str, promiscuous: bool, block_size: int, block_count: int, frame_snaplen: int
    ) -> None:
        self.name = name
        try:
            self.ifindex = socket.if_nametoindex(name)
        except OSError:
            raise ValueError(f"no such network interface: {name!r}") from None
        try:
            # protocol 0: nothing is queued until bind() names ETH_P_ALL, after the ring is ready
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        except PermissionError as exc:
            raise PermissionError(
                f"AF_PACKET capture on {name!r} needs root or the CAP_NET_RAW capability ({exc.strerror})"
            ) from exc
        self.mm: mmap.mmap | None = None
        try:
            s = self.sock
            s.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            self._attach_snap_filter(frame_snaplen)
            frame_size = min(2048, block_size)
            req = struct.pack(
                "7I",
                block_size,
                block_count,
                frame_size,
                (block_size // frame_size) * block_count,
                RETIRE_TOV_MS,
                0,
                0,
            )
            s.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
            self.mm = mmap.mmap(
                s.fileno(), block_size * block_count, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
            if promiscuous:
                mreq = struct.pack("iHH8s", self.ifindex, PACKET_MR_PROMISC, 0, b"")
                s.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        except Exception:
            self.close()
            raise
        self.blk8 = np.frombuffer(self.mm, dtype=np.uint8)
        self.blk32 = self.blk8.view(np.uint32)
        self.block_size = block_size
        self.cur = np.zeros(1, dtype=np.int64)

    def _attach_snap_filter(self, snaplen: int) -> None:
        insn = (ctypes.c_ubyte * 8).from_buffer_copy(struct.pack("HBBI", BPF_RET_K, 0, 0, snaplen))
        prog = struct.pack("HP", 1, ctypes.addressof(insn))  # struct sock_fprog (native alignment)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)

    def bind(self) -> None:
        self.sock.bind((self.name, ETH_P_ALL))

    def kernel_stats(self) -> tuple[int, int, int]:
        """(packets, drops, queue freezes) since the previous call: the kernel resets them on read."""
        raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
        return struct.unpack("3I", raw)

    def close(self) -> None:
        self.blk8 = self.blk32 = np.zeros(0, dtype=np.uint8)
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view is still alive; the mapping goes when it does
                pass
            self.mm = None
        self.sock.close()


class AfPacketSource(Source):
    """Captures live traffic from ``interfaces`` (one TPACKET_V3 ring each) into a lowwater ring.

    Frames of ``interfaces[k]`` get iface index ``iface_index + k``. Sockets and kernel rings are set
    up here (so permission and interface errors surface at once); capture starts with start().
    """

    kind = "afpacket"
    live_clock = True
    wakes_consumer = True

    def __init__(
        self,
        ring: Ring,
        interfaces: list[str],
        promiscuous: bool = False,
        block_size: int = 1 << 20,
        block_count: int = 64,
        frame_snaplen: int | None = None,
        iface_index: int = 0,
    ) -> None:
        if (
            isinstance(interfaces, str)
            or not interfaces
            or not all(isinstance(i, str) and i for i in interfaces)
        ):
            raise ValueError(
                f"afpacket interfaces must be a non-empty list of interface names, not {interfaces!r}"
            )
        page = mmap.PAGESIZE
        if block_size < page or block_size % page:
            raise ValueError(
                f"afpacket block_size must be a multiple of the page size ({page}), not {block_size}"
            )
        if block_count < 1:
            raise ValueError(f"afpacket block_count must be >= 1, not {block_count}")
        super().__init__(ring, interfaces)
        self.promiscuous = bool(promiscuous)
        self.frame_snaplen = int(ring.snaplen if frame_snaplen is None else frame_snaplen)
        if not 14 <= self.frame_snaplen <= 65535:
            raise ValueError(f"afpacket frame_snaplen must be in [14, 65535], not {self.frame_snaplen}")
        self.iface_index = int(iface_index)
        self._scratch = np.zeros(ring.snaplen + 4, dtype=np.uint8)
        self._kstats = [0, 0, 0]
        self.socket_errors = 0
        self._klock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()  # stop() writes, so the poll below may block long
        self._caps: list[_Capture] = []
        try:
            for name in self.interfaces:
                self._caps.append(
                    _Capture(name, self.promiscuous, block_size, block_count, self.frame_snaplen)
                )
        except Exception:
            self._cleanup()
            raise

    def start(self) -> AfPacketSource:
        """Bind the sockets (capture begins: frames queue in the kernel rings), then start the thread."""
        if not self._caps:
            raise RuntimeError("afpacket source is closed")
        if self._thread is None:
            for c in self._caps:
                c.bind()
        super().start()
        return self

    def stop(self) -> None:
        try:  # first: the thread closes the pipe only once it has seen the stop
            os.write(self._stop_w, b"s")
        except OSError:  # closed: the thread has ended
            pass
        super().stop()

    def _run(self) -> None:
        caps = self._caps
        poller = select.poll()
        by_fd = {c.sock.fileno(): c for c in caps}
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLERR)
        poller.register(self._stop_r, select.POLLIN)
        arrays = self.ring.arrays()
        next_stats = time.monotonic() + STATS_EVERY_S
        while not self._stop_evt.is_set():
            drained = 0
            for k, c in enumerate(caps):
                drained += tpacket_v3_kernel(
                    c.blk8,
                    c.blk32,
                    c.block_size,
                    c.cur,
                    self.iface_index + k,
                    self._scratch,
                    self._st,
                    arrays,
                )
            if drained:
                if self.on_records is not None:
                    self.on_records()
            else:
                wait_ms = max(0, int((next_stats - time.monotonic()) * 1000) + 1)
                for fd, ev in poller.poll(wait_ms):
                    if fd in by_fd and ev & (select.POLLERR | select.POLLHUP):
                        self._socket_error(by_fd[fd])
            if time.monotonic() >= next_stats:
                self._poll_kernel_stats()
                next_stats = time.monotonic() + STATS_EVERY_S

    def _socket_error(self, cap: _Capture) -> None:
        """Read (and so clear) a pending socket error, e.g. ENETDOWN when the interface went down:
        capture resumes by itself when it comes back up; until then poll() would not block."""
        err = cap.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.socket_errors += 1
            log.warning("afpacket %s: %s", cap.name, os.strerror(err))
        else:
            time.sleep(POLL_MS / 1000)  # POLLHUP without an error: do not spin

    def _poll_kernel_stats(self) -> None:
        with self._klock:
            for c in self._caps:
                if c.mm is None:
                    continue
                try:
                    got = c.kernel_stats()
                except OSError:
                    continue
                for j in range(3):
                    self._kstats[j] += got[j]

    def _cleanup(self) -> None:
        self._poll_kernel_stats()
        with self._klock:
            for c in self._caps:
                c.close()
            self._caps = [c for c in self._caps if c.mm is not None]
            if not self._caps and self._stop_r >= 0:
                os.close(self._stop_r)
                os.close(self._stop_w)
                self._stop_r = self._stop_w = -1

    def stats(self) -> dict[str, Any]:
        """Base counters plus the kernel's own: ``kernel_packets`` (seen, including dropped),
        ``kernel_drops`` (no room in the kernel ring), ``kernel_freeze_q_cnt``."""
        if self.running:
            self._poll_kernel_stats()
        d = super().stats()
        d.update(
            kernel_packets=self._kstats[0],
            kernel_drops=self._kstats[1],
            kernel_freeze_q_cnt=self._kstats[2],
            promiscuous=self.promiscuous,
            socket_errors=self.socket_errors,
        )
        return d
