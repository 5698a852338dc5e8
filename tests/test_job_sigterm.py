"""An operator's stop of the job process (``docker stop``, a supervisor's ``kill -TERM -<pgid>``): SIGTERM
to the whole process group while batches run stops the query in order and exits 0, and what a reader
sees holds every (window, group) at most once (the batch in flight is committed or abandoned, never
half-visible). The real ``lowwater-job`` process, real Kafka, Spark local[2]."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from contract import results as R
from high_level.cli import stop_exit
from local_stack.jars import spark_kafka_jars
from local_stack.kafka_broker import free_port
from lowwater_testing.queries import config, query
from lowwater_testing.spark import PORTS, Host, read_results
from lowwater_testing.topics import produce

REPO = Path(__file__).resolve().parents[1]


def test_exit_code_is_0_after_a_stop_asked_for_and_1_after_a_failure_nobody_asked_for() -> None:
    assert stop_exit(None, False) == 0 and stop_exit(None, True) == 0
    assert stop_exit(RuntimeError("stream failed"), True) == 0  # the batch in flight, abandoned on the stop
    assert stop_exit(RuntimeError("stream failed"), False) == 1


def _metrics_up(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).status == 200
    except OSError:
        return False


def test_sigterm_to_the_process_group_stops_in_order_and_exits_0(kafka, topic_factory, tmp_path) -> None:
    topic = topic_factory(partitions=1, prefix="hl-sigterm")
    doc = config(
        query(
            "sigterm",
            group_by=["dst_port"],
            aggregates=["count as n", "sum(length) as bytes"],  # the state Host sends
            window="1s",
            topic=topic,
            partitions=1,
        )
    )
    cfg = doc.write(tmp_path / "queries.yaml")
    q = doc.load().queries[0]
    h = Host("h0", q)
    p0 = q.window.origin_ns // q.window.pane_ns + 1_700_000_000
    results, port = tmp_path / "results", free_port()
    log = open(tmp_path / "job.log", "wb")  # noqa: SIM115 - closed below
    job = subprocess.Popen(
        [sys.executable, "-m", "high_level.cli", "--config", str(cfg), "--bootstrap", kafka.bootstrap_servers]
        + ["--results", str(results), "--checkpoint", str(tmp_path / "ck"), "--master", "local[2]"]
        + ["--metrics-port", str(port), "--trigger", "200ms", "--expected-hosts", "h0"]
        + ["--spark-jars", ",".join(spark_kafka_jars()), "--compact-every", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "LOWWATER_STATE_DIR": str(tmp_path / "state")},
        start_new_session=True,  # its own group, as a container's or a supervisor's
    )
    try:
        t0 = time.monotonic()
        produce(kafka, h.pane(p0, PORTS, 1, 100))
        while R.committed_batch(results, q.name) is None:  # the query runs and has committed a batch
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            assert time.monotonic() - t0 < 600, "no committed batch"  # a JVM start under load is slow
            time.sleep(0.1)
        assert _metrics_up(port)
        produce(kafka, [m for p in range(p0 + 1, p0 + 40) for m in h.pane(p, PORTS, 1, 100)])
        while (R.committed_batch(results, q.name) or 0) < 1:  # a batch with data is running or done
            time.sleep(0.05)
        os.killpg(job.pid, signal.SIGTERM)  # the whole group: the Python driver, its JVM, Spark's workers
        rc = job.wait(60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        log.close()
    assert rc == 0, (tmp_path / "job.log").read_text()[-3000:]
    rows = read_results(results, q.name)
    rows = rows[rows["kind"] == "final"]
    assert len(rows) and not rows.duplicated(["window_end", "dst_port"]).any()
    assert set(rows["n"]) == {1}
