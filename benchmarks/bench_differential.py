"""Differential aggregates against re-merging (dissertation §6.2.2.2-3, Eq. 6.1-6.2): sliding windows of
count, sum, avg and variance as they grow from 2 to 60 panes.

Input: the partial records the high level receives, ``groups`` (src_ip) keys, ``per_group`` records per
group per pane (random groups, so most groups are in most panes), punctuation after every pane. Query:
count, sum, avg and variance of the length per key, RANGE = k panes, SLIDE = 1 pane.

* ``remerge`` (``window.differential: false``): every closing window is assembled from its k panes
  (``high_level.aggregate.rollup.assemble``): k pane rows read per group and window.
* ``differential`` (the default for these aggregates): each group's running window plus the entering
  pane minus the expired one (``rollup.slide_windows``): two pane rows per group and window, whatever k.

Both run the real ``QueryRollup`` as the job does (blob state, one close per pane) and must produce the
same windows (checked, every window and group). Measured over the steady panes (after the first k): the
CPU time of a close (one window, the part the two plans differ in) and, apart, of the add that merges a
pane's partials into the pane table (the same code for both). The paper: the differential cost per window is independent of the number of
panes, re-merging grows with it.

    .venv/bin/python -m benchmarks.bench_differential [--quick]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from high_level.aggregate.rollup import Layout, QueryRollup, Windows
from lowwater_testing.queries import spec

MEASURED_PANES = 20
FIGURE = ("differential", "differential_vs_remerge", "dissertation §6.2.3, Eq. 6.1-6.2")


def query(k: int, differential: bool) -> Q.QuerySpec:
    return spec(
        "diff",
        group_by=["src_ip"],
        aggregates=[
            "count as packets",
            "sum(length) as bytes",
            "avg(length) as avg_len",
            "variance(length) as v",
        ],
        window={"range": f"{k}s", "slide": "1s", "differential": differential},
    )


QUERY = query(2, True)


def layout(k: int, differential: bool) -> Layout:
    return Layout.of(query(k, differential))


def pane_records(p: int, groups: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng((7, p, groups, n))
    g = rng.integers(0, groups, n)
    length = rng.integers(64, 1501, n)
    key = np.column_stack([np.zeros(n, np.int64), 0xFFFF_0A00_0000 + g])
    one = np.ones(n, np.int64)
    cols = Q.state_columns(QUERY)  # packets, bytes, avg (sum, count), variance (count, sum, sumsq)
    state = np.column_stack(
        [one if c.source == Q.SRC_ONE else length * length if c.square else length for c in cols]
    )
    return np.full(n, p, np.int64), key, state


def _sorted(w: Windows) -> np.ndarray:
    m = np.column_stack([w.window, w.key, w.state])
    return m[np.lexsort(m.T[::-1])]


def run(k: int, groups: int, per_group: int) -> list[dict[str, Any]]:
    rolls = {"remerge": QueryRollup(layout(k, False)), "differential": QueryRollup(layout(k, True))}
    assert rolls["differential"].layout.differential and not rolls["remerge"].layout.differential
    cpu = dict.fromkeys(rolls, 0.0)
    cpu_add = dict.fromkeys(rolls, 0.0)
    checked = 0
    for p in range(k + MEASURED_PANES):
        pane, key, state = pane_records(p, groups, groups * per_group)
        outs = {}
        for name, roll in rolls.items():
            t0 = time.process_time()
            roll.add(pane, key, state)
            t1 = time.process_time()
            outs[name] = roll.close(p + 1)
            if p >= k:
                cpu_add[name] += t1 - t0
                cpu[name] += time.process_time() - t1
        if not np.array_equal(_sorted(outs["remerge"]), _sorted(outs["differential"])):
            raise AssertionError(f"k={k}, pane {p}: differential and re-merged windows differ")
        checked += len(outs["remerge"])
    return [
        {
            "panes_per_window": k,
            "groups": groups,
            "records_per_group_per_pane": per_group,
            "plan": name,
            "close_cpu_ms_per_window": 1000 * cpu[name] / MEASURED_PANES,
            "add_cpu_ms_per_pane": 1000 * cpu_add[name] / MEASURED_PANES,
            "window_rows_checked": checked,
        }
        for name in rolls
    ]


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="k = 2, 8, 60 with fewer groups")
    ap.add_argument("--groups", type=int, default=None, help="groups (default 20000, quick 2000)")
    args = ap.parse_args()
    ks = [2, 8, 60] if args.quick else [2, 4, 8, 15, 30, 60]
    groups = args.groups or (2000 if args.quick else 20000)
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, load {harness.load()}", flush=True)
    run(2, 16, 1)  # warm imports
    rows: list[dict[str, Any]] = []
    print("  k  close ms: remerge  differential  ratio   add ms (both)")
    for k in ks:
        pair = run(k, groups, 2)
        ratio = pair[1]["close_cpu_ms_per_window"] / pair[0]["close_cpu_ms_per_window"]
        pair[1]["time_ratio_differential_vs_remerge"] = ratio
        rows += pair
        cells = (pair[0]["close_cpu_ms_per_window"], pair[1]["close_cpu_ms_per_window"], ratio)
        print(
            f"{k:3d}", *(f"{x:14.2f}" for x in cells), f"{pair[0]['add_cpu_ms_per_pane']:14.2f}", flush=True
        )
    method = {"measured_panes": MEASURED_PANES, "groups": groups, "quick": args.quick, "load": harness.load()}
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    fig, ax = harness.pyplot().subplots(1, 2, figsize=(11, 4))
    ks_of = {
        plan: [r["panes_per_window"] for r in rows if r["plan"] == plan]
        for plan in ("remerge", "differential")
    }
    for plan, color in (("remerge", "#c63"), ("differential", "#36c")):
        ms = [r["close_cpu_ms_per_window"] for r in rows if r["plan"] == plan]
        ax[0].plot(ks_of[plan], ms, marker="o", color=color, label=plan)
    ratios = [r["time_ratio_differential_vs_remerge"] for r in rows if r["plan"] == "differential"]
    ax[1].plot(ks_of["differential"], ratios, marker="o", color="#36c", label="differential / re-merge")
    ax[1].axhline(1, color="#999", lw=0.8)
    for a in ax:
        a.set_xscale("log")
        a.set_xticks(ks, [str(k) for k in ks])
        a.minorticks_off()
    harness.style_axes(ax, ("CPU ms per close (one window)", "differential / re-merge"), "panes per window")
    harness.save_figure(fig, harness.RESULTS / "differential.png")
    print(f"wrote {harness.RESULTS / 'differential.json'} and differential.png")


if __name__ == "__main__":
    main()
