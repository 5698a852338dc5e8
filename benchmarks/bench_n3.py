"""A sliding-window count over two dense hosts and one sparse, delayed host (OOP paper experiment N3,
Q9 / dissertation Fig. 8-11): output latency and state with on-demand punctuation, with periodic
heartbeats only, and with a watermark.

Hosts (virtual time, lowwater's real kernel, punctuation rule and high-level processor; see
``benchmarks/hostsim.py``): M1 and M2 at ``DENSE`` pkt/s each, C at 4 packets per minute whose
messages (partials and punctuation) reach the union ``delay`` seconds late. Query: count per
(src_ip, dst_ip), RANGE 10 s SLIDE 2 s (Q9's 5 panes per window, scaled from minutes to seconds).

* ``on demand``: 1-s timer + punctuation when a host is idle (lowwater today);
* ``on request``: 1-s timer + punctuation when the union asks the host that blocks it (item 6, simulated);
* ``periodic 1 s``: heartbeats every second only;
* ``watermark = delay`` / ``watermark 2 s``: the same roll-up closed by max event time seen minus a
  fixed delay (Spark's rule; event time of a partial = its pane start), late partials dropped.

Measured: window-close latency (virtual time of the close - window end), state (union rows + host
table entries, every 10 ms: peak and mean), packets missing from the closed windows against the
exact counts, late records. The paper: OOP memory stays about flat as C's delay grows, IOP's grows.

    .venv/bin/python -m benchmarks.bench_n3 [--quick] [--delays 1,2,5,10]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks import hostsim as H
from benchmarks.harness import machine

DENSE = 20_000
SPARSE = 4 / 60
WINDOW = "{range: 10s, slide: 2s}"
VARIANTS = ("on demand", "on request", "periodic 1 s", "watermark = delay", "watermark 2 s")


FIGURE = (
    "n3",
    "sparse_delayed_union",
    "OOP paper N3 (Fig. 13) / dissertation Fig. 8-11",
)  # results file, benchmark, the paper's figure


def measure(variant: str, delay_s: int, seconds: float) -> dict[str, Any]:
    mode = {"on demand": "on_demand", "on request": "on_request"}.get(variant, "periodic")
    q = H.query(WINDOW, interval="1s", on_demand=mode == "on_demand")
    hosts = [
        H.SimHost("M1", q, DENSE, seconds, mode, seed=1),
        H.SimHost("M2", q, DENSE, seconds, mode, seed=3),
        H.SimHost("C", q, SPARSE, seconds, mode, seed=5, groups=10, delay_ns=delay_s * H.NS),
    ]
    wm = variant.startswith("watermark")
    t0 = time.perf_counter()
    r = H.run(
        hosts,
        seconds,
        union="watermark" if wm else "punct",
        ask=mode == "on_request",
        margin_s=delay_s + 14,
        watermark_delay_ns=(delay_s if variant == "watermark = delay" else 2) * H.NS,
    )
    lat = np.array(r.latency_s) if r.latency_s else np.array([np.nan])
    return {
        "delay_s": delay_s,
        "variant": variant,
        "windows": len(r.latency_s),
        "latency_mean_s": float(np.mean(lat)),
        "latency_max_s": float(np.max(lat)),
        "rows_peak": r.rows_peak,
        "rows_mean": r.rows_mean,
        "punctuations_per_s": r.punctuations_per_s,
        "late_records": r.late_records,
        "packets_expected": r.packets_expected,
        "packets_missing": r.packets_missing,
        "sparse_packets": len(hosts[2].arrivals),
        "sim_seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="delays 2 and 10 s, 30 s of stream")
    ap.add_argument("--delays", default=None)
    ap.add_argument("--seconds", type=float, default=None)
    args = ap.parse_args()
    delays = [int(d) for d in (args.delays or ("2,10" if args.quick else "1,2,5,10")).split(",")]
    seconds = args.seconds or (30.0 if args.quick else 40.0)
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {seconds:.0f} s of stream per run", flush=True)
    print(
        f"{'delay':>5s} {'variant':18s} {'win':>4s} {'mean s':>7s} {'max s':>7s} {'rows peak':>9s} {'rows mean':>9s} "
        f"{'punct/s':>8s} {'late':>5s} {'missing':>8s}",
        flush=True,
    )
    rows = []
    for d in delays:
        for v in VARIANTS:
            r = measure(v, d, seconds)
            rows.append(r)
            print(
                f"{d:5d} {v:18s} {r['windows']:4d} {r['latency_mean_s']:7.2f} {r['latency_max_s']:7.2f} "
                f"{r['rows_peak']:9,d} {r['rows_mean']:9,.0f} {r['punctuations_per_s']:8.2f} {r['late_records']:5d} "
                f"{r['packets_missing']:8,d}",
                flush=True,
            )
    method = {
        "seconds": seconds,
        "dense_pkt_per_s": DENSE,
        "sparse_pkt_per_min": 4,
        "window": WINDOW,
        "delays_s": delays,
        "quick": args.quick,
    }
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    colors = dict(zip(VARIANTS, ("#2a7", "#1a5", "#999", "#36c", "#c33"), strict=True))
    for v in VARIANTS:
        rs = [r for r in rows if r["variant"] == v]
        x = [r["delay_s"] for r in rs]
        ax[0].plot(x, [r["latency_mean_s"] for r in rs], marker="o", color=colors[v], label=v)
        ax[1].plot(x, [r["rows_peak"] for r in rs], marker="o", color=colors[v], label=v)
        ax[2].plot(
            x,
            [100 * r["packets_missing"] / max(1, r["packets_expected"]) for r in rs],
            marker="o",
            color=colors[v],
            label=v,
        )
    titles = (
        "mean window-close latency (s)",
        "peak state (union rows + host tables)",
        "packets missing from closed windows (%)",
    )
    sup = f"M1, M2 at {DENSE:,} pkt/s + C at 4 pkt/min delayed; RANGE 10 s SLIDE 2 s count"
    harness.style_axes(ax, titles, "delay of the sparse host C (s)", suptitle=sup)
    harness.save_figure(fig, harness.RESULTS / "n3.png")
    print(f"wrote {harness.RESULTS / 'n3.json'} and n3.png")


if __name__ == "__main__":
    main()
