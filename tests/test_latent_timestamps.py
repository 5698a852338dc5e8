"""Latent timestamps in the real agent (on-demand punctuation paper section 5): a source whose records carry
no time of their own gets them stamped by the agent when it reads them, so an idle host's mark may be
"now" at once: asked for punctuation, it closes everything before the moment it was asked, with no skew
wait. Checked on the real agent (generator source, real kernel and emitter): counts exact, stamps within
the run's wall-clock span, never below a mark already sent; and through the real broker, the real
control listener and the job's asker: the latent host answers with the pane of the request's moment,
a host stamped by its source only with its clock minus the skew."""

from __future__ import annotations

import threading
import time

import pytest

from contract import query as Q
from contract import wire
from high_level.aggregate.rollup import Layout
from high_level.ondemand import PunctuationAsker
from low_level.cli import latent_option, parse_source
from low_level.host.agent import Agent
from low_level.host.ondemand import RequestListener
from lowwater_testing.capture import RecordingProducer
from lowwater_testing.queries import on_demand_query
from lowwater_testing.topics import read_all
from tests.test_ondemand_request import _status

NS = 1_000_000_000


def _query(topic: str = "t", interval: str = "1s", skew: str = "2s") -> Q.QuerySpec:
    q = on_demand_query("asked", topic, interval, table=4096)  # tests/test_ondemand_request.py's kernel
    return q.model_copy(
        update={"heartbeat": q.heartbeat.model_copy(update={"skew_ns": Q.parse_duration_ns(skew)})}
    )


def test_the_agent_stamps_records_when_it_reads_them_and_counts_exactly() -> None:
    """A generator on its synthetic clock (2023, a million packets a second) as a latent source: every
    partial falls in the panes of the run's wall-clock span, the counts add up to the packets sent, no
    packet is late, and no partial comes after a mark above its pane."""
    rec = RecordingProducer()
    n = 30_000
    agent = Agent(
        [_query()],
        {"type": "generator", "count": n, "groups": 50, "clock": "synthetic"},
        "gen",
        None,
        producer=rec,
        latent_timestamps=True,
    )
    assert agent.live_clock and agent.queries[0].heartbeat.skew_ns == 0
    t0 = time.time_ns()
    agent.run(30)
    t1 = time.time_ns()
    assert agent.finished
    total, mark = 0, -1
    for _, _, v in rec.sent:
        m = wire.decode(v)
        if isinstance(m, wire.Partials):
            assert (m.pane >= t0 // NS).all() and (m.pane <= t1 // NS).all()
            assert (m.pane >= mark).all(), "a partial below a mark already sent"
            total += int(m.state[:, 0].sum())
        elif isinstance(m, wire.Punctuation) and m.mark_pane < wire.END_OF_STREAM:
            mark = max(mark, m.mark_pane)
    assert total == n
    assert agent.summary()["queries"]["asked"] == {"matched": n, "late": 0}


def test_the_source_spec_takes_latent_timestamps() -> None:
    spec = parse_source("generator:rate=5,timestamps=latent")
    assert latent_option(spec) and "timestamps" not in spec and spec["type"] == "generator"
    assert not latent_option(parse_source("generator:rate=5"))
    assert latent_option(parse_source("afpacket:eth0,promisc,latent"))
    with pytest.raises(ValueError, match="timestamps=latent or timestamps=source"):
        latent_option(parse_source("generator:timestamps=later"))


def test_an_idle_latent_host_answers_a_request_with_the_moment_it_was_asked(kafka, topic_factory) -> None:
    """Two sparse agents (one packet in ~15 minutes, a 300-s timer, not on demand when idle): one stamped by
    its source's wall clock, one latent. The job's asker names both as blocking; its requests travel the
    real broker to the real listeners, one round at a time. The latent host's answer closes every pane
    before the one the request left in (whatever the machine's load); the other holds back its skew
    (mark_ns <= sent_wall_ns - 2 s)."""
    topic, ctl = topic_factory(1), topic_factory(1, prefix="ctl")
    q = _query(topic, "300s")
    listeners, agents = {}, {}
    for host, latent in (("latent", True), ("wall", False)):
        listeners[host] = RequestListener(host, [q], kafka.bootstrap_servers, topic=ctl).start()
        agents[host] = Agent(
            [q],
            {"type": "generator", "rate": 0.001, "groups": 4, "clock": "wall", "seed": 3},
            host,
            kafka.bootstrap_servers,
            control=listeners[host],
            latent_timestamps=latent,
        )
    assert all(lst.ready.wait(30) for lst in listeners.values())
    threads = [threading.Thread(target=a.run, args=(60,), daemon=True) for a in agents.values()]
    for t in threads:
        t.start()
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=0)
    asker = PunctuationAsker([Layout.of(q)], None, topic=ctl, min_gap_ms=0, producer=producer)
    asked: list[int] = []  # when each request left: one round at a time, each in a pane of its own
    try:
        for _ in range(3):
            time.sleep(1.05 - time.time() % 1)  # just past a pane boundary: the marks can move
            before = agents["latent"].heartbeats[0]
            asked.append(time.time_ns())
            asker.observe([_status(asked[-1] // NS - 5, asked[-1] / NS, ["latent", "wall"])])
            # the latent host answers every request; the other only when its skewed mark has moved (no
            # duplicate punctuation), which a round that slips under load may not see
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and agents["latent"].heartbeats[0] <= before:
                time.sleep(0.05)
        # each listener takes the request from its own consumer: the wall host's may trail the latent's answer
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(lst.accepted >= 3 for lst in listeners.values()):
            time.sleep(0.05)
        assert all(lst.accepted >= 3 for lst in listeners.values()), {
            h: lst.accepted for h, lst in listeners.items()
        }
    finally:
        for a in agents.values():
            a.stopping = True
        for t in threads:
            t.join(15)
        for lst in listeners.values():
            lst.stop()
        asker.close()
    answers: dict[str, list[tuple[int, int]]] = {"latent": [], "wall": []}
    for _, m in read_all(kafka.bootstrap_servers, topic, 1):
        if isinstance(m, wire.Punctuation) and 0 < m.mark_ns < wire.END_OF_STREAM:
            answers[m.host].append((m.mark_ns, m.sent_wall_ns))
    # the first is the timer's, the last the graceful stop's: the requests' answers are between, each
    # computed after its request arrived (the next request leaves only once it was queued)
    lat, wall = answers["latent"][1:-1], answers["wall"][1:-1]
    assert len(lat) == 3 and len(wall) >= 1, answers
    for mark, sent in lat:  # everything before the pane of the request's moment is closed
        req = max(t for t in asked if t < sent)
        assert mark >= req // NS * NS, (mark, req)
    # the other holds back its 2-s skew, less at most one 1-s pane (its mark is pane-grained), where the
    # latent host's answers lag their request by less than a pane
    assert all(sent - mark > 1 * NS for mark, sent in wall), wall
