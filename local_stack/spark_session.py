"""The local SparkSession (tests, benchmarks): :func:`high_level.cluster.session.build_spark` with the jars
``./lw setup`` fetched and scratch space under the repo's state dir."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from high_level.cluster.session import build_spark as _build
from local_stack.jars import spark_kafka_jars, state_dir


def build_spark(
    app_name: str,
    master: str = "local[2]",
    extra_conf: Mapping[str, str] | None = None,
    *,
    state: Path | str | None = None,
) -> SparkSession:
    """A SparkSession for this machine (see :func:`high_level.cluster.session.build_spark`)."""
    return _build(app_name, master, extra_conf, jars=spark_kafka_jars(), state=state or state_dir())
