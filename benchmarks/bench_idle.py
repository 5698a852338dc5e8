"""Cost at rest: each role's CPU share under ``./lw run``'s demo traffic with no browser, and with an idle
live interface; then how long a restarted API takes to show current live values over a big live topic.

Why: a monitor runs all day, mostly with nobody looking. Under the demo generator (20K packets/s) the API
once used 77% of a core with no client (the live table re-sorted every window start per new key) and the
agent 24% (the generator woke per packet, the host loop every 0.5 ms when idle); and a restarted API
replayed ~400K live messages of earlier runs before its live panel was current again.

Phases, one local stack (a Kafka broker of its own on free ports, the Spark job in local mode, the API with
``--live-bootstrap``, one agent), every role a process whose CPU seconds (its process tree, from /proc)
are read over the phase:

1. ``demo``: the agent on ``generator:rate=20000,...`` (what ``./lw run`` starts), no HTTP client;
2. ``idle_interface``: the agent on ``afpacket:<veth>``, a veth pair this benchmark creates (IPv6 off,
   nothing sends on it), the job and API as before; measured once the job is at rest (no window open
   and no row held, from its /metrics; a bounded wait with a progress line, ``job_rest_wait_s``);
3. ``catch_up``: the live topic of ``bytes_per_dst24`` began with ``--catch-up-messages`` values of old
   windows (written before the job started, stamped an hour ago: earlier runs); the API is restarted,
   and ``live_catch_up_s`` is the time from its start until ``/live/<query>/values`` holds the newest
   window the job published.

Root only (the veth and AF_PACKET). Goals: ``api_cpu_share_no_client`` <= 0.05,
``agent_cpu_share_idle_interface`` <= 0.02, ``job_cpu_share_idle_interface`` <= 0.5 (argued at GOALS),
``live_catch_up_s`` <= 10. ``--quick`` measures 10 s per phase
(a smoke run, not a figure to publish). Writes ``idle.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import load, machine, parser, write_results
from benchmarks.proccpu import machine_busy_seconds, tree_cpu_seconds
from contract import live as L
from contract import query as Q
from contract.control import CONTROL_TOPIC
from contract.topics import wanted_topics
from local_stack.kafka_broker import KafkaBroker, free_port

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "default.yaml"
DEMO_SOURCE = "generator:rate=20000,groups=5000,clock=wall"  # local_stack.stack.DEFAULT_SOURCE
LIVE_QUERY = "bytes_per_dst24"
# the job at idle: its only input is punctuation (each host's timer mark per query per second, for
# liveness, and a moved mark per pane), and Spark runs a whole micro-batch (Kafka offsets, the stateful
# step over every shuffle partition and its Python workers, the checkpoint's offset, state and commit
# files) whenever an offset moved. Half a core is what a monitor may cost with nothing to monitor on the
# 2-core central host of deploy/README.md's sizing; it was 1.26 (a micro-batch every second costing more
# than a second of CPU)
GOALS = {
    "api_cpu_share_no_client": 0.05,
    "agent_cpu_share_idle_interface": 0.02,
    "job_cpu_share_idle_interface": 0.5,
    "live_catch_up_s": 10.0,
}


def _bin(name: str) -> str:
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _wait(what: str, ok: Any, timeout: float, procs: list[subprocess.Popen]) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"bench_idle: {p.args[0]} exited with {p.returncode} while waiting: {what}")
        try:
            if ok():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"bench_idle: {what} not within {timeout:.0f} s")


class Stack:
    """The roles as processes (logs in ``state/logs``), started and stopped by pid."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.logs = state / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.broker = KafkaBroker("bench-idle", port=0, state=state)
        self.procs: dict[str, subprocess.Popen] = {}
        self.api_port = free_port()
        self.agent_port = free_port()
        self.job_port = free_port()

    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.procs[name] = p
        return p

    def start(self, old_messages: int) -> float:
        """Broker and topics, ``old_messages`` of earlier runs on the live topic, then the roles; returns
        the seconds the old messages took to write."""
        from kafka import KafkaAdminClient

        from high_level.live.publish import ensure_live_topics

        cfg = Q.load(CONFIG)
        self.broker.start()
        for topic, parts in wanted_topics([*cfg.queries, *cfg.selects]).items():
            self.broker.create_topic(topic, parts)
        self.broker.create_topic(CONTROL_TOPIC, 1)
        admin = KafkaAdminClient(bootstrap_servers=self.broker.bootstrap_servers)
        try:
            ensure_live_topics(admin, cfg.queries)
        finally:
            admin.close()
        # before the job publishes: a producer stamps its messages in order, earlier runs come first
        fill_s = fill_old(self.broker.bootstrap_servers, L.live_topic(LIVE_QUERY), old_messages)
        jars = 'jars="$("$0" -m local_stack.jars --spark-list)" || exit 1; exec "$@" --spark-jars "$jars"'
        self.spawn(
            "job",
            ["sh", "-c", jars, sys.executable, _bin("lowwater-job"), "--config", str(CONFIG)]
            + ["--bootstrap", self.broker.bootstrap_servers, "--results", str(self.state / "results")]
            + ["--checkpoint", str(self.state / "checkpoint"), "--master", "local[2]"]
            + ["--metrics-port", str(self.job_port), "--control-topic", CONTROL_TOPIC, "--live"],
        )
        self.start_api()
        self.start_agent(DEMO_SOURCE)
        return fill_s

    def start_api(self) -> float:
        """Start the API; returns the monotonic time it was started."""
        t0 = time.monotonic()
        self.spawn(
            "api",
            [_bin("lowwater-api"), "--config", str(CONFIG), "--results", str(self.state / "results")]
            + ["--port", str(self.api_port), "--live-bootstrap", self.broker.bootstrap_servers]
            + ["--log-level", "warning"],
        )
        _wait("API /health", lambda: _get(f"{self.api}/health"), 120, list(self.procs.values()))
        return t0

    def start_agent(self, source: str) -> None:
        self.spawn(
            "agent",
            [_bin("lowwater-agent"), "--config", str(CONFIG), "--source", source, "--host-id", "bench-idle"]
            + ["--bootstrap", self.broker.bootstrap_servers, "--metrics-port", str(self.agent_port)]
            + ["--control-topic", CONTROL_TOPIC],
        )
        _wait(
            "agent /metrics",
            lambda: _get(f"http://127.0.0.1:{self.agent_port}/metrics"),
            900,
            list(self.procs.values()),
        )

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def stop_role(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def stop(self) -> None:
        for name in ("agent", "api", "job"):
            self.stop_role(name)
        self.broker.stop()


def measure(stack: Stack, seconds: float) -> dict[str, float]:
    """Each role's CPU share (CPU seconds of its process tree / wall seconds) over ``seconds``."""
    pids = {n: p.pid for n, p in stack.procs.items()}
    before = {n: tree_cpu_seconds(pid) for n, pid in pids.items()}
    busy0, t0 = machine_busy_seconds(), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    out = {n: round((tree_cpu_seconds(pid) - before[n]) / wall, 4) for n, pid in pids.items()}
    out["machine_cores_busy"] = round((machine_busy_seconds() - busy0) / wall, 3)
    return out


def _job_metric(stack: Stack, name: str) -> dict[str, float]:
    """The job's samples of metric ``name`` (labels text -> value) from its /metrics."""
    text = _get(f"http://127.0.0.1:{stack.job_port}/metrics").decode()
    return {
        line[len(name) : line.rindex(" ")]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
    }


def windows_closed(stack: Stack) -> float:
    return sum(_job_metric(stack, "lowwater_job_windows_closed_total").values())


def job_unrested(stack: Stack) -> dict[str, float]:
    """What keeps the job from rest, per query: open windows and rows held for a window total (the
    sink's ``at_rest``, as its /metrics shows it); empty once every window up to the marks closed."""
    busy: dict[str, float] = {}
    for name in ("lowwater_job_open_windows", "lowwater_job_total_held_rows"):
        for labels, v in _job_metric(stack, name).items():
            if v:
                q = labels.split('query="', 1)[1].split('"', 1)[0] if 'query="' in labels else labels
                busy[q] = busy.get(q, 0) + v
    return busy


def wait_for_rest(stack: Stack, timeout: float) -> float | None:
    """Wait (at most ``timeout`` s, a progress line every 10 s) until no window is open; the seconds
    waited, None when the job did not rest in time (its figure is then not one at rest)."""
    t0 = time.monotonic()
    last = t0
    while True:
        for p in stack.procs.values():
            if p.poll() is not None:
                raise SystemExit(f"bench_idle: {p.args[0]} exited with {p.returncode} waiting for rest")
        try:
            busy = job_unrested(stack)
        except OSError:
            busy = {"(job /metrics not answering)": 1}
        now = time.monotonic()
        if not busy:
            return round(now - t0, 1)
        if now - t0 > timeout:
            print(f"bench_idle: the job did not rest within {timeout:.0f} s: {busy}", flush=True)
            return None
        if now - last >= 10:
            last = now
            print(
                f"bench_idle: waiting for the job to rest ({now - t0:.0f} of {timeout:.0f} s): {busy}",
                flush=True,
            )
        time.sleep(1)


def make_veth(name: str) -> None:
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
    for dev in (name, name + "p"):
        subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1"], check=False)
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)


