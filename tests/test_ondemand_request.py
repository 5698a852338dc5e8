"""On-demand punctuation on request: the blocked high level asks the host that holds its mark back.

Protocol (contract/control.py), job side (high_level/ondemand.py), agent side (low_level/host/ondemand.py),
and the whole path with the real broker, two real agents and the real Spark job.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from contract import control as C
from contract import query as Q
from contract.status import PartitionStatus
from high_level.aggregate.rollup import Layout
from high_level.job import HighLevelJob
from high_level.ondemand import PunctuationAsker
from low_level.host.agent import Agent
from low_level.host.ondemand import RequestListener
from lowwater_testing.queries import on_demand_query
from lowwater_testing.spark import job_options

NS = 1_000_000_000


def _query(topic: str = "t", interval: str = "1s") -> Q.QuerySpec:
    return on_demand_query("asked", topic, interval, table=4096)


def test_request_roundtrip_and_every_mutation_or_truncation_rejected() -> None:
    r = C.PunctuationRequest("syn_per_port", "host-7", 3, 1_700_000_123, 42)
    b = C.encode_request(r)
    assert C.decode_request(b) == r
    for i in range(len(b)):
        for flip in (0x01, 0x80):
            bad = bytearray(b)
            bad[i] ^= flip
            with pytest.raises(C.ControlError):
                C.decode_request(bytes(bad))
    for n in range(len(b)):
        with pytest.raises(C.ControlError):
            C.decode_request(b[:n])
    with pytest.raises(C.ControlError):
        C.decode_request(b + b"\0")
    with pytest.raises(C.ControlError):
        C.encode_request(C.PunctuationRequest("", "h", 0, 0, 0))


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float) -> None:
        pass


def _status(lwm: int | None, now_s: float, blocked: list[str], open_windows: int = 3) -> PartitionStatus:
    return PartitionStatus(
        query="asked",
        partition=0,
        low_water_mark_pane=lwm,
        low_water_mark_ns=None,
        closed_before_window=lwm,
        open_windows=open_windows,
        blocked_by=blocked,
        now_ms=int(now_s * 1000),
        live_hosts=1,
        state_rows=0,
        windows_closed=0,
        records=0,
        hosts={},
    )


def test_asker_asks_blocking_hosts_only_for_ended_windows_and_rate_limits() -> None:
    lay = Layout.of(_query())
    rec, clock = _Recorder(), [100.0]
    asker = PunctuationAsker([lay], None, topic="ctl", min_gap_ms=200, producer=rec, clock=lambda: clock[0])
    base = 1_700_000_000  # window w = pane w (1 s) ends at (w + 1) s
    assert asker.observe([_status(base + 10, base + 10.5, ["sparse"])]) == 0  # window 10 has not ended yet
    assert asker.observe([_status(base + 10, base + 11.2, ["sparse"], open_windows=0)]) == 0  # nothing waits
    assert asker.observe([_status(base + 10, base + 11.2, ["sparse", "b"])]) == 2
    req = C.decode_request(rec.sent[0][2])
    assert (req.query, req.host, req.partition, req.waiting_pane) == ("asked", "sparse", 0, base + 10)
    assert rec.sent[0][:2] == ("ctl", b"sparse")
    clock[0] += 0.1
    assert asker.observe([_status(base + 10, base + 11.3, ["sparse"])]) == 0  # within 200 ms: suppressed
    clock[0] += 0.15
    assert asker.observe([_status(base + 10, base + 11.5, ["sparse"])]) == 1
    assert (
        asker.observe([_status(None, base + 11.5, ["never-heard"])]) == 1
    )  # an expected host never punctuated


def test_listener_keeps_one_pending_flag_per_query_for_its_own_host() -> None:
    q = _query()
    lst = RequestListener("sparse", [q], "unused")
    lst.offer(C.encode_request(C.PunctuationRequest("asked", "other", 0, 5, 0)))
    lst.offer(C.encode_request(C.PunctuationRequest("unknown", "sparse", 0, 5, 0)))
    lst.offer(b"garbage")
    assert not lst.take(0)
    for _ in range(3):  # duplicates collapse: idempotent
        lst.offer(C.encode_request(C.PunctuationRequest("asked", "sparse", 0, 5, 0)))
    assert lst.take(0)
    assert not lst.take(0)
    assert (lst.received, lst.accepted, lst.bad) == (6, 3, 1)


def test_blocked_job_asks_the_sparse_agent_and_windows_close_long_before_its_heartbeat(
    kafka, spark, topic_factory, tmp_path
) -> None:
    """A dense agent (1-s heartbeats) and a sparse agent whose only timer punctuation falls at its start
    (heartbeat every 300 s, on-demand-when-idle off): without requests no window after its start
    could close for five minutes. With the asker, the job asks it and windows keep closing."""
    topic, ctl = topic_factory(1), topic_factory(1, prefix="ctl")
    dense_q, sparse_q = _query(topic, "1s"), _query(topic, "300s")
    opts = job_options(
        kafka.bootstrap_servers,
        tmp_path,
        "t-asked",
        host_timeout_ms=120_000,
        expected_hosts=("dense", "sparse"),
        create_topics=False,
        control_topic=ctl,
    )
    job = HighLevelJob(spark, [dense_q], opts)
    assert job.asker is not None
    listener = RequestListener("sparse", [sparse_q], kafka.bootstrap_servers, topic=ctl).start()
    assert listener.ready.wait(30)
    dense = Agent(
        [dense_q],
        {"type": "generator", "rate": 2000, "groups": 100, "clock": "wall"},
        "dense",
        kafka.bootstrap_servers,
    )
    sparse = Agent(
        [sparse_q],
        {"type": "generator", "rate": 0.001, "groups": 10, "clock": "wall", "seed": 2},
        "sparse",
        kafka.bootstrap_servers,
        control=listener,
    )
    job.start()
    start_pane = time.time_ns() // NS
    threads = [threading.Thread(target=a.run, args=(300,), daemon=True) for a in (dense, sparse)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 300  # the stream's first batch under load can take minutes
        closed = None
        while time.monotonic() < deadline:
            st = (job.sink.partitions.get(dense_q.name) or {}).get(0)
            closed = st.closed_before_window if st is not None else None
            if closed is not None and closed >= start_pane + 6:
                break
            time.sleep(0.5)
        assert closed is not None and closed >= start_pane + 6, (
            f"closed frontier {closed}, start pane {start_pane}"
        )
        assert job.asker.sent > 0
        assert listener.accepted > 0
        # the timer fired once; the rest were answers to requests (counted by the agent's thread right
        # after it hands the mark to its producer: wait for the count rather than race it)
        while sparse.heartbeats[0] < 2 and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert sparse.heartbeats[0] >= 2
    finally:
        for a in (dense, sparse):
            a.stopping = True
        for t in threads:
            t.join(15)
        listener.stop()
        job.stop()  # closes the asker too


HANDSHAKE = Q.load("configs/handshake.yaml")


def test_a_blocked_join_asks_the_hosts_holding_it_for_its_select_inputs() -> None:
    """A join's status row names the join and carries its mark in ns: the asker turns it into the output
    roll-up's pane and asks each blocking host for both select inputs; merged with the aggregates' asker
    (the job has one sink), both kinds are asked through one producer."""
    from types import SimpleNamespace

    from high_level.join.pipeline import join_asker, layouts

    rec, clock = _Recorder(), [100.0]
    opts = SimpleNamespace(kafka=None, control_topic="ctl")
    asker = join_asker(HANDSHAKE, opts, producer=rec)  # type: ignore[arg-type]
    assert asker is not None
    assert asker.inputs == {"handshakes": ("syns", "synacks"), "unanswered_syns": ("syns", "synacks")}
    asker.clock = lambda: clock[0]
    rl = layouts(HANDSHAKE)[0].rollup
    base = 1_700_000_000 * NS
    w = (base - rl.origin_ns) // rl.pane_ns  # the first open window of the join's output
    end_s = (rl.origin_ns + (w + 1) * rl.pane_ns) / NS

    def st(now_s: float, blocked: list[str], query: str = "handshakes") -> PartitionStatus:
        return _status(None, now_s, blocked).model_copy(
            update={"query": query, "low_water_mark_pane": base, "closed_before_window": w}
        )

    assert asker.observe([st(end_s - 0.5, ["cap-1"])]) == 0  # its window has not ended yet
    assert asker.observe([st(end_s + 0.2, ["cap-1"])]) == 2
    reqs = [C.decode_request(v) for _t, _k, v in rec.sent]
    assert {(r.query, r.host) for r in reqs} == {("syns", "cap-1"), ("synacks", "cap-1")}
    agg = PunctuationAsker([Layout.of(_query())], None, topic="ctl", producer=rec, clock=lambda: clock[0])
    both = agg.merge(asker)
    clock[0] += 1
    assert both.observe([st(end_s + 1.5, ["cap-2"]), _status(end_s, end_s + 2, ["cap-3"])]) == 3
    assert {(C.decode_request(v).query, k) for _t, k, v in rec.sent[2:]} == {
        ("syns", b"cap-2"),
        ("synacks", b"cap-2"),
        ("asked", b"cap-3"),
    }
    assert join_asker(dataclasses.replace(HANDSHAKE, joins=[]), opts, producer=rec) is None  # type: ignore[arg-type]


def test_the_agent_punctuates_a_select_a_join_asked_for() -> None:
    """The listener keeps a flag per select query too; the agent's loop takes it and punctuates that
    select at once (as if idle), not on its timer."""
    from lowwater_testing.joins import HANDSHAKE as SELECTS  # the kernel tests/test_select.py compiles too

    s = Q.load_text(SELECTS).selects[0]
    syns = s.model_copy(
        update={"heartbeat": s.heartbeat.model_copy(update={"interval_ns": 300 * NS, "on_demand": False})}
    )
    lst = RequestListener("cap-1", [_query(), syns], "unused")
    agent = Agent([], None, "cap-1", None, chunk=4096, control=lst, selects=[syns])
    calls: list[tuple[int, bool, bool]] = []
    agent.punctuate_select = lambda k, idle, timer=True, end_of_stream=False: calls.append((k, idle, timer))  # type: ignore[method-assign]
    agent.process()  # the timer's first punctuation
    agent.process()
    assert calls == [(0, False, True)] or [c for c in calls if c[2]] == calls
    n = len(calls)
    lst.offer(C.encode_request(C.PunctuationRequest(syns.name, "cap-1", 0, 5, 0)))
    time.sleep(0.02)  # past the on-demand rate limit
    agent.process()
    assert calls[n:] == [(0, True, False)]
    assert not lst.take_query(syns.name) and not lst.take_query("unknown")
