"""Scaling of the roll-up on a Spark standalone cluster: (workers, partitions) pairs, driver CPU, planning.

``.venv/bin/python -m benchmarks.bench_scaling [--records 30000000] [--groups 100000]
[--pairs 1x1,2x1,2x2,2x4] [--repeat 2] [--queries 1,7,20] [--zipf 1.2] [--pin] [--quick]`` starts a Kafka broker and, per
worker count W, a standalone cluster (master + W workers of one core each, ``local_stack/spark_cluster.py``,
the processes ``tests/test_cluster.py`` runs), and drives the real job against it (``--master spark://...``)
in a process of its own, one executor of one core per worker. The same partial records
(``bench_rollup.make_messages``: the Q4 shape from 3 emulated hosts) are written to one topic per P,
placed by ``hash mod P`` as agents place them; each (W, P) reads its topic from a fresh checkpoint with
``spark.sql.shuffle.partitions`` = P and micro-batches of at most ``--batch-records`` (default: the job's
batch for ``--expected-rate``, ``high_level.options.RATE_BATCH_RECORDS``), after a warm-up run
on a topic of its own. The rate is ``bench_rollup.run_config``'s sustained rate. Executor CPU seconds are
read from /proc (the workers' process trees), the driver's from its own (Python and JVM).

Figures (``benchmarks/results/scaling.json``): records per executor CPU-second per (W, P) and
``per_cpu_efficiency_p2`` = (2, 2) / (1, 1); ``driver_cpu_s_per_million_records`` and the driver's
ceiling (records / driver CPU-s) over the scaling runs (the executors write the store, the driver only
commits); ``p2_vs_p1`` (P = 2 vs P = 1 on 2 workers) against ``p2_vs_p1_ceiling_on_this_machine`` (at
P = 1's CPU per record, ``cores / machine_cores_busy(P = 1)``); Spark's per-trigger phases and the
driver's CPU per micro-batch for 1, 7 and 20 queries (``planning_per_batch_vs_queries``, each query on a
topic of its own, ~10 batches); and the same packets with Zipf(s) groups pre-aggregated per (pane, host)
as agents do (``zipf``: a hot group is one partial per pane and host) against the uniform run at (1, 1).
Each (W, P) runs ``--repeat`` times, the pairs alternated (medians; each run in ``*_runs``). Beside the
broker and the 2-worker cluster, a reference CPU-bound workload run alone and two at once
(:mod:`benchmarks.cpuref`, ``machine_per_cpu_efficiency``) measures the most ``per_cpu_efficiency_p2`` can
reach on this machine; ``--pin`` pins worker i (and so its executor and Python workers) to CPU i.
``--spark-conf K=V`` sets a session setting; ``--plan-variant K=V,...`` A/Bs settings on the 1-query
planning run (``plan_variants``: the driver's CPU per batch).
``--quick``: a smoke run (small topics, 1x1 and 2x2, 1 and 7 queries) that writes ``scaling-quick.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from benchmarks import harness
from benchmarks.bench_rollup import QUERY, make_messages, run_config
from benchmarks.cpuref import per_cpu_efficiency
from benchmarks.harness import machine
from benchmarks.proccpu import machine_busy_seconds, thread_cpu_seconds, tree_cpu_seconds
from contract import query as Q
from high_level.options import RATE_BATCH_RECORDS

REPO = Path(__file__).resolve().parents[1]


def query_for(topic: str, partitions: int) -> Q.QuerySpec:
    q = Q.load_text(QUERY).queries[0]
    return q.model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=partitions)})


def topics_of(a: argparse.Namespace, tag: str) -> dict[str, dict]:
    """Every run's topics: name -> {partitions, records (packets), zipf}; and the runs reading them."""
    out: dict[str, dict] = {}
    for p in sorted({p for _w, p in a.pairs}):
        out[f"scaling-{tag}-p{p}"] = {"partitions": p, "records": a.records, "zipf": 0.0}
    if a.zipf:
        out[f"scaling-{tag}-zipf"] = {"partitions": 1, "records": a.records, "zipf": a.zipf}
    for n in a.queries:
        for i in range(n):
            out[f"scaling-{tag}-q{n}-{i}"] = {"partitions": 1, "records": a.plan_records // n, "zipf": 0.0}
    out[f"scaling-{tag}-warm"] = {"partitions": 2, "records": a.records // 10, "zipf": 0.0}
    return out


def produce(bootstrap: str, a: argparse.Namespace, topics: dict[str, dict], t_all: float) -> dict[str, int]:
    """Each topic's records (placed by hash mod P as agents place them); partial records per topic."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(t, d["partitions"], 1) for t, d in topics.items()])
    admin.close()
    prod = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=16 << 20, batch_size=1 << 20
    )
    totals = {}
    for t, d in topics.items():
        q = query_for(t, d["partitions"])
        msgs = make_messages(q, d["records"], a.groups, a.hosts, a.panes, a.batch, zipf=d["zipf"])
        for part, v, _ in msgs:
            prod.send(t, value=v, partition=part)
        totals[t] = sum(k for *_, k in msgs)
        totals[f"{t}:messages"] = len(msgs)  # records per message: the micro-batch bound is in messages
        print(f"[{time.monotonic() - t_all:6.1f} s] produced {t}: {totals[t]:,} partial records", flush=True)
    prod.flush()
    prod.close()
    return totals


def driver(a: argparse.Namespace) -> int:
    """One SparkContext on the cluster (W executors of 1 core); each of its runs in turn; JSON lines on stdout."""
    from high_level.cluster.session import build_spark
    from local_stack.jars import spark_kafka_jars

    spec = json.loads(a.driver)
    w = spec["workers"]
    conf = {
        "spark.executor.memory": a.executor_memory,
        "spark.executor.cores": "1",
        "spark.cores.max": str(w),
        "spark.driver.memory": "1g",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        **dict(a.spark_conf),  # an experiment's settings (recorded in the JSON: spark_conf)
    }
    work = Path(spec["work"])
    t_start = time.monotonic()

    def step(what: str) -> None:
        print(f"STEP {time.monotonic() - t_start:6.1f} s {what}", flush=True)

    spark = build_spark(
        f"lowwater-scaling-w{w}",
        spec["master"],
        conf,
        jars=spark_kafka_jars(),
        state=work / "state",
        driver_host="127.0.0.1",
    )
    step(f"driver's session up, {sc_executors(spark)} executor(s) registered")
    jvm_pid = int(spark.sparkContext._gateway.proc.pid)
    totals = spec["totals"]

    def per_message(topics: list[str]) -> int:
        """Partial records per Kafka message of these topics (fewer than --batch when groups split over
        partitions and panes): run_config turns a batch's records into maxOffsetsPerTrigger with it."""
        return max(1, sum(totals[t] for t in topics) // max(1, sum(totals[f"{t}:messages"] for t in topics)))

    ns = argparse.Namespace(bootstrap=spec["bootstrap"], batch=per_message([spec["warm"]]), partitions=2)
    warm = query_for(spec["warm"], 2)
    wt = totals[spec["warm"]]  # a tenth of a topic: in about 3 micro-batches, whatever the bound
    run_config(spark, warm, ns, work / "warm", min(a.batch_records, wt // 3), wt)
    step(f"warm-up done ({wt:,} records)")
    for i, run in enumerate(spec["runs"]):
        step(
            f"run {i + 1}/{len(spec['runs'])}: {run['kind']}, P={run['partitions']}, {len(run['topics'])} queries"
        )
        p = ns.partitions = run["partitions"]
        ns.batch = per_message(run["topics"])
        qs = [query_for(t, p) for t in run["topics"]]
        total = sum(totals[t] for t in run["topics"])
        # at least 3 micro-batches (the first carries the query's start; the rate and the driver's CPU
        # are read over the rest), whatever --batch-records says
        batch_records = min(run.get("batch_records", a.batch_records), total // 3)
        c0 = sum(tree_cpu_seconds(pid) for pid in spec["worker_pids"])
        execs = executor_pids(spec["worker_pids"])
        ex_threads0 = _sum_threads(execs)
        ex_own0 = sum(_own_cpu_seconds(x) for x in execs)
        threads0, py0 = thread_cpu_seconds(jvm_pid), time.process_time()
        prof = cProfile.Profile() if a.profile else None
        d0, m0, t0 = tree_cpu_seconds(os.getpid()), machine_busy_seconds(), time.perf_counter()
        if prof is not None:
            prof.enable()
        variant = run.get("conf", {})  # an A/B of session settings (--plan-variant): this run's stream only
        before = {k: spark.conf.get(k, None) for k in variant}
        for k, v in variant.items():
            spark.conf.set(k, v)
        try:
            r = run_config(spark, qs, ns, work / f"run{i}", batch_records, total)
        finally:
            for k, v in before.items():
                spark.conf.unset(k) if v is None else spark.conf.set(k, v)
        if prof is not None:
            prof.disable()
        took = time.perf_counter() - t0
        r["executor_cpu_seconds"] = round(sum(tree_cpu_seconds(pid) for pid in spec["worker_pids"]) - c0, 2)
        # where the executors' CPU went: their JVMs' busiest threads (JIT compilers, Kafka, the tasks), and
        # everything else of the workers' trees (the Python workers, their numba kernels and state work)
        ex_spent = {n: v - ex_threads0.get(n, 0.0) for n, v in _sum_threads(execs).items()}
        r["executor_jvm_threads_cpu_seconds"] = {
            n: round(v, 2) for n, v in sorted(ex_spent.items(), key=lambda x: -x[1])[:8] if v >= 0.01
        }
        jvm = sum(_own_cpu_seconds(x) for x in execs) - ex_own0
        r["executor_jvm_cpu_seconds"] = round(jvm, 2)
        r["executor_python_cpu_seconds"] = round(r["executor_cpu_seconds"] - jvm, 2)
        # the driver (this process and its JVM) and every process of the machine (broker, master, workers, ...)
        r["driver_cpu_seconds"] = round(tree_cpu_seconds(os.getpid()) - d0, 2)
        # where the driver's CPU went: its Python (this process, all threads) and the JVM's busiest threads
        r["driver_python_cpu_seconds"] = round(time.process_time() - py0, 2)
        threads = thread_cpu_seconds(jvm_pid)
        spent = {n: threads[n] - threads0.get(n, 0.0) for n in threads}
        r["driver_jvm_threads_cpu_seconds"] = {
            n: round(v, 2) for n, v in sorted(spent.items(), key=lambda x: -x[1])[:8] if v >= 0.01
        }
        if prof is not None:
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
            path = Path(a.profile) / f"driver-w{w}-run{i}-{run['kind']}-q{len(qs)}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(out.getvalue())
        r["machine_cores_busy"] = round((machine_busy_seconds() - m0) / took, 2)
        # cores the executors kept busy over the whole catch-up (their CPU / wall): < W means they waited
        r["executor_cores_busy"] = round(r["executor_cpu_seconds"] / r["catchup_seconds"], 2)
        r.update(
            workers=w,
            partitions=p,
            executors=sc_executors(spark),
            kind=run["kind"],
            queries=len(qs),
            packets=run["packets"],
            rep=run.get("rep", 0),
            **({"variant": run["variant"], "conf": variant} if "variant" in run else {}),
        )
        print("ROW " + json.dumps(r), flush=True)
    spark.stop()
    return 0


def _drive(spec: dict, log: Path, t_all: float, timeout_s: float = 3600) -> Iterator[dict]:
    """Run :func:`driver` in a process of its own, its progress shown as it comes; its rows."""
    import threading

    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_scaling", "--driver", json.dumps(spec), *sys.argv[1:]],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=REPO,
        )
        timer = threading.Timer(timeout_s, proc.kill)  # bounded: a hung driver fails the run
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("ROW "):
                    yield json.loads(line[4:])
                elif line.startswith("STEP "):
                    print(f"[{time.monotonic() - t_all:6.1f} s]   driver {line[5:].rstrip()}", flush=True)
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"driver failed ({proc.returncode}), its log {log}:\n{log.read_text()[-4000:]}")


def executor_pids(worker_pids: list[int]) -> list[int]:
    """The executor JVMs the workers started (their child processes running CoarseGrainedExecutorBackend)."""
    out = []
    for w in worker_pids:
        try:
            kids = [
                int(c)
                for t in os.listdir(f"/proc/{w}/task")
                for c in Path(f"/proc/{w}/task/{t}/children").read_text().split()
            ]
        except OSError:
            continue
        for k in kids:
            try:
                if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{k}/cmdline").read_bytes():
                    out.append(k)
            except OSError:
                continue
    return out


def _own_cpu_seconds(pid: int) -> float:
    """A process's own CPU seconds (all its threads, not its children)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return 0.0


def _sum_threads(pids: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid in pids:
        for n, v in thread_cpu_seconds(pid).items():
            out[n] = out.get(n, 0.0) + v
    return out


def pin_tree(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid`` and of its descendants to ``cpu`` (what ``taskset -a -p`` does, for a
    tree): processes it starts later inherit the CPU of the thread that starts them."""
    todo = [pid]
    while todo:
        x = todo.pop()
        try:
            for t in os.listdir(f"/proc/{x}/task"):
                os.sched_setaffinity(int(t), {cpu})
                todo.extend(int(c) for c in Path(f"/proc/{x}/task/{t}/children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue


def sc_executors(spark) -> int:
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1  # minus the driver


def chart(rows: list[dict], path: Path) -> None:
    plt = harness.pyplot()
    rows = [r for r in rows if r.get("kind", "scale") == "scale"]

    fig, ax = plt.subplots(figsize=(6, 4))
    for w in sorted({r["workers"] for r in rows}):
        rs = sorted((r for r in rows if r["workers"] == w), key=lambda r: r["partitions"])
        ax.plot(
            [r["partitions"] for r in rs],
            [r["sustained_records_per_s"] / 1e6 for r in rs],
            marker="o",
            label=f"{w} worker{'s' if w > 1 else ''} (1 core each)",
        )
    ax.set_xlabel("Kafka partitions P (= shuffle partitions)")
    ax.set_xticks(sorted({r["partitions"] for r in rows}))
    ax.set_ylabel("sustained roll-up rate (M partial records/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("roll-up on a Spark standalone cluster (2-core VM)")
    ax.legend(fontsize=8)
    harness.save_figure(fig, path)


def _steady(r: dict) -> float | None:
    """A run's driver CPU per million records after its first batch (None: one batch only)."""
    if "sustained_driver_cpu_seconds" not in r:  # rows of a run before this figure: the whole run
        return round(r["driver_cpu_seconds"] / ((r["first_batch_records"] + r["sustained_records"]) / 1e6), 4)
    if not r["sustained_records"]:
        return None
    return round(r["sustained_driver_cpu_seconds"] / (r["sustained_records"] / 1e6), 4)


def driver_model(rows: list[dict], all_rows: list[dict]) -> dict:
    """The driver's CPU as a fixed cost per micro-batch plus a cost per record, d = F / B + v: F from the
    1-query planning run (small batches, so nearly all of it is fixed), v from the scaling runs. It says
    which batch size B meets a goal for d, i.e. the trigger an operator sets for a rate (B = rate x trigger)."""
    plan1 = [r for r in all_rows if r["kind"] == "plan" and r["queries"] == 1 and r["batches"] > 1]
    steady = [r for r in rows if "sustained_driver_cpu_seconds" in r and r["batches"] > 1]
    if not plan1 or not steady:
        return {}
    p = plan1[0]
    fixed = p["sustained_driver_cpu_seconds"] / (p["batches"] - 1)
    batches = sum(r["batches"] - 1 for r in steady)
    recs = sum(r["sustained_records"] for r in steady)
    per_m = max(
        0.0, (sum(r["sustained_driver_cpu_seconds"] for r in steady) - fixed * batches) / (recs / 1e6)
    )
    out = {
        "driver_fixed_cpu_s_per_batch": round(fixed, 3),
        "driver_cpu_s_per_million_records_beyond_fixed": round(per_m, 4),
        "records_per_batch_in_scaling_runs": round(recs / batches),
    }
    if per_m < 0.05:  # B at which F / B + v = 0.05 CPU-s per million
        out["batch_records_for_driver_goal"] = round(fixed / (0.05 - per_m) * 1e6)
    return out


def executor_model(all_rows: list[dict]) -> dict:
    """The executors' CPU as a fixed cost per task and micro-batch plus a cost per record, E = T f + R c
    (T: tasks, one per partition and batch; R: records), solved from the 1-query planning run (small batches)
    and the (1, 1) scaling runs (large ones). Why: a second partition doubles the fixed part, so at a given
    batch size (2, 2) costs more executor CPU per record than (1, 1) whatever the machine; the model says
    how much of per_cpu_efficiency_p2 that explains, and what a batch size would give."""
    plan = [r for r in all_rows if r["kind"] == "plan" and r["queries"] == 1 and "variant" not in r]
    big = [r for r in all_rows if r["kind"] == "scale" and (r["workers"], r["partitions"]) == (1, 1)]
    if not plan or not big:
        return {}

    def sums(rs: list[dict]) -> tuple[float, float, float]:
        recs = sum(r["first_batch_records"] + r["sustained_records"] for r in rs) / 1e6
        return (
            sum(r["batches"] * r["partitions"] for r in rs),
            recs,
            sum(r["executor_cpu_seconds"] for r in rs),
        )

    (t1, r1, e1), (t2, r2, e2) = sums(plan), sums(big)
    det = t1 * r2 - t2 * r1
    if det == 0:
        return {}
    f, c = (e1 * r2 - e2 * r1) / det, (t1 * e2 - t2 * e1) / det
    if f <= 0 or c <= 0:
        return {}
    out = {
        "executor_fixed_cpu_s_per_task_batch": round(f, 3),
        "executor_cpu_s_per_million_records": round(c, 3),
    }
    b = statistics.median(r["batch_records"] for r in big) / 1e6  # M records per batch of the scaling runs

    def eff(batch_m: float) -> float:  # (2, 2) over (1, 1): twice the tasks per batch, the same records
        return round((f + batch_m * c) / (2 * f + batch_m * c), 3)

    out["per_cpu_efficiency_p2_from_fixed_costs"] = eff(b)
    out["per_cpu_efficiency_p2_from_fixed_costs_at_batch"] = {
        f"{m:g}M": eff(m) for m in sorted({b, RATE_BATCH_RECORDS / 1e6, 2 * RATE_BATCH_RECORDS / 1e6})
    }
    return out


def goal_gaps(res: dict) -> dict:
    """Each goal missed: measured, goal, the factor between them and why, from this run's own figures."""
    out: dict = {}
    d, ceil, eff = (
        res.get("driver_cpu_s_per_million_records"),
        res.get("driver_ceiling_records_per_driver_cpu_s"),
        res.get("per_cpu_efficiency_p2"),
    )
    fixed, per_m = (
        res.get("driver_fixed_cpu_s_per_batch"),
        res.get("driver_cpu_s_per_million_records_beyond_fixed"),
    )
    b = res.get("records_per_batch_in_scaling_runs")
    why_d = (
        f"a fixed {fixed} CPU-s per micro-batch over batches of {b:,} records ({fixed / (b / 1e6):.3f} CPU-s per "
        f"million) plus {per_m} per million beyond it"
        if fixed is not None and per_m is not None and b
        else "see driver_fixed_cpu_s_per_batch"
    )
    if d is not None and d > 0.05:
        out["driver_cpu_s_per_million_records"] = {
            "measured": d,
            "goal": 0.05,
            "factor": round(d / 0.05, 1),
            "why": why_d,
        }
    if ceil is not None and ceil < 20e6:
        out["driver_ceiling_records_per_driver_cpu_s"] = {
            "measured": ceil,
            "goal": 20_000_000,
            "factor": round(20e6 / ceil, 1),
            "why": why_d,
        }
    if eff is not None and eff < 0.9:
        busy = res.get("executor_cores_busy", {})
        gap = {
            "measured": eff,
            "goal": 0.9,
            "factor": round(0.9 / eff, 2),
            "runs": res.get("per_cpu_efficiency_p2_runs"),
            "why": f"executors kept {busy} cores busy at load {res.get('load_avg')}: on 2 shared cores a second "
            "executor's CPU per record grows with the contention (caches, the other processes)",
        }
        if "per_cpu_efficiency_p2_from_fixed_costs" in res:
            gap["why"] += (
                f"; the executors' fixed cost of {res['executor_fixed_cpu_s_per_task_batch']} CPU-s per task and "
                f"batch (executor_model: (2, 2) runs twice the tasks of (1, 1) for the same records) alone "
                f"gives {res['per_cpu_efficiency_p2_from_fixed_costs']} at these batches; larger batches "
                f"amortise it: {res['per_cpu_efficiency_p2_from_fixed_costs_at_batch']}"
            )
        ref = res.get("machine_per_cpu_efficiency") or {}
        if "memory" in ref and "compute" in ref:
            m, c = ref["memory"]["per_cpu_efficiency_2_vs_1"], ref["compute"]["per_cpu_efficiency_2_vs_1"]
            gap["machine_ceiling"] = {"memory": m, "compute": c}
            gap["of_machine_ceiling"] = round(eff / m, 3)
            gap["why"] += (
                f"; the machine itself: a reference workload (benchmarks/cpuref.py) run two at once beside the "
                f"same broker and cluster did {m} (memory-bound) and {c} (compute-bound) of its lone work per "
                f"CPU-second, so the system reached {round(eff / m, 3)} of the memory-bound ceiling"
            )
        out["per_cpu_efficiency_p2"] = gap
    return out


def _per_batch(r: dict, key: str) -> float:
    return round(r["duration_ms"].get(key, 0) / max(r["batches"], 1), 1)


def summarize(all_rows: list[dict], head: dict) -> dict:
    """The figures of one run: rates per (W, P), the ratios, what the executors' and the driver's CPU
    say about the limit, planning per batch against the number of queries, uniform vs Zipf keys."""
    for r in all_rows:  # load-independent: records per second of executor CPU
        r.setdefault("kind", "scale")
        r["records_per_executor_cpu_s"] = round(
            (r["first_batch_records"] + r["sustained_records"]) / max(r["executor_cpu_seconds"], 1e-9)
        )
        recs = r["first_batch_records"] + r["sustained_records"]
        r["driver_cpu_s_per_million_records_with_start"] = round(r["driver_cpu_seconds"] / (recs / 1e6), 4)
        r["driver_cpu_s_per_million_records"] = _steady(r)
    rows = [r for r in all_rows if r["kind"] == "scale"]
    rate_runs: dict[tuple[int, int], list[float]] = {}
    per_cpu_runs: dict[tuple[int, int], list[float]] = {}
    for r in rows:  # each pair's repeats (--repeat): the medians below, the spread in *_runs
        rate_runs.setdefault((r["workers"], r["partitions"]), []).append(r["sustained_records_per_s"])
        per_cpu_runs.setdefault((r["workers"], r["partitions"]), []).append(r["records_per_executor_cpu_s"])
    rate = {k: round(statistics.median(v)) for k, v in rate_runs.items()}
    per_cpu = {k: round(statistics.median(v)) for k, v in per_cpu_runs.items()}
    wmax = max(w for w, _ in rate)
    load = head["load_avg"]

    def ratio(x: dict, a: tuple[int, int], b: tuple[int, int]) -> float | None:
        return round(x[a] / x[b], 3) if a in x and b in x else None

    # the driver over the scaling runs once each query runs (after its first batch, which carries the
    # query's start: a job starts its queries once, a run here once per row)
    recs_all = sum(r["first_batch_records"] + r["sustained_records"] for r in rows)
    dcpu_all = sum(r["driver_cpu_seconds"] for r in rows)
    if all("sustained_driver_cpu_seconds" in r for r in rows):
        recs = sum(r["sustained_records"] for r in rows)
        dcpu = sum(r["sustained_driver_cpu_seconds"] for r in rows)
    else:  # rows of a run before this figure (--rewrite): the whole runs
        recs, dcpu = recs_all, dcpu_all
    res = {
        "benchmark": "scaling",
        **head,
        "setup": "Spark standalone master + W workers of 1 core (spark-class, loopback), one executor of 1 core "
        "per worker, driver in its own process, one Kafka broker; all on the same 2-core VM; the executors "
        "write the result store, the driver commits a manifest per batch",
        "rows": all_rows,
        "rates": {f"w{w}_p{p}": v for (w, p), v in sorted(rate.items())},
        "p2_vs_p1": ratio(rate, (wmax, 2), (wmax, 1)),
        "p4_vs_p1": ratio(rate, (wmax, 4), (wmax, 1)),
        "w2_vs_w1_at_p2": ratio(rate, (2, 2), (1, 2)),
        "records_per_executor_cpu_s": {f"w{w}_p{p}": v for (w, p), v in sorted(per_cpu.items())},
        "records_per_executor_cpu_s_runs": {f"w{w}_p{p}": v for (w, p), v in sorted(per_cpu_runs.items())},
        "per_cpu_efficiency_p2": ratio(per_cpu, (2, 2), (1, 1)),
        "per_cpu_efficiency_p2_runs": [  # repeat k's (2, 2) over repeat k's (1, 1)
            round(a / b, 3)
            for a, b in zip(per_cpu_runs.get((2, 2), []), per_cpu_runs.get((1, 1), []), strict=False)
        ],
        # over every scaling run: the driver's CPU per million records, and the rate one driver core caps at
        "driver_cpu_s_per_million_records": round(dcpu / (recs / 1e6), 4) if recs else None,
        "driver_ceiling_records_per_driver_cpu_s": round(recs / dcpu) if dcpu > 0 else None,
        "driver_cpu_s_per_million_records_with_start": round(dcpu_all / (recs_all / 1e6), 4),
        "driver_definition": "the driver's CPU (its Python process and its JVM, /proc) from the end of each "
        "run's first micro-batch to the end of its last, over the records of those batches; _with_start "
        "counts the first batch (the streaming query's start) in",
        "goals": {
            "driver_cpu_s_per_million_records": "<= 0.05",
            "driver_ceiling_records_per_driver_cpu_s": ">= 20,000,000",
            "per_cpu_efficiency_p2": ">= 0.9",
        },
    }
    res.update(driver_model(rows, all_rows))
    res.update(executor_model(all_rows))
    variants = [r for r in all_rows if r["kind"] == "plan" and "variant" in r]
    if variants:  # --plan-variant: the driver's CPU per batch of the 1-query planning run per set of settings
        by: dict[int, list[dict]] = {}
        for r in variants:
            by.setdefault(r["variant"], []).append(r)
        res["plan_variants"] = [
            {
                "conf": rs[0]["conf"],
                "driver_cpu_ms_per_batch_runs": [
                    round(1000 * r["sustained_driver_cpu_seconds"] / max(r["batches"] - 1, 1), 1) for r in rs
                ],
                "query_planning_ms_per_batch_runs": [_per_batch(r, "queryPlanning") for r in rs],
            }
            for _, rs in sorted(by.items())
        ]
    plan = sorted(
        (r for r in all_rows if r["kind"] == "plan" and "variant" not in r), key=lambda r: r["queries"]
    )
    if plan:  # Spark's per-trigger phases (durationMs) per micro-batch, and the driver's CPU per batch
        res["planning_per_batch_vs_queries"] = {
            str(r["queries"]): {
                "batches": r["batches"],
                "query_planning_ms": _per_batch(r, "queryPlanning"),
                "add_batch_ms": _per_batch(r, "addBatch"),
                "trigger_execution_ms": _per_batch(r, "triggerExecution"),
                "overhead_ms": round(_per_batch(r, "triggerExecution") - _per_batch(r, "addBatch"), 1),
                # after the first batch (the query's start); Spark's phases above count every batch
                "driver_cpu_ms": round(
                    1000
                    * r.get("sustained_driver_cpu_seconds", r["driver_cpu_seconds"])
                    / max(r["batches"] - 1, 1),
                    1,
                ),
            }
            for r in plan
        }
    zipf = [r for r in all_rows if r["kind"] == "zipf"]
    uni = [r for r in rows if (r["workers"], r["partitions"]) == (zipf[0]["workers"], 1)] if zipf else []
    if zipf and uni:
        z, u = zipf[0], uni[0]
        res["zipf"] = {
            "s": head.get("zipf"),
            "note": "the same packets with Zipf-distributed groups, pre-aggregated per (pane, host) as agents "
            "do: a hot group is one partial per pane and host, so the partials (and the CPU) shrink",
            "packets": z["packets"],
            "uniform_partials": u["first_batch_records"] + u["sustained_records"],
            "zipf_partials": z["first_batch_records"] + z["sustained_records"],
            "uniform_records_per_executor_cpu_s": u["records_per_executor_cpu_s"],
            "zipf_records_per_executor_cpu_s": z["records_per_executor_cpu_s"],
            "uniform_packets_per_executor_cpu_s": round(u["packets"] / max(u["executor_cpu_seconds"], 1e-9)),
            "zipf_packets_per_executor_cpu_s": round(z["packets"] / max(z["executor_cpu_seconds"], 1e-9)),
            "hot_group_partials": head["panes"] * head["hosts"],
        }

    def median_of(key: str) -> dict[str, float | None]:
        """Per (W, P): the median of ``key`` over the pair's repeats (None if a row lacks it)."""
        runs: dict[str, list] = {}
        for r in rows:
            runs.setdefault(f"w{r['workers']}_p{r['partitions']}", []).append(r.get(key))
        return {k: None if None in v else round(statistics.median(v), 2) for k, v in runs.items()}

    busy = median_of("executor_cores_busy")
    res["executor_cores_busy"] = busy
    res["limit"] = (
        f"all on {res['machine']['cores']} cores shared with the driver, the Kafka broker and the machine's other "
        f"load (load average {min(load):.1f}-{max(load):.1f}); the executors kept {min(busy.values()):.2f}-"
        f"{max(busy.values()):.2f} cores busy over a run: a second executor only adds what the other processes "
        "leave of the second core"
    )
    mbusy = median_of("machine_cores_busy")
    if all(v is not None for v in mbusy.values()):
        res["machine_cores_busy"] = mbusy
        # at the CPU per record of P = 1, the most any P can reach on these cores: cores / cores P = 1 kept busy
        p1 = mbusy.get(f"w{wmax}_p1")
        if p1:
            res["p2_vs_p1_ceiling_on_this_machine"] = round(res["machine"]["cores"] / p1, 3)
            res["limit"] += (
                f"; at P = 1 every process together (executors, driver, broker, master, workers) already "
                f"kept {p1:.2f} of the {res['machine']['cores']} cores busy, so at that CPU per record no P "
                f"can gain more than {res['p2_vs_p1_ceiling_on_this_machine']}x here"
            )
    res["goal_gaps"] = goal_gaps(res)
    return res


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--spark-conf wants KEY=VALUE, not {text!r}")
    return key, value


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(w), int(p)) for w, p in (x.split("x") for x in text.split(","))]


def main() -> int:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=3 * RATE_BATCH_RECORDS)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--panes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4096, help="partial records per Kafka message")
    ap.add_argument(
        "--batch-records",
        type=int,
        default=RATE_BATCH_RECORDS,
        help="records per micro-batch at most (default: what the job's --expected-rate sizes a batch to)",
    )
    ap.add_argument(
        "--pairs", type=_pairs, default=_pairs("1x1,2x1,2x2,2x4"), help="WxP runs (workers x partitions)"
    )
    ap.add_argument("--queries", type=lambda s: [int(x) for x in s.split(",")], default=[1, 7, 20])
    ap.add_argument(
        "--plan-records", type=int, default=1_200_000, help="records of each planning run (all queries)"
    )
    ap.add_argument(
        "--zipf", type=float, default=1.2, help="Zipf exponent of the hot-key run at P = 1 (0: none)"
    )
    ap.add_argument("--executor-memory", default="1g")
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: small topics, 1x1 and 2x2, 1 and 7 queries"
    )
    ap.add_argument(
        "--rewrite", action="store_true", help="recompute scaling.json/png from the last run's rows"
    )
    ap.add_argument(
        "--profile",
        default=None,
        help="a folder: the driver's Python profile per run (cProfile of its main thread: the "
        "sink runs on py4j's callback thread, counted in rows[].driver_python_cpu_seconds)",
    )
    ap.add_argument(
        "--spark-conf",
        type=_conf,
        action="append",
        default=[],
        help="KEY=VALUE, a Spark setting of the driver's session (repeatable; an experiment: in the JSON)",
    )
    ap.add_argument(
        "--repeat", type=int, default=2, help="runs of each (workers, partitions) pair (variance; medians)"
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="pin worker i's process tree (its executor and Python workers) to CPU i (taskset; in the JSON)",
    )
    ap.add_argument(
        "--plan-variant",
        type=lambda t: dict(_conf(x) for x in t.split(",")),
        action="append",
        default=[],
        help="K=V[,K=V...]: also run the 1-query planning run with these session settings, alternated with "
        "the defaults --repeat times (plan_variants in the JSON: the driver's CPU per batch)",
    )
    ap.add_argument(
        "--no-reference", action="store_true", help="skip the reference workload (benchmarks/cpuref.py)"
    )
    ap.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:  # smaller defaults; what is given on the command line stays
        quick = {
            "records": 600_000,
            "groups": 20_000,
            "batch_records": 200_000,
            "plan_records": 140_000,
            "pairs": _pairs("1x1,2x2"),
            "queries": [1, 7],
        }
        for k, v in quick.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    if a.driver:
        return driver(a)
    if a.rewrite:
        old = json.loads(
            (harness.RESULTS / ("scaling-quick.json" if a.quick else "scaling.json")).read_text()
        )
        head = {
            k: old[k]
            for k in ("machine", "load_avg", "records_per_topic", "groups", "hosts", "panes", "batch_records")
        }
        head.update(
            {
                k: old[k]
                for k in (
                    "batch_records_note",
                    "headline_batch",
                    "quick",
                    "repeat",
                    "pinned",
                    "spark_conf",
                    "machine_per_cpu_efficiency",
                )
                if k in old
            }
        )
        head["zipf"] = old["zipf"]["s"] if isinstance(old.get("zipf"), dict) else old.get("zipf")
        return write(summarize(old["rows"], head))

    from local_stack.kafka_broker import KafkaBroker
    from local_stack.spark_cluster import SparkCluster

    work = Path(tempfile.mkdtemp(prefix="lowwater-scaling-"))
    t_all = time.monotonic()
    broker = KafkaBroker("bench-scaling", port=0, state=work / "kafka").start()
    print(f"[{time.monotonic() - t_all:6.1f} s] Kafka broker up ({work})", flush=True)
    rows: list[dict] = []
    reference: dict = {}
    load = [os.getloadavg()[0]]
    workers = sorted({w for w, _ in a.pairs})
    try:
        tag = uuid.uuid4().hex[:6]
        topics = topics_of(a, tag)
        totals = produce(broker.bootstrap_servers, a, topics, t_all)
        print(
            f"[{time.monotonic() - t_all:6.1f} s] {a.records:,} records per scaling topic, runs {a.pairs}, "
            f"queries {a.queries}",
            flush=True,
        )
        for w in workers:
            runs = [  # the pairs in turn, then again (--repeat): drift in the machine's load hits each alike
                {
                    "kind": "scale",
                    "topics": [f"scaling-{tag}-p{p}"],
                    "partitions": p,
                    "packets": a.records,
                    "rep": k,
                }
                for k in range(a.repeat)
                for ww, p in a.pairs
                if ww == w
            ]
            if w == workers[0]:  # the hot-key and planning runs on the smallest cluster, at P = 1
                if a.zipf:
                    runs.append(
                        {
                            "kind": "zipf",
                            "topics": [f"scaling-{tag}-zipf"],
                            "partitions": 1,
                            "packets": a.records,
                        }
                    )
                for n in a.queries:  # about ten micro-batches each, whatever the number of queries
                    qt = [f"scaling-{tag}-q{n}-{i}" for i in range(n)]
                    recs = sum(totals[t] for t in qt)
                    runs.append(
                        {
                            "kind": "plan",
                            "topics": qt,
                            "partitions": 1,
                            "packets": recs,
                            "batch_records": max(recs // 10, a.batch),
                        }
                    )
                q1 = [f"scaling-{tag}-q{a.queries[0]}-{i}" for i in range(a.queries[0])]
                for k in range(a.repeat if a.plan_variant else 0):  # each variant and the default, in turn
                    for v, conf in enumerate([{}, *a.plan_variant]):
                        recs = sum(totals[t] for t in q1)
                        runs.append(
                            {
                                "kind": "plan",
                                "topics": q1,
                                "partitions": 1,
                                "packets": recs,
                                "batch_records": max(recs // 10, a.batch),
                                "variant": v,
                                "conf": conf,
                                "rep": k,
                            }
                        )
            with SparkCluster(work / f"spark-w{w}", workers=w, cores=1, memory="1536m") as cluster:
                if (
                    a.pin
                ):  # before the driver: each executor (and its Python workers) inherits its worker's CPU
                    for i, proc in enumerate(cluster.procs[1:]):
                        pin_tree(proc.pid, sorted(os.sched_getaffinity(0))[i % len(os.sched_getaffinity(0))])
                if w == workers[-1] and not a.no_reference:
                    reference = per_cpu_efficiency(
                        pin=a.pin
                    )  # the machine's ceiling, beside broker and cluster
                    print(f"[{time.monotonic() - t_all:6.1f} s] reference workload: {reference}", flush=True)
                spec = {
                    "master": cluster.master,
                    "bootstrap": broker.bootstrap_servers,
                    "workers": w,
                    "runs": runs,
                    "warm": f"scaling-{tag}-warm",
                    "totals": totals,
                    "work": str(work / f"job-w{w}"),
                    "worker_pids": [p.pid for p in cluster.procs[1:]],
                }
                t0 = time.monotonic()
                print(
                    f"[{time.monotonic() - t_all:6.1f} s] {w}-worker cluster up; starting the driver",
                    flush=True,
                )
                for r in _drive(spec, work / f"driver-w{w}.log", t_all):
                    rows.append(r)
                    print(
                        f"[{time.monotonic() - t_all:6.1f} s] W={w} P={r['partitions']} {r['kind']} "
                        f"q={r['queries']}: {r['sustained_records_per_s']:>10,} records/s sustained "
                        f"({r['batches']} batches, executor CPU {r['executor_cpu_seconds']} s, driver CPU "
                        f"{r['driver_cpu_seconds']} s)",
                        flush=True,
                    )
                print(f"  {w} worker(s): {time.monotonic() - t0:.0f} s with the driver's start", flush=True)
                load.append(os.getloadavg()[0])
    finally:
        broker.stop()
    shutil.rmtree(work, ignore_errors=True)  # the topics (GBs at full size); kept on failure: the logs
    print(f"[{time.monotonic() - t_all:6.1f} s] done", flush=True)
    res = summarize(
        rows,
        {
            "machine": machine(),
            "load_avg": load,
            "records_per_topic": a.records,
            "groups": a.groups,
            "hosts": a.hosts,
            "panes": a.panes,
            "batch_records": a.batch_records,
            "batch_records_note": "each scaling run reads its topic in micro-batches of at most batch_records: "
            "what an operator's trigger gives at the rate (B = rate x trigger). The headline (default) is the "
            f"job's batch for --expected-rate, high_level.options.RATE_BATCH_RECORDS = {RATE_BATCH_RECORDS:,}"
            f"{'; this run: ' + format(a.batch_records, ',') if a.batch_records != RATE_BATCH_RECORDS else ''}"
            " (--quick: 200,000, so its driver figures carry the fixed cost of small batches); driver_model "
            "says which B meets the driver's goal (batch_records_for_driver_goal)",
            "headline_batch": a.batch_records == RATE_BATCH_RECORDS,
            "zipf": a.zipf,
            "quick": a.quick,
            "repeat": a.repeat,
            "pinned": a.pin,
            "spark_conf": dict(a.spark_conf),
            "machine_per_cpu_efficiency": reference,
        },
    )
    return write(res)


def write(res: dict) -> int:
    name = "scaling-quick" if res.get("quick") else "scaling"  # a smoke run never replaces the figures
    harness.write_results(f"{name}.json", res, indent=1)
    chart(res["rows"], harness.RESULTS / f"{name}.png")
    print(
        json.dumps(
            {
                k: res.get(k)
                for k in (
                    "rates",
                    "p2_vs_p1",
                    "driver_cpu_s_per_million_records",
                    "driver_ceiling_records_per_driver_cpu_s",
                    "driver_cpu_s_per_million_records_with_start",
                    "driver_fixed_cpu_s_per_batch",
                    "driver_cpu_s_per_million_records_beyond_fixed",
                    "batch_records_for_driver_goal",
                    "goal_gaps",
                    "per_cpu_efficiency_p2",
                    "planning_per_batch_vs_queries",
                    "zipf",
                    "load_avg",
                )
            },
            indent=1,
        )
    )
    print(f"wrote {harness.RESULTS / name}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
