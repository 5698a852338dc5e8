"""The machine's own per-CPU efficiency: a reference CPU-bound workload run alone, then two at once.

Why: ``per_cpu_efficiency_p2`` (records per executor CPU-second at two executors over one) can only be as
good as the machine lets two busy processes be. On a VM whose two vCPUs share a physical core, caches or a
memory bus, or beside a driver and a broker, the same work costs more CPU-seconds when two run at once.
This measures that ceiling with work that has nothing of lowwater in it: ``memory`` scatters increments
into a 64 MB table (like the roll-up's hash tables), ``compute`` hashes an in-cache buffer. Efficiency =
work per CPU-second of each of the two run together / work per CPU-second of one run alone.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

# one child: KIND UNITS [CPU]; prints "units cpu_seconds"
_CHILD = """
import hashlib, os, resource, sys
import numpy as np
kind, units = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3:
    os.sched_setaffinity(0, {int(sys.argv[3])})
rng = np.random.default_rng(7)
if kind == "memory":
    table = np.zeros(8 << 20, dtype=np.int64)  # 64 MB: beyond the caches
    idx = rng.integers(0, table.size, 1 << 20)
    t0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(units):
        table[(idx + i * 7919) & (table.size - 1)] += 1
else:
    buf = rng.bytes(64 << 10)
    t0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(units):
        hashlib.sha256(buf).digest()
t1 = resource.getrusage(resource.RUSAGE_SELF)
print(units, (t1.ru_utime + t1.ru_stime) - (t0.ru_utime + t0.ru_stime))
"""
UNITS = {"memory": 60, "compute": 6_000}  # about 1.5 CPU-s each on a 2.8 GHz Xeon


def _run(kind: str, n: int, pin: bool) -> tuple[list[float], float]:
    """``n`` children at once: each one's work per CPU-second, and the wall time of all."""
    cpus = sorted(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                kind,
                str(UNITS[kind]),
                *([str(cpus[i % len(cpus)])] if pin else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    rates = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        units, cpu = out.split()
        rates.append(int(units) / max(float(cpu), 1e-9))
    return rates, time.perf_counter() - t0


def per_cpu_efficiency(repeat: int = 3, pin: bool = False) -> dict:
    """Per kind: the median over ``repeat`` rounds (alone, then two at once) of the two's work per CPU-second
    over the lone run's, and the wall-clock speed-up of two at once (at most 2)."""
    out: dict = {
        "what": "a reference CPU-bound workload (benchmarks/cpuref.py) run alone, then two at once, beside the "
        "same broker and cluster: the two's work per CPU-second over the lone run's is the most "
        "per_cpu_efficiency_p2 can reach on this machine",
        "pinned": pin,
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
    }
    for kind in UNITS:
        eff, speedup = [], []
        for _ in range(repeat):
            (alone,), t1 = _run(kind, 1, pin)
            two, t2 = _run(kind, 2, pin)
            eff.append(statistics.mean(two) / alone)
            speedup.append(2 * t1 / t2)
        out[kind] = {
            "per_cpu_efficiency_2_vs_1": round(statistics.median(eff), 3),
            "runs": [round(x, 3) for x in eff],
            "wall_speedup_2_vs_1": round(statistics.median(speedup), 3),
        }
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(per_cpu_efficiency(pin="--pin" in sys.argv), indent=1))
