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
* ``IOP``: the paper's in-order plan on the same packets: an order-preserving union of the three hosts'
  packet tuples (each arriving its host's delay late; C's progress known from its 1-s heartbeats), then
  the same roll-up over the ordered stream (``benchmarks.bench_skew_iop.InOrderUnion``'s rule, sampled
  every 10 ms): state = tuples buffered in the union + the roll-up's rows.

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
from contract import wire
from high_level.aggregate.rollup import Layout, QueryRollup

DENSE = 20_000
SPARSE = 4 / 60
WINDOW = "{range: 10s, slide: 2s}"
VARIANTS = ("on demand", "on request", "periodic 1 s", "watermark = delay", "watermark 2 s", "IOP")


FIGURE = (
    "n3",
    "sparse_delayed_union",
    "OOP paper N3 (Fig. 13) / dissertation Fig. 8-11",
)  # results file, benchmark, the paper's figure


def measure_iop(delay_s: int, seconds: float) -> dict[str, Any]:
    """The in-order baseline on the same hosts' packets (their arrival times and frames)."""
    q = H.query(WINDOW, interval="1s")
    hosts = [
        H.SimHost("M1", q, DENSE, seconds, "periodic", seed=1),
        H.SimHost("M2", q, DENSE, seconds, "periodic", seed=3),
        H.SimHost("C", q, SPARSE, seconds, "periodic", seed=5, groups=10, delay_ns=delay_s * H.NS),
    ]
    lay = Layout.of(q)
    roll = QueryRollup(lay)
    phase = hosts[2].next_timer  # C's first heartbeat, at the random phase its agent would have
    packets = []
    for h in hosts:  # (ts, src, dst) per packet: frame i % BLOCK, as SimHost feeds its kernel
        f = h.frames[np.arange(len(h.arrivals)) % H.BLOCK]
        src = f[:, 26:30].astype(np.int64) @ np.array([1 << 24, 1 << 16, 1 << 8, 1], np.int64)
        dst = f[:, 30:34].astype(np.int64) @ np.array([1 << 24, 1 << 16, 1 << 8, 1], np.int64)
        key = np.zeros((len(src), lay.kw), np.int64)  # the key words: each address in the low word of its two
        key[:, lay.kw // 2 - 1], key[:, -1] = src, dst
        packets.append((h.arrivals, key, h.delay_ns))
    t0 = time.perf_counter()
    end = H.T0 + int(seconds * H.NS)
    step = 10 * H.MS
    pos = [0] * len(hosts)  # per host: delivered up to here; released (in the union's output) up to rel
    rel = [0] * len(hosts)
    closed_at: dict[int, int] = {}
    counted: dict[int, int] = {}
    rows, peak = [], 0
    now = H.T0
    while now <= end + 2 * step:
        fronts = []
        for i, (ts, _, delay) in enumerate(packets):
            pos[i] = int(np.searchsorted(ts, now - delay))  # delivered by now, in the host's own order
            seen = now - delay
            if (
                delay
            ):  # the sparse host: its progress is known only from its 1-s heartbeats (its timer's phase)
                seen = phase + (seen - phase) // H.NS * H.NS
            fronts.append(seen if now <= end else wire.END_OF_STREAM)
        front = min(fronts)
        out_ts, out_key = [], []
        for i, (ts, key, _) in enumerate(packets):  # release every buffered tuple below the front
            e = min(pos[i], int(np.searchsorted(ts, front)))
            out_ts.append(ts[rel[i] : e])
            out_key.append(key[rel[i] : e])
            rel[i] = max(rel[i], e)
        ts_o = np.concatenate(out_ts)
        if len(ts_o):
            o = np.argsort(ts_o, kind="stable")  # the ordered union's output
            key_o = np.concatenate(out_key)[o]
            roll.add((ts_o[o] - lay.origin_ns) // lay.pane_ns, key_o, np.ones((len(o), lay.na), np.int64))
        lwm = wire.END_OF_STREAM if front >= wire.END_OF_STREAM else (front - lay.origin_ns) // lay.pane_ns
        out = roll.close(lwm)
        for wi in np.unique(out.window).tolist():
            closed_at.setdefault(int(wi), min(now, end))
            counted[int(wi)] = counted.get(int(wi), 0) + int(out.state[out.window == wi, 0].sum())
        n = len(roll) + sum(p - r for p, r in zip(pos, rel, strict=True))
        rows.append(n)
        peak = max(peak, n)
        now += step
    lo, hi = H.T0 + 2 * H.NS, end - (delay_s + 14) * H.NS
    allts = np.sort(np.concatenate([h.arrivals for h in hosts]))
    lat, exp_total, missing = [], 0, 0
    for w in range(int((lo - lay.origin_ns) // lay.pane_ns), int((hi - lay.origin_ns) // lay.pane_ns)):
        w_end = int(lay.window_end_ns(np.array([w]))[0])
        exp = int(np.searchsorted(allts, w_end) - np.searchsorted(allts, w_end - lay.range_ns))
        exp_total += exp
        missing += exp - counted.get(w, 0)
        if w in closed_at:
            lat.append((closed_at[w] - w_end) / H.NS)
    la = np.array(lat) if lat else np.array([np.nan])
    return {
        "delay_s": delay_s,
        "variant": "IOP",
        "windows": len(lat),
        "latency_mean_s": float(la.mean()),
        "latency_p50_s": float(np.median(la)),
        "latency_max_s": float(la.max()),
        "wait_fraction": None,
        "rows_peak": int(peak),
        "rows_mean": float(np.mean(rows)),
        "punctuations_per_s": 1.0,
        "late_records": 0,
        "packets_expected": exp_total,
        "packets_missing": missing,
        "sparse_packets": len(hosts[2].arrivals),
        "sim_seconds": round(time.perf_counter() - t0, 1),
    }


def measure(variant: str, delay_s: int, seconds: float) -> dict[str, Any]:
    if variant == "IOP":
        return measure_iop(delay_s, seconds)
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
    return {
        "delay_s": delay_s,
        "variant": variant,
        **r.figures(),
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
    colors = dict(zip(VARIANTS, ("#2a7", "#1a5", "#999", "#36c", "#c33", "#a3a"), strict=True))
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
