"""On-demand punctuation vs periodic heartbeats: window-close latency with one dense and one sparse
capture host (the on-demand punctuation paper's union experiment, on lowwater).

Two real agents (generator sources on the wall clock: a dense host at 50,000 pkt/s and a sparse host
at 0.05 pkt/s) send to the real Kafka broker. A consumer applies the high level's Meld (min over live
hosts' punctuation) and records when the low-water mark passes each 1-second window's end.
Latency = the send time of the punctuation that let the window close - the window's end (wall clock):
the earliest moment the high level could close it, independent of transport and consumer lag. Heartbeat settings compared in one run:
periodic every 0.1 s, 1 s and 10 s (on demand off), on demand (1 s timer + immediate punctuation
whenever a host is idle) and on request (1 s timer + punctuation when the consumer asks: both agents
read a control topic, ``low_level.host.ondemand.RequestListener``; the consumer's
``high_level.ondemand.PunctuationAsker`` asks the hosts that hold its mark back once a window has
ended, at most every 200 ms per host, as the job would). Also reported: punctuations sent per second
(the overhead side) and, on request, requests sent per second.

    .venv/bin/python -m benchmarks.bench_on_demand [--seconds 40]
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
from kafka import KafkaConsumer, TopicPartition

from benchmarks import harness
from benchmarks.harness import machine
from contract import query as Q
from contract import wire
from contract.status import PartitionStatus
from high_level.aggregate.meld import Meld
from high_level.aggregate.rollup import Layout
from high_level.kafkaclients import KafkaClients
from high_level.ondemand import PunctuationAsker
from local_stack.kafka_broker import KafkaBroker
from low_level.host.agent import Agent
from low_level.host.ondemand import RequestListener
from lowwater_testing.queries import on_demand_query

NS = 1_000_000_000
SETTINGS = {
    "periodic 0.1 s": ("100ms", False),
    "periodic 1 s": ("1s", False),
    "periodic 10 s": ("10s", False),
    "on demand": ("1s", True),
    "on request": ("1s", False),
}


def query(topic: str, interval: str, on_demand: bool) -> Q.QuerySpec:
    return on_demand_query("ondemand", topic, interval, table=65536, on_demand=on_demand)


def measure(broker: KafkaBroker, label: str, seconds: float) -> dict:
    interval, on_demand = SETTINGS[label]
    topic = f"ondemand.{label.replace(' ', '_').replace('.', '')}.{time.time_ns()}"
    broker.create_topic(topic, 1)
    q = query(topic, interval, on_demand)
    asker, listeners = None, {}
    if label == "on request":
        ctl = broker.create_topic(f"{topic}.control", 1)
        asker = PunctuationAsker(
            [Layout.of(q)], KafkaClients(broker.bootstrap_servers), topic=ctl, min_gap_ms=200
        )
        for h in ("dense", "sparse"):
            listeners[h] = RequestListener(h, [q], broker.bootstrap_servers, topic=ctl).start()
            listeners[h].ready.wait(30)
    dense = Agent(
        [q],
        {"type": "generator", "rate": 50_000, "groups": 2000, "clock": "wall"},
        "dense",
        broker.bootstrap_servers,
        control=listeners.get("dense"),
    )
    sparse = Agent(
        [q],
        {"type": "generator", "rate": 0.05, "groups": 10, "clock": "wall", "seed": 2},
        "sparse",
        broker.bootstrap_servers,
        control=listeners.get("sparse"),
    )
    threads = [threading.Thread(target=a.run, args=(seconds,), daemon=True) for a in (dense, sparse)]
    t_start = time.time()
    for t in threads:
        t.start()
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        enable_auto_commit=False,
        consumer_timeout_ms=50,
        fetch_max_wait_ms=10,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    meld = Meld(host_timeout_ms=600_000, expected_hosts=["dense", "sparse"])
    closed_at: dict[int, float] = {}
    puncts = 0
    last_lwm = None

    def ask() -> None:
        """On request: what the job's status fold hands the asker after a batch."""
        if asker is not None:
            asker.observe(
                [
                    PartitionStatus(
                        query=q.name,
                        partition=0,
                        now_ms=int(time.time() * 1000),
                        low_water_mark_pane=meld.low_water_mark(),
                        low_water_mark_ns=None,
                        closed_before_window=last_lwm,
                        blocked_by=meld.blocking_hosts(),
                        live_hosts=2,
                        open_windows=1,
                        state_rows=0,
                        windows_closed=0,
                        records=0,
                        hosts={},
                    )
                ]
            )

    while any(t.is_alive() for t in threads) or time.time() < t_start + seconds + 2:
        for msg in consumer:
            now = time.time()
            b = wire.decode(msg.value)
            if isinstance(b, wire.Punctuation) and b.mark_pane != wire.END_OF_STREAM:
                puncts += 1
                meld.observe(b.host, b.incarnation, b.mark_pane, b.mark_ns, b.sent_wall_ns, int(now * 1000))
                lwm = meld.low_water_mark()
                if lwm is not None and (last_lwm is None or lwm > last_lwm):
                    lo = lwm - 60 if last_lwm is None else last_lwm
                    # the window could close as soon as this enabling punctuation existed: its send time
                    # (so a consumer that falls behind in this shared process does not count)
                    for w in range(lo, lwm):  # window w (1 s) ends at (w + 1) s
                        closed_at.setdefault(w, b.sent_wall_ns / 1e9)
                    last_lwm = lwm
            ask()
            if time.time() > t_start + seconds + 15:
                break
        ask()
        if time.time() > t_start + seconds + 15:
            break
    consumer.close()
    for t in threads:
        t.join(10)
    requests = asker.sent if asker is not None else 0
    if asker is not None:
        asker.close()
    for lst in listeners.values():
        lst.stop()
    # windows that ended while both hosts ran, leaving margin for the slowest setting
    lat = [closed_at[w] - (w + 1) for w in closed_at if t_start + 3 < w + 1 < t_start + seconds - 11]
    lat_arr = np.array(lat) if lat else np.array([float("nan")])
    return {
        "setting": label,
        "windows": len(lat),
        "latency_mean_s": float(np.mean(lat_arr)),
        "latency_p50_s": float(np.median(lat_arr)),
        "latency_max_s": float(np.max(lat_arr)),
        "punctuations_per_s": puncts / seconds,
        "requests_per_s": requests / seconds,
    }


