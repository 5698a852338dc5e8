"""The handshake join (SYN x SYN-ACK within 3 s) over 3 capture hosts with inter-host skew 0-40 s:
lowwater's order-agnostic join closed by punctuation vs Spark's own stream-stream join with watermarks,
on the same rows in the same arrival order.

* OA-Join: :class:`high_level.join.band.BandJoin` (one partition) fed the emulated hosts' ROWS batches and
  punctuation (punctuation every 1 s, host h's stream ``h * skew / 2`` behind), in micro-batches of
  ``--batch`` messages; state = stored input rows after each batch (peak), output checked against a
  brute-force oracle; rate = input rows per second of the join step on one core.
* Spark: the same rows, in the same arrival order, as one Parquet file per micro-batch read by
  ``readStream.parquet`` (``maxFilesPerTrigger=1``) on ``local[2]``, inner stream-stream join on the
  4-tuple with ``r.ts BETWEEN l.ts AND l.ts + 3 s`` and ``withWatermark`` of ``--delay`` (= the skew,
  the smallest safe delay, unless given); state = the join operator's ``numRowsTotal`` (peak over
  batches); pairs compared with the oracle (a watermark smaller than the skew drops rows).

Writes benchmarks/results/join.json and join.png.

    .venv/bin/python -m benchmarks.bench_join [--syns 20000] [--skews 0,10,20,40] [--batch 30]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import harness
from benchmarks.harness import machine
from benchmarks.proccpu import children, process_table
from contract import query as Q
from contract import wire
from high_level.aggregate.meld import Meld
from high_level.join.band import BandJoin, JoinLayout, match_pairs
from lowwater_testing import oracle as simulate
from lowwater_testing.traffic import make_handshake_traffic

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "handshake.yaml"


def workload(n_syn: int, seed: int = 1) -> tuple[Q.Config, np.ndarray, np.ndarray]:
    cfg = Q.load(CONFIG)
    cfg = Q.Config(
        cfg.path,
        [],
        [s.model_copy(update={"kafka": Q.KafkaSpec(topic=s.topic, partitions=1)}) for s in cfg.selects],
        cfg.joins,
    )
    t = make_handshake_traffic(n_syn, T0, 60 * NS, seed=seed, max_latency_ns=4 * NS)  # a minute of handshakes
    parsed = t.rows()
    left, right = (simulate.select_oracle(s, parsed) for s in cfg.selects)
    return cfg, left, right


def arrival(
    cfg: Q.Config, left: np.ndarray, right: np.ndarray, skew_s: int, hosts: int = 3, seed: int = 2
) -> list[simulate.Message]:
    rng = np.random.default_rng(seed)
    streams = []
    for s, rows in zip(cfg.selects, (left, right), strict=True):
        hidx = rng.integers(0, hosts, len(rows))
        streams += [
            simulate.select_messages(s, rows[hidx == h], f"cap-{h}", skew_ns=skew_s * NS * h // (hosts - 1))
            for h in range(hosts)
        ]
    return simulate.interleave(streams, seed=seed)


def oracle_pairs(left: np.ndarray, right: np.ndarray, band: int) -> int:
    ldf = pd.DataFrame(left, columns=["ts", "a", "b", "c", "d", "e", "f"])
    rdf = pd.DataFrame(right, columns=["rts", "d", "e", "f", "a", "b", "c"])  # swapped direction
    m = ldf.merge(rdf, on=["a", "b", "c", "d", "e", "f"])
    return int(((m["rts"] - m["ts"] >= 0) & (m["rts"] - m["ts"] <= band)).sum())


def _latency(lat: list[np.ndarray]) -> dict:
    """p50/p95/max in seconds of (emission clock - the later row's timestamp) over every pair."""
    x = np.concatenate(lat) / NS if lat else np.zeros(0)
    if not len(x):
        return {}
    return {
        "p50": round(float(np.percentile(x, 50)), 2),
        "p95": round(float(np.percentile(x, 95)), 2),
        "max": round(float(x.max()), 2),
    }


def run_oa(cfg: Q.Config, msgs: list[simulate.Message], batch: int) -> dict:
    j = cfg.joins[0]
    lay = JoinLayout.of(j.model_copy(update={"window": None, "aggregates": [], "group_by": []}), *cfg.selects)
    bj = BandJoin(lay, host_timeout_ms=10**12, expected_hosts=("cap-0", "cap-1", "cap-2"))
    peak_rows = peak_bytes = pairs = 0
    busy = 0.0
    lat = []
    for i in range(0, len(msgs), batch):
        chunk = msgs[i : i + batch]
        vals = [m.value for m in chunk]
        t0 = time.perf_counter()
        out = bj.process(vals, 0)
        busy += time.perf_counter() - t0
        pairs += out.pairs
        lat.append(max(m.t_ns for m in chunk) - np.maximum(out.l_ts, out.r_ts))
        peak_rows, peak_bytes = max(peak_rows, bj.state_rows), max(peak_bytes, bj.state_bytes)
    rows_in = sum(wire.decode(m.value).n for m in msgs if not m.is_punctuation)
    return {
        "pairs": pairs,
        "peak_state_rows": peak_rows,
        "peak_state_bytes": peak_bytes,
        "input_rows": rows_in,
        "input_tuples_per_s_one_core": round(rows_in / busy),
        "latency_s": _latency(lat),
    }


class InOrderJoin:
    """The seed's in-order baseline: buffer each input until every input's mark (min over both inputs'
    hosts) passes a row, i.e. until it is in order, then sort-merge in timestamp order keeping the left
    rows of the last ``band`` for the right rows still to come. Same marks as the OA-Join."""

    def __init__(self, lay: JoinLayout, hosts: tuple[str, ...]) -> None:
        self.lay = lay
        self.melds = {s: Meld(10**12, hosts) for s in ("left", "right")}
        self.buf = {
            s: [np.empty(0, np.int64), np.empty((0, w), np.int64)]
            for s, w in (("left", lay.lw), ("right", lay.rw))
        }
        self.window = [
            np.empty(0, np.int64),
            np.empty((0, lay.lw), np.int64),
        ]  # released left rows of the band

    def process(self, values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """-> (left ts, right ts) of the pairs this step emits."""
        lay = self.lay
        for v in values:
            b = wire.decode(v)
            side = lay.side_of(b.query)
            if isinstance(b, wire.Rows):
                self.buf[side] = [
                    np.concatenate([self.buf[side][0], b.ts]),
                    np.concatenate([self.buf[side][1], b.cols]),
                ]
            elif isinstance(b, wire.Punctuation):
                self.melds[side].observe(b.host, b.incarnation, b.mark_ns, b.mark_ns, b.sent_wall_ns, 0)
        marks = [m.low_water_mark() for m in self.melds.values()]
        if any(m is None for m in marks):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        front = min(marks)  # everything below is in order on both inputs: release it
        rel = {}
        for s in ("left", "right"):
            ts, cols = self.buf[s]
            go = ts < front
            rel[s] = (ts[go], cols[go])
            self.buf[s] = [ts[~go], cols[~go]]
        wl = [
            np.concatenate([self.window[0], rel["left"][0]]),
            np.concatenate([self.window[1], rel["left"][1]]),
        ]
        li, ri = match_pairs(
            wl[1][:, list(lay.lkey)], wl[0], rel["right"][1][:, list(lay.rkey)], rel["right"][0], lay.band_ns
        )
        keep = wl[0] >= front - lay.band_ns
        self.window = [wl[0][keep], wl[1][keep]]
        return wl[0][li], rel["right"][0][ri]

    @property
    def state_rows(self) -> int:
        return len(self.buf["left"][0]) + len(self.buf["right"][0]) + len(self.window[0])

    @property
    def state_bytes(self) -> int:
        return sum(a.nbytes for a in (*self.buf["left"], *self.buf["right"], *self.window))


def run_in_order(cfg: Q.Config, msgs: list[simulate.Message], batch: int) -> dict:
    j = cfg.joins[0]
    lay = JoinLayout.of(j.model_copy(update={"window": None, "aggregates": [], "group_by": []}), *cfg.selects)
    io = InOrderJoin(lay, ("cap-0", "cap-1", "cap-2"))
    peak_rows = peak_bytes = pairs = 0
    lat = []
    for i in range(0, len(msgs), batch):
        chunk = msgs[i : i + batch]
        lts, rts = io.process([m.value for m in chunk])
        pairs += len(lts)
        lat.append(max(m.t_ns for m in chunk) - np.maximum(lts, rts))
        peak_rows, peak_bytes = max(peak_rows, io.state_rows), max(peak_bytes, io.state_bytes)
    return {
        "pairs": pairs,
        "peak_state_rows": peak_rows,
        "peak_state_bytes": peak_bytes,
        "latency_s": _latency(lat),
    }


def run_spark(
    spark, cfg: Q.Config, msgs: list[simulate.Message], batch: int, delay_s: int, band_ns: int
) -> dict:
    """Spark's stream-stream inner join with watermarks over the same arrival, one file per micro-batch."""
    from pyspark.sql import functions as F

    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-join-"))
    names = {s.name: i for i, s in enumerate(cfg.selects)}
    try:
        for side in (0, 1):
            (tmp / f"in{side}").mkdir()
        k = 0
        clocks = [max(m.t_ns for m in msgs[i : i + batch]) for i in range(0, len(msgs), batch)]
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
            d = (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(tmp / f"in{side}"))
            )
            d = d.select(*[F.col(c).alias(f"{p}{c}") for c in ("ts_ns", "sh", "sl", "sp", "dh", "dl", "dp")])
            d = d.withColumn(f"{p}ts", F.timestamp_micros((F.col(f"{p}ts_ns") / 1000).cast("long")))
            return d.withWatermark(f"{p}ts", f"{delay_s} seconds")

        left, right = stream(0, "l_"), stream(1, "r_")
        cond = (
            (F.col("l_sh") == F.col("r_dh"))
            & (F.col("l_sl") == F.col("r_dl"))
            & (F.col("l_sp") == F.col("r_dp"))
            & (F.col("l_dh") == F.col("r_sh"))
            & (F.col("l_dl") == F.col("r_sl"))
            & (F.col("l_dp") == F.col("r_sp"))
            & (F.col("r_ts") >= F.col("l_ts"))
            & (F.col("r_ts") <= F.col("l_ts") + F.expr(f"INTERVAL {band_ns // NS} SECONDS"))
        )
        joined = left.join(right, cond, "inner")
        got: dict[int, pd.DataFrame] = {}

        def collect(df, batch_id: int) -> None:  # the pairs of each micro-batch, for their latency
            got[batch_id] = df.select("l_ts_ns", "r_ts_ns").toPandas()

        q = joined.writeStream.foreachBatch(collect).outputMode("append").start()
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
        data_batches = [p["batchId"] for p in q.recentProgress if p["numInputRows"]]
        q.stop()
        pairs = sum(len(d) for d in got.values())
        lat = [
            clocks[i] - np.maximum(got[b]["l_ts_ns"].to_numpy(), got[b]["r_ts_ns"].to_numpy())
            for i, b in enumerate(data_batches)
            if b in got
        ]  # micro-batch i read chunk i (one file each)
        rows_in = sum(wire.decode(m.value).n for m in msgs if not m.is_punctuation)
        return {
            "pairs": int(pairs),
            "peak_state_rows": peak,
            "peak_state_bytes": peak_bytes,
            "batches": k,
            "input_tuples_per_s_local2": round(rows_in / secs),
            "latency_s": _latency(lat),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scaled(left: np.ndarray, right: np.ndarray, copies: int) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` overlapping copies of the minute of handshakes, each on its own client addresses (the SYN's
    src_ip high word, the SYN-ACK's dst_ip high word, + copy): ``copies`` x the rate and the pairs."""
    dl, dr = np.zeros(left.shape[1], np.int64), np.zeros(right.shape[1], np.int64)
    out = []
    for side, d, w in ((left, dl, 1), (right, dr, 4)):
        parts = []
        for k in range(copies):
            d[:] = 0
            d[0], d[w] = k * 7_000_000, k
            parts.append(side + d)
        out.append(np.concatenate(parts))
    return out[0], out[1]


def tree_cpu_s(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by process ``root`` ('driver': the bench, its sink), its
    child JVM ('jvm': Kafka reads, shuffle, state store) and the JVM's descendants ('python': the Python
    workers of the join's state step), from /proc. On a shared, loaded VM wall time mostly measures the
    other tenants; CPU time per row does not."""
    stats = process_table()
    kids = children(stats)
    out = {"driver": stats.get(root, (0, 0.0, 0.0))[1], "jvm": 0.0, "python": 0.0}
    for child in kids.get(root, []):
        out["jvm"] += stats[child][1]
        out["python"] += stats[child][2]  # Python workers the JVM has reaped
        todo = list(kids.get(child, []))
        while todo:
            pid = todo.pop()
            out["python"] += stats[pid][1] + stats[pid][2]
            todo += kids.get(pid, [])
    return out


class CpuSampler:
    """(wall clock, process-tree CPU seconds per part) every ``period`` s in a thread, to cut the CPU used
    between two instants (the warm micro-batches) out of a run; the sampler's own CPU is taken off."""

    def __init__(self, period: float = 0.25) -> None:
        import threading

        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._t.start()

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            c = tree_cpu_s(os.getpid())
            c["driver"] -= time.thread_time()
            self.samples.append((time.time(), c))
            self._stop.wait(period)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        w = np.array([s[0] for s in self.samples])
        return {
            k: round(float(np.interp(t1, w, c) - np.interp(t0, w, c)), 2)
            for k in self.samples[0][1]
            for c in [np.array([s[1][k] for s in self.samples])]
        }


def stage_times(spark) -> list[dict]:
    """Per stage of the run (Spark's monitoring API, the UI on): what the executors spent where, in seconds."""
    import urllib.request

    url = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/stages?details=false", timeout=30) as r:
        stages = json.load(r)
    out: dict[str, dict] = {}
    for st in stages:
        key = f"{st['numTasks']} tasks: {st['name'][:60]}"
        d = out.setdefault(
            key,
            {
                "stage": key,
                "stages": 0,
                "run_s": 0.0,
                "cpu_s": 0.0,
                "gc_s": 0.0,
                "input_mb": 0.0,
                "shuffle_write_mb": 0.0,
                "shuffle_read_mb": 0.0,
            },
        )
        d["stages"] += 1
        d["run_s"] += st.get("executorRunTime", 0) / 1e3
        d["cpu_s"] += st.get("executorCpuTime", 0) / 1e9
        d["gc_s"] += st.get("jvmGcTime", 0) / 1e3
        d["input_mb"] += st.get("inputBytes", 0) / 2**20
        d["shuffle_write_mb"] += st.get("shuffleWriteBytes", 0) / 2**20
        d["shuffle_read_mb"] += st.get("shuffleReadBytes", 0) / 2**20
    return [{k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()} for d in out.values()]


def run_job(
    left: np.ndarray, right: np.ndarray, pairs: int, skew_s: int, batch_messages: int, stages: bool = False
) -> dict:
    """The job path: the hosts' select batches in a real Kafka broker (2 partitions per input), the real
    job (:class:`high_level.job.HighLevelJob`, the handshake join only) on ``local[2]``; every stored
    window's ``completed`` summed must equal the oracle's pairs."""
    from kafka import KafkaProducer

    from high_level.job import HighLevelJob
    from local_stack.kafka_broker import KafkaBroker
    from local_stack.spark_session import build_spark
    from lowwater_testing.spark import job_options, read_results

    work = Path(tempfile.mkdtemp(prefix="lw-bench-join-job-"))
    broker = KafkaBroker("bench-join", port=0, state=work / "kafka")
    broker.start()
    try:
        tl, tr = broker.create_topic("bench.syns", 2), broker.create_topic("bench.synacks", 2)
        text = CONFIG.read_text().replace("topic: lowwater.syns", f"topic: {tl}")
        cfg = Q.load_text(text.replace("topic: lowwater.synacks", f"topic: {tr}"))
        cfg = Q.Config(cfg.path, [], cfg.selects, [j for j in cfg.joins if j.name == "handshakes"])
        rng = np.random.default_rng(2)
        tagged = []
        for s, rows in zip(cfg.selects, (left, right), strict=True):
            hidx = rng.integers(0, 3, len(rows))
            for h in range(3):
                tagged += [
                    (m.t_ns, s.topic, m.partition, m.value)
                    for m in simulate.select_messages(
                        s, rows[hidx == h], f"cap-{h}", skew_ns=skew_s * NS * h // 2
                    )
                ]
        tagged.sort(key=lambda x: x[0])
        prod = KafkaProducer(
            bootstrap_servers=broker.bootstrap_servers,
            acks=1,
            linger_ms=5,
            batch_size=1 << 20,
            max_request_size=8 << 20,
        )
        for _, topic, part, value in tagged:
            prod.send(topic, value=value, partition=part)
        prod.flush()
        prod.close()
        cum: dict[tuple[str, int], list[int]] = {}  # rows before each offset, per topic-partition
        for _, topic, part, value in tagged:
            c = cum.setdefault((topic, part), [0])
            b = wire.decode(value)
            c.append(c[-1] + (b.n if isinstance(b, wire.Rows) else 0))
        conf = {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g"}
        if stages:  # the monitoring API needs the UI
            conf |= {"spark.ui.enabled": "true", "spark.ui.port": "0"}
        spark = build_spark("bench-join-job", "local[2]", conf, state=work / "spark")
        opts = job_options(
            broker.bootstrap_servers,
            work,
            "bench-join",
            trigger_ms=1000,
            create_topics=False,
            expected_hosts=("cap-0", "cap-1", "cap-2"),
            host_timeout_ms=10**9,
            max_offsets_per_trigger=batch_messages,
        )
        job = HighLevelJob(spark, [], opts, config=cfg)
        cpu = CpuSampler()
        t0 = time.perf_counter()
        job.start()
        job.process_all_available()
        wall = time.perf_counter() - t0
        cpu.stop()
        prog = [p for p in job.streams[0].recentProgress if p["numInputRows"]]
        job.stop()
        stage_rows = stage_times(spark) if stages else []
        spark.stop()
        got = read_results(work / "res", "handshakes")
        completed = int(got.loc[got["kind"] == "final", "completed"].sum())
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows_in = len(left) + len(right)

    def batch_rows(p: dict) -> int:
        src = p["sources"][0]
        start, end = (
            json.loads(x) if isinstance(x, str) else x for x in (src["startOffset"], src["endOffset"])
        )
        return sum(
            cum[(t, int(q))][o] - cum[(t, int(q))][(start or {}).get(t, {}).get(q, 0)]
            for t, parts in end.items()
            for q, o in parts.items()
        )

    warm = prog[1:] or prog  # the first micro-batch starts the Python workers and the Kafka consumers
    busy = sum(p["durationMs"]["triggerExecution"] for p in warm) / 1e3
    start = [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in warm]
    warm_cpu = cpu.between(start[0], start[-1] + warm[-1]["durationMs"]["triggerExecution"] / 1e3)
    warm_rows = sum(batch_rows(p) for p in warm)
    return {
        "input_rows": rows_in,
        "messages": len(tagged),
        "rows_per_message": round(rows_in / len(tagged)),
        "skew_s": skew_s,
        "messages_per_batch": batch_messages,
        "pairs": completed,
        "pairs_vs_oracle": completed - pairs,
        "wall_s": round(wall, 1),
        "batches": [
            {
                "messages": p["numInputRows"],
                "rows": batch_rows(p),
                "ms": p["durationMs"]["triggerExecution"],
                "add_batch_ms": p["durationMs"].get("addBatch"),
            }
            for p in prog
        ],
        "input_tuples_per_s": round(warm_rows / busy),
        "warm_cpu_s": warm_cpu,
        "input_tuples_per_cpu_s": round(warm_rows / sum(warm_cpu.values())),
        "input_tuples_per_s_wall": round(rows_in / wall),
        **({"stages": stage_rows} if stages else {}),
    }


def main() -> None:
    ap = harness.parser()
    ap.add_argument("--syns", type=int, default=20_000)
    ap.add_argument("--skews", default="0,10,20,40")
    ap.add_argument("--batch", type=int, default=30, help="Kafka messages per micro-batch")
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument(
        "--job-copies", type=int, default=10, help="job path: copies of the minute of handshakes (0: skip)"
    )
    ap.add_argument("--job-batch", type=int, default=3000, help="job path: Kafka messages per micro-batch")
    ap.add_argument("--job-skew", type=int, default=0, help="job path: inter-host skew (s)")
    ap.add_argument("--job-only", action="store_true", help="only the job path (prints its figures)")
    ap.add_argument(
        "--job-update", action="store_true", help="with --job-only: replace join.json's job block"
    )
    ap.add_argument("--job-stages", action="store_true", help="job path: add Spark's time per stage (UI on)")
    args = ap.parse_args()
    m = machine()
    load0 = [round(x, 1) for x in os.getloadavg()]  # the VM is shared: say how loaded it was
    cfg, left, right = workload(args.syns)
    band = cfg.joins[0].within_ns
    want = oracle_pairs(left, right, band)
    if args.job_only:
        jl, jr = scaled(left, right, args.job_copies)
        job = run_job(jl, jr, want * args.job_copies, args.job_skew, args.job_batch, args.job_stages)
        assert job["pairs_vs_oracle"] == 0, (
            f"the job found {job['pairs']} pairs, oracle {want * args.job_copies}"
        )
        job |= {
            "machine": m,
            "load_avg_1_5_15_at_start": load0,
            "load_avg_1_5_15_at_end": [round(x, 1) for x in os.getloadavg()],
        }
        print(json.dumps(job, indent=1))
        if args.job_update:  # the job block of join.json only (its own machine, date and load)
            path = harness.RESULTS / "join.json"
            d = json.loads(path.read_text())
            d["job"], d["input_tuples_per_s"] = job, job["input_tuples_per_s"]
            path.write_text(json.dumps(d, indent=2))
            print(f"wrote the job block of {path}")
        return
    print(
        f"machine: {m['cpu']}; {len(left):,} SYN rows, {len(right):,} SYN-ACK rows, {want:,} pairs in the band"
    )
    spark = None
    if not args.no_spark:
        from high_level.cluster.session import build_spark
        from local_stack.jars import spark_kafka_jars

        spark = build_spark(
            "bench-join",
            "local[2]",
            {"spark.sql.shuffle.partitions": "2"},
            jars=spark_kafka_jars(),
            state=tempfile.mkdtemp(prefix="lw-bench-join-state-"),
        )
    rows = []
    for skew in [int(x) for x in args.skews.split(",")]:
        msgs = arrival(cfg, left, right, skew)
        oa = run_oa(cfg, msgs, args.batch)
        assert oa["pairs"] == want, f"OA-Join found {oa['pairs']} pairs, oracle {want}"
        row = {"skew_s": skew, "oa": oa, "in_order": run_in_order(cfg, msgs, args.batch)}
        assert row["in_order"]["pairs"] == want
        if spark is not None:
            row["spark"] = run_spark(spark, cfg, msgs, args.batch, max(skew, 1), band)
            row["spark"]["watermark_delay_s"] = max(skew, 1)
            row["spark"]["pairs_vs_oracle"] = row["spark"]["pairs"] - want
        rows.append(row)
        sp = row.get("spark", {})
        print(
            f"skew {skew:3d} s: OA peak state {oa['peak_state_rows']:8,} rows {oa['peak_state_bytes'] / 2**20:7.2f} MiB, "
            f"{oa['input_tuples_per_s_one_core']:,} rows/s on one core; Spark peak state "
            f"{sp.get('peak_state_rows', '-')} rows, pairs {sp.get('pairs', '-')} (oracle {want}); in-order peak "
            f"{row['in_order']['peak_state_rows']:,} rows; latency p50 OA {oa['latency_s'].get('p50')} s, in-order "
            f"{row['in_order']['latency_s'].get('p50')} s, Spark {sp.get('latency_s', {}).get('p50')} s",
            flush=True,
        )
    result = {
        "benchmark": "join",
        "query": "configs/handshake.yaml handshakes (inner, within 3 s)",
        "syn_rows": len(left),
        "synack_rows": len(right),
        "pairs": want,
        "hosts": 3,
        "batch_messages": args.batch,
        "rows": rows,
        "machine": m,
        "load_avg_1_5_15_at_start": load0,
    }
    at40 = [r for r in rows if r["skew_s"] == 40 and "spark" in r]
    if at40 and at40[0]["spark"]["peak_state_rows"]:
        result["oa_state_rows_ratio_vs_spark_at_40s"] = round(
            at40[0]["oa"]["peak_state_rows"] / at40[0]["spark"]["peak_state_rows"], 3
        )
    result["oa_input_tuples_per_s_one_core"] = min(r["oa"]["input_tuples_per_s_one_core"] for r in rows)
    if spark is not None:
        spark.stop()
        spark = None
    if args.job_copies:
        jl, jr = scaled(left, right, args.job_copies)
        job = run_job(jl, jr, want * args.job_copies, args.job_skew, args.job_batch, args.job_stages)
        assert job["pairs_vs_oracle"] == 0, (
            f"the job found {job['pairs']} pairs, oracle {want * args.job_copies}"
        )
        result["job"] = job
        result["input_tuples_per_s"] = job["input_tuples_per_s"]
        print(
            f"job path (Kafka -> the Spark job, local[2]): {job['input_rows']:,} rows, {job['rows_per_message']} per "
            f"message: {job['input_tuples_per_s']:,} rows/s over the warm micro-batches, "
            f"{job['input_tuples_per_s_wall']:,} rows/s start to end",
            flush=True,
        )
    result["load_avg_1_5_15_at_end"] = [round(x, 1) for x in os.getloadavg()]
    harness.write_results("join.json", result)
    try:
        plt = harness.pyplot()

        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        xs = [r["skew_s"] for r in rows]
        series = [
            ("oa", "o-", "lowwater OA-Join (punctuation)"),
            ("in_order", "^--", "in-order sort-merge (seed baseline)"),
            ("spark", "s-", "Spark stream-stream join (watermark = skew)"),
        ]
        for k, style, label in series:
            if all(k in r for r in rows):
                ax.plot(xs, [r[k]["peak_state_rows"] for r in rows], style, label=label)
                ax2.plot(xs, [r[k]["latency_s"].get("p50") for r in rows], style, label=f"{label}, p50")
        ax.set_xlabel("inter-host skew (s)")
        ax.set_ylabel("peak join state (rows)")
        ax.set_title("SYN x SYN-ACK within 3 s, 3 hosts: state")
        ax.legend(fontsize=7)
        ax2.set_xlabel("inter-host skew (s)")
        ax2.set_ylabel("pair latency p50 (s): emission - later row's ts")
        ax2.set_title("result latency")
        ax2.legend(fontsize=7)
        harness.save_figure(fig, harness.RESULTS / "join.png")
    except ImportError:
        pass
    print(f"wrote {harness.RESULTS / 'join.json'}")


if __name__ == "__main__":
    main()
