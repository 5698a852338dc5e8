"""The store written by the Spark tasks (high_level/results/tasks.py) and committed by the driver: the
same rows, HAVING, alerts, export and metrics as the driver writing everything itself; a task's files
stay invisible until the commit; a replayed batch rewrites the same names. No Spark: each task is
:func:`high_level.results.tasks.write_task` on that task's share of the stateful step's real output."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from contract import results as R
from contract import wire
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from high_level.job import HighLevelJob, JobOptions
from high_level.results.tasks import write_task
from lowwater_testing.oracle import host_messages, interleave, split_hosts
from lowwater_testing.queries import config, query
from lowwater_testing.spark import read_results
from lowwater_testing.topics import KeyedRecorder
from lowwater_testing.traffic import make_traffic

T0 = 1_700_000_000_000_000_000
NS = 10**9
CONFIG = config(
    query(  # HAVING, an alert rule and the Prometheus export, each evaluated in the tasks
        "ports",
        kafka={"partitions": 2},
        export={"top": 3, "by": "syns"},
        alerts=[{"name": "syn_flood", "when": "syns >= 40", "severity": "critical"}],
        having="syns >= 30 and avg_len > 0",
        group_by=["dst_port"],
        aggregates=["count as syns", "avg(length) as avg_len"],
    ),
    query(
        "slide",
        group_by=["dst_ip/24"],
        aggregates=["max(length) as max_len", "count as packets"],
        window={"range": "10s", "slide": "4s"},
        kafka={"partitions": 2},
    ),
    query(  # holistic: its second stage runs in the task holding the group
        "spread",
        window={"range": "10s", "slide": "5s"},
        kafka={"partitions": 2},
        aggregates=["count_distinct(src_ip) as sources", "count as packets"],
        group_by=["dst_port"],
    ),
)


def _batches(live: bool = False) -> tuple[list, list[pa.Table]]:
    """The stateful step's packed output of 6 micro-batches (both Kafka partitions), from 2 hosts
    (with ``live``, the provisional rows of the open windows each batch changed too)."""
    cfg = CONFIG.load()
    qs = list(cfg.queries)
    lays = [Layout.of(q) for q in qs]
    t = make_traffic(12000, 40, T0, 60 * NS, seed=7)
    rows = t.rows()
    hix = split_hosts(len(t), 2, seed=3)
    msgs = interleave(
        [
            host_messages(
                q, rows[hix == i], h, partitions=2, punct_every_ns=NS, seed=i, end_mark=wire.END_OF_STREAM
            )
            for q in qs
            for i, h in enumerate(("a", "b"))
        ],
        seed=2,
    )
    settings = Settings(host_timeout_ms=10**9, expected_hosts=("a", "b"), live=live)
    procs = [PartitionProcessor(lays, p, settings) for p in range(2)]
    out = []
    for b, chunk in enumerate(np.array_split(np.arange(len(msgs)), 6)):
        frames = [
            procs[p].process_packed([msgs[i].value for i in chunk if msgs[i].partition == p], 1000 + b)
            for p in range(2)
        ]
        out.append(pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False))
    return qs, out


@pytest.fixture(scope="module")
def batches():
    return _batches()


@pytest.fixture(scope="module")
def live_batches():
    return _batches(live=True)


def _job(root, qs) -> HighLevelJob:
    return HighLevelJob(None, qs, JobOptions(bootstrap="x", results=str(root), checkpoint=str(root) + "-ck"))


def _tasks(job: HighLevelJob, qs, b: int, packed: pa.Table) -> pa.Table:
    """What the tasks hand the driver: task = Kafka partition here (any fixed placement will do)."""
    local = frozenset(job.store.queries) - job.sink.driver_queries()
    outs = [
        write_task(
            str(job.store.root), qs, b, task, packed.filter(pc.equal(packed["partition"], task)), local
        )
        for task in (0, 1)
    ]
    return pa.concat_tables(outs)


def _rows(root, name: str) -> pd.DataFrame:
    got = read_results(root, name)
    if not len(got):
        return got
    cols = [c for c in got.columns if c not in ("date", "query")]
    return got[cols].sort_values(cols[:-1]).reset_index(drop=True)


def _counters(job: HighLevelJob) -> dict:
    keep = (
        "lowwater_job_windows",
        "lowwater_job_having_dropped",
        "lowwater_job_alerts_fired",
        "lowwater_job_result",
    )
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in job.metrics.registry.collect()
        for s in m.samples
        if s.name.startswith(keep) and not s.name.endswith("_created")
    }


def test_tasks_write_what_the_driver_writes_hidden_until_the_commit(batches, tmp_path):
    qs, packed = batches
    a, b = _job(tmp_path / "a", qs), _job(tmp_path / "b", qs)
    for i, p in enumerate(packed):
        a.handle_packed(p, i)
        out = _tasks(b, qs, i, p)
        names = {f for q in qs for _d, d in R.date_dirs(b.store.root, q.name) for f in d.iterdir()}
        new = {f for f in names if R.parse_part_name(f.name) == i}
        assert all(R.is_task_part(f.name) for f in new)
        if new:  # written by the tasks, not visible before the driver commits
            assert not R.manifest_path(b.store.root, i).exists()
            before = {q.name: len(_rows(b.store.root, q.name)) for q in qs}
            b.handle_packed(out, i)
            doc = json.loads(R.manifest_path(b.store.root, i).read_text())
            assert {str(b.store.root / f) for f in doc["files"]} == {str(f) for f in new}
            assert sum(len(_rows(b.store.root, q.name)) - before[q.name] for q in qs) == sum(
                doc["rows"].values()
            )
        else:
            b.handle_packed(out, i)
    for q in qs:
        ra, rb = _rows(a.store.root, q.name), _rows(b.store.root, q.name)
        assert len(ra) > 0
        pd.testing.assert_frame_equal(ra, rb)
    assert set(_rows(b.store.root, "spread")["kind"]) == {"final"}
    alerts = [pd.read_parquet(f) for f in R.alert_files(b.store.root)]
    assert alerts and sum(len(x) for x in alerts) == sum(
        len(pd.read_parquet(f)) for f in R.alert_files(a.store.root)
    )
    assert _counters(a) == _counters(b) and any("having_dropped" in k[0] for k in _counters(b))
    # a replay of the last batch (Spark after a kill before its commit): the same names, no row twice
    last = len(packed) - 1
    files = sorted(b.store.root.rglob("part-*.parquet"))
    b.handle_packed(_tasks(b, qs, last, packed[last]), last)
    assert sorted(b.store.root.rglob("part-*.parquet")) == files
    for q in qs:
        pd.testing.assert_frame_equal(_rows(a.store.root, q.name), _rows(b.store.root, q.name))


def test_tasks_publish_live_values_and_tombstones_and_the_driver_gets_no_row(live_batches, tmp_path):
    """--live: each task publishes its provisional rows, the finals it wrote and the tombstones of its
    old closed windows (their keys kept in files beside the store); the driver only folds the counts.
    A replayed batch republishes the same messages, which the API's reader ignores (same version)."""
    from contract import live as L
    from high_level.live.hub import LiveHub
    from high_level.live.publish import KEEP_CLOSED, LivePublisher

    qs, packed = live_batches
    job = _job(tmp_path / "r", qs)
    job.sink.live = LivePublisher(qs, producer=KeyedRecorder())  # the driver's: must send nothing
    local = frozenset(job.store.queries) - job.sink.driver_queries()
    assert local == {q.name for q in qs}
    prods = {task: KeyedRecorder() for task in (0, 1)}

    def tasks(i: int) -> pa.Table:
        return pa.concat_tables(
            [
                write_task(
                    str(job.store.root),
                    qs,
                    i,
                    task,
                    packed[i].filter(pc.equal(packed[i]["partition"], task)),
                    local,
                    producer=prods[task],
                )
                for task in (0, 1)
            ]
        )

    for i in range(len(packed)):
        out = tasks(i)
        kinds = set(out["kind"].to_pylist())
        assert L.PROVISIONAL_KIND not in kinds and not kinds & set(R.ROW_KINDS)  # no row to the driver
        job.handle_packed(out, i)
    assert job.sink.live.producer.sent == []
    sent = [m for p in prods.values() for m in p.sent]
    hub = LiveHub(qs)
    for q in qs:
        msgs = [(k, v) for t, k, v in sent if t == L.live_topic(q.name)]
        finals = [L.decode(k, v) for k, v in msgs if v is not None and L.decode(k, v).final]
        stored = _rows(job.store.root, q.name)
        stored = stored[stored["kind"] == "final"]
        assert len(finals) == len(stored) > 0  # one final per stored (window, group)
        assert any(v is not None and not L.decode(k, v).final for k, v in msgs)  # provisional values
        assert job.sink.live.published[q.name]["final"] == len(finals)
        assert job.sink.live.tombstoned[q.name] == sum(v is None for _, v in msgs)
    tombstoned = 0
    for p in prods.values():  # per task: no message after its key's final but a tombstone, none after that
        last: dict[tuple[str, bytes], str] = {}
        for t, k, v in p.sent:
            assert last.get((t, k)) != "gone", "a message after the key's tombstone"
            if v is None:
                assert last.get((t, k)) == "final", "a tombstone before the key's final"
                last[(t, k)] = "gone"
                continue
            u = L.decode(k, v)
            assert last.get((t, k)) != "final", "a message after the key's final"
            last[(t, k)] = "final" if u.final else "provisional"
            hub.ingest(u)
        for q in qs:  # each task keeps the finals of its newest KEEP_CLOSED closed windows on the topic
            mine = {(k, st) for (t, k), st in last.items() if t == L.live_topic(q.name)}
            closed = sorted({L.window_of_key(k) for k, st in mine if st in ("final", "gone")})
            assert {L.window_of_key(k) for k, st in mine if st == "final"} == set(closed[-KEEP_CLOSED:])
            tombstoned += sum(st == "gone" for _, st in mine)
    assert tombstoned > 0
    # a replay of the last batch (a kill before the commit): the same messages, which the reader ignores
    mark = {t: len(p.sent) for t, p in prods.items()}
    job.handle_packed(tasks(len(packed) - 1), len(packed) - 1)
    again = [m for t, p in prods.items() for m in p.sent[mark[t] :] if m[2] is not None]
    assert again and all(m in sent for m in again)
    assert not any(hub.ingest(L.decode(k, v)) for _, k, v in again)


