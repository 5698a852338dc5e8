"""An equality join on the progressing attribute with late tuples on one input (OOP paper experiment N2,
Q8 / Fig. 12; dissertation Q8-4 / Fig. 8-10): peak memory vs the delay of the late input, lowwater's
order-agnostic join (OOP) against the in-order plan (IOP).

Streams (the paper's): M1 and M2 at ``RATE`` tuples/s each, C at ``SPARSE`` tuples/s whose tuples and
punctuation reach the join ``delay`` seconds late; the join is ``M1 x (M2 UNION C)``, equal flow (M2 and C
in the other direction) and the same tumbling 1 s window of ts (Q8's ``M1.ts = M3.ts`` at 1 s grain,
lowwater's ``within: window``), counted per window. Virtual time in ticks of 100 ms: memory and the
pairs found do not depend on the machine's load.

* ``OOP``: lowwater's :class:`high_level.join.band.BandJoin`; the right input's mark is the min over its
  hosts M2 and C, so M1 tuples wait for C, but an M2 tuple leaves as soon as M1's mark passes its window.
* ``IOP``: an order-preserving union of M2 and C (an M2 tuple waits in the merge until C's mark passes it)
  in front of the same join, whose right input is then in order.

Memory = rows held (join state + merge buffer; bytes too). Both variants' counts are checked equal to a
brute-force count per window. The paper: OOP's memory grows more slowly with the delay than IOP's.

    .venv/bin/python -m benchmarks.bench_late_join [--quick] [--delays 0,2,4,6,8,10]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.bench_band_join import (
    CONFIG,
    FLOWS,
    NS,
    RATE,
    T0,
    TICK,
    _add,
    flow_id,
    flow_table,
    publish,
    stream,
    sweep_args,
    sweep_rows,
)
from contract import query as Q
from high_level.aggregate.meld import Meld
from high_level.join.band import BandJoin, JoinLayout

SPARSE = 0.5  # tuples/s of C
WINDOW_S = 1
VARIANTS = ("OOP", "IOP")
FIGURE = ("late_join", "late_input_window_join", "OOP paper N2 (Fig. 12) / dissertation Fig. 8-10")
EOS = 2**62


def layout() -> JoinLayout:
    cfg = Q.load_text(CONFIG.format(time="within: window", window=WINDOW_S))
    return JoinLayout.of(cfg.joins[0], *cfg.selects)


def data(
    seconds: int, seed: int = 1, rate: int = RATE, flows: int = FLOWS
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The three streams' (ts, cols); M2 and C in the flows' other direction."""
    rng = np.random.default_rng(seed)
    flow = flow_table(rng, flows)
    return {
        "m1": stream(rng, flow, rate * seconds, seconds, False),
        "m2": stream(rng, flow, rate * seconds, seconds, True),
        "c": stream(rng, flow, max(1, int(SPARSE * seconds)), seconds, True),
    }


