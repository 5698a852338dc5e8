"""Shared fixtures: one real Kafka broker and one SparkSession per test session.

Both are session-scoped and lazy: pytest only builds a fixture when a collected test asks for
it, so a run of pure unit tests starts no JVM. Tests that use them are marked ``kafka`` /
``spark`` automatically, so ``-m "not kafka and not spark"`` selects the fast tests.
"""

from __future__ import annotations

import re
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from local_stack.kafka_broker import KafkaBroker

if TYPE_CHECKING:
    from fastapi.testclient import TestClient
    from pyspark.sql import SparkSession

TopicFactory = Callable[..., str]


def pytest_configure(config: pytest.Config) -> None:
    """Silence kafka-python's own use of deprecated importlib.resources calls (hundreds per run)."""
    for message in ("read_text is deprecated", "open_text is deprecated"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:DeprecationWarning")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by the services they need, so they can be selected or deselected with -m."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "kafka" in fixtures or "topic_factory" in fixtures:
            item.add_marker(pytest.mark.kafka)
        if "spark" in fixtures:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real single-node KRaft broker on a free port, with its data in a temp dir, for the whole session.

    Tests may kill() and restart() it (same port and data); it is stopped at the end.
    """
    broker = KafkaBroker("test", port=0, state=tmp_path_factory.mktemp("kafka-state"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession with the Kafka source for the whole session (JVM start is slow)."""
    from local_stack.spark_session import build_spark  # lazy: importing pyspark is not free

    session = build_spark("lowwater-tests", state=tmp_path_factory.mktemp("spark-state"))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def topic_factory(kafka: KafkaBroker, request: pytest.FixtureRequest) -> TopicFactory:
    """Create topics whose names are unique per call (and say which test made them).

    Call as ``topic_factory(partitions=2)``; optional ``prefix`` and ``config`` (topic configs).
    """
    default_prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:100]

    def make(partitions: int = 1, prefix: str | None = None, config: Mapping[str, str] | None = None) -> str:
        name = f"{prefix or default_prefix}-{uuid.uuid4().hex[:8]}"
        return kafka.create_topic(name, partitions, config)

    return make


@pytest.fixture(scope="module", params=["cached", "parquet"])
def client(request: pytest.FixtureRequest, store: Any) -> Iterator[TestClient]:
    """The API over the module's ``store`` fixture, twice: with the Arrow cache (fast paths) and with it
    off (DuckDB reads Parquet), so both paths answer every test that takes ``client``."""
    with warnings.catch_warnings():  # starlette's note that its TestClient will move to httpx2
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    from high_level.serve.api import create_app

    app = create_app(store.config, store.root, cache_mb=512 if request.param == "cached" else 0)
    with TestClient(app) as c:
        yield c


@pytest.fixture
def veth_pair():
    """A veth pair: host end in this namespace (up, 10.203.77.1/30, no IPv6), peer in a fresh netns."""
    from lowwater_testing.netns import NetnsUnavailable, veth_pair

    try:
        pair = veth_pair()
        ends = pair.__enter__()
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield ends
    finally:
        pair.__exit__(None, None, None)
