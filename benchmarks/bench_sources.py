"""Throughput of the sources into a ring drained by a trivial Numba consumer.

``.venv/bin/python -m benchmarks.bench_sources [--frames 2000000] [--size 64]`` prints frames/s for a fast-mode
pcap replay and for the generator (ring pushes included, consumer in another thread), plus the
generator's raw frame building (generate_frames, no ring).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from numba import njit

from benchmarks import harness
from benchmarks.pcapwrite import write_pcap_ns
from low_level.capture.ring import HEAD, TAIL, Ring
from low_level.capture.sources.base import Source
from low_level.capture.sources.generator import GeneratorSource, generate_frames
from low_level.capture.sources.pcap.source import PcapSource


@njit(cache=True, nogil=True)
def _consume(caplen, ctr, acc):
    """Take every available frame (sum their caplens so the slots are really read); returns how many."""
    head = ctr[HEAD]
    tail = ctr[TAIL]
    mask = caplen.shape[0] - 1
    s = 0
    for q in range(tail, head):
        s += caplen[q & mask]
    acc[0] += s
    ctr[TAIL] = head
    return head - tail


def write_pcap(path: str, n: int, size: int) -> None:
    """n generated frames of ``size`` bytes as a nanosecond pcap."""
    frames, caplen, wirelen, ts = generate_frames(
        n, groups=65536, seed=1, snaplen=size, sizes=(size, size), proto_mix={"udp": 1.0}
    )
    write_pcap_ns(Path(path), frames, caplen, wirelen, ts)


def drain_rate(ring: Ring, src: Source, n: int) -> float:
    """Run ``src`` against a consumer thread until n frames were consumed; frames/s."""
    acc = np.zeros(1, dtype=np.int64)
    done = [0]

    def consumer() -> None:
        while done[0] < n:
            got = _consume(ring.caplen, ring.ctr, acc)
            done[0] += got
            if not got:
                time.sleep(0)

    _consume(ring.caplen, ring.ctr, acc)  # compile outside the timing
    th = threading.Thread(target=consumer)
    t = time.perf_counter()
    th.start()
    src.start()
    th.join()
    dt = time.perf_counter() - t
    src.stop()
    src.join()
    return n / dt


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(description=__doc__)
    ap.add_argument("--frames", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--slots", type=int, default=1 << 16)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per measurement (after a warm-up); best and median shown"
    )
    args = ap.parse_args(argv)
    n = args.frames

    def show(label: str, rates: list[float]) -> None:
        rates = sorted(rates)
        print(f"{label}: best {rates[-1] / 1e6:.2f}, median {rates[len(rates) // 2] / 1e6:.2f} M frames/s")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.pcap")
        write_pcap(path, n, args.size)
        rates = []
        for k in range(args.repeat + 1):  # the first run includes compiling (or loading the cache)
            ring = Ring(nslots=args.slots)
            src = PcapSource(path, ring, mode="fast", progress=False)
            rate = drain_rate(ring, src, n)
            assert src.stats()["drops"] == 0 and src.stats()["frames_pushed"] == n
            src.close()
            if k:
                rates.append(rate)
        show(f"pcap fast replay, {n} x {args.size} B", rates)

    for sizes in ((args.size, args.size), (64, 1500)):
        rates = []
        for k in range(args.repeat + 1):
            ring = Ring(nslots=args.slots)
            gen = GeneratorSource(ring, count=n, clock="synthetic", sizes=sizes)
            rate = drain_rate(ring, gen, n)
            if k:
                rates.append(rate)
        show(f"generator into ring, {n} frames, sizes {sizes}", rates)

    generate_frames(1000)
    rates = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        generate_frames(n, snaplen=128)
        rates.append(n / (time.perf_counter() - t))
    show(f"generate_frames (no ring, allocates {n} x 128 B)", rates)


if __name__ == "__main__":
    main()
