"""Kafka with authentication: SASL/PLAIN (and SASL over TLS) from the capture agent to Spark.

Why: in a deployment the agents and the job reach Kafka with credentials (issue: "Kafka SASL/TLS
settings passed through config"). These tests run the real pieces against real brokers that refuse
unauthenticated clients (their own, not the session's PLAINTEXT broker):

* the ``lowwater-agent`` CLI with ``--kafka-security JSON`` creates its topic (``ensure_topics`` through
  ``contract.topics.connect`` with the same settings) and delivers partials and punctuation;
* an agent with a wrong password, and one without credentials, deliver nothing, keep capturing and
  count connect errors (they run in the background from the start of the module, because
  kafka-python gives up a bootstrap only after ``bootstrap_timeout_ms``, 30 s by default);
* Spark's Kafka source reads the topic through :func:`high_level.aggregate.ingest.kafka_stream` with
  ``kafka.*`` security options, and fails with the broker's reason when the password is wrong;
* with ACLs enforced, the agent's principal needs only WRITE and CREATE on its topics (CREATE for
  ``ensure_topics``; WRITE alone once kafka-init has provisioned them) and the job's only READ;
  neither can do the other's part; ``create_topics.py --kafka-security`` provisions topics;
* the same over SASL_SSL with a broker certificate signed by a throwaway CA (``ssl_cafile`` for
  kafka-python, a PEM truststore for Spark), and a client that does not trust that CA is refused.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dpkt
import numpy as np
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)

from contract import query as Q
from contract import wire
from contract.kafka_security import KafkaSecurity, check_sasl_credentials
from contract.topics import connect, existing_partitions
from local_stack.kafka_broker import KafkaBroker, free_port
from lowwater_testing.agent import agent_cmd
from lowwater_testing.queries import config, pairs
from lowwater_testing.spark import read_available
from lowwater_testing.traffic import build_frames, make_traffic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.kafka]
REPO = Path(__file__).resolve().parents[1]
NS = 1_000_000_000
T0 = 1_700_000_000 * NS
AGENT, JOB = "capture-01", "lowwater-job"  # principals besides the broker's own "admin"
WRITER = "capture-02"  # an agent principal with WRITE only, for topics that kafka-init provisioned
PACKETS = 20_000
PREFIX = "lowwater-sec"  # the ACLs of the SASL broker cover the topics whose names start with this


def _users() -> dict[str, str]:
    return {name: secrets.token_urlsafe(18) for name in ("admin", AGENT, WRITER, JOB)}


def _query_yaml(path: Path, topic: str, partitions: int) -> Path:
    return config(pairs(heartbeat={"interval": "200ms"}, topic=topic, partitions=partitions)).write(path)


def _agent_cmd(
    cfg: Path, source: str, host: str, bootstrap: str, security: KafkaSecurity | None, metrics_port: int = 0
) -> list[str]:
    cmd = agent_cmd(cfg, source, host=host, bootstrap=bootstrap, metrics_port=metrics_port)
    if security is not None:
        cmd += ["--kafka-security", json.dumps(security.revealed())]
    return cmd


def read_topic(
    bootstrap: str, topic: str, security: Mapping[str, Any], timeout: float = 30.0
) -> dict[tuple[int, int], bytes]:
    """Every record of ``topic`` as (partition, offset) -> value, read with kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **security)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert tps, f"topic {topic} has no partitions"
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        want = sum(consumer.end_offsets(tps).values())
        got: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update(((r.partition, r.offset), r.value) for r in records)
    finally:
        consumer.close()
    assert len(got) == want, f"read {len(got)} of {want} records of {topic}"
    return got


def spark_read(
    spark: SparkSession, bootstrap: str, topic: str, extra: Mapping[str, str], checkpoint: Path
) -> dict[tuple[int, int], bytes]:
    """Every record of ``topic`` read once by the job's Kafka source (availableNow into a memory sink)."""
    from high_level.aggregate.ingest import kafka_stream

    rows = read_available(kafka_stream(spark, bootstrap, [topic], extra=extra), checkpoint, timeout_s=120)
    assert {r["topic"] for r in rows} == {topic}
    return {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows}


