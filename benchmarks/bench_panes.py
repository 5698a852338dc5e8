"""Panes vs no panes for sliding windows (dissertation Fig. 6-15): the paned roll-up lowwater uses
against evaluating each window from its own partials (WID without panes).

Input: the partial records the high level receives (here one packet per record, the worst case for
the roll-up), ``groups`` (src_ip, dst_ip) keys, ``per_pane`` records per pane (1 s), punctuation after
every pane. Query: count + max(length) per key, RANGE = k panes, SLIDE = 1 pane, k = range/slide.

* ``paned`` (lowwater, ``high_level.aggregate.rollup.QueryRollup`` as the job runs it): records merge into one
  row per (pane, key); a window is assembled from its k panes when punctuation closes it.
* ``unpaned`` (WID): each record is bucketed into all k windows it belongs to
  (``rollup.expand_windows``) and merged into one row per (window, key) of a window-keyed
  ``QueryRollup`` (tumbling layout), which emits a window as it closes.

Both produce the same windows (checked: every closed window's totals are equal). Measured: CPU time
per pane over the steady panes (after the first k), and the rows held after each close (mean).
The paper: at 20 tuples per pane and 5 panes per window the paned plan takes ~30 % of the time.

    .venv/bin/python -m benchmarks.bench_panes [--quick]
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from high_level.aggregate.rollup import Layout, QueryRollup, expand_windows
from lowwater_testing.queries import spec

MEASURED_PANES = 20


FIGURE = (
    "panes",
    "panes_vs_no_panes",
    "dissertation Fig. 6-15",
)  # results file, benchmark, the paper's figure


def layout(k: int) -> Layout:
    q = spec(
        "panes",
        group_by=["src_ip", "dst_ip"],
        aggregates=["count as packets", "max(length) as biggest"],
        window={"range": f"{k}s", "slide": "1s"},
    )
    return Layout.of(q)


def pane_records(p: int, groups: int, per_pane: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng((5, p, groups, per_pane))
    g = rng.integers(0, groups, per_pane)
    key = np.column_stack(
        [
            np.zeros(per_pane, np.int64),
            0xFFFF_0A00_0000 + g // 64,
            np.zeros(per_pane, np.int64),
            0xFFFF_C0A8_0000 + g,
        ]
    )
    state = np.column_stack([np.ones(per_pane, np.int64), rng.integers(64, 1501, per_pane)])
    return np.full(per_pane, p, np.int64), key, state


def run(k: int, groups: int, per_pane: int) -> list[dict[str, Any]]:
    lay = layout(k)
    lay1 = dataclasses.replace(lay, k=1, range_ns=lay.pane_ns)  # one row per (window, key)
    paned, unpaned = QueryRollup(lay), QueryRollup(lay1)
    cpu = {"paned": 0.0, "unpaned": 0.0}
    rows: dict[str, list[int]] = {"paned": [], "unpaned": []}
    totals: dict[str, dict[int, tuple[int, int]]] = {"paned": {}, "unpaned": {}}
    n_panes = k + MEASURED_PANES

    def close(name: str, roll: QueryRollup, p: int, steady: bool, t0: float) -> None:
        """Close ``roll`` before pane p + 1: CPU since ``t0`` and rows held count in the steady phase;
        every closed window's (packets, max length) kept to compare the two plans."""
        out = roll.close(p + 1)
        dt = time.process_time() - t0
        if steady:
            cpu[name] += dt
            rows[name].append(len(roll))
        for w in np.unique(out.window).tolist():
            s = out.window == w
            totals[name][w] = (int(out.state[s, 0].sum()), int(out.state[s, 1].max()))

    for p in range(n_panes):
        pane, key, state = pane_records(p, groups, per_pane)
        t0 = time.process_time()
        paned.add(pane, key, state)
        close("paned", paned, p, p >= k, t0)
        t0 = time.process_time()
        idx, win = expand_windows(pane, p, p + k, k)
        unpaned.add(win, key[idx], state[idx])
        close("unpaned", unpaned, p, p >= k, t0)
    if totals["paned"] != totals["unpaned"]:
        raise AssertionError(f"k={k}: paned and unpaned windows differ")
    return [
        {
            "panes_per_window": k,
            "groups": groups,
            "records_per_pane": per_pane,
            "records_per_group_per_pane": per_pane / groups,
            "plan": v,
            "cpu_ms_per_pane": 1000 * cpu[v] / MEASURED_PANES,
            "rows_mean": float(np.mean(rows[v])),
            "windows_checked": len(totals[v]),
        }
        for v in ("paned", "unpaned")
    ]


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="k = 2, 5, 20; one density")
    ap.add_argument("--groups", type=int, default=2048)
    args = ap.parse_args()
    ks = [2, 5, 20] if args.quick else [2, 5, 10, 20, 60]
    dens = [20] if args.quick else [1, 20]
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores", flush=True)
    layout(2)  # warm imports
    rows: list[dict[str, Any]] = []
    print(
        f"{'k':>3s} {'rec/group/pane':>14s} {'paned ms':>9s} {'unpaned ms':>10s} {'ratio':>6s} {'paned rows':>10s} "
        f"{'unpaned rows':>12s}"
    )
    for d in dens:
        for k in ks:
            a, b = run(k, args.groups, d * args.groups)
            a["time_ratio_paned_vs_unpaned"] = a["cpu_ms_per_pane"] / b["cpu_ms_per_pane"]
            a["rows_ratio_paned_vs_unpaned"] = a["rows_mean"] / b["rows_mean"]
            rows += [a, b]
            print(
                f"{k:3d} {d:14d} {a['cpu_ms_per_pane']:9.2f} {b['cpu_ms_per_pane']:10.2f} "
                f"{a['time_ratio_paned_vs_unpaned']:6.2f} {a['rows_mean']:10,.0f} {b['rows_mean']:12,.0f}",
                flush=True,
            )
    method = {"measured_panes": MEASURED_PANES, "groups": args.groups, "quick": args.quick}
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for d, color in zip(dens, ("#36c", "#2a7"), strict=False):
        rs = [r for r in rows if r["plan"] == "paned" and r["records_per_group_per_pane"] == d]
        for axis, ratio in zip(
            ax, ("time_ratio_paned_vs_unpaned", "rows_ratio_paned_vs_unpaned"), strict=True
        ):
            axis.plot(
                [r["panes_per_window"] for r in rs],
                [r[ratio] for r in rs],
                marker="o",
                color=color,
                label=f"{d} record(s) per group per pane",
            )
    for a in ax:
        a.set_xscale("log")
        a.axhline(1, color="#999", lw=0.8)
    titles = ("CPU time, paned / unpaned", "rows held, paned / unpaned")
    harness.style_axes(ax, titles, "panes per window (range / slide)", legend_each=True)
    harness.save_figure(fig, harness.RESULTS / "panes.png")
    print(f"wrote {harness.RESULTS / 'panes.json'} and panes.png")


if __name__ == "__main__":
    main()
