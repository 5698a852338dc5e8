"""``lowwater-job``: the high-level job's command line (flags, environment), session and life cycle.

Every setting is a flag and, for containers, an environment variable ``LOWWATER_JOB_<FLAG>`` (flags
win). Cluster settings that used to need a wrapper around the job are settings here:
``--spark-conf KEY=VALUE`` (repeatable), ``--driver-host`` (the address executors connect back to on
a non-local master), ``--kafka-option kafka.KEY=VALUE`` (the Kafka source's and the topic
provisioning's security, one block: :mod:`contract.kafka_security`) and ``--spark-jars``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from contract import query as Q
from contract.kafka_security import KafkaSecurityError, kafka_python_settings
from high_level.job import MODES, HighLevelJob, JobOptions
from high_level.partition import LATE_POLICIES

log = logging.getLogger("lowwater.job")
ENV_PREFIX = "LOWWATER_JOB_"
_SEP = re.compile(r"[;\n]")


def _ms(text: str) -> int:
    return Q.parse_duration_ns(text) // 1_000_000


def _env(name: str, default: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if env is None else env).get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Flags, with defaults from ``LOWWATER_JOB_*`` environment variables."""

    def e(name: str, default: str | None = None) -> str | None:
        return _env(name, default, env)

    p = argparse.ArgumentParser(prog="lowwater-job", description="lowwater high-level job (PySpark, out of order)")
    p.add_argument("--config", default=e("config", "configs/default.yaml"), help="queries YAML")
    p.add_argument("--query", action="append", default=None, help="run only these queries (repeatable)")
    p.add_argument("--bootstrap", default=e("bootstrap", "127.0.0.1:9092"), help="Kafka bootstrap servers")
    p.add_argument("--results", default=e("results"), required=e("results") is None,
                   help="result store directory (Parquet + _status.json)")
    p.add_argument("--checkpoint", default=e("checkpoint"), required=e("checkpoint") is None,
                   help="Spark checkpoint directory")
    p.add_argument("--mode", choices=MODES, default=e("mode", "oop"), help="oop: punctuation (default); watermark: baseline")
    p.add_argument("--watermark-delay", default=e("watermark_delay", "10s"), help="watermark mode: max event time minus this")
    p.add_argument("--trigger", default=e("trigger", "1s"), help="micro-batch interval")
    p.add_argument("--host-timeout", default=e("host_timeout", "10s"), help="a host silent this long stops holding windows open")
    p.add_argument("--expected-hosts", default=e("expected_hosts", ""), help="comma list: nothing closes before each has punctuated")
    p.add_argument("--late-policy", choices=LATE_POLICIES, default=e("late_policy", "drop"))
    p.add_argument("--max-offsets-per-trigger", type=int, default=e("max_offsets_per_trigger"))
    p.add_argument("--master", default=e("master", "local[2]"))
    p.add_argument("--shuffle-partitions", type=int, default=e("shuffle_partitions"),
                   help="state partitions (default: the cores of --master); fixed once a checkpoint exists")
    p.add_argument("--metrics-port", type=int, default=e("metrics_port"), help="serve Prometheus /metrics on this port")
    p.add_argument("--kafka-option", action="append", default=None, metavar="KEY=VALUE",
                   help="a kafka.* option for Spark's Kafka source and the topic provisioning, e.g. "
                        "kafka.security.protocol=SASL_SSL (repeatable; env LOWWATER_JOB_KAFKA_OPTIONS: a JSON "
                        "object; see deploy/SECURITY.md)")
    p.add_argument("--spark-conf", action="append", default=None, metavar="KEY=VALUE",
                   help="an extra Spark setting, e.g. spark.executor.memory=2g (repeatable; env "
                        "LOWWATER_JOB_SPARK_CONF: items separated by ';' or newlines)")
    p.add_argument("--driver-host", default=e("driver_host"),
                   help="address executors reach the driver at (non-local master; default: the host name)")
    p.add_argument("--spark-jars", default=e("spark_jars"),
                   help="comma list of the Spark Kafka connector jars (default: the ones ./lw setup fetched)")
    a = p.parse_args(argv)
    if a.kafka_option is None:
        a.kafka_option = _json_options(e("kafka_options") or "")
    if a.spark_conf is None:
        a.spark_conf = [s.strip() for s in _SEP.split(e("spark_conf") or "") if s.strip() and not s.strip().startswith("#")]
    return a


