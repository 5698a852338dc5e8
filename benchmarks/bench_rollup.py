"""Roll-up rate: partial records per second through the real job (Kafka -> Spark -> Parquet).

``.venv/bin/python -m benchmarks.bench_rollup [--records 4000000] [--groups 100000] [--batch-records ...]`` starts its own
Kafka broker (or uses ``--bootstrap HOST:PORT``) and writes benchmarks/results/rollup.json.

Produces partial records of a (src_ip, dst_ip) count query (the OOP paper's Q4 shape) from several
emulated hosts, warms the JVM and Python workers up on a first slice (its own checkpoint), then, for
each ``--batch-records`` bound, runs the job from a fresh checkpoint over the whole topic with micro-
batches of at most that many records, read back to back. Reported per bound: the first batch (it
carries the query start: planning, code generation), the **sustained** rate of the running job after
it (``spark_records_per_s``: the largest bound), and the whole catch-up including the first batch.
Also times the pure partition processor on the same messages, without Spark, for comparison.

``--sweep`` runs the open-state sweep instead (``rollup_scale.json``): per ``--sweep-groups`` G, one pane is
filled with G distinct groups that stay open (every host's mark stays at that pane), then
``--sweep-records`` more partials of those groups arrive in micro-batches of ``--sweep-batch``; the rate
of those batches is measured for the blob state (the processor saved whole per batch) and the chunked
state (per-batch chunks in RocksDB, ``high_level/aggregate/chunks.py``), side by side in one run on the same
topic. End-of-stream punctuation then closes the pane and both results are checked (G rows, every record).

Besides the rates it records ``cpu_seconds`` (CPU of the Spark JVM, its Python workers and this
driver over the run: on a shared machine wall time depends on the neighbours, CPU time much less)
and Spark's ``durationMs``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import machine
from benchmarks.proccpu import tree_cpu_seconds
from contract import query as Q
from contract import wire
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.job import HighLevelJob, JobOptions
from lowwater_testing.queries import config, query

T0 = 1_700_000_000_000_000_000
QUERY = config(query("bench_pairs", group_by=["src_ip", "dst_ip"])).text


def _job_options(a: argparse.Namespace, work: Path, tag: Any, **kw: Any) -> JobOptions:
    """The job as these runs start it: results and checkpoint ``results-<tag>`` / ``ckpt-<tag>`` under
    ``work``, a 100 ms trigger, one shuffle partition per Kafka partition."""
    return JobOptions(
        bootstrap=a.bootstrap,
        results=str(work / f"results-{tag}"),
        checkpoint=str(work / f"ckpt-{tag}"),
        trigger_ms=100,
        shuffle_partitions=a.partitions,
        **kw,
    )


class _Hosts:
    """Emulated capture hosts sending partials of ``groups`` (src, dst) pairs in batches of ``batch``
    records, 1..4 packets each, with their per-(host, partition) sequence numbers."""

    def __init__(self, q: Q.QuerySpec, groups: int, hosts: int, batch: int, rng: np.random.Generator) -> None:
        gid = np.arange(groups, dtype=np.int64)
        self.keys = np.column_stack(
            [
                np.zeros(groups, np.int64),
                0xFFFF_0A00_0000 + gid // 256,
                np.zeros(groups, np.int64),
                0xFFFF_C0A8_0000 + gid % 65536,
            ]
        )
        self.q, self.hosts, self.batch, self.rng = q, hosts, batch, rng
        self.parts_of = wire.partition_of(self.keys, q.kafka.partitions)
        self.seq = {(h, p): 0 for h in range(hosts) for p in range(q.kafka.partitions)}
        self.out: list[tuple[int, bytes, int]] = []

    def send(self, h: int, g: np.ndarray, pane: int, mark: int | None = None) -> None:
        """Host ``h``'s partials of groups ``g`` in ``pane``, each partition followed by its punctuation
        up to ``mark`` if given."""
        q = self.q
        for p in range(q.kafka.partitions):
            sel = g[self.parts_of[g] == p]
            for s in range(0, len(sel), self.batch):
                k = self.keys[sel[s : s + self.batch]]
                n = len(k)
                st = self.rng.integers(1, 5, (n, 1))
                v = wire.encode_partials(q.name, f"h{h}", 1, p, self.seq[(h, p)], np.full(n, pane), k, st)
                self.seq[(h, p)] += n
                self.out.append((p, v, n))
            if mark is not None:
                self.out.append(self.punctuation(h, p, mark))

    def punctuation(self, h: int, p: int, mark: int) -> tuple[int, bytes, int]:
        pu = wire.Punctuation(self.q.name, f"h{h}", 1, p, self.seq[(h, p)], mark, 0, 0, {})
        return (p, wire.encode_punctuation(pu), 0)

    def punctuate(self, mark: int) -> list[tuple[int, bytes, int]]:
        """Every host's punctuation up to ``mark`` on every partition."""
        return [
            self.punctuation(h, p, mark) for h in range(self.hosts) for p in range(self.q.kafka.partitions)
        ]