def oracle(d: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[int, int]:
    """Pairs per window start by brute force."""
    import pandas as pd

    w = WINDOW_S * NS
    a = pd.DataFrame({"w": (d["m1"][0] - T0) // w, "k": flow_id(d["m1"][1], False)})
    rts = np.concatenate([d["m2"][0], d["c"][0]])
    rc = np.concatenate([d["m2"][1], d["c"][1]])
    b = pd.DataFrame({"w": (rts - T0) // w, "k": flow_id(rc, True)})
    m = a.merge(b, on=["w", "k"])
    u, c = np.unique(T0 + m.w.to_numpy() * w, return_counts=True)
    return dict(zip(u.tolist(), c.tolist(), strict=True))


def run(variant: str, delay_s: int, d: dict, seconds: int) -> dict[str, Any]:
    lay = layout()
    j = BandJoin(lay, host_timeout_ms=10**12)
    # every input's hosts are known from the start, as an agent's expected hosts are
    j.melds["left"] = Meld(10**12, ("m1",))
    j.melds["right"] = Meld(10**12, ("m2", "c") if variant == "OOP" else ("m3",))
    delay = delay_s * NS
    end_ns = T0 + seconds * NS
    pos = {s: 0 for s in d}
    buf_ts, buf_cols = np.empty(0, np.int64), np.empty((0, 6), np.int64)  # IOP: the union's merge buffer
    counts: dict[int, int] = {}
    peak_rows = peak_bytes = 0
    c0 = time.process_time()
    t = T0
    while True:
        t += TICK
        marks = {"m1": t, "m2": t, "c": t - delay}
        marks = {s: (m if m <= end_ns else EOS) for s, m in marks.items()}
        got = {}
        for s, (ts, cols) in d.items():
            e = int(np.searchsorted(ts, min(marks[s], end_ns)))
            got[s] = (ts[pos[s] : e], cols[pos[s] : e])
            pos[s] = e
        _add(j, "left", *got["m1"])
        j.observe("left", "m1", 1, marks["m1"], 0, 0)
        if variant == "OOP":
            for s in ("m2", "c"):
                _add(j, "right", *got[s])
                j.observe("right", s, 1, marks[s], 0, 0)
        else:
            buf_ts = np.concatenate([buf_ts, got["m2"][0], got["c"][0]])
            buf_cols = np.concatenate([buf_cols, got["m2"][1], got["c"][1]])
            front = min(marks["m2"], marks["c"])
            go = buf_ts < front
            order = np.argsort(buf_ts[go], kind="stable")  # the merge's output, in ts order
            _add(j, "right", buf_ts[go][order], buf_cols[go][order])
            j.observe("right", "m3", 1, front, 0, 0)
            buf_ts, buf_cols = buf_ts[~go], buf_cols[~go]
        out = j.step()
        w = out.windows
        for ws, n in zip(w.window.tolist(), w.state[:, 0].tolist(), strict=True):
            start = lay.rollup.origin_ns + ws * lay.rollup.pane_ns
            counts[start] = counts.get(start, 0) + int(n)
        peak_rows = max(peak_rows, j.state_rows + len(buf_ts))
        peak_bytes = max(peak_bytes, j.state_bytes + buf_ts.nbytes + buf_cols.nbytes)
        if all(m >= EOS for m in marks.values()):
            break
    return {
        "delay_s": delay_s,
        "variant": variant,
        "peak_rows": int(peak_rows),
        "peak_bytes": int(peak_bytes),
        "pairs": int(sum(counts.values())),
        "late_rows": int(sum(j.late.values())),
        "cpu_s": round(time.process_time() - c0, 3),
        "_counts": counts,
    }


def main() -> None:
    delays, seconds, quick = sweep_args(__doc__, "delays", "0,5,10", "0,2,4,6,8,10")
    d = data(seconds)
    exact = oracle(d)
    rows = sweep_rows(
        delays,
        VARIANTS,
        lambda v, dl: run(v, dl, d, seconds),
        lambda dl: exact,
        (
            f"{seconds} s of stream, {RATE:,} tuples/s on M1, M2",
            f"{'delay':>5s} {'variant':7s} {'peak rows':>10s} {'peak MB':>8s} {'pairs':>9s} {'late':>5s} {'cpu s':>6s}",
        ),
        lambda r: (
            f"{r['delay_s']:5d} {r['variant']:7s} {r['peak_rows']:10,d} {r['peak_bytes'] / 1e6:8.2f} "
            f"{r['pairs']:9,d} {r['late_rows']:5d} {r['cpu_s']:6.2f}"
        ),
    )
    by = {(r["delay_s"], r["variant"]): r for r in rows}
    lo, hi = delays[0], delays[-1]
    # rows per second of delay
    slope = {v: (by[hi, v]["peak_rows"] - by[lo, v]["peak_rows"]) / max(1, hi - lo) for v in VARIANTS}
    publish(
        FIGURE,
        rows,
        __doc__,
        {
            f"oop_vs_iop_peak_rows_at_{hi}s": round(
                by[hi, "OOP"]["peak_rows"] / by[hi, "IOP"]["peak_rows"], 3
            ),
            "oop_vs_iop_growth_per_s_delay": round(slope["OOP"] / slope["IOP"], 3) if slope["IOP"] else None,
            "all_exact": all(r["exact"] for r in rows),
            **{"seconds": seconds, "rate_per_input": RATE, "sparse_per_s": SPARSE, "window_s": WINDOW_S},
            **{"tick_ms": TICK // 1_000_000, "delays_s": delays, "quick": quick},
        },
        "delay_s",
        {"OOP": "#2a7", "IOP": "#c33"},
        [
            ("peak rows held (join state + merge buffer)", lambda r: r["peak_rows"]),
            ("peak memory (MB)", lambda r: r["peak_bytes"] / 1e6),
        ],
        (
            "delay of C (s)",
            f"M1 x (M2 UNION C), same {WINDOW_S} s window and flow; C ({SPARSE} tuples/s) delayed",
        ),
    )


if __name__ == "__main__":
    main()
