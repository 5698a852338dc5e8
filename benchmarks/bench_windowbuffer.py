"""UpStream Figs. 18-20: EAGER-WB vs LAZY-WB window buffers (``high_level/live/windowbuffer.py``),
staleness and memory, on a virtual clock (as ``bench_upstream.py``'s consumer).

The seed's query Q (Table 2): a sliding-window sum (w, s tuples) and a delay operator of cost C behind an
IN-PLACE window-aware update queue. CPT (scenario c): the delay is per tuple, in front of an incremental
aggregate, C = 50 ms; CPW (scenario d): the aggregate consumes the committed window's tuples at no cost
and the delay (C = 100 ms) is paid per window result. Tuples arrive at a steady rate, each for a key
drawn uniformly; the load factor LF = C / TBA (Table 3: TBA the time between arrivals), i.e. tuples/s x C.
Keys are served in IN-PLACE order (order of enqueue); a key's scheduling point commits its buffer's
candidate window, EAGER-WB then consumes the window as it arrives and leaves the key at a gap.

Staleness = the seed's Definitions 9-10 via ``high_level/live/staleness.py``: per key, a window is an
input arriving when it closes, a delivered window result reflects every window up to its start; time
average per key, mean over keys. Memory = tuples held by the key's buffer (max and time-mean per key),
against the bounds w + s (eager) and 2w + s (lazy). Every delivered result is checked against the
window's sum.

Fig. 18: one key, w = 10, s = 1 / 5 / 10, LF 0.5-16, CPT and CPW. Fig. 19: 10 keys, w = 10, s = 1-10,
low and high rate (CPT 40 / 1000 tuples/s, CPW 100 / 1000). Fig. 20: memory of the Fig. 18 CPT runs,
and vs w = 10-100 at 1000 tuples/s, s = 1.

    .venv/bin/python -m benchmarks.bench_windowbuffer [--quick]
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict

from benchmarks import harness
from benchmarks.harness import machine
from high_level.live.staleness import StalenessMeter
from high_level.live.windowbuffer import POLICIES, make

COST_S = {"cpt": 0.05, "cpw": 0.1}  # Table 2: C = 50 (per tuple) and 100 (per window), ms
LOAD_FACTORS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
SLIDES_18 = (1, 5, 10)
SLIDES_19 = (1, 2, 5, 10)
RATES_19 = {
    "cpt": (10, 40, 1000),
    "cpw": (100, 1000),
}  # tuples/s: §7.3.2's low and high, + CPT below capacity
SIZES_20 = (10, 20, 50, 100)
W = 10


def simulate(
    policy: str, mode: str, w: int, s: int, lf: float, keys: int, tuples: int, seed: int = 1
) -> dict:
    """One run of Q on the virtual clock (time unit: C); staleness and memory per key."""
    rng = random.Random(seed)
    tba = 1.0 / lf
    bufs = [make(policy, w, s) for _ in range(keys)]
    seq = [0] * keys
    values: list[list[float]] = [[] for _ in range(keys)]  # per key, by timestamp
    meter = StalenessMeter()
    line: OrderedDict[int, None] = OrderedDict()  # IN-PLACE: keys with work, in order of enqueue
    state = {"cur": None, "busy": None, "item": None, "acc": [0.0] * keys}
    delivered = wrong = 0
    mem_sum = 0

    def enqueue(k: int) -> None:
        if k != state["cur"] and k not in line and bufs[k].ready():
            line[k] = None

    def start_work(t: float) -> None:
        while True:
            k = state["cur"]
            if k is None:
                while line:
                    k, _ = line.popitem(last=False)
                    if bufs[k].ready():
                        break
                    k = None
                if k is None:
                    return
                state["cur"] = k
            b = bufs[k]
            if b.db is None:
                b.commit()
                state["acc"][k] = 0.0
            if mode == "cpt":
                got = b.take()
                if got is not None:
                    state["acc"][k] += got[1]
                if b.done():
                    state["item"] = (k, b.release(), state["acc"][k])
                    state["cur"] = None
                    enqueue(k)
                elif got is None:  # a gap: serve other keys meanwhile
                    state["cur"] = None
                if got is not None:
                    state["busy"] = t + 1.0
                    return
            else:
                while (got := b.take()) is not None:
                    state["acc"][k] += got[1]
                state["cur"] = None
                if b.done():
                    state["item"] = (k, b.release(), state["acc"][k])
                    enqueue(k)
                    state["busy"] = t + 1.0
                    return

    i = 0
    t_end = (tuples - 1) * tba
    while True:
        ta = i * tba if i < tuples else float("inf")
        busy = state["busy"]
        if busy is not None and busy <= ta:
            state["busy"] = None
            if state["item"] is not None:
                k, a, acc = state["item"]
                state["item"] = None
                if busy <= t_end:
                    meter.deliver(k, a, busy)
                delivered += 1
                wrong += acc != sum(values[k][a : a + w])
            start_work(busy)
        elif i < tuples:
            k = rng.randrange(keys)
            ts, v = seq[k], float(rng.randint(1, 9))
            seq[k] += 1
            values[k].append(v)
            for a in bufs[k].arrive(ts, v):
                meter.arrive(k, a, ta)
            mem_sum += sum(b.held for b in bufs)
            enqueue(k)
            i += 1
            if state["busy"] is None:
                start_work(ta)
        else:
            break
    return {
        "staleness_s": round(meter.stream_average(t_end) * COST_S[mode], 4),
        "windows_delivered": delivered,
        "windows_closed": sum(max(0, (q - w) // s + 1) for q in seq),
        "wrong_results": wrong,
        "max_held": max(b.max_held for b in bufs),
        "mean_held": round(mem_sum / tuples / keys, 2),
        "bound": bufs[0].bound,
        "overwritten": sum(b.overwritten for b in bufs),
    }


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer tuples per point")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    n1, nk = (800, 1500) if a.quick else (6000, 12000)
    m = machine()
    print(
        f"machine: {m['cpu']}, {m['cores']} cores; {n1} tuples per 1-key run, {nk} per 10-key run", flush=True
    )
    t0, c0 = time.perf_counter(), time.process_time()
    rows = []

    def run(fig: str, policy: str, mode: str, w: int, s: int, lf: float, keys: int, n: int) -> dict:
        r = {"figure": fig, "policy": policy, "mode": mode, "w": w, "s": s, "keys": keys}
        r.update({"load_factor": lf, "tuples_per_s": round(lf / COST_S[mode], 1)})
        r.update(simulate(policy, mode, w, s, lf, keys, n))
        rows.append(r)
        return r

    for mode in ("cpt", "cpw"):
        for s in SLIDES_18:
            for lf in LOAD_FACTORS:
                e, lz = (run("18", p, mode, W, s, lf, 1, n1) for p in POLICIES[::-1])
                print(
                    f"18 {mode} s={s:2d} LF {lf:4.1f}: staleness eager {e['staleness_s']:.3f} s, lazy "
                    f"{lz['staleness_s']:.3f} s; max held {e['max_held']}/{e['bound']} vs {lz['max_held']}/{lz['bound']}",
                    flush=True,
                )
        for rate in RATES_19[mode]:
            for s in SLIDES_19:
                lf = rate * COST_S[mode]
                e, lz = (run("19", p, mode, W, s, lf, 10, nk) for p in POLICIES[::-1])
                print(
                    f"19 {mode} {rate:4d}/s s={s:2d}: staleness eager {e['staleness_s']:.3f} s, lazy {lz['staleness_s']:.3f} s",
                    flush=True,
                )
    for w in SIZES_20:
        e, lz = (run("20c", p, "cpt", w, 1, 1000 * COST_S["cpt"], 1, n1) for p in POLICIES[::-1])
        print(
            f"20c w={w:3d}: max held eager {e['max_held']}/{e['bound']}, lazy {lz['max_held']}/{lz['bound']}",
            flush=True,
        )
    assert not any(r["wrong_results"] for r in rows), "a delivered window differs from its oracle sum"
    assert all(r["max_held"] <= r["bound"] for r in rows), "a buffer exceeded its memory bound"

    def pick(fig: str, mode: str, s: int, x: float, key: str = "load_factor") -> dict:
        return {
            r["policy"]: r
            for r in rows
            if r["figure"] == fig and r["mode"] == mode and r["s"] == s and r[key] == x
        }

    c1, w1 = pick("18", "cpt", 1, 1.0), pick("18", "cpw", 1, 1.0)
    c16 = pick("18", "cpt", 1, 16.0)
    summary = {
        "eager_vs_lazy_staleness_cpt_lf1_s1": round(
            c1["eager"]["staleness_s"] / c1["lazy"]["staleness_s"], 3
        ),
        "eager_vs_lazy_staleness_cpw_lf1_s1": round(
            w1["eager"]["staleness_s"] / w1["lazy"]["staleness_s"], 3
        ),
        "eager_vs_lazy_staleness_cpt_lf16_s1": round(
            c16["eager"]["staleness_s"] / c16["lazy"]["staleness_s"], 3
        ),
        "max_held_over_bound_eager": round(
            max(r["max_held"] / r["bound"] for r in rows if r["policy"] == "eager"), 3
        ),
        "max_held_over_bound_lazy": round(
            max(r["max_held"] / r["bound"] for r in rows if r["policy"] == "lazy"), 3
        ),
        "wrong_results": 0,
        "run_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
    }
    print(summary)
    method = {"tuples_1key": n1, "tuples_10keys": nk, "w": W, "cost_s": COST_S, "quick": a.quick}
    figure = ("windowbuffer", "windowbuffer", "UpStream Figs. 18-20 (EAGER-WB vs LAZY-WB: staleness, memory)")
    harness.write_figure(figure, m, rows, __doc__, {**method, "load": harness.load(), **summary})
    if not a.no_plot:
        plot(rows)
    print(f"wrote {harness.RESULTS / 'windowbuffer.json'}" + ("" if a.no_plot else " and windowbuffer.png"))


STYLE = {"eager": "-", "lazy": "--"}
SLIDE_COLOR = {1: "C0", 5: "C1", 10: "C2"}  # per slide; eager solid, lazy dashed


def _fig18_lines(ax: object, rows: list[dict], mode: str, field: str, label: str) -> None:
    """One line per (slide, buffer) of the 1-key runs: ``field`` against the load factor."""
    for s in SLIDES_18:
        for p in POLICIES:
            pts = [
                r
                for r in rows
                if r["figure"] == "18" and r["mode"] == mode and r["s"] == s and r["policy"] == p
            ]
            x, y = [r["load_factor"] for r in pts], [r[field] for r in pts]
            ax.plot(
                x,
                y,
                STYLE[p],
                color=SLIDE_COLOR[s],
                marker="o",
                label=label.format(p=p, s=s, b=pts[0]["bound"]),
            )
    ax.set_xscale("log", base=2)


def plot(rows: list[dict]) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(1, 5, figsize=(22, 4))
    style = STYLE
    for i, mode in enumerate(("cpt", "cpw")):
        _fig18_lines(ax[i], rows, mode, "staleness_s", "{p}-WB s={s}")
        ax[i].set_ylabel("staleness (s)")
    rcolor = {k: f"C{i}" for i, k in enumerate((m, r) for m in RATES_19 for r in RATES_19[m])}
    for mode, mk in (("cpt", "o"), ("cpw", "s")):
        for rate in RATES_19[mode]:
            for p in POLICIES:
                pts = [
                    r
                    for r in rows
                    if r["figure"] == "19"
                    and r["mode"] == mode
                    and r["policy"] == p
                    and r["tuples_per_s"] == rate
                ]
                ax[2].plot(
                    [r["s"] for r in pts],
                    [max(r["staleness_s"], 1e-3) for r in pts],  # log axis: 0 shown at 1 ms
                    style[p],
                    color=rcolor[mode, rate],
                    marker=mk,
                    label=f"{mode.upper()} {p} {rate}/s",
                )
    ax[2].set_yscale("log")
    _fig18_lines(ax[3], rows, "cpt", "mean_held", "{p} s={s} (bound {b})")
    for p in POLICIES:
        pts = [r for r in rows if r["figure"] == "20c" and r["policy"] == p]
        ax[4].plot(
            [r["w"] for r in pts], [r["max_held"] for r in pts], style[p], marker="o", label=f"{p} max"
        )
        ax[4].plot(
            [r["w"] for r in pts], [r["mean_held"] for r in pts], style[p], marker="x", label=f"{p} mean"
        )
        ax[4].plot([r["w"] for r in pts], [r["bound"] for r in pts], ":", label=f"{p} bound")
    ax[3].set_ylabel("tuples held (mean)")
    ax[4].set_ylabel("tuples held")
    titles = (
        "Fig. 18a CPT, 1 key",
        "Fig. 18b CPW, 1 key",
        "Fig. 19: 10 keys, w=10",
        "Fig. 20a/b: memory, CPT",
        "Fig. 20c: memory vs w (1000/s, s=1)",
    )
    harness.style_axes(ax, titles, "load factor", legend_each=True)
    ax[2].set_xlabel("window slide s")
    ax[4].set_xlabel("window size w")
    harness.save_figure(fig, harness.RESULTS / "windowbuffer.png")


if __name__ == "__main__":
    main()