def emit_some(bootstrap: str, security: Mapping[str, Any], q: Q.QuerySpec, host: str, n: int) -> None:
    """An in-process Emitter (``producer_config`` = ``security``, ``ensure_topics`` on) delivers ``n``
    partials and one punctuation per partition."""
    from low_level.host.emit import Emitter

    em = Emitter([q], host, bootstrap, producer_config=dict(security))
    try:
        key = np.random.default_rng(3).integers(0, 1 << 40, (n, Q.key_width(q))).astype(np.int64)
        state = np.ones((n, len(Q.state_columns(q))), dtype=np.int64)
        em.submit(q.name, np.full(n, 7, dtype=np.int64), key, state)
        em.punctuate(q.name, 7, 8 * 10**9, {"packets": n})
        deadline = time.monotonic() + 60
        while em.producer is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert em.producer is not None, f"not connected ({em.connect_errors} connect errors)"
        assert em.flush(30)
    finally:
        em.close()
    assert em.connect_errors == 0 and em.stats.delivery_failures == 0 and em.stats.send_errors == 0


def _check_emitted(records: Mapping[tuple[int, int], bytes], n: int, partitions: int) -> None:
    batches = [wire.decode(v) for _, v in sorted(records.items())]
    assert sum(b.n for b in batches if isinstance(b, wire.Partials)) == n
    assert sorted(b.partition for b in batches if isinstance(b, wire.Punctuation)) == list(range(partitions))


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"lowwater_agent_{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric lowwater_agent_{name} not in /metrics")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


