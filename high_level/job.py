"""The high-level Spark Structured Streaming job: wiring, sink and the ``lowwater-job`` CLI.

OOP mode (default): Kafka -> ``groupBy(topic, partition).applyInPandasWithState`` (one group per
Kafka partition, so a single shuffle; the body is :class:`high_level.partition.PartitionProcessor`)
-> ``foreachBatch`` sink writing typed Parquet and the status file. Windows close by punctuation
(min over live hosts), never by Spark's event-time watermark. ``--mode watermark`` runs the
max-event-time-minus-delay baseline (:mod:`high_level.watermark`) into the same layout.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import query as Q
from high_level.metrics import JobMetrics
from high_level.partition import (
    LATE_POLICIES,
    OUTPUT_DDL,
    PartitionProcessor,
    Settings,
    unpack_rows,
    unpack_windows,
)
from high_level.rollup import Layout
from high_level.store import ResultStore, generic_table, summarize

log = logging.getLogger("lowwater.job")
_FS_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _is_local_path(location: str) -> bool:
    """A checkpoint on this machine's file system (a plain path or file: URI), not HDFS/S3/..."""
    return "://" not in location or location.startswith("file:")
MODES = ("oop", "watermark")
_KINDS = pa.array(["correction", "final"])  # kind text by rank (the store orders kinds as their text)


@dataclass(frozen=True)
class JobOptions:
    """Everything the job needs besides the Spark session and the queries."""

    bootstrap: str
    results: str
    checkpoint: str
    mode: str = "oop"
    trigger_ms: int = 1000
    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    watermark_delay_ms: int = 10_000
    max_offsets_per_trigger: int | None = None
    shuffle_partitions: int | None = None  # None: the session's setting (fixed per checkpoint)
    name: str = "lowwater"
    create_topics: bool = True
    kafka_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}")
        if self.trigger_ms <= 0 or self.host_timeout_ms <= 0:
            raise ValueError("trigger and host timeout must be positive")

    @property
    def settings(self) -> Settings:
        return Settings(self.host_timeout_ms, tuple(self.expected_hosts), self.late_policy)


def state_function(layouts: Sequence[Layout], settings: Settings, tick_ms: int) -> Callable[..., Iterator[pd.DataFrame]]:
    """The applyInPandasWithState body: restore the partition's processor, feed it the batch in
    offset order, save it as compact bytes, re-arm the processing-time timeout (so a silent
    partition is still evaluated and its hosts can time out)."""
    by_topic: dict[str, list[Layout]] = {}
    for lay in layouts:
        by_topic.setdefault(lay.topic, []).append(lay)

    def fn(key: tuple, pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        topic, partition = str(key[0]), int(key[1])  # key[2] is the placement salt
        lays = by_topic[topic]
        if state.exists:
            proc = PartitionProcessor.from_bytes(state.get[0], lays, settings)
        else:
            proc = PartitionProcessor(lays, partition, settings)
        frames = [df for df in pdfs if len(df)]
        values: list[bytes] = []
        if frames:
            df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            df = df.sort_values("offset", kind="stable")
            values = df["value"].tolist()
        out = proc.process_packed(values, int(state.getCurrentProcessingTimeMs()))
        state.update((proc.to_bytes(),))
        state.setTimeoutDuration(tick_ms)
        yield out

    return fn


def checkpoint_shuffle_partitions(checkpoint: Path) -> int | None:
    """The shuffle partition count a checkpoint was started with (Spark restores it on restart)."""
    offsets = checkpoint / "offsets"
    ids = sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit()) if offsets.is_dir() else []
    for i in reversed(ids):
        try:
            meta = json.loads((offsets / str(i)).read_text().splitlines()[1])
            return int(meta["conf"]["spark.sql.shuffle.partitions"])
        except (OSError, IndexError, KeyError, ValueError):
            continue
    return None


_M32 = 0xFFFFFFFF


def _mix_k1(k: int) -> int:
    k = (k * 0xCC9E2D51) & _M32
    return (((k << 15) | (k >> 17)) & _M32) * 0x1B873593 & _M32


def _mix_h1(h: int, k: int) -> int:
    h ^= k
    return (((h << 13) | (h >> 19)) & _M32) * 5 + 0xE6546B64 & _M32


