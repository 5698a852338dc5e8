"""Memory and latency vs inter-host skew (the OOP paper's Fig. 1 question) on the real job.

Two emulated capture hosts, A and B, see the same traffic rate (RATE packets/s of data time each,
uniform over GROUPS (src_ip, dst_ip) groups; packets of a group arrive at both hosts, like ECMP
links). Query: ``group_by [src_ip, dst_ip]``, count + sum(length), 10-second tumbling windows. Each
host sends, for every second of data time, its partial aggregates of that second (one record per
group it saw, pane = the 10-s window), then punctuation "all my panes < floor(t/10 s) are sent" on
every Kafka partition (2 partitions, stable key hash, as the agents do). Host B's stream is the same
but trails A's by the skew: at replay step T (A has sent all its data before T) B has sent only
its data before T - skew.

Replay (deterministic, not real time): one Kafka broker and one local[2] SparkSession of our own.
Per skew, three streaming jobs (``high_level.job.HighLevelJob``) read the same topic:

* ``oop``       lowwater: windows close by punctuation (min over the expected hosts A, B);
* ``wm=skew``   ``--mode watermark`` with delay = the skew (the smallest delay that loses nothing);
* ``wm=2s``     ``--mode watermark`` with a fixed 2 s delay;

and, beside them without Spark, the OOP paper's own baseline:

* ``iop``       an in-order merge (``bench_skew_iop.InOrderUnion``) of the same packets as tuples
  (48 B: ts, 4 key words, length), released in timestamp order once both hosts are past them, into
  the same roll-up; its state = the merge buffer + the roll-up's rows. ``oop_vs_iop_state_at_40s``
  in ``skew.json`` = lowwater's payload / IOP's (the paper: ~0.3).

Each step's messages are produced in one Kafka transaction (the jobs read ``read_committed``), so a
micro-batch always holds whole steps and the run does not depend on trigger timing; then
``processAllAvailable`` on all three jobs. Steps are 5 s of data time during warm-up (until B has
sent 10 s), then 1 s.

Measured per job:

* state: after every step of the steady phase (B has sent >= 20 s), the rows the job holds
  (oop: pane rows in the partition processors, ``state_rows`` of the job status; watermark: Spark's
  ``numRowsTotal`` of the aggregation), ``payload`` = rows x (8 B window id + 4 x 8 B key + 2 x 8 B
  aggregates), the same row format for both, and Spark's own ``memoryUsedBytes`` of the state store
  (``HighLevelJob.progress()``; for oop the store holds one compact binary per partition, for the
  watermark one UnsafeRow per (window, key)). Mean and max over the steady steps.
* latency, in data time: a window [e - 10 s, e) appears in the output after step T -> latency T - e,
  i.e. how far the leading host's clock is past the window end when the window is emitted. This is
  wall-clock latency of a live deployment minus processing time (the batch duration, reported
  separately). Resolution 1 s; mean over the windows with e >= 20 s emitted at a 1-s step. The run
  ends at step skew + 20 s + MEAS (the end of the steady phase).
* loss: Spark's ``numRowsDroppedByWatermark`` (input partial records dropped, summed over all
  batches of the run) and, against the exact oracle (the generated packets), over the windows with
  20 s <= e <= last step - skew - 13 s (closed by then in every variant unless lost): (window, key)
  rows missing, rows present with a wrong value, packets missing.

Caveat built into the watermark baseline (``high_level/aggregate/watermark.py``): a partial aggregate carries
no finer time than its pane, so its event time is the pane start, and Spark's watermark (max event
time - delay) advances in whole 10-s steps and trails the leading host by up to a pane more than the
delay. That adds up to 10 s of latency and as much hidden slack (a 2-s delay tolerates ~2-12 s of
skew). Spark also evicts with the watermark of the previous micro-batch (no empty batches: + 1 step).

    .venv/bin/python -m benchmarks.bench_skew [--quick] [--skews 0,5,10,20,40]
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks import harness
from benchmarks.bench_skew_iop import DST0, GROUPS, HOSTS, KEYS, QUERY, TUPLE, WINDOW_S, InOrderUnion
from benchmarks.harness import machine
from contract import query as Q
from contract import wire
from high_level.aggregate.rollup import Layout
from high_level.job import HighLevelJob, JobOptions

NS = 1_000_000_000
T0_S = 1_700_000_000  # data time origin (a multiple of the window)
RATE = 4_000  # packets per second of data time, per host
PARTITIONS = 2
MAX_BATCH = 4096  # partial records per Kafka message
WARM_STEP_S = 5
ROW_BYTES = 8 + 4 * 8 + 2 * 8  # window/pane id + key words + (count, sum)


# -- the two capture hosts ------------------------------------------------------------------------
def second_partials(host: int, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host's packets of data second t, aggregated per group: (group ids, packets, bytes)."""
    rng = np.random.default_rng((17, host, t))
    g = rng.integers(0, GROUPS, RATE)
    length = rng.integers(64, 1501, RATE)
    cnt = np.bincount(g, minlength=GROUPS)
    byt = np.bincount(g, weights=length, minlength=GROUPS).astype(np.int64)
    nz = np.flatnonzero(cnt)
    return nz, cnt[nz].astype(np.int64), byt[nz]


