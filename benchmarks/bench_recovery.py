"""Central-tier recovery, measured: the driver or a Kafka broker SIGKILLed mid-stream on the real clusters.

``.venv/bin/python -m benchmarks.bench_recovery [--quick] [--rounds 3]`` starts a Spark standalone cluster
(master + 2 workers of 1 core) and a 3-broker KRaft Kafka cluster (replication 3, ``min.insync.replicas``
2), the processes ``tests/test_cluster.py`` runs (``lowwater_testing/cluster.py``). Three emulated capture
hosts stream partials and punctuation (real wire batches, punctuation every second, skew 0/0.5/1 s) into a
2-partition topic at the pace of their data time, continuously; ``lowwater-job`` runs on ``spark://`` with
2 executors, 2-s tumbling windows and a 500 ms trigger. Each round, after a few windows closed:

* **job**: the driver (Python and its JVM, one process group) is SIGKILLed and started again at once from
  its checkpoint, as a supervisor would;
* **broker**: the leader of partition 0 is SIGKILLed (producers and the job's Kafka source fail over), and
  started again once windows close again. The job's source bounds its wait on the dead leader with a 10 s
  admin call timeout and more retries (``high_level.options.FAILOVER_OPTIONS``, recorded in the JSON).

``*_recovery_s`` is the time from the kill until the first window whose closing punctuation was handed to
Kafka after the kill is whole in the store (its rows number the oracle's, read through the API's file index:
visible files only); ``next_window_s`` until any window not yet whole became whole. Before each fault (and
the end) the run waits for ``steady_windows`` windows closed on input sent after the previous fault's kill
(before the first: after the job's first window), never an absolute count: a replayed backlog never counts. Each fault's interrupted windows (not whole
at the kill, up to the recovery's window) are compared with the oracle on their own (``exact_across``), and
each restart's time is split into Spark session, queries started and first batch committed
(``restart_phases``: under load the first batch of fresh executors, their JVMs and Python workers, is
most of it). At the end the stream is
cut, every window below the hosts' last mark must close, and the store is compared with an offline oracle
over the same packets: ``rows_written_twice`` (final duplicates, or rows over the oracle's count seen at any
poll), missing, wrong, and windows closed early (goal: all 0). Writes ``benchmarks/results/reliability.json``
and ``reliability.png`` (close latency per window over the run, faults marked); ``--quick`` (one round, 100
packets/s) writes ``reliability-quick.json``, a smoke run that never replaces the figures.

Bounded: a line per step on stdout (clusters, topic, the job's launch and its queries' start, the stream,
each fault and its recovery, the end); the job boots while the stream is generated; a killed broker
restarts in the background; the hosts' stream (``--stream-seconds``) outlasts a run at load 30, and a fault
is skipped when it would end too soon; a fault is skipped (``faults_skipped``) when the ``--budget`` (690 s full,
170 s quick, cluster start included) would not hold its kind's longest cycle so far plus the end.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from high_level.options import FAILOVER_OPTIONS
from lowwater_testing.cluster import Stream, recovery_run, start_clusters


def chart(res: dict, path: Path) -> None:
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    tl = res["run"]["timeline"]
    ax.plot(
        [r["t_s"] for r in tl],
        [r["close_latency_s"] for r in tl],
        marker=".",
        ls="none",
        label="window (when whole)",
    )
    colors = {"job": "tab:red", "broker": "tab:orange"}
    seen = set()
    for ev in res["run"]["events"]:
        lab = None if ev["fault"] in seen else f"{ev['fault']} SIGKILL"
        seen.add(ev["fault"])
        ax.axvline(ev["t_kill_s"], color=colors[ev["fault"]], ls="--", label=lab)
    ax.set_xlabel("seconds since the job's start")
    ax.set_ylabel("closing punctuation -> window whole (s)")
    ax.set_title("central tier under SIGKILL: driver and Kafka broker (2-core VM)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    harness.save_figure(fig, path)


def summarize(run: dict, head: dict) -> dict:
    def figs(kind: str) -> list[float]:
        return [
            ev["recovery_s"] for ev in run["events"] if ev["fault"] == kind and ev["recovery_s"] is not None
        ]

    job, broker = figs("job"), figs("broker")
    return {
        "benchmark": "recovery",
        **head,
        "setup": "Spark standalone master + 2 workers of 1 core, driver (lowwater-job) in its own process group, "
        "3-broker KRaft Kafka cluster (replication 3, min ISR 2), 3 emulated hosts at data-time pace; all on "
        "the same VM",
        "timed": {
            "*_recovery_s": "median over the faults of that kind: from the SIGKILL (monotonic clock of this "
            "process) until the first window whose closing punctuation (mark past its end from every host on "
            "every partition) was handed to the producer after the kill has all the oracle's final rows in "
            "the store's visible files (polled every 0.25 s as the API's file index reads them)",
            "next_window_s": "per fault: from the SIGKILL until any window not yet whole became whole",
            "windows_across": "per fault: the windows it interrupted (not whole at the kill, up to the first "
            "window closed on fresh input), each compared with the oracle (exact_across, rows_across)",
            "steady": "before each fault and before the end: steady_windows windows closed on input sent after "
            "the previous fault's kill (before the first fault: after the job's first window), never an "
            "absolute count (a replayed backlog never counts)",
            "restart_phases": "per job fault, seconds from the restart's launch: session_s (driver JVM and "
            "its registration with the master), queries_started_s (streams started), first_batch_s (first "
            "micro-batch committed: the executors' start, their Python workers, the state store's load and "
            "the replay of the batch in flight at the kill)",
            "rows_written_twice": "final rows of one (window, group) seen more than once in the visible store: "
            "at the end, or at any poll (rows of a window over the oracle's count), whichever is more",
            "exact": "every window below the hosts' last mark, across the faults, equals the oracle (no row "
            "twice, missing, not in the oracle, wrong, or of a window closed early)",
        },
        "job_recovery_s": statistics.median(job) if job else None,
        "job_recovery_s_all": job,
        "broker_recovery_s": statistics.median(broker) if broker else None,
        "broker_recovery_s_all": broker,
        "rows_written_twice": run["rows_written_twice"],
        "exact": run["exact"],
        "steady_close_latency_s": run["steady_close_latency_s"],
        "job_first_window_s": run.get("job_first_window_s"),  # the job's first start, stream included
        "job_first_start_phases": run.get("job_first_start_phases"),
        "exact_across_each_fault": all(ev.get("exact_across") for ev in run["events"]),
        "faults_skipped": run.get("faults_skipped", []),  # by the budget
        "job_restarts_by_supervisor": run["job_restarts_by_supervisor"],
        "kafka_source_failover": FAILOVER_OPTIONS,  # the job's defaults (high_level/options.py)
        "run": run,
    }


def main() -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="one round (job, broker), a small stream: CI smoke")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (job, broker) faults (full mode)")
    ap.add_argument("--rate", type=float, default=None, help="packets/s over the three hosts")
    ap.add_argument("--groups", type=int, default=None)
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole run (default 690 full, 170 quick): later faults are skipped to end in time",
    )
    ap.add_argument(
        "--stream-seconds",
        type=int,
        default=None,
        help="data seconds the hosts can stream (default 2400 quick, budget + 600 full): the run fails "
        "clearly if it outlasts them (a loaded machine)",
    )
    a = ap.parse_args()
    rounds = 1 if a.quick else a.rounds
    rate = a.rate or (100.0 if a.quick else 1000.0)
    groups = a.groups or (200 if a.quick else 2000)
    budget = a.budget or (170.0 if a.quick else 690.0)
    # longer than the run, even one over its budget (at load 30 a quick run took ~1,100 s): it is cut at the end
    seconds = a.stream_seconds or (2400 if a.quick else int(budget) + 600)
    work = Path(tempfile.mkdtemp(prefix="lowwater-recovery-"))
    load = [harness.load()[0]]
    t0 = time.monotonic()
    print(
        f"starting a Spark standalone cluster (master + 2 workers) and 3 Kafka brokers in {work}", flush=True
    )
    spark, kafka = start_clusters(work)
    up = time.monotonic() - t0
    print(f"[{up:6.1f} s] clusters up", flush=True)
    try:
        run = recovery_run(
            spark.master,
            kafka,
            work / "run",
            ["job", "broker"] * rounds,
            stream=Stream(rate, groups, seconds),
            steady_windows=2 if a.quick else 4,
            budget_s=budget - up,
            reserve_s=30.0 if a.quick else 60.0,
            log=lambda s: print(s, flush=True),
            clock_from=t0,
        )
    finally:
        spark.stop()
        kafka.stop()
    run["clusters_start_s"] = round(up, 1)
    run["total_s"] = round(time.monotonic() - t0, 1)
    load.append(harness.load()[0])
    res = summarize(
        run,
        {
            "machine": harness.machine(),
            "load_avg": load,
            "quick": a.quick,
            "rounds": rounds,
            "budget_s": budget,
            "total_s": run["total_s"],
            "clusters_start_s": run["clusters_start_s"],
        },
    )
    name = "reliability-quick" if a.quick else "reliability"  # a smoke run never replaces the figures
    harness.write_results(f"{name}.json", res, indent=1)
    chart(res, harness.RESULTS / f"{name}.png")
    short = {k: v for k, v in res.items() if k not in ("run", "machine", "setup")}
    short.update(
        {k: run[k] for k in ("rows_missing", "rows_wrong", "rows_of_windows_closed_early", "windows_checked")}
    )
    for ev in run["events"]:
        print(
            f"{ev['fault']:>6} at {ev['t_kill_s']:6.1f} s: next window {ev['next_window_s']} s, "
            f"recovery {ev['recovery_s']} s",
            flush=True,
        )
    print(short)
    print(f"wrote {harness.RESULTS / name}.json")
    if run["exact"]:
        shutil.rmtree(work, ignore_errors=True)  # kept on failure: the job's and the brokers' logs
    else:
        print(f"not exact: logs kept in {work}")
    return 0 if run["exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
