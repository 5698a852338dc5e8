"""Memory vs inter-host skew against the OOP paper's own baseline, an in-order (IOP) merge
(OOP paper Fig. 1 / dissertation Fig. 8-8).

Two capture hosts, A and B, of equal rate (RATE packets/s of data time each, uniform over 65,536
(src_ip, dst_ip) groups, like two ECMP links); count + sum(length) per group per 10-s tumbling window.
B's stream arrives ``skew`` seconds after A's. Deterministic replay in steps of 1 s of data time: at
step T, A has delivered its data before T, B its data before T - skew. Both plans end in the same
aggregation code (``high_level.aggregate.rollup.QueryRollup``); what differs is what stands in front of it:

* ``oop`` (lowwater): each host sends, per second, its partial aggregates of that second (what the
  low level's flush emits) and punctuation. The real high-level processor
  (``high_level.aggregate.processor.PartitionProcessor``: wire decode, meld = min over the hosts' marks,
  roll-up, close) merges them as they come, in any order. State: its pane table, one row per
  (open pane, group), in rows and in bytes (the table's numpy arrays).
* ``iop``: the paper's in-order plan. The union of the two links releases packet tuples in timestamp
  order, so it must hold every tuple of A newer than B's frontier (B's punctuation) until B catches
  up; released tuples go, in order, into the same roll-up, which closes a window as soon as the
  ordered stream has passed its end. State: the merge buffer (tuples, and bytes of the buffered
  records: ts, 4 key words, length = 48 B per tuple, as stored) plus the roll-up's rows.

Measured after every step of the steady phase (B has delivered >= 20 s): mean and max. The paper's
headline: at 40 s skew OOP needs ~30 % of IOP's memory (Gigascope, 110,000 pkt/s per link).
``bench_skew.py`` runs the same IOP baseline beside lowwater and Spark's watermark at 4,000 pkt/s in
one run; ``skew_iop.json`` also carries that run's Spark rows (``spark_watermark_from_skew_json``,
labelled with its date).

    .venv/bin/python -m benchmarks.bench_skew_iop [--quick] [--rates 4000,110000] [--skews 1,5,10,20,40]
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from contract import wire
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout, QueryRollup, Windows
from lowwater_testing.queries import config, query

NS = 1_000_000_000
T0_S = 1_700_000_000
WINDOW_S = 10
GROUPS = 65_536
SRC0, DST0 = 0xFFFF_0A00_0000, 0xFFFF_C0A8_0000
HOSTS = ("A", "B")
MAX_BATCH = 65_536
TUPLE = np.dtype([("ts", "<i8"), ("k", "<i8", (4,)), ("len", "<i8")])  # a buffered packet tuple: 48 B
QUERY = config(
    query("skew", group_by=["src_ip", "dst_ip"], aggregates=["count as packets", "sum(length) as bytes"])
).text
GID = np.arange(GROUPS, dtype=np.int64)
KEYS = np.column_stack(
    [np.zeros(GROUPS, np.int64), SRC0 + GID // 256, np.zeros(GROUPS, np.int64), DST0 + GID]
)


def second_packets(host: int, t: int, rate: int) -> np.ndarray:
    """Host's packets of data second t as tuples, in timestamp order."""
    rng = np.random.default_rng((17, host, t, rate))
    out = np.empty(rate, TUPLE)
    out["ts"] = np.sort((T0_S + t) * NS + rng.integers(0, NS, rate))
    g = rng.integers(0, GROUPS, rate)
    out["k"] = KEYS[g]
    out["len"] = rng.integers(64, 1501, rate)
    return out


def gids(tup: np.ndarray) -> np.ndarray:
    return tup["k"][:, 3] - DST0


def host_second_msgs(q: Q.QuerySpec, h: int, t: int, tup: np.ndarray, seq: list[int]) -> list[bytes]:
    """What lowwater's low level sends for one second: partials (one per group seen) + punctuation."""
    g = gids(tup)
    cnt = np.bincount(g, minlength=GROUPS)
    byt = np.bincount(g, weights=tup["len"], minlength=GROUPS).astype(np.int64)
    nz = np.flatnonzero(cnt)
    pane = (T0_S + t) // WINDOW_S
    out = []
    for s in range(0, len(nz), MAX_BATCH):
        sel = nz[s : s + MAX_BATCH]
        out.append(
            wire.encode_partials(
                q.name,
                HOSTS[h],
                1,
                0,
                seq[h],
                np.full(len(sel), pane),
                KEYS[sel],
                np.column_stack([cnt[sel], byt[sel]]),
                compress=False,
            )
        )
        seq[h] += len(sel)
    mark = (T0_S + t + 1) // WINDOW_S
    out.append(
        wire.encode_punctuation(
            wire.Punctuation(
                q.name, HOSTS[h], 1, 0, seq[h], mark, mark * WINDOW_S * NS, (T0_S + t + 1) * NS, {}
            )
        )
    )
    return out


def rollup_bytes(r: QueryRollup) -> int:
    return int(r.pane.nbytes + r.key.nbytes + r.state.nbytes)


