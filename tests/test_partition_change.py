"""Changing a query's Kafka partition count: refused while it would split a group, safe at a clean cut.

Against the real broker: the agents' and the job's topic check (either direction), the job's start
guard over its checkpoint record and its own last status, and the whole procedure of
deploy/README.md on the real Spark job: windows closed on 2 partitions, topic grown to 3, the job
restarted on the same checkpoint with the new count, new traffic placed by ``hash mod 3``: every
window of both phases equals the oracle, none twice.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from contract import query as Q
from contract import results as R
from contract import status as S
from contract.topics import PartitionChangeRefused, connect, ensure_topics, existing_partitions
from high_level.cluster import partitioncount
from low_level.host.emit import Emitter
from lowwater_testing.oracle import host_messages, interleave, split_hosts
from lowwater_testing.spark import BASE, expected_typed, normalised, read_results, run_job
from lowwater_testing.topics import produce
from lowwater_testing.traffic import T0, make_traffic

pytestmark = pytest.mark.kafka


def query_on(topic: str, partitions: int) -> Q.QuerySpec:
    return BASE.query("tumble").model_copy(
        update={"name": "regrow", "kafka": Q.KafkaSpec(topic=topic, partitions=partitions)}
    )


def test_agents_and_job_refuse_a_topic_whose_count_is_not_the_configs(kafka, topic_factory) -> None:
    topic = topic_factory(partitions=3)
    admin = connect(kafka.bootstrap_servers, {}, 30)
    try:
        # kafka-init (create_topics.py) leaves a larger topic alone and says so ...
        assert ensure_topics(admin, {topic: 2}) == {topic: "exists with 3 partitions (config: 2)"}
        # ... the agents and the job do not: hosts on two counts would split a group
        with pytest.raises(
            PartitionChangeRefused, match=f"topic {topic} has 3 partitions, the config asks for 2"
        ):
            ensure_topics(admin, {topic: 2}, exact=True)
        with pytest.raises(PartitionChangeRefused, match="Changing a query's partition count"):
            partitioncount.check_topics(admin, [query_on(topic, 2)])
        with pytest.raises(
            PartitionChangeRefused, match=f"topic {topic} has 3 partitions, the config asks for 4"
        ):
            partitioncount.check_topics(admin, [query_on(topic, 4)])
        partitioncount.check_topics(admin, [query_on(topic, 3)])  # equal: fine
        assert existing_partitions(admin, [topic]) == {topic: 3}  # nothing was changed
    finally:
        admin.close()
    # the agent's emitter, as it connects: refused, logged, no producer (capture goes on into the backlog)
    em = Emitter([query_on(topic, 2)], "h-stale", None)
    em.bootstrap = kafka.bootstrap_servers
    with pytest.raises(PartitionChangeRefused, match="has 3 partitions"):
        em._ensure_topics()


def status_doc(query: str, open_windows: int) -> S.StatusDocument:
    part = S.PartitionStatus(
        query=query,
        partition=0,
        now_ms=1,
        low_water_mark_pane=None,
        low_water_mark_ns=None,
        closed_before_window=None,
        blocked_by=[],
        live_hosts=0,
        open_windows=open_windows,
        state_rows=0,
        windows_closed=0,
        records=0,
        hosts={},
    )
    return S.StatusDocument(
        mode="oop",
        updated_ms=1,
        batch_id=1,
        settings=S.JobSettings.model_validate(
            {
                "trigger_ms": 1000,
                "host_timeout_ms": 10_000,
                "expected_hosts": [],
                "late_policy": "drop",
                "watermark_delay_ms": 0,
            }
        ),
        queries={query: S.summarize_query({0: part})},
        hosts=[],
    )


def test_job_start_guard_needs_closed_windows_for_a_changed_count(tmp_path: Path) -> None:
    ckpt, results = tmp_path / "ckpt", tmp_path / "results"
    results.mkdir()
    q2, q4 = query_on("t", 2), query_on("t", 4)
    assert partitioncount.check_change(ckpt, results, [q4]) == []  # a new checkpoint: nothing to compare
    partitioncount.record(ckpt, [q2])
    assert partitioncount.recorded(ckpt) == {"regrow": {"topic": "t", "partitions": 2}}
    assert partitioncount.check_change(ckpt, results, [q2]) == []
    with pytest.raises(PartitionChangeRefused, match="cannot show that every window had closed"):
        partitioncount.check_change(ckpt, results, [q4])  # no status at all
    R.status_path(results).write_text(status_doc("regrow", 3).model_dump_json())
    with pytest.raises(
        PartitionChangeRefused, match="ran with 2 partitions of t, the config now has 4, and 3 windows"
    ):
        partitioncount.check_change(ckpt, results, [q4])
    R.status_path(results).write_text(status_doc("regrow", 0).model_dump_json())
    (line,) = partitioncount.check_change(ckpt, results, [q4])
    assert "2 -> 4 partitions of t at a clean cut" in line
    # a checkpoint on HDFS/S3 is not written to as a local path (the check is skipped, and logged)
    partitioncount.record("s3a://bucket/ckpt", [q2])
    assert partitioncount.recorded("s3a://bucket/ckpt") == {} and not Path("s3a:").exists()
    assert partitioncount.recorded(f"file://{ckpt}") == {"regrow": {"topic": "t", "partitions": 2}}


def phase(q: Q.QuerySpec, t, hosts: tuple[str, ...], seed: int) -> list[tuple[str, int, bytes]]:
    """The hosts' messages for ``q`` (placed by its partition count), each ending with end-of-stream."""
    from contract import wire

    rows = t.rows()
    hix = split_hosts(len(t), len(hosts), seed=seed)
    streams = [
        host_messages(
            q, rows[hix == i], h, partitions=q.kafka.partitions, end_mark=wire.END_OF_STREAM, seed=seed + i
        )
        for i, h in enumerate(hosts)
    ]
    return [(q.topic, m.partition, m.value) for m in interleave(streams, seed=seed)]


