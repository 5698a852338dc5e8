"""The job's SparkSession: the Kafka source's jars, scratch space and logging, local or on a cluster.

Why not ``spark.jars.packages``: Spark's Ivy resolution cannot be relied on where capture networks
are closed, so the Kafka source's jars are handed over as files (``spark.jars``; ``./lw setup``
fetches them with Maven, the image at build time). Spark's scratch space, warehouse and log file
live under ``state``, not in /tmp or the working directory, and the console only shows Spark errors.
On a cluster (a non-local master) executors connect back to the driver: ``driver_host`` is the
address they use, and the driver binds every interface.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from high_level.cluster.pyworker import install as install_worker_python
from high_level.cluster.pyworker import installed as installed_worker_python

_LOG4J2 = """\
# written by high_level.cluster.session: WARN and above to a file, only errors to the console
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.console.ref = console
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# Known noise on a fresh local setup.
logger.nativeloader.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeloader.level = error
"""

# The driver JVM of a cluster job (not local mode): its work is a micro-batch's planning and commit, a fixed
# cost per batch in code that runs a few times a second, where C2's compilations cost more CPU than the
# code they speed up; C1 only (TieredStopAtLevel=1), the serial collector (no concurrent GC threads on a
# heap of short-lived plans) and a small code cache cut the driver's CPU per batch
# (benchmarks/bench_scaling.py, driver_jvm_threads_cpu_seconds). A user's spark.driver.extraJavaOptions
# (--spark-conf) replaces them.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=64m"
# The executor JVMs of a cluster job: the hot path is the Python step (numba); the JVM fetches from Kafka,
# converts Arrow, calls RocksDB and loads new generated classes every micro-batch, which C2 compiled again.
# C1 only: executor CPU per record at (1, 1) 1.05M -> 1.13M records per CPU-s at 10M-record batches, and
# the fixed cost per task and batch 0.62 -> 0.32 CPU-s (bench_scaling, session 15; docs/design.md). A
# user's spark.executor.extraJavaOptions replaces it.
EXECUTOR_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def connector_jars(entries: Sequence[str]) -> list[str]:
    """The jar files of ``entries`` (``--spark-jars``): each a jar file, or a directory whose ``*.jar`` all go.

    How the job finds the Spark Kafka connector without knowing who fetched it: the launcher passes the
    list (``./lw run`` what ``./lw setup`` fetched, the image a directory baked in at build time)."""
    out: list[str] = []
    for entry in entries:
        path = Path(entry)
        out += sorted(str(j) for j in path.glob("*.jar")) if path.is_dir() else [entry]
    return out


@contextmanager
def jvm_ignores_sigterm() -> Iterator[None]:
    """Launch the driver's JVM with SIGTERM ignored (inherited through exec; the JVM installs no handler
    for a signal it starts with ignored). Why: a stop signal to the whole process group (a supervisor's
    ``kill -TERM -pgid``, ``./lw``'s stack) otherwise reaches the JVM too, whose shutdown hook stops the
    SparkContext under the running batch, and the job exits 1 instead of stopping in order from Python
    (high_level/cli.py). The JVM still ends with the driver: it exits when its stdin (the Python
    driver's pipe) closes, even after a SIGKILL."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


def build_spark(
    app_name: str,
    master: str = "local[2]",
    extra_conf: Mapping[str, str] | None = None,
    *,
    jars: Sequence[str],
    state: Path | str,
    driver_host: str | None = None,
) -> SparkSession:
    """Create (or get) a SparkSession with the Kafka source's ``jars`` on its classpath.

    ``extra_conf`` overrides any default below. ``state`` holds ``spark/local`` (shuffle/spill),
    ``spark/warehouse`` and ``spark/spark.log``. Static settings (jars, driver options) only apply
    when this call launches the JVM: if a SparkContext already runs in this process, getOrCreate
    returns it unchanged apart from the SQL settings.
    """
    missing = [j for j in jars if not Path(j).is_file()]
    if not jars or missing:
        raise FileNotFoundError(
            f"Spark Kafka connector jars missing: {missing or 'none given'} (--spark-jars or LOWWATER_JOB_SPARK_JARS: "
            "jar files or a directory of them; ./lw setup fetches them)"
        )
    base = Path(state) / "spark"
    local_dir = base / "local"
    local_dir.mkdir(parents=True, exist_ok=True)
    log4j = base / "log4j2.properties"
    log4j.write_text(_LOG4J2.format(log=base / "spark.log"))
    # Python workers must run the driver's own interpreter (the venv's python under ./lw),
    # or they miss the project's packages or differ in minor version. Through high_level.cluster.pyworker
    # (a script in the state directory on a local master, the package's console script on a cluster): the
    # installed pyspark (bytecode cached), not Spark's pyspark.zip (compiled from source at every worker
    # start, too slow under load for the 10-s connect-back of a query start).
    local = master.startswith("local")
    worker_python = install_worker_python(base) if local else (installed_worker_python() or sys.executable)
    os.environ["PYSPARK_PYTHON"] = worker_python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if local:  # otherwise Spark resolves the hostname and may bind to a non-loopback interface
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The driver JVM is launched by this call (local mode), so its Java options still apply here.
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    # On a cluster the driver only plans and commits: see DRIVER_JAVA_OPTIONS. In local mode the same JVM
    # runs the tasks (Kafka fetch, Arrow, state store), which need the optimising compiler.
    driver_opts = java_opts if local else f"{java_opts} {DRIVER_JAVA_OPTIONS}"
    conf: dict[str, str] = {
        "spark.jars": ",".join(jars),
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": str(local_dir),
        "spark.sql.warehouse.dir": str(base / "warehouse"),
        "spark.driver.host": "127.0.0.1" if local else (driver_host or socket.gethostname()),
        "spark.driver.bindAddress": "127.0.0.1" if local else "0.0.0.0",
        "spark.driver.extraJavaOptions": driver_opts,
        "spark.executor.extraJavaOptions": java_opts if local else f"{java_opts} {EXECUTOR_JAVA_OPTIONS}",
        "spark.pyspark.python": worker_python,
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # Event-time windows must not depend on the machine's time zone.
        "spark.sql.session.timeZone": "UTC",
    }
    conf.update(extra_conf or {})
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with jvm_ignores_sigterm():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # the file keeps warnings; the console filter shows errors only
    return spark