class InOrderUnion:
    """The paper's IOP plan: an order-preserving union of the hosts' packet tuples, then the roll-up.

    Tuples wait in per-host buffers until every host's frontier has passed them (a union that emits in
    timestamp order cannot emit a tuple while a slower input may still send an older one); released
    tuples go, in timestamp order, into the same ``QueryRollup`` lowwater uses, which closes every
    window the ordered stream has passed.
    """

    def __init__(self, lay: Layout, hosts: int = 2) -> None:
        self.buf: list[list[np.ndarray]] = [[] for _ in range(hosts)]
        self.roll = QueryRollup(lay)
        self.pane_ns = lay.pane_ns

    def push(self, h: int, tuples: np.ndarray) -> None:
        self.buf[h].append(tuples)

    def release(self, frontier_ns: int) -> Windows:
        """Emit, in order, every buffered tuple older than ``frontier_ns`` (all hosts are past it)."""
        ready = []
        for h, blocks in enumerate(self.buf):
            keep = []
            for blk in blocks:
                if blk["ts"][-1] < frontier_ns:
                    ready.append(blk)
                elif blk["ts"][0] < frontier_ns:
                    cut = int(np.searchsorted(blk["ts"], frontier_ns))
                    ready.append(blk[:cut])
                    keep.append(blk[cut:])
                else:
                    keep.append(blk)
            self.buf[h] = keep
        if ready:
            rel = np.concatenate(ready)
            rel = rel[np.argsort(rel["ts"], kind="stable")]  # the ordered union's output
            self.roll.add(
                rel["ts"] // self.pane_ns,
                rel["k"],
                np.column_stack([np.ones(len(rel), np.int64), rel["len"]]),
            )
        return self.roll.close(int(frontier_ns // self.pane_ns))

    @property
    def buffered_tuples(self) -> int:
        return sum(len(b) for hb in self.buf for b in hb)

    @property
    def buffered_bytes(self) -> int:
        return sum(b.nbytes for hb in self.buf for b in hb)


def run_skew(rate: int, skew: int, meas: int) -> list[dict[str, Any]]:
    q = Q.load_text(QUERY).queries[0]
    lay = Layout.of(q)
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=3_600_000, expected_hosts=HOSTS))
    oop = proc.queries[q.name].rollup
    iop = InOrderUnion(lay)
    seq = [0, 0]
    last = skew + 20 + meas
    samples: dict[str, list[tuple[int, int, int, int]]] = {
        "oop": [],
        "iop": [],
    }  # rows, bytes, buffer tuples, bytes
    closed_oop: dict[int, int] = {}
    closed_iop: dict[int, int] = {}
    secs = {"oop": 0.0, "iop": 0.0}
    for T in range(1, last + 1):
        arrive = [(0, T - 1)] + ([(1, T - 1 - skew)] if T - 1 - skew >= 0 else [])
        tuples = {h: second_packets(h, t, rate) for h, t in arrive}
        t0 = time.perf_counter()
        msgs = [m for h, t in arrive for m in host_second_msgs(q, h, t, tuples[h], seq)]
        out = proc.process(msgs, now_ms=T * 1000)
        secs["oop"] += time.perf_counter() - t0
        fin = out[out["kind"] == "final"]
        for w in np.unique(fin["window"].to_numpy(np.int64)).tolist() if len(fin) else []:
            closed_oop.setdefault(int(w), T)
        t0 = time.perf_counter()
        for h in tuples:
            iop.push(h, tuples[h])
        if T - skew > 0:  # B has delivered its data before T - skew
            done = iop.release((T0_S + T - skew) * NS)
            for w in np.unique(done.window).tolist():
                closed_iop.setdefault(int(w), T)
        secs["iop"] += time.perf_counter() - t0
        if skew + 20 < T <= last:
            samples["oop"].append((len(oop), rollup_bytes(oop), 0, 0))
            samples["iop"].append(
                (len(iop.roll), rollup_bytes(iop.roll), iop.buffered_tuples, iop.buffered_bytes)
            )
    rows = []
    for v, closed in (("oop", closed_oop), ("iop", closed_iop)):
        s = np.array(samples[v], dtype=np.float64)
        total = s[:, 1] + s[:, 3]
        lat = [T - ((w + 1) * WINDOW_S - T0_S) for w, T in closed.items() if (w + 1) * WINDOW_S - T0_S >= 20]
        rows.append(
            {
                "rate_pkt_per_s": rate,
                "skew_s": skew,
                "variant": v,
                "agg_rows_mean": float(s[:, 0].mean()),
                "agg_rows_max": int(s[:, 0].max()),
                "buffer_tuples_mean": float(s[:, 2].mean()),
                "buffer_tuples_max": int(s[:, 2].max()),
                "state_mib_mean": float(total.mean()) / 2**20,
                "state_mib_max": float(total.max()) / 2**20,
                "agg_mib_mean": float(s[:, 1].mean()) / 2**20,
                "buffer_mib_mean": float(s[:, 3].mean()) / 2**20,
                "latency_mean_s": float(np.mean(lat)) if lat else None,
                "windows_closed": len(closed),
                "cpu_s": round(secs[v], 3),
                "samples": len(s),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'rate':>7s} {'skew':>4s} {'plan':5s} {'agg rows':>9s} {'buffer tuples':>13s} {'state MiB':>9s} "
        f"{'max MiB':>8s} {'oop/iop':>7s} {'latency s':>9s} {'cpu s':>6s}"
    ]
    by = {(r["rate_pkt_per_s"], r["skew_s"], r["variant"]): r for r in rows}
    for r in rows:
        iop = by.get((r["rate_pkt_per_s"], r["skew_s"], "iop"))
        ratio = r["state_mib_mean"] / iop["state_mib_mean"] if iop else float("nan")
        lat = "-" if r["latency_mean_s"] is None else f"{r['latency_mean_s']:.1f}"
        lines.append(
            f"{r['rate_pkt_per_s']:7,d} {r['skew_s']:4d} {r['variant']:5s} {r['agg_rows_mean']:9,.0f} "
            f"{r['buffer_tuples_mean']:13,.0f} {r['state_mib_mean']:9.1f} {r['state_mib_max']:8.1f} "
            f"{ratio:7.2f} {lat:>9s} {r['cpu_s']:6.1f}"
        )
    return "\n".join(lines)