def make_messages(
    q: Q.QuerySpec,
    records: int,
    groups: int,
    hosts: int,
    panes: int,
    batch: int,
    seed: int = 0,
    zipf: float = 0.0,
) -> list[tuple[int, bytes, int]]:
    """(partition, value, records) in per-host order: each pane's partials, then punctuation. Group
    keys uniform, or (``zipf`` > 1) ``records`` packets of Zipf-distributed groups pre-aggregated per
    (pane, host) as an agent does: a hot group is one partial per pane and host."""
    rng = np.random.default_rng(seed)
    p0 = T0 // q.window.pane_ns
    per_pane_host = max(1, records // (panes * hosts))
    em = _Hosts(q, groups, hosts, batch, rng)
    for pane in range(p0, p0 + panes):
        for h in range(hosts):
            mark = pane + 1 if pane + 1 < p0 + panes else wire.END_OF_STREAM
            if zipf:  # a host pre-aggregates: one partial per group it saw in the pane, however hot
                keys = np.unique((rng.zipf(zipf, per_pane_host) - 1) % groups)
            else:
                keys = rng.integers(0, groups, per_pane_host)
            em.send(h, keys, pane, mark)
    return em.out


def offline_rate(q: Q.QuerySpec, msgs: list[tuple[int, bytes, int]], per_batch: int = 64) -> float:
    """Records/s of the pure processor (decode, merge, meld, close; state bytes round trip per batch)."""
    lay = Layout.of(q)
    st = Settings(host_timeout_ms=10**9)
    procs = {p: PartitionProcessor([lay], p, st) for p in range(q.kafka.partitions)}
    t0 = time.perf_counter()
    for p in procs:
        vals = [v for pp, v, _ in msgs if pp == p]
        for s in range(0, len(vals), per_batch):
            procs[p] = PartitionProcessor.from_bytes(procs[p].to_bytes(), [lay], st)
            procs[p].process(vals[s : s + per_batch], 1000 + s)
    return sum(n for *_, n in msgs) / (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    ap.add_argument("--records", type=int, default=4_000_000)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--panes", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096, help="partial records per Kafka message")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", default=None)
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting for this run (repeatable), e.g. spark.driver.memory=4g",
    )
    ap.add_argument(
        "--batch-records",
        type=int,
        nargs="+",
        default=[250_000, 1_000_000],
        help="micro-batch bounds to measure (records; sent as maxOffsetsPerTrigger)",
    )
    ap.add_argument("--sweep", action="store_true", help="run the open-state sweep -> rollup_scale.json")
    ap.add_argument("--sweep-groups", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    ap.add_argument(
        "--sweep-records",
        type=int,
        default=12_000_000,
        help="measured partials per sweep point (12 micro-batches: a long-open pane's merges amortised)",
    )
    ap.add_argument("--sweep-batch", type=int, default=1_000_000, help="records per micro-batch in the sweep")
    ap.add_argument(
        "--states", nargs="+", default=["blob", "chunked"], help="state layouts the sweep compares"
    )
    a = ap.parse_args(argv)
    broker = None
    if a.bootstrap is None:
        from local_stack.kafka_broker import KafkaBroker

        broker = KafkaBroker("bench-rollup", port=0, state=Path(tempfile.mkdtemp(prefix="lowwater-rollup-")))
        broker.start()
        a.bootstrap = broker.bootstrap_servers
    try:
        return _sweep(a) if a.sweep else _run(a)
    finally:
        if broker is not None:
            broker.stop()


class BatchClock(HighLevelJob):
    """The job, noting when each micro-batch's sink finished and how many records were consumed so far."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[tuple[float, int]] = []
        self.driver_cpu: list[float] = []  # the driver's CPU seconds (this process and its JVM) at each mark
        self.sink.on_batch.append(self.mark)

    def mark(self, batch_id: int) -> None:
        """The sink's watcher: called once each micro-batch is written."""
        done = self.metrics.registry.get_sample_value("lowwater_job_records_consumed_total") or 0.0
        self.marks.append((time.perf_counter(), int(done)))
        self.driver_cpu.append(tree_cpu_seconds(os.getpid()))


def run_config(
    spark: Any,
    q: Q.QuerySpec | list[Q.QuerySpec],
    a: argparse.Namespace,
    work: Path,
    batch_records: int,
    total: int,
) -> dict[str, Any]:
    """Read the whole topic (of each query) from a fresh checkpoint, at most ``batch_records`` per
    micro-batch."""
    max_offsets = max(1, batch_records // a.batch)  # Kafka messages per trigger (a.batch records each)
    opts = _job_options(a, work, batch_records, max_offsets_per_trigger=max_offsets)
    job = BatchClock(spark, q if isinstance(q, list) else [q], opts)
    jvm_pid = int(spark.sparkContext._gateway.proc.pid)  # local mode: the JVM runs the Python workers
    c0 = tree_cpu_seconds(jvm_pid) + time.process_time()
    t0 = time.perf_counter()
    job.start()
    job.process_all_available()
    took = time.perf_counter() - t0
    cpu = tree_cpu_seconds(jvm_pid) + time.process_time() - c0
    phases: dict[str, int] = {}
    for pr in job.streams[0].recentProgress:
        for k, v in (pr.get("durationMs") or {}).items():
            phases[k] = phases.get(k, 0) + int(v)
    job.stop()
    fed = [i for i, m in enumerate(job.marks) if m[1] > 0]
    marks = [job.marks[i] for i in fed]
    if not marks or marks[-1][1] != total:
        raise SystemExit(f"the job consumed {marks[-1][1] if marks else 0:,} of {total:,} records")
    (t_first, r_first), (t_last, r_last) = marks[0], marks[-1]
    # the driver's CPU over the sustained part (after the first batch, which carries the query's start)
    sustained_cpu = job.driver_cpu[fed[-1]] - job.driver_cpu[fed[0]]
    sustained = (r_last - r_first) / (t_last - t_first) if len(marks) > 1 else float("nan")
    return {
        "batch_records": batch_records,
        "max_offsets_per_trigger": max_offsets,
        "batches": len(marks),
        "first_batch_seconds": round(t_first - t0, 2),
        "first_batch_records": r_first,
        "sustained_records_per_s": round(sustained) if len(marks) > 1 else None,  # one batch: no rate
        "sustained_records": r_last - r_first,
        "sustained_seconds": round(t_last - t_first, 3),
        "catchup_seconds": round(took, 2),
        "catchup_records_per_s": round(total / took),
        "cpu_seconds": round(cpu, 2),
        "sustained_driver_cpu_seconds": round(sustained_cpu, 3),
        "duration_ms": phases,
    }


def new_topic_query(bootstrap: str, partitions: int, prefix: str) -> Q.QuerySpec:
    """The benchmark's query on a fresh topic of its own (created here with ``partitions`` partitions)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    q = Q.load_text(QUERY).queries[0]
    return q.model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=partitions)})


def _run(a: argparse.Namespace) -> int:
    from kafka import KafkaProducer

    from local_stack.spark_session import build_spark

    q = new_topic_query(a.bootstrap, a.partitions, "bench")
    topic = q.kafka.topic
    msgs = make_messages(q, a.records, a.groups, a.hosts, a.panes, a.batch)
    total = sum(n for *_, n in msgs)
    off = offline_rate(q, msgs)
    print(f"offline processor: {off:,.0f} partial records/s over {total:,} records", flush=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="lowwater-bench-"))
    prod = KafkaProducer(
        bootstrap_servers=a.bootstrap, acks="all", linger_ms=5, max_request_size=16 << 20, batch_size=1 << 20
    )
    warm = len(msgs) // a.panes  # the first pane warms the JVM and the Python workers (own checkpoint)
    for p, v, _ in msgs[:warm]:
        prod.send(topic, value=v, partition=p)
    prod.flush()
    spark = build_spark(
        "lowwater-bench", master=a.master, extra_conf=dict(kv.split("=", 1) for kv in a.spark_conf)
    )
    wopts = _job_options(a, work, "warm")
    job = HighLevelJob(spark, [q], wopts)
    job.start()
    job.process_all_available()
    job.stop()
    for p, v, _ in msgs[warm:]:
        prod.send(topic, value=v, partition=p)
    prod.flush()
    prod.close()
    configs = []
    for batch_records in a.batch_records:
        r = run_config(spark, q, a, work, batch_records, total)
        configs.append(r)
        print(
            f"batches of <= {batch_records:,} records: {r['batches']} batches; first (with query start) "
            f"{r['first_batch_seconds']:.2f} s; then {r['sustained_records_per_s']:,} records/s sustained; "
            f"whole catch-up {r['catchup_records_per_s']:,} records/s",
            flush=True,
        )
    head = configs[-1]
    res = {
        "records_total": total,
        "messages": len(msgs),
        "groups": a.groups,
        "hosts": a.hosts,
        "panes": a.panes,
        "partitions": a.partitions,
        "master": a.master,
        "spark_conf": a.spark_conf,
        "definition": "spark_records_per_s = sustained rate of the running job: partial records consumed after "
        "its first micro-batch divided by the wall time from the end of the first batch's sink to "
        "the end of the last (micro-batches of at most batch_records, read back to back from a "
        "full topic). The first batch, which carries the query start, is reported separately, "
        "and catchup_records_per_s counts it in.",
        "spark_records_per_s": head["sustained_records_per_s"],
        "batch_records": head["batch_records"],
        "catchup_records_per_s": head["catchup_records_per_s"],
        "offline_records_per_s": round(off),
        "configs": configs,
    }
    res["ratio_spark_vs_offline"] = round(res["spark_records_per_s"] / res["offline_records_per_s"], 3)
    res["machine"] = machine()
    print(json.dumps({k: v for k, v in res.items() if k != "configs"}, indent=1))
    harness.write_results("rollup.json", {"benchmark": "rollup", **res})
    print(f"wrote {harness.RESULTS / 'rollup.json'}")
    spark.stop()
    return 0


def sweep_messages(
    q: Q.QuerySpec, groups: int, records: int, hosts: int, batch: int, seed: int = 0
) -> tuple[list[tuple[int, bytes, int]], list[tuple[int, bytes, int]]]:
    """(fill and measured partials, end-of-stream punctuation): pane p0 gets every one of ``groups``
    groups once (spread over the hosts), each host marks p0 (so it stays open), then ``records`` more
    partials of random groups of p0."""
    rng = np.random.default_rng(seed)
    p0 = T0 // q.window.pane_ns
    em = _Hosts(q, groups, hosts, batch, rng)
    for h, g in enumerate(np.array_split(rng.permutation(groups), hosts)):
        em.send(h, g, p0)
    em.out += em.punctuate(p0)
    for h in range(hosts):
        em.send(h, rng.integers(0, groups, records // hosts), p0)
    return em.out, em.punctuate(wire.END_OF_STREAM)


def _sweep_run(
    spark: Any, q: Q.QuerySpec, a: argparse.Namespace, work: Path, tag: str, state: str, fill: int, total: int
) -> dict[str, Any]:
    """One state layout on one sweep topic: the rate of the batches after the fill."""
    opts = _job_options(
        a,
        work,
        tag,
        max_offsets_per_trigger=max(1, a.sweep_batch // a.batch),
        state=state,
        create_topics=False,
    )
    job = BatchClock(spark, [q], opts)
    jvm_pid = int(spark.sparkContext._gateway.proc.pid)
    c0 = tree_cpu_seconds(jvm_pid) + time.process_time()
    job.start()
    job.process_all_available()
    cpu = tree_cpu_seconds(jvm_pid) + time.process_time() - c0
    state_ops = (job.streams[0].lastProgress or {}).get("stateOperators") or []
    job.stop()
    marks = job.marks
    if not marks or marks[-1][1] != total:
        raise SystemExit(f"{tag}: the job consumed {marks[-1][1] if marks else 0:,} of {total:,} records")
    i0 = next(i for i, m in enumerate(marks) if m[1] >= fill)  # the batch that completes the fill
    (t0, r0), (t1, r1) = marks[i0], marks[-1]
    return {
        "state": state,
        "batches": len(marks),
        "measured_batches": len(marks) - 1 - i0,
        "measured_records": r1 - r0,
        "measured_seconds": round(t1 - t0, 3),
        "records_per_s": round((r1 - r0) / (t1 - t0)),
        "cpu_seconds_whole_run": round(cpu, 2),
        "state_memory_bytes": sum(int(o.get("memoryUsedBytes", 0)) for o in state_ops),
        "state_rows": sum(int(o.get("numRowsTotal", 0)) for o in state_ops),
    }


def _sweep_check(
    spark: Any,
    q: Q.QuerySpec,
    a: argparse.Namespace,
    work: Path,
    tag: str,
    state: str,
    groups: int,
    total: int,
) -> None:
    """Restart the run after the end-of-stream punctuation: the pane closes with every group and record."""
    import duckdb

    opts = _job_options(a, work, tag, state=state, create_topics=False)
    job = HighLevelJob(spark, [q], opts)
    job.start()
    job.process_all_available()
    job.stop()
    n, s = duckdb.sql(
        f"select count(*), sum(packets) from read_parquet('{work}/results-{tag}/query={q.name}/**/*.parquet', "
        "hive_partitioning=true) where kind = 'final'"
    ).fetchall()[0]
    if n != groups:
        raise SystemExit(f"{tag}: {n:,} final rows, expected {groups:,}")
    print(f"  {tag}: closed {n:,} groups, {s:,} packets", flush=True)


def _sweep(a: argparse.Namespace) -> int:
    from kafka import KafkaProducer

    from local_stack.spark_session import build_spark

    spark = build_spark(
        "lowwater-bench-scale", master=a.master, extra_conf=dict(kv.split("=", 1) for kv in a.spark_conf)
    )
    work = Path(a.workdir or tempfile.mkdtemp(prefix="lowwater-scale-"))
    prod = KafkaProducer(
        bootstrap_servers=a.bootstrap, acks="all", linger_ms=5, max_request_size=16 << 20, batch_size=1 << 20
    )
    points = []
    for groups in a.sweep_groups:
        q = new_topic_query(a.bootstrap, a.partitions, "scale")
        topic = q.kafka.topic
        msgs, eos = sweep_messages(q, groups, a.sweep_records, a.hosts, a.batch)
        for p, v, _ in msgs:
            prod.send(topic, value=v, partition=p)
        prod.flush()
        total = sum(n for *_, n in msgs)
        point: dict[str, Any] = {"open_groups": groups, "records_total": total, "fill_records": groups}
        for state in a.states:
            for attempt in range(3):  # under heavy load a Python worker may not connect back in time at start
                try:
                    r = _sweep_run(spark, q, a, work, f"{groups}-{state}", state, groups, total)
                    break
                except Exception as exc:  # noqa: BLE001 - StreamingQueryException; retried from scratch
                    print(f"  {groups}-{state}: attempt {attempt + 1} failed: {str(exc)[:200]}", flush=True)
                    import shutil

                    shutil.rmtree(work / f"ckpt-{groups}-{state}", ignore_errors=True)
                    shutil.rmtree(work / f"results-{groups}-{state}", ignore_errors=True)
            else:
                raise SystemExit(f"{groups}-{state}: failed three times")
            point[state] = r
            print(
                f"{groups:>9,} open groups, {state:>7}: {r['records_per_s']:>10,} partials/s over "
                f"{r['measured_batches']} batches ({r['measured_records']:,} records, {r['measured_seconds']} s)",
                flush=True,
            )
        for p, v, _ in eos:
            prod.send(topic, value=v, partition=p)
        prod.flush()
        for state in a.states:
            try:
                _sweep_check(spark, q, a, work, f"{groups}-{state}", state, groups, total)
                point[state]["checked"] = True
            except Exception as exc:  # noqa: BLE001 - the restart failed (see the retry above): say so
                print(f"  {groups}-{state}: check not run: {str(exc)[:200]}", flush=True)
                point[state]["checked"] = False
        points.append(point)
        _sweep_write(a, points, complete=False)  # a run cut short still leaves what it measured
    prod.close()
    spark.stop()
    _sweep_write(a, points, complete=True)
    _sweep_plot(json.loads((harness.RESULTS / "rollup_scale.json").read_text()))
    print(f"wrote {harness.RESULTS / 'rollup_scale.json'}")
    return 0


def _sweep_write(a: argparse.Namespace, points: list[dict[str, Any]], complete: bool) -> None:
    lo, hi = points[0], points[-1]
    res: dict[str, Any] = {
        "benchmark": "rollup_scale",
        "sweep_records": a.sweep_records,
        "sweep_batch_records": a.sweep_batch,
        "hosts": a.hosts,
        "partitions": a.partitions,
        "master": a.master,
        "spark_conf": a.spark_conf,
        "definition": "records_per_s = partial records of the micro-batches after the fill divided by the wall time "
        "from the end of the batch that completed the fill to the end of the last; the open pane holds "
        "open_groups groups all along (nothing closes while measured). rate_ratio_<hi>_vs_<lo> = "
        "chunked rate at the largest open state / chunked rate at the smallest; the same ratio of the "
        "blob state alongside.",
        "points": points,
        "complete": complete,
        "load_avg_at_write": [round(x, 2) for x in os.getloadavg()],
    }
    if len(points) > 1:
        for st in a.states:
            res[f"{st}_rate_ratio"] = round(hi[st]["records_per_s"] / lo[st]["records_per_s"], 3)
        res["ratio_points"] = [lo["open_groups"], hi["open_groups"]]
        if "chunked" in a.states and (lo["open_groups"], hi["open_groups"]) == (100_000, 5_000_000):
            res["rate_ratio_5m_vs_100k"] = res["chunked_rate_ratio"]
    if {"blob", "chunked"} <= set(a.states):
        res["chunked_vs_blob_at_largest"] = round(
            hi["chunked"]["records_per_s"] / hi["blob"]["records_per_s"], 3
        )
    res["machine"] = machine()
    print(json.dumps({k: v for k, v in res.items() if k != "points"}, indent=1), flush=True)
    harness.write_results("rollup_scale.json", res)


def _sweep_plot(res: dict[str, Any]) -> None:
    plt = harness.pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [p["open_groups"] for p in res["points"]]
    for st in ("blob", "chunked"):
        if all(st in p for p in res["points"]):
            ax.plot(xs, [p[st]["records_per_s"] / 1e6 for p in res["points"]], "o-", label=f"{st} state")
    ax.set_xscale("log")
    ax.set_xlabel("open groups (one open pane)")
    ax.set_ylabel("M partial records/s (Spark job)")
    ax.set_ylim(bottom=0)
    ax.set_title("High-level rate against open state")
    ax.legend()
    harness.save_figure(fig, harness.RESULTS / "rollup_scale.png")


if __name__ == "__main__":
    raise SystemExit(main())
