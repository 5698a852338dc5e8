"""A real Spark standalone cluster in the suite: a master and two workers started from the pyspark
distribution (``bin/spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``), and the job
run against it with ``--master spark://...`` in a process of its own (one SparkContext per process:
the session's local one stays in the test process). Emulated hosts -> the session's real Kafka ->
the job on the cluster's executors -> results equal the oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract import query as Q
from local_stack.kafka_broker import free_port
from tests.packets import make_traffic
from tests.test_high_level_spark import HOSTS, assert_exact, produce, traffic_messages

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000_000_000

pytestmark = pytest.mark.cluster

QUERY = """
queries:
  - name: {name}
    group_by: [src_ip, dst_ip]
    aggregates:
      - {{fn: count, as: packets}}
      - {{fn: sum, field: length, as: bytes}}
      - {{fn: avg, field: length, as: avg_len}}
      - {{fn: max, field: ttl, as: max_ttl}}
    window: {{range: 10s}}
    kafka: {{topic: {topic}, partitions: 4}}
"""

# the job on the cluster, in its own process: prints what the driver saw of the cluster as JSON
DRIVER = """
import json, sys
from contract import query as Q
from high_level.job import HighLevelJob, JobOptions
from high_level.session import build_spark
from local_stack.jars import spark_kafka_jars

master, cfg, bootstrap, results, ckpt, state, hosts = sys.argv[1:8]
conf = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2",
        "spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "4"}
spark = build_spark("lowwater-cluster-test", master, conf, jars=spark_kafka_jars(), state=state,
                    driver_host="127.0.0.1")
job = HighLevelJob(spark, Q.load(cfg).queries, JobOptions(bootstrap=bootstrap, results=results, checkpoint=ckpt,
                   trigger_ms=300, expected_hosts=tuple(hosts.split(",")), host_timeout_ms=600_000,
                   shuffle_partitions=4, name="cluster"))
job.start()
try:
    job.process_all_available()
finally:
    job.stop()
sc = spark.sparkContext
print("CLUSTER " + json.dumps({"master": sc.master, "block_managers": sc._jsc.sc().getExecutorMemoryStatus().size()}))
spark.stop()
"""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and two 1-core, 512 MB workers on loopback; yields the master URL."""
    home = _spark_home()
    work = tmp_path_factory.mktemp("spark-cluster")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_LOG_DIR": str(work), "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}  # fmt: skip
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    cls = str(home / "bin" / "spark-class")
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, *args: str) -> None:
        log = (work / f"{name}.log").open("wb")
        logs.append(log)
        procs.append(subprocess.Popen([cls, *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work,
                                      start_new_session=True))  # fmt: skip

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))  # fmt: skip
        for i in range(2):
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "768m", "--webui-port", str(free_port()), "--work-dir", str(work / f"w{i}"), master)  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            st = _get_json(f"http://127.0.0.1:{ui}/json/")
            if st and st.get("aliveworkers") == 2:
                break
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = "\n".join(
                    (work / f"{n}.log").read_text()[-1500:] for n in ("master", "worker0", "worker1")
                )
                pytest.fail(f"the standalone cluster did not come up (state {st}):\n{tails}")
            time.sleep(0.5)
        yield master
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()


@pytest.mark.kafka
def test_job_on_a_standalone_cluster_equals_the_oracle(
    spark_cluster, kafka, topic_factory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=4, prefix="hl-cluster")
    cfg = tmp_path / "q.yaml"
    cfg.write_text(QUERY.format(name="on_cluster", topic=topic))
    q = Q.load(cfg).queries[0]
    t = make_traffic(5000, 120, T0, 60 * 10**9, seed=17)
    produce(kafka, traffic_messages([q], t))
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-c", DRIVER, spark_cluster, str(cfg), kafka.bootstrap_servers,
                           str(results), str(tmp_path / "ckpt"), str(tmp_path / "state"), ",".join(HOSTS)],
                          capture_output=True, text=True, timeout=400, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CLUSTER "))
    seen = json.loads(line[len("CLUSTER ") :])
    assert seen["master"] == spark_cluster
    assert seen["block_managers"] >= 3, seen  # the driver and an executor on each worker
    assert_exact(results, q, t)