# -- brokers --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A SASL_PLAINTEXT broker (PLAIN mechanism) with ACLs: admin is a super user, the agent may write
    and create ``lowwater-sec*`` topics, the job may read them; nobody else may do anything."""
    broker = KafkaBroker(
        "sasl", port=0, state=tmp_path_factory.mktemp("kafka-sasl"), sasl_users=_users(), acls=True
    )
    broker.start()
    try:
        topics = ResourcePattern(ResourceType.TOPIC, PREFIX, ACLResourcePatternType.PREFIXED)
        grants = [
            (AGENT, ACLOperation.WRITE),
            (AGENT, ACLOperation.CREATE),
            (WRITER, ACLOperation.WRITE),
            (JOB, ACLOperation.READ),
        ]
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, **broker.client_security())
        try:
            result = admin.create_acls(
                [ACL(f"User:{user}", "*", op, ACLPermissionType.ALLOW, topics) for user, op in grants]
            )
        finally:
            admin.close()
        assert not result["failed"], result
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A SASL_SSL broker whose certificate (IP:127.0.0.1) is signed by a CA made for it."""
    broker = KafkaBroker(
        "sasl-ssl", port=0, state=tmp_path_factory.mktemp("kafka-sasl-ssl"), sasl_users=_users(), tls=True
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


# -- refused agents: started first, checked last -----------------------------------------------------
class RefusedAgent:
    def __init__(self, label: str, cmd: list[str], metrics_port: int, log: Path) -> None:
        self.label, self.metrics_port, self.log = label, metrics_port, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
            )
        self.started = time.monotonic()

    def metrics(self) -> str:
        return _scrape(self.metrics_port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its graceful stop would wait 10 s for Kafka
        self.proc.wait(10)


@pytest.fixture(scope="module", autouse=True)
def refused_agents(
    sasl_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Two agents on generated traffic that the SASL broker must refuse: wrong password, no credentials.

    Autouse so that they start with the module: each connect attempt of theirs ends only when
    kafka-python's bootstrap times out (30 s), and the other tests run meanwhile.
    """
    tmp = tmp_path_factory.mktemp("refused")
    topic = sasl_broker.create_topic(f"{PREFIX}-refused-{uuid.uuid4().hex[:6]}", 2)
    cfg = _query_yaml(tmp / "q.yaml", topic, 2)
    source = "generator:rate=2000,groups=200,clock=wall"
    cases = {
        "wrong-password": sasl_broker.security(AGENT, password="not-" + sasl_broker.sasl_users[AGENT]),
        "no-credentials": None,  # the agent's default: a PLAINTEXT client
    }
    agents = {}
    try:
        for label, security in cases.items():
            port = free_port()
            cmd = _agent_cmd(cfg, source, f"refused-{label}", sasl_broker.bootstrap_servers, security, port)
            agents[label] = RefusedAgent(label, cmd, port, tmp / f"{label}.log")
        yield {"topic": topic, "agents": agents}
    finally:
        for agent in agents.values():
            agent.stop()


# -- fast checks of the broker config ------------------------------------------------------------
def test_broker_config_for_sasl_and_acls(tmp_path: Path) -> None:
    plain = KafkaBroker("p", port=0, state=tmp_path)._config()
    assert "authorizer.class.name" not in plain
    assert (
        plain["listeners"].startswith("PLAINTEXT://127.0.0.1:")
        and plain["inter.broker.listener.name"] == "PLAINTEXT"
    )
    assert not any(k.startswith(("sasl.", "ssl.", "listener.name.")) for k in plain), (
        "PLAINTEXT stays as before"
    )
    assert KafkaBroker("p", port=0, state=tmp_path).client_security() == {}

    users = {"admin": "a-pw", "capture-01": "c-pw"}
    cfg = KafkaBroker("s", port=0, state=tmp_path, sasl_users=users)._config()
    assert cfg["listener.security.protocol.map"] == "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert "PLAINTEXT://" not in cfg["listeners"].replace("SASL_PLAINTEXT://", ""), (
        "no unauthenticated client port"
    )
    assert cfg["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert cfg["sasl.enabled.mechanisms"] == cfg["sasl.mechanism.inter.broker.protocol"] == "PLAIN"
    assert cfg["listener.name.sasl_plaintext.plain.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="a-pw"'
        ' user_admin="a-pw" user_capture-01="c-pw";'
    )
    for bad in ({"a b": "x"}, {"u": 'qu"ote'}, {"u": "back\\slash"}, {"u": ""}, {"u": "new\nline"}):
        with pytest.raises(ValueError):
            check_sasl_credentials(bad)
    with pytest.raises(ValueError):
        KafkaBroker("s", port=0, state=tmp_path, sasl_users=users, admin_user="nobody")
    with pytest.raises(ValueError):
        KafkaBroker("a", port=0, state=tmp_path, acls=True)  # ACLs need authenticated principals
    acl = KafkaBroker("a", port=0, state=tmp_path, sasl_users=users, acls=True)._config()
    assert (
        acl["super.users"] == "User:admin;User:ANONYMOUS" and acl["allow.everyone.if.no.acl.found"] == "false"
    )


# -- SASL_PLAINTEXT: agent CLI -> Kafka -> kafka-python and Spark ----------------------------------
@pytest.fixture(scope="module")
def delivered(sasl_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A pcap replayed by the real ``lowwater-agent`` CLI with ``--kafka-security``, to a topic it creates."""
    tmp = tmp_path_factory.mktemp("delivered")
    topic = f"{PREFIX}-{uuid.uuid4().hex[:8]}"  # not created here: the agent's ensure_topics does it
    cfg = _query_yaml(tmp / "q.yaml", topic, 2)
    t = make_traffic(PACKETS, 500, T0, 10 * NS, seed=5)
    frames, _cap, _wl, ts = build_frames(t)
    pcap = tmp / "t.pcap"
    with pcap.open("wb") as fh:
        w = dpkt.pcap.Writer(fh, nano=True)
        for i in range(PACKETS):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / NS)
    security = sasl_broker.security(AGENT)
    assert security.kafka_python() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": AGENT,
        "sasl_plain_password": sasl_broker.sasl_users[AGENT],
    }
    proc = subprocess.run(
        _agent_cmd(cfg, f"pcap:{pcap}", "cap-sasl", sasl_broker.bootstrap_servers, security),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"topic": topic, "stderr": proc.stderr}


def test_agent_delivers_partials_and_punctuation_over_sasl(
    sasl_broker: KafkaBroker, delivered: dict[str, Any]
) -> None:
    topic = delivered["topic"]
    assert f"topic {topic}: created with 2 partitions" in delivered["stderr"], (
        "ensure_topics must run with the credentials"
    )
    assert "Kafka not reachable" not in delivered["stderr"]
    records = read_topic(sasl_broker.bootstrap_servers, topic, sasl_broker.client_security(JOB))
    assert {p for p, _ in records} == {0, 1}, (
        "the agent's ensure_topics made 2 partitions (auto-create makes 1)"
    )
    packets = 0
    seq: dict[int, int] = {}
    ends: dict[int, wire.Punctuation] = {}
    for (part, _off), value in sorted(records.items()):
        b = wire.decode(value)
        assert b.host == "cap-sasl" and b.partition == part
        if isinstance(b, wire.Partials):
            seq[part] = seq.get(part, 0) + b.n
            packets += int(b.state[:, 0].sum())
        else:
            assert b.seq == seq.get(part, 0), "punctuation counts the partials before it"
            if b.mark_pane == wire.END_OF_STREAM:
                ends[part] = b
    assert packets == PACKETS, "every packet of the pcap is counted exactly once"
    assert set(ends) == {0, 1}, "every partition gets the closing punctuation"
    assert all(p.stats["packets"] == PACKETS for p in ends.values())


