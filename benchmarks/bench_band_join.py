"""A windowed count over a two-sided band join, band size swept (OOP paper experiment N1, Q7 / Fig. 11;
dissertation Q7-2, Figs. 7-6 and 7-7): lowwater's order-agnostic join (OA) against the order-preserving
output-buffered (OPOB) and input-buffered (OPIB) joins; peak memory, window-close latency, CPU time.

Two ordered, synchronised streams M1 (left) and M2 (right), ``RATE`` tuples/s each, ``FLOWS`` flows, a
tuple of M2 carrying its flow's 4-tuple in the other direction. Query (Q7-2, the window scaled from a
minute to 10 s): ``count(*)`` per tumbling 10 s window of M1.ts over M1 x M2 on the flow, with
``-n <= M2.ts - M1.ts <= n``. Virtual time in ticks of 100 ms: every tick each stream delivers that tick's
tuples and a punctuation at the tick's end, so memory and latency do not depend on the machine's load.

* ``OA``: lowwater's :class:`high_level.join.band.BandJoin` (``band: [-n, n]``, the count as its roll-up),
  closed by its own output mark, pairs aggregated as they are found.
* ``OPOB``: the same join, its pairs held in an output buffer and released sorted on M1.ts once no earlier
  pair can come (``min(M1 mark, M2 mark - n)``), then counted in order: buffer = the pairs of the last ``n``.
* ``OPIB``: join in output order by holding the M1 tuples in an input buffer until M2's mark passes
  ``ts + n`` (their partners are all there), then probing (the same BandJoin, its M1 mark = the released
  front): M2 tuples stay until the released M1 front, ``n`` behind, passes ``ts + n``.

Memory = rows held (join state + buffer; bytes too); latency = virtual time of a window's close - its end
(the floor is ``n``: a pair of the window can arrive until M2 passes its end + n); CPU = process time of
the whole run (load-sensitive: compare within one run). Every variant's window counts are checked equal to
a brute-force count.

    .venv/bin/python -m benchmarks.bench_band_join [--quick] [--bands 1,3,5,7,9]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from high_level.join.band import BandJoin, JoinLayout

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
TICK = NS // 10
RATE = 4_000  # tuples/s per stream (the paper's M1, M2)
FLOWS = 4_000
WINDOW_S = 10
VARIANTS = ("OA", "OPOB", "OPIB")
FIGURE = ("band_join", "band_join_sweep", "OOP paper N1 (Fig. 11) / dissertation Figs. 7-6, 7-7")

CONFIG = """
queries:
  - {{name: m1, kind: select, fields: [src_ip, src_port, dst_ip, dst_port], kafka: {{topic: m1, partitions: 1}}}}
  - {{name: m2, kind: select, fields: [src_ip, src_port, dst_ip, dst_port], kafka: {{topic: m2, partitions: 1}}}}
  - name: q7
    kind: join
    left: m1
    right: m2
    on: {{left: [src_ip, src_port, dst_ip, dst_port], right: [dst_ip, dst_port, src_ip, src_port]}}
    {time}
    type: inner
    aggregates: [{{fn: count, as: pairs}}]
    window: {{range: {window}s}}
"""


def layouts(band_s: int) -> tuple[JoinLayout, JoinLayout]:
    """(with the count roll-up, without it) for ``band: [-n, n]``."""
    cfg = Q.load_text(CONFIG.format(time=f"band: [-{band_s}s, {band_s}s]", window=WINDOW_S))
    j = cfg.joins[0]
    return JoinLayout.of(j, *cfg.selects), JoinLayout.of(j.model_copy(update={"window": None}), *cfg.selects)


def flow_table(rng: np.random.Generator, flows: int = FLOWS) -> np.ndarray:
    """int64[flows, 6]: each flow's select words (src_ip as 2 words, src_port, dst_ip as 2, dst_port)."""
    zero = np.zeros(flows, np.int64)
    return np.column_stack(
        [
            zero,
            rng.integers(1 << 24, 1 << 31, flows),
            rng.integers(1024, 65535, flows),
            zero,
            rng.integers(1 << 24, 1 << 31, flows),
            np.full(flows, 443),
        ]
    ).astype(np.int64)