def _fmix(h: int, n: int) -> int:
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def spark_hash(*values: str | int) -> int:
    """Spark SQL's ``hash(...)`` (Murmur3Hash, seed 42) of strings and ints, computed in Python.

    Bit-exact with Spark: strings (UTF8_BINARY) use ``Murmur3_x86_32.hashUnsafeBytes`` (4-byte
    little-endian words, then each tail byte sign-extended on its own), ints ``hashInt``; each
    value seeds the next. Placement must not need a Spark job at start.
    """
    h = 42
    for v in values:
        if isinstance(v, str):
            b = v.encode()
            n4 = len(b) - len(b) % 4
            for i in range(0, n4, 4):
                h = _mix_h1(h, _mix_k1(int.from_bytes(b[i : i + 4], "little")))
            for x in b[n4:]:
                h = _mix_h1(h, _mix_k1((x - 256 if x > 127 else x) & _M32))
            h = _fmix(h, len(b))
        else:
            if not -(2**31) <= int(v) < 2**31:
                raise ValueError(f"{v} is not a 32-bit int")
            h = _fmix(_mix_h1(h, _mix_k1(int(v) & _M32)), 4)
    return h - (1 << 32) if h >= 1 << 31 else h


def placement_salts(partitions: dict[str, int], n_tasks: int, tries: int = 64) -> dict[tuple[str, int], int]:
    """A salt per (topic, Kafka partition) that spreads the stateful groups evenly over Spark tasks.

    Why: Spark places group (topic, partition) on task pmod(murmur3(topic, partition), N); with as
    many Kafka partitions as cores two of them collide half the time and one core does all the work.
    Grouping by (topic, partition, salt) with the smallest salt that hashes to task
    ``(partition + crc32(topic)) % N`` makes the placement round-robin. The salt depends only on
    (topic, partition, N) and N is fixed per checkpoint, so a group's state key never changes.
    Computed with Spark's own ``hash`` function (the one hash partitioning uses), reimplemented
    bit-exactly in :func:`spark_hash` so that starting the job runs no Spark job.
    """
    out: dict[tuple[str, int], int] = {}
    for t, n in sorted(partitions.items()):
        for p in range(n):
            want = (p + zlib.crc32(t.encode())) % n_tasks
            for salt in range(tries):
                if spark_hash(t, p, salt) % n_tasks == want:  # Python's % is pmod for n_tasks > 0
                    out[(t, p)] = salt
                    break
    return out


