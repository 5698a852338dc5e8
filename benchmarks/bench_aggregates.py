"""Aggregates beyond sums (issue 14): results in ``benchmarks/results/aggregates.json``, one entry per part.

Parts (``--part``; each run rewrites only its own entry, so parts can be measured separately):

* ``alert_latency``: how long after a window closes its alert reaches the webhook, on the real job.
  Two emulated capture hosts replay synthetic traffic in *wall-clock* time (data time = now, partials
  of a pane leave within one pane after its end as evictions would send them, punctuation every
  200 ms) into a local Kafka broker; the real Spark job (local[2], trigger ``--trigger``, default 1 s)
  closes 2-s tumbling windows by punctuation and fires an alert for every (window, dst_port) group
  with at least ``--min-count`` packets; a real HTTP receiver on 127.0.0.1 (Alertmanager v2 path)
  records when each alert arrives. Latency = arrival - ``startsAt`` (the close: the timestamp of the
  micro-batch whose punctuation closed the window), so it is the rest of that micro-batch (stateful
  step, sink, alert file) plus the delivery thread's post. Goal: p95 <= one trigger interval. Also
  reported: arrival - window end (end to end, includes the hosts' flush delay and punctuation).
* ``kernel_rates``: low-level Mpkt/s on one core of a distinct count (exact and HLL), a top-k and a
  quantile query next to the Q4 count query, in the same run on the same ring (the timed loop of
  ``bench_kernel.py``, variants interleaved, best of ``--repeat``); ``min_ratio_vs_q4`` over the
  holistic ones (goal >= 0.5). Each holistic query groups by (group, sub-key), so its table holds
  more entries than the group count: the rate includes those extra evictions.
* ``hll_error``: HyperLogLog relative error vs memory, precision 10..16, over 10^6 distinct values
  and several seeds, through the second stage (``high_level.aggregate.holistic``); memory = registers x the
  wire record's bytes (pane, group, register, rank words).
* ``adaptwid``: exact distinct count on the high level, the dissertation's section 6.3 comparison:
  per-pane distinct (group, value) sets merged into windows (what lowwater does) vs buffering the
  raw values of each pane and computing every window at close; sliding windows of k panes. Time and
  rows held, measured.

    .venv/bin/python -m benchmarks.bench_aggregates [--part alert_latency|kernel_rates|hll_error|adaptwid]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from contract import wire
from high_level.job import HighLevelJob, JobOptions
from lowwater_testing.oracle import host_messages, interleave, split_hosts
from lowwater_testing.queries import config, query, spec
from lowwater_testing.traffic import make_traffic

NS = 1_000_000_000
HOSTS = ("a", "b")


def alert_query(min_count: int, topic: str) -> Q.QuerySpec:
    """Packets and bytes per port per 2 s, alerting on busy ports."""
    return spec(
        "alert_bench",
        group_by=["dst_port"],
        aggregates=["count as packets", "sum(length) as bytes"],
        alerts=[{"name": "busy_port", "when": f"packets >= {min_count}", "severity": "warning"}],
        window="2s",
        topic=topic,
        partitions=2,
    )


class Receiver:
    """Records each alert's arrival (wall clock) and its payload; answers 200 like Alertmanager."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, dict[str, Any]]] = []
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.time()
                rec.arrivals.extend((now, a) for a in body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _pct(xs: list[float], p: float) -> float:
    return round(float(np.percentile(xs, p)), 3) if xs else float("nan")


def alert_latency(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from kafka import KafkaProducer

    from local_stack.kafka_broker import KafkaBroker
    from local_stack.spark_session import build_spark

    work = Path(tempfile.mkdtemp(prefix="lowwater-bench-aggregates-"))
    broker = KafkaBroker("aggregates", port=0, state=work / "kafka")
    trigger_ms = int(Q.parse_duration_ns(args.trigger) // 1_000_000)
    rx = Receiver()
    try:
        broker.start()
        topic = broker.create_topic("lowwater.alert_bench", 2)
        q = alert_query(args.min_count, topic)
        spark = build_spark(
            "lowwater-bench-aggregates",
            master=args.master,
            state=work / "spark-state",
            extra_conf={"spark.sql.shuffle.partitions": "2"},
        )
        opts = JobOptions(
            bootstrap=broker.bootstrap_servers,
            results=str(work / "results"),
            checkpoint=str(work / "ckpt"),
            trigger_ms=trigger_ms,
            shuffle_partitions=2,
            expected_hosts=HOSTS,
            host_timeout_ms=60_000,
            alert_webhook=rx.url,
            name="bench-alerts",
        )
        job = HighLevelJob(spark, [q], opts)
        submitted: dict[str, float] = {}
        submit = job.delivery.submit

        def timed_submit(alerts: Any) -> None:  # when the sink hands a batch's alerts over
            now = time.time()
            submitted.update((i, now) for i in alerts["id"].to_pylist())
            submit(alerts)

        job.delivery.submit = timed_submit  # type: ignore[method-assign]
        job.start()
        # data time = wall time: traffic from now + 3 s (the job is up) for --seconds
        t0 = (time.time_ns() // (2 * NS) + 2) * 2 * NS
        traffic = make_traffic(args.rate * args.seconds, args.groups, t0, args.seconds * NS, seed=3)
        hix = split_hosts(len(traffic), len(HOSTS), seed=1)
        rows = traffic.rows()
        streams = [
            host_messages(
                q,
                rows[hix == i],
                h,
                partitions=2,
                punct_every_ns=NS // 5,
                seed=i,
                end_mark=wire.END_OF_STREAM,
            )  # the capture's end closes everything
            for i, h in enumerate(HOSTS)
        ]
        msgs = interleave(streams, seed=2)
        log(
            f"replaying {len(msgs)} messages over {args.seconds} s of wall-clock data time (trigger {trigger_ms} ms)"
        )
        prod = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks=1, linger_ms=0)
        try:
            for m in msgs:  # send each message when the wall clock reaches its data-time send instant
                wait = m.t_ns / NS - time.time()
                if wait > 0:
                    prod.flush()
                    time.sleep(wait)
                prod.send(topic, value=m.value, partition=m.partition)
            prod.flush()
        finally:
            prod.close(5)
        deadline = time.time() + 30
        while time.time() < deadline and (job.delivery.queue or not rx.arrivals):
            time.sleep(0.2)
        time.sleep(3 * trigger_ms / 1000)
        job.stop()
        spark.stop()
    finally:
        rx.close()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    after_close = [t - _ts(a["startsAt"]) for t, a in rx.arrivals]
    # the two parts: close -> the sink hands the alerts over (the rest of the micro-batch), then the post
    in_batch = [
        submitted[a["annotations"]["lowwater_id"]] - _ts(a["startsAt"])
        for _, a in rx.arrivals
        if a["annotations"]["lowwater_id"] in submitted
    ]
    delivery = [
        t - submitted[a["annotations"]["lowwater_id"]]
        for t, a in rx.arrivals
        if a["annotations"]["lowwater_id"] in submitted
    ]
    steady = [
        x
        for (t, a), x in zip(rx.arrivals, after_close, strict=True)
        if _ts(a["labels"]["window_end"]) >= t0 / NS + 10
    ]
    after_end = [t - _ts(a["labels"]["window_end"]) for t, a in rx.arrivals]
    ids = [a["annotations"]["lowwater_id"] for _, a in rx.arrivals]
    ends = sorted({a["labels"]["window_end"] for _, a in rx.arrivals})
    p95 = _pct(after_close, 95)
    return {
        "alerts": len(ids),
        "distinct_alerts": len(set(ids)),
        "windows_with_alerts": len(ends),
        "trigger_s": trigger_ms / 1000,
        "window_s": 2,
        "hosts": len(HOSTS),
        "rate_pkt_per_s": args.rate,
        "groups": args.groups,
        "seconds": args.seconds,
        "punctuation_every_s": 0.2,
        "master": args.master,
        "latency_after_close_s": {
            "p50": _pct(after_close, 50),
            "p95": p95,
            "p99": _pct(after_close, 99),
            "max": _pct(after_close, 100),
        },
        "latency_after_close_steady_s": {
            "p50": _pct(steady, 50),
            "p95": _pct(steady, 95),
            "n": len(steady),
            "note": "windows ending >= 10 s after the replay started (warm JVM)",
        },
        "close_to_sink_handoff_s": {"p50": _pct(in_batch, 50), "p95": _pct(in_batch, 95)},
        "handoff_to_receiver_s": {
            "p50": _pct(delivery, 50),
            "p95": _pct(delivery, 95),
            "max": _pct(delivery, 100),
        },
        "latency_after_window_end_s": {
            "p50": _pct(after_end, 50),
            "p95": _pct(after_end, 95),
            "max": _pct(after_end, 100),
        },
        "goal": "p95 after close <= 1 trigger interval",
        "goal_met": bool(p95 <= trigger_ms / 1000),
        "goal_met_steady": bool(_pct(steady, 95) <= trigger_ms / 1000),
    }


HOLISTIC_QUERIES = config(
    query(
        "distinct_src_per_dst",
        group_by=["dst_ip"],
        aggregates=["count_distinct(src_ip) as sources"],
        window="1m",
        table=524288,
    ),
    query(
        "hll_src_per_dst",
        group_by=["dst_ip"],
        aggregates=[
            {"fn": "count_distinct", "field": "src_ip", "approx": "hll", "precision": 12, "as": "sources"}
        ],
        window="1m",
        table=524288,
    ),
    query(
        "top_src_per_dst24",
        group_by=["dst_ip/24"],
        aggregates=[{"fn": "top", "field": "src_ip", "k": 10, "by": "length", "as": "bytes"}],
        window="1m",
        table=524288,
    ),
    query(
        "len_quantiles_per_proto",
        group_by=["protocol"],
        aggregates=[{"fn": "quantiles", "field": "length", "q": [0.5, 0.95, 0.99], "as": "len"}],
        window="1m",
        table=4096,
    ),
).text


def kernel_rates(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Low-level Mpkt/s of the holistic queries vs Q4 (count per (src, dst)) in one run, one core."""
    from benchmarks.bench_kernel import fill_ring, run_kernel
    from benchmarks.queries import q4
    from low_level.capture.sources.generator import generate_frames

    frames, caplen, wirelen, ts = generate_frames(args.packets, groups=args.kgroups, seed=7, snaplen=64)
    ring = fill_ring(frames, caplen, wirelen, ts)
    del frames
    hol = Q.load_text(HOLISTIC_QUERIES).queries
    variants = {"Q4 count (lazy)": [q4(524288, "lazy")], **{q.name: [q] for q in hol}}
    warm = fill_ring(*generate_frames(2000, groups=100, snaplen=64))
    for qs in variants.values():
        run_kernel(warm, qs, 2000)  # compile
    runs: dict[str, list[float]] = {v: [] for v in variants}
    emitted: dict[str, int] = {}
    for r in range(args.repeat):
        for name, qs in variants.items():
            secs, _cpu, st = run_kernel(ring, qs, args.packets)
            runs[name].append(secs)
            emitted[name] = st.get("emitted", 0)
        log(f"round {r + 1}: " + ", ".join(f"{n} {args.packets / runs[n][-1] / 1e6:.2f}" for n in variants))
    mpps = {n: args.packets / min(v) / 1e6 for n, v in runs.items()}
    q4_rate = mpps["Q4 count (lazy)"]
    ratios = {n: round(m / q4_rate, 3) for n, m in mpps.items() if n != "Q4 count (lazy)"}
    return {
        "packets": args.packets,
        "groups": args.kgroups,
        "repeat": args.repeat,
        "mpps": {n: round(m, 3) for n, m in mpps.items()},
        "all_mpps": {n: [round(args.packets / s / 1e6, 3) for s in v] for n, v in runs.items()},
        "records_emitted": emitted,
        "ratio_vs_q4": ratios,
        "min_ratio_vs_q4": min(ratios.values()),
        "goal_min_ratio": 0.5,
    }


def hll_error(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """HLL relative error vs memory (registers) at precision 10..16 over 10^6 distinct values."""
    import pandas as pd

    from contract import sketch
    from high_level.aggregate import holistic

    n, seeds = args.distinct, args.seeds
    rows = []
    for p in range(10, 17):
        q = spec(
            "d", aggregates=[{"fn": "count_distinct", "field": "src_ip", "approx": "hll", "precision": p}]
        )
        errs = []
        for seed in range(seeds):
            rng = np.random.default_rng(1000 + seed)
            vals = rng.choice(1 << 40, n, replace=False).astype(np.int64)
            words = np.column_stack([vals >> 32, vals])  # two address words
            reg, rank = sketch.hll_register_rank(words, p)
            regs = pd.Series(rank).groupby(reg).max()
            est = holistic.offline(
                q,
                np.zeros(len(regs), np.int64),
                regs.index.to_numpy(np.int64).reshape(-1, 1),
                regs.to_numpy(np.int64).reshape(-1, 1),
            )
            errs.append(float(est.iloc[0, -1]) / n - 1)
        rec = 8 * (
            1 + Q.key_width(q) + len(Q.state_columns(q))
        )  # bytes of one wire record (pane, key, state)
        row = {
            "precision": p,
            "registers": 1 << p,
            "max_record_bytes": (1 << p) * rec,
            "std_error_theory": round(sketch.hll_relative_error(p), 5),
            "rms_error": round(float(np.sqrt(np.mean(np.square(errs)))), 5),
            "max_abs_error": round(float(np.max(np.abs(errs))), 5),
            "errors": [round(e, 5) for e in errs],
        }
        log(
            f"p={p}: rms {row['rms_error']:.4f} (theory {row['std_error_theory']:.4f}), max {row['max_abs_error']:.4f}"
        )
        rows.append(row)
    return {"distinct": n, "seeds": seeds, "by_precision": rows, "default_precision": sketch.HLL_DEFAULT_P}


def adaptwid(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Exact distinct per (window, group), sliding k panes: pane sets merged vs raw values buffered.

    Timed: the high level's work from what it receives (pane sets: expand to windows, count values per
    (window, group); raw: per window, count values of its panes' packets), same pandas primitive for
    both; rows held = records the high level receives and keeps (the Kafka volume too)."""
    import pandas as pd

    from high_level.aggregate.rollup import expand_windows, group_reduce

    rng = np.random.default_rng(3)
    out = []
    for k, per_pane, groups, values in (
        (6, 200_000, 1000, 50_000),
        (6, 200_000, 1000, 2_000),
        (2, 200_000, 1000, 50_000),
    ):
        panes = 20
        pane = np.repeat(np.arange(panes, dtype=np.int64), per_pane)
        grp = rng.integers(0, groups, len(pane))
        val = rng.zipf(1.3, len(pane)) % values
        # lowwater: the low level ships per-pane distinct (group, value) rows (deduplicated there) ...
        keys = np.column_stack([pane, grp, val]).astype(np.int64)
        ukeys, _ = group_reduce(keys, np.ones((len(keys), 1), np.int64), (Q.MERGE_SUM,))
        held_sets = len(ukeys)
        t0 = time.perf_counter()
        # ... the high level puts each pane row in its k windows and counts values per (window, group)
        rows, win = expand_windows(ukeys[:, 0], 0, panes + k - 1, k)
        d = pd.DataFrame({"w": win, "g": ukeys[rows, 1], "v": ukeys[rows, 2]})
        a = d.groupby(["w", "g"])["v"].nunique()
        t_sets = time.perf_counter() - t0
        t0 = time.perf_counter()
        # AdaptWID's alternative: buffer the raw values per pane, compute each window at close
        held_raw = len(pane)
        res = []
        for w in range(panes + k - 1):
            sel = (pane > w - k) & (pane <= w)
            d = pd.DataFrame({"g": grp[sel], "v": val[sel]})
            if len(d):
                res.append(d.groupby("g")["v"].nunique().rename(w))
        b = pd.concat(res) if res else pd.Series(dtype=np.int64)
        t_raw = time.perf_counter() - t0
        assert int(a.sum()) == int(b.sum()), "both strategies must count the same"
        row = {
            "panes_per_window": k,
            "packets_per_pane": per_pane,
            "groups": groups,
            "value_domain": values,
            "rows_held_pane_sets": held_sets,
            "rows_held_raw": held_raw,
            "seconds_pane_sets": round(t_sets, 3),
            "seconds_raw_buffer": round(t_raw, 3),
            "faster": "pane_sets" if t_sets < t_raw else "raw_buffer",
            "records_shipped_ratio_raw_vs_sets": round(held_raw / held_sets, 2),
        }
        log(json.dumps(row))
        out.append(row)
    return {"cases": out}


PARTS: dict[str, Callable[[argparse.Namespace, Callable[[str], None]], dict[str, Any]]] = {
    "alert_latency": alert_latency,
    "kernel_rates": kernel_rates,
    "hll_error": hll_error,
    "adaptwid": adaptwid,
}


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=[*PARTS, "all"], default="all")
    ap.add_argument("--seconds", type=int, default=40, help="alert_latency: wall-clock seconds of traffic")
    ap.add_argument("--rate", type=int, default=2000, help="alert_latency: packets per second of data time")
    ap.add_argument("--groups", type=int, default=50, help="alert_latency: dst_port groups")
    ap.add_argument("--min-count", type=int, default=20, help="alert_latency: packets per window that fire")
    ap.add_argument("--trigger", default="1s")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--packets", type=int, default=4_000_000, help="kernel_rates: packets in the ring")
    ap.add_argument("--kgroups", type=int, default=65536, help="kernel_rates: generator groups")
    ap.add_argument(
        "--repeat", type=int, default=3, help="kernel_rates: interleaved rounds (best is reported)"
    )
    ap.add_argument("--distinct", type=int, default=1_000_000, help="hll_error: distinct values")
    ap.add_argument("--seeds", type=int, default=5, help="hll_error: seeds per precision")
    args = ap.parse_args()
    m = machine()
    t_all = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_all:6.0f}s] {msg}", flush=True)

    log(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB")
    results = harness.RESULTS / "aggregates.json"  # parts not run keep their last figures
    doc: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    doc.setdefault("benchmark", "aggregates")
    doc.setdefault("parts", {})
    for name, fn in PARTS.items():
        if args.part in (name, "all"):
            res = fn(args, log)
            doc["parts"][name] = {"machine": m, "doc": fn.__doc__ or "", "result": res}
            log(f"{name}: {json.dumps(res)}")
    print(f"wrote {harness.write_results('aggregates.json', doc)}")


if __name__ == "__main__":
    main()
