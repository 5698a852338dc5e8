"""Group-wise punctuation and AdaptWID end to end: two real agents (in-process: real ring, kernel, emitter,
Kafka producer) over a real broker into the real job (one job start for both: the suite's time).

Group-wise punctuation (OOP App. A), ``heartbeat: {groups: true}``: Host ``cap-a`` sees
every packet of a few flows (sources 10.0.0.1-4) and says so for them at its mark (``Emitter.group_done``,
the hook a source calls); host ``cap-b`` lags, holding the job's low-water mark back. Their windows close
on the group punctuation before the low-water mark passes them, exactly the oracle's, complete; nothing
of any other group closes past the low-water mark; then the lagging host catches up and every window of
both hosts equals the oracle, none emitted twice.

The agent's own rule (``heartbeat: {groups: {on: tcp_close, grace: 1s}}``, query ``conns`` keyed by the
connection's directed 4-tuple): host ``cap-c`` replays a pcap of TCP connections (scapy, through the
agent's pcap source into its ring) that end with FINs or a RST; the agent notes each close in the kernel,
drains the group once its clock passes close + grace and sends the group's punctuation. Its windows close
ahead of the low-water mark (``cap-b`` lags), exactly the offline oracle's, complete, and no window of a
group without a close (a long-lived connection, a RST's other direction) closes past the mark. A stray
packet of a closed connection, replayed later with its old timestamp, is not lost: its closed window gets
a ``late`` row (the late policy ``drop``), the window after it counts it, and at the end every window
equals the oracle.

AdaptWID (``window: {strategy: adaptive}``, a sliding window per (source, destination), skewed sources so
that dense and sparse groups mix): the windows below the low-water mark after the first part, and all of
them at the end, equal the oracle (the lazy pane table gives the oracle's windows: the suite's other
end-to-end tests)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
from scapy.all import IP, TCP, Ether, PcapWriter, Raw

from contract import fields as F
from contract import query as Q
from low_level.capture.sources import PcapSource
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


SERVER, CLIENTS = "10.9.1.1", "10.9.0."
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
GRACE = 1.0
STRAY = (14.5, 8)  # a stray ACK of connection 8 (closed at 14 s, done below pane 15) at 14.5 s, sent late


def _connections() -> list[tuple]:
    """(seconds after T0, src, dst, sport, dport, flags, payload) of 10 connections, the even ones closed
    with FINs both ways and a final ACK, the odd ones with a RST from the client, and one long-lived
    connection that never closes (its packets up to 20 s here; the rest in :func:`_tail`)."""
    out = []
    for i in range(10):
        s, c, cp = 1.0 + 1.5 * i, f"{CLIENTS}{i + 1}", 40000 + i
        out += [(s, c, SERVER, cp, 80, SYN, 0), (s + 0.05, SERVER, c, 80, cp, SYN | ACK, 0)]
        for k in range(4):
            out += [(s + 0.1 + 0.2 * k, c, SERVER, cp, 80, PSH | ACK, 100 + k)]
            out += [(s + 0.15 + 0.2 * k, SERVER, c, 80, cp, ACK, 1000 + 10 * k)]
        if i % 2 == 0:
            out += [(s + 1.0, c, SERVER, cp, 80, FIN | ACK, 0), (s + 1.05, SERVER, c, 80, cp, FIN | ACK, 0)]
            out += [(s + 1.1, c, SERVER, cp, 80, ACK, 0)]
        else:
            out += [(s + 1.0, c, SERVER, cp, 80, RST, 0)]
    return sorted(out + _long_lived(0.5, 20.0))


def _long_lived(t0: float, t1: float) -> list[tuple]:
    c = f"{CLIENTS}100"
    ts = np.arange(t0, t1, 0.5).tolist()
    return [(t, c, SERVER, 50000, 443, ACK, 200) for t in ts] + [
        (t + 0.1, SERVER, c, 443, 50000, ACK, 0) for t in ts
    ]


def _tail() -> list[tuple]:
    """What cap-c replays after its groups' punctuation: the stray, then the long-lived connection on."""
    t, i = STRAY
    return [(t, f"{CLIENTS}{i + 1}", SERVER, 40000 + i, 80, ACK, 0), *_long_lived(20.0, 22.0)]


