"""UpStream's experiment on lowwater's live path: average staleness vs load factor for FIFO, random drop,
IN-PLACE and LINECUTTING, under uniform and Zipf-skewed key update rates.

The updates are real provisional results: two emulated capture hosts send, every second, their partial
aggregates of the pane that just ended and their punctuation to the high level's partition processor
(``high_level/aggregate/processor.py`` with live results on), which publishes the current value of every open
window and group it changed, and the final at close; each goes through the live publisher's encoding
and the live contract's validating decoder (``contract/live.py``) into one consumer's update queue
(``high_level/live/queue.py``). Only the consumer is simulated: it takes one update per service slot
on a simulated clock (``service_s = LF / offered updates per second``), and each take is also charged
the CPU time the policy's decision really took, so LINECUTTING pays for its queue scan in throughput.

Policies: the seed's baselines ``fifo`` (a plain append queue) and ``random`` (append + random drop at
p = 1 - 1/LF; a dropped final skips its whole window), ``fifo+final`` (the live endpoint's FIFO: a final
drops its key's queued provisionals), ``inplace`` and ``linecutting``.

Query: packets and bytes per destination port, landmark windows of 30 s updated every second (the
live panel's use: the totals so far of the open window). 200 groups; 600 packets/s; uniform: every
group the same rate; skewed: Zipf(1.2) rates, a few ports busy every second, most seen every few tens
of seconds. Staleness = the seed's Definitions 9-10: per key (window, group) the time its newest input
has waited unreflected at the consumer, time-averaged over the key's life, averaged over keys.

    .venv/bin/python -m benchmarks.bench_upstream [--quick]
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa

from benchmarks import harness
from benchmarks.harness import machine
from contract import live as L
from contract import query as Q
from contract import wire
from high_level.aggregate.packed import unpack_windows
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.live.publish import LIVE_KINDS, live_messages, split_provisional
from high_level.live.queue import Update, UpdateQueue, replay
from lowwater_testing.queries import config, query

CONFIG = config(
    query(
        "ports_live",
        group_by=["dst_port"],
        aggregates=["count as packets", "sum(length) as bytes"],
        window={"landmark": "30s", "update": "1s"},
    )
).text
GROUPS, PPS, HOSTS = 200, 600, ("h0", "h1")
LOAD_FACTORS = (0.5, 1.0, 2.0, 4.0, 8.0)
T0_S = 1_764_000_000  # data clock origin (whole minutes: windows align)


def live_updates(dist: str, seconds: int, seed: int = 1) -> tuple[list[tuple[float, Update]], dict]:
    """Run the high level on emulated hosts; return the live updates (batch time, update) it published."""
    q = Q.load_text(CONFIG).queries[0]
    lay = Layout.of(q)
    rng = np.random.default_rng(seed)
    w = np.ones(GROUPS) if dist == "uniform" else 1.0 / np.arange(1, GROUPS + 1) ** 1.2
    rate = PPS * w / w.sum()  # packets per second per group
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=HOSTS, live=True))
    seq = dict.fromkeys(HOSTS, 0)
    timed: list[tuple[float, Update]] = []
    counts = {"provisional": 0, "final": 0, "batches": 0}
    p0 = (T0_S * 10**9 - lay.origin_ns) // lay.pane_ns
    for b in range(seconds + lay.k + 1):
        values = []
        pane = p0 + b
        for hi, h in enumerate(HOSTS):
            if b < seconds:  # the pane that just ended: each host saw half of each group's packets
                n = rng.poisson(rate / len(HOSTS))
                g = np.flatnonzero(n)
                if len(g):
                    key = (1000 + g).reshape(-1, 1).astype(np.int64)
                    state = np.column_stack([n[g], n[g] * rng.integers(60, 1500, len(g))]).astype(np.int64)
                    values.append(
                        wire.encode_partials(
                            q.name, h, 1, 0, seq[h], np.full(len(g), pane, np.int64), key, state
                        )
                    )
                    seq[h] += len(g)
            mark = pane + 1
            values.append(
                wire.encode_punctuation(
                    wire.Punctuation(
                        q.name,
                        h,
                        1,
                        0,
                        seq[h],
                        int(mark),
                        lay.origin_ns + int(mark) * lay.pane_ns,
                        int(mark) * lay.pane_ns,
                        {},
                    )
                )
            )
            del hi
        packed = pa.Table.from_pandas(
            proc.process_packed(values, (T0_S + b + 1) * 1000), preserve_index=False
        )
        prov_packed, rest = split_provisional(packed)
        src = {
            False: unpack_windows(prov_packed, {q.name: lay}, LIVE_KINDS)[0],
            True: unpack_windows(rest, {q.name: lay})[0],
        }
        counts["batches"] += 1
        for final in (False, True):
            if q.name not in src[final]:
                continue
            for k, v in live_messages(q, lay, src[final][q.name], final, b):
                u = L.decode(k, v)  # the API's validating decoder
                timed.append(
                    (
                        float(b),
                        Update(u.window_start_us, tuple(u.group.values()), u.values, u.final, u.version),
                    )
                )
                counts["final" if final else "provisional"] += 1
    return timed, counts


# policy as reported -> (queue policy, supersede): the seed's baselines are plain append queues (FIFO, and
# FIFO with random drop at p = 1 - 1/LF); "fifo+final" is the live endpoint's FIFO (a final drops its
# key's queued provisionals), reported to show what window awareness alone buys
VARIANTS = {
    "fifo": ("fifo", False),
    "random": ("random", False),
    "fifo+final": ("fifo", True),
    "inplace": ("inplace", True),
    "linecutting": ("linecutting", True),
}


def run_policy(
    variant: str,
    timed: list[tuple[float, Update]],
    lf: float,
    offered_per_s: float,
    end: float,
    seed: int = 0,
) -> dict:
    policy, supersede = VARIANTS[variant]
    service_s = lf / offered_per_s
    drop_p = max(0.0, 1.0 - 1.0 / lf) if policy == "random" else 0.0
    q = UpdateQueue(policy, service_s=service_s, drop_p=min(drop_p, 0.99), seed=seed, supersede=supersede)
    t0 = time.process_time()
    out = replay(q, [(t, Update(**vars(u))) for t, u in timed], until=end, charge_cpu=True)
    cpu = time.process_time() - t0
    delivered = sum(1 for _, x in out if isinstance(x, Update))
    return {
        "policy": variant,
        "load_factor": lf,
        "service_ms": round(service_s * 1e3, 3),
        "staleness_s": round(q.meter.stream_average(end), 4),
        "result_staleness_s": round(q.meter.mean_result_staleness, 4),
        "delivered": delivered,
        "throughput_per_s": round(delivered / end, 2),
        "offered": q.stats.offered,
        "overwrites": q.stats.overwrites,
        "superseded": q.stats.superseded,
        "dropped": q.stats.dropped,
        "skipped_windows": q.stats.skipped_windows,
        "max_cells": q.stats.max_cells,
        "measured_load_factor": round(q.load_factor(end), 3),
        "cpu_s": round(cpu, 3),
    }


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 s of data instead of 240 s")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    seconds = 60 if a.quick else 240
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores")
    rows, feeds = [], {}
    for dist in ("uniform", "zipf"):
        t = time.perf_counter()
        timed, counts = live_updates(dist, seconds)
        end = timed[-1][0] + 1.0
        offered_per_s = len(timed) / end
        feeds[dist] = {
            **counts,
            "updates": len(timed),
            "updates_per_s": round(offered_per_s, 1),
            "keys": len({u.key for _, u in timed}),
            "seconds": end,
            "high_level_s": round(time.perf_counter() - t, 2),
        }
        print(f"{dist}: {len(timed)} live updates ({counts}) in {end:.0f} s of data, {offered_per_s:.0f}/s")
        for lf in LOAD_FACTORS:
            for pol in VARIANTS:
                r = {"distribution": dist, **run_policy(pol, timed, lf, offered_per_s, end)}
                rows.append(r)
                print(
                    f"  LF {lf:>4} {pol:<12} staleness {r['staleness_s']:8.3f} s  delivered {r['delivered']:6d}  "
                    f"overwrites {r['overwrites']:6d}  skipped windows {r['skipped_windows']}  max cells {r['max_cells']}"
                )

    def get(dist: str, pol: str, lf: float) -> dict:
        return next(
            r for r in rows if r["distribution"] == dist and r["policy"] == pol and r["load_factor"] == lf
        )

    inplace_vs_fifo = (
        get("uniform", "inplace", 4.0)["staleness_s"] / get("uniform", "fifo", 4.0)["staleness_s"]
    )
    lc_vs_ip = {
        str(lf): round(
            get("zipf", "linecutting", lf)["staleness_s"] / get("zipf", "inplace", lf)["staleness_s"], 4
        )
        for lf in LOAD_FACTORS
        if lf > 1 and get("zipf", "inplace", lf)["staleness_s"] > 0
    }
    loss = {
        str(lf): round(
            1 - get("zipf", "linecutting", lf)["delivered"] / get("zipf", "inplace", lf)["delivered"], 4
        )
        for lf in LOAD_FACTORS
        if lf > 1
    }
    summary = {
        "inplace_vs_fifo_staleness_at_lf4": round(inplace_vs_fifo, 4),
        "inplace_vs_fifo_final_staleness_at_lf4": round(
            get("uniform", "inplace", 4.0)["staleness_s"] / get("uniform", "fifo+final", 4.0)["staleness_s"],
            4,
        ),
        "linecutting_vs_inplace_staleness_skewed": lc_vs_ip.get("4.0"),
        "linecutting_vs_inplace_staleness_skewed_per_lf": lc_vs_ip,
        "linecutting_throughput_loss_skewed": loss.get("4.0"),
        "linecutting_throughput_loss_skewed_per_lf": loss,
    }
    print(json.dumps(summary, indent=1))
    harness.write_results(
        "upstream.json",
        {
            "benchmark": "upstream",
            "machine": m,
            "query": CONFIG.strip(),
            "groups": GROUPS,
            "packets_per_s": PPS,
            "hosts": len(HOSTS),
            "seconds": seconds,
            "zipf": 1.2,
            "load_factors": list(LOAD_FACTORS),
            "feeds": feeds,
            **summary,
            "rows": rows,
            "method": "real partition processor (live results on) -> live publisher encoding -> contract.live.decode -> "
            "UpdateQueue; simulated consumer clock, each take charged its measured CPU time; staleness per "
            "the seed's Definitions 9-10 (time-average per (window, group) over its life, mean over keys), "
            "at the end of the data; throughput = updates delivered in the same simulated time",
        },
        indent=1,
    )
    if not a.no_plot:
        plt = harness.pyplot()

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, dist in zip(axes, ("uniform", "zipf"), strict=True):
            for pol in VARIANTS:
                ys = [max(get(dist, pol, lf)["staleness_s"], 1e-3) for lf in LOAD_FACTORS]
                ax.plot(LOAD_FACTORS, ys, marker="o", label=pol)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("load factor")
            ax.set_title(f"{dist} key update rates")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("average staleness (s, log)")
        axes[0].legend()
        fig.suptitle("UpStream on lowwater's live path: staleness vs load factor")
        harness.save_figure(fig, harness.RESULTS / "upstream.png")
    print(f"wrote {harness.RESULTS / 'upstream.json'}" + ("" if a.no_plot else " and upstream.png"))


if __name__ == "__main__":
    main()