def test_spark_kafka_source_reads_over_sasl(
    sasl_broker: KafkaBroker, spark: SparkSession, delivered: dict[str, Any], tmp_path: Path
) -> None:
    topic = delivered["topic"]
    password = sasl_broker.sasl_users[JOB]
    extra = {  # what LOWWATER_KAFKA_OPTIONS / the job's kafka_options carry in a deployment
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{JOB}" password="{password}";',
    }
    assert extra == sasl_broker.spark_kafka_options(JOB)
    got = spark_read(spark, sasl_broker.bootstrap_servers, topic, extra, tmp_path / "ck")
    assert got == read_topic(sasl_broker.bootstrap_servers, topic, sasl_broker.client_security(JOB))
    kinds = Counter(type(wire.decode(v)).__name__ for v in got.values())
    assert kinds["Partials"] > 0 and kinds["Punctuation"] >= 2
    assert (
        sum(int(b.state[:, 0].sum()) for b in map(wire.decode, got.values()) if isinstance(b, wire.Partials))
        == PACKETS
    )

    from pyspark.errors import StreamingQueryException

    wrong = sasl_broker.spark_kafka_options(JOB, password="not-" + password)
    with pytest.raises(StreamingQueryException, match="Invalid username or password"):
        spark_read(spark, sasl_broker.bootstrap_servers, topic, wrong, tmp_path / "ck-wrong")


def test_wrong_or_missing_credentials_are_refused(
    sasl_broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A kafka-python client with a wrong password gets the broker's reason; one without SASL gets nowhere."""
    caplog.set_level(logging.WARNING, logger="kafka")
    for security in (sasl_broker.client_security(AGENT, password="wrong"), {}):
        with pytest.raises(Exception, match="Unable to bootstrap"):
            KafkaAdminClient(
                bootstrap_servers=sasl_broker.bootstrap_servers, bootstrap_timeout_ms=3000, **security
            )
    # the broker's reason reaches the client only when it reads the SASL response before the broker
    # closes the socket (a race in kafka-python); the broker's own log is the authoritative record
    assert (
        "Authentication failed: Invalid username or password" in caplog.text
        or "socket disconnected" in caplog.text
    )
    assert "Failed authentication with /127.0.0.1" in sasl_broker.log_tail(400), "the broker logs the refusal"


def test_acls_give_each_principal_only_its_role(
    sasl_broker: KafkaBroker, delivered: dict[str, Any], tmp_path: Path
) -> None:
    """The agent (WRITE, CREATE) cannot read; the job (READ) cannot write; nobody creates other topics;
    WRITE alone is enough for an agent whose topics exist already."""
    from kafka.errors import KafkaError, TopicAuthorizationFailedError

    from contract.topics import connect, ensure_topics

    topic, bootstrap = delivered["topic"], sasl_broker.bootstrap_servers
    with pytest.raises(TopicAuthorizationFailedError):
        read_topic(bootstrap, topic, sasl_broker.client_security(AGENT))
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, max_block_ms=10_000, **sasl_broker.client_security(JOB)
    )
    try:
        with pytest.raises(KafkaError, match="AuthorizationFailed"):
            producer.send(topic, b"not from an agent", partition=0).get(timeout=10)
    finally:
        producer.close(timeout=2)
    admin = connect(bootstrap, sasl_broker.client_security(AGENT), 10)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            ensure_topics(admin, {f"other-{uuid.uuid4().hex[:6]}": 1})
    finally:
        admin.close()

    provisioned = sasl_broker.create_topic(f"{PREFIX}-provisioned-{uuid.uuid4().hex[:6]}", 2)  # as kafka-init
    q = Q.load(_query_yaml(tmp_path / "q.yaml", provisioned, 2)).queries[0]
    emit_some(bootstrap, sasl_broker.client_security(WRITER), q, "cap-2", 500)
    _check_emitted(read_topic(bootstrap, provisioned, sasl_broker.client_security(JOB)), 500, 2)