@pytest.mark.spark
def test_growing_partitions_at_a_clean_cut_keeps_every_window_exact(
    spark, kafka, topic_factory, tmp_path
) -> None:
    topic = topic_factory(partitions=2)
    q2, q3 = query_on(topic, 2), query_on(topic, 3)
    t1 = make_traffic(3000, 80, T0, 40 * 10**9, seed=21)
    t2 = make_traffic(3000, 80, T0 + 120 * 10**9, 40 * 10**9, seed=22)
    kw = dict(bootstrap=kafka.bootstrap_servers, host_timeout_ms=600_000)  # one checkpoint and store for both

    produce(kafka, phase(q2, t1, ("a0", "a1"), seed=5))
    job = run_job(spark, [q2], tmp_path, "grow", **kw)
    ckpt, results = Path(job.opts.checkpoint), Path(job.opts.results)
    partitioncount.record(ckpt, [q2])  # what lowwater-job does once the job has started
    assert S.read(R.status_path(results)).queries["regrow"].open_windows == 0  # the clean cut

    admin = connect(kafka.bootstrap_servers, {}, 30)
    try:
        with pytest.raises(PartitionChangeRefused, match="--grow"):
            ensure_topics(admin, {topic: 3}, exact=True)  # the agents never grow it themselves
        assert ensure_topics(admin, {topic: 3}, grow=True) == {topic: "grown from 2 to 3 partitions"}
    finally:
        admin.close()
    (line,) = partitioncount.check_change(ckpt, results, [q3])  # the job's start guard lets it through
    assert "2 -> 3 partitions" in line

    produce(kafka, phase(q3, t2, ("b0", "b1"), seed=6))
    run_job(spark, [q3], tmp_path, "grow", **kw)
    got = read_results(results, "regrow")
    fin = got[got["kind"] == "final"]
    keys = ["window_end", *[p.name for p in q3.key_parts]]
    assert not fin.duplicated(keys).any(), "a (window, group) was reported twice"
    want = pd.concat([normalised(expected_typed(q2, t1), q2), normalised(expected_typed(q3, t2), q3)])
    want = want.sort_values(keys).reset_index(drop=True)
    g = normalised(fin, q3)
    assert len(g) == len(want), f"{len(g)} rows, oracle {len(want)}"
    pd.testing.assert_frame_equal(g, want, check_dtype=False, rtol=1e-12)
    # the second phase really used the new partition
    from lowwater_testing.topics import read_topic

    assert len(read_topic(kafka.bootstrap_servers, topic, 3)[2]) > 0
