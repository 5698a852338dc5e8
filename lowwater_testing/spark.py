"""The real high-level job in the tests: start it, read its Parquet store back, compare with the oracle.

``QUERIES``/``BASE`` are the roll-up queries the Spark tests share; :class:`Host` is a hand-driven capture host
for the tests that control every partial and punctuation."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from contract import query as Q
from contract import results as R
from contract import wire
from high_level.job import HighLevelJob, JobOptions
from lowwater_testing.oracle import window_oracle
from lowwater_testing.queries import config, query, tcp_ports
from lowwater_testing.traffic import oracle

QUERIES = config(
    query(
        "tumble",
        group_by=["src_ip", "dst_ip"],
        aggregates=[
            "count as packets",
            "sum(length) as bytes",
            "avg(length) as avg_len",
            "max(ttl) as max_ttl",
        ],
    ),
    tcp_ports("slide", "pkts"),
    query("gate", group_by=["dst_port"], aggregates=["count as n", "sum(length) as bytes"]),
    query(
        "mixed",
        group_by=["dst_ip/24/48", "dscp"],
        aggregates=[
            "count as packets",
            "min(tos) as min_tos",
            "max(tos) as max_tos",
            "avg(dscp) as avg_dscp",
        ],
    ),
).text


BASE = Q.load_text(QUERIES)


def variant(topic_factory, base: str, name: str, partitions: int) -> Q.QuerySpec:
    """The base query under a new name, on a fresh topic with ``partitions`` partitions."""
    topic = topic_factory(partitions=partitions, prefix=f"hl-{name}")
    return BASE.query(base).model_copy(
        update={"name": name, "kafka": Q.KafkaSpec(topic=topic, partitions=partitions)}
    )


def read_results(results: Path, name: str) -> pd.DataFrame:
    """The rows a reader sees (:func:`contract.results.visible_files`: committed, not covered)."""
    upto = R.committed_batch(results, name)
    files = []
    for _day, d in R.date_dirs(results, name):
        named = {f.name: r for f in d.iterdir() if (r := R.batch_range(f.name)) is not None}
        files += [str(d / n) for n in R.visible_files(named, upto)]
    if not files:
        return pd.DataFrame(columns=["window_end", "kind"])
    return duckdb.read_parquet(files, hive_partitioning=True).df()


def expected_typed(q: Q.QuerySpec, t) -> pd.DataFrame:
    """The oracle in the store's typed form, converted row by row with contract.decode_key/finalize."""
    wo = window_oracle(q, oracle(q, t))
    kw = Q.key_width(q)
    scols = [c for c in wo.columns if c.startswith("s")]
    recs = []
    for r in wo.itertuples(index=False):
        end = q.window.origin_ns + (int(r.window) + 1) * q.window.pane_ns
        rec = {"window_end": pd.Timestamp(end, unit="ns", tz="UTC")}
        rec.update(Q.decode_key(q, np.array([getattr(r, f"k{i}") for i in range(kw)])))
        rec.update(Q.finalize(q, np.array([getattr(r, c) for c in scols])))
        recs.append(rec)
    return pd.DataFrame(recs)


def normalised(df: pd.DataFrame, q: Q.QuerySpec) -> pd.DataFrame:
    keys = ["window_end", *[p.name for p in q.key_parts]]
    d = df[keys + [a.name for a in q.aggregates]].copy()
    d["window_end"] = pd.to_datetime(d["window_end"], utc=True).astype("datetime64[ns, UTC]")
    for p in q.key_parts:
        d[p.name] = d[p.name].astype(str)
    return d.sort_values(keys).reset_index(drop=True)


def assert_exact(results: Path, q: Q.QuerySpec, t) -> pd.DataFrame:
    got = read_results(results, q.name)
    fin = got[got["kind"] == "final"]
    keys = ["window_end", *[p.name for p in q.key_parts]]
    assert not fin.duplicated(keys).any(), f"{q.name}: a (window, key) emitted twice"
    g, e = normalised(fin, q), normalised(expected_typed(q, t), q)
    assert len(g) == len(e), f"{q.name}: {len(g)} rows, oracle {len(e)}"
    pd.testing.assert_frame_equal(g, e, check_dtype=False, rtol=1e-12)
    return g


def job_options(bootstrap: str, root: Path, name: str, **kw: Any) -> JobOptions:
    """The job's options as the tests and benchmarks run it: results in ``root/res``, checkpoint in
    ``root/ck``, a 300 ms trigger and two shuffle partitions unless ``kw`` says otherwise."""
    base = dict(results=str(root / "res"), checkpoint=str(root / "ck"), trigger_ms=300, shuffle_partitions=2)
    return JobOptions(bootstrap=bootstrap, name=name, **(base | kw))


def start_job(spark, queries, tmp_path: Path, tag: str, **kw) -> HighLevelJob:
    opts = JobOptions(
        results=str(tmp_path / f"results-{tag}"),
        checkpoint=str(tmp_path / f"ckpt-{tag}"),
        trigger_ms=kw.pop("trigger_ms", 300),
        shuffle_partitions=2,
        name=f"t-{tag}",
        **kw,
    )
    job = HighLevelJob(spark, queries, opts)
    job.start()
    return job