def stream(
    rng: np.random.Generator, flow: np.ndarray, n: int, seconds: int, reverse: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(ts sorted, cols) of ``n`` tuples over ``seconds`` of random flows, (dst, dport, src, sport) if reversed."""
    ts = T0 + np.sort(rng.integers(0, seconds * NS, n))
    f = flow[rng.integers(0, len(flow), n)]
    return ts, (f[:, [3, 4, 5, 0, 1, 2]] if reverse else f)


def flow_id(cols: np.ndarray, reverse: bool) -> np.ndarray:
    """One int per flow (its client address and port) for the brute-force oracles."""
    return cols[:, 4] * 65536 + cols[:, 5] if reverse else cols[:, 1] * 65536 + cols[:, 2]


def streams(
    seconds: int, seed: int = 1, rate: int = RATE, flows: int = FLOWS
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(M1 ts, M1 cols, M2 ts, M2 cols), each sorted on ts; M2 in the flows' other direction."""
    rng = np.random.default_rng(seed)
    flow = flow_table(rng, flows)
    return (
        *stream(rng, flow, rate * seconds, seconds, False),
        *stream(rng, flow, rate * seconds, seconds, True),
    )


def oracle(m1: np.ndarray, k1: np.ndarray, m2: np.ndarray, k2: np.ndarray, band: int) -> dict[int, int]:
    """Pairs per window (window start ns) by brute force: per flow, every M2 ts within the band."""
    import pandas as pd

    a = pd.DataFrame({"ts": m1, "k": flow_id(k1, False)})
    b = pd.DataFrame({"rts": m2, "k": flow_id(k2, True)})
    m = a.merge(b, on="k")
    m = m[(m.rts - m.ts).abs() <= band]
    w = T0 + (m.ts.to_numpy() - T0) // (WINDOW_S * NS) * (WINDOW_S * NS)
    u, c = np.unique(w, return_counts=True)
    return dict(zip(u.tolist(), c.tolist(), strict=True))


def _add(j: BandJoin, side: str, ts: np.ndarray, cols: np.ndarray) -> None:
    if len(ts):
        j.add(side, ts, cols)


def _feed(seconds: int) -> Any:
    """Per tick: (tick end ns, M1 slice, M2 slice) of the sorted streams."""
    for k in range(seconds * NS // TICK + 1):
        yield T0 + (k + 1) * TICK


def run(variant: str, band_s: int, data: tuple, seconds: int) -> dict[str, Any]:
    m1, k1, m2, k2 = data
    band = band_s * NS
    with_rollup, plain = layouts(band_s)
    j = BandJoin(with_rollup if variant == "OA" else plain, host_timeout_ms=10**12, expected_hosts=("h",))
    win_ns = WINDOW_S * NS
    counts: dict[int, int] = {}
    close: dict[int, int] = {}
    peak_rows = peak_bytes = 0
    buf_ts = np.empty(0, np.int64)  # OPOB: buffered pairs' M1.ts (a pair row: 2 ts + 12 words)
    in_ts, in_cols = np.empty(0, np.int64), np.empty((0, 6), np.int64)  # OPIB: held M1 tuples
    front_done = T0  # in-order count: windows below this are closed
    pair_bytes = 8 * (2 + 12)
    c0 = time.process_time()
    i1 = i2 = 0
    for end in _feed(seconds):
        e1, e2 = np.searchsorted(m1, end), np.searchsorted(m2, end)
        mark1 = mark2 = end if end < T0 + seconds * NS else 2**62  # end of stream: every mark passes
        if variant == "OPIB":
            in_ts = np.concatenate([in_ts, m1[i1:e1]])
            in_cols = np.concatenate([in_cols, k1[i1:e1]])
            front = min(mark1, mark2 - band)  # M1 tuples below it have all their M2 partners
            go = in_ts < front
            _add(j, "left", in_ts[go], in_cols[go])
            in_ts, in_cols = in_ts[~go], in_cols[~go]
            j.observe("left", "h", 1, front, 0, 0)
        else:
            _add(j, "left", m1[i1:e1], k1[i1:e1])
            j.observe("left", "h", 1, mark1, 0, 0)
        _add(j, "right", m2[i2:e2], k2[i2:e2])
        j.observe("right", "h", 1, mark2, 0, 0)
        i1, i2 = e1, e2
        out = j.step()
        now = min(end, T0 + seconds * NS)
        extra_rows, extra_bytes = 0, 0
        if variant == "OA":
            w = out.windows
            for ws, n in zip(w.window.tolist(), w.state[:, 0].tolist(), strict=True):
                start = with_rollup.rollup.origin_ns + ws * with_rollup.rollup.pane_ns
                counts[start] = counts.get(start, 0) + int(n)
                close.setdefault(start, now)
            extra_rows = len(j.rollup.pane) if hasattr(j.rollup, "pane") else 0
        else:
            lts = out.l_ts
            if variant == "OPOB":
                buf_ts = np.concatenate([buf_ts, lts])
                front = min(mark1, mark2 - band)
                go = buf_ts < front
                lts = np.sort(buf_ts[go])  # released in M1.ts order
                buf_ts = buf_ts[~go]
                extra_rows, extra_bytes = len(buf_ts), len(buf_ts) * pair_bytes
            else:
                front = min(mark1, mark2 - band)
                extra_rows, extra_bytes = len(in_ts), in_ts.nbytes + in_cols.nbytes
            ws = T0 + (lts - T0) // win_ns * win_ns
            u, c = np.unique(ws, return_counts=True)
            for s, n in zip(u.tolist(), c.tolist(), strict=True):
                counts[s] = counts.get(s, 0) + n
            # in order: every window ending at or below the front is complete
            while front_done + win_ns <= min(front, T0 + seconds * NS):
                close.setdefault(front_done, now)
                front_done += win_ns
        peak_rows = max(peak_rows, j.state_rows + extra_rows)
        peak_bytes = max(peak_bytes, j.state_bytes + extra_bytes)
    cpu = time.process_time() - c0
    # windows closed before the end of the stream (the last ones close by the end-of-stream mark)
    lat = [
        (close[s] - (s + win_ns)) / NS for s in sorted(close) if s + win_ns + band + TICK < T0 + seconds * NS
    ]
    return {
        "band_s": band_s,
        "variant": variant,
        "peak_rows": int(peak_rows),
        "peak_bytes": int(peak_bytes),
        "latency_median_s": round(float(np.median(lat)), 2) if lat else None,
        "windows": len(lat),
        "pairs": int(sum(counts.values())),
        "cpu_s": round(cpu, 3),
        "_counts": counts,
    }


def sweep_args(doc: str, axis: str, quick: str, full: str) -> tuple[list[int], int, bool]:
    """The join benchmarks' command line: ``--quick`` (``quick`` values, 30 s of stream), ``--<axis>``
    (values, comma-separated; default ``full``), ``--seconds`` (default 60) -> (values, seconds, quick)."""
    ap = harness.parser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{axis} {quick} over 30 s of stream")
    ap.add_argument(f"--{axis}", default=None)
    ap.add_argument("--seconds", type=int, default=None)
    args = ap.parse_args()
    values = [int(x) for x in (getattr(args, axis) or (quick if args.quick else full)).split(",")]
    return values, args.seconds or (30 if args.quick else 60), bool(args.quick)


def sweep_rows(
    values: list[int],
    variants: tuple[str, ...],
    measure: Any,
    oracle_of: Any,
    head: tuple[str, str],
    line: Any,
) -> list[dict[str, Any]]:
    """Every (value, variant) run, its window counts checked against the value's brute-force counts; prints
    the machine and ``head`` (what runs, the table's header), then ``line(row)`` per run."""
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {head[0]}\n{head[1]}", flush=True)
    rows = []
    for x in values:
        exact = oracle_of(x)
        for v in variants:
            r = measure(v, x)
            r["exact"] = {k: n for k, n in r.pop("_counts").items() if n} == exact
            rows.append(r)
            print(line(r) + (" exact" if r["exact"] else " WRONG"), flush=True)
    return rows


def publish(
    figure: tuple[str, str, str],
    rows: list[dict],
    doc: str | None,
    method: dict,
    axis: str,
    colors: dict[str, str],
    panels: list,
    labels: tuple[str, str],
) -> None:
    """Print the summary in ``method``, write ``<name>.json`` (machine, load, method, rows) and ``<name>.png``:
    one panel per (title, value of a row), a line per variant; ``labels`` = (x label, figure title)."""
    print({k: v for k, v in method.items() if k.startswith(("o", "all"))})
    harness.write_figure(figure, machine(), rows, doc, {**method, "load": harness.load()})
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for v, c in colors.items():
        rs = [r for r in rows if r["variant"] == v]
        for a, (_, val) in zip(ax, panels, strict=True):
            a.plot([r[axis] for r in rs], [val(r) for r in rs], marker="o", color=c, label=v)
    harness.style_axes(ax, tuple(t for t, _ in panels), labels[0], suptitle=labels[1])
    harness.save_figure(fig, harness.RESULTS / f"{figure[0]}.png")
    print(f"wrote {harness.RESULTS / figure[0]}.json and {figure[0]}.png")


def main() -> None:
    bands, seconds, quick = sweep_args(__doc__, "bands", "1,5,9", "1,3,5,7,9")
    data = streams(seconds)
    rows = sweep_rows(
        bands,
        VARIANTS,
        lambda v, b: run(v, b, data, seconds),
        lambda b: oracle(*data, b * NS),
        (
            f"{seconds} s of stream, {RATE:,} tuples/s per input",
            f"{'band':>4s} {'variant':7s} {'peak rows':>10s} {'peak MB':>8s} {'lat p50 s':>9s} {'pairs':>10s} {'cpu s':>6s}",
        ),
        lambda r: (
            f"{r['band_s']:4d} {r['variant']:7s} {r['peak_rows']:10,d} {r['peak_bytes'] / 1e6:8.2f} "
            f"{r['latency_median_s']:9.2f} {r['pairs']:10,d} {r['cpu_s']:6.2f}"
        ),
    )
    by = {(r["band_s"], r["variant"]): r for r in rows}
    hi = bands[-1]
    publish(
        FIGURE,
        rows,
        __doc__,
        {
            f"oa_vs_opob_peak_rows_at_{hi}s": round(
                by[hi, "OA"]["peak_rows"] / by[hi, "OPOB"]["peak_rows"], 3
            ),
            f"oa_vs_opib_peak_rows_at_{hi}s": round(
                by[hi, "OA"]["peak_rows"] / by[hi, "OPIB"]["peak_rows"], 3
            ),
            "all_exact": all(r["exact"] for r in rows),
            **{"seconds": seconds, "rate_per_input": RATE, "flows": FLOWS, "window_s": WINDOW_S},
            **{"tick_ms": TICK // 1_000_000, "bands_s": bands, "quick": quick},
        },
        "band_s",
        {"OA": "#2a7", "OPOB": "#c33", "OPIB": "#36c"},
        [
            ("(a) peak memory (MB: join state + buffers)", lambda r: r["peak_bytes"] / 1e6),
            ("(b) median window-close latency (s)", lambda r: r["latency_median_s"]),
            ("(c) CPU time (s)", lambda r: r["cpu_s"]),
        ],
        ("band size n (s)", f"count per {WINDOW_S} s window over M1 x M2 within +-n, {RATE:,} tuples/s each"),
    )


if __name__ == "__main__":
    main()
