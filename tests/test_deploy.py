"""The deployment (Dockerfile, docker-compose.yml, deploy/) is consistent with itself and with the code.

Why: no Docker engine runs in CI, so nothing here starts a container. What can be checked statically
is checked: compose files are valid for docker-compose, Prometheus scrapes only what compose defines,
every metric a Grafana panel plots is one the code exports, the privileges are the minimal ones,
images are pinned, the compose commands are accepted by the real CLIs, and the deploy helper
scripts (topic creation, health check) do what they claim (the topic script against
the real Kafka broker).
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from lowwater_testing.compose import CENTRAL_CORE_SERVICES

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CENTRAL = REPO / "docker-compose.yml"
CAPTURE = DEPLOY / "capture-host" / "docker-compose.yml"
COMPOSE_FILES = (CENTRAL, CAPTURE)
DOCKERFILE = REPO / "Dockerfile"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "rules"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
ROLES = ("agent", "central")  # Dockerfile targets = pyproject extras = deploy/requirements-<role>.lock
LOCKS = {role: DEPLOY / f"requirements-{role}.lock" for role in ROLES}
# what a capture host must not install or import: the central roles' stack and the test/bench tools
NOT_ON_CAPTURE_HOSTS = (
    "pyspark",
    "py4j",
    "duckdb",
    "fastapi",
    "starlette",
    "uvicorn",
    "pandas",
    "dpkt",
    "scapy",
    "matplotlib",
)

# Values for the variables compose files require (${VAR:?...}), for `config` only.
REQUIRED_ENV = {
    "LOWWATER_AGENT_HOST_ID": "capture-test",
    "LOWWATER_AGENT_BOOTSTRAP": "central.example.net:9094",
}
# the env files the services read (env_file), as an operator copies them from the examples
ENV_FILES = {
    "CENTRAL_ENV_FILE": str(DEPLOY / "env.example"),
    "CAPTURE_ENV_FILE": str(DEPLOY / "capture-host" / "env.example"),
}
CAPTURE_CAPS = {"NET_RAW", "NET_ADMIN"}
LOWWATER_SERVICES_CMD = {"lowwater-agent", "lowwater-job", "lowwater-api"}


# -- helpers ----------------------------------------------------------------------------------------
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """Resolve compose ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}`` in strings."""
    env = {} if env is None else env
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, op, arg = m.group(1), m.group(2), m.group(3) or ""
            got = env.get(name)
            if op in (":-", ":?") and not got:
                return arg if op == ":-" else REQUIRED_ENV.get(name, "x")
            if op in ("-", "?") and got is None:
                return arg if op == "-" else REQUIRED_ENV.get(name, "x")
            return got or ""

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load_compose(path: Path) -> dict[str, Any]:
    """The compose file with YAML anchors/merges applied and variables set to their defaults."""
    return interpolate(yaml.safe_load(path.read_text()))


def services(path: Path) -> dict[str, dict[str, Any]]:
    return load_compose(path)["services"]


def command_of(svc: Mapping[str, Any]) -> list[str]:
    """The service's command, without the env_from_files.py wrapper (``python ...py VAR=FILE -- CMD``)."""
    cmd = svc.get("command") or []
    cmd = [str(c) for c in (cmd.split() if isinstance(cmd, str) else cmd)]
    if len(cmd) > 1 and cmd[1].endswith("/env_from_files.py") and "--" in cmd:
        cmd = cmd[cmd.index("--") + 1 :]
    return cmd


def flag(cmd: list[str], name: str) -> str | None:
    """Value of ``--name V`` in a command list (None when absent)."""
    return cmd[cmd.index(name) + 1] if name in cmd else None


def container_ports(svc: Mapping[str, Any]) -> set[int]:
    """Ports a service declares it listens on: ``expose`` plus the container side of ``ports``."""
    out = {int(str(p).split("/")[0]) for p in svc.get("expose", [])}
    for p in svc.get("ports", []):
        target = p.get("target") if isinstance(p, dict) else str(p).rsplit(":", 1)[-1]
        out.add(int(str(target).split("/")[0]))
    return out


def listening_port(svc: Mapping[str, Any]) -> int | None:
    """The port a lowwater process is told to listen on (``--metrics-port`` / ``--port``)."""
    cmd = command_of(svc)
    for name in ("--metrics-port", "--port"):
        if (v := flag(cmd, name)) is not None:
            return int(v)
    return None


def _load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compose_binary() -> list[str] | None:
    """docker-compose (installed with apt-get when missing and possible), else ``docker compose``."""
    exe = shutil.which("docker-compose")
    if exe is None and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "docker-compose"],
            capture_output=True,
            timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        exe = shutil.which("docker-compose")
    if exe is not None:
        return [exe]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


@pytest.fixture(scope="module")
def compose_cmd() -> list[str]:
    cmd = compose_binary()
    assert cmd is not None, (
        "neither docker-compose nor `docker compose` is available (./lw setup installs the "
        "Debian package docker-compose): compose files not validated"
    )
    return cmd


