"""The job at rest (high_level/aggregate/pacer.py): after a batch that left no window open, the stream
waits for a partial instead of running a micro-batch per punctuation; a partial ends the wait at once and
its window closes on time; a stop ends the wait. Real Kafka, the real Spark job."""

from __future__ import annotations

import time
from pathlib import Path

from contract import wire
from high_level.aggregate.pacer import batch_offsets, is_punctuation
from lowwater_testing.spark import PORTS, Host, start_gate_job, variant, windows_of
from lowwater_testing.topics import produce

IDLE_MS = 30_000  # far longer than any wait below: a wait that ends early was ended by what the test sent


def _until(what: str, ok, timeout_s: float = 300.0) -> float:  # a stream start under load is slow
    t0 = time.monotonic()
    while not ok():
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_punctuation_is_told_from_partials_by_the_wire_header(topic_factory) -> None:
    q = variant(topic_factory, "gate", "restwire", 1)
    h = Host("h0", q)
    (_, _, partials), (_, _, punct) = h.pane(5, PORTS, 1, 100)
    assert not is_punctuation(partials) and is_punctuation(punct)
    assert wire.peek(punct)[0] == wire.KIND_PUNCT
    assert not is_punctuation(b"") and not is_punctuation(None) and not is_punctuation(b"XX\x03\x02")


def test_at_rest_the_job_waits_for_a_partial_and_closes_its_window_on_time(
    spark, kafka, topic_factory, tmp_path
) -> None:
    q, job, p0 = start_gate_job(
        spark, kafka, topic_factory, tmp_path, "rest", ("h0",), idle_trigger_ms=IDLE_MS
    )
    h = Host("h0", q)
    pacer = job.sink.pacer
    assert pacer is not None
    try:
        produce(kafka, h.pane(p0, PORTS, 1, 100))
        _until("the first window", lambda: p0 in windows_of(job, q))
        _until("a wait at rest", lambda: pacer.holding)  # nothing open: the stream waits
        ck = next(c for c in (Path(job.opts.checkpoint) / d for d in ("oop-chunked", "oop")) if c.is_dir())
        last = max(int(f.name) for f in (ck / "offsets").iterdir() if f.name.isdigit())
        # the offset log of the batch the stream rests after (an empty batch 0 may come before it, when
        # the stream started before the partial was produced): it ends after the partial and punctuation
        assert batch_offsets(ck, last) == {q.topic: {0: 2}}
        holds = pacer.holds
        produce(kafka, h.punct(p0 + 3))  # a mark alone closes nothing: the wait goes on
        time.sleep(1.5)
        assert pacer.holding and pacer.holds == holds and pacer.woken == 0
        produce(kafka, h.pane(p0 + 5, PORTS, 2, 100))  # traffic: the wait ends, the window closes
        _until("the window after the rest", lambda: p0 + 5 in windows_of(job, q))
        assert pacer.woken == 1  # the partial ended the wait, not its deadline
        assert set(windows_of(job, q)[p0 + 5]["n"]) == {2}
        _until("a wait at rest again", lambda: pacer.holding)
    finally:
        t0 = time.monotonic()
        job.stop(grace_s=IDLE_MS / 1e3)
    assert time.monotonic() - t0 < IDLE_MS / 1e3 / 2  # the stop ended the wait, not its deadline
    assert not pacer.holding