def test_job_provisions_its_topics_with_its_security_block(sasl_broker: KafkaBroker, tmp_path: Path) -> None:
    """The job creates missing topics before its Kafka source starts, with the same security block as the
    source: on a SASL broker with ACLs that works with the block, and fails (clearly) without it."""
    from high_level.job import HighLevelJob, JobOptions

    topic = f"{PREFIX}-job-{uuid.uuid4().hex[:6]}"
    q = Q.load(_query_yaml(tmp_path / "q.yaml", topic, 3)).queries[0]

    def job(security: KafkaSecurity) -> HighLevelJob:
        opts = JobOptions(
            bootstrap=sasl_broker.bootstrap_servers,
            results=str(tmp_path / "r"),
            checkpoint=str(tmp_path / "c"),
            kafka_security=security,
        )
        return HighLevelJob(None, [q], opts)

    with pytest.raises(RuntimeError, match="not reachable"):
        job(KafkaSecurity()).provision_topics(deadline_s=5)  # a PLAINTEXT client on the SASL listener
    assert job(sasl_broker.security(AGENT)).provision_topics() == {topic: "created with 3 partitions"}
    admin = connect(sasl_broker.bootstrap_servers, sasl_broker.client_security(), 10)
    try:
        assert existing_partitions(admin, [topic]) == {topic: 3}
    finally:
        admin.close()


