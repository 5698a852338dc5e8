"""Group-wise punctuation and AdaptWID end to end: two real agents (in-process: real ring, kernel, emitter,
Kafka producer) over a real broker into the real job (one job start for both: the suite's time).

Group-wise punctuation (OOP App. A), ``heartbeat: {groups: true}``: Host ``cap-a`` sees
every packet of a few flows (sources 10.0.0.1-4) and says so for them at its mark (``Emitter.group_done``,
the hook a source calls); host ``cap-b`` lags, holding the job's low-water mark back. Their windows close
on the group punctuation before the low-water mark passes them, exactly the oracle's, complete; nothing
of any other group closes past the low-water mark; then the lagging host catches up and every window of
both hosts equals the oracle, none emitted twice.

AdaptWID (``window: {strategy: adaptive}``, a sliding window per (source, destination), skewed sources so
that dense and sparse groups mix): the windows below the low-water mark after the first part, and all of
them at the end, equal the oracle (the lazy pane table gives the oracle's windows: the suite's other
end-to-end tests)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from contract import fields as F
from low_level.host.agent import Agent
from lowwater_testing.capture import drain, feed
from lowwater_testing.queries import spec
from lowwater_testing.spark import expected_typed, normalised, read_results, start_job
from lowwater_testing.traffic import T0, Traffic, make_traffic

NS = 1_000_000_000
OWNED = [f"10.0.0.{i}" for i in range(1, 5)]  # the flows only cap-a sees: punctuated by group


def _traffic(n: int, srcs: np.ndarray, seed: int) -> Traffic:
    t = make_traffic(n, 16, T0, 40 * NS, seed=seed)
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(srcs) + 1)  # skewed: a few dense sources, a tail of sparse ones
    return dataclasses.replace(t, src=(0x0A000000 + rng.choice(srcs, n, p=p / p.sum())).astype(np.uint32))


def _both(a: Traffic, b: Traffic) -> Traffic:
    cols = {f: np.concatenate([getattr(a, f), getattr(b, f)]) for f in ("ts", "src", "dst", "sport", "dport")}
    cols |= {f: np.concatenate([getattr(a, f), getattr(b, f)]) for f in ("proto", "flags", "length", "ttl")}
    order = np.argsort(cols["ts"], kind="stable")
    return Traffic(**{f: v[order] for f, v in cols.items()})


def _ends_ns(df: pd.DataFrame) -> np.ndarray:
    return pd.to_datetime(df["window_end"], utc=True).astype("datetime64[ns, UTC]").astype("int64").to_numpy()


def _agent(queries, host: str, bootstrap: str) -> Agent:
    """An in-process agent sending to the broker, fed through its ring (lowwater_testing.capture.feed)."""
    return Agent(queries, None, host, bootstrap, ring_slots=1 << 13, chunk=2048)


def _early(full: pd.DataFrame, end_ns: int) -> pd.DataFrame:
    return full[_ends_ns(full) <= end_ns].reset_index(drop=True)


def test_groups_close_on_their_punctuation_and_adaptive_windows_are_exact(
    spark, kafka, topic_factory, tmp_path
):
    topic = topic_factory(partitions=2, prefix="hl-groups")
    q = spec(
        "flows",
        group_by=["src_ip"],
        aggregates=["count as n", "sum(length) as bytes", "max(length) as mx"],
        window={"range": "4s", "slide": "2s"},
        table=512,
        flush={"policy": "lazy", "m": 2},
        topic=topic,
        partitions=2,
        heartbeat={"max_disorder": "0s", "groups": True},
    )
    qa = spec(
        "ada",
        group_by=["src_ip", "dst_ip"],
        aggregates=["count as n", "sum(length) as bytes", "min(ttl) as mn"],
        window={"range": "10s", "slide": "1s", "strategy": "adaptive"},
        table=1024,
        flush={"policy": "lazy", "m": 2},
        topic=topic_factory(partitions=2, prefix="hl-adaptwid"),
        partitions=2,
        heartbeat={"max_disorder": "0s"},
    )
    ta = _traffic(3000, np.arange(1, 17), seed=1)  # cap-a: the owned flows and shared sources
    tb = _traffic(3000, np.arange(5, 17), seed=2)  # cap-b: shared sources only
    pane_ns = q.window.pane_ns
    a, b = (
        _agent([q, qa], "cap-a", kafka.bootstrap_servers),
        _agent([q, qa], "cap-b", kafka.bootstrap_servers),
    )
    cut = int(np.searchsorted(tb.ts, T0 + 10 * NS))  # cap-b has sent its first 10 s only
    feed(a, ta, 0, len(ta))
    feed(b, tb, 0, cut)
    for agent in (a, b):
        agent.punctuate_all(idle=True, timer=True)
    mark_a, mark_b = int(a.last_mark_pane[0]), int(b.last_mark_pane[0])
    owned = np.array([F.ip_to_words(ip) for ip in OWNED], np.int64)  # src_ip's key words
    a.emitter.group_done("flows", owned, np.full(len(owned), mark_a))
    for agent in (a, b):
        agent.emitter.pump()
        assert agent.emitter.flush(60)
    assert mark_b + 5 < mark_a, (mark_a, mark_b)  # the low-water mark (cap-b's) lags far behind cap-a's
    job = start_job(
        spark,
        [q, qa],
        tmp_path,
        "groups",
        bootstrap=kafka.bootstrap_servers,
        expected_hosts=("cap-a", "cap-b"),
        host_timeout_ms=600_000,
    )
    try:
        job.process_all_available()
        first = read_results(Path(job.opts.results), q.name)
        fin = first[first["kind"] == "final"]
        ends = _ends_ns(fin)
        mine = fin["src_ip"].astype(str).isin(OWNED).to_numpy()
        # the owned flows: every window below cap-a's mark, exactly the oracle's (cap-a sees all of them)
        want = normalised(expected_typed(q, ta), q)
        want = want[want["src_ip"].isin(OWNED)]
        want = want[_ends_ns(want) <= q.window.origin_ns + mark_a * pane_ns].reset_index(drop=True)
        got = normalised(fin[mine], q)
        assert len(want) > 0 and (_ends_ns(want) > q.window.origin_ns + (mark_b + 2) * pane_ns).any()
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
        assert fin[mine]["complete"].all()
        # every other group waits for the low-water mark: nothing past it, and what closed is exact
        lwm_end = q.window.origin_ns + mark_b * pane_ns
        assert (ends[~mine] <= lwm_end).all()
        full = normalised(expected_typed(q, _both(ta, tb)), q)
        early = full[~full["src_ip"].isin(OWNED) & (_ends_ns(full) <= lwm_end)].reset_index(drop=True)
        pd.testing.assert_frame_equal(normalised(fin[~mine], q), early, check_dtype=False)
        # the adaptive query: what the low-water mark passed, exactly
        ada = read_results(Path(job.opts.results), qa.name)
        ada = ada[ada["kind"] == "final"]
        full_a = normalised(expected_typed(qa, _both(ta, tb)), qa)
        lwm_a = qa.window.origin_ns + int(min(a.last_mark_pane[1], b.last_mark_pane[1])) * qa.window.pane_ns
        assert len(ada) > 0 and (_ends_ns(ada) <= lwm_a).all()
        pd.testing.assert_frame_equal(normalised(ada, qa), _early(full_a, lwm_a), check_dtype=False)
        # cap-b catches up and both finish: every window of both hosts, once, the owned ones not again
        feed(b, tb, cut, len(tb))
        drain(b)
        drain(a)
        job.process_all_available()
    finally:
        job.stop()
    for query, want in ((q, full), (qa, full_a)):
        res = read_results(Path(job.opts.results), query.name)
        fin = res[res["kind"] == "final"]
        assert not fin.duplicated(["window_end", *(p.name for p in query.key_parts)]).any()
        pd.testing.assert_frame_equal(normalised(fin, query), want, check_dtype=False)
