"""Faults injected for real, for the completeness tests (``tests/test_completeness.py``) and benchmark
(``benchmarks/bench_completeness.py``): each scenario runs real agents (ring, Numba kernel, punctuation,
backlog and outbox) against a real Kafka broker, then what reached Kafka through the job's own steps
(``PartitionProcessor``, ``JoinProcessor``) batch by batch, and returns one verdict per window against an
oracle over every packet that was on the wire. ``kafka`` is the broker (``bootstrap_servers``, ``stop``,
``start``), ``topic_factory(partitions)`` makes a fresh topic."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd

from contract import query as Q
from high_level.aggregate.packed import unpack_rows
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.join.band import JoinLayout, finalize
from high_level.join.step import JoinProcessor
from low_level.capture.ring import ring_push
from low_level.host.agent import Agent
from lowwater_testing import oracle as simulate
from lowwater_testing.traffic import build_frames, make_handshake_traffic, make_traffic, oracle

NS = 1_000_000_000


T0 = 1_700_000_000 * NS


def agg_query(
    topic: str, window: str = "{range: 1s}", max_disorder: str = "0s", partitions: int = 2
) -> Q.QuerySpec:
    return Q.load_text(agg_yaml(topic, window, max_disorder, partitions)).queries[0]


def agg_yaml(topic: str, window: str = "{range: 1s}", max_disorder: str = "0s", partitions: int = 2) -> str:
    """The config of :func:`agg_query` (what a real agent process reads)."""
    return f"""
queries:
  - name: pairs
    group_by: [src_ip, dst_ip]
    aggregates: [{{fn: count, as: n}}, {{fn: sum, field: length, as: bytes}}, {{fn: max, field: length, as: mx}}]
    window: {window}
    table: {{size: 512}}
    flush: {{policy: lazy, m: 2}}
    heartbeat: {{max_disorder: {max_disorder}}}
    kafka: {{topic: {topic}, partitions: {partitions}}}
