"""Dissertation Fig. 6-10: WID (panes) against buffering for a row window, tuple-based sliding max, RANGE
4000 rows, SLIDE from 1 to 4000 rows (``high_level/rows/windows.py``).

One in-order stream (the paper's Experiment 1: no disorder) of ``--rows`` packet lengths, fed in flushes of
``FLUSH`` rows (a capture host's table flush). *WID*: the host numbers the rows (``low_level.kernel.rownum``)
and sub-aggregates max per pane of gcd(RANGE, SLIDE) rows; the high level merges the pane partials and
closes every window the host's row count passed (``RowWindows``): state = the open panes. *Buffering*: keep
the last RANGE rows and re-aggregate each window from them at every slide (vectorised: a sliding view over
the buffer and the flush, max per window end): state = RANGE rows. Both emit the same windows (their max
values are compared). Execution time = process time of everything after the data is made; the scan line =
one pass of max over the input. Virtual time: the stream is an array, run at full CPU speed as in the paper.

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
I64 = np.int64


def wid(length: np.ndarray, slide: int) -> tuple[np.ndarray, float, int]:
    """Window maxima (in window order), process time, peak pane rows held."""
    spec = row_query(
        {
            "name": "r",
            "aggregates": [{"fn": "max", "field": "length"}],
            "window": {"rows": RANGE, "slide": slide},
        }
    )
    pane_rows = spec.window.pane_rows
    t0 = time.process_time()
    counter, op = RowCounter(0), RowWindows(spec, 0, 0)
    out, peak = [], 0
    for i in range(0, len(length), FLUSH):
        v = length[i : i + FLUSH]
        pane = counter.number(np.zeros((len(v), 0), I64)) // pane_rows
        keys, st = group_reduce(pane.reshape(-1, 1), v.reshape(-1, 1), spec.ops)
        op.add("h", np.zeros((len(keys), 0), I64), keys[:, 0], np.zeros((len(keys), 0), I64), st)
        op.punctuate("h", *counter.punctuation())
        peak = max(peak, op.state_rows)
        out.append(op.close().state[:, 0])
    return np.concatenate(out), time.process_time() - t0, peak


def buffering(length: np.ndarray, slide: int) -> tuple[np.ndarray, float, int]:
    """Keep the last RANGE rows; at every slide, the max of the window ending there from the buffer."""
    t0 = time.process_time()
    buf = np.zeros(0, I64)
    seen, out = 0, []
    for i in range(0, len(length), FLUSH):
        v = length[i : i + FLUSH]
        data = np.concatenate([buf, v])
        base = seen - len(buf)  # row number of data[0]
        ends = np.arange(seen // slide + 1, (seen + len(v)) // slide + 1, dtype=I64) * slide
        seen += len(v)
        if len(ends):
            padded = np.concatenate([np.full(RANGE - 1, np.iinfo(I64).min, I64), data])
            view = np.lib.stride_tricks.sliding_window_view(padded, RANGE)
            out.append(view[ends - base - 1].max(axis=1))
        buf = data[-RANGE:]
    return np.concatenate(out) if out else np.zeros(0, I64), time.process_time() - t0, RANGE


def measure(length: np.ndarray, slide: int) -> dict[str, Any]:
    w_out, w_s, w_peak = wid(length, slide)
    b_out, b_s, b_rows = buffering(length, slide)
    if not np.array_equal(w_out, _aligned(b_out, slide)):
        raise SystemExit(f"slide {slide}: WID and buffering disagree")
    return {
        "range_rows": RANGE,
        "slide_rows": slide,
        "windows": int(len(w_out)),
        "wid_s": w_s,
        "buffering_s": b_s,
        "wid_state_rows_peak": w_peak,
        "buffering_state_rows": b_rows,
        "ratio_buffering_over_wid": b_s / w_s if w_s else None,
    }


def _aligned(b_out: np.ndarray, slide: int) -> np.ndarray:
    """Buffering emits a window at every multiple of the slide; WID's windows start at multiples of the
    slide (end at RANGE + n*slide, or earlier short ones when the slide divides RANGE): keep the same ends."""
    ends = (np.arange(len(b_out)) + 1) * slide
    return b_out[(ends - RANGE) % slide == 0]


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
        f"{n:,} rows, RANGE {RANGE}, on {m['cores']} cores of {m['cpu']}\nslide | windows | WID s | buffering s | WID panes"
    )
    wid(length[: 2 * FLUSH], RANGE)  # compile the numbering kernel (numba) before anything is timed
    rows = []
    for s in slides:
        r = measure(length, s)
        rows.append(r)
        print(
            f"{s:5d} {r['windows']:8,d} {r['wid_s']:7.3f} {r['buffering_s']:9.3f} {r['wid_state_rows_peak']:6d}",
            flush=True,
        )
    method = {
        "rows": n,
        "range": RANGE,
        "slides": slides,
        "flush": FLUSH,
        "scan_s": scan_s,
        "quick": args.quick,
        "smoke": args.quick,
    }
    path = harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    x = [r["slide_rows"] for r in rows]
    ax[0].plot(x, [r["wid_s"] for r in rows], "o-", label="WID (panes)", color="#2a7")
    ax[0].plot(x, [r["buffering_s"] for r in rows], "s-", label="buffering", color="#c33")
    ax[0].axhline(scan_s, color="#999", ls="--", label="scan")
    ax[1].plot(x, [r["wid_state_rows_peak"] for r in rows], "o-", label="WID pane rows", color="#2a7")
    ax[1].plot(x, [r["buffering_state_rows"] for r in rows], "s-", label="buffered rows", color="#c33")
    for a in ax:
        a.set_xscale("log")
    harness.style_axes(
        ax,
        ("execution time (process s)", "state (rows held, peak)"),
        f"SLIDE (rows), RANGE {RANGE}",
        legend_each=True,
        suptitle=f"Row windows: WID vs buffering, sliding max, {n:,} rows{' - smoke' if args.quick else ''}",
    )
    harness.save_figure(fig, harness.RESULTS / "rowwid.png")
    print(f"wrote {path} and rowwid.png")


if __name__ == "__main__":
    main()
