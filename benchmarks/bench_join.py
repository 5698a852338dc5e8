"""The handshake join (SYN x SYN-ACK within 3 s) over 3 capture hosts with inter-host skew 0-40 s:
lowwater's order-agnostic join closed by punctuation vs Spark's own stream-stream join with watermarks,
on the same rows in the same arrival order.

* OA-Join: :class:`high_level.join.BandJoin` (one partition) fed the emulated hosts' ROWS batches and
  punctuation (punctuation every 1 s, host h's stream ``h * skew / 2`` behind), in micro-batches of
  ``--batch`` messages; state = stored input rows after each batch (peak), output checked against a
  brute-force oracle; rate = input rows per second of the join step on one core.
* Spark: the same rows, in the same arrival order, as one Parquet file per micro-batch read by
  ``readStream.parquet`` (``maxFilesPerTrigger=1``) on ``local[2]``, inner stream-stream join on the
  4-tuple with ``r.ts BETWEEN l.ts AND l.ts + 3 s`` and ``withWatermark`` of ``--delay`` (= the skew,
  the smallest safe delay, unless given); state = the join operator's ``numRowsTotal`` (peak over
  batches); pairs compared with the oracle (a watermark smaller than the skew drops rows).

Writes benchmarks/results/join.json and join.png.

    .venv/bin/python benchmarks/bench_join.py [--syns 20000] [--skews 0,10,20,40] [--batch 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine  # noqa: E402
from contract import query as Q  # noqa: E402
from contract import wire  # noqa: E402
from high_level import simulate  # noqa: E402
from high_level.join import BandJoin, JoinLayout  # noqa: E402
from tests.packets import make_handshake_traffic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NS = 1_000_000_000
T0 = 1_700_000_000 * NS
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "handshake.yaml"


def workload(n_syn: int, seed: int = 1) -> tuple[Q.Config, np.ndarray, np.ndarray]:
    cfg = Q.load(CONFIG)
    cfg = Q.Config(cfg.path, [], [s.model_copy(update={"kafka": Q.KafkaSpec(topic=s.topic, partitions=1)})
                                  for s in cfg.selects], cfg.joins)  # fmt: skip
    t = make_handshake_traffic(n_syn, T0, 60 * NS, seed=seed, max_latency_ns=4 * NS)  # a minute of handshakes
    parsed = t.rows()
    left, right = (simulate.select_oracle(s, parsed) for s in cfg.selects)
    return cfg, left, right


def arrival(cfg: Q.Config, left: np.ndarray, right: np.ndarray, skew_s: int, hosts: int = 3,
            seed: int = 2) -> list[simulate.Message]:  # fmt: skip
    rng = np.random.default_rng(seed)
    streams = []
    for s, rows in zip(cfg.selects, (left, right), strict=True):
        hidx = rng.integers(0, hosts, len(rows))
        streams += [simulate.select_messages(s, rows[hidx == h], f"cap-{h}", skew_ns=skew_s * NS * h // (hosts - 1))
                    for h in range(hosts)]  # fmt: skip
    return simulate.interleave(streams, seed=seed)


def oracle_pairs(left: np.ndarray, right: np.ndarray, band: int) -> int:
    ldf = pd.DataFrame(left, columns=["ts", "a", "b", "c", "d", "e", "f"])
    rdf = pd.DataFrame(right, columns=["rts", "d", "e", "f", "a", "b", "c"])  # swapped direction
    m = ldf.merge(rdf, on=["a", "b", "c", "d", "e", "f"])
    return int(((m["rts"] - m["ts"] >= 0) & (m["rts"] - m["ts"] <= band)).sum())


def run_oa(cfg: Q.Config, msgs: list[simulate.Message], batch: int) -> dict:
    j = cfg.joins[0]
    lay = JoinLayout.of(j.model_copy(update={"window": None, "aggregates": [], "group_by": []}), *cfg.selects)
    bj = BandJoin(lay, host_timeout_ms=10**12, expected_hosts=("cap-0", "cap-1", "cap-2"))
    peak_rows = peak_bytes = pairs = 0
    rows_in = 0
    busy = 0.0
    for i in range(0, len(msgs), batch):
        vals = [m.value for m in msgs[i : i + batch]]
        t0 = time.perf_counter()
        out = bj.process(vals, 0)
        busy += time.perf_counter() - t0
        pairs += out.pairs
        peak_rows, peak_bytes = max(peak_rows, bj.state_rows), max(peak_bytes, bj.state_bytes)
    rows_in = sum(wire.decode(m.value).n for m in msgs if not m.is_punctuation)
    return {"pairs": pairs, "peak_state_rows": peak_rows, "peak_state_bytes": peak_bytes,
            "input_rows": rows_in, "input_tuples_per_s_one_core": round(rows_in / busy)}  # fmt: skip


def run_spark(spark, cfg: Q.Config, msgs: list[simulate.Message], batch: int, delay_s: int, band_ns: int) -> dict:
    """Spark's stream-stream inner join with watermarks over the same arrival, one file per micro-batch."""
    from pyspark.sql import functions as F

    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-join-"))
    names = {s.name: i for i, s in enumerate(cfg.selects)}
    try:
        for side in (0, 1):
            (tmp / f"in{side}").mkdir()
        k = 0
        for i in range(0, len(msgs), batch):
            per = {0: [], 1: []}
            for m in msgs[i : i + batch]:
                b = wire.decode(m.value)
                if isinstance(b, wire.Rows) and b.n:
                    per[names[b.query]].append(np.column_stack([b.ts, b.cols]))
            for side, parts in per.items():
                a = np.concatenate(parts) if parts else np.zeros((0, 7), np.int64)
                df = pd.DataFrame(a, columns=["ts_ns", "sh", "sl", "sp", "dh", "dl", "dp"])
                df.to_parquet(tmp / f"in{side}" / f"part-{k:06d}.parquet")
            k += 1
        schema = "ts_ns long, sh long, sl long, sp long, dh long, dl long, dp long"

        def stream(side: int, p: str):
            d = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(tmp / f"in{side}"))
            d = d.select(*[F.col(c).alias(f"{p}{c}") for c in ("ts_ns", "sh", "sl", "sp", "dh", "dl", "dp")])
            d = d.withColumn(f"{p}ts", F.timestamp_micros((F.col(f"{p}ts_ns") / 1000).cast("long")))
            return d.withWatermark(f"{p}ts", f"{delay_s} seconds")

        left, right = stream(0, "l_"), stream(1, "r_")
        cond = ((F.col("l_sh") == F.col("r_dh")) & (F.col("l_sl") == F.col("r_dl")) & (F.col("l_sp") == F.col("r_dp"))
                & (F.col("l_dh") == F.col("r_sh")) & (F.col("l_dl") == F.col("r_sl")) & (F.col("l_dp") == F.col("r_sp"))
                & (F.col("r_ts") >= F.col("l_ts"))
                & (F.col("r_ts") <= F.col("l_ts") + F.expr(f"INTERVAL {band_ns // NS} SECONDS")))  # fmt: skip
        joined = left.join(right, cond, "inner")
        q = joined.writeStream.format("memory").queryName(f"bench_join_{delay_s}_{int(time.time())}") \
            .outputMode("append").start()  # fmt: skip
        t0 = time.perf_counter()
        peak = peak_bytes = 0
        seen = -1
        while True:
            q.processAllAvailable()
            for p in q.recentProgress:
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    ops = p.get("stateOperators") or []
                    peak = max(peak, sum(int(o.get("numRowsTotal", 0)) for o in ops))
                    peak_bytes = max(peak_bytes, sum(int(o.get("memoryUsedBytes", 0)) for o in ops))
            if seen >= k - 1 or time.perf_counter() - t0 > 1800:
                break
        secs = time.perf_counter() - t0
        pairs = spark.sql(f"select count(*) from {q.name}").collect()[0][0]
        q.stop()
        rows_in = sum(wire.decode(m.value).n for m in msgs if not m.is_punctuation)
        return {"pairs": int(pairs), "peak_state_rows": peak, "peak_state_bytes": peak_bytes, "batches": k,
                "input_tuples_per_s_local2": round(rows_in / secs)}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--syns", type=int, default=20_000)
    ap.add_argument("--skews", default="0,10,20,40")
    ap.add_argument("--batch", type=int, default=30, help="Kafka messages per micro-batch")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    m = machine()
    cfg, left, right = workload(args.syns)
    band = cfg.joins[0].within_ns
    want = oracle_pairs(left, right, band)
    print(f"machine: {m['cpu']}; {len(left):,} SYN rows, {len(right):,} SYN-ACK rows, {want:,} pairs in the band")
    spark = None
    if not args.no_spark:
        from high_level.session import build_spark
        from local_stack.jars import spark_kafka_jars

        spark = build_spark("bench-join", "local[2]", {"spark.sql.shuffle.partitions": "2"}, jars=spark_kafka_jars(),
                            state=tempfile.mkdtemp(prefix="lw-bench-join-state-"))  # fmt: skip
    rows = []
    for skew in [int(x) for x in args.skews.split(",")]:
        msgs = arrival(cfg, left, right, skew)
        oa = run_oa(cfg, msgs, args.batch)
        assert oa["pairs"] == want, f"OA-Join found {oa['pairs']} pairs, oracle {want}"
        row = {"skew_s": skew, "oa": oa}
        if spark is not None:
            row["spark"] = run_spark(spark, cfg, msgs, args.batch, max(skew, 1), band)
            row["spark"]["watermark_delay_s"] = max(skew, 1)
            row["spark"]["pairs_vs_oracle"] = row["spark"]["pairs"] - want
        rows.append(row)
        sp = row.get("spark", {})
        print(f"skew {skew:3d} s: OA peak state {oa['peak_state_rows']:8,} rows {oa['peak_state_bytes'] / 2**20:7.2f} MiB, "
              f"{oa['input_tuples_per_s_one_core']:,} rows/s on one core; Spark peak state "
              f"{sp.get('peak_state_rows', '-')} rows, pairs {sp.get('pairs', '-')} (oracle {want})", flush=True)
    result = {"benchmark": "join", "query": "configs/handshake.yaml handshakes (inner, within 3 s)",
              "syn_rows": len(left), "synack_rows": len(right), "pairs": want, "hosts": 3, "batch_messages": args.batch,
              "rows": rows, "machine": m}  # fmt: skip
    at40 = [r for r in rows if r["skew_s"] == 40 and "spark" in r]
    if at40 and at40[0]["spark"]["peak_state_rows"]:
        result["oa_state_rows_ratio_vs_spark_at_40s"] = round(at40[0]["oa"]["peak_state_rows"]
                                                              / at40[0]["spark"]["peak_state_rows"], 3)
    result["oa_input_tuples_per_s_one_core"] = min(r["oa"]["input_tuples_per_s_one_core"] for r in rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "join.json").write_text(json.dumps(result, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["skew_s"] for r in rows]
        ax.plot(xs, [r["oa"]["peak_state_rows"] for r in rows], "o-", label="lowwater OA-Join (punctuation)")
        if all("spark" in r for r in rows):
            ax.plot(xs, [r["spark"]["peak_state_rows"] for r in rows], "s-", label="Spark stream-stream join (watermark)")
        ax.set_xlabel("inter-host skew (s)")
        ax.set_ylabel("peak join state (rows)")
        ax.set_title("SYN x SYN-ACK within 3 s, 3 hosts")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "join.png", dpi=110)
    except ImportError:
        pass
    print(f"wrote {RESULTS / 'join.json'}")
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
