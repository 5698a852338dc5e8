"""End to end on a capture host: pcap file -> ring -> kernel -> wire batches -> the real Kafka broker.

The queries: by default the three of configs/default.yaml that bench_kernel's "three queries" figure
runs (q4_pairs, bytes_per_dst24, syn_per_port, chosen by name so the figure keeps its meaning as
queries are added there); ``--config FILE`` runs every query of FILE. Measured side by side in one
run, on the same frames: the kernel alone over a pre-filled ring (bench_kernel's timed loop), the
agent with a producer that discards batches, and the agent sending to Kafka.
``pcap_to_kafka_vs_kernel`` = Kafka rate / kernel rate: what the rest of the capture host (pcap
reader, ring, punctuation, wire encoding, the producer) costs on one core. Pinned to one CPU the agent
pulls the replay from its own loop (``Agent.pull``: no reader thread) into a ring over the mapped file
(``Ring.over``: the kernel reads each frame where it lies, none is copied); the last variant has both
CPUs, so the reader runs in its thread next to the kernel and copies the frames into a ring. Rounds interleave
the variants; best of --repeat (all times are kept in the JSON), each agent run timed from the
source's start until Kafka has acknowledged every batch. CPU time is reported next to it (this process's
threads: the agent's loop and its Kafka client's I/O thread), with the load average of each round:
on a shared machine wall time also counts the turns of other processes. Writes
benchmarks/results/pcap_to_kafka.json.

    .venv/bin/python -m benchmarks.bench_pcap_to_kafka [--config configs/default.yaml] [--packets 8000000]
        [--groups 65536] [--repeat 3]
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.bench_kernel import fill_ring, run_kernel, three_queries
from benchmarks.harness import machine
from benchmarks.pcapwrite import write_pcap_ns
from contract import query as Q
from local_stack.kafka_broker import KafkaBroker
from low_level.capture.sources.generator import generate_frames
from low_level.host.agent import Agent

TMP = harness.RESULTS / "tmp"
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


class NullProducer:
    def send(self, topic: str, value: bytes, partition: int) -> None:
        return None


LOADS: list[float] = []  # 1-minute load average at the start of each round (a shared machine: say how shared)
CPU_S: list[float] = []  # CPU seconds of the last run (every thread of this process: kernel loop, Kafka I/O)
CONNECT_S: list[float] = []  # per Kafka run: producer connect + topic metadata, before the clock starts


def wait_connected(agent: Agent, queries: list[Q.QuerySpec], timeout_s: float = 60.0) -> float:
    """Wait until the agent's producer is connected and knows every topic's partitions; returns seconds.

    The agent connects in the background and never blocks on it (capture goes on, partials wait in the
    backlog), so on an 8M-packet replay of under a second the one-time bootstrap (topic check, producer,
    metadata: round trips to the broker) would otherwise be counted as if it were per-packet work."""
    from kafka.errors import KafkaTimeoutError

    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    while agent.emitter.producer is None:
        if time.perf_counter() > deadline:
            raise SystemExit("the agent's Kafka producer did not connect")
        time.sleep(0.01)
    for q in queries:
        while True:
            try:
                if agent.emitter.producer.partitions_for(q.topic):
                    break
            except KafkaTimeoutError:  # max_block_ms=0: not known yet, a metadata request is under way
                pass
            if time.perf_counter() > deadline:
                raise SystemExit(f"no metadata for topic {q.topic}")
            time.sleep(0.01)
    return time.perf_counter() - t0


def kernel_alone(ring, queries: list[Q.QuerySpec], n: int) -> tuple[float, None]:
    secs, cpu, _ = run_kernel(ring, queries, n)
    CPU_S.append(cpu)
    return secs, None


def run(queries: list[Q.QuerySpec], pcap: Path, bootstrap: str | None, producer=None) -> tuple[float, Agent]:
    """One agent run; seconds from the source's start (producer connected, see wait_connected) until
    Agent.finish returned, i.e. until the end-of-stream punctuation is sent and Kafka has acknowledged
    every batch (the producer's close and the source thread's join after that are not the pipeline's work)."""
    agent = Agent(
        queries,
        {"type": "pcap", "path": str(pcap), "mode": "fast", "progress": True},
        "bench",
        bootstrap,
        ring_slots=1 << 18,
        producer=producer,
    )
    if bootstrap is not None:
        CONNECT_S.append(wait_connected(agent, queries))
    done: list[tuple[float, float]] = []
    finish = agent.finish

    def timed_finish() -> None:
        finish()
        done.append((time.perf_counter(), time.process_time()))

    agent.finish = timed_finish  # type: ignore[method-assign]
    t0, c0 = time.perf_counter(), time.process_time()
    agent.run()
    CPU_S.append(done[0][1] - c0)
    return done[0][0] - t0, agent


def main() -> None:
    ap = harness.parser()
    ap.add_argument(
        "--config",
        type=Path,
        default=None,
        help="run every query of this file (default: the three named queries of configs/default.yaml)",
    )
    ap.add_argument("--packets", type=int, default=8_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every variant; the best is reported")
    ap.add_argument("--groups", type=int, default=65536)
    ap.add_argument(
        "--cpu",
        type=int,
        default=-1,
        help="the one CPU for the one-core variants (agent's reader thread, kernel loop and producer "
        "all on it); -1 = the last CPU",
    )
    args = ap.parse_args()
    m = machine()
    print(f"machine: {m['cpu']} ({m['cpu_id']}), {m['cores']} cores")
    queries = three_queries() if args.config is None else Q.load(args.config).queries
    config = args.config or DEFAULT_CONFIG
    print(f"queries ({config.name}): {', '.join(q.name for q in queries)}")
    TMP.mkdir(parents=True, exist_ok=True)
    pcap = TMP / "bench.pcap"
    print(f"writing {args.packets:,} frames to {pcap} ...", flush=True)
    frames, caplen, wirelen, ts = generate_frames(
        args.packets, groups=args.groups, seed=9, snaplen=64, proto_mix={"tcp": 1.0}, synthetic_pps=200_000
    )
    write_pcap_ns(pcap, frames, caplen, wirelen, ts)
    ring = fill_ring(frames, caplen, wirelen, ts)  # the same frames for the kernel-only variant
    del frames
    state = TMP / "kafka-bench"
    shutil.rmtree(state, ignore_errors=True)
    broker = KafkaBroker("bench", port=0, state=state)
    broker.start()
    n = args.packets
    cpus = sorted(os.sched_getaffinity(0))
    one = cpus[-1] if args.cpu == -1 else args.cpu
    kafka = broker.bootstrap_servers
    # (name, pinned to one CPU, what runs); the agent's threads (pcap reader, producer) inherit the pin
    variants = [
        ("kernel alone (ring pre-filled)", True, lambda: kernel_alone(ring, queries, n)),
        ("pcap -> kernel -> discard, one core", True, lambda: run(queries, pcap, None, NullProducer())),
        ("pcap -> kernel -> Kafka (acks=all), one core", True, lambda: run(queries, pcap, kafka)),
        (
            "pcap -> kernel -> Kafka (acks=all), reader on a 2nd core",
            False,
            lambda: run(queries, pcap, kafka),
        ),
    ]
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    cpu: dict[str, list[float]] = {v[0]: [] for v in variants}
    agents: dict[str, Agent] = {}
    try:
        for q in queries:
            broker.create_topic(q.topic, q.kafka.partitions)
        run_kernel(ring, queries, 1000)  # warm-up: compile, page cache
        run(queries, pcap, None, NullProducer())
        for _ in range(args.repeat):  # rounds: every variant once, back to back
            LOADS.append(round(os.getloadavg()[0], 2))
            for name, pin, fn in variants:
                os.sched_setaffinity(0, {one} if pin else cpus)
                secs, agent = fn()
                os.sched_setaffinity(0, cpus)
                times[name].append(secs)
                cpu[name].append(CPU_S[-1])
                if agent is not None and secs == min(times[name]):
                    agents[name] = agent
    finally:
        os.sched_setaffinity(0, cpus)
        broker.stop()
    names = [v[0] for v in variants]
    st = agents[names[2]].emitter.stats
    rows = []
    for name in names:
        best = min(times[name])
        rows.append(
            {
                "variant": name,
                "seconds": best,
                "mpps": n / best / 1e6,
                "all_mpps": [round(n / x / 1e6, 2) for x in times[name]],
                "cpu_seconds": min(cpu[name]),
                "all_cpu_seconds": [round(x, 3) for x in cpu[name]],
            }
        )
    rows[2].update(records_sent=st.records_sent, bytes_sent=st.bytes_sent, batches=st.batches_sent)
    ratio = rows[2]["mpps"] / rows[0]["mpps"]
    per_round = [round(k / f, 3) for k, f in zip(times[names[0]], times[names[2]], strict=True)]
    by_cpu = (
        rows[0]["cpu_seconds"] / rows[2]["cpu_seconds"]
    )  # on a shared machine wall time counts others' turns too
    print(f"\n{'variant':58s} {'seconds':>8s} {'Mpkt/s':>8s} {'vs kernel':>9s} {'CPU s':>6s}  all runs")
    for r in rows:
        print(
            f"{r['variant']:58s} {r['seconds']:8.2f} {r['mpps']:8.2f} {r['mpps'] / rows[0]['mpps']:9.2f} "
            f"{r['cpu_seconds']:6.2f}  {r['all_mpps']}"
        )
    print(
        f"Kafka: {st.records_sent:,} partial records in {st.batches_sent:,} batches, {st.bytes_sent / 1e6:.1f} MB"
    )
    print(
        f"pcap_to_kafka_vs_kernel = {ratio:.3f} on CPU {one} (per round: {per_round}); "
        f"with the reader on a second core {rows[3]['mpps'] / rows[0]['mpps']:.3f}; by CPU time {by_cpu:.3f}"
    )
    out = {
        "benchmark": "pcap_to_kafka",
        "packets": n,
        "groups": args.groups,
        "config": config.name,
        "queries": [q.name for q in queries],
        "query": f"{len(queries)} queries of {config.name} in one pass",
        "cpu": m["cpu"],
        "e2e_mpps": rows[2]["mpps"],
        "kernel_mpps": rows[0]["mpps"],
        "pcap_to_kafka_vs_kernel": round(ratio, 3),
        "pcap_to_kafka_vs_kernel_per_round": per_round,
        "pcap_to_kafka_vs_kernel_by_cpu": round(by_cpu, 3),
        "pcap_to_kafka_vs_kernel_two_cores": round(rows[3]["mpps"] / rows[0]["mpps"], 3),
        "e2e_mpps_two_cores": rows[3]["mpps"],
        "pinned_cpu": one,
        "timing": "from the pcap source's start (the agent's producer connected and holding the topics' "
        "metadata) until Agent.finish returned (end-of-stream punctuation sent, every batch "
        "acknowledged by Kafka); kernel alone = bench_kernel's loop over a pre-filled ring",
        "connect_seconds_untimed": [round(x, 3) for x in CONNECT_S],
        "cpu_time": "CPU seconds of the benchmark process over the same interval (every thread: the agent's loop and "
        "its Kafka client's I/O thread; not the broker), best of the rounds",
        "load_average": LOADS,
        "repeat": args.repeat,
        "all_seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "rows": rows,
        "machine": m,
    }
    harness.write_results("pcap_to_kafka.json", out)
    print(f"wrote {harness.RESULTS / 'pcap_to_kafka.json'}")


if __name__ == "__main__":
    main()
