"""A capture host on several cores: N worker processes (AF_PACKET fanout live, a flow-hash split of a
replay), each punctuating as host ``H/wI``. Checked end to end: replay with 2 workers -> real Kafka ->
real Spark equals the oracle and the 1-worker run; live fanout over a veth pair counts every packet once."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import dpkt
import numpy as np
import pytest
from scapy.all import IP, TCP, UDP, Dot1Q, Ether, IPv6, Raw

from contract import query as Q
from contract import wire
from low_level.capture.fanout import ShareSource, flow_hash, parse_worker, share_of, worker_host_id
from low_level.capture.ring import HEAD, TAIL, Ring
from low_level.capture.workers import default_workers
from lowwater_testing.agent import metrics_text as scrape
from lowwater_testing.agent import run_agent as _run_agent
from lowwater_testing.agent import spawn_agent, spawn_workers, traffic_pcap
from lowwater_testing.queries import config, pairs
from lowwater_testing.spark import assert_exact, expecting, run_job
from lowwater_testing.topics import read_all
from lowwater_testing.traffic import build_frames, make_traffic

REPO = Path(__file__).resolve().parents[1]
NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def _hash(frame: bytes) -> int:
    b = np.frombuffer(frame, dtype=np.uint8)
    return int(flow_hash(b, 0, len(b)))


def test_flow_hash_is_symmetric_and_spreads_flows() -> None:
    e1, e2 = (
        dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02"),
        dict(src="02:00:00:00:00:02", dst="02:00:00:00:00:01"),
    )
    pairs = [
        (
            Ether(**e1) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1234, dport=80),
            Ether(**e2) / IP(src="10.0.0.2", dst="10.0.0.1") / TCP(sport=80, dport=1234),
        ),
        (
            Ether(**e1) / Dot1Q(vlan=7) / IP(src="10.0.0.1", dst="10.9.0.2") / UDP(sport=53, dport=5353),
            Ether(**e2) / Dot1Q(vlan=7) / IP(src="10.9.0.2", dst="10.0.0.1") / UDP(sport=5353, dport=53),
        ),
        (
            Ether(**e1) / IPv6(src="2001:db8::1", dst="2001:db8::2") / TCP(sport=4000, dport=443),
            Ether(**e2) / IPv6(src="2001:db8::2", dst="2001:db8::1") / TCP(sport=443, dport=4000),
        ),
        (Ether(**e1) / Raw(b"\x88\xcc" + b"x" * 40), Ether(**e2) / Raw(b"\x88\xcc" + b"x" * 40)),
    ]
    for a, b in pairs:
        assert _hash(bytes(a)) == _hash(bytes(b)), a.summary()
    base = Ether(**e1) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1234, dport=80)
    other_port = Ether(**e1) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1235, dport=80)
    assert _hash(bytes(base)) != _hash(bytes(other_port))
    # every fragment of a datagram hashes alike (the later ones have no ports)
    first = (
        Ether(**e1)
        / IP(src="10.0.0.1", dst="10.0.0.2", flags="MF", id=9)
        / UDP(sport=1, dport=2)
        / Raw(b"a" * 32)
    )
    later = Ether(**e1) / IP(src="10.0.0.1", dst="10.0.0.2", frag=5, id=9, proto=17) / Raw(b"b" * 32)
    assert _hash(bytes(first)) == _hash(bytes(later))
    assert _hash(b"\x00" * 5) == 0  # a runt frame hashes, it does not read out of bounds

    t = make_traffic(20_000, 2000, T0, 10 * NS, seed=3)
    frames, cap, _wl, _ts = build_frames(t)
    flat = np.ascontiguousarray(frames).reshape(-1)
    for n in (2, 3, 4):
        share = share_of(flat, frames.shape[1], cap.astype(np.int64), n)
        counts = np.bincount(share, minlength=n)
        assert counts.min() > 0.8 * len(share) / n, counts  # flows spread over the workers


def test_worker_flag_and_default_counts() -> None:
    assert parse_worker("1/4/256") == (1, 4, 256) and parse_worker("0/2") == (0, 2, 0)
    for bad in ("2/2", "x/2", "1", "-1/2/0"):
        with pytest.raises(ValueError, match="INDEX/COUNT"):
            parse_worker(bad)
    assert worker_host_id("edge-1", 3) == "edge-1/w3"
    assert default_workers("pcap:/x.pcap", cores=32) == 1 and default_workers("generator", cores=32) == 1
    assert default_workers("afpacket:eth0", cores=2) == 1 and default_workers("afpacket:eth0", cores=16) == 8
    assert default_workers("afpacket:eth0", cores=128) == 16


def drain_ring(ring: Ring) -> list[tuple[bytes, int]]:
    out = []
    for seq in range(int(ring.ctr[TAIL]), int(ring.ctr[HEAD])):
        s = seq & (ring.nslots - 1)
        out.append(
            (bytes(ring.frames[s * ring.snaplen : s * ring.snaplen + ring.caplen[s]]), int(ring.ts[s]))
        )
    ring.ctr[TAIL] = ring.ctr[HEAD]
    return out


def test_replay_shares_take_every_frame_once_and_keep_flows_together(tmp_path: Path) -> None:
    t, pcap = traffic_pcap(tmp_path / "s.pcap", 5000, 400, T0, 5 * NS, seed=5)
    got = []
    for i in range(3):
        ring = Ring(1 << 13)  # larger than the file: nothing waits
        src = ShareSource({"type": "pcap", "path": str(pcap)}, ring, i, 3, staging_slots=256)
        src.start()
        assert src.join(30) and src.finished and src.error is None
        mine = drain_ring(ring)
        st = src.stats()
        assert st["share"] == f"{i}/3" and st["frames_kept"] == len(mine) and st["frames_read"] == 5000
        assert st["frames_kept"] + st["frames_others"] == 5000
        got.append(mine)
    assert sum(len(g) for g in got) == 5000
    assert sorted(f for g in got for f in g) == sorted(drain_ring_all(pcap))
    flows = [{(f[26:34], f[34:38]) for f, _ in g} for g in got]  # IPv4 addresses + ports
    assert not flows[0] & flows[1] and not flows[1] & flows[2] and not flows[0] & flows[2]


def drain_ring_all(pcap: Path) -> list[tuple[bytes, int]]:
    with pcap.open("rb") as fh:
        return [(bytes(buf)[:128], int(Decimal(ts) * NS)) for ts, buf in dpkt.pcap.Reader(fh)]


def pairs_config(topic: str, sources: str, **more) -> str:
    """Packets and bytes per (src, dst) per 2 s on 2 partitions, run by the hosts ``sources`` matches."""
    aggregates = ["count as packets", "sum(length) as bytes"]
    return config(pairs(aggregates=aggregates, sources=[sources], topic=topic, partitions=2, **more)).text


def run_agent(cfg: Path, source: str, host: str, bootstrap: str, *extra: str, timeout: float = 300) -> None:
    _run_agent(cfg, source, host=host, bootstrap=bootstrap, extra=extra, timeout=timeout)


def merged(batches) -> tuple[Counter, set[str], set[tuple[str, int]]]:
    got: Counter = Counter()
    hosts, ends = set(), set()
    for part, b in batches:
        hosts.add(b.host)
        if isinstance(b, wire.Partials):
            for p, k, s in zip(b.pane, b.key, b.state, strict=True):
                got[(int(p), *map(int, k))] += int(s[0])
        elif b.mark_pane == wire.END_OF_STREAM:
            ends.add((b.host, part))
    return got, hosts, ends


@pytest.mark.kafka
@pytest.mark.spark
def test_two_workers_replay_through_kafka_and_spark_equal_oracle_and_one_worker(
    spark, kafka, topic_factory, tmp_path: Path
) -> None:
    t, pcap = traffic_pcap(tmp_path / "w.pcap", 12_000, 600, T0, 12 * NS, seed=21)
    one, two = topic_factory(partitions=2), topic_factory(partitions=2)
    cfg1, cfg2 = tmp_path / "one.yaml", tmp_path / "two.yaml"
    cfg1.write_text(pairs_config(one, "cap-1"))
    cfg2.write_text(pairs_config(two, "cap-1"))  # a worker runs what its host runs
    summary = tmp_path / "summary.json"
    run_agent(cfg1, f"pcap:{pcap}", "cap-1", kafka.bootstrap_servers)
    run_agent(
        cfg2, f"pcap:{pcap}", "cap-1", kafka.bootstrap_servers, "--workers", "2", "--summary", str(summary)
    )

    g1, h1, e1 = merged(read_all(kafka.bootstrap_servers, one, 2))
    g2, h2, e2 = merged(read_all(kafka.bootstrap_servers, two, 2))
    assert h1 == {"cap-1"} and h2 == {"cap-1/w0", "cap-1/w1"}
    assert e2 == {(h, p) for h in h2 for p in (0, 1)}, "every worker closes every partition"
    assert g2 == g1 and sum(g1.values()) == 12_000
    s = json.loads(summary.read_text())
    assert s["host"] == "cap-1" and set(s["workers"]) == h2 and s["packets"] == 12_000 and s["failed"] is None
    assert all(w["packets"] > 3000 for w in s["workers"].values()), "both workers took a share"

    q = Q.load(cfg2).queries[0]
    job = run_job(spark, [q], tmp_path, "workers", **expecting(kafka, sorted(h2)))
    assert_exact(Path(job.opts.results), q, t)
    st = json.loads((Path(job.opts.results) / "_status.json").read_text())
    assert set(st["queries"]["pairs"]["hosts"]) == h2


def test_a_replay_worker_that_dies_stops_the_agent(tmp_path: Path) -> None:
    """A replay cannot be resumed by a restarted worker (it would send packets twice): the supervisor
    stops the other workers and exits 1, naming the dead worker."""
    t, pcap = traffic_pcap(tmp_path / "d.pcap", 2000, 50, T0, 60 * NS, seed=2)
    cfg = tmp_path / "q.yaml"
    cfg.write_text(pairs_config("lw-none", "*"))
    summary = tmp_path / "s.json"
    proc = spawn_agent(
        cfg,
        f"pcap:{pcap},paced",
        host="cap-9",
        bootstrap="127.0.0.1:9",
        extra=("--workers", "2", "--summary", str(summary)),
    )
    try:
        pids = wait_children(proc.pid, 2, timeout=120)
        time.sleep(1.0)
        os.kill(pids[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]
    assert "died (exit -9)" in out and "stopping every worker" in out
    s = json.loads(summary.read_text())
    assert "died" in s["failed"]


def wait_children(pid: int, n: int, timeout: float) -> list[int]:
    """The pids of ``pid``'s children once there are ``n`` of them and each has started its kernel."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            kids = []
        if len(kids) == n:
            return kids
        time.sleep(0.1)
    raise AssertionError(f"{pid} did not start {n} workers")


