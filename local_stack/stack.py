"""The local all-in-one stack: Kafka (KRaft), the high-level Spark job (local mode), the REST API
and one capture agent on a source that needs no special hardware (the generator by default).

``./lw run`` calls this. Every component runs as its own process, exactly as in a deployment; this
module only starts them in order, waits for each to be healthy, prints where to look, and stops
everything on Ctrl-C (or after ``--duration`` seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import dpkt

from contract import query as Q
from contract import status as S
from contract.control import CONTROL_TOPIC
from contract.query.durations import NS
from contract.results import STATUS_FILE
from contract.topics import wanted_topics
from local_stack.jars import state_dir
from local_stack.kafka_broker import KafkaBroker, KafkaBrokerError, TopicMismatch

REPO = Path(__file__).resolve().parents[1]


def _bin(name: str) -> str:
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def _log_of(proc: subprocess.Popen, logs: Path) -> Path:
    return logs / (Path(str(proc.args[0])).name.removeprefix("lowwater-") + ".log")


def _exited(proc: subprocess.Popen, logs: Path) -> SystemExit:
    """The stack's exit when one of its processes ended unexpectedly: who, its status, its last words."""
    name = Path(str(proc.args[0])).name
    return SystemExit(
        f"lowwater-stack: {name} exited with {proc.returncode}; the end of its log "
        f"({_log_of(proc, logs)}):\n{_tail(_log_of(proc, logs))}"
    )


def _wait_http(
    url: str, timeout: float, proc: subprocess.Popen, logs: Path, done_ok: bool = False, waiting: str = ""
) -> None:
    """Wait until ``url`` answers; a process that exits first is an error, unless it exited cleanly and
    ``done_ok`` (an agent on a short capture may be done before its metrics were ever asked for).
    ``waiting`` is said every 30 s, so a long first start (a cold kernel compile) does not look hung."""
    start = time.monotonic()
    deadline, said = start + timeout, start
    while time.monotonic() < deadline:
        if waiting and time.monotonic() - said >= 30:
            said = time.monotonic()
            print(f"[stack] {waiting} ({said - start:.0f} s so far)", flush=True)
        if done_ok and proc.poll() == 0:
            return
        if proc.poll() is not None:
            raise _exited(proc, logs)
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"lowwater-stack: {url} did not answer within {timeout:.0f}s")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in text[-lines:])


def _first_packet_ns(path: str) -> int | None:
    """The first record's timestamp (ns) of a pcap or pcapng file, read by dpkt; None for an empty, short or
    unreadable file (then nothing is checked up front: the end-of-capture line still reports late partials)."""
    try:
        with open(path, "rb") as f:
            for ts, _frame in dpkt.pcap.UniversalReader(f):
                return int(ts) * NS + round((ts - int(ts)) * NS)  # a float's ns would round off the seconds
    except (OSError, ValueError, dpkt.dpkt.Error):
        return None
    return None


def _closed_frontier_ns(status_path: Path, cfg: Q.Config) -> int | None:
    """Where the store's closed windows end (ns), from the last run's status: a packet older than this
    lands in a window an earlier run already closed on some partition, so the job counts it late."""
    try:
        doc = S.read(status_path)
    except S.StatusUnavailable:
        return None
    frontier = None
    for q in cfg.queries:
        qs = doc.queries.get(q.name)
        for p in qs.partitions.values() if qs else []:
            if p.closed_before_window is not None:
                ns = q.window.origin_ns + p.closed_before_window * q.window.pane_ns
                frontier = ns if frontier is None else max(frontier, ns)
    return frontier


def _host_late(doc: S.StatusDocument | Path, host: str) -> int:
    """The late partials the store has counted for ``host`` so far (0 without a status)."""
    try:
        doc = doc if isinstance(doc, S.StatusDocument) else S.read(doc)
    except S.StatusUnavailable:
        return 0
    return sum(h.late_partials for h in doc.hosts if h.host == host)


