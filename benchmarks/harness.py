"""One harness for every benchmark: the common flags, the machine and its load, the results files, the plots.

Every benchmark runs from the repository root as ``python -m benchmarks.<name>`` (``.venv/bin/python -m
benchmarks.bench_n3 --quick``) and imports what it shares with the tests from ``lowwater_testing``, never
from ``tests/``. It writes its JSON (with the machine and the load average it ran under) and its pictures to
``benchmarks/results/``, the published figures, or to ``--out DIR`` for a trial run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"  # where results go; ``--out`` moves it for this run


def _lscpu() -> dict[str, str]:
    """lscpu's fields (vendor, family, model, caches): "AMD EPYC" alone does not say which CPU it was."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {
        k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v.strip()
    }


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()  # noqa: SIM115
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def machine() -> dict[str, str | int]:
    """What machine a benchmark ran on: printed with every result, stored in every results file."""
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
    cpu_id = ", ".join(
        f"{k} {ls[k]}"
        for k in ("Vendor ID", "CPU family", "Model", "Stepping", "L2 cache", "L3 cache")
        if k in ls
    )
    return {
        "cpu": cpu,
        "cpu_id": cpu_id,
        "hypervisor": ls.get("Hypervisor vendor", "none"),
        "thp": _thp_mode(),
        "cores": os.cpu_count() or 0,
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def load() -> list[float]:
    """The 1, 5 and 15-minute load averages: the machine may be shared, a figure says how busy it was."""
    return [round(x, 2) for x in os.getloadavg()]


class _Parser(argparse.ArgumentParser):
    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        global RESULTS
        ns = super().parse_args(args, namespace)
        RESULTS = Path(ns.out)
        RESULTS.mkdir(parents=True, exist_ok=True)
        return ns


def parser(doc: str | None = None, **kw: Any) -> argparse.ArgumentParser:
    """The benchmark's argument parser (``doc``: its module docstring, the first paragraph is the description),
    with the common ``--out DIR`` flag: where the JSON and the pictures go (default ``benchmarks/results``)."""
    if doc is not None:
        kw.setdefault("description", doc.split("\n\n")[0])
    ap = _Parser(**kw)
    ap.add_argument(
        "--out",
        default=str(RESULTS),
        help="directory for the results JSON and pictures "
        "(default: benchmarks/results, the published figures)",
    )
    return ap


def write_results(name: str, doc: Any, indent: int = 2) -> Path:
    """Write ``doc`` as ``<results>/<name>`` (indented JSON); a dict gets the load average at write time
    (``load_avg_at_write``) unless it carries its own. Creates the folder. Returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    if isinstance(doc, dict):
        doc.setdefault("load_avg_at_write", load())
    path = RESULTS / name
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    return path


def write_figure(
    figure: tuple[str, str, str], machine: dict, rows: list, doc: str | None, method: dict
) -> Path:
    """The results file of a benchmark that reproduces a paper's figure, ``figure`` = (file name, benchmark,
    the paper's figure): ``<name>.json`` holding the benchmark, the figure, the machine, the method (the
    module's ``doc`` and its settings) and the rows."""
    name, benchmark, paper = figure
    return write_results(
        f"{name}.json",
        {
            "benchmark": benchmark,
            "figure": paper,
            "machine": machine,
            "method": {"doc": doc, **method},
            "rows": rows,
        },
    )


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (benchmarks run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay the figure out tight, save it as ``path`` and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def style_axes(
    ax: Any, titles: tuple[str, ...], xlabel: str, legend_each: bool = False, suptitle: str | None = None
) -> None:
    """The plots' common look: a small title per panel, the shared x label, a light grid, small legends
    (on every panel, or on the first only), the figure's title if given."""
    for a, t in zip(ax, titles, strict=True):
        a.set_title(t, fontsize=9)
        a.set_xlabel(xlabel)
        a.grid(alpha=0.3)
        if legend_each:
            a.legend(fontsize=8)
    if not legend_each:
        ax[0].legend(fontsize=8)
    if suptitle is not None:
        ax[0].figure.suptitle(suptitle, fontsize=10)
