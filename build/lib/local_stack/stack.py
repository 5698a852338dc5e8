"""The local all-in-one stack: Kafka (KRaft), the high-level Spark job (local mode), the REST API
and one capture agent on a source that needs no special hardware (the generator by default).

``./lw run`` calls this. Every component runs as its own process, exactly as in a deployment; this
module only starts them in order, waits for each to be healthy, prints where to look, and stops
everything on Ctrl-C (or after ``--duration`` seconds).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from contract import query as Q
from local_stack.jars import state_dir
from local_stack.kafka_broker import KafkaBroker

REPO = Path(__file__).resolve().parents[1]


def _bin(name: str) -> str:
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"lowwater-stack: {proc.args[0]} exited with {proc.returncode} (see its log)")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"lowwater-stack: {url} did not answer within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="lowwater-stack", description="run lowwater locally: Kafka, Spark job, API, agent")
    ap.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    ap.add_argument("--source", default="generator:rate=20000,groups=5000,clock=wall",
                    help="agent source (see lowwater-agent --help); default: synthetic traffic at 20k pkt/s")
    ap.add_argument("--kafka-port", type=int, default=9092)
    ap.add_argument("--api-port", type=int, default=8080)
    ap.add_argument("--agent-metrics-port", type=int, default=9101)
    ap.add_argument("--job-metrics-port", type=int, default=9102)
    ap.add_argument("--duration", type=float, default=None, help="stop everything after this many seconds")
    ap.add_argument("--fresh", action="store_true", help="delete previous results and checkpoints first")
    args = ap.parse_args(argv)
    try:
        cfg = Q.load(args.config)
    except Q.ConfigError as exc:
        raise SystemExit(f"lowwater-stack: {exc}") from None

    state = state_dir() / "stack"
    logs = state / "logs"
    results, checkpoint = state / "results", state / "checkpoint"
    if args.fresh:
        import shutil

        for d in (results, checkpoint):
            shutil.rmtree(d, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    broker = KafkaBroker("stack", port=args.kafka_port, die_with_parent=True)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        print(f"[stack] starting Kafka on 127.0.0.1:{args.kafka_port} ...", flush=True)
        broker.start()
        for q in cfg.queries:
            broker.create_topic(q.topic, q.kafka.partitions)
        bootstrap = broker.bootstrap_servers
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def spawn(name: str, cmd: list[str]) -> subprocess.Popen:
            log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            procs.append(p)
            print(f"[stack] {name}: pid {p.pid}, log {logs / (name + '.log')}", flush=True)
            return p

        print("[stack] starting the high-level Spark job (local mode) ...", flush=True)
        spawn("job", [_bin("lowwater-job"), "--config", args.config, "--bootstrap", bootstrap,
                      "--results", str(results), "--checkpoint", str(checkpoint), "--master", "local[2]",
                      "--metrics-port", str(args.job_metrics_port)])
        api = spawn("api", [_bin("lowwater-api"), "--config", args.config, "--results", str(results),
                            "--port", str(args.api_port)])
        _wait_http(f"http://127.0.0.1:{args.api_port}/health", 60, api)
        print("[stack] starting the capture agent ...", flush=True)
        agent = spawn("agent", [_bin("lowwater-agent"), "--config", args.config, "--source", args.source,
                                "--host-id", "local-agent", "--bootstrap", bootstrap,
                                "--metrics-port", str(args.agent_metrics_port)])
        _wait_http(f"http://127.0.0.1:{args.agent_metrics_port}/metrics", 120, agent)
        print(f"""
lowwater is running.
  results page   http://127.0.0.1:{args.api_port}/ui
  REST API docs  http://127.0.0.1:{args.api_port}/docs
  agent metrics  http://127.0.0.1:{args.agent_metrics_port}/metrics
  job metrics    http://127.0.0.1:{args.job_metrics_port}/metrics
  logs           {logs}
Windows close as the agent's punctuation passes them (the first 10 s windows after ~15 s).
Press Ctrl-C to stop.""", flush=True)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while deadline is None or time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(f"lowwater-stack: {p.args[0]} exited with {p.returncode}; see {logs}")
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        print("[stack] stopping ...", flush=True)
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        broker.stop()


if __name__ == "__main__":
    main()