"""


def consume(bootstrap: str, topics: list[str], partitions: int = 2) -> dict[tuple[str, int], list[bytes]]:
    """Every message of ``topics`` by (topic, partition), in offset order (what the job's source reads)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=4000)
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    out: dict[tuple[str, int], list[bytes]] = {(tp.topic, tp.partition): [] for tp in tps}
    for m in c:
        out[(m.topic, m.partition)].append(m.value)
    c.close()
    return out


def run_job(
    q: Q.QuerySpec,
    values: dict[tuple[str, int], list[bytes]],
    settings: Settings,
    batches: int = 12,
    step_ms: int = 500,
) -> pd.DataFrame:
    """The job's per-partition step over what reached Kafka, in ``batches`` micro-batches per partition
    (state saved and restored between them, as Spark does), processing time passing ``step_ms`` each."""
    lay = Layout.of(q)
    out = []
    for p in range(q.kafka.partitions):
        vals = values.get((q.topic, p), [])
        proc = PartitionProcessor([lay], p, settings)
        now = 1_000_000
        for chunk in [*np.array_split(np.arange(len(vals)), batches), *([np.arange(0)] * 6)]:
            proc = PartitionProcessor.from_bytes(proc.to_bytes(), [lay], settings)
            out.append(proc.process([vals[i] for i in chunk], now))
            now += step_ms
    return pd.concat(out, ignore_index=True)


def verdicts(q: Q.QuerySpec, df: pd.DataFrame, traffic) -> list[simulate.Verdict]:
    lay = Layout.of(q)
    exp = simulate.window_oracle(q, oracle(q, traffic))
    wins = set(exp["window"].astype(int)) | set(df.loc[df["kind"] == "final", "window"].astype(int))
    return simulate.judge_windows(df, exp, {w: int(lay.window_start_ns(np.array([w]))[0]) for w in wins})


def push(agent: Agent, frames: np.ndarray, cap: np.ndarray, wl: np.ndarray, ts: np.ndarray) -> int:
    """Frames into the agent's ring the way a source pushes them (``ring_push``: a full ring drops and
    counts, with the dropped frame's time); returns the frames dropped."""
    flat = np.ascontiguousarray(frames).ravel()
    width = frames.shape[1]
    arrs = agent.ring.arrays()
    return sum(
        not ring_push(arrs, flat, i * width, int(cap[i]), int(wl[i]), int(ts[i]), 0) for i in range(len(ts))
    )


def drain(agent: Agent, punctuate: bool = True) -> None:
    while agent.ring.fill:
        agent.step()
    if punctuate:  # a busy host's timer punctuation (the real rule, with its max_disorder hold)
        for i in range(len(agent.queries)):
            agent.punctuate(i, idle=False, timer=True)
        agent.emitter.pump()


def replay(agent: Agent, traffic, stop: int | None = None) -> None:
    """The traffic's frames (the first ``stop`` of them) through the agent 500 at a time, each chunk drained
    with the busy host's timer punctuation."""
    frames, cap, wl, ts = build_frames(traffic)
    stop = len(ts) if stop is None else stop
    for s in range(0, stop, 500):
        e = min(stop, s + 500)
        push(agent, frames[s:e], cap[s:e], wl[s:e], ts[s:e])
        drain(agent)


def stop_host(agent: Agent, finish: bool = True) -> None:
    """Finish the host (its last mark) unless it is killed, then every record is sent."""
    if finish:
        agent.finish()
    assert agent.emitter.flush(60)
    agent.emitter.close()


def ring_drops(kafka, topic_factory, window: str = "{range: 1s}") -> list[simulate.Verdict]:
    """Every fourth burst of frames comes faster than a small ring drains: the ring drops and counts."""
    q = agg_query(topic_factory(partitions=2), window)
    traffic = make_traffic(24_000, 300, T0, 12 * NS, seed=31)
    frames, cap, wl, ts = build_frames(traffic)
    agent = Agent([q], None, "h-ring", kafka.bootstrap_servers, ring_slots=1 << 10, chunk=1024)
    dropped = 0
    for s in range(0, len(ts), 2000):
        e = min(len(ts), s + 2000)
        size = 2000 if (s // 2000) % 4 == 1 else 500  # every fourth burst comes faster than the ring drains
        for a in range(s, e, size):
            b = min(e, a + size)
            dropped += push(agent, frames[a:b], cap[a:b], wl[a:b], ts[a:b])
            drain(agent, punctuate=False)
        drain(agent)
    agent.finish()
    assert agent.emitter.flush(60)
    agent.emitter.close()
    assert dropped > 0 and agent.ring.drops == dropped
    df = run_job(q, consume(kafka.bootstrap_servers, [q.topic]), Settings(10**9, ("h-ring",)))
    return verdicts(q, df, traffic)


SENDER = """
import json, socket, sys, time
iface, blob, plan = sys.argv[1], open(sys.argv[2], 'rb').read(), json.loads(sys.argv[3])
frames, p = [], 0
while p < len(blob):
    n = int.from_bytes(blob[p:p + 2], 'big'); frames.append(blob[p + 2:p + 2 + n]); p += 2 + n
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
i, out = 0, []
for count, paced in plan:  # one burst per second, from 0.3 s into it (its window is that second's)
    time.sleep(1.3 - time.time() % 1)
    t0 = time.time_ns()
    for k in range(count):
        s.send(frames[i + k])
        if paced and k % 50 == 49:
            time.sleep(0.005)  # a rate the running agent's rings keep up with
    out.append([t0, time.time_ns(), count])
    i += count
print(json.dumps(out))
"""


def _metric(port: int, name: str) -> float:
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def socket_drops(kafka, topic_factory, ends: tuple[str, str, str], tmp_path) -> list[simulate.Verdict]:
    """A live agent (AF_PACKET, a kernel ring of two 1 MiB blocks) on a veth pair: bursts it keeps up with,
    then bursts while it is paused (SIGSTOP) that overflow its socket's ring (the kernel's ``tp_drops``),
    then bursts again after SIGCONT. Every packet's window is the second its burst was sent in."""
    import signal
    import subprocess
    import sys

    from lowwater_testing.agent import spawn_workers

    ns, host_if, peer = ends
    topic = topic_factory(partitions=2)
    cfg = tmp_path / "q.yaml"
    cfg.write_text(agg_yaml(topic))
    plan = [[1500, True]] * 3 + [[6000, False]] * 3 + [[1500, True]] * 3
    traffic = make_traffic(sum(c for c, _ in plan), 200, T0, NS, seed=37)
    frames, cap, wl, _ = build_frames(traffic)
    wire_frames = [  # each frame as long as its wire length (the headers, then zeros)
        bytes(frames[i, : min(cap[i], wl[i])]) + bytes(max(0, int(wl[i] - cap[i]))) for i in range(len(wl))
    ]
    blobs, at = [], 0
    for k in range(0, len(plan), 3):  # one file per phase: running, paused, running again
        n = sum(c for c, _ in plan[k : k + 3])
        blobs.append(tmp_path / f"frames{k}.bin")
        blobs[-1].write_bytes(b"".join(len(f).to_bytes(2, "big") + f for f in wire_frames[at : at + n]))
        at += n
    summary = tmp_path / "summary.json"
    source = f"afpacket:{host_if},promisc,blocks=2"
    agent, port = spawn_workers(cfg, source, "edge-s", kafka.bootstrap_servers, 1, summary)
    sent: list[list[int]] = []

    def send(phase: int) -> None:
        part = json.dumps(plan[3 * phase : 3 * phase + 3])
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, peer, str(blobs[phase]), part],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        sent.extend(json.loads(r.stdout))

    try:
        deadline = time.monotonic() + 240
        while _metric(port, "lowwater_agent_heartbeats_total") < 1:  # its loop runs: the socket is bound
            assert agent.poll() is None and time.monotonic() < deadline, agent.stdout.read()[-3000:]
            time.sleep(0.2)
        send(0)
        agent.send_signal(signal.SIGSTOP)  # paused: its socket's ring fills and the kernel drops
        send(1)
        agent.send_signal(signal.SIGCONT)
        send(2)
        captured = -1.0
        while time.monotonic() < deadline:  # until the agent has read everything its rings held
            time.sleep(1.0)
            now = _metric(port, "lowwater_agent_packets_captured_total")
            if now == captured:
                break
            captured = now
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGCONT)
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, out[-3000:]
    drops = json.loads(summary.read_text())["source"]["kernel_drops"]
    assert drops > 0, "the paused agent's socket was meant to drop frames"
    traffic.ts = np.repeat(np.array([t0 for t0, _, _ in sent], np.int64), [c for *_, c in sent])
    df = run_job(
        q := agg_query(topic), consume(kafka.bootstrap_servers, [topic]), Settings(10**9, ("edge-s",))
    )
    lay = Layout.of(q)
    # a burst that ran past its second (a loaded machine) has no single window: those windows are not judged
    straddle = {
        int(w)
        for t0, t1, _ in sent
        if (t0 - lay.origin_ns) // lay.pane_ns != (t1 - lay.origin_ns) // lay.pane_ns
        for w in ((t0 - lay.origin_ns) // lay.pane_ns, (t1 - lay.origin_ns) // lay.pane_ns)
    }
    sts = [json.loads(t) for t in df.loc[df["kind"] == "status", "status"]]
    assert max(st["hosts"]["edge-s"]["losses"].get("socket", 0) for st in sts) == drops  # every drop reported
    # a live agent stopped by SIGTERM passes no end-of-stream mark (it may come back): its last windows are
    # still open, no result yet; judged: the windows the job closed
    last = {st["partition"]: st["closed_before_window"] for st in sts}  # per partition, its last status
    assert len(last) == 2 and None not in last.values()
    closed = min(last.values())
    return [v for v in verdicts(q, df, traffic) if v.window not in straddle and v.window < closed]


def block_sorted(traffic, block_ns: int):
    """Disorder inside one host: blocks of ``block_ns``, flow by flow within each (a flow cache's export)."""
    order = np.lexsort((traffic.ts, traffic.dst, traffic.src, (traffic.ts - T0) // block_ns))
    return traffic.take(order)


def disorder(kafka, topic_factory, bound: str = "1s") -> tuple[list[simulate.Verdict], int]:
    """Block-sorted disorder of 4 s inside one host whose heartbeat.max_disorder is ``bound``:
    (verdicts, late packets)."""
    topic = topic_factory(partitions=2)
    traffic = make_traffic(20_000, 200, T0, 16 * NS, seed=32)
    shuffled = block_sorted(traffic, 4 * NS)
    q = agg_query(topic, "{range: 2s, slide: 1s}", max_disorder=bound)
    agent = Agent([q], None, f"h-dis-{bound}", kafka.bootstrap_servers, ring_slots=1 << 12, chunk=1024)
    replay(agent, shuffled)
    stop_host(agent)
    df = run_job(q, consume(kafka.bootstrap_servers, [topic]), Settings(10**9, (agent.host,)))
    return verdicts(q, df, traffic), int(agent.kernel.t.stat(0, "late"))


def killed_host(kafka, topic_factory) -> list[simulate.Verdict]:
    """Two hosts share the traffic; one is killed (no flush, no last mark) a little past half of it."""
    q = agg_query(topic_factory(partitions=2), "{range: 2s, slide: 1s}")
    traffic = make_traffic(20_000, 300, T0, 12 * NS, seed=33)
    hosts = simulate.split_hosts(len(traffic), 2, seed=1)
    agents = [
        Agent([q], None, f"h{i}", kafka.bootstrap_servers, ring_slots=1 << 12, chunk=1024) for i in (0, 1)
    ]
    shares = [traffic.take(np.flatnonzero(hosts == i)) for i in (0, 1)]
    shares = [t.take(np.argsort(t.ts, kind="stable")) for t in shares]  # on the wire in time order
    for i in (1, 0):  # h1 first: killed, it falls silent while h0's partials and marks go on arriving
        n = len(shares[i])
        replay(agents[i], shares[i], n if i == 0 else n * 55 // 100)  # h1 is killed (SIGKILL: no mark) here
        stop_host(agents[i], finish=i == 0)
    df = run_job(
        q,
        consume(kafka.bootstrap_servers, [q.topic]),
        Settings(host_timeout_ms=1500, expected_hosts=("h0", "h1")),
        batches=20,
    )
    return verdicts(q, df, traffic)


def kafka_gap(kafka, topic_factory) -> list[simulate.Verdict]:
    """A real sequence gap: the job reads a third of partition 0, then the broker deletes the next third
    (``delete_records``, as retention does to a job that fell behind) and the job reads on from the new
    log start. The records deleted were sent (the host's ``seq`` counts them) and never reached the job."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    q = agg_query(topic_factory(partitions=2), "{range: 2s, slide: 1s}")
    traffic = make_traffic(20_000, 300, T0, 12 * NS, seed=36)
    agent = Agent([q], None, "h-gap", kafka.bootstrap_servers, ring_slots=1 << 12, chunk=1024)
    replay(agent, traffic)
    stop_host(agent)
    values = consume(kafka.bootstrap_servers, [q.topic])
    settings = Settings(10**9, (agent.host,))
    lay = Layout.of(q)
    n0 = len(values[(q.topic, 0)])
    cut_from, cut_to = n0 // 3, 2 * n0 // 3
    out = []
    procs = {p: PartitionProcessor([lay], p, settings) for p in (0, 1)}
    now = 1_000_000
    for p in (0, 1):
        vals = values[(q.topic, p)][:cut_from] if p == 0 else values[(q.topic, p)]
        for chunk in np.array_split(np.arange(len(vals)), 6):
            out.append(procs[p].process([vals[i] for i in chunk], now))
            now += 500
    tp = TopicPartition(q.topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.delete_records({tp: cut_to})
    finally:
        admin.close()
    c = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False, consumer_timeout_ms=4000
    )
    c.assign([tp])
    c.seek_to_beginning(tp)
    rest = list(c)
    c.close()
    assert rest and rest[0].offset == cut_to, "the broker deleted the records below cut_to"
    vals = [m.value for m in rest]
    for chunk in [*np.array_split(np.arange(len(vals)), 6), *([np.arange(0)] * 4)]:
        procs[0] = PartitionProcessor.from_bytes(procs[0].to_bytes(), [lay], settings)
        out.append(procs[0].process([vals[i] for i in chunk], now))
        now += 500
    return verdicts(q, pd.concat(out, ignore_index=True), traffic)


def truncated_capture(tmp_path) -> tuple[list[simulate.Verdict], int]:
    """A pcap cut mid-record replayed by a real agent: (verdicts, malformed frames the job was told of)."""
    from lowwater_testing.agent import write_traffic_pcap
    from lowwater_testing.capture import RecordingProducer

    q = agg_query("t-trunc", "{range: 1s}", partitions=2)
    traffic = make_traffic(6_000, 100, T0, 6 * NS, seed=34)
    frames, cap, wl, ts = build_frames(traffic)
    pcap = tmp_path / "cut.pcap"
    write_traffic_pcap(pcap, traffic)
    with pcap.open("r+b") as f:
        f.truncate(pcap.stat().st_size - 20)  # the last record loses its last bytes
    prod = RecordingProducer()
    agent = Agent(
        [q],
        {"type": "pcap", "path": str(pcap), "loop": False, "mode": "fast", "rebase_to_now": False},
        "h-trunc",
        None,
        producer=prod,
    )
    agent.run()
    assert agent.source.stats()["malformed_tail"]
    values: dict[tuple[str, int], list[bytes]] = {}
    for topic, part, v in prod.sent:
        values.setdefault((topic, part), []).append(v)
    df = run_job(q, values, Settings(10**9, ("h-trunc",)))
    st = [json.loads(t)["hosts"]["h-trunc"] for t in df.loc[df["kind"] == "status", "status"]]
    return verdicts(q, df, traffic.take(np.arange(len(traffic) - 1))), max(h["malformed"] for h in st)


def handshake_config(t1: str, t2: str, kind: str = "anti") -> Q.Config:
    from lowwater_testing.joins import HANDSHAKE, handshake_kind

    text = HANDSHAKE.replace("kafka: {partitions: 4}", f"kafka: {{topic: {t1}, partitions: 2}}", 1)
    text = text.replace("kafka: {partitions: 4}", f"kafka: {{topic: {t2}, partitions: 2}}", 1)
    text = text.replace("window: {range: 1m}", "window: {range: 5s}")
    return Q.load_text(handshake_kind(text, kind, "left.dst_port"))


def join_verdicts(
    cfg: Q.Config, values: dict[tuple[str, int], list[bytes]], traffic, hosts: tuple[str, ...]
) -> list[simulate.Verdict]:
    from lowwater_testing.joins import join_oracle, join_window_oracle

    lay = JoinLayout.of(cfg.joins[0], *cfg.selects)
    rl = lay.rollup
    proc = JoinProcessor(lay, Settings(10**9, hosts, "drop"))
    by_part = {
        p: [v for t in (lay.left_topic, lay.right_topic) for v in values.get((t, p), [])]
        for p in range(lay.partitions)
    }
    out, now = [], 1_000_000
    for b in range(8):
        chunk = {p: vs[len(vs) * b // 8 : len(vs) * (b + 1) // 8] for p, vs in by_part.items()}
        out.append(unpack_rows(proc.process_packed(chunk, now), {lay.name: rl}).to_pandas())
        proc = JoinProcessor.from_bytes(proc.to_bytes(), lay, Settings(10**9, hosts, "drop"))
        now += 500
    df = pd.concat(out, ignore_index=True)
    left, right = (simulate.select_oracle(s, traffic.rows()) for s in cfg.selects)
    exp_df = join_window_oracle(lay, *join_oracle(lay, left, right))
    names = [a for _, a, _ in lay.aggs]
    exp: dict[int, set] = {}
    for w, k, *vals in exp_df[["window", "key", *names]].itertuples(index=False):
        exp.setdefault(int(w), set()).add((*k, *(round(float(v), 3) for v in vals)))
    fin = df[df["kind"] == "final"]
    vals = finalize(lay, np.array(fin["state"].tolist(), np.int64).reshape(len(fin), -1))
    got: dict[int, set] = {}
    for i, (w, k) in enumerate(zip(fin["window"].tolist(), fin["key"].tolist(), strict=True)):
        got.setdefault(int(w), set()).add((*k, *(round(float(vals[a][i]), 3) for a in names)))
    closed = proc.rollup.closed
    # a window the join has not closed is no result yet (its marks did not pass it): judged once closed
    wins = {w for w in set(exp) | set(got) if closed is not None and w < closed}
    if len(wins) < len(set(exp) | set(got)):
        st = json.loads(df.loc[df["kind"] == "status", "status"].iloc[-1])
        print(
            f"join {lay.name}: {len(set(exp) | set(got)) - len(wins)} windows still open; marks "
            f"{ {h: v['mark_ns'] for h, v in st['hosts'].items()} }, closed before {closed}"
        )
    starts = {w: int(rl.window_start_ns(np.array([w]))[0]) for w in wins}
    return simulate.judge(got, exp, simulate.window_causes(df, starts), wins)


def select_outage(kafka, topic_factory, kind: str = "anti") -> list[simulate.Verdict]:
    """A Kafka outage longer than the select outbox holds: SYN and SYN-ACK rows shed by the host."""
    cfg = handshake_config(topic_factory(partitions=2), topic_factory(partitions=2), kind)
    traffic = make_handshake_traffic(6_000, T0, 30 * NS, seed=35, answered=0.7, max_latency_ns=2 * NS)
    frames, cap, wl, ts = build_frames(traffic)
    agent = Agent(
        [], None, "cap", kafka.bootstrap_servers, ring_slots=1 << 12, chunk=1024, selects=cfg.selects
    )
    agent.emitter.outbox.max_rows = 800
    deadline = time.monotonic() + 60
    while agent.emitter.producer is None and time.monotonic() < deadline:  # connected before capture starts
        time.sleep(0.1)
    third = len(ts) // 3
    for s in range(0, third, 500):  # the uplink keeps up (on a loaded machine too): nothing shed here
        push(agent, frames[s : s + 500], cap[s : s + 500], wl[s : s + 500], ts[s : s + 500])
        drain(agent, punctuate=False)
        for k in range(len(cfg.selects)):
            agent.punctuate_select(k, idle=False)
        assert agent.emitter.flush(60)
    assert agent.emitter.outbox.lost == 0
    inflight = agent.emitter.max_inflight_bytes
    agent.emitter.max_inflight_bytes = 4096  # an uplink that holds little beyond the outbox (broker down)
    kafka.stop()
    try:
        for s in range(third, 2 * third, 500):
            e = min(2 * third, s + 500)
            push(agent, frames[s:e], cap[s:e], wl[s:e], ts[s:e])
            drain(agent, punctuate=False)
            for k in range(len(cfg.selects)):
                agent.punctuate_select(k, idle=False)
            agent.emitter.pump()
        assert agent.emitter.outbox.lost > 0
    finally:
        kafka.start()
    agent.emitter.max_inflight_bytes = inflight
    assert agent.emitter.flush(120)  # reconnected, the outbox drained
    lost = agent.emitter.outbox.lost
    for s in range(2 * third, len(ts), 500):  # the broker is back: the uplink keeps up again
        push(agent, frames[s : s + 500], cap[s : s + 500], wl[s : s + 500], ts[s : s + 500])
        drain(agent, punctuate=False)
        for k in range(len(cfg.selects)):
            agent.punctuate_select(k, idle=False)
        assert agent.emitter.flush(60)
    assert agent.emitter.outbox.lost == lost
    agent.finish()
    assert agent.emitter.flush(90)
    agent.emitter.close()
    vs = join_verdicts(
        cfg, consume(kafka.bootstrap_servers, [s.topic for s in cfg.selects]), traffic, ("cap",)
    )
    return vs
