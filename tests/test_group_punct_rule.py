"""The agent's built-in group-wise punctuation rule (``heartbeat: {groups: {on: tcp_close, grace: ...}}``):
the loader's checks, the kernel's close notes and drain (FIN, RST, grace, the reverse direction of a
directed key, a stray packet after the close) and the agent's order of partials and punctuation.
Pure logic: the kernel over built frames, the agent with a recording producer (no Kafka)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from contract import fields as F
from contract import query as Q
from contract import wire
from low_level.host.agent import Agent
from low_level.kernel.fused import Kernel
from low_level.kernel.tables import EMPTY, QP_SIZE, QP_STRIDE, QS_CLOSES, QS_GROUPS_DONE, Tables
from lowwater_testing.capture import RecordingProducer, push_frames
from lowwater_testing.queries import spec
from lowwater_testing.traffic import T0, Traffic, build_frames, merge_partials, oracle

NS = 1_000_000_000
MS = NS // 1000
FIN, SYN, RST, ACK = 1, 2, 4, 16
A, B, C = 0x0A000001, 0x0A000002, 0x0A000003
KEY = ["src_ip", "dst_ip", "src_port", "dst_port"]


def _query(name: str = "conns", grace: str = "1s", **kw) -> Q.QuerySpec:
    return spec(
        name,
        group_by=kw.pop("group_by", KEY),
        aggregates=["count as n", "sum(length) as bytes"],
        window={"range": "2s", "slide": "1s"},
        table=256,
        flush={"policy": "lazy", "m": 4},
        heartbeat={"max_disorder": "0s", "groups": {"on": "tcp_close", "grace": grace}},
        **kw,
    )


def _packets(rows: list[tuple[float, int, int, int, int, int]]) -> Traffic:
    """(seconds after T0, src, dst, sport, dport, flags) TCP packets of 100 bytes, in the given order."""
    n = len(rows)
    col = list(zip(*rows, strict=True))
    return Traffic(
        ts=T0 + (np.array(col[0]) * NS).astype(np.int64),
        src=np.array(col[1], np.uint32),
        dst=np.array(col[2], np.uint32),
        sport=np.array(col[3], np.int64),
        dport=np.array(col[4], np.int64),
        proto=np.full(n, 6, np.int64),
        flags=np.array(col[5], np.int64),
        length=np.full(n, 100, np.int64),
        ttl=np.full(n, 64, np.int64),
    )


def _cat(*ts: Traffic) -> Traffic:
    fields = ("ts", "src", "dst", "sport", "dport", "proto", "flags", "length", "ttl")
    return Traffic(**{f: np.concatenate([getattr(t, f) for t in ts]) for f in fields})


class _Host:
    """The compiled kernel over built frames, fed part by part; keeps every partial it emits."""

    def __init__(self, q: Q.QuerySpec) -> None:
        self.q = q
        self.t = Tables.build([q], chunk=64)
        self.k = Kernel(self.t)
        self.recs: list[np.ndarray] = []

    def feed(self, traffic: Traffic) -> None:
        frames, cap, wl, ts = build_frames(traffic)
        for s in range(0, len(ts), 64):
            self.k.run_arrays(frames, cap, wl, ts, s, min(len(ts), s + 64))
            self.recs.append(self.t.drain(0))

    def close(self, clock_s: float) -> dict[tuple[int, ...], int]:
        """close_groups at the clock: {(src, dst, sport, dport): done pane}; the drained entries kept."""
        key, done = self.k.close_groups(0, T0 + int(clock_s * NS))
        self.recs.append(self.t.drain(0))
        return {tuple(int(v) for v in k): int(d) for k, d in zip(key, done, strict=True)}

    def emitted(self) -> pd.DataFrame:
        recs = np.concatenate(self.recs)
        return merge_partials(self.q, *self.t.split(0, recs))

    def held_panes(self, src: int) -> list[int]:
        """Panes of the table entries (not yet emitted) of groups from source ``src``."""
        t = self.t
        stride, size = int(t.qp[0, QP_STRIDE]), int(t.qp[0, QP_SIZE])
        slots = t.tab[: size * stride].reshape(size, stride)
        live = slots[:, 0] != EMPTY
        return sorted(slots[live & (slots[:, 2] == F.ip_to_words(_ip(src))[1]), 0].tolist())

    def finish(self) -> pd.DataFrame:
        self.k.flush_below(0, wire.END_OF_STREAM)
        self.recs.append(self.t.drain(0))
        return self.emitted()


def _pane(s: float) -> int:
    return (T0 + int(s * NS)) // NS  # 1 s panes from origin 0


def _key(src: int, dst: int, sport: int, dport: int) -> tuple[int, ...]:
    return (*F.ip_to_words(_ip(src)), *F.ip_to_words(_ip(dst)), sport, dport)


def _of(df: pd.DataFrame, src: int, dst: int) -> pd.DataFrame:
    """The rows of one direction's groups (k1, k3: the addresses' low words)."""
    lo = F.ip_to_words(_ip(src))[1], F.ip_to_words(_ip(dst))[1]
    return df[(df["k1"] == lo[0]) & (df["k3"] == lo[1])].reset_index(drop=True)


def _ip(v: int) -> str:
    return ".".join(str((v >> s) & 0xFF) for s in (24, 16, 8, 0))


def test_loader_takes_the_rule_and_refuses_keys_that_name_no_connection(tmp_path) -> None:
    q = _query(grace="2s")
    assert q.heartbeat.groups and q.heartbeat.close == Q.GroupCloseSpec(on="tcp_close", grace="2s")
    assert q.heartbeat.close.grace_ns == 2 * NS
    assert _query(group_by=[*KEY, "protocol", "vlan"]).heartbeat.close is not None
    base = """queries:
  - name: conns
    group_by: {key}
    aggregates: [{{fn: count, as: n}}]
    window: {{range: 2s, slide: 1s}}
    heartbeat:
      max_disorder: 0s
      groups: {{on: tcp_close, grace: 2s}}
