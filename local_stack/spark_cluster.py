"""A local Spark standalone cluster: a master and N workers from the pip-installed pyspark distribution.

The same processes a deployment runs (``bin/spark-class org.apache.spark.deploy.master.Master`` /
``...deploy.worker.Worker``, in the foreground), on loopback, for the cluster test and the scaling
benchmark. Each process leads its own session, so :meth:`SparkCluster.stop` ends it and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from local_stack.kafka_broker import free_port


class SparkClusterError(RuntimeError):
    """The master or a worker did not come up; the message has the end of their logs."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class SparkCluster:
    """``workers`` standalone workers of ``cores`` cores and ``memory`` each, and their master, logs in ``work``."""

    def __init__(
        self, work: Path, workers: int = 2, cores: int = 1, memory: str = "768m", daemon_memory: str = "256m"
    ) -> None:
        self.work = Path(work)
        self.workers, self.cores, self.memory, self.daemon_memory = workers, cores, memory, daemon_memory
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self._logs: list[IO[bytes]] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_LOG_DIR": str(self.work),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        }

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self._logs.append(log)
        cls = str(spark_home() / "bin" / "spark-class")
        self.procs.append(
            subprocess.Popen(
                [cls, *args],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                start_new_session=True,
            )
        )

    def spawn(self) -> SparkCluster:
        """Start the master and the workers without waiting (see :meth:`wait_ready`)."""
        self.work.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for i in range(self.workers):
            self._spawn(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(self.work / f"w{i}"),
                self.master,
            )
        return self

    def wait_ready(self, timeout: float = 120.0) -> SparkCluster:
        """Block until the master reports every worker alive; SparkClusterError (with the logs) otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            st = _get_json(f"http://127.0.0.1:{self.ui_port}/json/")
            if st and st.get("aliveworkers") == self.workers:
                return self
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                names = ["master", *(f"worker{i}" for i in range(self.workers))]
                tails = "\n".join(
                    (self.work / f"{n}.log").read_text()[-1500:]
                    for n in names
                    if (self.work / f"{n}.log").exists()
                )
                raise SparkClusterError(f"the standalone cluster did not come up (state {st}):\n{tails}")
            time.sleep(0.5)

    def start(self, timeout: float = 120.0) -> SparkCluster:
        return self.spawn().wait_ready(timeout)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for log in self._logs:
            log.close()
        self.procs, self._logs = [], []

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
