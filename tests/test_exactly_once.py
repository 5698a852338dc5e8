"""Exactly once when the Spark tasks write the store and the driver commits it: the job is SIGKILLed
between the tasks' writes of a batch and the driver's commit, then restarted on the same checkpoint.

Real Kafka, real Spark, the job in its own process (lowwater_testing/jobproc.py) stopped at the fault
point (``LOWWATER_JOB_STOP_BEFORE_COMMIT``) and killed with SIGKILL: the killed batch's files are on disk
but no reader sees them; after the restart the replayed batch rewrites the same names, commits, and the
visible rows equal the oracle with no (window, group) twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract import results as R
from high_level.results.sink import STOP_AT_ENV
from lowwater_testing.hosts import HOSTS, traffic_messages
from lowwater_testing.jobproc import write_spec
from lowwater_testing.spark import assert_exact, read_results, variant
from lowwater_testing.topics import produce
from lowwater_testing.traffic import T0, make_traffic

ROOT = Path(__file__).resolve().parents[1]
STOP_AT = 3  # the batch killed before its commit


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def _task_files(root: Path, name: str) -> dict[str, int]:
    return {
        f.name: b
        for _d, d in R.date_dirs(root, name)
        for f in d.iterdir()
        if R.is_task_part(f.name) and (b := R.parse_part_name(f.name)) is not None
    }


def _visible(root: Path, name: str, committed: int | None) -> set[str]:
    out: set[str] = set()
    for _d, d in R.date_dirs(root, name):
        named = {f.name: r for f in d.iterdir() if (r := R.batch_range(f.name)) is not None}
        out |= set(R.visible_files(named, committed))
    return out


@pytest.mark.timeout(1500)
def test_sigkill_between_task_writes_and_commit_then_restart_is_exact(kafka, topic_factory, tmp_path):
    t = make_traffic(4000, 100, T0, 60 * 10**9, seed=11)
    queries = [
        variant(topic_factory, "tumble", "tumble_tk", 2),
        variant(topic_factory, "slide", "slide_tk", 2),
    ]
    produce(kafka, traffic_messages(queries, t, seed=11))
    results = tmp_path / "results"
    spec = write_spec(
        tmp_path / "job.pickle",
        queries,
        bootstrap=kafka.bootstrap_servers,
        results=str(results),
        checkpoint=str(tmp_path / "ckpt"),
        trigger_ms=200,
        shuffle_partitions=2,
        name="t-taskkill",
        expected_hosts=list(HOSTS),
        host_timeout_ms=600_000,
        max_offsets_per_trigger=60,
    )
    cmd = [sys.executable, "-m", "lowwater_testing.jobproc", str(spec)]
    log = tmp_path / "job.log"
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, STOP_AT_ENV: str(STOP_AT)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,  # its JVM dies with it
    )
    try:
        deadline = time.monotonic() + 600
        while not _stopped(proc.pid):
            assert proc.poll() is None, f"the job ended before its fault point: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the job never reached its fault point"
            time.sleep(0.2)
        # stopped before committing batch STOP_AT: its task files are written, and invisible
        for q in queries:
            files = _task_files(results, q.name)
            committed = R.committed_batch(results, q.name)
            assert committed is None or committed < STOP_AT
            seen = read_results(results, q.name)
            upto = -1 if committed is None else committed
            assert not {n for n, b in files.items() if b > upto} & _visible(results, q.name, committed)
            assert not seen.duplicated().any()
        killed = {
            q.name: {n for n, b in _task_files(results, q.name).items() if b >= STOP_AT} for q in queries
        }
        assert any(killed.values()), (
            "no task file of the killed batch: the fault point is not after the writes"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    stopped = max(R.parse_part_name(n) or 0 for names in killed.values() for n in names)  # the killed batch
    assert not R.manifest_path(results, stopped).exists()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    for q in queries:
        assert killed[q.name] <= set(_task_files(results, q.name))  # the replay rewrote the same names
        assert (R.committed_batch(results, q.name) or 0) >= STOP_AT
        assert_exact(results, q, t)
    assert R.manifest_path(results, stopped).exists()
