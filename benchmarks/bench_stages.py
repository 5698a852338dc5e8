"""Where time goes: the throughput of each stage of lowwater on the same Q4 traffic, in one run.

Stages measured here, one after another on 2M 64-byte frames (65,536 (src, dst) groups, 1-minute
windows, table 2^17, lazy flush):

1. capture   - pcap fast replay into the ring, drained by a trivial consumer (frames/s);
2. parse     - the Numba parser alone (frames/s);
3. kernel    - parse + filter + key + table update + flush, the agent's hot loop (frames/s);
4. emit      - partial records of that run, encoded and sent to the real Kafka broker with acks=all
               (records/s; per-packet cost = time / packets);
5. roll-up   - the high level's partition processor (decode, merge, meld, close) on those Kafka
               batches, without Spark (records/s).

Two more stages come from their own benchmarks and are quoted, with their files, when present:
Spark roll-up (results/rollup.json) and the REST top-100 query (results/api.json).

    .venv/bin/python -m benchmarks.bench_stages [--packets 2000000]
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np

from benchmarks import harness
from benchmarks.bench_sources import drain_rate
from benchmarks.harness import machine
from benchmarks.pcapwrite import write_pcap_ns
from benchmarks.queries import q4
from contract.fields import NFIELDS
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from local_stack.kafka_broker import KafkaBroker
from low_level.capture.ring import Ring
from low_level.capture.sources.generator import generate_frames
from low_level.capture.sources.pcap.source import PcapSource
from low_level.host.emit import Emitter
from low_level.kernel.fused import Kernel
from low_level.kernel.parse import parse_batch
from low_level.kernel.tables import Tables

TMP = harness.RESULTS / "tmp"


class Capture:
    """A producer stand-in that keeps the batches, to feed the roll-up stage with exactly them."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.values: dict[int, list[bytes]] = {}

    def send(self, topic: str, value: bytes, partition: int):
        self.values.setdefault(partition, []).append(value)
        return self.inner.send(topic, value=value, partition=partition)

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self.inner.close(timeout=timeout)


