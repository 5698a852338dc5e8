"""Dissertation Fig. 6-10: WID (panes) against buffering for a row window, tuple-based sliding max, RANGE
4000 rows, SLIDE from 1 to 4000 rows (``high_level/rows/windows.py``); one max (the paper's) and a max per
group over 100 groups (``group_by: [dst_port]``).

One in-order stream (the paper's Experiment 1: no disorder) of ``--rows`` packet lengths, fed in flushes of
``FLUSH`` rows (a capture host's table flush). *WID*: the host numbers the rows (``low_level.kernel.rownum``)
and sub-aggregates max per (pane, group), pane = gcd(RANGE, SLIDE) rows; the high level merges the pane
partials and closes every window the host's row count passed (``RowWindows``): state = the open panes.
*Buffering*: keep the last RANGE rows and re-aggregate each window from them at every slide (one group: the
max of a strided view over the buffer, no copy; groups: a scatter-max of each window's rows): state = RANGE
rows. Both emit the same (window, group, max) rows (compared). Execution time = process time of everything
after the data is made; the scan line = one pass of max over the input. Virtual time: the stream is an
array, run at full CPU speed as in the paper.

    .venv/bin/python -m benchmarks.bench_rowwid [--quick] [--rows 400000]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract.query.rows import row_query
from high_level.aggregate.merge import group_reduce
from high_level.rows.windows import RowWindows
from low_level.kernel.rownum import RowCounter

FIGURE = ("rowwid", "bench_rowwid", "dissertation Fig. 6-10 (WID vs buffering, tuple-based sliding max)")
RANGE = 4000
SLIDES = (1, 2, 5, 10, 20, 50, 100, 200, 400, 1000, 2000, 4000)
QUICK_SLIDES = (10, 40, 100, 400, 1000, 4000)
FLUSH = 10_000
GROUPS = (1, 100)  # the paper's single max, and max per dst_port over 100 ports
I64 = np.int64


def wid(length: np.ndarray, group: np.ndarray, slide: int) -> tuple[np.ndarray, float, int]:
    """(window end, group, max) rows in window order, process time, peak pane rows held."""
    spec = row_query(
        {
            "name": "r",
            "group_by": ["dst_port"],
            "aggregates": [{"fn": "max", "field": "length"}],
            "window": {"rows": RANGE, "slide": slide},
        }
    )
    pane_rows = spec.window.pane_rows
    t0 = time.process_time()
    counter, op = RowCounter(0), RowWindows(spec, 0, 1)
    out, peak = [], 0
    for i in range(0, len(length), FLUSH):
        v, g = length[i : i + FLUSH], group[i : i + FLUSH]
        pane = counter.number(np.zeros((len(v), 0), I64)) // pane_rows
        keys, st = group_reduce(np.column_stack([pane, g]), v.reshape(-1, 1), spec.ops)
        op.add("h", np.zeros((len(keys), 0), I64), keys[:, 0], keys[:, 1:], st)
        op.punctuate("h", *counter.punctuation())
        peak = max(peak, op.state_rows)
        res = op.close()
        out.append(np.column_stack([res.end_row, res.key[:, 0], res.state[:, 0]]))
    return np.concatenate(out), time.process_time() - t0, peak


def buffering(
    length: np.ndarray, group: np.ndarray, slide: int, groups: int
) -> tuple[np.ndarray, float, int]:
    """Keep the last RANGE rows; at every slide, re-aggregate the window ending there from the buffer: one
    group, the max of a strided view (no copy, SIMD); several, a scatter-max of the window's rows."""
    t0 = time.process_time()
    buf, gbuf = np.zeros(0, I64), np.zeros(0, I64)
    seen, out = 0, []
    for i in range(0, len(length), FLUSH):
        data = np.concatenate([buf, length[i : i + FLUSH]])
        gdata = np.concatenate([gbuf, group[i : i + FLUSH]])
        base = seen - len(buf)  # row number of data[0]
        ends = np.arange(seen // slide + 1, (base + len(data)) // slide + 1, dtype=I64) * slide
        seen = base + len(data)
        if len(ends) and groups == 1:
            padded = np.concatenate([np.full(RANGE - 1, np.iinfo(I64).min, I64), data])
            view = np.lib.stride_tricks.sliding_window_view(padded, RANGE)
            first = int(ends[0] - base - 1)  # the ends are evenly spaced: a strided view, no copy
            mx = view[first : first + len(ends) * slide : slide].max(axis=1)
            out.append(np.column_stack([ends, gdata[:1].repeat(len(ends)), mx]))
        for b in range(0, len(ends) if groups > 1 else 0, 256):  # blocks of windows bound the memory
            e = ends[b : b + 256] - base
            s0 = np.maximum(e - RANGE, 0)
            n = e - s0
            rows = np.repeat(s0, n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
            cell = np.full((len(e), groups), np.iinfo(I64).min, I64)
            np.maximum.at(cell, (np.repeat(np.arange(len(e)), n), gdata[rows]), data[rows])
            w, k = np.nonzero(cell != np.iinfo(I64).min)
            out.append(np.column_stack([e[w] + base, k, cell[w, k]]))
        buf, gbuf = data[-RANGE:], gdata[-RANGE:]
    return np.concatenate(out), time.process_time() - t0, RANGE


def measure(length: np.ndarray, groups: int, slide: int) -> dict[str, Any]:
    group = np.random.default_rng(2).integers(0, groups, len(length)).astype(I64)
    w_out, w_s, w_peak = wid(length, group, slide)
    b_out, b_s, b_rows = buffering(length, group, slide, groups)
    b_out = b_out[(b_out[:, 0] - RANGE) % slide == 0]  # windows start at multiples of the slide (WID)
    if not np.array_equal(w_out[np.lexsort(w_out.T[::-1])], b_out[np.lexsort(b_out.T[::-1])]):
        raise SystemExit(f"slide {slide}, {groups} groups: WID and buffering disagree")
    return {
        "range_rows": RANGE,
        "slide_rows": slide,
        "groups": groups,
        "windows": int(len(np.unique(w_out[:, 0]))),
        "wid_s": w_s,
        "buffering_s": b_s,
        "wid_state_rows_peak": w_peak,
        "buffering_state_rows": b_rows,
        "ratio_buffering_over_wid": b_s / w_s if w_s else None,
    }


def main() -> None:
    m = machine()
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="rows of stream (400,000; --quick: 100,000)")
    ap.add_argument("--quick", action="store_true", help="100K rows, six slides (a smoke check)")
    args = ap.parse_args()
    n = args.rows or (100_000 if args.quick else 400_000)
    slides = QUICK_SLIDES if args.quick else SLIDES
    length = np.random.default_rng(1).integers(40, 1500, n).astype(I64)
    t0 = time.process_time()
    length.max()
    scan_s = time.process_time() - t0
    print(
        f"{n:,} rows, RANGE {RANGE}, on {m['cores']} cores of {m['cpu']}\ngroups | slide | windows | WID s | buffering s | WID panes"
    )
    wid(length[: 2 * FLUSH], np.zeros(2 * FLUSH, I64), RANGE)  # compile the numbering kernel (numba) first
    rows = [measure(length, g, s) for g in GROUPS for s in slides]
    for r in rows:
        print(
            f"{r['groups']:4d} {r['slide_rows']:5d} {r['windows']:8,d} {r['wid_s']:7.3f} {r['buffering_s']:9.3f} "
            f"{r['wid_state_rows_peak']:6d}"
        )
    method = {
        "rows": n,
        "range": RANGE,
        "slides": slides,
        "groups": GROUPS,
        "flush": FLUSH,
        "scan_s": scan_s,
        "quick": args.quick,
        "smoke": args.quick,
    }
    path = harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for groups, dash in zip(GROUPS, ("-", ":"), strict=True):
        mine = [r for r in rows if r["groups"] == groups]
        x = [r["slide_rows"] for r in mine]
        tag = f"{groups} group{'s' if groups > 1 else ''}"
        ax[0].plot(x, [r["wid_s"] for r in mine], "o" + dash, label=f"WID, {tag}", color="#2a7")
        ax[0].plot(x, [r["buffering_s"] for r in mine], "s" + dash, label=f"buffering, {tag}", color="#c33")
        ax[1].plot(
            x,
            [r["wid_state_rows_peak"] for r in mine],
            "o" + dash,
            label=f"WID pane rows, {tag}",
            color="#2a7",
        )
    ax[0].axhline(scan_s, color="#999", ls="--", label="scan")
    ax[1].axhline(RANGE, color="#c33", label="buffered rows")
    for a in ax:
        a.set_xscale("log")
    ax[0].set_yscale("log")
    harness.style_axes(
        ax,
        ("execution time (process s, log)", "state (rows held, peak)"),
        f"SLIDE (rows), RANGE {RANGE}",
        legend_each=True,
        suptitle=f"Row windows: WID vs buffering, sliding max, {n:,} rows{' - smoke' if args.quick else ''}",
    )
    harness.save_figure(fig, harness.RESULTS / "rowwid.png")
    print(f"wrote {path} and rowwid.png")


if __name__ == "__main__":
    main()
