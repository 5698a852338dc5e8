"""Joint vs individual punctuation for an aggregation on the right timestamp of a band join (OOP paper
section 7, query Q3 and Fig. 8; dissertation Figs. 7-3, 7-4): how long after its end a window of the
SYN-ACK's timestamp can close, as the band grows.

Q3's shape on the handshake: SYN x SYN-ACK (``within: band``), counted per 10-s window of the SYN-ACK's
timestamp (``window_on: right``), on lowwater's :class:`high_level.join.band.BandJoin`. Both inputs arrive
in order of their own clock and punctuate every 0.5 s; the right input lags ``lag`` s behind the left.
Virtual time (stream seconds): independent of the machine's load.

* ``joint``: the right component of the join's joint punctuation (:func:`high_level.join.band.joint_marks`).
* ``individual``: the join's individual output punctuation on the left timestamp carried over by the band
  (:func:`high_level.join.band.individual_right_mark`), all an aggregation could use before.

Delay = stream time at which the mark passes a window's end - the window's end, mean over the windows.
``exact``: every window's count of pairs emitted by the time its mark closed it equals the brute-force
count. The paper: joint punctuation does not depend on the band, individual punctuation waits a band.

    .venv/bin/python -m benchmarks.bench_joint [--quick] [--bands 3,10,20,40] [--lag 5]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from high_level.join import band as B
from high_level.join.band import BandJoin, JoinLayout
from lowwater_testing.joins import HANDSHAKE, join_oracle, rows_of

NS = 1_000_000_000
TICK = NS // 2
FIGURE = ("joint", "joint_punctuation", "OOP Fig. 8 (query Q3); dissertation Figs. 7-3, 7-4")
VARIANTS = ("joint", "individual")


def q3(
    partitions: int = 1, band: str = "within: 20s", window_on: str = "right", window: str = "10s"
) -> Q.Config:
    """The paper's Q3 shape on the handshake: SYN x SYN-ACK in a band, counted per window of the SYN-ACK's
    timestamp (and the mean handshake latency per server port)."""
    text = HANDSHAKE.replace("partitions: 4", f"partitions: {partitions}").replace(
        "range: 1m", f"range: {window}"
    )
    return Q.load_text(text.replace("    within: 3s\n", f"    {band}\n    window_on: {window_on}\n"))


def close_delays(cfg: Q.Config, lag_s: float, n_syn: int = 600, seed: int = 5) -> dict[str, dict[str, Any]]:
    """Per variant: mean and max delay (s) between a right-timestamp window's end and the stream time its
    mark passed it, and whether each window's pairs were all emitted by then (``exact``)."""
    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    rl = lay.rollup
    assert rl is not None
    left, right = rows_of(cfg, n_syn, seed)
    want, _ = join_oracle(lay, left, right)
    win = rl.pane_ns * rl.k
    wid = (want[:, 1 + lay.lw] - rl.origin_ns) // win
    t0 = int(min(left[:, 0].min(), right[:, 0].min()))
    end = int(max(left[:, 0].max(), right[:, 0].max()))
    windows = range((t0 - rl.origin_ns) // win, (end - rl.origin_ns) // win + 1)
    j = BandJoin(lay, host_timeout_ms=10**12)
    lag = int(lag_s * NS)
    emitted: dict[int, int] = {}
    closed: dict[str, dict[int, tuple[int, int]]] = {v: {} for v in VARIANTS}  # window -> (time, pairs then)
    sent = {"left": t0, "right": t0 - lag}
    t = t0
    while t < end + 2 * lag + 120 * NS and any(len(c) < len(windows) for c in closed.values()):
        t += TICK
        for side, rows, clock in (("left", left, t), ("right", right, t - lag)):
            new = rows[(rows[:, 0] >= sent[side]) & (rows[:, 0] < clock)]
            if len(new):
                j.add(side, new[:, 0], new[:, 1:])
            sent[side] = clock
            j.observe(side, "cap", 1, clock, 0, 0)
        out = j.step()
        for w, n in zip(*np.unique((out.r_ts - rl.origin_ns) // win, return_counts=True), strict=True):
            emitted[int(w)] = emitted.get(int(w), 0) + int(n)
        marks = {
            "joint": j.joint[1],
            "individual": B.individual_right_mark(lay, B.individual_mark(j.b["left"], j.store["left"])),
        }
        for v, m in marks.items():
            for w in windows:
                if m is not None and m >= rl.origin_ns + (w + 1) * win and w not in closed[v]:
                    closed[v][w] = (t, emitted.get(w, 0))
    out_rows: dict[str, dict[str, Any]] = {}
    truth = dict(zip(*np.unique(wid, return_counts=True), strict=True))
    for v, c in closed.items():
        delays = [(c[w][0] - (rl.origin_ns + (w + 1) * win)) / NS for w in c]
        out_rows[v] = {
            "windows": len(windows),
            "closed": len(c),
            "mean_delay_s": float(np.mean(delays)) if delays else None,
            "max_delay_s": float(np.max(delays)) if delays else None,
            "exact": len(c) == len(windows) and all(c[w][1] == int(truth.get(w, 0)) for w in c),
        }
    return out_rows


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bands 3,20 and 300 SYNs (a smoke run)")
    ap.add_argument("--bands", default=None, help="band widths in s, comma-separated (default 3,10,20,40)")
    ap.add_argument("--lag", type=float, default=5.0, help="how far the right input lags (s)")
    args = ap.parse_args()
    bands = [int(x) for x in (args.bands or ("3,20" if args.quick else "3,10,20,40")).split(",")]
    n = 300 if args.quick else 1500
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; right input {args.lag:g} s behind, {n} SYNs")
    rows = []
    for b in bands:
        res = close_delays(q3(1, f"within: {b}s"), args.lag, n_syn=n)
        for v in VARIANTS:
            r = {"band_s": b, "variant": v, "lag_s": args.lag, **res[v]}
            rows.append(r)
            print(
                f"band {b:3d} s {v:10s} mean delay {r['mean_delay_s']:6.2f} s max {r['max_delay_s']:6.2f} s"
                f" {'exact' if r['exact'] else 'WRONG'}"
            )
    by = {(r["band_s"], r["variant"]): r for r in rows}
    hi = bands[-1]
    method = {
        f"individual_minus_joint_delay_at_{hi}s": round(
            by[hi, "individual"]["mean_delay_s"] - by[hi, "joint"]["mean_delay_s"], 2
        ),
        "all_exact": all(r["exact"] for r in rows),
        "quick": bool(args.quick),
        "tick_ms": TICK // 1_000_000,
        "syns": n,
        "load": harness.load(),
    }
    print(method)
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, 1, figsize=(5, 4))
    for v, c in (("joint", "#2a7"), ("individual", "#c33")):
        rs = [r for r in rows if r["variant"] == v]
        ax.plot([r["band_s"] for r in rs], [r["mean_delay_s"] for r in rs], marker="o", color=c, label=v)
    harness.style_axes(
        [ax], ("mean window-close delay (s)",), "band (s)", suptitle="joint vs individual punctuation"
    )
    harness.save_figure(fig, harness.RESULTS / f"{FIGURE[0]}.png")
    print(f"wrote {harness.RESULTS / FIGURE[0]}.json and {FIGURE[0]}.png")


if __name__ == "__main__":
    main()