def start_gate_job(
    spark, kafka, topic_factory, tmp_path: Path, name: str, hosts: Sequence[str], **kw: Any
) -> tuple[Q.QuerySpec, HighLevelJob, int]:
    """The ``gate`` query as ``name`` on a fresh one-partition topic, a started job that waits up to 10
    minutes for ``hosts``, and a first pane near 1.7e9 s (a recent time): ``(query, job, pane)``."""
    q = variant(topic_factory, "gate", name, 1)
    p0 = q.window.origin_ns // q.window.pane_ns + 1_700_000_000 // 10
    job = start_job(spark, [q], tmp_path, name, **expecting(kafka, hosts), **kw)
    return q, job, p0


def expecting(kafka, hosts: Sequence[str]) -> dict[str, Any]:
    """Job options: read from ``kafka``, expect ``hosts`` and wait for them up to 10 minutes (a start under
    load is slow; a test that needs a host timeout sets its own)."""
    return {"bootstrap": kafka.bootstrap_servers, "expected_hosts": hosts, "host_timeout_ms": 600_000}


def crash_after_batches(job: HighLevelJob, state: str, batches: int = 3, timeout_s: float = 300) -> int:
    """Stop the job's stream abruptly once it has run ``batches`` batches, leaving its last batch
    uncommitted (as a crash after its files were written, before Spark's commit), so a restart replays it.
    Returns that batch's id."""
    deadline = time.monotonic() + timeout_s
    while (job.streams[0].lastProgress or {}).get("batchId", -1) < batches:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job.streams[0].stop()  # abrupt: interrupts whatever batch is running
    ckpt = Path(job.opts.checkpoint) / ("oop" if state == "blob" else "oop-chunked")

    def ids(d: str) -> list[int]:
        return sorted(int(p.name) for p in (ckpt / d).iterdir() if p.name.isdigit())

    last = ids("offsets")[-1]
    if ids("commits")[-1] == last:
        # stopped between batches: pretend the last batch crashed after its files were written but
        # before Spark committed it (otherwise the stop already interrupted batch `last` mid-way)
        (ckpt / "commits" / str(last)).unlink()
        (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


def run_job(spark, queries, tmp_path: Path, tag: str, **kw) -> HighLevelJob:
    """:func:`start_job`, process what the topics hold, stop: the stopped job (``opts`` name its store)."""
    job = start_job(spark, queries, tmp_path, tag, **kw)
    try:
        job.process_all_available()
    finally:
        job.stop()
    return job


def status(job: HighLevelJob) -> dict:
    return json.loads((Path(job.opts.results) / "_status.json").read_text())


class Host:
    """A hand-driven capture host for one query: exact control over every partial and punctuation."""

    def __init__(self, name: str, q: Q.QuerySpec, incarnation: int = 1) -> None:
        self.name, self.q, self.inc = name, q, incarnation
        self.seq = [0] * q.kafka.partitions

    def partials(self, pane: int, ports: list[int], n: int, length: int) -> list[tuple[str, int, bytes]]:
        key = np.array(ports, np.int64).reshape(-1, 1)
        part = wire.partition_of(key, self.q.kafka.partitions)
        out = []
        for p in range(self.q.kafka.partitions):
            sel = part == p
            if sel.any():
                k = key[sel]
                state = np.column_stack([np.full(len(k), n), np.full(len(k), n * length)])
                out.append(
                    (
                        self.q.topic,
                        p,
                        wire.encode_partials(
                            self.q.name, self.name, self.inc, p, self.seq[p], np.full(len(k), pane), k, state
                        ),
                    )
                )
                self.seq[p] += len(k)
        return out

    def pane(self, pane: int, ports: list[int], n: int, length: int) -> list[tuple[str, int, bytes]]:
        """This host's partials of ``pane`` (:meth:`partials`), then its punctuation past it."""
        return self.partials(pane, ports, n, length) + self.punct(pane + 1)

    def punct(self, mark: int) -> list[tuple[str, int, bytes]]:
        w = self.q.window
        return [
            (
                self.q.topic,
                p,
                wire.encode_punctuation(
                    wire.Punctuation(
                        self.q.name,
                        self.name,
                        self.inc,
                        p,
                        self.seq[p],
                        mark,
                        w.origin_ns + mark * w.pane_ns,
                        time.time_ns(),
                        {},
                    )
                ),
            )
            for p in range(self.q.kafka.partitions)
        ]


PORTS = [22, 53, 80, 443, 8080]


def windows_of(job: HighLevelJob, q: Q.QuerySpec, kind: str = "final") -> dict[int, pd.DataFrame]:
    df = read_results(Path(job.opts.results), q.name)
    df = df[df["kind"] == kind]
    if not len(df):
        return {}
    end = pd.to_datetime(df["window_end"], utc=True).astype("datetime64[ns, UTC]").astype("int64")
    wid = (end - q.window.origin_ns) // q.window.pane_ns - 1
    return {int(w): g.sort_values("dst_port").reset_index(drop=True) for w, g in df.groupby(wid.to_numpy())}


def read_available(df: Any, checkpoint: Path, timeout_s: float = 120) -> list:
    """Every row of a streaming DataFrame, read once: ``availableNow`` into a memory sink, waited for (at
    most ``timeout_s``), then collected; the query must have finished without an exception."""
    spark = df.sparkSession
    table = f"rows_{uuid.uuid4().hex}"
    query = (
        df.writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(timeout=timeout_s)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"the availableNow query did not finish within {timeout_s:g} s"
    assert query.exception() is None
    rows = spark.table(table).collect()
    spark.catalog.dropTempView(table)
    return rows
