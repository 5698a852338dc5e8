"""Disorder inside one capture stream: punctuation (lowwater: lazy flush with m chosen for the disorder)
against buffering with consistent and generous slack (dissertation Fig. 6-11 and 6-12).

One host's packets (generator frames, ``RATE`` pkt/s, 1,000 (src_ip, dst_ip) groups, ``SECONDS`` s)
arrive out of order:

* ``band``: each packet up to D late (arrival = timestamp + U(0, D)), e.g. several NICs or RSS queues
  merged. Fig. 6-11's RANGE 64 s / SLIDE 6.4 s / D 3.2 s, scaled by 1/8: RANGE 8 s, SLIDE 0.8 s,
  D 0.4 s; slack 0, 40, 80, 160, 320, 400, 500 ms.
* ``block``: block-sorted, the flow-cache (NetFlow) pattern: per block of B s the packets come flow by
  flow, each flow's packets in time order. Fig. 6-12's RANGE 600 s / SLIDE 60 s / disorder 490 s,
  scaled by 1/60: RANGE 10 s, SLIDE 1 s, B 8.2 s; slack 0 .. 10 s.

Query: count per group over the sliding window. Plans:

* ``punctuation``: the real Numba kernel (parse, sub-aggregate, lazy flush m = ceil(D / pane)), the
  real punctuation rule (``low_level.host.punctuate.advance`` every 256 packets, on the data clock) and
  the real roll-up (``high_level.aggregate.rollup.QueryRollup``) closing windows below each mark. Packets
  behind the mark are late: counted by the kernel and not merged. The agent's rule today: mark =
  min(oldest pane in the table, data clock).
* ``punctuation, hold m``: the same with ``advance(hold_panes=m)``: the mark stays m panes behind
  the data clock while the host is busy.
* ``punctuation, default max_disorder``: the hold the agent applies by default (``heartbeat.max_disorder``,
  2 s, the default skew); case ``block_2s`` is block-sorted disorder of exactly that much, which it
  must absorb without a late packet (its latency over ``punctuation`` is the setting's cost).
* ``consistent slack s`` / ``generous slack s`` (Aurora-style buffering): window w closes when the
  largest timestamp seen passes end(w) + s. A packet late for one of its windows is dropped from all
  (consistent) or only from the windows already closed (generous).

Latency = the largest timestamp seen when the window closed - the window's end (stream time).
Accuracy, over the windows fully inside the stream: mean |error| % of the (window, group) counts, and
% of (window, group) results that are wrong; plus packets dropped as late.

    .venv/bin/python -m benchmarks.bench_disorder [--quick]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from contract import wire
from high_level.aggregate.rollup import Layout, QueryRollup
from low_level.capture.sources.generator import generate_frames
from low_level.host.punctuate import advance
from low_level.kernel.fused import Kernel
from low_level.kernel.parse import empty_outputs, parse_batch
from low_level.kernel.tables import Tables
from lowwater_testing.oracle import packet_partials
from lowwater_testing.queries import spec

NS = 1_000_000_000
MS = 1_000_000
GROUPS = 1000
CHUNK = 256
CASES = {
    "band": {
        "range": "8s",
        "slide": "800ms",
        "pane_ns": 800 * MS,
        "disorder_ns": 400 * MS,
        "slacks_ms": [0, 40, 80, 160, 320, 400, 500],
    },
    "block": {
        "range": "10s",
        "slide": "1s",
        "pane_ns": NS,
        "disorder_ns": 8200 * MS,
        "slacks_ms": [0, 900, 1800, 3600, 5500, 7200, 8200, 10000],
    },
    # block-sorted disorder of the default skew (2 s): what the default heartbeat.max_disorder must absorb
    "block_2s": {"range": "10s", "slide": "1s", "pane_ns": NS, "disorder_ns": 2 * NS, "slacks_ms": [0, 2000]},
}
# the operator's setting (contract.query.HeartbeatSpec.max_disorder) at its default, as the agent applies it
DEFAULT_MAX_DISORDER_NS = Q.HeartbeatSpec().max_disorder_ns


FIGURE = (
    "disorder",
    "disorder_in_one_stream",
    "dissertation Fig. 6-11 (band) and 6-12 (block-sorted)",
)  # results file, benchmark, the paper's figure


def make_query(case: dict[str, Any], m: int) -> Q.QuerySpec:
    return spec(
        "disorder",
        group_by=["src_ip", "dst_ip"],
        window={"range": case["range"], "slide": case["slide"]},
        table=16384,
        flush={"policy": "lazy", "m": m},
    )


def stream(
    kind: str, case: dict[str, Any], q: Q.QuerySpec, rate: int, seconds: int, seed: int = 7
) -> dict[str, Any]:
    """Frames in arrival order, their timestamps, group codes and windows (first window per packet)."""
    n = rate * seconds
    frames, caplen, wirelen, ts = generate_frames(n, groups=GROUPS, seed=seed, synthetic_pps=rate)
    out, status, err = empty_outputs(n)
    parse_batch(
        frames.reshape(-1),
        np.arange(n, dtype=np.int64) * frames.shape[1],
        caplen,
        wirelen,
        ts,
        np.zeros(n, np.int64),
        n,
        out,
        status,
        err,
    )
    _, pane, key, _ = packet_partials(q, out)
    if len(pane) != n:
        raise AssertionError("every generated packet must match the filterless query")
    hashes = wire.key_hash(key)
    uniq, code = np.unique(hashes, return_inverse=True)
    rng = np.random.default_rng(seed)
    if kind.startswith("band"):
        order = np.argsort(ts + rng.integers(0, case["disorder_ns"], n), kind="stable")
    else:
        blk = (ts - ts[0]) // case["disorder_ns"]
        order = np.lexsort((ts, code, blk))
    return {
        "frames": np.ascontiguousarray(frames[order]),
        "caplen": caplen[order],
        "wirelen": wirelen[order],
        "ts": ts[order],
        "pane": pane[order],
        "code": code[order],
        "uniq": uniq,
    }


def counts(pane: np.ndarray, code: np.ndarray, first: np.ndarray, k: int, wlo: int, whi: int) -> np.ndarray:
    """(window, group) counts over windows [wlo, whi]: a packet of pane p counts in windows
    [max(first, p), p + k - 1] (a difference array, no per-packet Python)."""
    a = np.maximum(first, wlo)
    b = np.minimum(pane + k - 1, whi)
    ok = a <= b
    diff = np.zeros((whi - wlo + 2, GROUPS), np.int64)
    np.add.at(diff, (a[ok] - wlo, code[ok]), 1)
    np.add.at(diff, (b[ok] - wlo + 1, code[ok]), -1)
    return np.cumsum(diff, axis=0)[:-1]


def accuracy(got: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    has = exact > 0
    err = np.abs(got - exact)[has] / exact[has]
    return 100.0 * float(err.mean()), 100.0 * float((got != exact).sum()) / max(1, int(has.sum()))


def run_punctuation(s: dict[str, Any], q: Q.QuerySpec, wlo: int, whi: int, hold: int = 0) -> dict[str, Any]:
    lay = Layout.of(q)
    tables = Tables.build([q], chunk=CHUNK)
    kern = Kernel(tables)
    roll = QueryRollup(lay)
    n = len(s["ts"])
    runmax = np.maximum.accumulate(s["ts"])
    closed_at: dict[int, int] = {}
    got = np.zeros((whi - wlo + 1, GROUPS), np.int64)

    def take(stream_ns: int, mark: int | None) -> None:
        recs = tables.drain(0)
        if len(recs):
            pane, key, state = tables.split(0, recs)
            roll.add(pane, key, state)
        if mark is None:
            return
        out = roll.close(mark)
        if len(out):
            sel = (out.window >= wlo) & (out.window <= whi)
            code = np.searchsorted(s["uniq"], wire.key_hash(out.key[sel]))
            np.add.at(got, (out.window[sel] - wlo, code), out.state[sel, 0])
            for w in np.unique(out.window).tolist():
                closed_at.setdefault(int(w), stream_ns)

    for a in range(0, n, CHUNK):
        e = min(n, a + CHUNK)
        kern.run_arrays(s["frames"], s["caplen"], s["wirelen"], s["ts"], a, e)
        m = advance(kern, 0, 0, False, False, hold_panes=hold)
        take(int(runmax[e - 1]), None if m is None else m.pane)
    advance(kern, 0, 0, True, False, end_of_stream=True)
    take(int(runmax[-1]), wire.END_OF_STREAM // 2)
    ends = lay.window_end_ns(np.arange(wlo, whi + 1))
    lat = [(closed_at[w] - int(ends[w - wlo])) / NS for w in range(wlo, whi + 1)]
    return {
        "got": got,
        "latency": lat,
        "late": tables.stat(0, "late"),
        "evictions": tables.stat(0, "evictions"),
    }


def run_slack(
    s: dict[str, Any], lay: Layout, slack_ns: int, consistent: bool, wlo: int, whi: int
) -> dict[str, Any]:
    ts, pane, code = s["ts"], s["pane"], s["code"]
    runmax = np.maximum.accumulate(ts)
    wm = runmax - slack_ns  # watermark when each packet arrives (itself included)
    first_open = (wm - lay.origin_ns) // lay.pane_ns  # windows w with end(w) > wm are still open
    late_any = first_open > pane  # late for at least its earliest window
    if consistent:
        keep = ~late_any
        got = counts(pane[keep], code[keep], pane[keep], lay.k, wlo, whi)
    else:
        got = counts(pane, code, np.maximum(pane, first_open), lay.k, wlo, whi)
    ends = lay.window_end_ns(np.arange(wlo, whi + 1))
    idx = np.searchsorted(wm, ends, side="left")  # first arrival with wm >= end(w)
    lat = [
        (int(runmax[i]) - int(e)) / NS if i < len(ts) else math.nan for i, e in zip(idx, ends, strict=True)
    ]
    return {"got": got, "latency": lat, "late": int(late_any.sum())}


def run_case(kind: str, rate: int, seconds: int) -> list[dict[str, Any]]:
    case = CASES[kind]
    m = max(1, math.ceil(case["disorder_ns"] / case["pane_ns"]))
    q = make_query(case, m)
    lay = Layout.of(q)
    s = stream(kind, case, q, rate, seconds)
    wlo = int(s["pane"].min()) + lay.k  # windows fully inside the stream, clear of its end
    whi = int(s["pane"].max()) - math.ceil(case["disorder_ns"] / case["pane_ns"]) - 2
    exact = counts(s["pane"], s["code"], s["pane"], lay.k, wlo, whi)
    rows = []

    def row(plan: str, slack_ms: int | None, r: dict[str, Any]) -> None:
        err, wrong = accuracy(r["got"], exact)
        lat = np.array(r["latency"], dtype=np.float64)
        rows.append(
            {
                "disorder": kind,
                "plan": plan,
                "slack_ms": slack_ms,
                "m": m if plan.startswith("punctuation") else None,
                "latency_mean_s": float(np.nanmean(lat)),
                "latency_max_s": float(np.nanmax(lat)),
                "mean_error_pct": err,
                "wrong_results_pct": wrong,
                "late_packets": int(r["late"]),
                "late_pct": 100.0 * int(r["late"]) / len(s["ts"]),
                "windows": whi - wlo + 1,
                "evictions": r.get("evictions"),
            }
        )

    row("punctuation", None, run_punctuation(s, q, wlo, whi))
    row("punctuation, hold m", None, run_punctuation(s, q, wlo, whi, hold=m))
    default_hold = math.ceil(DEFAULT_MAX_DISORDER_NS / case["pane_ns"])  # what the agent passes by default
    row("punctuation, default max_disorder", None, run_punctuation(s, q, wlo, whi, hold=default_hold))
    for sl in case["slacks_ms"]:
        for consistent in (True, False):
            row(
                "consistent slack" if consistent else "generous slack",
                sl,
                run_slack(s, lay, sl * MS, consistent, wlo, whi),
            )
    return rows


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 s of stream instead of 120")
    ap.add_argument("--rate", type=int, default=5000)
    args = ap.parse_args()
    seconds = 60 if args.quick else 120
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {args.rate:,} pkt/s, {seconds} s per case", flush=True)
    rows: list[dict[str, Any]] = []
    print(
        f"{'disorder':8s} {'plan':37s} {'slack ms':>8s} {'latency s':>9s} {'max s':>6s} {'err %':>7s} {'wrong %':>8s} "
        f"{'late pkts':>9s}"
    )
    for kind in CASES:
        rs = run_case(kind, args.rate, seconds)
        rows += rs
        for r in rs:
            sl = "-" if r["slack_ms"] is None else str(r["slack_ms"])
            print(
                f"{r['disorder']:8s} {r['plan']:37s} {sl:>8s} {r['latency_mean_s']:9.3f} {r['latency_max_s']:6.2f} "
                f"{r['mean_error_pct']:7.3f} {r['wrong_results_pct']:8.2f} {r['late_packets']:9,d}",
                flush=True,
            )
    method = dict(rate_pkt_per_s=args.rate, seconds=seconds, groups=GROUPS, cases=CASES, quick=args.quick)
    harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for a, kind, metric, label in (
        (ax[0], "band", "mean_error_pct", "mean error (%)"),
        (ax[1], "block", "wrong_results_pct", "wrong (window, group) results (%)"),
    ):
        for plan, color, marker in (
            ("consistent slack", "#c33", "s"),
            ("generous slack", "#36c", "^"),
            ("punctuation", "#2a7", "o"),
            ("punctuation, hold m", "#e90", "D"),
        ):
            rs = [r for r in rows if r["disorder"] == kind and r["plan"] == plan]
            a.plot(
                [r["latency_mean_s"] for r in rs],
                [r[metric] for r in rs],
                marker=marker,
                color=color,
                label=f"{plan} (lazy m={rs[0]['m']})" if rs[0]["m"] else plan,
                linestyle="-" if len(rs) > 1 else "none",
                markersize=9 if rs[0]["m"] else 6,
            )
        a.set_xlabel("mean latency (s of stream time after the window end)")
        a.set_ylabel(label)
        a.set_title(
            f"{kind} disorder ({CASES[kind]['disorder_ns'] / NS:g} s), RANGE {CASES[kind]['range']} "
            f"SLIDE {CASES[kind]['slide']}",
            fontsize=9,
        )
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    harness.save_figure(fig, harness.RESULTS / "disorder.png")
    print(f"wrote {harness.RESULTS / 'disorder.json'} and disorder.png")


if __name__ == "__main__":
    main()