"""
    for key, why in (
        ("[src_ip, dst_ip]", "whole src_port, dst_port missing"),
        ("[src_ip/24, dst_ip, src_port, dst_port]", "whole src_ip missing"),
        ("[src_ip, dst_ip, src_port, dst_port, tcp_flags]", "tcp_flags may change within one"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(base.format(key=key))
        with pytest.raises(Q.ConfigError) as err:
            Q.load(path)
        assert (err.value.file, err.value.line) == (str(path), 8), str(err.value)
        assert err.value.field == "query 'conns': heartbeat.groups" and why in err.value.reason, str(
            err.value
        )
    path.write_text(
        base.format(key=KEY).replace("[{fn: count, as: n}]", "[{fn: count_distinct, field: ttl, as: d}]")
    )
    with pytest.raises(Q.ConfigError) as err:  # a holistic aggregate's table keys (group, sub-key)
        Q.load(path)
    assert err.value.line == 8 and "holistic" in err.value.reason, str(err.value)
    path.write_text(base.format(key="[src_ip, dst_ip, src_port, dst_port]").replace("tcp_close", "fin"))
    with pytest.raises(Q.ConfigError) as err:
        Q.load(path)
    assert err.value.line == 8 and "tcp_close" in err.value.reason, str(err.value)


def test_rst_and_fins_close_their_groups_after_the_grace_and_nothing_is_lost() -> None:
    q = _query(grace="1s")
    h = _Host(q)
    # A->B:1000->80 (directed key: two groups, one per direction) ends with a RST from A at 2.5 s;
    # C->B:2000->80 ends with FINs both ways at 1.5 / 1.6 s and A's final ACK at 1.7 s;
    # B->A keeps sending (no FIN or RST of its own): never punctuated by the rule
    first = _packets(
        [
            (0.1, A, B, 1000, 80, SYN),
            (0.2, B, A, 80, 1000, SYN | ACK),
            (0.3, C, B, 2000, 80, SYN),
            (1.1, A, B, 1000, 80, ACK),
            (1.2, B, A, 80, 1000, ACK),
            (1.5, C, B, 2000, 80, FIN | ACK),
            (1.6, B, C, 80, 2000, FIN | ACK),
            (1.7, C, B, 2000, 80, ACK),
            (2.1, A, B, 1000, 80, ACK),
            (2.5, A, B, 1000, 80, RST),
            (2.55, B, A, 80, 1000, ACK),
        ]
    )
    h.feed(first)
    assert h.t.qs[0, QS_CLOSES] == 3  # A->B (RST), C->B and B->C (FIN)
    assert h.close(2.45) == {}, "nothing is due before close + grace (C->B: 1.5 s + 1 s)"
    # at 2.7 s C->B (FIN 1.5 + 1 s) and B->C (1.6 + 1 s) are due, A->B (2.5 + 1 s) not yet
    assert h.close(2.7) == {_key(C, B, 2000, 80): _pane(2.5), _key(B, C, 80, 2000): _pane(2.6)}
    assert h.held_panes(C) == [] and h.held_panes(A) == [_pane(t) for t in (0.1, 1.1, 2.1)]
    # what left is every packet of those groups (their panes all lie below the done pane)
    got = h.emitted()
    pd.testing.assert_frame_equal(_of(got, C, B), _of(oracle(q, first), C, B))
    pd.testing.assert_frame_equal(_of(got, B, C), _of(oracle(q, first), B, C))
    # 3.6 s: A->B is due, done below the pane holding 3.5 s; B->A (no FIN/RST) still held
    second = _packets([(3.6, B, A, 80, 1000, ACK)])
    h.feed(second)
    assert h.close(3.6) == {_key(A, B, 1000, 80): _pane(3.5)}
    assert h.held_panes(A) == [] and h.held_panes(B), "B->A keeps its entries"
    assert h.t.qs[0, QS_CLOSES] == 0 and h.t.qs[0, QS_GROUPS_DONE] == 3
    # a stray packet of A->B below its done pane (an old retransmission) is not lost: it leaves as a
    # partial of its own (the job counts it late); one after the done pane is an ordinary partial
    stray = _packets([(2.9, A, B, 1000, 80, ACK), (4.2, A, B, 1000, 80, ACK | FIN)])
    h.feed(stray)
    everything = _cat(first, second, stray)
    pd.testing.assert_frame_equal(h.finish(), oracle(q, everything))


def test_earliest_close_counts_and_udp_or_plain_acks_close_nothing() -> None:
    q = _query(grace="500ms")
    h = _Host(q)
    rows = [(0.2 + 0.1 * i, A, B, 3000 + i, 53, ACK) for i in range(5)]  # plain ACKs: no close
    rows += [(1.0, A, C, 4000, 443, FIN | ACK), (1.3, A, C, 4000, 443, RST)]  # the FIN at 1.0 s counts
    t = _packets(rows)
    udp = _packets([(1.1, A, B, 5000, 53, FIN)])
    udp.proto[:] = 17  # a UDP packet has no TCP flags (build_frames writes none)
    h.feed(_cat(t, udp))
    assert h.t.qs[0, QS_CLOSES] == 1
    assert h.close(1.49) == {}
    assert h.close(1.5) == {_key(A, C, 4000, 443): _pane(1.5)}
    pd.testing.assert_frame_equal(h.finish(), oracle(q, _cat(t, udp)))


def test_agent_sends_the_groups_partials_then_their_punctuation_in_their_partition() -> None:
    q = _query(grace="1s", partitions=2)
    prod = RecordingProducer()
    agent = Agent([q], None, "cap-1", None, ring_slots=1 << 10, chunk=256, producer=prod)
    conns = [(0x0A000100 + i, B, 1024 + i, 80) for i in range(40)]
    rows = [(0.1 + 0.01 * i, s, d, sp, dp, ACK) for i, (s, d, sp, dp) in enumerate(conns)]
    rows += [(1.1 + 0.01 * i, s, d, sp, dp, FIN | ACK) for i, (s, d, sp, dp) in enumerate(conns[:20])]
    rows += [(2.9, A, B, 999, 80, ACK)]  # the clock: 1.1-1.29 + 1 s passed for the 20 closed ones
    t = _packets(rows)
    push_frames(agent.ring, *build_frames(t))
    while agent.ring.fill:
        agent.step()
    agent.punctuate(0, idle=False, timer=True)
    agent.emitter.pump()
    msgs = [(p, wire.decode(v)) for _, p, v in prod.sent]
    groups = [(p, m) for p, m in msgs if isinstance(m, wire.GroupPunctuation)]
    assert sum(len(m.done_pane) for _, m in groups) == 20
    for p, g in groups:
        before = [m for pp, m in msgs[: msgs.index((p, g))] if pp == p and isinstance(m, wire.Partials)]
        keys = {tuple(k) for m in before for k in m.key.tolist()}
        assert wire.partition_of(g.key, 2).tolist() == [p] * len(g.done_pane)
        for k, done in zip(g.key.tolist(), g.done_pane.tolist(), strict=True):
            assert tuple(k) in keys, "a group's partials go before its punctuation"
            assert done == _pane(2.1) or done == _pane(2.2), done
    # the groups not closed are only in the host's own (global) punctuation
    closed = {tuple(k) for _, g in groups for k in g.key.tolist()}
    assert len(closed) == 20 and F.ip_to_words(_ip(A))[1] not in {k[1] for k in closed}
