"""Completeness that never lies: every loss on the way reaches the windows it affects.

The property, for every window: either its stored rows equal the oracle over every packet that was on
the wire, or the job flagged it (a row says incomplete, or ``_incomplete`` lists it) with a non-zero
count of the cause. No window is both wrong and complete.

The faults are injected for real: frames pushed into a real agent's small ring faster than it drains,
disorder past the host's bound, a host that stops mid-window, a Kafka broker stopped longer than the
select outbox holds, a truncated capture file. What reached the real broker then goes through the job's
own steps (``PartitionProcessor``, ``JoinProcessor``) as the Spark job runs them, batch by batch with
processing time passing. ``benchmarks/bench_completeness.py`` counts the same verdicts per cause.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from contract import query as Q
from contract import wire
from high_level.aggregate.meld import Meld
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout
from lowwater_testing import oracle as simulate
from lowwater_testing.faults import (
    agg_query,
    disorder,
    kafka_gap,
    killed_host,
    ring_drops,
    select_outage,
    socket_drops,
    truncated_capture,
)

# -- pure logic ---------------------------------------------------------------------------------------


def test_an_expected_capture_host_waits_for_every_worker_its_workers_announce() -> None:
    m = Meld(10_000, expected_hosts=["capture-01"])
    m.advance(0)
    assert m.waiting_for() == ["capture-01"]
    m.observe("capture-01/w0", 1, 5, 0, 0, 0)
    m.workers_of("capture-01/w0", 2)
    assert m.waiting_for() == ["capture-01/w1"] and m.low_water_mark() is None
    m.observe("capture-01/w1", 1, 3, 0, 0, 0)
    assert m.low_water_mark() == 3 and m.expected_ids() == ("capture-01/w0", "capture-01/w1")
    r = Meld(10_000, expected_hosts=["capture-01"])
    r.load_dict(m.to_dict())  # the worker count survives a restart from the checkpoint
    assert r.low_water_mark() == 3


def _punct(q: Q.QuerySpec, host: str, mark: int, seq: int = 0, losses=(), workers: int = 0) -> bytes:
    return wire.encode_punctuation(
        wire.Punctuation(q.name, host, 1, 0, seq, mark, 0, 0, {"workers": workers}, (), tuple(losses))
    )


def test_losses_before_kafka_flag_exactly_the_windows_of_their_panes_and_malformed_frames_do_not() -> None:
    q = agg_query("t", window="{range: 2s, slide: 1s}", partitions=1)
    lay = Layout.of(q)
    part = wire.encode_partials(
        q.name,
        "h",
        1,
        0,
        0,
        np.arange(10, dtype=np.int64),
        np.ones((10, lay.kw), np.int64),
        np.ones((10, lay.na), np.int64),
    )
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=10**9, expected_hosts=("h",)))
    msgs = [
        part,
        _punct(q, "h", 3, 10),
        _punct(q, "h", 11, 10, [(4, 5, "socket", 7), (8, 8, "malformed", 2)]),
    ]
    df = proc.process(msgs, 1000)
    fin = df[df["kind"] == "final"]
    short = set(fin.loc[fin["missing_records"] > 0, "window"].astype(int))
    assert short == {4, 5, 6}  # the 2-s windows holding pane 4 or 5 (window id = its last pane)
    assert (fin.loc[fin["missing_records"] > 0, "missing_records"] == 7).all()
    flagged = [w for t in df.loc[df["kind"] == "incomplete", "status"] for w in json.loads(t)["windows"]]
    assert {(w[5], w[6], w[4]) for w in flagged} == {("h", "socket_drops", 7)} and len(flagged) == 3
    st = json.loads(df.loc[df["kind"] == "status", "status"].iloc[-1])["hosts"]["h"]
    assert st["losses"] == {"socket": 7} and st["malformed"] == 2  # malformed: reported, nothing flagged


def test_a_host_that_times_out_flags_the_windows_it_never_passed_even_without_rows() -> None:
    q = agg_query("t", partitions=1)
    lay = Layout.of(q)
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=1000, expected_hosts=("a", "b")))
    proc.process([_punct(q, "a", 2), _punct(q, "b", 2)], 0)
    now, out = 0, []
    for mark in range(3, 12):  # b stops; a goes on
        now += 600
        out.append(proc.process([_punct(q, "a", mark)], now))
    df = pd.concat(out, ignore_index=True)
    flagged = [w for t in df.loc[df["kind"] == "incomplete", "status"] for w in json.loads(t)["windows"]]
    wins = {(w[0] - lay.origin_ns) // lay.pane_ns for w in flagged}
    assert {w[6] for w in flagged} == {"timeout"} and {w[5] for w in flagged} == {"b"}
    assert wins and min(wins) == 2 and max(wins) == 10  # every window closed after b's mark 2


# -- the faults, injected for real ---------------------------------------------------------------------


def assert_property(vs: list[simulate.Verdict], cause: str) -> None:
    wrong = [v for v in vs if v.wrong]
    assert wrong, "the fault was meant to make some window short"
    assert not [v for v in vs if v.wrong and not v.flagged], "a window is wrong and says complete"
    assert all(v.causes.get(cause, 0) > 0 for v in wrong), [v for v in wrong if cause not in v.causes][:3]
    assert any(not v.flagged and not v.wrong for v in vs), "everything flagged: the flags say nothing"


@pytest.mark.kafka
@pytest.mark.timeout(900)
@pytest.mark.parametrize("window", ["{range: 1s}", "{range: 3s, slide: 1s}"])
def test_ring_drops_of_frames_sent_faster_than_a_small_ring_drains_flag_their_windows(
    kafka, topic_factory, window
) -> None:
    assert_property(ring_drops(kafka, topic_factory, window), "ring_drops")


@pytest.mark.netns
@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_a_paused_live_agent_whose_socket_drops_frames_flags_their_windows(
    request, kafka, topic_factory, tmp_path
) -> None:
    ends = request.getfixturevalue("veth_pair")
    assert_property(socket_drops(kafka, topic_factory, ends, tmp_path), "socket_drops")


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_disorder_past_the_hosts_bound_flags_the_windows_of_its_late_packets(kafka, topic_factory) -> None:
    vs, late = disorder(kafka, topic_factory, "1s")  # past the bound: late packets, flagged
    assert late > 0
    assert_property(vs, "host_late")
    vs, late = disorder(kafka, topic_factory, "5s")  # within it: nothing lost
    assert late == 0 and not any(v.wrong or v.flagged for v in vs)


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_a_host_killed_mid_window_flags_every_window_it_never_passed(kafka, topic_factory) -> None:
    assert_property(killed_host(kafka, topic_factory), "timeout")


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_records_deleted_by_the_broker_before_the_job_read_them_flag_their_windows(
    kafka, topic_factory
) -> None:
    assert_property(kafka_gap(kafka, topic_factory), "gap")


def test_a_truncated_capture_file_is_reported_and_every_window_of_what_it_holds_is_exact(tmp_path) -> None:
    """The cut record's bytes are no packet (dpkt or tshark read none there either): every window is
    exact and complete, and the cut record is reported (malformed), never counted as a loss."""
    vs, malformed = truncated_capture(tmp_path)
    assert vs and not any(v.wrong or v.flagged for v in vs)
    assert malformed >= 1


# -- joins: both inputs' losses ------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["anti", "inner"])
def test_an_outage_longer_than_the_select_outbox_flags_the_joins_windows(kafka, topic_factory, kind) -> None:
    """SYN-ACKs shed by the host's outbox during a Kafka outage: an anti join would call their SYNs
    unanswered (an inner join miss their handshakes); every such window is flagged (shed), the rest exact."""
    assert_property(select_outage(kafka, topic_factory, kind), "shed")
