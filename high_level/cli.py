"""``lowwater-job``: the high-level job's command line, Spark session and life cycle.

Settings come from flags, ``LOWWATER_JOB_*`` environment variables and an optional settings file
(:class:`high_level.settings.JobSettings`; precedence in :mod:`contract.settings`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contract import query as Q
from contract.settings import SettingsError, load, role_parser
from contract.topics import PartitionChangeRefused
from high_level.aggregate.processor import LATE_POLICIES
from high_level.cluster import partitioncount
from high_level.job import MODES, HighLevelJob, pipelines
from high_level.settings import JobSettings

log = logging.getLogger("lowwater.job")
STOP_GRACE_S = 10.0  # on SIGINT/SIGTERM, wait this long for the running micro-batch before stopping


def _pairs(items: list[str] | None, flag: str) -> dict[str, str] | None:
    if items is None:
        return None
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _json(text: str | None, flag: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{flag}: not JSON: {exc}") from None


def parse_args(argv: Sequence[str] | None = None) -> tuple[dict[str, Any], str | None]:
    """The flags the user gave (as settings fields) and the settings file, if any."""
    p = role_parser("lowwater-job", "lowwater high-level job (PySpark, out of order)", "JOB")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default 127.0.0.1:9092)")
    p.add_argument("--results", help="result store directory (Parquet + _status.json); required")
    p.add_argument("--checkpoint", help="Spark checkpoint directory; required")
    p.add_argument("--mode", choices=MODES, help="oop: punctuation (default); watermark: baseline")
    p.add_argument("--watermark-delay", help="watermark mode: max event time minus this (default 10s)")
    p.add_argument("--trigger", help="micro-batch interval (default 1s)")
    p.add_argument(
        "--idle-trigger",
        help="at rest (no window open), wait for a partial or this long (default 5s; 0s: off)",
    )
    p.add_argument("--host-timeout", help="a host silent this long stops holding windows open (default 10s)")
    p.add_argument("--expected-hosts", help="comma list: nothing closes before each has punctuated")
    p.add_argument("--late-policy", choices=LATE_POLICIES)
    p.add_argument("--max-offsets-per-trigger", type=int)
    p.add_argument(
        "--expected-rate",
        type=float,
        help="partial records/s at peak (all queries): the trigger grows so a micro-batch holds ~5M records "
        "(the driver's cost per batch is fixed), up to 10 s; windows close up to one trigger later",
    )
    p.add_argument("--master", help="Spark master (default local[2])")
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        help="state partitions (default: the cores of --master); fixed once a checkpoint exists",
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument(
        "--kafka-security",
        metavar="JSON",
        help="the Kafka security block (protocol, sasl_mechanism, username, password, ca_file, ...), "
        "used by the Kafka source and the topic provisioning alike; see deploy/SECURITY.md",
    )
    p.add_argument(
        "--kafka-option",
        action="append",
        metavar="KEY=VALUE",
        help="an extra kafka.* option of Spark's Kafka source, e.g. kafka.isolation.level=read_committed",
    )
    p.add_argument(
        "--spark-conf", action="append", metavar="KEY=VALUE", help="an extra Spark setting (repeatable)"
    )
    p.add_argument(
        "--driver-host", help="address executors reach the driver at (non-local master; default: host name)"
    )
    p.add_argument(
        "--control-topic",
        help="ask the hosts that block a window for punctuation on this topic "
        "(e.g. lowwater.control; agents run with the same --control-topic)",
    )
    p.add_argument(
        "--retention-days",
        type=int,
        help="delete the results of windows older than this many days "
        "(checked every minute; default: keep everything)",
    )
    p.add_argument(
        "--compact-every",
        type=float,
        help="seconds between store maintenance passes: compaction, roll-up tiers, retention per tier "
        "(default 3600; 0: off)",
    )
    p.add_argument(
        "--spark-jars",
        help="comma list of the Spark Kafka connector jars, or of directories of them "
        "(required; `python -m local_stack.jars --spark-list` prints what ./lw setup fetched)",
    )
    p.add_argument(
        "--alert-webhook",
        metavar="URL",
        help="Alertmanager v2 endpoint for alert rules, e.g. http://127.0.0.1:9093/api/v2/alerts",
    )
    p.add_argument("--alert-timeout", help="timeout of one webhook post (default 2s)")
    p.add_argument(
        "--live",
        action="store_true",
        default=None,
        help="publish provisional values of open windows (and finals) to lowwater.live.<query>",
    )
    p.add_argument(
        "--state",
        choices=("auto", "blob", "chunked"),
        help="OOP state layout: chunked keeps pane tables as per-batch chunks in RocksDB (a batch costs "
        "what it brings, not the open groups); blob saves the whole processor every batch; auto "
        "(default): chunked unless --live, a landmark/bounded-top query or a blob checkpoint "
        "needs the blob",
    )
    a = p.parse_args(argv)
    flags = {
        k: v
        for k, v in vars(a).items()
        if v is not None and k not in ("settings", "kafka_option", "spark_conf")
    }
    if a.expected_hosts is not None:
        flags["expected_hosts"] = [h.strip() for h in a.expected_hosts.split(",") if h.strip()]
    if a.spark_jars is not None:
        flags["spark_jars"] = [j.strip() for j in a.spark_jars.split(",") if j.strip()]
    flags["kafka_security"] = _json(a.kafka_security, "--kafka-security")
    flags["kafka_options"] = _pairs(a.kafka_option, "--kafka-option")
    flags["spark_conf"] = _pairs(a.spark_conf, "--spark-conf")
    return {k: v for k, v in flags.items() if v is not None}, a.settings


def settings_from(argv: Sequence[str] | None = None) -> JobSettings:
    flags, file = parse_args(argv)
    return load(JobSettings, flags, file)


def guard_partitions(s: JobSettings, opts: Any, queries: Sequence[Q.QuerySpec]) -> None:
    """PartitionChangeRefused if a query's Kafka partition count changed under open windows, or a topic's
    count is not the config's (high_level/cluster/partitioncount.py)."""
    for line in partitioncount.check_change(s.checkpoint, s.results, queries):
        log.info("%s", line)
    try:
        admin = opts.kafka.admin(60)
    except RuntimeError as exc:  # the job's own provisioning reports an unreachable broker
        log.warning("partition counts not checked: %s", exc)
        return
    try:
        partitioncount.check_topics(admin, queries)
    finally:
        admin.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``lowwater-job``: run until SIGINT/SIGTERM or a stream failure."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        s = settings_from(argv)
        cfg = Q.load(s.config)
        opts = s.options()
        queries = [cfg.query(n) for n in s.queries] if s.queries else cfg.queries
        pipelines(
            opts.mode, queries, cfg
        )  # a config the mode cannot run: say so at once, before Spark starts
        if not s.spark_jars:
            raise SettingsError(
                "no Spark Kafka connector jars: give --spark-jars (jar files or a directory of them) "
                "or LOWWATER_JOB_SPARK_JARS; ./lw run passes what ./lw setup fetched"
            )
    except (SettingsError, Q.ConfigError, KeyError, ValueError) as exc:
        print(f"lowwater-job: {exc}", file=sys.stderr)
        return 2
    from high_level.cluster.session import build_spark, connector_jars

    state = os.environ.get("LOWWATER_STATE_DIR") or str(Path(s.checkpoint).resolve().parent)
    spark = build_spark(
        "lowwater-job",
        s.master,
        s.spark_conf,
        jars=connector_jars(s.spark_jars),
        state=state,
        driver_host=s.driver_host,
    )
    job = HighLevelJob(spark, queries, opts, config=cfg)
    if s.metrics_port:
        job.metrics.serve(s.metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        guard_partitions(s, opts, queries)
        job.start()
    except PartitionChangeRefused as exc:
        print(f"lowwater-job: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    partitioncount.record(s.checkpoint, queries)
    log.info("started %s mode for %s; results in %s", opts.mode, [q.name for q in queries], opts.results)
    failed: RuntimeError | None = None
    try:
        job.await_termination(stop_event=stop)
    except RuntimeError as exc:
        failed = exc
    try:
        job.stop(grace_s=STOP_GRACE_S if stop.is_set() else 0.0)  # an operator's stop: let the batch finish
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - a stop that asked for it is still a clean exit
        if not stop.is_set():
            raise
        log.warning("stopping: %s", exc)
    return stop_exit(failed, stop.is_set())


def stop_exit(failed: BaseException | None, stop_asked: bool) -> int:
    """The job's exit code: 0 after an operator's stop (SIGTERM/SIGINT), even if the batch in flight
    failed on the way (a signal to the whole process group also reaches Spark's Python workers; that
    batch is not committed, and a restart replays it from the checkpoint: exactly once), 1 after a stream
    failure nobody asked for."""
    if failed is None:
        return 0
    if stop_asked:
        log.info("stopped; the batch in flight was abandoned (%s), a restart replays it", failed)
        return 0
    log.error("%s", failed)
    return 1


if __name__ == "__main__":
    sys.exit(main())