def second_tuples(host: int, t: int) -> np.ndarray:
    """The same packets as :func:`second_partials`, as tuples in timestamp order (for the IOP merge)."""
    rng = np.random.default_rng((17, host, t))
    g = rng.integers(0, GROUPS, RATE)
    length = rng.integers(64, 1501, RATE)
    out = np.empty(RATE, TUPLE)
    order = np.argsort(
        ts := (T0_S + t) * NS + np.random.default_rng((18, host, t)).integers(0, NS, RATE), kind="stable"
    )
    out["ts"], out["k"], out["len"] = ts[order], KEYS[g[order]], length[order]
    return out


class Host:
    """One emulated capture host: per second of data time, its partials then punctuation."""

    def __init__(self, q: Q.QuerySpec, index: int) -> None:
        self.q, self.index, self.name = q, index, HOSTS[index]
        self.seq = [0] * PARTITIONS
        self.part = wire.partition_of(KEYS, PARTITIONS)

    def second(self, t: int, oracle: dict[int, np.ndarray]) -> list[tuple[int, bytes]]:
        """Messages for data second t (relative to T0_S): (partition, value)."""
        gid, cnt, byt = second_partials(self.index, t)
        pane = (T0_S + t) // WINDOW_S
        acc = oracle.setdefault(pane, np.zeros((GROUPS, 2), np.int64))
        acc[gid, 0] += cnt
        acc[gid, 1] += byt
        out = []
        parts = self.part[gid]
        for p in range(PARTITIONS):
            sel = gid[parts == p]
            st = np.column_stack([cnt[parts == p], byt[parts == p]])
            for s in range(0, len(sel), MAX_BATCH):
                k = KEYS[sel[s : s + MAX_BATCH]]
                n = len(k)
                out.append(
                    (
                        p,
                        wire.encode_partials(
                            self.q.name,
                            self.name,
                            1,
                            p,
                            self.seq[p],
                            np.full(n, pane),
                            k,
                            st[s : s + MAX_BATCH],
                        ),
                    )
                )
                self.seq[p] += n
        mark = (T0_S + t + 1) // WINDOW_S  # every pane before the one holding t+1 is complete
        for p in range(PARTITIONS):
            pu = wire.Punctuation(
                self.q.name, self.name, 1, p, self.seq[p], mark, mark * WINDOW_S * NS, (T0_S + t + 1) * NS, {}
            )
            out.append((p, wire.encode_punctuation(pu)))
        return out


# -- a job that records what it emits, per replay step -------------------------------------------
@dataclass
class Recorder:
    step: int = 0
    first_step: dict[int, int] = field(default_factory=dict)  # window end (s, relative) -> step seen first
    last_step: dict[int, int] = field(default_factory=dict)
    rows: dict[int, list[np.ndarray]] = field(
        default_factory=dict
    )  # window end -> [gid, packets, bytes] blocks
    batch_ids: list[int] = field(default_factory=list)