def test_create_topics_script_with_kafka_security(sasl_broker: KafkaBroker, tmp_path: Path) -> None:
    """kafka-init's script with ``--kafka-security``: the agent's principal (CREATE on its topics) suffices."""
    topic = f"{PREFIX}-init-{uuid.uuid4().hex[:6]}"
    cfg = _query_yaml(tmp_path / "q.yaml", topic, 3)
    cmd = [
        sys.executable,
        str(REPO / "deploy" / "docker" / "create_topics.py"),
        "--config",
        str(cfg),
        "--bootstrap",
        sasl_broker.bootstrap_servers,
        "--wait",
        "20",
        "--kafka-security",
        json.dumps(sasl_broker.security(AGENT).revealed()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{topic}: created with 3 partitions" in proc.stderr
    admin = KafkaAdminClient(bootstrap_servers=sasl_broker.bootstrap_servers, **sasl_broker.client_security())
    try:
        (desc,) = admin.describe_topics([topic])
    finally:
        admin.close()
    assert len(desc["partitions"]) == 3


# -- SASL_SSL -------------------------------------------------------------------------------------------
def test_emitter_and_spark_over_sasl_ssl(
    tls_broker: KafkaBroker, spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert tls_broker.security_protocol == "SASL_SSL"
    topic = f"lowwater-tls-{uuid.uuid4().hex[:8]}"  # created by the Emitter's ensure_topics
    q = Q.load(_query_yaml(tmp_path / "q.yaml", topic, 2)).queries[0]
    security = tls_broker.client_security(AGENT)
    assert security["ssl_cafile"] == str(tls_broker.ca_file)
    assert tls_broker.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")
    emit_some(tls_broker.bootstrap_servers, security, q, "cap-tls", 3000)
    got = read_topic(tls_broker.bootstrap_servers, topic, tls_broker.client_security(JOB))
    _check_emitted(got, 3000, 2)

    opts = tls_broker.spark_kafka_options(JOB)
    assert opts["kafka.ssl.truststore.type"] == "PEM" and opts["kafka.security.protocol"] == "SASL_SSL"
    assert spark_read(spark, tls_broker.bootstrap_servers, topic, opts, tmp_path / "ck") == got

    # A client that does not trust the CA never gets to authenticate.
    caplog.set_level(logging.WARNING, logger="kafka")
    untrusting = {k: v for k, v in security.items() if k != "ssl_cafile"}
    with pytest.raises(Exception, match="Unable to bootstrap"):
        KafkaAdminClient(
            bootstrap_servers=tls_broker.bootstrap_servers, bootstrap_timeout_ms=3000, **untrusting
        )
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


# -- last: the refused agents ---------------------------------------------------------------------------
def test_refused_agents_keep_capturing_and_deliver_nothing(
    sasl_broker: KafkaBroker, refused_agents: dict[str, Any]
) -> None:
    agents: dict[str, RefusedAgent] = refused_agents["agents"]
    # agent start includes compiling its kernel (tens of seconds on a loaded machine with a cold cache)
    deadline = min(a.started for a in agents.values()) + 240
    first: dict[str, str] = {}
    while len(first) < len(agents) and time.monotonic() < deadline:
        for label, agent in agents.items():
            assert agent.proc.poll() is None, f"{label} agent exited:\n{agent.log.read_text()[-3000:]}"
            try:
                first.setdefault(label, agent.metrics())
            except OSError:
                time.sleep(0.5)  # metrics server not up yet
    assert len(first) == len(agents), f"metrics never answered: {sorted(set(agents) - set(first))}"
    time.sleep(1.0)  # let capture go on between the two scrapes
    deadline = time.monotonic() + 80  # one connect attempt: 30 s bootstrap, and some slack
    while time.monotonic() < deadline:
        if all(_metric(a.metrics(), "kafka_connect_errors_total") >= 1 for a in agents.values()):
            break
        time.sleep(1)
    for label, agent in agents.items():
        text = agent.metrics()
        assert _metric(text, "kafka_connect_errors_total") >= 1, f"{label}: no connect error counted"
        assert _metric(text, "packets_captured_total") > _metric(first[label], "packets_captured_total"), (
            f"{label}: capture must go on while Kafka refuses the agent"
        )
        assert _metric(text, "backlog_records") > 0, f"{label}: partials wait in the backlog"
        assert (
            _metric(text, "kafka_records_sent_total") == 0 and _metric(text, "kafka_batches_sent_total") == 0
        )
    logs = {label: a.log.read_text() for label, a in agents.items()}
    # the reason reaches the client unless the broker closes the socket first (see above)
    assert (
        "Invalid username or password" in logs["wrong-password"]
        or "socket disconnected" in logs["wrong-password"]
    ), logs["wrong-password"][-3000:]
    for label, log in logs.items():
        assert "Kafka not reachable" in log, f"{label}: the agent must say that it cannot reach Kafka"
    records = read_topic(
        sasl_broker.bootstrap_servers, refused_agents["topic"], sasl_broker.client_security()
    )
    assert records == {}, "nothing from the refused agents reaches the topic"


def test_api_live_reader_over_sasl_ssl(tls_broker: KafkaBroker, tmp_path: Path) -> None:
    """The API's reader of the live topics (``--live-bootstrap``) takes the same security block as every role:
    with it the live values arrive over SASL_SSL; with a wrong password none do, and /live says why."""
    from fastapi.testclient import TestClient

    from contract import live as L
    from high_level.serve.api import create_app

    cfg = _query_yaml(tmp_path / "q.yaml", f"lowwater-tls-live-{uuid.uuid4().hex[:6]}", 1)
    admin = KafkaAdminClient(
        bootstrap_servers=tls_broker.bootstrap_servers, **tls_broker.client_security(JOB)
    )
    try:
        from kafka.admin import NewTopic

        admin.create_topics([NewTopic(L.live_topic("pairs"), 1, 1, topic_configs=L.TOPIC_CONFIG)])
    finally:
        admin.close()
    u = L.LiveUpdate(
        query="pairs",
        window_start_us=T0 // 1000,
        window_end_us=T0 // 1000 + 2_000_000,
        group={"src_ip": "10.0.0.1", "dst_ip": "10.0.0.2"},
        values={"packets": 42},
        final=True,
        version=3,
        published_ms=1,
        hosts_in_mark=1,
        hosts_expected=1,
        complete=True,
    )
    producer = KafkaProducer(
        bootstrap_servers=tls_broker.bootstrap_servers, **tls_broker.client_security(JOB)
    )
    producer.send(L.live_topic("pairs"), value=L.encode(u)[1], key=L.encode(u)[0]).get(30)
    producer.close()

    def values(security: KafkaSecurity, wait_s: float) -> tuple[list, dict]:
        app = create_app(
            cfg, tmp_path / "results", live_bootstrap=tls_broker.bootstrap_servers, live_security=security
        )
        with TestClient(app) as api:
            deadline = time.monotonic() + wait_s
            while True:
                got = api.get("/live/pairs/values").json()["values"]
                if got or time.monotonic() > deadline:
                    return got, api.get("/live").json()
                time.sleep(0.3)

    got, live = values(tls_broker.security(JOB), 60)
    assert [(v["values"], v["final"], v["version"]) for v in got] == [({"packets": 42}, True, 3)], live
    assert live["enabled"] and live["received"] == 1 and live["source_error"] == ""
    got, live = values(tls_broker.security(JOB, password="not-" + tls_broker.sasl_users[JOB]), 25)
    assert got == [] and live["received"] == 0 and live["source_error"], live  # refused, and said so