def main() -> None:
    ap = harness.parser()
    ap.add_argument("--packets", type=int, default=2_000_000)
    ap.add_argument("--groups", type=int, default=65536)
    args = ap.parse_args()
    n = args.packets
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores; {n:,} frames, {args.groups:,} groups")
    frames, caplen, wirelen, ts = generate_frames(
        n,
        groups=args.groups,
        seed=4,
        snaplen=64,
        sizes=(64, 64),
        proto_mix={"tcp": 1.0},
        synthetic_pps=100_000,
    )
    TMP.mkdir(parents=True, exist_ok=True)
    pcap = TMP / "stages.pcap"
    write_pcap_ns(pcap, frames, caplen, wirelen, ts)
    rows: list[dict] = []

    def add(
        stage: str, unit: str, count: int, secs: float, packets: int = n, source: str = "this run"
    ) -> None:
        rows.append(
            {
                "stage": stage,
                "unit": unit,
                "rate": count / secs,
                "ns_per_packet": secs / packets * 1e9,
                "source": source,
            }
        )
        print(
            f"  {stage:10s} {count / secs / 1e6:8.2f} M {unit}/s  ({secs / packets * 1e9:6.1f} ns per packet)",
            flush=True,
        )

    # 1. capture
    best = 0.0
    for _ in range(3):
        ring = Ring(1 << 16, snaplen=64)
        src = PcapSource(str(pcap), ring, mode="fast", progress=False)
        best = max(best, drain_rate(ring, src, n))
        src.close()
    add("capture", "frames", n, n / best)
    # 2. parse
    flat = np.ascontiguousarray(frames).reshape(-1)
    offs = np.arange(n, dtype=np.int64) * 64
    ifs = np.zeros(n, dtype=np.int64)
    out = np.zeros((n, NFIELDS), dtype=np.int64)
    st = np.zeros(n, dtype=np.int64)
    errs = np.zeros(16, dtype=np.int64)
    parse_batch(flat[:6400], offs[:100], caplen[:100], wirelen[:100], ts[:100], ifs[:100], 100, out, st, errs)
    secs = min(
        _timed(lambda: parse_batch(flat, offs, caplen, wirelen, ts, ifs, n, out, st, errs)) for _ in range(3)
    )
    add("parse", "frames", n, secs)
    # 3. kernel
    q = q4(1 << 17, "lazy", "stages.q4", partitions=2)
    recs: list[np.ndarray] = []

    def kernel_run(keep: bool) -> None:
        t = Tables.build([q], chunk=1 << 16)
        k = Kernel(t)
        for s in range(0, n, t.chunk):
            k.run_arrays(frames, caplen, wirelen, ts, s, min(n, s + t.chunk))
            r = t.drain(0)
            if keep:
                recs.append(r)
        k.flush_below(0, 2**62)
        if keep:
            recs.append(t.drain(0))

    kernel_run(False)
    secs = min(_timed(lambda: kernel_run(False)) for _ in range(3))
    add("kernel", "frames", n, secs)
    kernel_run(True)
    allrecs = np.concatenate(recs)
    tables = Tables.build([q])
    pane, key, state = tables.split(0, allrecs)
    # 4. emit to the real broker
    state_dir = TMP / "kafka-stages"
    shutil.rmtree(state_dir, ignore_errors=True)
    broker = KafkaBroker("stages", port=0, state=state_dir)
    broker.start()
    try:
        broker.create_topic("stages.q4", 2)
        from kafka import KafkaProducer

        prod = Capture(
            KafkaProducer(
                bootstrap_servers=broker.bootstrap_servers,
                acks="all",
                linger_ms=5,
                batch_size=1 << 20,
                max_request_size=8 << 20,
            )
        )
        em = Emitter([q], "stages", None, producer=prod, ensure_topics=False)
        prod.inner.send("stages.warmup", value=b"x").get(timeout=60)  # connection and metadata, not timed
        t0 = time.perf_counter()
        em.submit(q.name, pane, key, state)
        em.punctuate(q.name, 2**62, 2**62, {})
        em.flush(120)
        secs = time.perf_counter() - t0
        em.close()
    finally:
        broker.stop()
    add("emit", "records", len(allrecs), secs)
    # 5. roll-up without Spark
    lay = Layout.of(q)
    t0 = time.perf_counter()
    for part, vals in prod.values.items():
        proc = PartitionProcessor([lay], part, Settings(host_timeout_ms=10**9))
        for s in range(0, len(vals), 64):
            proc.process(vals[s : s + 64], 1000)
    add("roll-up", "records", len(allrecs), time.perf_counter() - t0)
    # quoted from their own benchmarks
    quoted = {}
    for name in ("rollup.json", "api.json"):
        path = harness.RESULTS / name
        if path.exists():
            quoted[name] = json.loads(path.read_text())
    if "rollup.json" in quoted:
        r = quoted["rollup.json"]
        rate = r["spark_records_per_s"]
        rows.append(
            {
                "stage": "spark roll-up",
                "unit": "records",
                "rate": rate,
                "ns_per_packet": len(allrecs) / rate / n * 1e9,
                "source": "results/rollup.json",
            }
        )
    ratio = len(allrecs) / n
    print(f"\npartials per packet in this run: {ratio:.4f} ({len(allrecs):,} partial records)")
    print(f"{'stage':14s} {'rate':>14s} {'ns/packet':>10s}  source")
    for r in rows:
        print(
            f"{r['stage']:14s} {r['rate'] / 1e6:9.2f} M {r['unit'][:3]}/s {r['ns_per_packet']:10.1f}  {r['source']}"
        )
    out_json = {
        "benchmark": "stages",
        "method": __doc__,
        "packets": n,
        "groups": args.groups,
        "partials": int(len(allrecs)),
        "rows": rows,
        "quoted": {k: v.get("machine") for k, v in quoted.items()},
        "machine": m,
    }
    harness.write_results("stages.json", out_json)
    plt = harness.pyplot()

    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh([r["stage"] for r in rows][::-1], [r["ns_per_packet"] for r in rows][::-1], color="#3a7bd5")
    ax.set_xlabel("ns per captured packet (lower is better)")
    ax.set_title(f"Q4, {n / 1e6:.0f}M packets, {args.groups:,} groups: cost of each stage")
    harness.save_figure(fig, harness.RESULTS / "stages.png")
    print(f"wrote {harness.RESULTS / 'stages.json'} and stages.png")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
