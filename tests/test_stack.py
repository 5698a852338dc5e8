"""The local stack the way the README runs it: ``lowwater-stack`` with a pcap source, again and again
on one state directory.

A finite capture must end with every window of the file closed and served while the stack stays up;
a second run on the same state must start (the broker's topics survive); a topic of another size is
a one-line error that names the fix, and ``--fresh`` is that fix; an agent that fails stops the stack
with its reason. Results are checked against an independent dpkt aggregate of the file.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contract import fields as F
from local_stack.jars import jars_root
from local_stack.kafka_broker import KafkaBroker, TopicMismatch, free_port
from lowwater_testing.agent import dpkt_oracle, write_pcap
from lowwater_testing.queries import config as _config
from lowwater_testing.queries import pairs
from lowwater_testing.traffic import NS, T0

REPO = Path(__file__).resolve().parents[1]
WINDOW_S = 2
SPAN_S = 20


def config(path: Path, partitions: int) -> Path:
    return _config(
        pairs(window=f"{WINDOW_S}s", topic="lowwater.stacktest.pairs", partitions=partitions)
    ).write(path)


def kafka_port() -> int:
    """A free port P whose P + 1 is free too: the stack's broker puts its controller on P + 1."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two adjacent free ports")


class Stack:
    """One ``lowwater-stack`` process on free ports, its console read line by line."""

    def __init__(self, state: Path, cfg: Path, source: str, *extra: str, group: bool = False) -> None:
        self.api = free_port()
        ports = [
            "--kafka-port",
            str(kafka_port()),
            "--api-port",
            str(self.api),
            "--agent-metrics-port",
            str(free_port()),
            "--job-metrics-port",
            str(free_port()),
        ]
        env = {**os.environ, "LOWWATER_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1"}
        # the checkout's jar sets (./lw setup fetched them), not a Maven run per state dir (minutes under load)
        if jars_root().is_dir() and not (state / "jars").exists():
            state.mkdir(parents=True, exist_ok=True)
            (state / "jars").symlink_to(jars_root(), target_is_directory=True)
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "lowwater-stack"),
                "--config",
                str(cfg),
                "--source",
                source,
                *ports,
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
            # group: a process group of its own with SIGINT ignored, as a shell starts a background job
            start_new_session=group,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if group else None,
        )
        self.group = group
        self.lines: queue.Queue[str] = queue.Queue()
        self.console: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.console.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            if text in line:
                return line
        raise AssertionError(
            f"no {text!r} on the console within {timeout}s:\n{''.join(self.console)[-4000:]}"
        )

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api}{path}", timeout=10) as r:
            return json.loads(r.read())

    def results(self) -> Counter:
        start = datetime.fromtimestamp(T0 / NS - 60, UTC).isoformat().replace("+00:00", "Z")
        end = datetime.fromtimestamp(T0 / NS + SPAN_S + 60, UTC).isoformat().replace("+00:00", "Z")
        got: Counter = Counter()
        offset = 0
        while offset is not None:
            body = self.get(f"/queries/pairs/results?start={start}&end={end}&limit=10000&offset={offset}")
            for r in body["rows"]:
                ws = int(datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp()) * NS
                got[(ws, F.ip_to_words(r["src_ip"])[1], F.ip_to_words(r["dst_ip"])[1])] += r["packets"]
            offset = body["paging"]["next_offset"]
        return got

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops it (to the whole process group, as a terminal sends it, if ``group``)."""
        if self.group:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(90)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter]:
    d = tmp_path_factory.mktemp("stack-pcap")
    pcap = d / "capture.pcap"
    write_pcap(pcap, 6000, 300, SPAN_S, seed=5)
    want: Counter = Counter()
    for (pane, src, dst), n in dpkt_oracle(pcap, WINDOW_S * NS).items():
        want[(pane * WINDOW_S * NS, src, dst)] += n
    return pcap, want


def test_pcap_runs_stay_up_serve_every_window_run_again_and_a_topic_size_change_needs_fresh(
    tmp_path: Path, capture: tuple[Path, Counter]
) -> None:
    pcap, want = capture
    state = tmp_path / "state"
    cfg = config(tmp_path / "q.yaml", 2)
    for run in (1, 2):  # the second run reuses the broker's data, topics, checkpoint and results
        stack = Stack(state, cfg, f"pcap:{pcap}")
        try:
            line = stack.wait_for("capture finished", 300)
            assert "6000 packets" in line and "all windows closed" in line, line
            time.sleep(2)  # the stack stays up after the capture: still serving
            assert stack.proc.poll() is None, "".join(stack.console)[-3000:]
            assert stack.results() == want, (
                f"run {run}: served results differ from dpkt's aggregate of the file"
            )
            status = stack.get("/status")
            q = status["queries"]["pairs"]
            assert q["hosts_total"] == 1 and q["partitions_total"] == 2, q
            assert [h["host"] for h in status["hosts"]] == ["local-agent"]
            late = status["hosts"][0]["late_partials"]
            assert (late == 0) if run == 1 else (late > 0), (
                f"run {run}: the replay's partials must all be late"
            )
            if (
                run == 1
            ):  # the live panel's feed (job --live -> live topic -> API): final at close, = the store
                deadline = time.monotonic() + 60
                while True:
                    vals = stack.get("/live/pairs/values")["values"]
                    if (vals and all(v["final"] for v in vals)) or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                assert vals and all(v["final"] for v in vals), vals[:3]
                for v in vals:
                    g = v["group"]
                    key = (
                        v["window_start_us"] * 1000,
                        F.ip_to_words(g["src_ip"])[1],
                        F.ip_to_words(g["dst_ip"])[1],
                    )
                    assert v["values"]["packets"] == want[key], v
        finally:
            rc = stack.interrupt()
        assert rc == 0, "".join(stack.console)[-3000:]
    # then live traffic on the same state: the capture's end-of-stream must not make its windows late
    # started as a background job (SIGINT ignored) and stopped by SIGINT to its group: a clean stop, no
    # "exited with" report of a child that stopped on the same signal
    stack = Stack(state, cfg, "generator:rate=2000,groups=50,clock=wall", group=True)
    try:
        stack.wait_for("lowwater is running", 300)
        q0 = stack.get("/status")["queries"]["pairs"]  # the second replay's packets were all late
        end = time.monotonic() + 120
        while time.monotonic() < end:
            q = stack.get("/status")["queries"]["pairs"]
            if q["windows_closed"] > q0["windows_closed"]:
                break
            time.sleep(2)
        assert q["windows_closed"] > q0["windows_closed"], q
        assert q["hosts"]["local-agent"]["late_partials"] == q0["hosts"]["local-agent"]["late_partials"], q
    finally:
        rc = stack.interrupt()
        stack.finish()
    text = "".join(stack.console)
    assert rc == 0 and "exited with" not in text and "the end of its log" not in text, text[-3000:]
    # last, on the same state (its broker holds the topic at 2 partitions): a config that wants 3 is a
    # one-line error naming --fresh, and --fresh resets
    three = config(tmp_path / "three.yaml", 3)
    mismatch = Stack(state, three, f"pcap:{pcap}")
    assert mismatch.finish(120) != 0
    err = [ln for ln in mismatch.console if ln.startswith("lowwater-stack:")]
    assert (
        len(err) == 1 and "2 partitions" in err[0] and "3 are configured" in err[0] and "--fresh" in err[0]
    ), mismatch.console
    assert not any("Traceback" in ln for ln in mismatch.console), "".join(mismatch.console)
    fresh = Stack(state, three, f"pcap:{pcap}", "--fresh")
    try:
        fresh.wait_for("capture finished", 300)
        assert fresh.results() == want
        assert fresh.get("/status")["queries"]["pairs"]["partitions_total"] == 3
    finally:
        assert fresh.interrupt() == 0


def test_a_topic_of_another_size_is_refused_naming_fresh(kafka: KafkaBroker, topic_factory) -> None:
    """The broker's side of the stack's topic check (the session broker: the stack's is the same class)."""
    name = topic_factory(partitions=2)
    kafka.create_topic(name, 2)  # again: a no-op
    with pytest.raises(TopicMismatch, match="--fresh"):
        kafka.create_topic(name, 3)


def test_an_agent_that_fails_stops_the_stack_with_its_reason(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "state", config(tmp_path / "q.yaml", 1), f"pcap:{tmp_path / 'no-such.pcap'}")
    rc = stack.finish(240)
    text = "".join(stack.console)
    assert rc != 0 and "lowwater-agent exited with" in text and "no-such.pcap" in text, text[-3000:]


def _scapy_pcap(path: Path, n: int, t0_s: float, span_s: float) -> None:
    """A classic (microsecond) pcap of ``n`` UDP packets over ``span_s`` from ``t0_s``, written by scapy."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    pkts = []
    for i in range(n):
        p = (
            Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
            / IP(src=f"10.1.0.{1 + i % 7}", dst="10.2.0.1")
            / UDP(sport=1000 + i, dport=53)
        )
        p.time = t0_s + span_s * i / n
        pkts.append(p)
    wrpcap(str(path), pkts)


def test_first_packet_time_of_a_capture(tmp_path: Path) -> None:
    from local_stack.stack import _first_packet_ns

    pcap = tmp_path / "c.pcap"
    _scapy_pcap(pcap, 3, T0 / NS + 0.25, 1.0)
    assert _first_packet_ns(str(pcap)) == T0 + 250_000_000
    (tmp_path / "short.pcap").write_bytes(pcap.read_bytes()[:30])
    assert _first_packet_ns(str(tmp_path / "short.pcap")) is None
    assert _first_packet_ns(str(tmp_path / "missing.pcap")) is None
    ng = tmp_path / "c.pcapng"  # what tshark and dumpcap write by default
    subprocess.run(["editcap", "-F", "pcapng", str(pcap), str(ng)], check=True, capture_output=True)
    assert _first_packet_ns(str(ng)) == T0 + 250_000_000
