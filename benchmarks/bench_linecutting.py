"""Why LINECUTTING gains little over IN-PLACE in lowwater's live path (UpStream Fig. 15): the same update
queue (``high_level/live/queue.py``) fed two update streams with the same Zipf(1.2) key rates.

* ``live (1-s panes)``: ``bench_upstream.py``'s updates, the real partition processor's provisional and
  final values; every key changes at most once per second (the hosts send a pane's partials when it
  ends), and every key that changed arrives at the same instant.
* ``tuple-grained``: the seed's setting, one update per packet at its own (Poisson) time, each key at its
  packet rate.

Measured per load factor: LINECUTTING's staleness / IN-PLACE's (``bench_upstream.run_policy``, the
policies' decision CPU charged), and the spread of update rates over keys (fastest / slowest key). The
gain of LINECUTTING comes from slow updaters cutting the line ahead of fast ones; when aggregation caps
the fast keys at one update per second, the spread that it exploits is mostly gone.

    .venv/bin/python -m benchmarks.bench_linecutting [--quick]
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from benchmarks import bench_upstream as U
from benchmarks import harness
from benchmarks.harness import machine
from high_level.live.queue import Update

LOAD_FACTORS = (2.0, 4.0, 8.0)
ZIPF = 1.2
WINDOW_S = 30  # the landmark window of bench_upstream's query


def tuple_grained(seconds: int, seed: int = 1) -> list[tuple[float, Update]]:
    """One provisional update per packet at its own time, Zipf key rates as ``bench_upstream``'s."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, U.GROUPS + 1) ** ZIPF
    rate = U.PPS * w / w.sum()
    ev = []
    for g in range(U.GROUPS):
        ts = np.sort(rng.uniform(0, seconds, rng.poisson(rate[g] * seconds)))
        win = (ts // WINDOW_S).astype(np.int64) * WINDOW_S * 1_000_000
        ev += [
            (float(t), Update(int(wi), (1000 + g,), {"packets": i + 1}, False, i + 1))
            for i, (t, wi) in enumerate(zip(ts.tolist(), win.tolist(), strict=True))
        ]
    ev.sort(key=lambda x: x[0])
    return ev


def rate_spread(timed: list[tuple[float, Update]], seconds: int) -> float:
    """Fastest / slowest key's provisional updates per second (keys seen at all)."""
    n = Counter(u.group for _, u in timed if not u.final)
    r = np.array(list(n.values()), float) / seconds
    return round(float(r.max() / r.min()), 1)


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="60 s of data instead of 240 s (bench_upstream.py's)"
    )
    a = ap.parse_args()
    seconds = 60 if a.quick else 240
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {seconds} s of updates", flush=True)
    feeds = {"live (1-s panes)": U.live_updates("zipf", seconds)[0], "tuple-grained": tuple_grained(seconds)}
    rows = []
    for name, feed in feeds.items():
        offered = len(feed) / seconds
        for lf in LOAD_FACTORS:
            ip = U.run_policy("inplace", feed, lf, offered, seconds)
            lc = U.run_policy("linecutting", feed, lf, offered, seconds)
            r = {
                "updates": name,
                "offered_per_s": round(offered, 1),
                "rate_spread": rate_spread(feed, seconds),
                "load_factor": lf,
                "inplace_staleness_s": ip["staleness_s"],
                "linecutting_staleness_s": lc["staleness_s"],
                "linecutting_vs_inplace": round(lc["staleness_s"] / ip["staleness_s"], 3),
                "throughput_loss": round(1 - lc["delivered"] / ip["delivered"], 4),
            }
            rows.append(r)
            print(
                f"{name:18s} spread {r['rate_spread']:7.1f}x LF {lf:3.1f}: IN-PLACE {ip['staleness_s']:.4f} s, "
                f"LINECUTTING {lc['staleness_s']:.4f} s, ratio {r['linecutting_vs_inplace']:.3f}",
                flush=True,
            )
    by = {(r["updates"], r["load_factor"]): r for r in rows}
    summary = {
        "linecutting_vs_inplace_live_lf2": by["live (1-s panes)", 2.0]["linecutting_vs_inplace"],
        "linecutting_vs_inplace_tuple_grained_lf2": by["tuple-grained", 2.0]["linecutting_vs_inplace"],
    }
    print(summary)
    method = {"seconds": seconds, "zipf": ZIPF, "groups": U.GROUPS, "packets_per_s": U.PPS, "quick": a.quick}
    figure = ("linecutting", "linecutting_cause", "UpStream Fig. 15 (LINECUTTING vs IN-PLACE, Zipf rates)")
    harness.write_figure(figure, m, rows, __doc__, {**method, "load": harness.load(), **summary})
    print(f"wrote {harness.RESULTS / 'linecutting.json'}")


if __name__ == "__main__":
    main()
