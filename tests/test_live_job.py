"""Integration: the real Spark job with live results on (--live) publishes provisional values of the open
window to the compacted lowwater.live.<query> topic on real Kafka, then the final, equal to the store's."""

from __future__ import annotations

import time

from contract import live as L
from lowwater_testing.hosts import HOSTS
from lowwater_testing.spark import PORTS, Host, start_gate_job, windows_of
from lowwater_testing.topics import produce


def _read_live(kafka, query: str, want: int, timeout_s: float = 30.0) -> list[L.LiveUpdate]:
    """Every message of the query's live topic, decoded and validated by the contract."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(L.live_topic(query), 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        out: list[L.LiveUpdate] = []
        end = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < end:
            for recs in c.poll(timeout_ms=500).values():
                out += [L.decode(r.key, r.value) for r in recs]
        return out
    finally:
        c.close()


def test_job_publishes_provisional_then_final_values_to_the_compacted_live_topic(
    spark, kafka, topic_factory, tmp_path
):
    q, job, p0 = start_gate_job(spark, kafka, topic_factory, tmp_path, "livegate", HOSTS, live=True)
    h = {n: Host(n, q) for n in HOSTS}
    try:
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource

        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        cfg = str(admin.describe_configs([ConfigResource("TOPIC", L.live_topic(q.name))]))
        admin.close()
        assert "cleanup.policy" in cfg and "compact" in cfg  # created by the job, compacted
        # two of three hosts: the window is open, its values provisional (2 of 3 hosts past it)
        produce(
            kafka,
            h["h0"].pane(p0, PORTS, 1, 100) + h["h1"].pane(p0, PORTS, 2, 100),
        )
        job.process_all_available()
        assert windows_of(job, q) == {}
        prov = _read_live(kafka, q.name, len(PORTS))
        assert len(prov) >= len(PORTS) and not any(u.final or u.complete for u in prov)
        newest = {u.group["dst_port"]: u for u in prov}
        assert {p: u.values["n"] for p, u in newest.items()} == dict.fromkeys(PORTS, 3)
        assert {(u.hosts_in_mark, u.hosts_expected) for u in newest.values()} == {(2, 3)}
        # the third host: the window closes; the final follows its provisional values, equal to the store
        produce(kafka, h["h2"].pane(p0, PORTS, 4, 100))
        job.process_all_available()
        stored = windows_of(job, q)[p0]
        msgs = _read_live(kafka, q.name, 3 * len(PORTS))
        last = {}
        for u in msgs:
            assert not last.get(u.key, u).final or u.final, "a provisional value after the final"
            last[u.key] = u
        fin = {u.group["dst_port"]: u for u in last.values()}
        assert all(u.final and u.complete for u in fin.values())
        assert {p: u.values["n"] for p, u in fin.items()} == dict(
            zip(stored["dst_port"], stored["n"], strict=True)
        )
        assert {p: u.values["n"] for p, u in fin.items()} == dict.fromkeys(PORTS, 7)
        assert (
            job.live is not None
            and job.live.errors == 0
            and job.live.published[q.name]["final"] == len(PORTS)
        )
    finally:
        job.stop()