# -- live: AF_PACKET fanout over a veth pair in a namespace of our own ---------------------------------

SENDER = """
import struct, sys
from scapy.all import sendp, conf
conf.verb = 0
iface, blob = sys.argv[1], open(sys.argv[2], 'rb').read()
frames, p = [], 0
while p < len(blob):
    (n,) = struct.unpack('>H', blob[p:p + 2]); frames.append(blob[p + 2:p + 2 + n]); p += 2 + n
sendp(frames, iface=iface, verbose=False)
"""


@pytest.mark.netns
@pytest.mark.kafka
def test_live_fanout_counts_every_packet_once_over_two_workers(request, kafka, topic_factory, tmp_path: Path):
    ns, host_if, peer = request.getfixturevalue("veth_pair")  # the conftest fixture
    topic = topic_factory(partitions=2)
    cfg = tmp_path / "q.yaml"
    # only the frames sent here count (a stray frame on the veth would be counted too, by one worker)
    cfg.write_text(pairs_config(topic, "edge-1/*", filter="dst_ip == 10.77.200.1"))
    n, flows = 2000, 64
    frames = []
    for i in range(n):
        f = i % flows
        # dst MAC not the host end's: the host stack discards them (PACKET_OTHERHOST), nothing replies
        pkt = (
            Ether(src="02:00:00:cc:00:02", dst="02:00:00:cc:00:99")
            / IP(src=f"10.77.{f}.2", dst="10.77.200.1")
            / UDP(sport=40000 + f, dport=9)
            / Raw(struct.pack(">I", i))
        )
        frames.append(bytes(pkt))
    blob = tmp_path / "frames.bin"
    blob.write_bytes(b"".join(struct.pack(">H", len(x)) + x for x in frames))
    summary = tmp_path / "s.json"
    proc, port = spawn_workers(
        cfg, f"afpacket:{host_if},promisc", "edge-1", kafka.bootstrap_servers, 2, summary
    )
    try:
        wait_metrics(port, {"edge-1/w0", "edge-1/w1"}, timeout=180)  # both workers joined the group
        subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, peer, str(blob)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and captured(port) < n:
            time.sleep(0.2)
        text = scrape(port)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert (
        'worker="w0"' in text and 'worker="w1"' in text and 'lowwater_agent_worker_up{host="edge-1"' in text
    )
    s = json.loads(summary.read_text())
    per = {h: w["queries"]["pairs"]["matched"] for h, w in s["workers"].items()}
    assert sum(per.values()) == n, per  # each frame went to exactly one worker
    assert all(v > 0 for v in per.values()), per
    assert all(w["source"]["kernel_drops"] == 0 and w["ring_drops"] == 0 for w in s["workers"].values())
    got, hosts, ends = merged(read_all(kafka.bootstrap_servers, topic, 2))
    assert hosts == {"edge-1/w0", "edge-1/w1"} and sum(got.values()) == n


