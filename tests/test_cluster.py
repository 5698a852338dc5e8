"""Real clusters in the suite, started once together (JVM start-up is most of the cost):

* a Spark standalone cluster: a master and two workers from the pyspark distribution
  (``bin/spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``); the job runs against it
  with ``--master spark://...`` in a process of its own (one SparkContext per process: the session's
  local one stays in the test process);
* a 3-broker KRaft Kafka cluster (``local_stack/kafka_cluster.py``), topics with replication factor 3
  and ``min.insync.replicas`` 2.

Emulated hosts' partials and punctuations go to the Kafka cluster while the leader of a partition is
SIGKILLed mid-stream and then restarted: nothing is lost, duplicated or reordered, and the job on the
standalone cluster's executors gives results equal to the oracle. And the job's driver is SIGKILLed while
hosts stream and restarted from its checkpoint: windows close again, each exact and none written twice
(the core of ``benchmarks/bench_recovery.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contract import query as Q
from local_stack.kafka_cluster import KafkaCluster
from local_stack.spark_cluster import SparkClusterError
from lowwater_testing.cluster import (
    BrokerRestart,
    PacedHosts,
    Stream,
    fresh_windows,
    idempotent_producer,
    interrupted,
    leader,
    recovery_of,
    recovery_run,
    start_clusters,
)
from lowwater_testing.hosts import HOSTS, traffic_messages
from lowwater_testing.oracle import Message
from lowwater_testing.queries import config, query
from lowwater_testing.spark import assert_exact
from lowwater_testing.topics import read_topic
from lowwater_testing.traffic import make_traffic

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000_000_000

pytestmark = pytest.mark.cluster

AGGREGATES = ["count as packets", "sum(length) as bytes", "avg(length) as avg_len", "max(ttl) as max_ttl"]

# the job on the cluster, in its own process: prints what the driver saw of the cluster as JSON
DRIVER = """
import json, sys
from contract import query as Q
from high_level.job import HighLevelJob, JobOptions
from high_level.cluster.session import build_spark
from local_stack.jars import spark_kafka_jars

master, cfg, bootstrap, results, ckpt, state, hosts = sys.argv[1:8]
conf = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2",
        "spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "2"}
spark = build_spark("lowwater-cluster-test", master, conf, jars=spark_kafka_jars(), state=state,
                    driver_host="127.0.0.1")
job = HighLevelJob(spark, Q.load(cfg).queries, JobOptions(bootstrap=bootstrap, results=results, checkpoint=ckpt,
                   trigger_ms=300, expected_hosts=tuple(hosts.split(",")), host_timeout_ms=600_000,
                   shuffle_partitions=2, name="cluster"))
job.start()
try:
    job.process_all_available()
finally:
    job.stop()