def newest_live_window(bootstrap: str, topic: str) -> int:
    """The newest window start among the last messages of a live topic (what the job publishes now)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        c.seek(tp, max(0, end - 500))
        newest, got = 0, 0
        deadline = time.monotonic() + 10
        while got < min(end, 500) and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                for r in recs:
                    got += 1
                    if r.value is not None:
                        newest = max(newest, json.loads(r.value)["window_start_us"])
        return newest
    finally:
        c.close()


def fill_old(bootstrap: str, topic: str, n: int) -> float:
    """``n`` values of old windows on ``topic``, published an hour ago (earlier runs); returns seconds."""
    from kafka import KafkaProducer

    t0 = time.monotonic()
    prod = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=50, batch_size=1 << 20)
    hour_ago = int(time.time() * 1000) - 3_600_000
    w_old = (int(time.time()) // 10 - 360 * 24) * 10_000_000  # a day ago
    for i in range(n):
        w = w_old + (i // 5000) * 10_000_000
        doc = {
            "v": 1,
            "query": LIVE_QUERY,
            "window_start_us": w,
            "window_end_us": w + 10_000_000,
            "group": {"dst_ip_24": f"10.{i % 5000 // 250}.{i % 250}.0"},
            "values": {"bytes": 1000, "packets": 1, "avg_len": 1000.0, "max_len": 1000},
            "final": True,
            "version": 1,
            "published_ms": hour_ago,
            "hosts_in_mark": 1,
            "hosts_expected": 1,
            "complete": True,
        }
        key = json.dumps([w, list(doc["group"].values())], separators=(",", ":")).encode()
        prod.send(topic, key=key, value=json.dumps(doc).encode(), timestamp_ms=hour_ago + i // 100)
    prod.flush(300)
    prod.close()
    return time.monotonic() - t0


def catch_up(stack: Stack, n_old: int, fill_s: float) -> dict[str, Any]:
    topic = L.live_topic(LIVE_QUERY)
    stack.stop_role("api")
    target = newest_live_window(stack.broker.bootstrap_servers, topic)
    t0 = stack.start_api()
    health_s = time.monotonic() - t0
    took = None
    deadline = t0 + 300
    while time.monotonic() < deadline:
        vals = json.loads(_get(f"{stack.api}/live/{LIVE_QUERY}/values"))["values"]
        if any(v["window_start_us"] >= target for v in vals):
            took = time.monotonic() - t0
            break
        time.sleep(0.1)
    st = json.loads(_get(f"{stack.api}/live"))
    return {
        "live_catch_up_s": None if took is None else round(took, 2),
        "api_start_to_health_s": round(health_s, 2),  # of live_catch_up_s: the process start itself
        "old_messages_added": n_old,
        "old_messages_fill_s": round(fill_s, 1),
        # every message the restarted reader took from the topic (read, refused, tombstones, or replaced
        # unread by a newer value of its key)
        "messages_read_after_restart": st["received"]
        + st["rejected"]
        + st["tombstones"]
        + st.get("coalesced", 0),
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=60.0, help="measuring time per phase")
    ap.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="after the first window closed; the least after an agent start",
    )
    ap.add_argument("--catch-up-messages", type=int, default=400_000)
    ap.add_argument(
        "--rest-timeout", type=float, default=300.0, help="longest wait for the job to rest (no open window)"
    )
    ap.add_argument("--quick", action="store_true", help="10 s phases, 100K old messages (smoke run)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_idle needs root (a veth pair and AF_PACKET for the idle interface)")
    if args.quick:
        # a 10-s warm-up: the agent's first seconds (its capture kernel loaded, Kafka metadata, the first
        # marks) are start-up, not cost at rest
        args.seconds, args.warmup, args.catch_up_messages = 10.0, 10.0, 100_000
    state = Path(tempfile.mkdtemp(prefix="lowwater-bench-idle-"))
    veth = f"lwidle{os.getpid() % 100000}"
    stack = Stack(state)
    doc: dict[str, Any] = {"benchmark": "cost at rest and live catch-up", "machine": machine()}
    doc["load_avg_at_start"] = load()
    try:
        fill_s = stack.start(args.catch_up_messages)
        _wait("a first closed window", lambda: windows_closed(stack) > 0, 300, list(stack.procs.values()))
        time.sleep(args.warmup)
        demo = measure(stack, args.seconds)
        print(f"demo load: {demo}", flush=True)
        stack.stop_role("agent")
        make_veth(veth)
        t_agent = time.monotonic()
        stack.start_agent(f"afpacket:{veth}")
        # the idle phase is the job at rest: every window the demo traffic opened closed (1-min windows
        # close a minute or more after the last packet), not a fixed warm-up that may end before
        rest_s = wait_for_rest(stack, args.rest_timeout)
        time.sleep(max(0.0, args.warmup - (time.monotonic() - t_agent)))  # the agent's start-up is not rest
        idle = measure(stack, args.seconds)
        unrested_after = job_unrested(stack)
        print(
            f"idle interface: {idle}, job rested after {rest_s} s, then {unrested_after or 'still at rest'}"
        )
        cu = catch_up(stack, args.catch_up_messages, fill_s)
        print(f"catch-up: {cu}", flush=True)
        doc.update(
            {
                "source_demo": DEMO_SOURCE,
                "seconds_per_phase": args.seconds,
                "quick": args.quick,
                "agent_cpu_share_demo": demo["agent"],
                "job_cpu_share_demo": demo["job"],
                "api_cpu_share_no_client": demo["api"],
                "machine_cores_busy_demo": demo["machine_cores_busy"],
                "agent_cpu_share_idle_interface": idle["agent"],
                "job_cpu_share_idle_interface": idle["job"],
                "api_cpu_share_idle_interface": idle["api"],
                "machine_cores_busy_idle_interface": idle["machine_cores_busy"],
                # seconds from the idle agent's start until no window was open (None: not within
                # --rest-timeout: the idle job figure is then not one at rest), and what was open after
                "job_rest_wait_s": rest_s,
                "job_at_rest_during_idle": rest_s is not None and not unrested_after,
                **cu,
                "goals": GOALS,
            }
        )
        doc["meets_goals"] = {k: doc[k] is not None and doc[k] <= g for k, g in GOALS.items()}
    finally:
        stack.stop()
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    path = write_results("idle.json", doc)
    print(json.dumps(doc, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