def _pcap(path: Path, rows: list[tuple]) -> Traffic:
    """The rows as a nanosecond pcap (scapy, explicit Ethernet addresses), and as the oracle's traffic."""
    pkts = []
    for t, src, dst, sp, dp, flags, size in rows:
        p = Ether(src="02:00:00:00:00:0c", dst="02:00:00:00:00:0b") / IP(src=src, dst=dst, ttl=64)
        p = p / TCP(sport=sp, dport=dp, flags=flags) / Raw(b"x" * size)
        p.time = Decimal(T0 + round(t * NS)) / 10**9
        pkts.append(p)
    with PcapWriter(str(path), nano=True) as w:
        w.write(pkts)
    n = len(rows)
    ip = np.array([[int(F.ip_to_words(r[k])[1]) & 0xFFFFFFFF for k in (1, 2)] for r in rows], np.uint32)
    return Traffic(
        ts=np.array([T0 + round(r[0] * NS) for r in rows], np.int64),
        src=ip[:, 0],
        dst=ip[:, 1],
        sport=np.array([r[3] for r in rows], np.int64),
        dport=np.array([r[4] for r in rows], np.int64),
        proto=np.full(n, 6, np.int64),
        flags=np.array([r[5] for r in rows], np.int64),
        length=np.array([len(bytes(p)) for p in pkts], np.int64),
        ttl=np.full(n, 64, np.int64),
    )


def _replay(agent: Agent, path: Path) -> None:
    """The agent's pcap source writes the file into its ring while the agent takes it (one agent, its
    loop turns by hand: no idle punctuation, timer punctuation as it falls)."""
    src = PcapSource(path, agent.ring, progress=False).start()
    while not src.finished or agent.ring.fill:
        agent.step()
    assert src.join(5) and src.error is None, src.error


def _trickle(t0_s: float, t1_s: float) -> Traffic:
    """UDP from 10.9.2.1 every 0.5 s: cap-b's packets of ``conns`` (its clock there), never closed."""
    ts = (T0 + np.arange(t0_s, t1_s, 0.5) * NS).astype(np.int64)
    n = len(ts)
    one = np.ones(n, np.int64)
    return Traffic(
        ts,
        np.full(n, 0x0A090201, np.uint32),
        np.full(n, 0xC0A80001, np.uint32),
        5000 * one,
        53 * one,
        17 * one,
        0 * one,
        80 * one,
        64 * one,
    )


def _closes() -> dict[tuple[str, str, str, str], int]:
    """Each closed group's done pane under the rule: the pane holding its first FIN/RST + grace."""
    out: dict = {}
    for t, src, dst, sp, dp, flags, _ in _connections():
        if flags & (FIN | RST) and (src, dst, str(sp), str(dp)) not in out:
            out[(src, dst, str(sp), str(dp))] = (T0 + round((t + GRACE) * NS)) // NS
    return out


