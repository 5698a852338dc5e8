"""How many CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota.

Why: in a container ``os.cpu_count()`` is the host's core count. A capture host's agent limited to
``cpus: 2.0`` on a 32-core machine must not start 16 workers (each a capture thread, a kernel loop,
a ring and tables) that then share two CPUs' worth of time. Docker's ``--cpus`` is a CFS quota:
``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (cgroup v1).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_paths(proc_cgroup: str | None) -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup ('' is the v2 unified one)."""
    out: dict[str, str] = {}
    for line in (proc_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(",") if parts[1] else [""]:
                out[ctl] = parts[2]
    return out


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The CPU quota in CPUs (e.g. 2.0), or None when there is none (or no cgroup fs to read).

    A container sees its own cgroup at the mount's root; a process on the host sees it under the path
    /proc/self/cgroup names: both places are tried, the first quota found counts.
    """
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    own = _own_paths(proc_cgroup)
    v2 = own.get("", "/").lstrip("/")
    for d in dict.fromkeys([root / v2, root]):  # cgroup v2: "max 100000" or "200000 100000"
        text = _read(d / "cpu.max")
        if text is not None:
            quota, _, period = text.partition(" ")
            if quota != "max" and period:
                return int(quota) / int(period)
            return None
    v1 = own.get("cpu", "/").lstrip("/")
    for base in (root / "cpu,cpuacct", root / "cpu"):
        for d in dict.fromkeys([base / v1, base]):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if quota is not None and period is not None:
                q = int(quota)
                return q / int(period) if q > 0 else None
    return None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int:
    """CPUs this process may use: the affinity mask's size, capped by the cgroup quota (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)