class RecordingJob(HighLevelJob):
    """HighLevelJob whose sink also notes, per final row, the replay step it was emitted in."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.rec = Recorder()
        self.rec_lock = threading.Lock()
        self.sink.on_rows.append(self.record)

    def record(self, tbl: pa.Table, batch_id: int) -> None:
        """The sink's watcher: every batch's generic rows (whichever pipeline wrote them)."""
        fin = tbl.filter(pc.equal(tbl["kind"], "final"))
        with self.rec_lock:
            self.rec.batch_ids.append(batch_id)
            if fin.num_rows:
                n = fin.num_rows
                end = (np.asarray(fin["window_end_ns"].to_numpy(), np.int64) // NS) - T0_S
                key = _matrix(fin["key"], n, 4)
                st = _matrix(fin["state"], n, 2)
                gid = key[:, 3] - DST0
                for e in np.unique(end).tolist():
                    sel = end == e
                    self.rec.first_step.setdefault(e, self.rec.step)
                    self.rec.last_step[e] = self.rec.step
                    self.rec.rows.setdefault(e, []).append(np.column_stack([gid[sel], st[sel]]))


def _matrix(col: pa.ChunkedArray, n: int, width: int) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(n, width)


# -- one skew ------------------------------------------------------------------------------------
# the blob state, as in the published figures: its state_rows are the pane rows held (the chunked state counts a
# group once per chunk until its pane's chunks merge, so its rows are not the table the paper's figure shows)
STATE = "blob"
VARIANTS = ("oop", "wm=skew", "wm=2s")  # Spark jobs; "iop" runs beside them without Spark


def state_sample(job: RecordingJob, variant: str) -> dict[str, int]:
    """State numbers after the step: rows held, payload bytes, Spark's state-store memory."""
    prog = next(iter(job.progress().values()), {})
    if variant == "oop":
        qs = next(iter(job.sink.partitions.values()), {})
        rows = sum(p.state_rows for p in qs.values())
    else:
        rows = int(prog.get("stateRows", 0))
    return {
        "rows": rows,
        "payload_bytes": rows * ROW_BYTES,
        "spark_memory_bytes": int(prog.get("stateMemoryBytes", 0)),
    }


def wait_progress(job: RecordingJob, timeout: float = 10.0) -> None:
    """lastProgress can trail processAllAvailable by a moment: wait until it reports our last batch."""
    with job.rec_lock:
        want = max(job.rec.batch_ids, default=-1)
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        p = job.streams[0].lastProgress
        if p is not None and int(p.get("batchId", -1)) >= want:
            return
        time.sleep(0.02)