def _utc(ns: int) -> str:
    try:
        return datetime.fromtimestamp(ns / NS, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return "the end of time"


def _older_than_store(source: str, status_path: Path, cfg: Q.Config) -> str | None:
    """The warning for a capture (``pcap:FILE`` without ``loop``, which keeps its own timestamps) that
    starts before the windows the store already closed, else None. Why: the stack keeps its broker,
    checkpoint and results across runs, and the closed frontier is per partition, not per host, so such
    packets are late under any host id."""
    kind, _, rest = source.partition(":")
    path, *flags = rest.split(",")
    if kind != "pcap" or "loop" in flags:
        return None
    first, frontier = _first_packet_ns(path), _closed_frontier_ns(status_path, cfg)
    if first is None or frontier is None or first >= frontier:
        return None
    return (
        f"[stack] warning: this capture starts at {_utc(first)}, before {_utc(frontier)}, up to where "
        "this stack's store (kept from earlier runs) has already closed its windows: the capture's packets "
        "before then fall in closed windows, are counted as late partials and are not in the results. "
        f"For the capture's exact results, replay it on an empty store: ./lw run --fresh --source {source}"
    )


def _capture_finished(
    summary_path: Path,
    status_path: Path,
    host: str,
    timeout_s: float,
    procs: list[subprocess.Popen],
    late_before: int = 0,
) -> str:
    """After a finite source ended: wait until the job has closed every window of the capture, and
    return the line that says so (or what is still open when ``timeout_s`` passes)."""
    try:
        seen = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        seen = {}
    if "incarnation" not in seen:  # without it a status of an earlier run could pass for this one
        return f"capture finished, but the agent left no summary in {summary_path}: cannot tell when its windows close"
    deadline = time.monotonic() + timeout_s
    doc, why = None, ""
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(
                    f"lowwater-stack: {p.args[0]} exited with {p.returncode} while closing the capture's windows"
                )
        try:
            doc = S.read(status_path)
            if doc.stream_ended(host, int(seen["incarnation"])):
                break
        except S.StatusUnavailable as exc:
            why = str(exc)
        time.sleep(0.5)
    else:
        open_ = {n: q.open_windows for n, q in (doc.queries.items() if doc else [])}
        return (
            f"capture finished, but not every window closed within {timeout_s:.0f}s "
            f"(open windows per query: {open_ or why or 'no status yet'})"
        )
    packets = seen.get("packets")
    lost = [
        f"{seen[k]} {k.replace('_', ' ')}"
        for k in ("parse_errors", "ring_drops", "backlog_lost")
        if seen.get(k)
    ]
    late = _host_late(doc, host) - late_before if doc is not None else 0
    return (
        f"capture finished: {packets if packets is not None else '?'} packets"
        f"{' (' + ', '.join(lost) + ')' if lost else ''}, all windows closed"
        + (
            f"; {late} late partials: the capture's packets in windows the store had closed before it, "
            "not in its results (./lw run --fresh replays it on an empty store)"
            if late > 0
            else ""
        )
    )


DEFAULT_SOURCE = "generator:rate=20000,groups=5000,clock=wall"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="lowwater-stack", description="run lowwater locally: Kafka, Spark job, API, agent"
    )
    ap.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    ap.add_argument(
        "--source",
        default=None,
        help="agent source (see lowwater-agent --help); default: the config's top-level 'source:', "
        f"else synthetic traffic at 20k pkt/s ({DEFAULT_SOURCE}). "
        "A finite source (pcap:FILE) ends with every window closed; the stack stays up until Ctrl-C",
    )
    ap.add_argument("--kafka-port", type=int, default=9092)
    ap.add_argument("--api-port", type=int, default=8080)
    ap.add_argument("--agent-metrics-port", type=int, default=9101)
    ap.add_argument("--job-metrics-port", type=int, default=9102)
    ap.add_argument("--duration", type=float, default=None, help="stop everything after this many seconds")
    ap.add_argument(
        "--close-timeout",
        type=float,
        default=300.0,
        help="after a finite source ends, wait this long for every window to close",
    )
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="start from nothing: delete the local Kafka broker's data, results and checkpoints",
    )
    ap.add_argument(
        "--alert-webhook",
        metavar="URL",
        help="deliver the queries' alerts to this Alertmanager v2 endpoint (e.g. http://127.0.0.1:9093/api/v2/alerts)",
    )
    args = ap.parse_args(argv)
    try:
        cfg = Q.load(args.config)
    except Q.ConfigError as exc:
        raise SystemExit(f"lowwater-stack: {exc}") from None
    if args.source is None:
        args.source = cfg.source or DEFAULT_SOURCE
        print(f"[stack] source: {args.source}" + (f" (from {args.config})" if cfg.source else ""), flush=True)

    state = state_dir() / "stack"
    logs = state / "logs"
    results, checkpoint = state / "results", state / "checkpoint"
    broker = KafkaBroker("stack", port=args.kafka_port, die_with_parent=True)
    if args.fresh:
        try:
            broker.wipe()
        except KafkaBrokerError as exc:
            raise SystemExit(f"lowwater-stack: --fresh: {exc}") from None
        for d in (results, checkpoint):
            shutil.rmtree(d, ignore_errors=True)
        print(f"[stack] --fresh: deleted the local broker's data, {results} and {checkpoint}", flush=True)
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    host_id = "local-agent"
    summary_path = state / "agent-summary.json"
    summary_path.unlink(missing_ok=True)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C stops the stack even when SIGINT came in ignored (a shell starts background jobs so, and
    # Python then installs no handler): otherwise the children stop on the group's SIGINT and this
    # process would report their exit as a failure, with a log dump.
    signal.signal(signal.SIGINT, stop)
    try:
        print(f"[stack] starting Kafka on 127.0.0.1:{args.kafka_port} ...", flush=True)
        broker.start()
        try:
            for topic, partitions in wanted_topics([*cfg.queries, *cfg.selects, *cfg.rows]).items():
                broker.create_topic(topic, partitions)
            broker.create_topic(CONTROL_TOPIC, 1)  # the job asks blocking hosts for punctuation here
        except (TopicMismatch, ValueError) as exc:
            raise SystemExit(f"lowwater-stack: {exc}") from None
        bootstrap = broker.bootstrap_servers
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        def spawn(name: str, cmd: list[str]) -> subprocess.Popen:
            log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            procs.append(p)
            print(f"[stack] {name}: pid {p.pid}, log {logs / (name + '.log')}", flush=True)
            return p

        print("[stack] starting the high-level Spark job (local mode) ...", flush=True)
        # the job gets the connector jars ./lw setup fetched (the product never looks for them itself);
        # resolved in the job's own process, so a first fetch overlaps the API's and the agent's start
        jars = 'jars="$("$0" -m local_stack.jars --spark-list)" || exit 1; exec "$@" --spark-jars "$jars"'
        spawn(
            "job",
            [
                "sh",
                "-c",
                jars,
                sys.executable,
                _bin("lowwater-job"),
                "--config",
                args.config,
                "--bootstrap",
                bootstrap,
                "--results",
                str(results),
                "--checkpoint",
                str(checkpoint),
                "--master",
                "local[2]",
                "--metrics-port",
                str(args.job_metrics_port),
                "--control-topic",
                CONTROL_TOPIC,
                "--live",
                *(["--alert-webhook", args.alert_webhook] if args.alert_webhook else []),
            ],
        )
        api = spawn(
            "api",
            [
                _bin("lowwater-api"),
                "--config",
                args.config,
                "--results",
                str(results),
                "--port",
                str(args.api_port),
                "--live-bootstrap",
                bootstrap,
            ],
        )
        _wait_http(f"http://127.0.0.1:{args.api_port}/health", 60, api, logs)
        warning = _older_than_store(args.source, results / STATUS_FILE, cfg)
        if warning:
            print(warning, flush=True)
        late_before = _host_late(results / STATUS_FILE, host_id)
        print("[stack] starting the capture agent ...", flush=True)
        agent = spawn(
            "agent",
            [
                _bin("lowwater-agent"),
                "--config",
                args.config,
                "--source",
                args.source,
                "--host-id",
                host_id,
                "--bootstrap",
                bootstrap,
                "--metrics-port",
                str(args.agent_metrics_port),
                "--summary",
                str(summary_path),
                "--control-topic",
                CONTROL_TOPIC,
            ],
        )
        # a first run compiles the generated kernel (cached afterwards): minutes on a busy 2-core machine
        _wait_http(
            f"http://127.0.0.1:{args.agent_metrics_port}/metrics",
            600,
            agent,
            logs,
            done_ok=True,
            waiting="the agent is still starting: compiling its capture kernel on a first run",
        )
        page = f"http://127.0.0.1:{args.api_port}/ui"
        print(
            f"""
lowwater is running.
  results page   {page}
  REST API docs  http://127.0.0.1:{args.api_port}/docs
  agent metrics  http://127.0.0.1:{args.agent_metrics_port}/metrics
  job metrics    http://127.0.0.1:{args.job_metrics_port}/metrics
  logs           {logs}
Windows close as the agent's punctuation passes them (the first 10 s windows after ~15 s).
Press Ctrl-C to stop.""",
            flush=True,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while deadline is None or time.monotonic() < deadline:
            for p in list(procs):
                if p.poll() is None:
                    continue
                if p is agent and p.returncode == 0:
                    procs.remove(agent)
                    print(
                        "[stack] the capture source ended; waiting for the job to close every window ...",
                        flush=True,
                    )
                    line = _capture_finished(
                        summary_path, results / STATUS_FILE, host_id, args.close_timeout, procs, late_before
                    )
                    print(
                        f"[stack] {line}; results at {page} (the stack stays up: Ctrl-C to stop)", flush=True
                    )
                    continue
                if p.returncode in (0, -signal.SIGINT, -signal.SIGTERM, 130, 143):
                    # Ctrl-C in a terminal reaches every process of its group, and a child may stop before
                    # this process sees its own SIGINT: give that a moment before calling the exit a failure
                    time.sleep(2)
                raise _exited(p, logs)
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        # a second SIGINT/SIGTERM while stopping (a terminal's group signal after a direct one) must not
        # abort the orderly stop with a traceback; each child still gets at most 20 s before a kill
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
