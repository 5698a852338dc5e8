"""Settings of every role: defaults < settings file < LOWWATER_<ROLE>_* environment < flags, one
shared Kafka security block, and bad settings refused with where they came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.kafka_security import KafkaSecurity
from contract.settings import SettingsError, load
from high_level.cli import settings_from
from high_level.serve.settings import ApiSettings
from low_level.settings import AgentSettings

SASL = {
    "protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "username": "job-1",
    "password": "s3cret pw",
    "ca_file": "/etc/lowwater/kafka/ca.pem",
}


def test_precedence_default_file_env_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("results: /from-file\ncheckpoint: /ck\ntrigger: 5s\nmaster: local[4]\nhost_timeout: 30s\n")
    monkeypatch.setenv("LOWWATER_JOB_TRIGGER", "2s")  # env beats the file
    monkeypatch.setenv("LOWWATER_JOB_MASTER", "local[3]")
    s = settings_from(["--settings", str(f), "--master", "local[1]"])  # the flag beats both
    assert (s.results, s.trigger, s.master, s.host_timeout, s.bootstrap) == (
        "/from-file",
        "2s",
        "local[1]",
        "30s",
        "127.0.0.1:9092",
    )
    o = s.options()
    assert o.trigger_ms == 2000 and o.host_timeout_ms == 30_000 and o.shuffle_partitions == 1


def test_one_security_block_for_both_clients_of_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOWWATER_JOB_KAFKA_SECURITY", json.dumps(SASL))
    s = settings_from(
        ["--results", "/r", "--checkpoint", "/c", "--kafka-option", "kafka.isolation.level=read_committed"]
    )
    o = s.options()
    assert o.kafka_security.kafka_python() == {  # the topic provisioning's admin client
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "job-1",
        "sasl_plain_password": "s3cret pw",
        "ssl_cafile": "/etc/lowwater/kafka/ca.pem",
    }
    src = o.source_options  # the Kafka source: the same block, and the extra option
    assert src["kafka.security.protocol"] == "SASL_SSL" and src["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert 'ScramLoginModule required username="job-1" password="s3cret pw";' in src["kafka.sasl.jaas.config"]
    assert (
        src["kafka.ssl.truststore.location"] == "/etc/lowwater/kafka/ca.pem"
        and src["kafka.isolation.level"] == "read_committed"
    )
    assert "s3cret" not in repr(s), "the password must not show in logs or reprs"


def test_kafka_source_fails_over_within_seconds_and_flags_override() -> None:
    """Spark's listOffsets after a leader's death waits out default.api.timeout.ms: the job bounds it, with
    more retries so a slow broker is retried as long as with Kafka's defaults (bench_recovery measures it)."""
    src = settings_from(["--results", "/r", "--checkpoint", "/c"]).options().source_options
    api, req = int(src["kafka.default.api.timeout.ms"]), int(src["kafka.request.timeout.ms"])
    assert api <= 10_000 and req <= api
    patience = int(src["fetchOffset.numRetries"]) * (api + int(src["fetchOffset.retryIntervalMs"]))
    assert patience >= 3 * (60_000 + 1000), "a slow broker must be retried as long as with the defaults"
    flags = ["--results", "/r", "--checkpoint", "/c", "--kafka-option", "kafka.request.timeout.ms=30000"]
    src = settings_from(flags).options().source_options
    assert src["kafka.request.timeout.ms"] == src["kafka.default.api.timeout.ms"] == "30000"  # else refused


def test_nested_environment_and_agent_api_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOWWATER_AGENT_KAFKA_SECURITY__PROTOCOL", "SSL")
    monkeypatch.setenv("LOWWATER_AGENT_KAFKA_SECURITY__CA_FILE", "/ca.pem")
    monkeypatch.setenv("LOWWATER_AGENT_HOST_ID", "cap-7")
    a = load(AgentSettings, {"source": "pcap:/x.pcap"})
    assert a.host_id == "cap-7" and a.source == "pcap:/x.pcap" and a.metrics_port == 9101
    assert a.kafka_security.kafka_python() == {"security_protocol": "SSL", "ssl_cafile": "/ca.pem"}
    monkeypatch.setenv("LOWWATER_API_TOKEN", "t0k")
    monkeypatch.setenv("LOWWATER_API_RESULTS", "/results")
    api = load(ApiSettings, {"port": 8181})
    assert (
        api.token is not None
        and api.token.get_secret_value() == "t0k"
        and api.results == "/results"
        and api.port == 8181
    )