class HighLevelJob:
    """Builds, starts and feeds the streaming queries; owns the result store and the metrics."""

    def __init__(self, spark: Any, queries: Sequence[Q.QuerySpec], opts: JobOptions,
                 metrics: JobMetrics | None = None) -> None:  # fmt: skip
        if not queries:
            raise ValueError("no queries")
        self.spark = spark
        self.queries = list(queries)
        self.opts = opts
        self.metrics = metrics or JobMetrics()
        self.store = ResultStore(opts.results, self.queries)
        self.layouts = {q.name: Layout.of(q) for q in self.queries}
        self.streams: list[Any] = []
        self._lock = threading.Lock()
        prev = self.store.read_status()
        self.partitions: dict[str, dict[int, dict[str, Any]]] = {}
        if prev.get("mode") == opts.mode:
            for qn, qs in prev.get("queries", {}).items():
                self.partitions[qn] = {int(k): v for k, v in qs.get("partitions", {}).items()}
        self.last_batch: dict[str, Any] = {}

    # -- building ---------------------------------------------------------------------------------
    def start(self) -> list[Any]:
        """Start the streaming query (one in OOP mode, one per query in watermark mode)."""
        if self.opts.create_topics:
            # Spark's Kafka source fails on a missing topic, and agents may start after the job
            from contract.topics import connect, ensure_topics, wanted_topics

            admin = connect(self.opts.bootstrap, {}, 60)
            try:
                for topic, action in ensure_topics(admin, wanted_topics(self.queries)).items():
                    log.info("topic %s: %s", topic, action)
            finally:
                admin.close()
        self.spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        # No empty micro-batches: with a processing-time timeout Spark would otherwise run one every
        # trigger forever (and processAllAvailable would never return). Closing needs no empty
        # batches: a window can only close when some host's punctuation arrives, which is data.
        self.spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        if self.opts.shuffle_partitions:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(self.opts.shuffle_partitions))
        if _is_local_path(self.opts.checkpoint):
            # Hadoop's FileContext on the local file system (no native libhadoop in pyspark) forks a
            # `readlink` per checkpoint file create/rename, ~40 process spawns per micro-batch; the
            # FileSystem-based manager needs ~10, a chmod per new file (its renames are POSIX rename(2), atomic on one disk).
            # Sustained roll-up rate: 1.16 -> 1.40 M records/s (benchmarks/bench_rollup.py).
            self.spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", _FS_CHECKPOINT_MANAGER)
        if self.opts.mode == "oop":
            self.streams = [self._start_oop()]
        else:
            from high_level.watermark import start_watermark

            self.streams = start_watermark(self)
        return self.streams

    def _start_oop(self) -> Any:
        from pyspark.sql.streaming.state import GroupStateTimeout

        from high_level.ingest import kafka_stream

        o = self.opts
        layouts = [Layout.of(q) for q in self.queries]
        from pyspark.sql import functions as F

        raw = kafka_stream(self.spark, o.bootstrap, [lay.topic for lay in layouts],
                           max_offsets_per_trigger=o.max_offsets_per_trigger, extra=o.kafka_options)  # fmt: skip
        ckpt = Path(o.checkpoint) / "oop"
        n_tasks = checkpoint_shuffle_partitions(ckpt) or int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        parts: dict[str, int] = {}
        for q in self.queries:
            parts[q.topic] = max(parts.get(q.topic, 0), q.kafka.partitions)
        salts = placement_salts(parts, n_tasks)
        if salts:
            table = F.create_map(*[x for (t, p), v in sorted(salts.items()) for x in (F.lit(f"{t}/{p}"), F.lit(v))])
            salt = F.coalesce(F.try_element_at(table, F.concat_ws("/", "topic", F.col("partition").cast("string"))),
                              F.lit(0)).cast("int")  # fmt: skip
        else:
            salt = F.lit(0)
        raw = raw.withColumn("salt", salt)
        rolled = raw.groupBy("topic", "partition", "salt").applyInPandasWithState(
            state_function(layouts, o.settings, o.trigger_ms),
            outputStructType=OUTPUT_DDL,
            stateStructType="blob binary",
            outputMode="append",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
        return (
            rolled.writeStream.queryName(f"{o.name}-oop")
            .foreachBatch(self._sink_oop)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime=f"{o.trigger_ms} milliseconds")
            .start()
        )

    # -- sink -------------------------------------------------------------------------------------
    def _sink_oop(self, df: Any, batch_id: int) -> None:
        """foreachBatch: one action (toArrow) so the stateful step runs once, then write.

        The packed output goes straight to the store (:meth:`handle_packed`); a subclass that overrides
        :meth:`handle_rows` (to watch the generic rows, e.g. a benchmark's recorder) gets generic rows.
        """
        t0 = time.monotonic()
        packed = df.toArrow()
        if type(self).handle_rows is HighLevelJob.handle_rows:
            self.handle_packed(packed, batch_id)
        else:
            self.handle_rows(unpack_rows(packed, self.layouts), batch_id)
        self.metrics.batch_duration.observe(time.monotonic() - t0)

    def handle_packed(self, packed: pa.Table, batch_id: int) -> dict[str, int]:
        """:meth:`handle_rows` for the stateful step's packed output: the same files, status and metrics,
        without building generic rows first (their list columns cost more than the Parquet encoding)."""
        wins, texts = unpack_windows(packed, self.layouts)
        with self._lock:
            written: dict[str, int] = {}
            for name in sorted(wins):
                w, lay = wins[name], self.layouts[name]
                end_ns = lay.window_end_ns(w.window)
                q = self.store.queries.get(name)
                if q is not None:
                    rank = w.final.astype(np.int8)
                    written[name] = self.store.write_query(batch_id, q, w.window, rank, _KINDS.take(pa.array(rank)),
                                                           end_ns - lay.range_ns, end_ns, w.key, w.state,
                                                           w.closed_at_ms, w.hosts)  # fmt: skip
                n_final = int(np.count_nonzero(w.final))
                self.metrics.windows.labels(name).inc(n_final)
                self.metrics.corrections.labels(name).inc(len(w.final) - n_final)
                if n_final:
                    # one latency observation per closed window end: its latest close
                    last = pd.Series(w.closed_at_ms[w.final]).groupby(end_ns[w.final], sort=False).max()
                    for end, at_ms in zip(last.index.tolist(), last.tolist(), strict=True):
                        self.metrics.latency.observe(max(0.0, at_ms / 1e3 - int(end) / 1e9))
            self._fold_status([json.loads(t) for t in texts], batch_id, written)
            return written

    def handle_rows(self, rows: pd.DataFrame | pa.Table, batch_id: int) -> dict[str, int]:
        """Write one batch of generic rows and fold its status rows into ``_status.json`` + metrics."""
        with self._lock:
            tbl = generic_table(rows)
            is_status = pc.equal(tbl["kind"], "status")
            statuses = [json.loads(s) for s in pc.filter(tbl["status"], is_status).to_pylist()]
            written = self.store.write_batch(batch_id, tbl)
            # per query: finals, corrections, and one latency observation per closed window end
            data = tbl.select(["query", "kind", "window_end_ns", "closed_at_ms"]).filter(pc.invert(is_status))
            if data.num_rows:
                counts = data.group_by(["query", "kind"]).aggregate([([], "count_all")]).to_pydict()
                per_query: dict[str, dict[str, int]] = {}
                for qn, kind, n in zip(counts["query"], counts["kind"], counts["count_all"], strict=True):
                    per_query.setdefault(qn, {})[kind] = n
                for qn in sorted(per_query):
                    self.metrics.windows.labels(qn).inc(per_query[qn].get("final", 0))
                    self.metrics.corrections.labels(qn).inc(per_query[qn].get("correction", 0))
                fin = data.filter(pc.equal(data["kind"], "final"))
                lat = fin.group_by(["query", "window_end_ns"]).aggregate([("closed_at_ms", "max")]).to_pydict()
                for end_ns, at_ms in zip(lat["window_end_ns"], lat["closed_at_ms_max"], strict=True):
                    self.metrics.latency.observe(max(0.0, at_ms / 1e3 - int(end_ns) / 1e9))
            self._fold_status(statuses, batch_id, written)
            return written

    def _fold_status(self, statuses: list[dict[str, Any]], batch_id: int, written: dict[str, int]) -> None:
        """The batch's per-partition status rows -> partitions, metrics and ``_status.json``."""
        for st in statuses:
            self.partitions.setdefault(st["query"], {})[int(st["partition"])] = st
        self.metrics.on_batch_status(statuses)
        now_ms = max([st["now_ms"] for st in statuses], default=int(time.time() * 1000))
        summary = summarize(self.partitions)
        self.metrics.on_status(summary, now_ms)
        self.last_batch = {"batch_id": batch_id, "written": written, "now_ms": now_ms}
        self.write_status(summary, now_ms)

    def write_status(self, summary: dict[str, Any], now_ms: int) -> None:
        o = self.opts
        self.store.write_status({
            "mode": o.mode, "updated_ms": now_ms, "batch_id": self.last_batch.get("batch_id"),
            "settings": {"trigger_ms": o.trigger_ms, "host_timeout_ms": o.host_timeout_ms,
                         "expected_hosts": list(o.expected_hosts), "late_policy": o.late_policy,
                         "watermark_delay_ms": o.watermark_delay_ms},
            "queries": summary, "progress": self.progress(),
        })  # fmt: skip

    # -- running ----------------------------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        """State-store numbers of the last progress of each stream (what the skew benchmark reads)."""
        out: dict[str, Any] = {}
        for s in self.streams:
            try:
                p = s.lastProgress
            except Exception:  # noqa: BLE001 - a stopped query has no progress
                p = None
            if not p:
                continue
            ops = p.get("stateOperators") or []
            out[s.name or str(s.id)] = {
                "batchId": p.get("batchId"),
                "numInputRows": p.get("numInputRows"),
                "durationMs": p.get("durationMs", {}).get("triggerExecution"),
                "stateRows": sum(int(o.get("numRowsTotal", 0)) for o in ops),
                "stateMemoryBytes": sum(int(o.get("memoryUsedBytes", 0)) for o in ops),
                "droppedByWatermark": sum(int(o.get("numRowsDroppedByWatermark", 0)) for o in ops),
            }
        return out

    def refresh_metrics(self) -> None:
        """Copy Spark's state-store numbers into the gauges (per stream name)."""
        for name, p in self.progress().items():
            self.metrics.state_bytes.labels(name).set(p["stateMemoryBytes"])
            self.metrics.dropped.labels(name).set(p["droppedByWatermark"])

    def process_all_available(self) -> None:
        for s in self.streams:
            s.processAllAvailable()

    def stop(self) -> None:
        for s in self.streams:
            try:
                s.stop()
            except Exception as exc:  # noqa: BLE001 - stopping must not hide the other streams
                log.warning("stopping %s: %s", s.name, exc)

    def await_termination(self, poll_s: float = 1.0, stop_event: threading.Event | None = None) -> None:
        """Block until a stream fails or ``stop_event`` is set, refreshing metrics meanwhile."""
        while True:
            for s in self.streams:
                if not s.isActive:
                    exc = s.exception()
                    if exc is not None:
                        raise RuntimeError(f"stream {s.name} failed: {exc}")
                    return
            self.refresh_metrics()
            if stop_event is not None and stop_event.wait(poll_s):
                return
            if stop_event is None:
                time.sleep(poll_s)


