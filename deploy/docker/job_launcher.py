"""Run ``lowwater-job`` in a container, against a Spark standalone master or in local mode.

Why a launcher: :func:`local_stack.spark_session.build_spark` pins the driver to 127.0.0.1, which is
right on one machine and wrong for a cluster (executors in other containers connect back to the
driver), and the job's CLI has no flag for extra Spark settings or for the Kafka source's security
options. This launcher takes them from the environment and then runs the unchanged
:func:`high_level.job.main` with the same arguments:

``LOWWATER_DRIVER_HOST``
    Address executors use to reach the driver; only for a non-local ``--master`` (compose: ``job``,
    the service name). Default: this container's hostname. The driver then binds 0.0.0.0.
``LOWWATER_SPARK_CONF``
    Extra Spark settings, ``key=value`` separated by newlines or ``;`` (e.g.
    ``spark.executor.memory=2g;spark.cores.max=4``). They override the launcher's and
    ``build_spark``'s defaults.
``LOWWATER_KAFKA_OPTIONS``
    JSON object of ``kafka.*`` options for the Spark Kafka source, e.g.
    ``{"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512", ...}``.

It wraps two module attributes the job looks up at call time (``build_spark`` inside ``main`` and the
module-level ``options_from_args``); ``tests/test_deploy.py`` fails if the job stops doing so. Once
the job's CLI accepts these settings itself, compose can call ``lowwater-job`` directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

_SEP = re.compile(r"[;\n]")


def parse_spark_conf(text: str) -> dict[str, str]:
    """``"a=1; b=2\\nc=3"`` -> ``{"a": "1", "b": "2", "c": "3"}``; blank items and ``#`` comments skipped."""
    out: dict[str, str] = {}
    for item in _SEP.split(text or ""):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.startswith("spark."):
            raise ValueError(f"LOWWATER_SPARK_CONF: {item!r} is not spark.<key>=<value>")
        out[key] = value.strip()
    return out


def spark_conf(env: Mapping[str, str], master: str) -> dict[str, str]:
    """The Spark settings the launcher adds for ``master`` (before the caller's own ``extra_conf``)."""
    conf: dict[str, str] = {}
    if not master.startswith("local"):
        conf["spark.driver.host"] = env.get("LOWWATER_DRIVER_HOST") or socket.gethostname()
        conf["spark.driver.bindAddress"] = "0.0.0.0"
    conf.update(parse_spark_conf(env.get("LOWWATER_SPARK_CONF", "")))
    return conf


def kafka_options(env: Mapping[str, str]) -> dict[str, str]:
    """``LOWWATER_KAFKA_OPTIONS`` as a dict of ``kafka.*`` source options (string values)."""
    raw = (env.get("LOWWATER_KAFKA_OPTIONS") or "").strip()
    if not raw:
        return {}
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"LOWWATER_KAFKA_OPTIONS is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("LOWWATER_KAFKA_OPTIONS must be a JSON object")
    bad = sorted(k for k in obj if not str(k).startswith("kafka."))
    if bad:
        raise ValueError(f"LOWWATER_KAFKA_OPTIONS: keys must start with 'kafka.': {bad}")
    return {str(k): str(v) for k, v in obj.items()}


def install(env: Mapping[str, str], job: Any = None, spark_session: Any = None) -> None:
    """Wrap ``spark_session.build_spark`` and ``job.options_from_args`` with the settings of ``env``."""
    if job is None:
        from high_level import job
    if spark_session is None:
        from local_stack import spark_session
    orig_build = spark_session.build_spark
    orig_options = job.options_from_args
    kopts = kafka_options(env)
    spark_conf(env, "local")  # fail now, not at the first session, on a malformed LOWWATER_SPARK_CONF

    def build_spark(app_name: str, master: str = "local[2]", extra_conf: Mapping[str, str] | None = None,
                    **kwargs: Any) -> Any:  # fmt: skip
        conf = spark_conf(env, master)
        conf.update(extra_conf or {})
        return orig_build(app_name, master, conf, **kwargs)

    def options_from_args(args: Any) -> Any:
        opts = orig_options(args)
        if not kopts:
            return opts
        return dataclasses.replace(opts, kafka_options={**opts.kafka_options, **kopts})

    spark_session.build_spark = build_spark
    job.options_from_args = options_from_args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        install(os.environ)
    except ValueError as exc:
        print(f"job_launcher: {exc}", file=sys.stderr)
        return 2
    from high_level import job

    return int(job.main(list(sys.argv[1:] if argv is None else argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