def main() -> None:
    ap = harness.parser()
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores")
    state = harness.RESULTS / "tmp" / "kafka-ondemand"
    shutil.rmtree(state, ignore_errors=True)
    broker = KafkaBroker("ondemand", port=0, state=state)
    broker.start()
    rows = []
    try:
        print("warm-up (compiles and caches the kernels; not reported) ...", flush=True)
        measure(broker, "on demand", 8)
        for label in SETTINGS:
            print(f"running '{label}' for {args.seconds:.0f} s ...", flush=True)
            rows.append(measure(broker, label, args.seconds))
            print(f"  {rows[-1]}", flush=True)
    finally:
        broker.stop()
    od = next(r for r in rows if r["setting"] == "on demand")
    print(
        f"\n{'setting':16s} {'windows':>7s} {'mean s':>7s} {'p50 s':>7s} {'max s':>7s} {'punct/s':>8s} {'mean vs on demand':>18s}"
    )
    for r in rows:
        print(
            f"{r['setting']:16s} {r['windows']:7d} {r['latency_mean_s']:7.2f} {r['latency_p50_s']:7.2f} "
            f"{r['latency_max_s']:7.2f} {r['punctuations_per_s']:8.1f} {r['latency_mean_s'] / od['latency_mean_s']:18.2f}"
        )
    harness.write_results(
        "on_demand.json",
        {"benchmark": "on_demand_punctuation", "method": __doc__, "rows": rows, "machine": m},
    )
    plt = harness.pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(
        [r["setting"] for r in rows],
        [r["latency_mean_s"] for r in rows],
        color=["#999", "#999", "#999", "#2a7", "#1a5"],
    )
    ax.set_ylabel("mean window-close latency (s)")
    ax.set_title("dense (50k pkt/s) + sparse (0.05 pkt/s) host, 1 s windows")
    harness.save_figure(fig, harness.RESULTS / "on_demand.png")
    print(f"wrote {harness.RESULTS / 'on_demand.json'} and on_demand.png")


if __name__ == "__main__":
    main()