def captured(port: int) -> int:
    total = 0
    for line in scrape(port).splitlines():
        if line.startswith("lowwater_agent_packets_processed_total{"):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def wait_metrics(port: int, hosts: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = scrape(port)
        beats = [line for line in text.splitlines() if line.startswith("lowwater_agent_heartbeats_total{")]
        running = {
            h
            for h in hosts
            for line in beats
            if f'worker="{h.rsplit("/", 1)[1]}"' in line and float(line.rsplit(" ", 1)[1]) >= 1
        }
        if running == hosts:  # each worker's loop runs: its socket is in the fanout group
            return
        time.sleep(0.3)
    raise AssertionError(f"workers {hosts} did not serve metrics in {timeout} s")


# -- the status document and the page group workers under their capture host ---------------------------


def worker_status_doc(now_ms: int) -> dict:
    """A status document with capture host edge-9 as two workers (w1 silent) and a host without workers."""
    from contract import status as S

    def host(live: bool, mark_ns: int, records: int) -> S.HostOnPartition:
        return S.HostOnPartition(
            live=live,
            expected=True,
            mark_pane=mark_ns // 10**10,
            mark_ns=mark_ns,
            lag_s=1.0,
            last_heard_ms=now_ms,
            silent_s=0.5,
            punctuations=3,
            incarnation=1,
            records=records,
            sent_records=records,
            received_records=records,
            missing_records=0,
            late_partials=0,
        )

    mark = now_ms * 10**6 - 20 * NS
    hosts = {
        "edge-9/w0": host(True, mark, 70),
        "edge-9/w1": host(False, mark - 5 * NS, 30),
        "solo": host(True, mark, 5),
    }
    part = S.PartitionStatus(
        query="q4_pairs",
        partition=0,
        now_ms=now_ms,
        low_water_mark_pane=mark // 10**10,
        low_water_mark_ns=mark,
        closed_before_window=None,
        blocked_by=[],
        live_hosts=2,
        open_windows=1,
        state_rows=3,
        windows_closed=1,
        records=105,
        hosts=hosts,
    )
    queries = {"q4_pairs": S.summarize_query({0: part})}
    from lowwater_testing.store import status_document

    return status_document(queries, now_ms, 1, sorted(hosts)).model_dump(mode="json")


def test_status_groups_workers_under_their_capture_host(tmp_path: Path) -> None:
    from contract import status as S
    from high_level.serve.status import read_status

    now_ms = int(time.time() * 1000)
    (tmp_path / "_status.json").write_text(json.dumps(worker_status_doc(now_ms)))
    st = read_status(tmp_path)
    assert st["available"], st["error"]
    by = {h["host"]: h for h in st["hosts"]}
    assert by["edge-9/w1"]["capture_host"] == "edge-9" and by["edge-9/w1"]["worker"] == "w1"
    assert by["solo"]["capture_host"] is None and by["solo"]["worker"] is None
    caps = {g["host"]: g for g in st["capture_hosts"]}
    assert set(caps) == {"edge-9", "solo"}
    e9 = caps["edge-9"]
    assert e9["workers"] == ["edge-9/w0", "edge-9/w1"] and e9["workers_live"] == 1 and not e9["live"]
    assert e9["records"] == 100 and e9["low_water_mark_ns"] == by["edge-9/w1"]["low_water_mark_ns"]
    assert caps["solo"]["workers"] == ["solo"] and caps["solo"]["live"]
    assert S.split_worker("a/b/w12") == ("a/b", "w12") and S.split_worker("a/wx") == ("a/wx", None)


def test_page_shows_workers_under_their_host(tmp_path: Path) -> None:
    from lowwater_testing.page import CHROMIUM, chromium, serve_api, stop
    from lowwater_testing.store import make_store

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium, or ./lw setup)")
    store = make_store(tmp_path / "results")
    (store.root / "_status.json").write_text(json.dumps(worker_status_doc(int(time.time() * 1000))))
    proc, base = serve_api(store)
    try:
        dom = chromium(f"{base}/ui", tmp_path / "profile", "--dump-dom").stdout
    finally:
        stop(proc)
    assert "1/2 workers live" in dom, dom[-3000:]
    assert dom.index(">edge-9<") < dom.index("edge-9/w0") < dom.index("edge-9/w1") < dom.index(">solo<")
