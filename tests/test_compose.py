"""Deploy as operators do: build the images and run both compose files on a real Docker engine.

What runs (``./lw test-compose``, and in ``./lw test``, so in CI): the Docker daemon (started when
none runs; a daemon that cannot start FAILS the test, it never skips), the repository's Dockerfile
built through the compose files, the central stack (``docker-compose.yml``: Kafka, kafka-init, Spark
master and worker, job, API, Prometheus, Alertmanager; Grafana scaled to 0: no image here) and two
capture hosts (``deploy/capture-host/``): one replays a pcap from a mounted folder into Kafka's
external listener, one captures live on a veth pair whose peer lives in a namespace of its own.
Images Docker Hub would serve are local stand-ins (``local_stack/docker_engine.py``) named through
the compose files' image variables; nothing else about the files changes.

Asserted: the stack comes up healthy; the API (with its token) serves exactly a dpkt oracle of the pcap
and the live packets; every Prometheus target is up and no LowwaterComponentDown is pending; every
Grafana panel's PromQL returns series (one of its queries at least); a HAVING alert reaches Alertmanager; the page renders in
headless Chromium; ``down``/``up`` keeps results and checkpoint (same rows, no
duplicates, new windows close); the 3-broker profile runs with RF 3 / min.insync.replicas 2;
``down -v`` leaves no container, network or volume. Published ports bind to 127.0.0.1; the stacks'
networks are compose's bridges; the veth pair and namespace are removed even when a step fails.
Timings and image sizes go to ``<state>/compose-test.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from contract import fields as F
from local_stack import docker_engine
from local_stack.jars import state_dir
from local_stack.kafka_broker import free_port
from lowwater_testing.agent import dpkt_oracle, write_pcap
from lowwater_testing.compose import CENTRAL_CORE_SERVICES
from lowwater_testing.page import CHROMIUM, chromium
from lowwater_testing.traffic import NS, T0

REPO = Path(__file__).resolve().parents[1]
CAPTURE_COMPOSE = REPO / "deploy" / "capture-host" / "docker-compose.yml"
K3_OVERRIDE = REPO / "deploy" / "kafka-cluster.yml"
CENTRAL, REPLAY, LIVE, K3 = "lwtest-central", "lwtest-replay", "lwtest-live", "lwtest-k3"
VETH, PEER, NETNS = "lwct0", "lwct1", "lwct-ns"
WINDOW_S = 10
SPAN_S = 30
LIVE_SRC, LIVE_DST = "10.99.0.1", "10.99.0.2"
# the first test carries the module's set-up: a cold image build and three Spark-job starts on 2 cores
pytestmark = pytest.mark.timeout(2400)
# every service of docker-compose.yml but grafana (no image here: its provisioning is checked instead)
CENTRAL_SERVICES = (*CENTRAL_CORE_SERVICES, "alertmanager")
TIMINGS: dict[str, Any] = {}


def run(
    cmd: list[str], env: dict[str, str] | None = None, check: bool = True, timeout: float = 900, **kw: Any
) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


class Compose:
    """One compose project: ``docker-compose -p NAME -f FILE... --env-file ENV`` with the test's variables."""

    def __init__(self, project: str, files: list[Path], env_file: Path, env: dict[str, str]) -> None:
        self.project, self.files, self.env_file, self.env = project, files, env_file, env

    def __call__(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        cmd = [
            "docker-compose",
            "-p",
            self.project,
            *[a for f in self.files for a in ("-f", str(f))],
            "--env-file",
            str(self.env_file),
            *args,
        ]
        return run(cmd, env=self.env, check=check, timeout=timeout)

    def logs(self, *services: str, tail: int = 60) -> str:
        return self("logs", "--no-color", "--tail", str(tail), *services, check=False).stdout[-12000:]

    def containers(self) -> dict[str, dict[str, Any]]:
        """service -> docker inspect of its (first) container."""
        ids = run(
            ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"]
        ).stdout.split()
        if not ids:
            return {}
        out = {}
        for c in json.loads(run(["docker", "inspect", *ids]).stdout):
            out.setdefault(c["Config"]["Labels"]["com.docker.compose.service"], c)
        return out


def http(url: str, token: str | None = None, data: bytes | None = None, timeout: float = 10) -> Any:
    req = urllib.request.Request(
        url, data=data, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def wait(what: str, fn: Any, timeout: float, diag: Any = None, every: float = 3) -> Any:
    """Poll fn() until it returns a truthy value; fail with what, its last value and diag()."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            last = fn()
            if last:
                return last
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last = repr(exc)
        time.sleep(every)
    raise AssertionError(
        f"{what}: not within {timeout:.0f} s (last: {str(last)[:1500]})\n{diag() if diag else ''}"
    )


def cleanup_host() -> None:
    """The veth pair and namespace (idempotent; also before a run, after a crashed one)."""
    subprocess.run(["ip", "link", "del", VETH], capture_output=True)
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def queries_yaml(alert_at: int) -> str:
    return f"""
queries:
  - name: pairs
    description: packets per (src, dst) per {WINDOW_S} s
    group_by: [src_ip, dst_ip]
    aggregates: [{{fn: count, as: packets}}]
    alerts:
      - {{name: busy_pair, when: packets >= {alert_at}, severity: warning, summary: "a busy pair"}}
    window: {{range: {WINDOW_S}s}}
    table: {{size: 8192}}
    flush: {{policy: lazy, m: 2}}
    heartbeat: {{interval: 1s, skew: 2s}}
    kafka: {{topic: lowwater.ct.pairs, partitions: 2}}
  - name: bytes_per_dst24
    description: bytes per destination /24 (exported to Prometheus for the dashboard's traffic panels)
    group_by: [dst_ip/24]
    aggregates: [{{fn: sum, field: length, as: bytes}}, {{fn: count, as: packets}}]
    window: {{range: {WINDOW_S}s}}
    table: {{size: 4096}}
    flush: {{policy: lazy, m: 2}}
    export: {{top: 10, by: bytes}}
    kafka: {{topic: lowwater.ct.bytes_per_dst24, partitions: 1}}
"""


def send_live(n: int) -> None:
    """n TCP frames LIVE_SRC -> LIVE_DST into the veth from its peer's namespace (scapy, explicit MACs)."""
    code = (
        "from scapy.all import Ether, IP, TCP, sendp\n"
        f"f = Ether(src='02:00:00:00:99:01', dst='02:00:00:00:99:02') / IP(src='{LIVE_SRC}', dst='{LIVE_DST}')"
        " / TCP(sport=40000, dport=443, flags='A')\n"
        f"sendp([f] * {n}, iface='{PEER}', verbose=False)\n"
    )
    run(["ip", "netns", "exec", NETNS, sys.executable, "-c", code])


class Site:
    """Everything the test brought up, and how to reach it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ports = {
            k: free_port()
            for k in (
                "kafka",
                "api",
                "prometheus",
                "alertmanager",
                "spark",
                "grafana",
                "replay_metrics",
                "live_metrics",
            )
        }
        self.token = os.urandom(16).hex()

    def api(self, path: str) -> Any:
        return http(f"http://127.0.0.1:{self.ports['api']}{path}", self.token)

    def prom(self, path: str) -> Any:
        return http(f"http://127.0.0.1:{self.ports['prometheus']}{path}")

    def results(self, start_s: float, end_s: float) -> Counter:
        """(window start ns, src, dst) -> packets, every row the API serves in [start, end)."""
        fmt = lambda s: datetime.fromtimestamp(s, UTC).isoformat().replace("+00:00", "Z")  # noqa: E731
        got: Counter = Counter()
        offset: int | None = 0
        while offset is not None:
            body = self.api(
                f"/queries/pairs/results?start={fmt(start_s)}&end={fmt(end_s)}&limit=10000&offset={offset}"
            )
            for r in body["rows"]:
                ws = int(datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp()) * NS
                key = (ws, F.ip_to_words(r["src_ip"])[1], F.ip_to_words(r["dst_ip"])[1])
                assert key not in got, f"duplicate row {r}"
                got[key] += r["packets"]
            offset = body["paging"]["next_offset"]
        return got

    def replay_results(self) -> Counter:
        return self.results(T0 / NS - 60, T0 / NS + SPAN_S + 60)

    def live_packets(self, since_s: float) -> int:
        src, dst = F.ip_to_words(LIVE_SRC)[1], F.ip_to_words(LIVE_DST)[1]
        return sum(
            n
            for (_, s, d), n in self.results(since_s - 120, time.time() + 120).items()
            if (s, d) == (src, dst)
        )


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    # No skip: CI must really run this. A daemon that cannot start fails here with its log.
    t0 = time.monotonic()
    try:
        images = docker_engine.image_env()
    except docker_engine.DockerError as exc:
        pytest.fail(f"the compose test needs a Docker engine and its stand-in images: {exc}", pytrace=False)
    TIMINGS["standins_s"] = round(time.monotonic() - t0, 1)
    tmp = Path(tempfile.mkdtemp(prefix="compose-test-", dir=state_dir()))
    tmp.chmod(0o755)
    s = Site(tmp)
    env = {**docker_engine.docker_env(), **images, "EXTRA_CA_CERTS": docker_engine.extra_ca_certs()}
    # the pcap, its oracle, the queries (alert threshold: the busiest pair-window of the file fires)
    for d in ("queries", "pcap", "file_sd", "secrets"):
        (tmp / d).mkdir(mode=0o755)
    pcap = tmp / "pcap" / "capture.pcap"
    write_pcap(pcap, 6000, 200, SPAN_S, seed=11)
    pcap.chmod(0o644)
    s.want = Counter()
    for (pane, src, dst), n in dpkt_oracle(pcap, WINDOW_S * NS).items():
        s.want[(pane * WINDOW_S * NS, src, dst)] += n
    s.alert_at = max(s.want.values())
    s.alerting = sorted(k for k, v in s.want.items() if v >= s.alert_at)
    (tmp / "queries" / "test.yaml").write_text(queries_yaml(s.alert_at))
    (tmp / "secrets" / "api_token").write_text(s.token + "\n")
    (tmp / "secrets" / "grafana_admin_password").write_text("not-used\n")
    for f in (tmp / "secrets").iterdir():
        f.chmod(0o644)
    (tmp / "file_sd" / "capture-hosts.yml").write_text("[]\n")
    p = s.ports
    # secure by default: the operator's one setup script makes the CA, the broker's certificate and a
    # credential per capture host (SASL_SSL on the external listener, ACLs from kafka-init)
    s.secrets = tmp / "kafka-secrets"
    run(
        [
            sys.executable,
            str(REPO / "deploy" / "kafka_secrets.py"),
            "--dir",
            str(s.secrets),
            "--external-host",
            "localhost",
            "--external-port",
            str(p["kafka"]),
            "--san",
            "127.0.0.1",
            "replay-01",
            "live-01",
        ]
    )
    central_env = tmp / "central.env"
    central_env.write_text(f"""# the compose test's deploy/.env
KAFKA_EXTERNAL_HOST=localhost
KAFKA_EXTERNAL_PORT={p["kafka"]}
KAFKA_EXTERNAL_BIND=127.0.0.1
KAFKA_HEAP_OPTS=-Xms256m -Xmx512m
API_BIND=127.0.0.1
API_PORT={p["api"]}
GRAFANA_BIND=127.0.0.1
GRAFANA_PORT={p["grafana"]}
ADMIN_BIND=127.0.0.1
PROMETHEUS_PORT={p["prometheus"]}
ALERTMANAGER_PORT={p["alertmanager"]}
SPARK_MASTER_UI_PORT={p["spark"]}
SPARK_WORKER_CORES=2
SPARK_WORKER_MEMORY=2g
SPARK_DRIVER_MEMORY=768m
QUERIES_DIR={tmp / "queries"}
QUERIES_FILE=test.yaml
API_TOKEN_FILE={tmp / "secrets" / "api_token"}
GRAFANA_ADMIN_PASSWORD_FILE={tmp / "secrets" / "grafana_admin_password"}
PROMETHEUS_FILE_SD={tmp / "file_sd"}
KAFKA_SECRETS_DIR={s.secrets}
CENTRAL_ENV_FILE={central_env}
LOWWATER_JOB_SPARK_CONF={{"spark.executor.memory": "1g"}}
LOWWATER_JOB_TRIGGER=1s
# the replayed file is old (T0): nothing may close before the replay host has said where it starts, or
# the live host alone would close those windows and the replay's partials would be late (deploy/README.md)
LOWWATER_JOB_EXPECTED_HOSTS=replay-01,live-01
HEALTHCHECK_INTERVAL=10s
""")
    s.central = Compose(CENTRAL, [REPO / "docker-compose.yml"], central_env, env)
    capture_envs = {}
    for name, host, source, port in (
        (REPLAY, "replay-01", "pcap:/var/lib/lowwater/pcap/capture.pcap", p["replay_metrics"]),
        (LIVE, "live-01", f"afpacket:{VETH}", p["live_metrics"]),
    ):
        f = tmp / f"{name}.env"
        bundle = s.secrets / "capture-hosts" / host  # what the operator copies to the capture host
        f.write_text(f"""# the compose test's capture-host .env: agent.env of kafka_secrets.py (host id, bootstrap,
# the SASL_SSL block), then the rest
{(bundle / "agent.env").read_text()}
KAFKA_CERTS_DIR={bundle}
LOWWATER_AGENT_SOURCE={source}
LOWWATER_AGENT_METRICS_PORT={port}
LOWWATER_AGENT_CONTROL_TOPIC=lowwater.control
LOWWATER_AGENT_LINGER=true
LOWWATER_AGENT_RING_SLOTS=16384
QUERIES_DIR={tmp / "queries"}
QUERIES_FILE=test.yaml
PCAP_DIR={tmp / "pcap"}
CAPTURE_ENV_FILE={f}
""")
        capture_envs[name] = f
    s.replay = Compose(REPLAY, [CAPTURE_COMPOSE], capture_envs[REPLAY], env)
    s.live = Compose(LIVE, [CAPTURE_COMPOSE], capture_envs[LIVE], env)
    k3_env = (
        tmp / "k3.env"
    )  # its own external ports, picked by its test when it starts: it runs next to the central stack
    k3_env.write_text(central_env.read_text().replace(f"KAFKA_EXTERNAL_PORT={p['kafka']}", ""))
    s.k3 = Compose(K3, [REPO / "docker-compose.yml", K3_OVERRIDE], k3_env, env)
    projects = (s.live, s.replay, s.k3, s.central)
    for c in projects:  # leftovers of a run that was killed
        c("down", "-v", "--remove-orphans", check=False, timeout=300)
    cleanup_host()
    try:
        yield s
    finally:
        for c in projects:
            c("down", "-v", "--remove-orphans", "-t", "20", check=False, timeout=300)
        cleanup_host()
        shutil.rmtree(tmp, ignore_errors=True)
        TIMINGS["images"] = {
            tag: round(
                int(
                    run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], check=False).stdout.strip()
                    or 0
                )
                / 1e6
            )
            for tag in ("lowwater-central:0.1.0", "lowwater-agent:0.1.0", *images.values())
        }
        (state_dir() / "compose-test.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


@pytest.fixture(scope="module")
def up(site: Site) -> Site:
    """Build the images as an operator does, then bring the central stack and both capture hosts up."""
    s = site
    t0 = time.monotonic()
    s.central("build")
    s.replay("build")
    TIMINGS["build_s"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    s.central("up", "-d", *CENTRAL_SERVICES, timeout=900)
    TIMINGS["central_up_s"] = round(time.monotonic() - t0, 1)
    # the live capture host's NIC: a veth whose peer is in a namespace of its own
    run(["ip", "link", "add", VETH, "type", "veth", "peer", "name", PEER])
    run(["ip", "netns", "add", NETNS])
    run(["ip", "link", "set", PEER, "netns", NETNS])
    run(["ip", "link", "set", VETH, "up"])
    run(["ip", "netns", "exec", NETNS, "ip", "link", "set", PEER, "up"])
    s.replay("up", "-d")
    s.live("up", "-d")
    # Prometheus reaches the capture hosts (host network) at the central network's gateway
    gw = json.loads(run(["docker", "network", "inspect", f"{CENTRAL}_default"]).stdout)[0]["IPAM"]["Config"][
        0
    ]["Gateway"]
    (s.tmp / "file_sd" / "capture-hosts.yml").write_text(
        json.dumps(
            [
                {
                    "targets": [f"{gw}:{s.ports['replay_metrics']}"],
                    "labels": {"component": "agent", "capture_host": "replay-01"},
                },
                {
                    "targets": [f"{gw}:{s.ports['live_metrics']}"],
                    "labels": {"component": "agent", "capture_host": "live-01"},
                },
            ]
        )
    )
    return s


def healthy(c: Compose, services: set[str]) -> bool | str:
    cs = c.containers()
    states = {
        n: cs[n]["State"].get("Health", {}).get("Status", cs[n]["State"]["Status"]) if n in cs else "absent"
        for n in services
    }
    return all(v == "healthy" for v in states.values()) or str(states)


def test_central_stack_comes_up_healthy_on_loopback_only(up: Site) -> None:
    s = up
    services = {"kafka", "spark-master", "spark-worker", "job", "api", "prometheus", "alertmanager"}
    t0 = time.monotonic()
    wait(
        "central stack healthy",
        lambda: healthy(s.central, services) is True,
        420,
        lambda: f"{healthy(s.central, services)}\n{s.central.logs('job', 'kafka', 'kafka-init', tail=40)}",
    )
    TIMINGS["healthy_s"] = round(time.monotonic() - t0, 1)
    cs = s.central.containers()
    assert cs["kafka-init"]["State"]["ExitCode"] == 0
    for name, c in cs.items():
        for port, binds in (c["HostConfig"].get("PortBindings") or {}).items():
            assert all(b["HostIp"] == "127.0.0.1" for b in binds), (
                f"{name} publishes {port} beyond loopback: {binds}"
            )
        nets = c["NetworkSettings"]["Networks"]
        assert list(nets) == [f"{CENTRAL}_default"], f"{name} is on {list(nets)}"
    net = json.loads(run(["docker", "network", "inspect", f"{CENTRAL}_default"]).stdout)[0]
    assert net["Driver"] == "bridge"
    for c in (s.replay, s.live):
        agent = c.containers()["agent"]
        assert agent["HostConfig"]["NetworkMode"] == "host"
        assert sorted(agent["HostConfig"]["CapAdd"]) == ["NET_ADMIN", "NET_RAW"]
    # the worker default honours the container's CPU quota (0.5 CPU on this host's cores: 1, not cores/2)
    out = run(
        [
            "docker",
            "run",
            "--rm",
            "--cpus",
            "0.5",
            "--network",
            "none",
            "lowwater-agent:0.1.0",
            "python",
            "-c",
            "from low_level.capture.cpuquota import usable_cpus; print(usable_cpus())",
        ]
    ).stdout
    assert out.strip() == "1", out


def test_api_serves_the_oracle_of_the_replayed_pcap_and_the_live_capture(up: Site) -> None:
    s = up
    t0 = time.monotonic()
    wait(
        "replayed pcap's windows served",
        lambda: s.replay_results() == s.want,
        420,
        lambda: s.central.logs("job", tail=40) + s.replay.logs(tail=30),
    )
    TIMINGS["replay_results_s"] = round(time.monotonic() - t0, 1)
    assert s.replay_results() == s.want  # equal to dpkt's aggregate of the file: nothing lost or doubled
    # the live host: wait until its agent captures (kernel compiled), then send and read back exactly
    wait(
        "live agent metrics",
        lambda: "lowwater_agent" in http(f"http://127.0.0.1:{s.ports['live_metrics']}/metrics"),
        300,
        lambda: s.live.logs(tail=40),
    )
    s.live_since = time.time()
    send_live(40)
    wait(
        "live packets served",
        lambda: s.live_packets(s.live_since) == 40,
        180,
        lambda: f"{s.live_packets(s.live_since)}\n{s.live.logs(tail=30)}{s.central.logs('job', tail=30)}",
    )
    status = s.api("/status")
    hosts = {h["host"] for h in status["hosts"]}
    assert {"replay-01", "live-01"} <= hosts, status["hosts"]


def test_external_listener_is_sasl_ssl_and_acls_limit_a_capture_host(up: Site) -> None:
    """PLAINTEXT and a wrong password get nowhere; a capture host sees its queries' topics and the
    control topic, nothing else, and cannot write the job's live topics."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError

    from contract.kafka_security import KafkaSecurity

    s = up
    bootstrap = f"localhost:{s.ports['kafka']}"
    line = next(
        ln
        for ln in (s.secrets / "capture-hosts" / "replay-01" / "agent.env").read_text().splitlines()
        if ln.startswith("LOWWATER_AGENT_KAFKA_SECURITY=")
    )
    block = json.loads(line.split("=", 1)[1])
    block["ca_file"] = str(s.secrets / "ca.pem")
    good = KafkaSecurity.model_validate(block).kafka_python()
    c = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=20000, **good)
    try:
        assert c.topics() == {"lowwater.ct.pairs", "lowwater.ct.bytes_per_dst24", "lowwater.control"}
    finally:
        c.close()
    p = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=15000, **good)
    try:
        with pytest.raises(KafkaError):
            p.send("lowwater.live.pairs", b"not from a capture host").get(timeout=20)
    finally:
        p.close(5)
    for bad in ({}, {**good, "sasl_plain_password": "wrong"}):
        with pytest.raises(KafkaError):
            c = KafkaConsumer(
                bootstrap_servers=bootstrap,
                request_timeout_ms=10000,
                api_version_auto_timeout_ms=10000,
                **bad,
            )
            try:
                c.topics()
            finally:
                c.close()


def test_prometheus_targets_up_no_component_down_and_grafana_panels_have_series(up: Site) -> None:
    s = up

    def targets() -> bool | str:
        act = s.prom("/api/v1/targets")["data"]["activeTargets"]
        jobs = {t["labels"]["job"] for t in act}
        down = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in act if t["health"] != "up"]
        want = {"lowwater-job", "lowwater-api", "lowwater-agent", "prometheus"}
        n_agents = sum(t["labels"]["job"] == "lowwater-agent" for t in act)
        return (
            not down and want <= jobs and n_agents == 2
        ) or f"jobs {jobs}, agents {n_agents}, not up {down}"

    wait("every Prometheus target up", lambda: targets() is True, 180, targets)
    alerts = s.prom("/api/v1/query?query=" + urllib.parse.quote('ALERTS{alertname="LowwaterComponentDown"}'))
    assert alerts["data"]["result"] == [], alerts
    am = s.prom("/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert am and "alertmanager:9093" in am[0]["url"], am
    # Grafana is not started (no image here), but its provisioning is checked against this Prometheus
    dash = json.loads((REPO / "deploy/grafana/dashboards/lowwater.json").read_text())
    # the rows of sources this site runs (it has no flow collector: that row's queries must still parse)
    row, panels, unused = "", {}, {}
    for p in dash["panels"]:
        if p.get("type") == "row":
            row = p["title"]
            continue
        exprs = [t["expr"] for t in p.get("targets", []) if t.get("expr")]
        if exprs:
            (unused if row.startswith("Flow collectors") else panels)[p["title"]] = exprs
    assert len(panels) > 15 and unused, (list(panels), list(unused))

    def query(e: str) -> dict:
        q = re.sub(r"\$__rate_interval", "1m", e).replace("$host", ".*").replace("$query", ".*")
        return s.prom("/api/v1/query?query=" + urllib.parse.quote(q))

    def series(e: str) -> int:
        return len(query(e)["data"]["result"])

    def empty_panels() -> list[str]:
        # a panel shows something when one of its queries returns series (a counter such as the job's
        # late partials exists only once there was one: its panel also plots the agents' late packets)
        return [title for title, exprs in panels.items() if not any(series(e) for e in exprs)]

    wait(
        "every dashboard panel's PromQL returns series",
        lambda: not empty_panels(),
        240,
        empty_panels,
        every=10,
    )
    for e in (e for exprs in unused.values() for e in exprs):
        assert query(e)["status"] == "success", e
    TIMINGS["panel_queries_without_series"] = [e for exprs in panels.values() for e in exprs if not series(e)]
    ds = (REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    assert "http://prometheus:9090" in ds


def test_having_alert_reaches_alertmanager(up: Site) -> None:
    s = up
    url = f"http://127.0.0.1:{s.ports['alertmanager']}/api/v2/alerts"

    def fired() -> list[dict]:
        return [a for a in http(url) if a["labels"].get("alertname") == "busy_pair"]

    got = wait(
        "busy_pair in Alertmanager", fired, 120, lambda: s.central.logs("job", "alertmanager", tail=30)
    )
    want = {
        (
            socket.inet_ntoa((src & 0xFFFFFFFF).to_bytes(4, "big")),
            socket.inet_ntoa((dst & 0xFFFFFFFF).to_bytes(4, "big")),
        )
        for _, src, dst in s.alerting
    }
    seen = {(a["labels"].get("src_ip"), a["labels"].get("dst_ip")) for a in got}
    assert want <= seen, (want, got[:3])


def test_page_renders_in_headless_chromium(up: Site, tmp_path: Path) -> None:
    s = up
    assert CHROMIUM, "chromium is missing: ./lw setup installs it"
    page = f"http://127.0.0.1:{s.ports['api']}/ui#token={s.token}"
    proc = chromium(page, tmp_path / "profile", "--dump-dom", budget_ms=8000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom = proc.stdout
    assert 'id="q-pairs"' in dom and 'id="q-bytes_per_dst24"' in dom, dom[-3000:]
    assert 'class="top-row"' in dom and "live-01" in dom, dom[-3000:]


def _windows_closed(s: Site) -> int:
    return int(s.api("/status")["queries"]["pairs"]["windows_closed"])


def _still_exact_and_closing(s: Site, what: str, sent: int) -> None:
    """After a restart: the replay's rows unchanged (no duplicate), new live packets served, windows closing."""
    wait(
        f"API back after {what}", lambda: s.api("/status"), 240, lambda: s.central.logs("api", "job", tail=30)
    )
    before = _windows_closed(s)
    send_live(sent)
    want = s.live_total + sent
    wait(
        f"live packets served after {what}",
        lambda: s.live_packets(s.live_since) == want,
        300,
        lambda: f"{s.live_packets(s.live_since)} != {want}\n{s.central.logs('job', tail=40)}",
    )
    s.live_total = want
    assert s.replay_results() == s.want, f"{what}: the replay's results changed"
    wait(f"windows keep closing after {what}", lambda: _windows_closed(s) > before, 120)


def test_down_and_up_keep_results_and_checkpoint(up: Site) -> None:
    """``down`` then ``up`` (Kafka, job and API recreated on their volumes): the job resumes from its
    checkpoint. A restart of the job alone is the same recovery with Kafka kept up, so it is not run apart."""
    s = up
    s.live_total = 40
    t0 = time.monotonic()
    s.central("down", "-t", "60", timeout=300)
    assert s.central.containers() == {}
    s.central("up", "-d", *CENTRAL_SERVICES, timeout=900)
    _still_exact_and_closing(s, "down and up", 15)
    TIMINGS["down_up_s"] = round(time.monotonic() - t0, 1)
    # the live agent buffered while Kafka was away and lost nothing: every packet sent is served
    metrics = http(f"http://127.0.0.1:{s.ports['live_metrics']}/metrics")
    lost = [ln for ln in metrics.splitlines() if ln.startswith("lowwater_agent_backlog_lost_records_total")]
    assert all(float(ln.split()[-1]) == 0 for ln in lost), lost


def test_three_broker_profile_replicates(up: Site) -> None:
    """deploy/kafka-cluster.yml: three KRaft brokers, topics with RF 3 and min.insync.replicas 2."""
    s = up
    t0 = time.monotonic()
    with s.k3.env_file.open("a") as f:  # picked now, not at setup: a port free then may be taken by now
        f.write("".join(f"KAFKA_EXTERNAL_PORT{sfx}={free_port()}\n" for sfx in ("", "_2", "_3")))
    try:
        _three_brokers_replicate(s)
    finally:
        s.k3("down", "-v", "-t", "10", timeout=300)
    TIMINGS["kafka_cluster_s"] = round(time.monotonic() - t0, 1)


def _three_brokers_replicate(s: Site) -> None:
    s.k3("up", "-d", "kafka", "kafka-2", "kafka-3", "kafka-init", timeout=600)

    def described() -> str | bool:
        cs = s.k3.containers()
        if cs.get("kafka-init", {}).get("State", {}).get("Status") != "exited":
            return False
        assert cs["kafka-init"]["State"]["ExitCode"] == 0, s.k3.logs("kafka-init")
        return run(
            [
                "docker",
                "exec",
                cs["kafka"]["Id"],
                "/opt/kafka/bin/kafka-topics.sh",
                "--bootstrap-server",
                "kafka:9092",
                "--describe",
                "--topic",
                "lowwater.ct.pairs",
            ]
        ).stdout

    out = wait("3-broker topics", described, 300, lambda: s.k3.logs(tail=40))
    assert "ReplicationFactor: 3" in out, out
    assert len(re.findall(r"Isr: \d,\d,\d", out)) == 2, out  # both partitions: three replicas in sync
    kafka = s.k3.containers()["kafka"]["Id"]
    conf = run(
        [
            "docker",
            "exec",
            kafka,
            "/opt/kafka/bin/kafka-configs.sh",
            "--bootstrap-server",
            "kafka:9092",
            "--describe",
            "--entity-type",
            "topics",
            "--entity-name",
            "lowwater.ct.pairs",
            "--all",
        ]
    ).stdout
    assert re.search(r"^\s*min.insync.replicas=2 ", conf, re.M), conf


def test_down_v_leaves_nothing_behind(up: Site) -> None:
    s = up
    for c in (s.live, s.replay, s.central):
        c("down", "-v", "-t", "30", timeout=300)
    for kind in ("ps -a", "volume ls", "network ls"):
        for c in (s.central, s.replay, s.live, s.k3):
            left = run(
                ["docker", *kind.split(), "-q", "--filter", f"label=com.docker.compose.project={c.project}"]
            ).stdout
            assert not left.strip(), f"{kind} after down -v of {c.project}: {left}"
