"""What machine a benchmark ran on: printed with every result, stored in every results file."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime


def _lscpu() -> dict[str, str]:
    """lscpu's fields (vendor, family, model, caches): "AMD EPYC" alone does not say which CPU it was."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v.strip()}


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()  # noqa: SIM115
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def machine() -> dict[str, str | int]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = 0
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError):
        pass
    ls = _lscpu()
    cpu_id = ", ".join(f"{k} {ls[k]}" for k in ("Vendor ID", "CPU family", "Model", "Stepping", "L2 cache", "L3 cache")
                       if k in ls)
    return {"cpu": cpu, "cpu_id": cpu_id, "hypervisor": ls.get("Hypervisor vendor", "none"), "thp": _thp_mode(),
            "cores": os.cpu_count() or 0, "memory_gib": mem_gib, "python": platform.python_version(),
            "date": datetime.now(UTC).isoformat(timespec="seconds")}