@pytest.mark.parametrize(
    ("env", "flags", "reason"),
    [
        ({}, {"protocol": "SASL_SSL"}, "needs sasl_mechanism, username and password"),
        ({}, {"protocol": "PLAINTEXT", "username": "u"}, r"need a SASL_\* protocol"),
        ({}, {"protocol": "SSL", "cert_file": "/c.pem"}, "go together"),
        ({}, {"protocol": "TLS"}, "Input should be"),
        (
            {},
            {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "username": "u", "password": 'a"b'},
            "no quote",
        ),
        ({}, {"protocl": "SSL"}, "Extra inputs"),
    ],
)
def test_bad_security_blocks_are_refused(env: dict, flags: dict, reason: str) -> None:
    with pytest.raises(SettingsError, match=reason) as e:
        load(AgentSettings, {"kafka_security": flags})
    assert "kafka_security" in str(e.value) and "LOWWATER_AGENT_KAFKA_SECURITY" in str(e.value)


def test_bad_values_name_the_setting_and_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="trigger.*not a duration.*LOWWATER_JOB_TRIGGER"):
        settings_from(["--results", "/r", "--checkpoint", "/c", "--trigger", "soon"])
    with pytest.raises(SettingsError, match="spark_conf.*start with 'spark.'"):
        settings_from(["--results", "/r", "--checkpoint", "/c", "--spark-conf", "executor.memory=2g"])
    with pytest.raises(SettingsError, match="kafka_options.*security goes in kafka_security"):
        settings_from(
            ["--results", "/r", "--checkpoint", "/c", "--kafka-option", "kafka.sasl.mechanism=PLAIN"]
        )
    with pytest.raises(SettingsError, match="results: Field required"):
        settings_from(["--checkpoint", "/c"])
    monkeypatch.setenv("LOWWATER_API_PORT", "99999")
    with pytest.raises(SettingsError, match="port.*LOWWATER_API_PORT"):
        load(ApiSettings, {"results": "/r"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("results: /r\ncheckpoint: [unclosed\n")
    with pytest.raises(SettingsError, match=rf"{bad}:\d+: not YAML"):
        settings_from(["--settings", str(bad)])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("results: /r\ncheckpoint: /c\ntriger: 1s\n")
    with pytest.raises(SettingsError, match=f"triger: Extra inputs are not permitted.*{unknown}"):
        settings_from(["--settings", str(unknown)])


def test_broker_security_block_round_trips_through_a_child_process_flag() -> None:
    """What a test or an operator hands a child process (``revealed``) validates back to the same block."""
    k = KafkaSecurity(**SASL)
    assert KafkaSecurity.model_validate_json(json.dumps(k.revealed())) == k
    assert KafkaSecurity().kafka_python() == {} and KafkaSecurity().spark_options() == {}
    assert KafkaSecurity().librdkafka() == {}
    mtls = KafkaSecurity(protocol="SSL", ca_file="/ca", cert_file="/c", key_file="/k", check_hostname=False)
    assert mtls.librdkafka() == {  # the API's live reader (librdkafka) spelling of the same block
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca",
        "ssl.certificate.location": "/c",
        "ssl.key.location": "/k",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_the_api_live_reader_takes_the_shared_security_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lowwater-api``: the reader of the live topics (``--live-bootstrap``) authenticates with the same block
    as every role (flag, LOWWATER_API_KAFKA_SECURITY, settings file); a bad block is refused at start."""
    from high_level.serve.api import create_app, settings_of

    monkeypatch.setenv("LOWWATER_API_KAFKA_SECURITY", json.dumps(SASL))
    s = settings_of(
        ["--results", str(tmp_path), "--live-bootstrap", "kafka:9093", "--config", "configs/default.yaml"]
    )
    assert s.kafka_security == KafkaSecurity(**SASL) and s.live_bootstrap == "kafka:9093"
    app = create_app(s.config, s.results, live_bootstrap=s.live_bootstrap, live_security=s.kafka_security)
    assert (
        app.state.live_source.config
        == {  # the consumer's settings: the job's own block, spelled for librdkafka
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "job-1",
            "sasl.password": "s3cret pw",
            "ssl.ca.location": "/etc/lowwater/kafka/ca.pem",
        }
    )
    monkeypatch.delenv("LOWWATER_API_KAFKA_SECURITY")
    flag = settings_of(["--results", "/r", "--kafka-security", '{"protocol": "SSL", "ca_file": "/ca.pem"}'])
    assert flag.kafka_security.kafka_python() == {"security_protocol": "SSL", "ssl_cafile": "/ca.pem"}
    assert (
        create_app("configs/default.yaml", tmp_path, live_bootstrap="k:9092").state.live_source.config == {}
    )
    with pytest.raises(SystemExit, match="--kafka-security is not JSON"):
        settings_of(["--results", "/r", "--kafka-security", "{protocol: SSL"])
    with pytest.raises(SystemExit, match="kafka_security.*needs sasl_mechanism.*LOWWATER_API_KAFKA_SECURITY"):
        settings_of(["--results", "/r", "--kafka-security", '{"protocol": "SASL_SSL"}'])


def test_the_job_takes_its_connector_jars_from_its_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job never falls back to the dev stand-ins (local_stack) for its Spark Kafka jars: without
    --spark-jars / LOWWATER_JOB_SPARK_JARS it stops before Spark with a clear reason; a directory stands
    for its jar files (what the central image passes)."""
    from high_level import cli
    from high_level.cluster.session import connector_jars

    monkeypatch.delenv("LOWWATER_JOB_SPARK_JARS", raising=False)
    config = str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml")
    rc = cli.main(["--config", config, "--results", str(tmp_path / "r"), "--checkpoint", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert (
        rc == 2
        and "--spark-jars" in err
        and "LOWWATER_JOB_SPARK_JARS" in err
        and not (tmp_path / "r").exists()
    )
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("b.jar", "a.jar", "README"):
        (jars / name).touch()
    monkeypatch.setenv("LOWWATER_JOB_SPARK_JARS", json.dumps([str(jars), "/opt/x.jar"]))
    s = settings_from(["--results", "/r", "--checkpoint", "/c"])
    assert connector_jars(s.spark_jars) == [str(jars / "a.jar"), str(jars / "b.jar"), "/opt/x.jar"]
    assert settings_from(
        ["--results", "/r", "--checkpoint", "/c", "--spark-jars", "/a.jar, /b"]
    ).spark_jars == ["/a.jar", "/b"]


def test_expected_rate_sizes_the_trigger_for_the_driver() -> None:
    """--expected-rate: batches of about RATE_BATCH_RECORDS (the driver's cost per batch is fixed), never a
    shorter trigger than asked, never longer than MAX_RATE_TRIGGER_MS (a window's latency)."""
    from high_level.options import MAX_RATE_TRIGGER_MS, RATE_BATCH_RECORDS, rate_trigger_ms

    base = ["--results", "/r", "--checkpoint", "/c"]
    assert settings_from(base).options().trigger_ms == 1000  # no rate: the trigger as given
    rate = RATE_BATCH_RECORDS / 4  # 4 s of traffic make a batch
    assert settings_from([*base, "--expected-rate", str(rate)]).options().trigger_ms == 4000
    assert (
        settings_from([*base, "--expected-rate", str(rate), "--trigger", "6s"]).options().trigger_ms == 6000
    )
    assert rate_trigger_ms(1000, RATE_BATCH_RECORDS * 10) == 1000  # a high rate fills 1 s batches
    assert rate_trigger_ms(1000, 1.0) == MAX_RATE_TRIGGER_MS  # a trickle waits no longer than the cap
    with pytest.raises(ValueError, match="expected_rate"):
        settings_from([*base, "--expected-rate", "0"])


@pytest.mark.parametrize(
    "value, want",
    [
        (
            "capture-01,capture-02",
            ("capture-01", "capture-02"),
        ),  # as deploy/README.md and env.example write it
        (" capture-01/w0 , capture-01/w1 ", ("capture-01/w0", "capture-01/w1")),
        ('["replay-01", "live-01"]', ("replay-01", "live-01")),
        ("", ()),
    ],
)
def test_expected_hosts_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, want: tuple
) -> None:
    """``LOWWATER_JOB_EXPECTED_HOSTS`` takes the comma list the deploy guide shows, or a JSON list."""
    monkeypatch.setenv("LOWWATER_JOB_EXPECTED_HOSTS", value)
    assert settings_from(["--results", "/r", "--checkpoint", "/c"]).options().expected_hosts == want
