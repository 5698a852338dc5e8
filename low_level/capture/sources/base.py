"""The common shape of every packet source: a producer thread that fills one :class:`~low_level.capture.ring.Ring`.

Why a thread per source: the per-packet work runs in Numba ``nogil`` kernels, so a source's thread
and the aggregation kernel's thread really run in parallel; the Python loop around the kernels only
handles pacing, waiting and stopping, once per chunk of packets, never per packet.

A ring is single-producer: give each source its own ring (a source that captures several interfaces,
like :class:`~low_level.capture.sources.afpacket.AfPacketSource`, does it from one thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from low_level.capture.ring import Ring
from low_level.jit.refcount import pin

log = logging.getLogger(__name__)

# Indices of the per-source counters every Numba producer updates (``Source._st``).
ST_READ, ST_PUSHED, ST_DROPS, ST_BYTES = 0, 1, 2, 3
NST_BASE = 4


@njit(cache=True, nogil=True)
def count_frames(st: np.ndarray, nread: int, npushed: int, ndrops: int, nbytes: int) -> None:
    """Add a producer call's counts to its source's stats (once per call: per frame would halve the speed)."""
    st[ST_READ] += nread
    st[ST_PUSHED] += npushed
    st[ST_DROPS] += ndrops
    st[ST_BYTES] += nbytes
    pin(st)


class Source:
    """A producer of frames into a ring, run in its own thread.

    Attributes every source sets:

    * ``live_clock``: timestamps track the wall clock (live capture, paced/looped replay rebased to
      now, generator in wall-clock mode), so a consumer may close time windows by the wall clock.
      When False, time only advances with the data (fast file replay, synthetic generator).
    * ``interfaces``: names of the interfaces whose frames it produces; frame ``iface`` values are
      ``iface_index + position`` in this list.
    * ``wakes_consumer``: the thread calls ``on_records`` (when set) after pushing frames, so the
      consumer may wait for it rather than look at the ring every few milliseconds (an idle live
      interface then costs its host almost nothing).
    """

    kind = "source"
    live_clock: bool = False
    wakes_consumer: bool = False

    def __init__(self, ring: Ring, interfaces: list[str], nstats: int = NST_BASE) -> None:
        self.ring = ring
        self.interfaces = list(interfaces)
        self._st = np.zeros(max(nstats, NST_BASE), dtype=np.int64)  # updated by the Numba kernels
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False
        self.error: BaseException | None = None
        self.on_records: Callable[[], None] | None = None  # see wakes_consumer

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Source:
        """Start the producer thread (once); returns self so ``src = X(...).start()`` reads well."""
        if self._thread is not None:
            raise RuntimeError(f"{self.kind} source already started")
        self._thread = threading.Thread(target=self._main, name=f"lowwater-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the producer to stop; it notices within one chunk (milliseconds). Use join() to wait."""
        self._stop_evt.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the producer thread; True when it has ended (or was never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """True once a finite source is exhausted (end of file, packet count reached).

        A source stopped by stop(), or one that failed (see ``error``), is not finished.
        """
        return self._finished

    @property
    def stopping(self) -> bool:
        return self._stop_evt.is_set()

    def close(self) -> None:
        """Stop if running and release OS resources now (also for a source that never started)."""
        if self.running:
            self.stop()
            self.join()
        self._cleanup()

    def __enter__(self) -> Source:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    # --- stats -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of this source alone (the ring's counters are shared by whoever fills it).

        ``frames_read``: frames taken from the input; ``frames_pushed``: of those, landed in the
        ring; ``drops``: lost because the ring was full (0 for sources that wait); ``bytes``: wire
        bytes of the pushed frames.
        """
        st = self._st
        return {
            "type": self.kind,
            "interfaces": list(self.interfaces),
            "live_clock": self.live_clock,
            "frames_read": int(st[ST_READ]),
            "frames_pushed": int(st[ST_PUSHED]),
            "drops": int(st[ST_DROPS]),
            "bytes": int(st[ST_BYTES]),
            "running": self.running,
            "finished": self._finished,
            "error": None if self.error is None else repr(self.error),
        }

    # --- for subclasses --------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported via .error and the log, the thread must not die silently
            self.error = exc
            log.exception("%s source failed", self.kind)
        finally:
            self._cleanup()

    def _run(self) -> None:
        """The producer loop; set ``self._finished = True`` when a finite input is exhausted."""
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Release OS resources (files, sockets, mmaps) when the producer thread ends."""


class Backoff:
    """Waiting for ring space without burning a core: yield first, then sleep longer, up to 1 ms."""

    def __init__(self) -> None:
        self.n = 0

    def reset(self) -> None:
        self.n = 0

    def wait(self) -> None:
        self.n += 1
        if self.n <= 8:
            time.sleep(0)  # releases the GIL: a Python consumer gets to run
        else:
            time.sleep(min(1e-3, 1e-5 * (1 << min(self.n - 8, 7))))
