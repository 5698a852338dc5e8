"""What machine a benchmark ran on: printed with every result, stored in every results file."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime


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
    return {"cpu": cpu, "cores": os.cpu_count() or 0, "memory_gib": mem_gib, "python": platform.python_version(),
            "date": datetime.now(UTC).isoformat(timespec="seconds")}
