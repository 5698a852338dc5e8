"""``PcapSource``: replay a pcap or pcapng file into a ring, from its own thread or pulled by the agent.

The file is memory-mapped and walked by the Numba kernels of ``low_level.capture.sources.pcap.walk``,
a chunk of records per call, so a replay runs at memory speed and stop() is still noticed within a few
milliseconds. Modes, formats and damaged files: see ``low_level.capture.sources.pcap``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from typing import Any

import numpy as np

from low_level.capture.ring import Ring
from low_level.capture.sources.base import ST_PUSHED, ST_READ, Backoff, Source
from low_level.capture.sources.pcap import format as fmt
from low_level.capture.sources.pcap.format import UnsupportedLinktypeError, _pcapng_header_linktypes
from low_level.capture.sources.pcap.link import LT_ETHERNET, SCRATCH, linktype_msg, readable
from low_level.capture.sources.pcap.walk import pcap_kernel, pcapng_kernel

log = logging.getLogger(__name__)


class PcapSource(Source):
    """Replays a pcap/pcapng capture into a ring (see the module docstring for modes and formats)."""

    kind = "pcap"

    def __init__(
        self,
        path: str | os.PathLike[str],
        ring: Ring,
        iface_index: int = 0,
        mode: str = "fast",
        loop: bool = False,
        rebase_to_now: bool = False,
        progress: bool = True,
        speed: float = 1.0,
    ) -> None:
        if mode not in ("fast", "paced"):
            raise ValueError(f"pcap mode must be 'fast' or 'paced', not {mode!r}")
        if not speed > 0:
            raise ValueError(f"pcap speed must be > 0, not {speed!r}")
        self.path = os.fspath(path)
        super().__init__(ring, [os.path.basename(self.path)], nstats=fmt.NST)
        self.iface_index = int(iface_index)
        self.mode = mode
        self.loop = bool(loop)
        self.rebase_to_now = bool(rebase_to_now)
        self.progress = bool(progress)
        self.speed = float(speed)
        self.live_clock = self.rebase_to_now
        self.passes = 0
        self.malformed_tail = False
        self.reason: str | None = None
        self._pulled = False

        size = os.path.getsize(self.path)
        if size < 24:
            raise ValueError(f"{self.path}: not a pcap/pcapng file ({size} bytes)")
        with open(self.path, "rb") as f:
            # a private mapping: writable as numpy sees it (so a ring over it has the type of any ring's
            # frames and the kernels compile once); nothing writes to it
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)
        try:
            self._detect()
        except Exception:
            self._cleanup()
            raise

    def _detect(self) -> None:
        head = bytes(self._buf[:24])
        (magic_le,) = struct.unpack("<I", head[:4])
        self._p = np.zeros(fmt.NP, dtype=np.int64)
        self._p[fmt.P_END] = len(self._buf)
        self._p[fmt.P_IFIDX] = self.iface_index
        self._ifs = np.zeros((fmt.MAX_IFACES, 5), dtype=np.int64)
        self._p[fmt.P_LINKTYPE] = LT_ETHERNET  # pcapng: per interface, in _ifs
        self._scratch = np.zeros(SCRATCH, dtype=np.uint8)  # a record rewritten as Ethernet (link.to_ethernet)
        if magic_le == fmt.BT_SHB:
            self.format = "pcapng"
            self._data_start = 0
            _pcapng_header_linktypes(self._buf, self.path)
            return
        formats = {0xA1B2C3D4: 1000, 0xA1B23C4D: 1}
        (magic_be,) = struct.unpack(">I", head[:4])
        if magic_le in formats:
            endian, mult = "<", formats[magic_le]
        elif magic_be in formats:
            endian, mult = ">", formats[magic_be]
        else:
            raise ValueError(f"{self.path}: not a pcap/pcapng file (magic 0x{magic_le:08x})")
        _vmaj, _vmin, _zone, _sigfigs, snaplen, network = struct.unpack(endian + "HHiIII", head[4:24])
        linktype = network & 0xFFFF
        if not readable(linktype):
            raise UnsupportedLinktypeError(linktype_msg(self.path, linktype))
        self._p[fmt.P_LINKTYPE] = linktype
        self.format = "pcap-ns" if mult == 1 else "pcap"
        self._data_start = 24
        self._p[fmt.P_BE] = endian == ">"
        self._p[fmt.P_TSMULT] = mult
        self._p[fmt.P_MAXCAP] = max(snaplen, fmt.PCAP_MAX_CAPLEN)

    # --- producer ----------------------------------------------------------------------------
    def _new_pass(self) -> None:
        st = self._st
        st[fmt.S_POS] = self._data_start
        st[fmt.S_BASE_IN] = st[fmt.S_LAST_TS] = fmt.NONE
        st[fmt.S_BE] = st[fmt.S_NIF] = st[fmt.S_IFBASE] = st[fmt.S_PASS_READ] = 0
        self._pass_mono = time.monotonic_ns()
        self._p[fmt.P_OUTBASE] = time.time_ns()
        self._p[fmt.P_REBASE] = self.rebase_to_now

    def _call(self) -> int:
        ring = self.ring
        if ring.zero_copy and (ring.frames is not self._buf or not self._zero_copy_ok()):
            raise RuntimeError(
                "a ring over the file is only filled by a fast classic-pcap replay of that file"
            )
        if self.format == "pcapng":
            return int(
                pcapng_kernel(
                    self._buf, self._st, self._p, self._scale, self._ifs, self._scratch, ring.arrays()
                )
            )
        return int(
            pcap_kernel(self._buf, self._st, self._p, self._scale, self._scratch, ring.arrays(), ring.offs)
        )

    def _run(self) -> None:
        paced = self.mode == "paced"
        p, st = self._p, self._st
        p[fmt.P_MAXN] = fmt.CHUNK
        p[fmt.P_WAIT] = not paced
        p[fmt.P_ELAPSED] = fmt.FOREVER
        self._scale = 1.0 / self.speed if paced else 1.0
        bar = None
        if self.progress and not paced:
            from tqdm import tqdm

            bar = tqdm(desc=os.path.basename(self.path), unit="pkt", unit_scale=True, mininterval=0.5)
        shown = 0
        backoff = Backoff()
        self._new_pass()
        try:
            while not self._stop_evt.is_set():
                if paced:
                    p[fmt.P_ELAPSED] = int((time.monotonic_ns() - self._pass_mono) * self.speed)
                rc = self._call()
                if bar is not None and st[ST_READ] - shown >= 1:
                    bar.update(int(st[ST_READ]) - shown)
                    shown = int(st[ST_READ])
                    bar.set_postfix_str(
                        f"{100.0 * st[fmt.S_POS] / max(1, p[fmt.P_END]):.0f}% of file", refresh=False
                    )
                if rc == fmt.RC_CHUNK:
                    backoff.reset()
                elif rc == fmt.RC_FULL:
                    backoff.wait()
                elif rc == fmt.RC_WAIT:
                    due_mono = self._pass_mono + int(st[fmt.S_NEXT_REL] / self.speed)
                    delay = (due_mono - time.monotonic_ns()) / 1e9
                    if delay > 0:
                        self._stop_evt.wait(min(delay, 0.01))
                elif rc in (fmt.RC_EOF, fmt.RC_MALFORMED):
                    if self._end_of_pass(rc):
                        return
                elif rc == fmt.RC_LINKTYPE:
                    self._linktype_error()
        finally:
            if bar is not None:
                bar.close()

    def _end_of_pass(self, rc: int) -> bool:
        """The kernel reached the end of the file (or a malformed tail): count the pass, start the next
        one when looping over a file that had records, else finish. True when the replay is over."""
        if rc == fmt.RC_MALFORMED and not self.malformed_tail:
            self.malformed_tail = True
            self.reason = self._bad_reason()
        self.passes += 1
        if self.loop and self._st[fmt.S_PASS_READ] > 0:
            self._new_pass()
            return False
        self._finished = True
        return True

    def _linktype_error(self) -> None:
        """An interface block with a link type lowwater cannot parse: say which, where, and stop."""
        where = f" (interface block at offset {int(self._st[fmt.S_BAD_POS])})"
        self.reason = linktype_msg(self.path, int(self._st[fmt.S_BAD_A]), where)
        raise UnsupportedLinktypeError(self.reason)

    # --- pulled by the consumer ---------------------------------------------------------------
    def _zero_copy_ok(self) -> bool:
        """Whether every record takes pcap_kernel's fast path (so none would be copied into the ring): an
        Ethernet classic pcap replayed fast without rebasing."""
        return (
            self.format != "pcapng"
            and self._p[fmt.P_LINKTYPE] == LT_ETHERNET
            and self.mode == "fast"
            and not self.rebase_to_now
        )

    def pull_ring(self, nslots: int, snaplen: int) -> Ring:
        """The ring to :meth:`pull` into: for a fast classic-pcap replay one over the mapped file itself
        (Ring.over: the kernel reads each frame where it lies, nothing is copied), else a plain ring.
        Also made this source's ring."""
        if self._zero_copy_ok() and self._buf.size:
            self.ring = Ring.over(self._buf, nslots, snaplen)
        else:
            self.ring = Ring(nslots, snaplen)
        return self.ring

    @property
    def can_pull(self) -> bool:
        """A fast replay can also be driven by its consumer (:meth:`pull`) instead of its own thread."""
        return self.mode == "fast" and self._thread is None

    def pull(self, max_frames: int) -> int:
        """Replay up to ``max_frames`` more records into the ring from the caller's thread; returns the
        frames pushed (0 once the replay is over: see ``finished`` and ``error``).

        For a consumer that has one core to itself and the reader: there a reader thread only adds
        thread switches, and with the ring's whole length between the writer and the reader the frames
        have left the cache when the kernel reads them. Pulled a few thousand at a time, the consumer
        reads them while they are still there. Never start() a source that is pulled."""
        if self._thread is not None or self.mode != "fast":
            raise RuntimeError("pull() is for a fast replay without its own thread")
        if self._finished or self.error is not None or self._stop_evt.is_set() or self._buf.size == 0:
            return 0  # over, failed, stopped or closed
        st, p = self._st, self._p
        if not self._pulled:
            self._pulled = True
            p[fmt.P_WAIT] = 1
            p[fmt.P_ELAPSED] = fmt.FOREVER
            self._scale = 1.0
            self._new_pass()
        p[fmt.P_MAXN] = max_frames
        before = int(st[ST_PUSHED])
        try:
            rc = self._call()
            if rc in (fmt.RC_EOF, fmt.RC_MALFORMED):
                self._end_of_pass(rc)
            elif rc == fmt.RC_LINKTYPE:
                self._linktype_error()
        except Exception as exc:  # as a source thread does: reported via .error and the log, never raised
            self.error = exc
            log.exception("%s source failed", self.kind)
        return int(st[ST_PUSHED]) - before

    def _bad_reason(self) -> str:
        st = self._st
        text = fmt.BAD_REASONS.get(int(st[fmt.S_BAD_CODE]), "code {a} {b}").format(
            a=int(st[fmt.S_BAD_A]), b=int(st[fmt.S_BAD_B])
        )
        return f"{self.path}: stopped at offset {int(st[fmt.S_BAD_POS])}: {text}"

    def _cleanup(self) -> None:
        self._buf = np.zeros(0, dtype=np.uint8)
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with it
            pass

    def stats(self) -> dict[str, Any]:
        """Base counters plus the file position, the passes done and why the replay stopped early."""
        d = super().stats()
        st = self._st
        d.update(
            path=self.path,
            format=getattr(self, "format", None),
            mode=self.mode,
            passes=self.passes,
            position=int(st[fmt.S_POS]),
            malformed_tail=self.malformed_tail,
            malformed_offset=int(st[fmt.S_BAD_POS]) if self.malformed_tail else None,
            reason=self.reason,
        )
        return d