def test_a_task_whose_kafka_is_down_still_writes_its_rows_and_counts_the_live_error(
    live_batches, tmp_path, monkeypatch
):
    """Live values are best effort: a producer that cannot be built (no broker) fails no task."""
    from kafka.errors import KafkaTimeoutError

    from high_level.kafkaclients import KafkaClients
    from high_level.live import publish

    def no_broker(kafka):
        raise KafkaTimeoutError(f"Unable to bootstrap from {kafka.bootstrap}")

    monkeypatch.setattr(publish, "task_producer", no_broker)
    qs, packed = live_batches
    i = next(i for i, p in enumerate(packed) if set(R.ROW_KINDS) & set(p["kind"].to_pylist()))
    local = frozenset(q.name for q in qs)
    out = write_task(str(tmp_path), qs, i, 0, packed[i], local, KafkaClients("127.0.0.1:1"))
    doc = json.loads(out.filter(pc.equal(out["kind"], "written"))["status"][0].as_py())
    assert doc["live"]["errors"] == 1 and sum(doc["written"].values()) > 0
    assert list(tmp_path.rglob("part-*.parquet"))


def test_a_driver_that_cannot_see_the_tasks_files_stops_instead_of_committing(batches, tmp_path):
    """Executors whose results directory is not the driver's (a worker without the shared volume): the
    driver must not commit a batch whose files it cannot see."""
    qs, packed = batches
    executor, driver = _job(tmp_path / "executor", qs), _job(tmp_path / "driver", qs)
    i = next(i for i, p in enumerate(packed) if p.num_rows)
    out = _tasks(executor, qs, i, packed[i])
    assert list((tmp_path / "executor").rglob("part-*.parquet"))
    with pytest.raises(RuntimeError, match="shared by the driver, the API and every Spark worker"):
        driver.handle_packed(out, i)
    assert not R.manifest_path(driver.store.root, i).exists()


def test_a_task_writes_nothing_of_the_queries_the_driver_writes(batches, tmp_path):
    qs, packed = batches
    out = write_task(str(tmp_path), qs, 0, 0, packed[1], frozenset())
    assert out.num_rows == packed[1].num_rows and not list(tmp_path.rglob("*.parquet"))


def test_visible_files_hide_task_files_of_uncommitted_batches():
    named = {
        n: r
        for n in [
            "compact-000000000000-000000000005.parquet",
            "part-000000000004-00001.parquet",
            "part-000000000006-00000.parquet",
            "part-000000000006-00001.parquet",
            "part-000000000007.parquet",
            "part-000000000008-00000.parquet",
        ]
        if (r := R.batch_range(n)) is not None
    }
    assert len(named) == 6
    assert R.visible_files(named, 6) == [
        "compact-000000000000-000000000005.parquet",
        "part-000000000006-00000.parquet",
        "part-000000000006-00001.parquet",
        "part-000000000007.parquet",
    ]
    assert R.visible_files(named) == [
        "compact-000000000000-000000000005.parquet",
        "part-000000000007.parquet",
    ]
    assert R.visible_files(named, 8)[-1] == "part-000000000008-00000.parquet"
