"""On-demand punctuation with all four variants of the seed (on-demand punctuation paper Fig. 7 and 8):
latency, the fraction of time the union waits idle, peak state and punctuation traffic.

A dense host (50,000 pkt/s, a capture host) and a sparse host (0.05 pkt/s), count per (src_ip,
dst_ip) per 1-s tumbling window, on lowwater's real kernel, punctuation rule and high-level processor
in virtual time (``benchmarks/hostsim.py``), ``--seconds`` of stream (default 120):

* A  no punctuation: marks only at end of stream;
* B  periodic heartbeats at rising rates (every 10 s, 1 s, 100 ms, 10 ms; on demand off);
* C  on demand: 1-s timer + a punctuation as soon as a host is idle (5 ms without packets) and its
     mark moved (lowwater's agent today);
* C' on request: 1-s timer + a punctuation when the union asks the host that blocks it (issue item 6,
     simulated: the request costs no transit time here);
* D  latent timestamps, the ideal: the sparse host's progress is known without any message.

And the cause of the ~1-s floor of ``bench_on_demand.py``: C again with a sweep below the data clock at
every 100-ms heartbeat of the dense host, and with 0.1-s panes (the same 1-s windows, sliding by
0.1 s). (Lazy flush m = 0 does not exist: the config requires m >= 1.)

Latency = virtual time the union closed a window - the window's end (1-ms ticks). Waiting = the
fraction of time during which a window holding data has ended but cannot be emitted yet (the union
idles on punctuation: the seed's idle-waiting). State = the union's pane-table rows + the hosts' table
entries, sampled every 10 ms (peak and mean), the analogue of the seed's peak queue size.

    .venv/bin/python -m benchmarks.bench_union [--quick] [--seconds 120]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks import hostsim as H
from benchmarks.harness import machine

DENSE, SPARSE = 50_000, 0.05
TUMBLING = "{range: 1s}"


FIGURE = (
    "union",
    "on_demand_union_variants",
    "on-demand punctuation paper Fig. 7 and 8",
)  # results file, benchmark, the paper's figure


def variants(quick: bool) -> list[dict[str, Any]]:
    """label, group, per-host mode, query settings and union options."""
    v: list[dict[str, Any]] = [{"label": "A no punctuation", "group": "A", "mode": "eos", "interval": "1s"}]
    for iv, rate in (("10s", 0.1), ("1s", 1), ("100ms", 10), ("10ms", 100)):
        if quick and iv in ("10ms",):
            continue
        v.append(
            {"label": f"B periodic {iv}", "group": "B", "mode": "periodic", "interval": iv, "rate": rate}
        )
    v += [
        {"label": "C on demand", "group": "C", "mode": "on_demand", "interval": "1s"},
        {"label": "C' on request", "group": "C'", "mode": "on_request", "interval": "1s", "ask": True},
        {"label": "D latent timestamps", "group": "D", "mode": "on_demand", "interval": "1s", "latent": True},
        {
            "label": "C, dense sweep every 100 ms",
            "group": "floor",
            "mode": "on_demand",
            "interval": "100ms",
            "sweep": True,
        },
        {
            "label": "C, 0.1-s panes (slide 0.1 s)",
            "group": "floor",
            "mode": "on_demand",
            "interval": "1s",
            "window": "{range: 1s, slide: 100ms}",
        },
    ]
    return v


def measure(v: dict[str, Any], seconds: float) -> dict[str, Any]:
    q = H.query(
        v.get("window", TUMBLING), m=v.get("m", 1), interval=v["interval"], on_demand=v["mode"] == "on_demand"
    )
    dense = H.SimHost("dense", q, DENSE, seconds, v["mode"], seed=1, sweep_on_timer=v.get("sweep", False))
    sparse = H.SimHost(
        "sparse", q, SPARSE, seconds, "latent" if v.get("latent") else v["mode"], seed=2, groups=10
    )
    t0 = time.perf_counter()
    r = H.run(
        [dense, sparse], seconds, latent=("sparse",) if v.get("latent") else (), ask=v.get("ask", False)
    )
    lat = np.array(r.latency_s) if r.latency_s else np.array([np.nan])
    return {
        "variant": v["label"],
        "group": v["group"],
        "heartbeat_interval": v["interval"],
        "windows": len(r.latency_s),
        "latency_mean_s": float(np.mean(lat)),
        "latency_p50_s": float(np.median(lat)),
        "latency_max_s": float(np.max(lat)),
        "wait_fraction": r.wait_fraction,
        "rows_peak": r.rows_peak,
        "rows_mean": r.rows_mean,
        "punctuations_per_s": r.punctuations_per_s,
        "late_records": r.late_records,
        "packets_missing": r.packets_missing,
        "sparse_packets": len(sparse.arrivals),
        "sim_seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 s of stream, no 10-ms heartbeat")
    ap.add_argument("--seconds", type=float, default=None)
    args = ap.parse_args()
    seconds = args.seconds or (60.0 if args.quick else 120.0)
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {seconds:.0f} s of stream per variant", flush=True)
    rows = []
    head = (
        f"{'variant':32s} {'win':>4s} {'mean s':>8s} {'p50 s':>7s} {'max s':>7s} {'wait %':>7s} {'rows pk':>8s} "
        f"{'rows mean':>9s} {'punct/s':>8s} {'late':>5s} {'miss':>5s}"
    )
    print(head, flush=True)
    for v in variants(args.quick):
        r = measure(v, seconds)
        rows.append(r)
        print(
            f"{r['variant']:32s} {r['windows']:4d} {r['latency_mean_s']:8.3f} {r['latency_p50_s']:7.3f} "
            f"{r['latency_max_s']:7.3f} {100 * r['wait_fraction']:7.2f} {r['rows_peak']:8,d} {r['rows_mean']:9,.0f} "
            f"{r['punctuations_per_s']:8.2f} {r['late_records']:5d} {r['packets_missing']:5d}",
            flush=True,
        )
    method = {"seconds": seconds, "dense_pkt_per_s": DENSE, "sparse_pkt_per_s": SPARSE, "quick": args.quick}
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    labels = [r["variant"] for r in rows]
    colors = {"A": "#c33", "B": "#999", "C": "#2a7", "C'": "#1a5", "D": "#36c", "floor": "#e90"}
    col = [colors[r["group"]] for r in rows]
    for a, key, title, log in (
        (ax[0], "latency_mean_s", "mean window-close latency (s, log)", True),
        (ax[1], "wait_fraction", "fraction of time the union idle-waits", False),
        (ax[2], "rows_peak", "peak rows held: union + host tables (log)", True),
    ):
        a.barh(labels, [max(r[key], 1e-4) for r in rows], color=col)
        a.set_title(title, fontsize=9)
        if log:
            a.set_xscale("log")
        a.invert_yaxis()
        a.tick_params(axis="y", labelsize=8)
    for a in ax[1:]:
        a.set_yticklabels([])
    fig.suptitle(
        f"dense {DENSE:,} pkt/s + sparse {SPARSE} pkt/s host, 1-s windows, {seconds:.0f} s of stream "
        "(virtual time, real kernel + processor)",
        fontsize=10,
    )
    harness.save_figure(fig, harness.RESULTS / "union.png")
    print(f"wrote {harness.RESULTS / 'union.json'} and union.png")


if __name__ == "__main__":
    main()
