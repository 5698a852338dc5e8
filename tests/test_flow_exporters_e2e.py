"""Two exporters at once, end to end (issue #29's "done when"): pmacct exports NetFlow v9 (``nfprobe``) from
127.0.0.2 and sFlow (``sfprobe``, agent 127.0.0.3) from two pcaps, both with ifIndex 5 (TCP) and 7 (UDP)
by a pre_tag_map, into ONE ``lowwater-agent --source flows:`` -> real Kafka -> the real Spark job, grouped by
(exporter, in_iface). The job's closed windows must equal nfdump's (NetFlow, by end time) and sfacctd's
(sFlow, by arrival) totals per (exporter, interface, window); the API then names the ports from an
interfaces file and follows SIGHUP reloads (a bad file keeps the old names and is counted)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from contract import query as Q
from local_stack.kafka_broker import free_port
from lowwater_testing.agent import agent_cmd, metrics_text
from lowwater_testing.flows import (
    PAIRS_AGGREGATES,
    flow_pcap,
    free_udp_port,
    nfdump_ms,
    nfdump_records,
    wait_udp,
)
from lowwater_testing.page import chromium
from lowwater_testing.queries import config, query
from lowwater_testing.sflow import Sfacctd, counter_sample, datagram, sfprobe_export
from lowwater_testing.spark import expecting, read_results, run_job
from lowwater_testing.traffic import NS

REPO = Path(__file__).resolve().parents[1]
NF_EXPORTER, SF_AGENT = "127.0.0.2", "127.0.0.3"
WINDOW_S = 4
SF_RATE = 4
SLACK_S = 1
EXPORTER_TIMEOUT_S = 3
PEERS = all(shutil.which(x) for x in ("pmacctd", "sfacctd", "nfcapd", "nfdump"))
pytestmark = pytest.mark.skipif(not PEERS, reason="pmacct / nfdump not installed (./lw setup installs them)")
TAG_MAP = "set_tag=5 filter='tcp'\nset_tag=7 filter='udp'\n"  # ifIndex 5 for TCP, 7 for UDP, both exporters


def _u32(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def _receive(rx: socket.socket, proc: subprocess.Popen) -> list[bytes]:
    """Every datagram until pmacctd exits by itself after the pcap (nfprobe exports at its shutdown)."""
    out: list[bytes] = []
    rx.settimeout(0.5)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                out.append(rx.recv(65535))
            except TimeoutError:
                if proc.poll() is not None:
                    break
    finally:
        rx.close()
        if proc.poll() is None:
            proc.kill()
        log = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert out, log
    return out


def nfprobe_export(pcap: Path, tmp: Path) -> list[bytes]:
    """pmacctd's NetFlow v9 export (nfprobe) of the pcap, ifIndex from the tag map, every datagram as received."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    rx.bind(("127.0.0.1", 0))
    (tmp / "tags.map").write_text(TAG_MAP)
    conf = tmp / "nfprobe.conf"
    conf.write_text(
        "daemonize: false\n"
        f"pcap_savefile: {pcap}\n"
        "plugins: nfprobe\n"
        f"nfprobe_receiver: 127.0.0.1:{rx.getsockname()[1]}\n"
        "nfprobe_version: 9\n"
        f"pre_tag_map: {tmp / 'tags.map'}\n"
        "nfprobe_ifindex[default_nfprobe]: tag\n"  # per plugin only (pmacct refuses them global)
        "nfprobe_direction[default_nfprobe]: in\n"
    )
    proc = subprocess.Popen(["pmacctd", "-f", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return _receive(rx, proc)


class Nfcapd:
    """nfcapd collecting on a free loopback port; :meth:`rows` lists (router, in ifIndex, end ms, packets, bytes)."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "nfcapd"
        self.dir.mkdir()
        self.port = free_udp_port()
        self.proc = subprocess.Popen(
            ["nfcapd", "-p", str(self.port), "-b", "127.0.0.1", "-w", str(self.dir), "-t", "3600"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            wait_udp(self.port)  # every datagram read before the stop
        self.proc.terminate()
        self.proc.wait(30)

    def rows(self) -> list[tuple[str, int, int, int, int]]:
        files = sorted(str(p) for p in self.dir.iterdir() if p.name.startswith("nfcapd."))
        assert files, "nfcapd wrote no file"
        return [
            (ra, int(inif), nfdump_ms(te), int(pk), int(by))
            for ra, inif, te, pk, by in nfdump_records("%ra,%in,%te,%pkt,%byt", "-R", str(self.dir))
        ]


def _send(grams: list[bytes], src: str, ports: list[int]) -> None:
    """Send every datagram from ``src`` to each port, paced so that no receiver's buffer overflows."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind((src, 0))
    for x in grams:
        for p in ports:
            tx.sendto(x, ("127.0.0.1", p))
        time.sleep(0.0005)
    tx.close()


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _sflow_bursts(grams: list[bytes], ports: list[int], bursts: int = 2) -> list[int]:
    """The sFlow datagrams in ``bursts`` bursts from the agent's address, each 0.3 s into its own window, so
    that lowwater's and sfacctd's arrival times fall in the same window; returns each burst's window start."""
    per, starts = -(-len(grams) // bursts), []
    for b in range(bursts):
        start = (int(time.time() // WINDOW_S) + 1) * WINDOW_S
        _sleep_until(start + 0.3)
        starts.append(start)
        _send(grams[b * per : (b + 1) * per], SF_AGENT, ports)
        assert time.time() < start + WINDOW_S - 0.3, "a burst overran its window: machine too loaded"
    return starts


@pytest.fixture(scope="module")
def pipeline(kafka, spark, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both exporters -> one agent -> Kafka -> the job; the job's results, the peers' oracle, the config."""
    tmp = tmp_path_factory.mktemp("exporters")
    topic = kafka.create_topic(f"flow-exporters-{os.getpid()}-{time.time_ns() % 10**8}", 2)
    cfg = tmp / "q.yaml"
    config(
        query(
            "by_iface",
            group_by=["exporter", "in_iface"],
            aggregates=PAIRS_AGGREGATES,
            window=f"{WINDOW_S}s",
            table=256,
            topic=topic,
            partitions=2,
        )
    ).write(cfg)
    q = Q.load(cfg).queries[0]
    # NetFlow: pmacct times records by the packets' times and its header by the wall clock: packets of
    # the last 12 s, so every record ends within the collector's inactive timeout of its export
    nf_pcap, sf_pcap = tmp / "nf.pcap", tmp / "sf.pcap"
    flow_pcap(nf_pcap, 6000, 29, time.time_ns() - 12 * NS, 10 * NS)
    nf_grams = nfprobe_export(nf_pcap, tmp)
    exported = max(struct.unpack("!I", g[8:12])[0] for g in nf_grams)  # the exporter's clock (v9 header)
    flow_pcap(sf_pcap, 4000, 30, time.time_ns(), 10 * NS)
    (tmp / "tags.map").write_text(TAG_MAP)
    sf_grams = sfprobe_export(sf_pcap, tmp, sampling_rate=SF_RATE, agent=SF_AGENT, extra=_sf_tagging(tmp))
    port = free_udp_port()
    nfcapd, sfacctd = Nfcapd(tmp), Sfacctd(tmp, renormalize=False, aggregate="peer_src_ip, in_iface")
    agent = subprocess.Popen(
        agent_cmd(
            cfg,
            f"flows:127.0.0.1:{port},inactive=60,slack={SLACK_S},exporter_timeout={EXPORTER_TIMEOUT_S}",
            host="routers",
            bootstrap=kafka.bootstrap_servers,
            metrics_port=(metrics := free_port()),
            extra=("--summary", str(tmp / "summary.json")),
        ),
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    rest: list[str] = []
    reader = None
    try:
        for line in agent.stderr:  # ready once it says which source it runs
            rest.append(line)
            if "queries, source" in line:
                break
        reader = threading.Thread(target=lambda: rest.extend(agent.stderr), daemon=True)
        reader.start()
        # nfcapd and sfacctd have no ready line: wait until their sockets are bound
        wait_udp(nfcapd.port, read=False)  # nfcapd has no ready line (sfacctd's start waits the same way)
        _send(nf_grams, NF_EXPORTER, [port, nfcapd.port])
        # the NetFlow exporter stops holding the mark once the sFlow agent's clock is EXPORTER_TIMEOUT past
        # its export clock: from then on the agent's arrivals (minus slack) close the windows
        _sleep_until(exported + EXPORTER_TIMEOUT_S + 1)
        starts = _sflow_bursts(sf_grams, [port, sfacctd.port])
        # one more datagram of the agent (a counter sample, no flow) after the last window's end + slack:
        # the mark passes it and the job closes it
        _sleep_until(starts[-1] + WINDOW_S + SLACK_S + 0.5)
        _send([datagram([counter_sample(5, 1, 2)], agent=SF_AGENT, seq=10**6)], SF_AGENT, [port])
        last_end = starts[-1] + WINDOW_S
        sent = len(nf_grams) + len(sf_grams) + 1
        _wait(
            lambda: (
                _agent_says(metrics, "flow_datagrams_total", sum) == sent
                and _agent_says(metrics, "low_water_mark_timestamp_seconds", max) >= last_end
            ),
            "the agent to take every datagram and punctuate past the last window",
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
        if reader is not None:
            reader.join(10)
        nfcapd.stop()
        sf_log = sfacctd.stop()
    assert agent.returncode == 0, "".join(rest)[-3000:]
    summary = json.loads((tmp / "summary.json").read_text())
    assert summary["source"]["late_records"] == 0, summary["source"]
    want: Counter = Counter()

    def window_end(t_ns: int) -> int:
        return q.window.origin_ns + ((t_ns - q.window.origin_ns) // q.window.range_ns + 1) * q.window.range_ns

    nf_rows = nfcapd.rows()
    assert {r[0] for r in nf_rows} == {NF_EXPORTER} and {r[1] for r in nf_rows} == {5, 7}, nf_rows[:5]
    assert sum(r[3] for r in nf_rows) == 6000  # every packet of the pcap in a record nfdump read
    for ra, inif, end_ms, pk, by in nf_rows:
        key = (window_end(end_ms * 1_000_000), _u32(ra), inif)
        want[key + ("packets",)] += pk
        want[key + ("bytes",)] += by
    sf_rows = sfacctd.records()
    assert sf_rows, sf_log[-2000:]
    assert {r["PEER_SRC_IP"] for r in sf_rows} == {SF_AGENT}, sf_rows[:3]
    assert {int(r["IN_IFACE"]) for r in sf_rows} == {5, 7}, sf_rows[:3]
    for r in sf_rows:
        key = (window_end(int(r["TIMESTAMP_ARRIVAL"]) * NS), _u32(SF_AGENT), int(r["IN_IFACE"]))
        want[key + ("packets",)] += int(r["PACKETS"]) * SF_RATE
        want[key + ("bytes",)] += int(r["BYTES"]) * SF_RATE
    assert {k[0] for k in want if k[1] == _u32(SF_AGENT)} == {(s + WINDOW_S) * NS for s in starts}

    job = run_job(spark, [q], tmp, "exporters", **expecting(kafka, ["routers"]))
    res = Path(job.opts.results)
    got_df = read_results(res, "by_iface")
    return {"q": q, "cfg": cfg, "results": res, "want": want, "got": got_df, "tmp": tmp}


def _agent_says(port: int, name: str, fold) -> float:
    """``fold`` (sum, max) over the samples of the agent's ``lowwater_agent_<name>``; -1 without any."""
    vals = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text(port).splitlines()
        if line.startswith(f"lowwater_agent_{name}{{") or line.startswith(f"lowwater_agent_{name} ")
    ]
    return fold(vals) if vals else -1


def _sf_tagging(tmp: Path) -> str:
    return f"pre_tag_map: {tmp / 'tags.map'}\nsfprobe_ifindex[default_sfprobe]: tag\nsfprobe_direction[default_sfprobe]: in\n"


def test_job_results_equal_nfdump_and_sfacctd_per_exporter_interface_and_window(pipeline) -> None:
    """Every closed window of the job, per (exporter, in_iface): packets and bytes as the peers say; the
    same ifIndex of the two exporters is two groups."""
    df, want = pipeline["got"], pipeline["want"]
    fin = df[df["kind"] == "final"]
    assert not fin.duplicated(["window_end", "exporter", "in_iface"]).any()
    assert (
        fin["complete"].all() and (fin["missing_records"] == 0).all()
    )  # closed by punctuation, nothing lost
    got: Counter = Counter()
    for r in fin.itertuples(index=False):
        end = pd.Timestamp(r.window_end).value
        got[(end, int(r.exporter), int(r.in_iface), "packets")] += int(r.packets)
        got[(end, int(r.exporter), int(r.in_iface), "bytes")] += int(r.bytes)
    assert got == want
    groups = {(k[1], k[2]) for k in got}
    assert groups == {(_u32(e), i) for e in (NF_EXPORTER, SF_AGENT) for i in (5, 7)}


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read().decode()
    return json.loads(body) if resp.headers.get("content-type", "").startswith("application/json") else body


def _wait(cond, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


IFACES = """\
exporters:
  127.0.0.2:
    name: router-a
    interfaces:
      5: {name: xe-0/0/5, speed: 10000}
      7: {name: xe-0/0/7, speed: 100000}
  127.0.0.3:
    name: switch-b
    interfaces:
      5: {name: Ethernet5, speed: 25000}
"""


def test_api_names_ports_and_reloads_on_sighup(pipeline) -> None:
    """``lowwater-api --interfaces``: rows grouped by (exporter, in_iface) carry the port's name and speed;
    SIGHUP with a bad file keeps the names (logged, counted), with a good one renames."""
    tmp = pipeline["tmp"]
    ifile = tmp / "interfaces.yaml"
    ifile.write_text(IFACES)
    port, token = free_port(), "t0k3n"
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "high_level.serve.api",
            "--config",
            str(pipeline["cfg"]),
            "--results",
            str(pipeline["results"]),
            "--port",
            str(port),
            "--interfaces",
            str(ifile),
            "--log-level",
            "warning",
        ],
        env={**os.environ, "LOWWATER_API_TOKEN": token},
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    base = f"http://127.0.0.1:{port}"
    fin = pipeline["got"]
    start = (fin["window_start"].min() - datetime.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = (fin["window_end"].max() + datetime.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:

        def latest() -> dict | None:
            try:
                return _get(f"{base}/queries/by_iface/results?start={start}&end={end}", token)
            except urllib.error.HTTPError:
                raise  # an answer, just not a good one: say it now
            except OSError:  # not listening yet
                return None

        body = _wait(latest, "the API")
        rows = body["rows"]
        assert rows and body["name_columns"] == ["exporter_name", "in_iface_name", "in_iface_speed"]
        names = {
            (r["exporter"], r["in_iface"]): (r["exporter_name"], r["in_iface_name"], r["in_iface_speed"])
            for r in rows
        }
        a, b = _u32(NF_EXPORTER), _u32(SF_AGENT)
        assert names == {
            (a, 5): ("router-a", "xe-0/0/5", 10000),
            (a, 7): ("router-a", "xe-0/0/7", 100000),
            (b, 5): ("switch-b", "Ethernet5", 25000),
            (b, 7): ("switch-b", None, None),  # a port the file does not name
        }

        def reloads(result: str) -> float:
            text = _get(f"{base}/metrics", token)
            line = next(
                x
                for x in text.splitlines()
                if x.startswith(f'lowwater_api_interfaces_reloads_total{{result="{result}"}}')
            )
            return float(line.split()[-1])

        # a bad file is counted and keeps the names it had; a good one renames
        for edit, result, name in (
            (("speed: 25000", "speed: 25G"), "error", "Ethernet5"),
            (("Ethernet5", "Ethernet5/1"), "ok", "Ethernet5/1"),
        ):
            ifile.write_text(IFACES.replace(*edit))
            api.send_signal(signal.SIGHUP)
            _wait(lambda result=result: reloads(result) == 1, f"the {result} reload to be counted")
            names = {(r["exporter"], r["in_iface"]): r["in_iface_name"] for r in latest()["rows"]}
            assert names[(b, 5)] == name
        assert api.poll() is None  # SIGHUP reloads, it does not stop the API
        # the page prints them beside the ifIndex (its top rows are the newest window's: the sFlow agent's)
        dom = chromium(f"{base}/ui#token={token}", tmp / "profile", "--dump-dom", budget_ms=15000).stdout
        assert f"{b} · switch-b" in dom and "5 · Ethernet5/1 (25G)" in dom, dom[-3000:]
    finally:
        api.terminate()
        _, err = api.communicate(timeout=30)
    assert "interfaces.yaml:10" in err and "not reloaded" in err, err[-2000:]
