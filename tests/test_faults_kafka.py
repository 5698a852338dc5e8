"""Kafka faults with the real broker: a SIGKILL mid-stream and an outage while the agent keeps
capturing. The agent must lose nothing, keep its backlog bounded by merging in place, deliver after
recovery, and the rolled-up result must still equal the offline oracle exactly (no loss, no
duplicates)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from contract import query as Q
from contract import wire
from lowwater_testing.capture import drain, feed, kafka_agent, pairs_query
from lowwater_testing.traffic import make_traffic, merge_partials, oracle

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def consume(bootstrap: str, q: Q.QuerySpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, set[int]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    tps = [TopicPartition(q.topic, p) for p in range(q.kafka.partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    panes, keys, states, closed = [], [], [], set()
    for m in consumer:
        b = wire.decode(m.value)
        if isinstance(b, wire.Partials):
            panes.append(b.pane)
            keys.append(b.key)
            states.append(b.state)
        elif b.mark_pane == wire.END_OF_STREAM:
            closed.add(m.partition)
    consumer.close()
    return np.concatenate(panes), np.concatenate(keys), np.concatenate(states), closed


@pytest.mark.timeout(300)
def test_broker_sigkill_and_restart_mid_stream_loses_nothing(kafka, topic_factory) -> None:
    q = pairs_query(topic_factory(partitions=2))
    traffic = make_traffic(60_000, 2000, T0, 30 * NS, seed=21)
    agent = kafka_agent(q, "h-kill", kafka.bootstrap_servers)
    feed(agent, traffic, 0, 20_000)
    assert agent.emitter.flush(30)
    feed(agent, traffic, 20_000, 30_000)  # some of this is in flight when the broker dies
    kafka.kill()
    feed(agent, traffic, 30_000, 45_000)
    kafka.restart()
    feed(agent, traffic, 45_000, 60_000)
    drain(agent, 60)
    pane, key, state, closed = consume(kafka.bootstrap_servers, q)
    assert closed == {0, 1}
    assert agent.emitter.stats.delivery_failures == 0
    assert merge_partials(q, pane, key, state).equals(oracle(q, traffic))


@pytest.mark.timeout(300)
def test_outage_keeps_capturing_with_bounded_backlog_then_delivers(kafka, topic_factory) -> None:
    q = pairs_query(topic_factory(partitions=2))
    groups = 500
    traffic = make_traffic(80_000, groups, T0, 8 * NS, seed=22)  # 8 panes x 500 groups
    # a tiny merge threshold forces in-place merging during the outage
    agent = kafka_agent(q, "h-down", kafka.bootstrap_servers, merge_at=3000, max_records=50_000)
    feed(agent, traffic, 0, 10_000)
    assert agent.emitter.flush(30)
    kafka.stop()
    down_at = time.monotonic()
    try:
        peak = 0
        for s in range(10_000, 70_000, 5000):
            feed(agent, traffic, s, s + 5000)
            peak = max(peak, agent.emitter.backlog.records)
        processed = int(agent.kernel.hc[0])
        assert processed == 70_000, "capture must go on while Kafka is down"
        # bounded: in-place merging keeps at most one record per distinct (pane, key) per partition
        assert agent.emitter.backlog.merges > 0
        assert peak <= max(3000, 8 * groups) + 5000
        while time.monotonic() - down_at < 30:  # an outage of 30 s, heartbeats keep queueing
            agent.step()
            time.sleep(0.05)
        assert agent.emitter.backlog.records <= 8 * groups + 5000
    finally:
        kafka.start()
    feed(agent, traffic, 70_000, 80_000)
    drain(agent)
    assert agent.emitter.backlog.lost == 0
    pane, key, state, closed = consume(kafka.bootstrap_servers, q)
    assert closed == {0, 1}
    assert merge_partials(q, pane, key, state).equals(oracle(q, traffic))