sc = spark.sparkContext
print("CLUSTER " + json.dumps({"master": sc.master, "block_managers": sc._jsc.sc().getExecutorMemoryStatus().size()}))
spark.stop()
"""


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, KafkaCluster]]:
    """A standalone master and two 1-core workers on loopback (``local_stack/spark_cluster.py``), and a
    3-node Kafka cluster, started side by side; yields (the master URL, the Kafka cluster)."""
    try:
        spark, kafka = start_clusters(tmp_path_factory.mktemp("clusters"))
    except SparkClusterError as exc:
        pytest.fail(str(exc))
    try:
        yield spark.master, kafka
    finally:
        spark.stop()
        kafka.stop()


def test_steady_and_recovery_count_only_windows_closed_on_input_sent_after_the_fault():
    """Pure logic, no cluster: one host on one partition punctuating each second (mark = window + 1 closes a
    window), sent at t = 10, 11, ... The kill at 13.5 s: windows 0-2 closed before it on older input; window 3
    (closing punctuation sent at 13 s, before the kill) is the replayed backlog, whole only after the kill;
    window 4 (sent at 14 s) is the first closed on fresh input. Neither the steady count nor the recovery may
    count the backlog, however many windows it holds."""
    hosts = PacedHosts("unused:0", "t", [Message(i * 10**9, "h0", 0, b"", mark_pane=i + 1) for i in range(8)])
    hosts.sent = 8
    hosts.sent_at[:] = 10.0 + np.arange(8)
    whole = {0: 10.5, 1: 11.5, 2: 12.5, 3: 40.0, 4: 40.0, 5: 41.0}
    t_kill = 13.5
    assert fresh_windows(whole, hosts, t_kill) == [4, 5]
    assert fresh_windows(whole, hosts, 40.5) == []  # steady after the recovery: 5's input was sent before
    sent = dict(zip(range(6), hosts.closing_sent(np.arange(6)).tolist(), strict=True))
    rec = recovery_of(t_kill, whole, sent)
    assert rec == {"next_window_s": 26.5, "recovery_s": 26.5, "recovery_window": 4}
    assert interrupted(t_kill, whole, rec["recovery_window"]) == [3, 4]


def produce_killing_a_leader(cluster: KafkaCluster, topic: str, msgs: list[tuple[str, int, bytes]]):
    """Send ``msgs`` (acks=all, idempotent) and SIGKILL partition 0's leader after two thirds were handed
    to the producer, sends in flight; every send must be acknowledged. Returns the seconds the sends took
    and the victim, started again in the background (it catches up from the others; a JVM start the
    caller overlaps with the job's)."""
    prod = idempotent_producer(cluster.bootstrap_servers, 120_000)
    victim = cluster.nodes[leader(cluster, topic, 0) - 1]
    futures = []
    third = len(msgs) // 3
    t0 = time.monotonic()
    try:
        for i, (_topic, part, value) in enumerate(msgs):
            futures.append(prod.send(topic, value=value, partition=part))
            if i == third:
                prod.flush(60)
            if i == 2 * third:
                victim.kill()  # the producer fails over to the new leader
        prod.flush(120)
        for f in futures:
            f.get(timeout=60)
    finally:
        prod.close(10)
    took = time.monotonic() - t0
    assert not victim.is_running()
    restart = BrokerRestart(victim, lambda s: None)
    restart.start()
    return took, restart


@pytest.mark.timeout(1200)  # the module's clusters start in its setup: 195 s of it at load 50, the job 400 s
def test_job_on_standalone_spark_and_3_brokers_with_a_killed_leader_equals_the_oracle(
    clusters, tmp_path: Path
):
    master, kafka = clusters
    topic = kafka.create_topic("lw-rf3-pairs", 2, {"min.insync.replicas": "2"})
    cfg = tmp_path / "q.yaml"
    config(
        query("on_clusters", group_by=["src_ip", "dst_ip"], aggregates=AGGREGATES, topic=topic, partitions=2)
    ).write(cfg)
    q = Q.load(cfg).queries[0]
    t = make_traffic(5000, 120, T0, 60 * 10**9, seed=17)
    msgs = traffic_messages([q], t)
    took, restart = produce_killing_a_leader(kafka, topic, msgs)
    print(f"\n{len(msgs)} messages sent in {took:.1f} s across a leader's SIGKILL")

    sent: dict[int, list[bytes]] = {p: [] for p in range(2)}
    for _topic, part, value in msgs:
        sent[part].append(value)
    got = read_topic(kafka.bootstrap_servers, topic, 2)
    assert {p: len(v) for p, v in got.items()} == {p: len(v) for p, v in sent.items()}, (
        "records lost or duplicated"
    )
    assert got == sent, "records reordered or altered"

    results = tmp_path / "results"
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            master,
            str(cfg),
            kafka.bootstrap_servers,
            str(results),
            str(tmp_path / "ckpt"),
            str(tmp_path / "state"),
            ",".join(HOSTS),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"job on the standalone cluster: {time.monotonic() - t0:.1f} s")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CLUSTER "))
    seen = json.loads(line[len("CLUSTER ") :])
    assert seen["master"] == master
    assert seen["block_managers"] >= 3, seen  # the driver and an executor on each worker
    assert_exact(results, q, t)
    assert restart.wait(240), "the killed broker's restart did not end within 240 s"
    assert restart.error is None and restart.node.is_running(), (
        f"the killed broker did not restart: {restart.error}"
    )


@pytest.mark.timeout(1500)  # the job starts twice: well under a minute quiet, minutes at load 30
def test_driver_sigkilled_mid_stream_restarts_from_its_checkpoint_exactly_once(clusters, tmp_path: Path):
    """The kill comes one window after the first: the checkpoint already holds committed batches and
    state, and the restart must resume from them (no row twice, none missing). The stream (900 s of data
    time) outlasts both starts even at load 30; it is cut once a window closed after the restart."""
    master, kafka = clusters
    res = recovery_run(
        master, kafka, tmp_path / "run", ["job"], stream=Stream(100, 100, 900), steady_windows=1
    )
    summary = {k: v for k, v in res.items() if k != "timeline"}
    print(f"\n{summary}")
    (ev,) = res["events"]
    assert ev["recovery_s"] is not None and ev["recovery_s"] > 0, summary
    assert ev["windows_across"] >= 1 and ev["exact_across"], summary  # the windows the kill interrupted
    assert res["windows_checked"] >= 10, summary
    assert res["rows_written_twice"] == 0, summary
    assert res["rows_missing"] == res["rows_wrong"] == res["rows_of_windows_closed_early"] == 0, summary
    assert res["exact"], summary