def _iop_step(iop: InOrderUnion, rec: Recorder, step: int, frontier_ns: int) -> None:
    """Release what both hosts are past and note the closed windows as the jobs' recorders do."""
    done = iop.release(frontier_ns)
    if len(done):
        end = (np.asarray(iop.roll.layout.window_end_ns(done.window), np.int64) // NS) - T0_S
        gid = done.key[:, 3] - DST0
        for e in np.unique(end).tolist():
            sel = end == e
            rec.first_step.setdefault(e, step)
            rec.last_step[e] = step
            rec.rows.setdefault(e, []).append(np.column_stack([gid[sel], done.state[sel]]))


def run_skew(spark: Any, broker: Any, work: Path, skew: int, meas: int, log: Any) -> list[dict[str, Any]]:
    from kafka import KafkaProducer

    topic = f"skew-{skew}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, PARTITIONS)
    q = Q.load_text(QUERY).queries[0]
    q = q.model_copy(update={"kafka": Q.KafkaSpec(topic=topic, partitions=PARTITIONS)})
    hosts = [Host(q, 0), Host(q, 1)]
    iop = InOrderUnion(Layout.of(q))
    iop_rec = Recorder()
    iop_samples: list[dict[str, int]] = []
    oracle: dict[int, np.ndarray] = {}
    jobs: dict[str, RecordingJob] = {}
    for v in VARIANTS:
        mode, delay = ("oop", 0) if v == "oop" else ("watermark", skew * 1000 if v == "wm=skew" else 2000)
        opts = JobOptions(
            bootstrap=broker.bootstrap_servers,
            results=str(work / f"{skew}-{v}" / "results"),
            checkpoint=str(work / f"{skew}-{v}" / "ckpt"),
            mode=mode,
            watermark_delay_ms=delay,
            trigger_ms=200,
            host_timeout_ms=3_600_000,
            expected_hosts=HOSTS,
            shuffle_partitions=2,
            name=f"skew{skew}-{v.replace('=', '')}",
            create_topics=False,
            kafka_options={"kafka.isolation.level": "read_committed"},
            state=STATE,
        )
        jobs[v] = RecordingJob(spark, [q], opts)
        jobs[v].start()
    prod = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers,
        transactional_id=f"bench-skew-{topic}",
        acks="all",
        linger_ms=5,
        max_request_size=16 << 20,
        batch_size=1 << 20,
    )
    prod.init_transactions()
    warm_end = skew + 10  # coarse steps until B has sent 10 s
    steady = (skew + 20, skew + 20 + meas)  # state sampled at steps T in (a, b]
    last = steady[1]
    steps = list(range(WARM_STEP_S, warm_end + 1, WARM_STEP_S))
    steps += list(range((steps[-1] if steps else 0) + 1, last + 1))
    fine = {T for i, T in enumerate(steps) if i and steps[i - 1] == T - 1}  # steps with 1-s resolution
    # windows every variant has closed by the last step unless it lost them (watermark: by e + skew + 12)
    loss_windows = list(range(2 * WINDOW_S, last - skew - 13 + 1, WINDOW_S))
    sent = [0, 0]  # data seconds sent per host
    samples: dict[str, list[dict[str, int]]] = {v: [] for v in VARIANTS}
    durations: dict[str, list[int]] = {v: [] for v in VARIANTS}
    drops: dict[str, dict[int, int]] = {v: {} for v in VARIANTS}
    t_start = time.monotonic()
    try:
        for i, T in enumerate(steps):
            for j in jobs.values():
                with j.rec_lock:
                    j.rec.step = T
            msgs: list[tuple[int, bytes]] = []
            while sent[0] < T or sent[1] < T - skew:  # in arrival order: A's second t at t+1, B's at t+1+skew
                h = 0 if sent[0] + 1 <= sent[1] + 1 + skew and sent[0] < T else 1
                msgs += hosts[h].second(sent[h], oracle)
                iop.push(h, second_tuples(h, sent[h]))
                sent[h] += 1
            _iop_step(iop, iop_rec, T, (T0_S + min(sent)) * NS)
            prod.begin_transaction()
            for p, v in msgs:
                prod.send(topic, value=v, partition=p)
            prod.commit_transaction()
            for j in jobs.values():
                j.process_all_available()
            for v, j in jobs.items():
                wait_progress(j)
                p = next(iter(j.progress().values()), {})
                durations[v].append(int(p.get("durationMs") or 0))
                if steady[0] < T <= steady[1]:
                    samples[v].append(state_sample(j, v))
            if steady[0] < T <= steady[1]:
                iop_samples.append(
                    {
                        "rows": len(iop.roll),
                        "tuples": iop.buffered_tuples,
                        "payload_bytes": len(iop.roll) * ROW_BYTES + iop.buffered_bytes,
                    }
                )
                for pr in j.streams[0].recentProgress:  # per batch, deduplicated by batch id
                    drops[v][int(pr["batchId"])] = sum(
                        int(o.get("numRowsDroppedByWatermark", 0)) for o in pr.get("stateOperators") or []
                    )
            if i % 10 == 0 or T == last:
                s = {
                    v: (samples[v][-1]["rows"] if samples[v] else state_sample(j, v)["rows"])
                    for v, j in jobs.items()
                }
                log(
                    f"  skew {skew:2d}s step T={T:3d}/{last} s  state rows {s}  {time.monotonic() - t_start:5.0f}s"
                )
        dropped = {v: sum(d.values()) for v, d in drops.items()}
    finally:
        prod.close()
        for j in jobs.values():
            j.stop()
    out = []
    recs = {v: j.rec for v, j in jobs.items()}
    recs["iop"] = iop_rec
    for v, rec in recs.items():
        # latency over the windows (end >= 20 s) this variant emitted at a 1-s step
        lat = [
            rec.last_step[e] - e
            for e in sorted(rec.last_step)
            if e >= 2 * WINDOW_S and rec.last_step[e] in fine
        ]
        miss_rows = wrong_rows = miss_pk = total_pk = 0
        for e in loss_windows:
            exp = oracle[(T0_S + e) // WINDOW_S - 1]
            got = np.zeros((GROUPS, 2), np.int64)
            present = np.zeros(GROUPS, bool)
            for blk in rec.rows.get(e, []):
                got[blk[:, 0]] += blk[:, 1:]
                present[blk[:, 0]] = True
            has = exp[:, 0] > 0
            miss_rows += int((has & ~present).sum())
            wrong_rows += int((present & (got != exp).any(axis=1)).sum())
            miss_pk += int(exp[:, 0].sum() - got[:, 0].sum())
            total_pk += int(exp[:, 0].sum())
        sm = samples[v] if v != "iop" else iop_samples
        out.append(
            {
                "skew_s": skew,
                "variant": v,
                "watermark_delay_s": None if v in ("oop", "iop") else (skew if v == "wm=skew" else 2),
                "state_rows_mean": float(np.mean([s["rows"] for s in sm])),
                "state_rows_max": max(s["rows"] for s in sm),
                "payload_mib_mean": float(np.mean([s["payload_bytes"] for s in sm])) / 2**20,
                "spark_state_mib_mean": float(np.mean([s.get("spark_memory_bytes", 0) for s in sm])) / 2**20,
                "spark_state_mib_max": max(s.get("spark_memory_bytes", 0) for s in sm) / 2**20,
                "iop_buffer_tuples_mean": float(np.mean([s["tuples"] for s in sm])) if v == "iop" else None,
                "latency_windows": len(lat),
                "latency_mean_s": float(np.mean(lat)) if lat else None,
                "latency_max_s": max(lat) if lat else None,
                "loss_windows": len(loss_windows),
                "loss_windows_not_emitted": sum(e not in rec.last_step for e in loss_windows),
                "dropped_by_watermark": dropped.get(v, 0),
                "rows_missing": miss_rows,
                "rows_wrong": wrong_rows,
                "packets_missing": miss_pk,
                "packets_total": total_pk,
                "packets_missing_pct": 100.0 * miss_pk / total_pk if total_pk else 0.0,
                "batch_ms_mean": float(np.mean(durations[v])) if durations.get(v) else None,
                "steps": len(steps),
                "steady_samples": len(sm),
            }
        )
    return out


# -- report --------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'skew':>5s} {'mode':8s} {'state rows':>10s} {'+ tuples':>9s} {'payload':>8s} {'spark mem':>9s} {'latency':>8s} "
        f"{'lat max':>7s} {'dropped':>8s} {'rows miss':>9s} {'rows wrong':>10s} {'pkts miss':>9s} {'batch':>6s}"
    )
    lines = [
        head,
        f"{'s':>5s} {'':8s} {'mean':>10s} {'(iop)':>9s} {'MiB':>8s} {'MiB':>9s} {'mean s':>8s} {'s':>7s} "
        f"{'records':>8s} {'':>9s} {'':>10s} {'%':>9s} {'ms':>6s}",
    ]
    for r in rows:
        lat = "-" if r["latency_mean_s"] is None else f"{r['latency_mean_s']:.1f}"
        lmax = "-" if r["latency_max_s"] is None else f"{r['latency_max_s']}"
        tup = "-" if r.get("iop_buffer_tuples_mean") is None else f"{r['iop_buffer_tuples_mean']:,.0f}"
        lines.append(
            f"{r['skew_s']:5d} {r['variant']:8s} {r['state_rows_mean']:10,.0f} {tup:>9s} {r['payload_mib_mean']:8.1f} "
            f"{r['spark_state_mib_mean']:9.1f} {lat:>8s} {lmax:>7s} {r['dropped_by_watermark']:8,d} "
            f"{r['rows_missing']:9,d} {r['rows_wrong']:10,d} {r['packets_missing_pct']:9.1f} "
            f"{r['batch_ms_mean'] or 0:6.0f}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = harness.pyplot()

    style = {
        "oop": ("lowwater (punctuation)", "#2a7", "o", 10),
        "wm=skew": ("Spark watermark, delay = skew", "#36c", "s", 7),
        "wm=2s": ("Spark watermark, delay = 2 s", "#c33", "^", 5),
        "iop": ("in-order merge (IOP) + roll-up", "#999", "D", 5),
    }
    # markers shrink in drawing order so that equal values (e.g. both watermarks at 5-10 s) stay visible
    fig, ax = plt.subplots(1, 4, figsize=(17, 4.2))
    for v, (label, color, marker, size) in style.items():
        rs = sorted((r for r in rows if r["variant"] == v), key=lambda r: r["skew_s"])
        x = [r["skew_s"] for r in rs]
        kw = {"label": label, "color": color, "marker": marker, "markersize": size}
        ax[0].plot(x, [r["payload_mib_mean"] for r in rs], **kw)
        if v != "iop":
            ax[1].plot(x, [r["spark_state_mib_mean"] for r in rs], **kw)
        ax[2].plot(x, [r["latency_mean_s"] if r["latency_mean_s"] is not None else np.nan for r in rs], **kw)
        ax[3].plot(x, [r["packets_missing_pct"] for r in rs], **kw)
    titles = (
        "state payload (MiB, mean; IOP: + buffered 48-B tuples)",
        "Spark state store memoryUsedBytes (MiB, mean)",
        "result latency: leading host's time - window end (s)",
        "packets missing from results (%)",
    )
    sup = f"2 hosts x {RATE:,} pkt/s, {GROUPS:,} groups, {WINDOW_S}-s tumbling windows (replay)"
    harness.style_axes(ax, titles, "skew between the two hosts (s)", suptitle=sup)
    harness.save_figure(fig, path)


def main() -> None:
    ap = harness.parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skews 0, 20 s and a shorter steady phase (< 4 min)")
    ap.add_argument("--skews", default=None, help="comma list of skews in seconds (default 0,5,10,20,40)")
    ap.add_argument(
        "--meas", type=int, default=None, help="steady phase in seconds of data time (default 30)"
    )
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    skews = [int(s) for s in (args.skews or ("0,20" if args.quick else "0,5,10,20,40")).split(",")]
    meas = args.meas or (20 if args.quick else 30)
    m = machine()
    t_all = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_all:6.0f}s] {msg}", flush=True)

    log(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB")
    from local_stack.kafka_broker import KafkaBroker
    from local_stack.spark_session import build_spark

    work = Path(tempfile.mkdtemp(prefix="lowwater-bench-skew-"))
    broker = KafkaBroker("skew", port=0, state=work / "kafka")
    rows: list[dict[str, Any]] = []
    try:
        log(f"starting Kafka on {broker.bootstrap_servers} and Spark {args.master} (state under {work}) ...")
        broker.start()
        spark = build_spark(
            "lowwater-bench-skew",
            master=args.master,
            state=work / "spark-state",
            extra_conf={"spark.sql.shuffle.partitions": "2"},
        )
        try:
            for skew in skews:
                log(f"skew {skew} s: 3 jobs (oop, watermark delay={skew}s, watermark delay=2s) ...")
                rs = run_skew(spark, broker, work / "jobs", skew, meas, log)
                rows += rs
                print(table(rs), flush=True)
        finally:
            spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t_all
    print(f"\nmachine: {m['cpu']}, {m['cores']} cores; {took:.0f} s total")
    print(table(rows))
    method = {
        "doc": __doc__,
        "hosts": 2,
        "rate_pkt_per_s_per_host": RATE,
        "groups": GROUPS,
        "window_s": WINDOW_S,
        "kafka_partitions": PARTITIONS,
        "master": args.master,
        "steady_phase_s": meas,
        "skews_s": skews,
        "state_row_bytes": ROW_BYTES,
        "quick": args.quick,
        "runtime_s": round(took),
    }
    by = {(r["skew_s"], r["variant"]): r for r in rows}
    ratio = {str(k): by[(k, "oop")]["payload_mib_mean"] / by[(k, "iop")]["payload_mib_mean"] for k in skews}
    print(f"oop / iop state payload by skew: {ratio} (OOP paper Fig. 1: ~0.3 at 40 s)")
    harness.write_results(
        "skew.json",
        {
            "benchmark": "memory_latency_vs_skew",
            "machine": m,
            "method": method,
            "oop_vs_iop_state_by_skew": ratio,
            "oop_vs_iop_state_at_40s": ratio.get("40"),
            "rows": rows,
        },
    )
    plot(rows, harness.RESULTS / "skew.png")
    print(f"wrote {harness.RESULTS / 'skew.json'} and {harness.RESULTS / 'skew.png'}")


if __name__ == "__main__":
    main()