def _json_options(raw: str) -> list[str]:
    if not raw.strip():
        return []
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise SystemExit(f"lowwater-job: {ENV_PREFIX}KAFKA_OPTIONS is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise SystemExit(f"lowwater-job: {ENV_PREFIX}KAFKA_OPTIONS must be a JSON object")
    return [f"{k}={v}" for k, v in obj.items()]


def key_values(items: Sequence[str], prefix: str, flag: str) -> dict[str, str]:
    """``["a.b=1", ...]`` -> ``{"a.b": "1"}``; every key must start with ``prefix``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.startswith(prefix):
            raise ValueError(f"{flag} {item!r}: expected {prefix}<setting>=<value>")
        out[key] = value.strip()
    return out


def options_from_args(a: argparse.Namespace) -> JobOptions:
    kafka_options = key_values(a.kafka_option, "kafka.", "--kafka-option")
    try:
        kafka_python_settings(kafka_options)  # refuse now what the topic provisioning could not apply
    except KafkaSecurityError as exc:
        raise ValueError(f"--kafka-option: {exc}") from None
    return JobOptions(
        bootstrap=a.bootstrap, results=a.results, checkpoint=a.checkpoint, mode=a.mode,
        trigger_ms=_ms(a.trigger), host_timeout_ms=_ms(a.host_timeout),
        expected_hosts=tuple(h.strip() for h in a.expected_hosts.split(",") if h.strip()),
        late_policy=a.late_policy, watermark_delay_ms=_ms(a.watermark_delay),
        max_offsets_per_trigger=int(a.max_offsets_per_trigger) if a.max_offsets_per_trigger else None,
        shuffle_partitions=int(a.shuffle_partitions) if a.shuffle_partitions else _cores(a.master),
        kafka_options=kafka_options,
    )  # fmt: skip


def _cores(master: str) -> int | None:
    m = re.fullmatch(r"local\[(\d+)\]", master.strip())
    return int(m.group(1)) if m else None


def _jars(a: argparse.Namespace) -> list[str]:
    if a.spark_jars:
        return [j.strip() for j in a.spark_jars.split(",") if j.strip()]
    from local_stack.jars import spark_kafka_jars  # the development default: what ./lw setup fetched

    return spark_kafka_jars()


def main(argv: Sequence[str] | None = None) -> int:
    """``lowwater-job``: run until SIGINT/SIGTERM or a stream failure."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    a = parse_args(argv)
    try:
        cfg = Q.load(a.config)
        opts = options_from_args(a)
        spark_conf = key_values(a.spark_conf, "spark.", "--spark-conf")
        queries = [cfg.query(n) for n in a.query] if a.query else cfg.queries
    except (Q.ConfigError, KeyError, ValueError) as exc:
        print(f"lowwater-job: {exc}", file=sys.stderr)
        return 2
    from high_level.session import build_spark

    state = os.environ.get("LOWWATER_STATE_DIR") or str(Path(a.checkpoint).resolve().parent)
    spark = build_spark("lowwater-job", a.master, spark_conf, jars=_jars(a), state=state, driver_host=a.driver_host)
    job = HighLevelJob(spark, queries, opts)
    if a.metrics_port:
        job.metrics.serve(int(a.metrics_port))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    job.start()
    log.info("started %s mode for %s; results in %s", opts.mode, [q.name for q in queries], opts.results)
    try:
        job.await_termination(stop_event=stop)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    finally:
        job.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