# -- CLI ------------------------------------------------------------------------------------------
def _ms(text: str) -> int:
    return Q.parse_duration_ns(text) // 1_000_000


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lowwater-job", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml", help="queries YAML")
    p.add_argument("--query", action="append", default=None, help="run only these queries (repeatable)")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    p.add_argument("--results", required=True, help="result store directory (Parquet + _status.json)")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--mode", choices=MODES, default="oop", help="oop: punctuation (default); watermark: baseline")
    p.add_argument("--watermark-delay", default="10s", help="watermark mode: max event time minus this")
    p.add_argument("--trigger", default="1s", help="micro-batch interval")
    p.add_argument("--host-timeout", default="10s", help="a host silent this long stops holding windows open")
    p.add_argument("--expected-hosts", default="", help="comma list: nothing closes before each has punctuated")
    p.add_argument("--late-policy", choices=LATE_POLICIES, default="drop")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--shuffle-partitions", type=int, default=None,
                   help="state partitions (default: the cores of --master); fixed once a checkpoint exists")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a kafka.* option for Spark's Kafka source, e.g. kafka.security.protocol=SASL_SSL "
                        "(repeatable; see deploy/SECURITY.md)")
    return p.parse_args(argv)


def _kafka_options(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("kafka."):
            raise ValueError(f"--kafka-option {item!r}: expected kafka.<setting>=<value>")
        out[key] = value
    return out


def options_from_args(a: argparse.Namespace) -> JobOptions:
    return JobOptions(
        bootstrap=a.bootstrap, results=a.results, checkpoint=a.checkpoint, mode=a.mode,
        trigger_ms=_ms(a.trigger), host_timeout_ms=_ms(a.host_timeout),
        expected_hosts=tuple(h.strip() for h in a.expected_hosts.split(",") if h.strip()),
        late_policy=a.late_policy, watermark_delay_ms=_ms(a.watermark_delay),
        max_offsets_per_trigger=a.max_offsets_per_trigger,
        shuffle_partitions=a.shuffle_partitions or _cores(a.master),
        kafka_options=_kafka_options(a.kafka_option),
    )  # fmt: skip


def _cores(master: str) -> int | None:
    m = re.fullmatch(r"local\[(\d+)\]", master.strip())
    return int(m.group(1)) if m else None


def main(argv: Sequence[str] | None = None) -> int:
    """``lowwater-job``: run until SIGINT/SIGTERM or a stream failure."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    a = parse_args(argv)
    try:
        cfg = Q.load(a.config)
        opts = options_from_args(a)
        queries = [cfg.query(n) for n in a.query] if a.query else cfg.queries
    except (Q.ConfigError, KeyError, ValueError) as exc:
        print(f"lowwater-job: {exc}", file=sys.stderr)
        return 2
    from local_stack.spark_session import build_spark

    spark = build_spark("lowwater-job", master=a.master)
    job = HighLevelJob(spark, queries, opts)
    if a.metrics_port:
        job.metrics.serve(a.metrics_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    job.start()
    log.info("started %s mode for %s; results in %s", opts.mode, [q.name for q in queries], opts.results)
    try:
        job.await_termination(stop_event=stop)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    finally:
        job.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