def _group(df: pd.DataFrame) -> pd.Series:
    return pd.Series(
        list(zip(df["src_ip"], df["dst_ip"], df["src_port"], df["dst_port"], strict=True)), df.index
    )


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
    qc = spec(
        "conns",
        sources=["cap-b", "cap-c"],
        filter="src_ip in 10.9.0.0/16",
        group_by=["src_ip", "dst_ip", "src_port", "dst_port"],
        aggregates=["count as n", "sum(length) as bytes"],
        window={"range": "2s", "slide": "1s"},
        table=256,
        flush={"policy": "lazy", "m": 2},
        topic=topic_factory(partitions=2, prefix="hl-conns"),
        partitions=2,
        heartbeat={"max_disorder": "5s", "groups": {"on": "tcp_close", "grace": f"{GRACE}s"}},
    )
    ta = _traffic(3000, np.arange(1, 17), seed=1)  # cap-a: the owned flows and shared sources
    tb = _both(_traffic(3000, np.arange(5, 17), seed=2), _trickle(0, 40))  # cap-b: shared sources only
    pane_ns = q.window.pane_ns
    a, b = (
        _agent([q, qa], "cap-a", kafka.bootstrap_servers),
        _agent([q, qa, qc], "cap-b", kafka.bootstrap_servers),
    )
    c = Agent([qc], None, "cap-c", kafka.bootstrap_servers, ring_slots=1 << 13, chunk=2048, idle_after_s=3600)
    conns = _pcap(tmp_path / "conns.pcap", _connections())
    tail = _pcap(tmp_path / "tail.pcap", _tail())
    cut = int(np.searchsorted(tb.ts, T0 + 10 * NS))  # cap-b has sent its first 10 s only
    feed(a, ta, 0, len(ta))
    feed(b, tb, 0, cut)
    _replay(c, tmp_path / "conns.pcap")
    for agent in (a, b):
        agent.punctuate_all(idle=True, timer=True)
    c.punctuate_all(idle=False, timer=True)  # a busy host: its mark 5 s (max_disorder) behind its clock
    mark_a, mark_b = int(a.last_mark_pane[0]), int(b.last_mark_pane[0])
    lwm_c = min(int(b.last_mark_pane[2]), int(c.last_mark_pane[0]))  # conns' low-water mark
    owned = np.array([F.ip_to_words(ip) for ip in OWNED], np.int64)  # src_ip's key words
    a.emitter.group_done("flows", owned, np.full(len(owned), mark_a))
    for agent in (a, b, c):
        agent.emitter.pump()
        assert agent.emitter.flush(60)
    assert mark_b + 5 < mark_a, (mark_a, mark_b)  # the low-water mark (cap-b's) lags far behind cap-a's
    done = _closes()
    assert c.kernel.t.stat(0, "groups_done") == len(done) == 15  # 10 client sides, 5 FIN server sides
    job = start_job(
        spark,
        [q, qa, qc],
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
        # the rule's groups: every window below its done pane, exactly the oracle's, ahead of the mark;
        # every other group's windows only below the mark
        lwm_c_end = qc.window.origin_ns + lwm_c * qc.window.pane_ns
        _conns_first(
            qc,
            read_results(Path(job.opts.results), qc.name),
            _both(conns, tb.take(np.arange(cut))),
            done,
            lwm_c_end,
        )
        # cap-c replays the stray and its long-lived connection's tail; cap-b catches up; all finish:
        # every window of every host, once, the owned ones not again
        _replay(c, tmp_path / "tail.pcap")
        feed(b, tb, cut, len(tb))
        for agent in (b, a, c):
            drain(agent)
        job.process_all_available()
    finally:
        job.stop()
    _conns_end(qc, read_results(Path(job.opts.results), qc.name), conns, tail, tb, done)
    for query, want in ((q, full), (qa, full_a)):
        res = read_results(Path(job.opts.results), query.name)
        fin = res[res["kind"] == "final"]
        assert not fin.duplicated(["window_end", *(p.name for p in query.key_parts)]).any()
        pd.testing.assert_frame_equal(normalised(fin, query), want, check_dtype=False)


def _conns_first(qc: Q.QuerySpec, res: pd.DataFrame, sent: Traffic, done: dict, lwm_end: int) -> None:
    """Before the mark passes them: exactly the windows below each closed group's done pane, and every
    window below the low-water mark, each the oracle's and complete; nothing else."""
    fin = res[res["kind"] == "final"]
    want = normalised(expected_typed(qc, sent), qc)
    limit = _group(want).map(lambda g: done.get(g, 0) * NS).to_numpy()  # done pane -> its start (ns)
    ends = _ends_ns(want)
    want = want[(ends <= lwm_end) | (ends <= limit)].reset_index(drop=True)
    pd.testing.assert_frame_equal(normalised(fin, qc), want, check_dtype=False)
    assert fin["complete"].all()
    ahead = _ends_ns(want) > lwm_end
    assert ahead.sum() >= 10 and _group(want[ahead]).map(lambda g: g in done).all(), (lwm_end, ahead.sum())


def _conns_end(
    qc: Q.QuerySpec, res: pd.DataFrame, conns: Traffic, tail: Traffic, tb: Traffic, done: dict
) -> None:
    """At the end: every window once, the oracle's over everything cap-c and cap-b replayed, except the
    stray's closed window, which lacks it and has a ``late`` row with it (the late policy ``drop``)."""
    everything = _both(_both(conns, tail), tb)
    fin = res[res["kind"] == "final"]
    assert not fin.duplicated(["window_end", *(p.name for p in qc.key_parts)]).any()
    t, i = STRAY
    stray = (f"{CLIENTS}{i + 1}", SERVER, str(40000 + i), "80")
    closed_end = done[stray] * NS  # the stray's group's windows closed before it came
    with_stray = normalised(expected_typed(qc, everything), qc)
    without = normalised(expected_typed(qc, _both(_both(conns, tail.take(np.arange(1, len(tail)))), tb)), qc)

    def hit(d: pd.DataFrame) -> np.ndarray:
        return _group(d).map(lambda g: g == stray).to_numpy() & (_ends_ns(d) <= closed_end)

    want = pd.concat([with_stray[~hit(with_stray)], without[hit(without)]])
    want = want.sort_values(list(want.columns[: 1 + len(qc.key_parts)])).reset_index(drop=True)
    pd.testing.assert_frame_equal(normalised(fin, qc), want, check_dtype=False)
    late = res[res["kind"] == "late"]
    assert len(late) == 1 and _group(normalised(late, qc)).map(lambda g: g == stray).all(), late
    assert _ends_ns(late).tolist() == [closed_end] and late["n"].tolist() == [1]
    assert late["late_partials"].tolist() == [1] and (T0 + int(t * NS)) // NS == closed_end // NS - 1
