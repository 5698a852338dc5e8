"""Dissertation Fig. 6-19: AdaptWID vs eager vs lazy window aggregation (``high_level/aggregate/adaptwid.py``)
on a tumbling query over one source (Q6-7: sum(len) per srcIP, RANGE = SLIDE = 1 s) and a sliding query
over the union of three sources (Q6-8: count per srcIP, RANGE 10 s, SLIDE 1 s; the sources 0, 1 and 2 s
apart), for mixes of dense and sparse groups; memory, CPU per close and close latency.

Virtual time: every source flushes its partial rows ``(pane, srcIP, state)`` every 250 ms of stream (a
capture host's table flush), a dense group in every flush of every source, a sparse group once every
``sparse_period`` seconds on one source; the union's low-water mark is the slowest source's pane, and the
windows below it close at every pane boundary. The three strategies get the same batches and must emit
the same windows (a checksum of every emitted row is compared). Memory = the state's int64 words after
every batch (peak, mean); CPU per close = process time of one close (the latency from the punctuation to
the output, the paper's latency); CPU = all merges and closes.

    .venv/bin/python -m benchmarks.bench_adaptwid [--quick] [--seconds 120]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import aggregates as A
from contract import wire
from high_level.aggregate.adaptwid import STRATEGIES, AdaptiveWindows
from high_level.aggregate.rollup import I64, Layout

FIGURE = ("adaptwid", "bench_adaptwid", "dissertation Fig. 6-19 (WID vs AdaptWID, Q6-7 and Q6-8)")
FLUSHES_PER_S = 4
QUERIES = {  # name: (panes per window, source offsets in s)
    "Q6-7 tumbling 1 s, 1 source": (1, (0,)),
    "Q6-8 sliding 10 s/1 s, 3 sources": (10, (0, 1, 2)),
}
MIXES = {  # name: (dense groups, sparse groups, sparse period in s)
    "DS1 dense only": (400, 0, 1),
    "DS2 10% dense": (200, 1800, 10),
    "DS3 1% dense": (50, 5000, 20),
}


def batches(seconds: int, k: int, offsets: tuple[int, ...], mix: tuple[int, int, int], seed: int = 1):
    """Per flush tick: the union's rows (pane, key, state) and the low-water mark after it."""
    dense, sparse, period = mix
    rng = np.random.default_rng(seed)
    ticks = seconds * FLUSHES_PER_S
    phase = rng.integers(0, period * FLUSHES_PER_S, sparse)  # a sparse group's tick within its period
    src_of = rng.integers(0, len(offsets), sparse)
    for t in range(ticks + max(offsets) * FLUSHES_PER_S):
        parts = []
        for j, off in enumerate(offsets):
            ts = t - off * FLUSHES_PER_S  # the source's own stream tick
            if ts < 0 or ts >= ticks:
                continue
            sp = np.flatnonzero((src_of == j) & (phase == ts % (period * FLUSHES_PER_S)))
            keys = np.concatenate([np.arange(dense), dense + sp]).astype(I64)
            v = rng.integers(40, 1500, len(keys)).astype(I64)
            parts.append((np.full(len(keys), ts // FLUSHES_PER_S, I64), keys, v))
        if not parts:
            continue
        pane, key, v = (np.concatenate(x) for x in zip(*parts, strict=True))
        lwm = (t - max(offsets) * FLUSHES_PER_S) // FLUSHES_PER_S  # the slowest source's current pane
        yield pane, key.reshape(-1, 1), np.column_stack([v, np.ones(len(v), I64)]), lwm


def measure(query: str, mix: str, strategy: str, seconds: int) -> dict[str, Any]:
    k, offsets = QUERIES[query]
    lay = Layout("q", "t", 1, k, 0, k, (A.MERGE_SUM, A.MERGE_SUM), 1)
    aw = AdaptiveWindows(lay, strategy)
    words, closes, merge_cpu, rows_in, rows_out = [], [], 0.0, 0, 0
    check = 0
    for pane, key, state, lwm in batches(seconds, k, offsets, MIXES[mix]):
        t0 = time.process_time()
        aw.merge(pane, key, state)
        merge_cpu += time.process_time() - t0
        rows_in += len(pane)
        words.append(aw.words())
        if lwm > (aw.closed or 0):
            t0 = time.process_time()
            out = aw.close(lwm)
            closes.append(time.process_time() - t0)
            rows_out += len(out)
            if len(out):
                h = wire.key_hash(np.column_stack([out.window, out.key, out.state]))
                check = (check + int(h.astype(np.uint64).sum(dtype=np.uint64))) % 2**64
    out = aw.close(10**9)
    rows_out += len(out)
    if len(out):
        h = wire.key_hash(np.column_stack([out.window, out.key, out.state]))
        check = (check + int(h.astype(np.uint64).sum(dtype=np.uint64))) % 2**64
    c = np.array(closes)
    return {
        "query": query,
        "mix": mix,
        "strategy": strategy,
        "rows_in": rows_in,
        "windows_out": rows_out,
        "checksum": check,
        "memory_words_peak": int(max(words)),
        "memory_words_mean": float(np.mean(words)),
        "close_cpu_ms_mean": float(1e3 * c.mean()),
        "close_cpu_ms_p95": float(1e3 * np.percentile(c, 95)),
        "cpu_s": float(merge_cpu + c.sum()),
        "switches_lazy_to_eager": aw.switches[0],
        "switches_eager_to_lazy": aw.switches[1],
    }


HEAD = ("query", "mix", "strategy", "words pk", "words mean", "close ms", "cpu s", "->eager", "->lazy")


def _settings() -> tuple[bool, int]:
    """--quick and the seconds of stream per run."""
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 s of stream per run (a smoke check)")
    ap.add_argument("--seconds", type=int, default=None)
    args = ap.parse_args()
    return args.quick, args.seconds or (40 if args.quick else 120)


def main() -> None:
    quick, seconds = _settings()
    m = machine()
    print(
        f"{seconds} s of stream per run on {m['cores']} cores of {m['cpu']}\n" + " | ".join(HEAD), flush=True
    )
    rows = []
    for q in QUERIES:
        for mix in MIXES:
            got = [measure(q, mix, s, seconds) for s in STRATEGIES]
            if len({r["checksum"] for r in got}) != 1 or len({r["windows_out"] for r in got}) != 1:
                raise SystemExit(f"{q} {mix}: the strategies disagree: {got}")
            for r in got:
                print(
                    f"{q:34s} {mix:15s} {r['strategy']:9s} {r['memory_words_peak']:9,d} {r['memory_words_mean']:10,.0f} "
                    f"{r['close_cpu_ms_mean']:8.2f} {r['cpu_s']:6.2f} {r['switches_lazy_to_eager']:7d} "
                    f"{r['switches_eager_to_lazy']:6d}",
                    flush=True,
                )
            rows += got
    method = {
        "seconds": seconds,
        "flushes_per_s": FLUSHES_PER_S,
        "queries": QUERIES,
        "mixes": MIXES,
        "quick": quick,
        "smoke": quick,
    }
    path = harness.write_figure(FIGURE, m, rows, __doc__, method)
    plt = harness.pyplot()
    fig, ax = plt.subplots(2, 3, figsize=(15, 7))
    colors = {"lazy": "#999", "eager": "#c33", "adaptive": "#2a7"}
    for i, q in enumerate(QUERIES):
        for j, (key, title) in enumerate(
            (
                ("memory_words_mean", "mean state (int64 words)"),
                ("close_cpu_ms_mean", "CPU per close (ms)"),
                ("cpu_s", "CPU, all merges + closes (s)"),
            )
        ):
            a = ax[i, j]
            x = np.arange(len(MIXES))
            for n, s in enumerate(STRATEGIES):
                vals = [
                    next(r[key] for r in rows if r["query"] == q and r["mix"] == mx and r["strategy"] == s)
                    for mx in MIXES
                ]
                a.bar(x + (n - 1) * 0.27, vals, 0.27, label=s, color=colors[s])
            a.set_xticks(x, [mx.split()[0] for mx in MIXES])
            a.set_title(f"{q}: {title}", fontsize=9)
            a.grid(axis="y", alpha=0.3)
    ax[0, 0].legend(fontsize=8)
    fig.suptitle(
        f"AdaptWID vs eager vs lazy, {seconds} s of stream (virtual time){' - smoke' if quick else ''}",
        fontsize=10,
    )
    harness.save_figure(fig, harness.RESULTS / "adaptwid.png")
    print(f"wrote {path} and adaptwid.png")


if __name__ == "__main__":
    main()