def spark_rows() -> list[dict[str, Any]]:
    """Spark watermark rows of the last bench_skew.py run (4,000 pkt/s): rows, and payload at 56 B/row."""
    p = harness.RESULTS / "skew.json"
    if not p.exists():
        return []
    d = json.loads(p.read_text())
    return [
        {
            "skew_s": r["skew_s"],
            "variant": r["variant"],
            "state_rows_mean": r["state_rows_mean"],
            "payload_mib_mean": r["payload_mib_mean"],
            "spark_state_mib_mean": r["spark_state_mib_mean"],
            "run": d["machine"].get("date"),
        }
        for r in d["rows"]
    ]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = harness.pyplot()

    rates = sorted({r["rate_pkt_per_s"] for r in rows})
    fig, ax = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4), squeeze=False)
    for a, rate in zip(ax[0], rates, strict=True):
        for v, color, label in (
            ("iop", "#c33", "IOP: ordered union + roll-up"),
            ("oop", "#2a7", "lowwater (OOP)"),
        ):
            rs = sorted(
                (r for r in rows if r["rate_pkt_per_s"] == rate and r["variant"] == v),
                key=lambda r: r["skew_s"],
            )
            a.plot(
                [r["skew_s"] for r in rs],
                [r["state_mib_max"] for r in rs],
                marker="o",
                color=color,
                label=label,
            )
        a.set_title(f"2 hosts x {rate:,} pkt/s, 65,536 groups, 10-s windows", fontsize=9)
        a.set_xlabel("skew of the late host (s)")
        a.set_ylabel("peak state (MiB)")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    harness.save_figure(fig, path)


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skews 1, 10, 40 s, steady phase 10 s")
    ap.add_argument("--rates", default="4000,110000")
    ap.add_argument("--skews", default=None)
    ap.add_argument("--meas", type=int, default=None)
    args = ap.parse_args()
    skews = [int(s) for s in (args.skews or ("1,10,40" if args.quick else "1,5,10,20,40")).split(",")]
    rates = [int(r) for r in args.rates.split(",")]
    meas = args.meas or (10 if args.quick else 20)
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores", flush=True)
    t_all = time.monotonic()
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for skew in skews:
            rows += run_skew(rate, skew, meas)
            print(table(rows[-2:]), flush=True)
    by = {(r["rate_pkt_per_s"], r["skew_s"], r["variant"]): r for r in rows}
    ratio40 = {
        str(rate): by[(rate, 40, "oop")]["state_mib_max"] / by[(rate, 40, "iop")]["state_mib_max"]
        for rate in rates
        if (rate, 40, "oop") in by
    }
    print(f"\nmachine: {m['cpu']}, {m['cores']} cores; {time.monotonic() - t_all:.0f} s")
    print(table(rows))
    print(f"oop/iop peak state at 40 s skew: {ratio40} (paper ~0.3)")
    out = {
        "benchmark": "skew_oop_vs_iop",
        "figure": "OOP paper Fig. 1 / dissertation Fig. 8-8",
        "machine": m,
        "method": {
            "doc": __doc__,
            "groups": GROUPS,
            "window_s": WINDOW_S,
            "rates": rates,
            "skews_s": skews,
            "steady_phase_s": meas,
            "quick": args.quick,
            "tuple_bytes": TUPLE.itemsize,
        },
        "oop_vs_iop_state_at_40s": ratio40,
        "rows": rows,
        "spark_watermark_from_skew_json": spark_rows(),
    }
    harness.write_results("skew_iop.json", out)
    plot(rows, harness.RESULTS / "skew_iop.png")
    print(f"wrote {harness.RESULTS / 'skew_iop.json'} and skew_iop.png")


if __name__ == "__main__":
    main()
