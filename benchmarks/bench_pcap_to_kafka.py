"""End to end on a capture host: pcap file -> ring -> kernel -> wire batches -> the real Kafka broker.

Measured side by side in one run: the same agent with a producer that discards batches (so the
ratio shows what Kafka emission costs). Best of --repeat runs (all Kafka times are kept in the
JSON), each timed from the source's start until Kafka has acknowledged every batch. Writes
benchmarks/results/pcap_to_kafka.json.

    .venv/bin/python benchmarks/bench_pcap_to_kafka.py [--packets 8000000] [--groups 65536] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import machine  # noqa: E402
from benchmarks.pcapwrite import write_pcap_ns  # noqa: E402
from benchmarks.queries import q4  # noqa: E402
from contract import query as Q  # noqa: E402
from local_stack.kafka_broker import KafkaBroker  # noqa: E402
from low_level.agent import Agent  # noqa: E402
from low_level.sources.generator import generate_frames  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TMP = RESULTS / "tmp"


class NullProducer:
    def send(self, topic: str, value: bytes, partition: int) -> None:
        return None


def run(q: Q.QuerySpec, pcap: Path, bootstrap: str | None, producer=None) -> tuple[float, Agent]:
    agent = Agent([q], {"type": "pcap", "path": str(pcap), "mode": "fast", "progress": True}, "bench",
                  bootstrap, ring_slots=1 << 18, producer=producer)
    t0 = time.perf_counter()
    agent.run()  # returns after the closing punctuation is flushed and acknowledged
    return time.perf_counter() - t0, agent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packets", type=int, default=8_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each variant; the best is reported")
    ap.add_argument("--groups", type=int, default=65536)
    ap.add_argument("--table", type=int, default=1 << 17)
    args = ap.parse_args()
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores")
    TMP.mkdir(parents=True, exist_ok=True)
    pcap = TMP / "bench.pcap"
    print(f"writing {args.packets:,} frames to {pcap} ...", flush=True)
    frames, caplen, wirelen, ts = generate_frames(args.packets, groups=args.groups, seed=9, snaplen=64,
                                                  proto_mix={"tcp": 1.0}, synthetic_pps=200_000)
    write_pcap_ns(pcap, frames, caplen, wirelen, ts)
    del frames
    state = TMP / "kafka-bench"
    shutil.rmtree(state, ignore_errors=True)
    broker = KafkaBroker("bench", port=0, state=state)
    broker.start()
    try:
        topic = "bench.q4"
        broker.create_topic(topic, 2)
        q = q4(args.table, "lazy", topic, partitions=2)
        run(q4(1024, "lazy", topic, partitions=2), pcap, None, NullProducer())  # warm-up: compile, page cache
        null_s = min(run(q, pcap, None, NullProducer())[0] for _ in range(args.repeat))
        kafka_runs = [run(q, pcap, broker.bootstrap_servers) for _ in range(args.repeat)]
        kafka_s, agent = min(kafka_runs, key=lambda r: r[0])
    finally:
        broker.stop()
    st = agent.emitter.stats
    rows = [
        {"variant": "pcap -> kernel -> discard", "seconds": null_s, "mpps": args.packets / null_s / 1e6},
        {"variant": "pcap -> kernel -> Kafka (acks=all)", "seconds": kafka_s, "mpps": args.packets / kafka_s / 1e6,
         "records_sent": st.records_sent, "bytes_sent": st.bytes_sent, "batches": st.batches_sent},
    ]
    print(f"\n{'variant':38s} {'seconds':>8s} {'Mpkt/s':>8s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['variant']:38s} {r['seconds']:8.2f} {r['mpps']:8.2f} {r['mpps'] / rows[0]['mpps']:6.2f}")
    print(f"Kafka: {st.records_sent:,} partial records in {st.batches_sent:,} batches, {st.bytes_sent / 1e6:.1f} MB")
    out = {"benchmark": "pcap_to_kafka", "packets": args.packets, "groups": args.groups, "table": args.table,
           "query": "Q4 count per (src_ip, dst_ip) per minute, lazy m=2", "e2e_mpps": rows[1]["mpps"],
           "repeat": args.repeat, "all_kafka_seconds": [round(r[0], 3) for r in kafka_runs],
           "rows": rows, "machine": m}
    (RESULTS / "pcap_to_kafka.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS / 'pcap_to_kafka.json'}")


if __name__ == "__main__":
    main()
