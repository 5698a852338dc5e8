"""CPU seconds from /proc: per process tree, and for the whole machine.

Why: the benchmark VM is shared, so wall time depends on the neighbours; CPU time much less. Linux only
(elsewhere every figure is 0 or NaN).
"""

from __future__ import annotations

import os
from pathlib import Path


def process_table() -> dict[int, tuple[int, float, float]]:
    """pid -> (ppid, its own user+system CPU seconds, those of its reaped children: cutime + cstime).

    Counting the reaped children's time too keeps processes that have exited (Spark's Python workers) in
    the total of whoever waited for them."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except (OSError, ValueError):
        return {}
    out: dict[int, tuple[int, float, float]] = {}
    for d in pids:
        try:
            f = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick)
    return out


def children(table: dict[int, tuple[int, float, float]]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        kids.setdefault(ppid, []).append(pid)
    return kids


def _own_and_reaped(pid: int, tick: float) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / tick


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants, live or exited (see :func:`process_table`).

    Walks the tree through ``/proc/<pid>/task/<tid>/children`` where the kernel has it, so a benchmark
    that reads its own tree every micro-batch does not pay for reading every process of the machine."""
    try:
        if not Path(f"/proc/{pid}/task/{pid}/children").exists():  # a kernel without it: the table
            raise FileNotFoundError(pid)
        tick = float(os.sysconf("SC_CLK_TCK"))
        total, todo = 0.0, [pid]
        while todo:
            x = todo.pop()
            try:
                total += _own_and_reaped(x, tick)
                for t in os.listdir(f"/proc/{x}/task"):
                    todo.extend(int(c) for c in Path(f"/proc/{x}/task/{t}/children").read_text().split())
            except FileNotFoundError:  # it exited meanwhile: its time is in its parent's reaped time
                continue
        return total
    except (OSError, ValueError):
        pass
    table = process_table()
    kids = children(table)
    total, todo = 0.0, [pid]
    while todo:
        x = todo.pop()
        _, own, reaped = table.get(x, (0, 0.0, 0.0))
        total += own + reaped
        todo.extend(kids.get(x, []))
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (user, nice, system, irq, softirq of /proc/stat; not
    idle, iowait or steal): over a run, busy / wall is how many of the cores every process together used."""
    try:
        f = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f[1:8])
        return (user + nice + system + irq + softirq) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return float("nan")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` by thread name (``comm``, 15 characters; threads of one
    name, e.g. a pool's, add up): where a JVM spends its time, read without attaching to it."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = {}
    for t in tids:
        try:
            text = Path(f"/proc/{pid}/task/{t}/stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")].rstrip("0123456789-#")
        f = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
    return out