# -- compose files are valid ------------------------------------------------------------------------
@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_compose_file_passes_docker_compose_config(compose_cmd: list[str], path: Path) -> None:
    env = {**os.environ, **REQUIRED_ENV, **ENV_FILES}
    proc = subprocess.run(
        [*compose_cmd, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=120,
    )
    assert proc.returncode == 0, f"{' '.join(compose_cmd)} -f {path} config failed:\n{proc.stderr}"
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == set(services(path)), "compose and the test's own parsing disagree"


@pytest.mark.parametrize(
    ("path", "var"), [(CAPTURE, "LOWWATER_AGENT_HOST_ID"), (CAPTURE, "LOWWATER_AGENT_BOOTSTRAP")]
)
def test_compose_refuses_to_run_without_required_settings(
    compose_cmd: list[str], path: Path, var: str
) -> None:
    env = {k: v for k, v in {**os.environ, **REQUIRED_ENV, **ENV_FILES}.items() if k != var}
    proc = subprocess.run(
        [*compose_cmd, "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,
        timeout=120,
    )
    assert proc.returncode != 0 and var in proc.stderr, proc.stderr


def test_compose_service_hygiene() -> None:
    """Healthcheck, restart policy, memory limit on every long-running service; nothing privileged."""
    for path in COMPOSE_FILES:
        for name, svc in services(path).items():
            where = f"{path.relative_to(REPO)}: {name}"
            assert not svc.get("privileged"), f"{where} is privileged"
            assert "mem_limit" in svc, f"{where} has no memory limit"
            assert svc.get("restart") in ("unless-stopped", "always", "on-failure", "no"), where
            assert "no-new-privileges:true" in svc.get("security_opt", []), f"{where} lacks no-new-privileges"
            assert svc.get("cap_drop") == ["ALL"], f"{where} does not drop all capabilities"
            hc = svc.get("healthcheck")
            if svc.get("restart") == "no":  # one-shot jobs
                continue
            assert hc and not hc.get("disable"), f"{where} has no healthcheck"
            assert svc.get("image", "").split(":")[-1] not in ("", "latest"), f"{where}: image not pinned"


def test_central_compose_wiring() -> None:
    svcs = services(CENTRAL)
    assert {*CENTRAL_CORE_SERVICES, "grafana"} <= set(svcs)
    kafka = svcs["kafka"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller", "single-node KRaft combined mode"
    assert any(v.startswith("kafka-data:") for v in kafka["volumes"]), "Kafka data must be on a named volume"
    assert "kafka-data" in load_compose(CENTRAL)["volumes"]
    assert "INTERNAL://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert "EXTERNAL://" in env["KAFKA_ADVERTISED_LISTENERS"], "capture hosts need a host-reachable listener"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", (
        "topics come from kafka-init with their partitions"
    )
    # kafka-init before the job; the job and the workers share the checkpoint and the results at the same
    # paths (executors write the state store and the results files there); the API reads them read-only.
    assert svcs["job"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    ckpt = "lowwater-checkpoint:/var/lib/lowwater/checkpoint"
    assert ckpt in svcs["job"]["volumes"] and ckpt in svcs["spark-worker"]["volumes"]
    results = "lowwater-results:/var/lib/lowwater/results"
    assert results in svcs["job"]["volumes"] and results in svcs["spark-worker"]["volumes"]
    assert "lowwater-results:/var/lib/lowwater/results:ro" in svcs["api"]["volumes"]
    job = command_of(svcs["job"])
    assert svcs["job"]["environment"]["LOWWATER_JOB_MASTER"] == "spark://spark-master:7077"
    assert flag(job, "--results") == "/var/lib/lowwater/results"
    assert flag(job, "--checkpoint") == "/var/lib/lowwater/checkpoint"
    assert svcs["job"]["environment"]["LOWWATER_JOB_DRIVER_HOST"] == svcs["job"]["hostname"] == "job"
    # every lowwater service reads the same queries file at the same path, in its mounted directory (a
    # networks file the queries name relative to it is found there too)
    for path in COMPOSE_FILES:
        for name, svc in services(path).items():
            cmd = command_of(svc)
            if flag(cmd, "--config") is not None:
                assert flag(cmd, "--config") == "/etc/lowwater/queries/default.yaml", name
                assert any(str(v).endswith("configs:/etc/lowwater/queries:ro") for v in svc["volumes"]), name
    assert (REPO / "configs" / "default.yaml").is_file()


def cli_flags(module: str) -> set[str]:
    """The ``--flags`` in ``python -m module --help``."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout))


def test_compose_job_agent_and_topic_commands_are_accepted_by_the_real_clis() -> None:
    """The job's own parser takes the compose command; agent and kafka-init flags exist in their --help."""
    from high_level.cli import settings_from

    job = command_of(services(CENTRAL)["job"])
    assert job[0] == "lowwater-job"
    env = {k: v for k, v in services(CENTRAL)["job"]["environment"].items() if k.startswith("LOWWATER_JOB_")}
    assert env["LOWWATER_JOB_DRIVER_HOST"] == "job"
    with (
        pytest.MonkeyPatch.context() as mp
    ):  # the environment compose gives the job: env.example, then environment:
        for k, v in {**env_file_settings(DEPLOY / "env.example", "LOWWATER_JOB_"), **env}.items():
            mp.setenv(k, str(v))
        s = settings_from(job[1:])
    assert s.driver_host == "job" and s.spark_conf == {"spark.executor.memory": "2g"}
    assert s.master == "spark://spark-master:7077" and s.control_topic == "lowwater.control" and s.live
    assert s.alert_webhook == "http://alertmanager:9093/api/v2/alerts"
    assert s.metrics_port == listening_port(services(CENTRAL)["job"])
    s.options()
    agent_flags = cli_flags("low_level.cli")
    for path, name in ((CENTRAL, "agent-demo"), (CAPTURE, "agent")):
        cmd = command_of(services(path)[name])
        assert cmd[0] == "lowwater-agent"
        used = {c for c in cmd if c.startswith("--")}
        assert used <= agent_flags, f"{name}: unknown agent flags {used - agent_flags}"
    init = command_of(services(CENTRAL)["kafka-init"])
    assert {c for c in init if c.startswith("--")} <= cli_flags_of_script(
        DEPLOY / "docker" / "create_topics.py"
    )


def test_compose_api_command_is_accepted_by_the_real_cli() -> None:
    api = command_of(services(CENTRAL)["api"])
    assert api[0] == "lowwater-api"
    used = {c for c in api if c.startswith("--")}
    assert used <= cli_flags("high_level.serve.api"), used
    # the live reader authenticates with the central .env's Kafka security block, as the job does
    from high_level.serve.api import settings_of

    assert services(CENTRAL)["api"]["env_file"] == services(CENTRAL)["job"]["env_file"] == "./deploy/.env"
    example = env_file_settings(DEPLOY / "env.example", "LOWWATER_")
    assert example["LOWWATER_API_KAFKA_SECURITY"] == example["LOWWATER_JOB_KAFKA_SECURITY"]
    block = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "username": "job",
        "password": "pw",
        "ca_file": "/etc/lowwater/kafka/ca.pem",
    }
    for value, protocol in (("", "PLAINTEXT"), (json.dumps(block), "SASL_SSL")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LOWWATER_API_KAFKA_SECURITY", value)
            s = settings_of(api[1:])
        assert s.live_bootstrap == "kafka:9092" and s.kafka_security.protocol == protocol


def env_file_settings(path: Path, prefix: str) -> dict[str, str]:
    """The ``NAME=value`` lines of an env file whose name starts with prefix (commented ones too)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$", line.strip())
        if m and m.group(1).startswith(prefix):
            out[m.group(1)] = m.group(2)
    return out


@pytest.mark.parametrize(
    ("path", "roles"),
    [(DEPLOY / "env.example", ("job", "api")), (DEPLOY / "capture-host" / "env.example", ("agent",))],
)
def test_env_examples_use_one_naming_scheme_that_reaches_the_roles(
    path: Path, roles: tuple[str, ...]
) -> None:
    """Every LOWWATER_* name in an env file is LOWWATER_<ROLE>_<SETTING> of a role that reads the file
    (env_file), so it takes effect: no compose-only look-alikes, nothing silently ignored."""
    from high_level.serve.settings import ApiSettings
    from high_level.settings import JobSettings
    from low_level.settings import AgentSettings

    models = {"job": JobSettings, "api": ApiSettings, "agent": AgentSettings}
    names = env_file_settings(path, "LOWWATER_")
    assert names, path
    for name in names:
        role = next((r for r in roles if name.startswith(f"LOWWATER_{r.upper()}_")), None)
        assert role is not None, (
            f"{path.name}: {name} is not a setting of {roles} (compose-only names have no LOWWATER_)"
        )
        field = name[len(f"LOWWATER_{role.upper()}_") :].lower().split("__")[0]
        assert field in models[role].model_fields, f"{path.name}: {name}: {role} has no setting {field!r}"
    svcs = {**services(CENTRAL), **services(CAPTURE)}
    for role in roles:
        svc = {"job": "job", "api": "api", "agent": "agent"}[role]
        assert "env_file" in svcs[svc], f"{svc} does not read its env file"


def cli_flags_of_script(path: Path) -> set[str]:
    out = subprocess.run(
        [sys.executable, str(path), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout))


def test_secrets_are_files_shared_by_the_api_and_prometheus() -> None:
    """The API token exists once (a secret file): the API reads it through env_from_files.py, Prometheus
    sends it to scrape the API's protected /metrics. No secret sits in the compose environment."""
    compose = load_compose(CENTRAL)
    svcs = compose["services"]
    raw = svcs["api"]["command"]
    assert (
        raw[1] == "/app/deploy/docker/env_from_files.py"
        and "LOWWATER_API_TOKEN=/run/secrets/api_token" in raw
    )
    assert "api_token" in svcs["api"]["secrets"] and "api_token" in svcs["prometheus"]["secrets"]
    api_job = next(
        sc for sc in _prometheus()["scrape_configs"] if "api:8080" in sc["static_configs"][0]["targets"]
    )
    assert api_job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/api_token"}
    assert (
        svcs["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
        == "/run/secrets/grafana_admin_password"
    )
    assert "grafana_admin_password" in svcs["grafana"]["secrets"]
    for name, sec in compose["secrets"].items():
        assert sec["file"].startswith("./deploy/secrets/"), name
    assert "secrets/" in (DEPLOY / ".gitignore").read_text().split()
    for name, svc in svcs.items():
        for key in svc.get("environment", {}):
            assert not re.search(r"TOKEN|PASSWORD|SECRET", key) or key.endswith("__FILE"), (
                f"{name}: {key} in env"
            )


def test_env_from_files_wrapper(tmp_path: Path) -> None:
    wrapper = DEPLOY / "docker" / "env_from_files.py"
    mod = _load_module("lw_env_from_files", wrapper)
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    assert mod.read_env_files([f"LOWWATER_API_TOKEN={tok}"]) == {"LOWWATER_API_TOKEN": "s3cret"}
    (tmp_path / "empty").write_text("\n")
    for bad in ([f"X={tmp_path / 'missing'}"], [f"X={tmp_path / 'empty'}"], ["novalue"], [f"1X={tok}"]):
        with pytest.raises(ValueError):
            mod.read_env_files(bad)
    out = subprocess.run(
        [
            sys.executable,
            str(wrapper),
            f"TOK={tok}",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['TOK'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "s3cret", out.stderr
    out = subprocess.run(
        [sys.executable, str(wrapper), f"TOK={tmp_path / 'missing'}", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "cannot read" in out.stderr


# -- Prometheus scrapes what compose defines ---------------------------------------------------------
def _prometheus() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS.read_text())


def _seconds(v: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", v)
    assert m, v
    return int(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def test_the_job_is_scraped_at_least_once_per_exported_window() -> None:
    """An exported query's series change once per window slide: a longer scrape interval loses windows
    (bytes_per_dst24's 10-s windows scraped every 15 s: one in three never reached Prometheus)."""
    from contract import query as Q

    cfg = _prometheus()
    job = next(sc for sc in cfg["scrape_configs"] if sc["job_name"] == "lowwater-job")
    interval = _seconds(job.get("scrape_interval", cfg["global"]["scrape_interval"]))
    assert _seconds(job.get("scrape_timeout", cfg["global"]["scrape_timeout"])) < interval
    exported = []
    for path in sorted((REPO / "configs").glob("*.yaml")):
        for q in Q.load(path).queries:
            if getattr(q, "export", None) is not None:
                exported.append((q.window.slide / 1e9, f"{path.name}:{q.name}"))
    assert exported, "no config exports a query"
    for slide_s, where in exported:
        assert interval <= slide_s, (
            f"{where}: windows every {slide_s:g} s, the job scraped every {interval:g} s"
        )


def test_job_metric_families_follow_the_naming_guide(tmp_path: Path) -> None:
    """No gauge ends in _total, liveness is _up, marks are _timestamp_seconds (the real registry)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from high_level.metrics import JobMetrics

    m = JobMetrics()
    m.host_up.labels("q", "h").set(1)
    m.host_lwm.labels("q", "h").set(1.7e9)
    m.dropped_so_far("q", 5)
    m.dropped_so_far("q", 7)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    for f in fams.values():
        if f.type == "gauge":
            assert not f.name.endswith("_total"), f.name
            assert not f.name.endswith("_live"), f.name
    assert "lowwater_job_host_up" in fams
    assert "lowwater_job_host_low_water_mark_timestamp_seconds" in fams
    dropped = fams["lowwater_job_rows_dropped_by_watermark"]
    assert dropped.type == "counter" and dropped.samples[0].value == 7  # cumulative, counted once


def test_every_prometheus_static_target_is_a_compose_service_port() -> None:
    svcs = services(CENTRAL)
    cfg = _prometheus()
    names = [sc["job_name"] for sc in cfg["scrape_configs"]]
    assert len(names) == len(set(names)), "duplicate job_name"
    seen: set[str] = set()
    for sc in cfg["scrape_configs"]:
        for group in sc.get("static_configs", []):
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                service = "prometheus" if host == "localhost" else host
                assert service in svcs, f"{sc['job_name']}: target {target}: no compose service {service!r}"
                assert int(port) in container_ports(svcs[service]), (
                    f"{sc['job_name']}: {target}: {service} does not expose port {port}"
                )
                lp = listening_port(svcs[service])
                if lp is not None:
                    assert int(port) == lp, f"{target}: {service} listens on {lp}"
                seen.add(service)
        for group in sc.get("dns_sd_configs", []):  # the demo agent: a target only while it runs
            for host in group["names"]:
                assert host in svcs and group["port"] in container_ports(svcs[host]), (sc["job_name"], host)
                assert group["port"] == listening_port(svcs[host]), host
                seen.add(host)
    # every component that serves metrics is scraped
    assert {"job", "api", "agent-demo", "prometheus"} <= seen
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert 9093 in container_ports(svcs["alertmanager"])


def test_file_sd_capture_hosts_use_the_agent_metrics_port() -> None:
    svcs = services(CENTRAL)
    prom = svcs["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"] if v.startswith("./")}
    capture_port = int(
        env_file_settings(DEPLOY / "capture-host" / "env.example", "LOWWATER_AGENT_")[
            "LOWWATER_AGENT_METRICS_PORT"
        ]
    )
    assert capture_port == 9101 and services(CAPTURE)["agent"]["environment"]["LOWWATER_HEALTH_URL"].endswith(
        ":9101/metrics"
    )
    files = [
        f for sc in _prometheus()["scrape_configs"] for c in sc.get("file_sd_configs", []) for f in c["files"]
    ]
    assert files, "capture hosts need a file_sd file"
    for f in files:
        local = next(
            (
                REPO / src / Path(f).relative_to(dst)
                for dst, src in mounts.items()
                if Path(f).is_relative_to(dst)
            ),
            None,
        )
        assert local is not None and local.is_file(), f"{f} is not a file mounted from deploy/"
        for group in yaml.safe_load(local.read_text()):
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                assert int(port) == capture_port, f"{target}: capture agents listen on {capture_port}"
                assert host not in svcs, f"{target}: capture hosts are outside the compose project"


def test_promtool_accepts_the_prometheus_config_and_every_dashboard_expression(tmp_path: Path) -> None:
    """Real parsers: ``promtool check config`` (mount paths mapped to deploy/) and ``promtool check rules``
    on one recording rule per Grafana expression (Grafana variables replaced by plain values)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed (Debian package 'prometheus', installed by ./lw setup)"
    secret = tmp_path / "api_token"
    secret.write_text("token\n")
    text = PROMETHEUS.read_text().replace("/etc/prometheus/file_sd", str(DEPLOY / "prometheus" / "file_sd"))
    text = text.replace("/etc/prometheus/rules", str(RULES))
    assert str(RULES) in text, "prometheus.yml loads no rule files from /etc/prometheus/rules"
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text.replace("/run/secrets/api_token", str(secret)))
    out = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = [
        {
            "record": f"lowwater:check_{i}",
            "expr": re.sub(r"\$(host|query)\b", ".*", e.replace("$__rate_interval", "1m")),
        }
        for i, (_, _, e) in enumerate(dashboard_exprs())
        if not e.startswith("label_values(")
    ]
    rf = tmp_path / "rules.yml"
    rf.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run(
        [promtool, "check", "rules", str(rf), *map(str, sorted(RULES.glob("*.yml")))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_and_recording_rules_use_only_exported_metrics() -> None:
    """Every metric an alert or recording rule reads is exported by the code (or Prometheus' ``up``,
    or a series recorded by the rules themselves); the rules directory is mounted into Prometheus."""
    defined = set().union(*defined_metrics().values())
    rules = [
        r
        for f in sorted(RULES.glob("*.yml"))
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
    ]
    recorded = {r["record"] for r in rules if "record" in r}
    assert recorded and any("alert" in r for r in rules)
    for r in rules:
        for n in promql_metrics(r["expr"]):
            assert n == "up" or n in recorded or exposition_candidates(n) & defined, (
                f"{r}: {n} is not exported"
            )
    mounts = services(CENTRAL)["prometheus"]["volumes"]
    assert any(str(v).startswith("./deploy/prometheus/rules:/etc/prometheus/rules") for v in mounts), mounts


# -- Grafana plots only metrics the code exports ----------------------------------------------------
_PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "le",
}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (also ``label_values(metric, label)``), Grafana variables removed."""
    e = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings (label values, regexes)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # grouping labels
    e = re.sub(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", r" \1 ", e)
    e = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", " ", e)  # $__rate_interval, $host
    names = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def test_promql_metric_extraction() -> None:
    assert promql_metrics('sum by (host) (rate(a_total{host=~"$host"}[$__rate_interval])) / b') == {
        "a_total",
        "b",
    }
    assert promql_metrics("histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))") == {"x_bucket"}
    assert promql_metrics("label_values(m_total, host)") == {"m_total"}
    assert promql_metrics("max without (instance) (g) > bool 1e-9") == {"g"}


def dashboard_exprs() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every panel target and templating query."""
    out = []
    for f in sorted(DASHBOARDS.glob("*.json")):
        d = json.loads(f.read_text())

        def walk(panels: list[dict[str, Any]], fname: str = f.name) -> Iterator[tuple[str, str, str]]:
            for p in panels:
                for t in p.get("targets", []):
                    if t.get("expr"):
                        yield fname, p.get("title", ""), t["expr"]
                yield from walk(p.get("panels", []))

        out.extend(walk(d.get("panels", [])))
        for v in d.get("templating", {}).get("list", []):
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            if v.get("type") == "query" and q:
                out.append((f.name, f"variable {v['name']}", q))
    return out


def defined_metrics() -> dict[str, set[str]]:
    """Metric names exported by the code, by component: the agent's METRIC_NAMES, and every
    ``lowwater_job_*`` / ``lowwater_api_*`` string literal under high_level/ (the metric definitions)."""
    from low_level.host.metrics import METRIC_NAMES

    out: dict[str, set[str]] = {"agent": set(METRIC_NAMES), "job": set(), "api": set()}
    for py in (REPO / "high_level").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                m = re.fullmatch(r"lowwater_(job|api)_[a-z0-9_]+", node.value)
                if m:
                    out[m.group(1)].add(node.value)
    return out


def exposition_candidates(name: str) -> set[str]:
    """Names under which ``name`` may be defined: counters gain ``_total``, histograms ``_bucket/_sum/_count``."""
    cands = {name}
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            cands.add(name.removesuffix(suffix))
    return cands


def test_dashboard_metrics_are_all_lowwater_metrics() -> None:
    exprs = dashboard_exprs()
    assert exprs, "no Grafana dashboard expressions found"
    for fname, title, expr in exprs:
        names = promql_metrics(expr)
        assert names, f"{fname} / {title}: no metric in {expr!r}"
        for n in names:
            assert re.fullmatch(r"lowwater_(agent|job|api)_[a-z0-9_]+", n), (
                f"{fname} / {title}: {n} in {expr!r}"
            )


@pytest.mark.parametrize("component", ["agent", "job", "api"])
def test_every_dashboard_metric_is_defined_in_the_code(component: str) -> None:
    defined = defined_metrics()[component]
    used = {
        (n, f"{f} / {t}")
        for f, t, e in dashboard_exprs()
        for n in promql_metrics(e)
        if n.startswith(f"lowwater_{component}_")
    }
    assert used, f"the dashboard plots no lowwater_{component}_* metric"
    assert defined, f"no lowwater_{component}_* metric found in the code ({len(used)} panel uses unchecked)"
    missing = sorted({(n, where) for n, where in used if not exposition_candidates(n) & defined})
    assert not missing, f"dashboard metrics not exported by the code: {missing}; defined: {sorted(defined)}"


def test_dashboard_covers_the_operational_signals() -> None:
    text = "\n".join(e for _, _, e in dashboard_exprs())
    for needle in (
        "lowwater_agent_packets_captured_total",
        "lowwater_agent_packets_processed_total",  # throughput
        "lowwater_agent_ring_drops_total",
        "lowwater_agent_kernel_drops_total",  # drops
        "lowwater_agent_evictions_total",  # evictions
        "lowwater_job_host_lag_seconds",  # low-water-mark lag per host
        "lowwater_job_late_partials_total",
    ):  # late data
        assert needle in text, needle
    assert re.search(r"histogram_quantile\(.*lowwater_job_result_latency_seconds_bucket", text), (
        "window-close latency"
    )


def test_grafana_provisioning_matches_compose_and_dashboards() -> None:
    grafana = services(CENTRAL)["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    prov = REPO / mounts["/etc/grafana/provisioning"]
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    uids = {d["uid"] for d in ds}
    assert any(d["url"] == "http://prometheus:9090" for d in ds)
    providers = yaml.safe_load((prov / "dashboards" / "lowwater.yml").read_text())["providers"]
    for p in providers:
        assert REPO / mounts[p["options"]["path"]] == DASHBOARDS
    for f in DASHBOARDS.glob("*.json"):
        d = json.loads(f.read_text())
        stack = list(d["panels"])
        while stack:
            p = stack.pop()
            stack.extend(p.get("panels", []))
            for obj in (p, *p.get("targets", [])):
                if "datasource" in obj:
                    assert obj["datasource"]["uid"] in uids, f"{f.name}: {p.get('title')}: unknown datasource"


# -- privileges -----------------------------------------------------------------------------------
def test_capture_host_has_host_networking_and_only_net_raw_net_admin() -> None:
    svcs = services(CAPTURE)
    assert list(svcs) == ["agent"]
    a = svcs["agent"]
    assert a["network_mode"] == "host"
    assert a["cap_drop"] == ["ALL"]
    assert set(a["cap_add"]) == CAPTURE_CAPS and len(a["cap_add"]) == 2
    assert not a.get("privileged") and not a.get("devices") and a.get("pid") != "host"
    assert a.get("read_only") is True
    assert "ports" not in a, "ports mean nothing with host networking"
    assert all(str(v).endswith(":ro") for v in a["volumes"]), "capture host mounts must be read-only"
    assert command_of(a)[0] == "lowwater-agent"
    example = env_file_settings(DEPLOY / "capture-host" / "env.example", "LOWWATER_AGENT_")
    assert example["LOWWATER_AGENT_SOURCE"].startswith("afpacket:")


def dockerfile_stages() -> dict[str, str]:
    """Stage name -> its instructions (from its FROM line to the next; comment lines left out)."""
    text = "\n".join(ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#"))
    parts = re.split(r"^(?=FROM\s)", text, flags=re.M)
    out = {}
    for part in parts[1:]:
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", part, re.I)
        assert m, f"unnamed stage: {part.splitlines()[0]}"
        out[m.group(1)] = part
    return out


def _stage_user(stage: str) -> str | None:
    """The USER a target runs as (each stage starts as its base's user: root for python:*, else the
    parent stage's)."""
    stages = dockerfile_stages()
    text = stages[stage]
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    if users:
        return users[-1]
    parent = re.match(r"FROM\s+(\S+)", text).group(1)
    return _stage_user(parent) if parent in stages else None


def test_image_does_not_run_as_root_except_for_capture() -> None:
    for role in ROLES:
        user = _stage_user(role)
        assert user is not None, f"target {role} sets no USER (would run as root)"
        assert user.split(":")[0] not in ("0", "root"), f"target {role} runs as {user}"
    for path in COMPOSE_FILES:
        for name, svc in services(path).items():
            u = str(svc.get("user", "")).split(":")[0]
            if u in ("0", "root"):
                assert path == CAPTURE and name == "agent", f"{path.name}: {name} runs as root"
                assert set(svc["cap_add"]) <= CAPTURE_CAPS and svc["cap_drop"] == ["ALL"]
            elif path == CENTRAL:
                assert not svc.get("cap_add"), f"{name}: the central stack needs no capability"


# -- image -----------------------------------------------------------------------------------------
def _resolved_from_images() -> list[str]:
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)", text, re.M))
    images = []
    for ref in re.findall(r"^FROM\s+(\S+)", text, re.M):
        images.append(
            re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), ref)
        )
    return images


def test_dockerfile_base_image_is_pinned_to_an_exact_tag() -> None:
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", DOCKERFILE.read_text(), re.M | re.I))
    external = [i for i in _resolved_from_images() if i not in stages]
    assert external
    for image in external:
        assert "$" not in image, f"unresolved base image {image}"
        assert "@sha256:" in image or re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", image), (
            f"base image {image} is not pinned to an exact version tag"
        )
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image


def test_third_party_images_are_pinned_and_kafka_matches_local_stack() -> None:
    pom = (REPO / "local_stack" / "maven" / "kafka-broker.pom.xml").read_text()
    kafka_version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1)
    for path in COMPOSE_FILES:
        for name, svc in services(path).items():
            image = svc.get("image", "")
            if "build" in svc:
                continue
            assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{name}: {image} not pinned to an exact version"
            if name == "kafka":
                assert image == f"apache/kafka:{kafka_version}", "compose Kafka must be the version tests run"


def test_dockerfile_builds_what_the_roles_need() -> None:
    """One target per role; the agent target has no Java, Maven, Spark jars or central lock."""
    stages = dockerfile_stages()
    assert set(ROLES) <= set(stages), f"targets {ROLES} not all in {sorted(stages)}"
    agent = stages["agent"] + stages["build-agent"]
    central = stages["central"] + stages["build-central"]
    assert "openjdk-17-jre-headless" in stages["central"], "Spark 4 needs Java 17"
    assert "local_stack.jars" in central and "spark_kafka_jars" in central, (
        "connector jars via the project's Maven fetch"
    )
    for word in (
        "openjdk",
        "maven",
        "spark_kafka_jars",
        "requirements-central.lock",
        "/var/lib/lowwater/jars",
    ):
        assert word not in agent and word not in stages["base"], f"the agent image gets {word}"
    for role, text in (("agent", agent), ("central", central)):
        assert f"deploy/requirements-{role}.lock" in text, f"target {role} does not install its lock"
        assert re.search(r"^HEALTHCHECK\s", stages[role], re.M), role
        assert re.search(r"^LABEL\s+org\.opencontainers\.image\.", stages[role], re.M), role
    text = DOCKERFILE.read_text()
    for script in re.findall(
        r"/app/(deploy/docker/[\w.]+\.py)", text + CENTRAL.read_text() + CAPTURE.read_text()
    ):
        assert (REPO / script).is_file(), script
    ignore = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and ln[0] != "#"
    ]
    assert "!deploy/docker" in ignore
    assert all(f"!deploy/{LOCKS[r].name}" in ignore for r in ROLES)
    for needed in (
        "local_stack",
        "contract",
        "low_level",
        "high_level",
        "configs",
        "pyproject.toml",
        "README.md",
    ):
        assert needed not in ignore, f".dockerignore drops {needed}, which the image needs"


def test_compose_services_build_their_roles_target() -> None:
    """Capture agents (and the demo agent) run the agent image; every other lowwater service the central one."""
    seen = set()
    for path in COMPOSE_FILES:
        for name, svc in services(path).items():
            if "build" not in svc:
                continue
            role = "agent" if command_of(svc)[0] == "lowwater-agent" else "central"
            assert svc["build"].get("target") == role, (
                f"{path.name}: {name} builds {svc['build'].get('target')}"
            )
            assert f"lowwater-{role}:" in svc["image"], f"{path.name}: {name} image {svc['image']}"
            seen.add(role)
    assert seen == set(ROLES)


def _pins(lock: Path) -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{lock.name}: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


@pytest.mark.parametrize("role", ROLES)
def test_requirements_lock_pins_every_dependency_of_the_role(role: str) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _pins(LOCKS[role])
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"][role]
    for dep in deps:
        req = Requirement(dep)
        got = pins.get(canonicalize_name(req.name))
        assert got is not None, f"{req.name} (pyproject, {role}) is not pinned in {LOCKS[role].name}"
        assert req.specifier.contains(got, prereleases=True), (
            f"{req.name}=={got} violates pyproject {req.specifier}"
        )
    if role == "central":
        spark_pom = (REPO / "local_stack" / "maven" / "spark-kafka.pom.xml").read_text()
        spark = re.search(r"<spark.version>([^<]+)</spark.version>", spark_pom).group(1)
        assert pins["pyspark"] == spark, "pyspark must equal the Spark Kafka connector version"
    else:
        assert not set(pins) & set(NOT_ON_CAPTURE_HOSTS), (
            f"the agent lock pins {set(pins) & set(NOT_ON_CAPTURE_HOSTS)}"
        )


def test_agent_extra_leaves_out_the_central_stack_and_test_tools() -> None:
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {
        Requirement(d).name.lower()
        for d in project["dependencies"] + project["optional-dependencies"]["agent"]
    }
    assert not names & set(NOT_ON_CAPTURE_HOSTS), names & set(NOT_ON_CAPTURE_HOSTS)
    for tool in ("dpkt", "scapy"):  # only where used
        assert any(Requirement(d).name == tool for d in project["optional-dependencies"]["test"])
        assert not any(
            Requirement(d).name == tool
            for d in project["dependencies"] + project["optional-dependencies"]["central"]
        )


def test_agent_import_graph_stays_off_the_central_stack() -> None:
    """The agent and every module it may load (sources, metrics, emit, topic provisioning) import
    nothing a capture host does not install: checked in a fresh interpreter's sys.modules."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import low_level, contract\n"
        "for pkg in (contract, low_level):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "from low_level.cli import main\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    top = set(out.stdout.split())
    assert {"low_level", "numba", "pyarrow"} <= top, "the probe did not import the agent"
    forbidden = {*NOT_ON_CAPTURE_HOSTS, "high_level", "local_stack"}
    assert not top & forbidden, top & forbidden
    # imports inside functions (sources, Kafka, metrics are loaded lazily) never ran above: read them all
    allowed = {
        *sys.stdlib_module_names,
        "contract",
        "low_level",
        "numpy",
        "numba",
        "llvmlite",
        "pyarrow",
        "pydantic",
        "pydantic_settings",
        "yaml",
        "kafka",
        "crc32c",
        "prometheus_client",
        "tqdm",
    }
    for py in [*(REPO / "contract").rglob("*.py"), *(REPO / "low_level").rglob("*.py")]:
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for n in names:
                assert n.split(".")[0] in allowed, f"{py.relative_to(REPO)}:{node.lineno} imports {n}"


# -- deploy helper scripts -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def create_topics() -> ModuleType:
    return _load_module("lw_create_topics", DEPLOY / "docker" / "create_topics.py")


class FakeAdmin:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = dict(topics)
        self.calls: list[str] = []

    def list_topics(self) -> list[str]:
        return list(self.topics)

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"name": n, "error_code": 0, "partitions": [{}] * self.topics[n]} for n in names]

    def create_topics(self, spec: dict[str, dict[str, int]], timeout_ms: int) -> None:
        self.calls.append("create")
        self.topics.update({t: s["num_partitions"] for t, s in spec.items()})

    def create_partitions(self, spec: dict[str, int], timeout_ms: int) -> None:
        self.calls.append("grow")
        self.topics.update(spec)

    def wait_for_topics(self, names: list[str], timeout_ms: int) -> None:
        assert set(names) <= set(self.topics)


def test_create_topics_plan(create_topics: ModuleType) -> None:
    from contract import query as Q

    cfg = Q.load(REPO / "configs" / "default.yaml")
    wanted = create_topics.wanted_topics(cfg.queries)
    assert wanted == {q.topic: q.kafka.partitions for q in cfg.queries}
    admin = FakeAdmin({"lowwater.q4_pairs": 1, "lowwater.syn_per_port": 4})
    with pytest.raises(
        create_topics.PartitionChangeRefused,
        match="lowwater.q4_pairs has 1 partitions, the config asks for 2",
    ):
        create_topics.ensure_topics(admin, wanted)  # never grown by default: groups would move mid-window
    assert admin.topics == {
        "lowwater.q4_pairs": 1,
        "lowwater.syn_per_port": 4,
    }  # refused before changing anything
    actions = create_topics.ensure_topics(admin, wanted, grow=True)
    assert admin.topics["lowwater.q4_pairs"] == 2 and "grown" in actions["lowwater.q4_pairs"]
    assert admin.topics["lowwater.bytes_per_dst24"] == 2 and "created" in actions["lowwater.bytes_per_dst24"]
    assert admin.topics["lowwater.syn_per_port"] == 4 and "exists" in actions["lowwater.syn_per_port"]
    assert create_topics.ensure_topics(admin, wanted) == {
        t: ("exists" if n == 2 else actions[t]) for t, n in admin.topics.items()
    }
    shared = [
        SimpleNamespace(name=n, topic="t", kafka=SimpleNamespace(partitions=p))
        for n, p in (("a", 2), ("b", 3))
    ]
    with pytest.raises(ValueError, match="share topic"):
        create_topics.wanted_topics(shared)


def test_create_topics_against_the_real_broker(create_topics: ModuleType, kafka: Any) -> None:
    name = f"deploy-test-{uuid.uuid4().hex[:8]}"
    admin = create_topics.connect(kafka.bootstrap_servers, {}, 30)
    try:
        assert create_topics.ensure_topics(admin, {name: 2}) == {name: "created with 2 partitions"}
        assert create_topics.ensure_topics(admin, {name: 2}) == {name: "exists"}
        with pytest.raises(create_topics.PartitionChangeRefused, match="--grow"):
            create_topics.ensure_topics(admin, {name: 3})
        assert create_topics.existing_partitions(admin, [name]) == {name: 2}
        assert create_topics.ensure_topics(admin, {name: 3}, grow=True) == {
            name: "grown from 2 to 3 partitions"
        }
        assert create_topics.existing_partitions(admin, [name]) == {name: 3}
    finally:
        admin.close()


def test_job_builds_its_session_without_the_local_stack() -> None:
    """The job's Spark session comes from high_level.cluster.session (jars, driver address as parameters); no
    module of the high level imports local_stack (the launcher passes the connector jars: --spark-jars)."""
    mods = sorted((REPO / "high_level").rglob("*.py"))
    assert {"job.py", "cli.py", "session.py", "sink.py", "placement.py"} <= {m.name for m in mods}
    for mod in mods:
        tree = ast.parse(mod.read_text())
        names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [n for n in names if n and n.startswith("local_stack")], (
            f"{mod.relative_to(REPO)} imports local_stack"
        )


def test_healthcheck_script(tmp_path: Path) -> None:
    hc = _load_module("lw_healthcheck", DEPLOY / "docker" / "healthcheck.py")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert hc.main([f"http://127.0.0.1:{port}/metrics"]) == 0
        assert hc.main([f"tcp://127.0.0.1:{port}"]) == 0
        assert hc.main([f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{port}/nope"]) == 1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        assert hc.main([f"tcp://127.0.0.1:{closed}"]) == 1
        assert hc.main(["ftp://x/"]) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_capture_host_grants_cover_only_the_queries_a_host_runs(
    create_topics: ModuleType, tmp_path: Path
) -> None:
    """kafka-init's ACL plan: WRITE on the topics of the queries whose sources match the host, READ on
    the control topic, DESCRIBE on both; nothing for another host's query (the broker enforces it:
    tests/test_compose.py)."""
    from contract import query as Q

    cfg = tmp_path / "q.yaml"
    cfg.write_text("""
queries:
  - {name: all, group_by: [dst_port], aggregates: [{fn: count, as: n}], window: {range: 10s},
     kafka: {topic: lowwater.all, partitions: 1}}
  - {name: edge, group_by: [dst_port], aggregates: [{fn: count, as: n}], window: {range: 10s},
     sources: ["edge-*"], kafka: {topic: lowwater.edge, partitions: 1}}
""")
    grants = create_topics.capture_host_grants(Q.load(cfg), ["edge-1", "core-1"], "lowwater.control")
    assert grants["edge-1"] == {
        "lowwater.all": {"WRITE", "DESCRIBE"},
        "lowwater.edge": {"WRITE", "DESCRIBE"},
        "lowwater.control": {"READ", "DESCRIBE"},
    }
    assert grants["core-1"] == {
        "lowwater.all": {"WRITE", "DESCRIBE"},
        "lowwater.control": {"READ", "DESCRIBE"},
    }
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# capture hosts\nedge-1\n\ncore-1\n")
    assert create_topics.read_hosts(str(hosts)) == ["edge-1", "core-1"]


def test_kafka_secrets_script_makes_ca_broker_cert_and_one_user_per_host(tmp_path: Path) -> None:
    """deploy/kafka_secrets.py: idempotent; a new host adds a user and keeps the others' passwords."""
    script = DEPLOY / "kafka_secrets.py"
    d = tmp_path / "k"

    def run(*a):
        return subprocess.run(
            [
                sys.executable,
                str(script),
                "--dir",
                str(d),
                "--external-host",
                "kafka.example",
                *a,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    assert "made CA" in run("cap-1")
    jaas = (d / "kafka_server_jaas.conf").read_text()
    assert jaas.startswith("//") and "external.KafkaServer" in jaas and 'user_cap-1="' in jaas
    assert (d / "ca.key").stat().st_mode & 0o077 == 0
    assert "nothing new" in run("cap-1")
    run("cap-2")
    pw1 = re.search(r'user_cap-1="([^"]+)"', jaas).group(1)
    again = (d / "kafka_server_jaas.conf").read_text()
    assert again.count("user_") == 2 and f'user_cap-1="{pw1}"' in again
    assert (d / "capture-hosts.txt").read_text() == "cap-1\ncap-2\n"
    env = (d / "capture-hosts" / "cap-2" / "agent.env").read_text()
    block = json.loads(env.split("LOWWATER_AGENT_KAFKA_SECURITY=", 1)[1])
    assert (
        block["protocol"] == "SASL_SSL"
        and block["username"] == "cap-2"
        and "LOWWATER_AGENT_BOOTSTRAP=kafka.example:9094" in env
    )
    cert = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(d / "broker.pem")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:kafka.example" in cert
    ok = subprocess.run(
        ["openssl", "verify", "-CAfile", str(d / "ca.pem"), str(d / "broker.pem")],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
