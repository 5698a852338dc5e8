"""Select queries at the capture host: the generated pass copies exactly the filtered packets' rows (next
to aggregate queries, in the same pass), late rows are dropped after a mark, the rows travel as columnar
ROWS batches partitioned by a direction-normalised key, and the config rejects bad selects and joins."""

from __future__ import annotations

import numpy as np
import pytest

from contract import query as Q
from contract import wire
from low_level.kernel.fused import Kernel
from low_level.kernel.selection import SS_LATE, SelectBuffers, SelectOutbox
from low_level.kernel.tables import Tables
from lowwater_testing.agent import run_agent
from lowwater_testing.capture import make_query
from lowwater_testing.joins import HANDSHAKE
from lowwater_testing.oracle import select_oracle
from lowwater_testing.traffic import (
    NS,
    T0,
    build_frames,
    make_mixed_traffic,
    make_traffic,
    merge_partials,
    oracle,
)


def run_selects(
    selects: list, queries: list, traffic, chunk: int = 512
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The generated pass over the traffic in chunks; drained select rows and aggregate partials."""
    tables = Tables.build(queries, chunk=chunk)
    k = Kernel(tables, selects)
    frames, cap, wl, ts = build_frames(traffic)
    rows: list[list[np.ndarray]] = [[] for _ in selects]
    recs: list[list[np.ndarray]] = [[] for _ in queries]
    for s in range(0, len(traffic), chunk):
        k.run_arrays(frames, cap, wl, ts, s, min(len(traffic), s + chunk))
        for i in range(len(selects)):
            rows[i].append(k.sel_buf.drain(i))
        for i in range(len(queries)):
            recs[i].append(tables.drain(i))
    for i in range(len(queries)):
        k.flush_below(i, wire.END_OF_STREAM)
        recs[i].append(tables.drain(i))
    return [np.concatenate(r) for r in rows], [np.concatenate(r) for r in recs]


def test_selected_rows_equal_the_oracle_next_to_aggregates() -> None:
    cfg = Q.load_text(HANDSHAKE)
    queries = [make_query("lazy", 1024, name="pairs")]
    traffic = make_mixed_traffic(6000, 300, T0, 10 * NS, seed=3)
    rows, recs = run_selects(cfg.selects, queries, traffic)
    parsed = traffic.rows()
    for s, got in zip(cfg.selects, rows, strict=True):
        want = select_oracle(s, parsed)
        assert len(want) > 100
        np.testing.assert_array_equal(got, want)
    # the aggregate query in the same pass stays exact
    assert merge_partials(queries[0], *Tables.build(queries).split(0, recs[0])).equals(
        oracle(queries[0], traffic)
    )


def test_rows_below_the_mark_are_late_and_counted() -> None:
    s = Q.load_text(HANDSHAKE).selects[0]
    # no disorder allowance: the mark is the host's clock itself
    s = s.model_copy(update={"heartbeat": s.heartbeat.model_copy(update={"max_disorder_ns": 0})})
    traffic = make_traffic(2000, 50, T0, 4 * NS, seed=5)
    tables = Tables.build([], chunk=4096)
    k = Kernel(tables, [s])
    frames, cap, wl, ts = build_frames(traffic)
    k.run_arrays(frames, cap, wl, ts, 0, 1000)
    first = k.sel_buf.drain(0)
    mark = k.sel_buf.advance_mark(0, 0, idle=False, live_clock=False)
    assert (
        mark == ts[:1000].max() >= first[:, 0].max()
    )  # the host's clock: every parsed packet, not only selected
    # replay the first half: everything below the mark is late now, nothing is selected twice
    k.run_arrays(frames, cap, wl, ts, 0, 1000)
    again = k.sel_buf.drain(0)
    assert (again[:, 0] >= mark).all() and len(again) <= 1
    assert k.sel_buf.sst[0, SS_LATE] == len(first) - len(again)


def test_direction_normalised_key_puts_a_syn_and_its_synack_in_one_partition() -> None:
    cfg = Q.load_text(HANDSHAKE)
    syn, synack = cfg.selects
    rng = np.random.default_rng(1)
    n = 2000
    c_hi, c_lo = np.zeros(n, np.int64), rng.integers(0, 1 << 40, n)
    s_hi, s_lo = np.zeros(n, np.int64), rng.integers(0, 1 << 40, n)
    cport, sport = rng.integers(1024, 65535, n), rng.choice([22, 80, 443], n)
    ts = np.arange(n, dtype=np.int64)
    syn_rows = np.column_stack([ts, c_hi, c_lo, cport, s_hi, s_lo, sport])  # client -> server
    ack_rows = np.column_stack([ts, s_hi, s_lo, sport, c_hi, c_lo, cport, np.full(n, 64)])  # server -> client
    parts = {}
    for s, rows in ((syn, syn_rows), (synack, ack_rows)):
        box = SelectOutbox([s], "h", 1)
        box.submit(s.name, rows)
        sent: list[wire.Rows] = []
        box.pump(lambda topic, p, v, sent=sent: sent.append(wire.decode(v)) or True)
        part = np.full(n, -1)
        for b in sent:
            part[b.ts] = b.partition
        parts[s.name] = part
    assert (parts["syn"] >= 0).all() and len(set(parts["syn"].tolist())) == 4
    np.testing.assert_array_equal(parts["syn"], parts["synack"])


def test_outbox_orders_punctuation_after_rows_and_sheds_oldest_rows() -> None:
    s = Q.load_text(HANDSHAKE.replace("partitions: 4", "partitions: 1")).selects[0]
    box = SelectOutbox([s], "h", 7, max_rows=1000)
    rows = np.column_stack([np.arange(800), np.ones((800, 6), dtype=np.int64)])
    box.submit("syn", rows)
    box.punctuate("syn", 800, {})
    box.submit("syn", rows + 800 * np.eye(1, 7, 0, dtype=np.int64))
    assert box.lost == 600 and box.rows == 1000
    sent = []
    box.pump(lambda topic, p, v: sent.append(wire.decode(v)) or True)
    kinds = [type(b).__name__ for b in sent]
    assert kinds == ["Rows", "Punctuation", "Rows"] or kinds == ["Punctuation", "Rows"]
    punct = next(b for b in sent if isinstance(b, wire.Punctuation))
    assert punct.sent_upto == 799  # the newest row sent or shed before it: what a gap there may reach
    # shed rows count in seq, so the job sees them as a gap before the next batch (completeness)
    assert isinstance(sent[-1], wire.Rows) and sent[-1].seq == box.lost + sum(
        b.n for b in sent[:-1] if isinstance(b, wire.Rows)
    )


def test_rows_batches_roundtrip_and_reject_corruption() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 50, 20_000):
        rows = rng.integers(-(1 << 62), 1 << 62, (n, 5))
        b = wire.encode_rows("s", "h", 3, 1, 9, rows)
        assert b[3] == (wire.KIND_ROWS_LZ4 if n * 40 >= wire.COMPRESS_MIN else wire.KIND_ROWS)
        d = wire.decode(b)
        assert isinstance(d, wire.Rows) and (d.partition, d.seq, d.n) == (1, 9, n)
        np.testing.assert_array_equal(np.column_stack([d.ts, d.cols]), rows)
        with pytest.raises(wire.WireError):
            wire.decode(b[:-9] + bytes(5) + b[-4:])


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (("right: synack", "right: nope"), "unknown query 'nope'"),
        (
            ("right: [dst_ip, dst_port, src_ip, src_port]", "right: [dst_port, dst_port, src_ip, src_port]"),
            "differ in type or width",
        ),
        (("    within: 3s\n", ""), "a join needs its time band"),
        (("within: 3s", "within: 2m"), "larger than what input 'syn' can hold"),
        (
            ("fields: [src_ip, src_port, dst_ip, dst_port]\n", "fields: [src_ip, timestamp]\n"),
            "timestamp is always",
        ),
        (("partition_by: [dst_ip", "partition_by: [protocol"), "not among the selected fields"),
        (
            ("partitions: 4}\n  - name: handshakes", "partitions: 2}\n  - name: handshakes"),
            "Kafka partitions",
        ),
        (("on: {left: [src_ip, src_port", "on: {left: [src_port, src_ip"), "differ in type or width"),
        (("type: inner", ""), None),
    ],
)
def test_bad_select_and_join_configs_name_file_line_and_reason(
    change: tuple[str, str], where: str | None
) -> None:
    text = HANDSHAKE.replace(*change, 1)
    if where is None:
        Q.load_text(text, "x.yaml")
        return
    assert text != HANDSHAKE
    with pytest.raises(Q.ConfigError) as e:
        Q.load_text(text, "x.yaml")
    assert where in str(e.value) and str(e.value).startswith("x.yaml:"), str(e.value)
    assert e.value.line is not None


def test_a_query_without_kind_stays_an_aggregate() -> None:
    cfg = Q.load_text(
        HANDSHAKE
        + """
  - name: plain
    group_by: [dst_port]
    aggregates: [{fn: count, as: n}]
    window: {range: 10s}
"""
    )
    assert [q.name for q in cfg.queries] == ["plain"] and [s.name for s in cfg.selects] == ["syn", "synack"]
    assert [j.name for j in cfg.joins] == ["handshakes"]
    assert cfg.selects[1].partition_words == [3, 4, 5, 0, 1, 2] and cfg.selects[1].width == 7


def test_select_buffers_mark_follows_the_wall_clock_when_idle() -> None:
    s = Q.load_text(HANDSHAKE).selects[0]
    b = SelectBuffers([s], 16)
    assert b.advance_mark(0, 100 * NS, idle=False, live_clock=True) is None
    assert b.advance_mark(0, 100 * NS, idle=True, live_clock=True) == 100 * NS - s.heartbeat.skew_ns
    assert b.advance_mark(0, 0, idle=True, live_clock=False, end_of_stream=True) == wire.END_OF_STREAM


def test_agent_sends_selected_rows_and_punctuation_through_real_kafka(kafka, topic_factory, tmp_path) -> None:
    """The real agent process replays a pcap of handshakes; the ROWS batches read back from Kafka hold exactly
    the oracle's rows, each partition's rows are never below a punctuation already sent, seq counts rows."""
    from decimal import Decimal

    import dpkt

    from lowwater_testing.topics import read_topic
    from lowwater_testing.traffic import make_handshake_traffic

    t1, t2 = topic_factory(partitions=2), topic_factory(partitions=2)
    text = (
        HANDSHAKE.replace("partitions: 4}", "partitions: 2}", 1)
        .replace("partitions: 4}", "partitions: 2}", 1)
        .replace("kafka: {partitions: 2}", f"kafka: {{topic: {t1}, partitions: 2}}", 1)
        .replace("kafka: {partitions: 2}", f"kafka: {{topic: {t2}, partitions: 2}}", 1)
    )
    cfg = tmp_path / "hs.yaml"
    cfg.write_text(text)
    traffic = make_handshake_traffic(3000, T0, 20 * NS, seed=2, noise=2000)
    frames, _, _, ts = build_frames(traffic)
    pcap = tmp_path / "hs.pcap"
    with pcap.open("wb") as fh:
        w = dpkt.pcap.Writer(fh, nano=True)
        for i in range(len(traffic)):
            w.writepkt(bytes(frames[i]), ts=Decimal(int(ts[i])) / 1_000_000_000)
    run_agent(cfg, f"pcap:{pcap}", bootstrap=kafka.bootstrap_servers)
    loaded = Q.load(cfg)
    parsed = traffic.rows()
    for s, topic in zip(loaded.selects, (t1, t2), strict=True):
        got, ends = [], set()
        for part, vals in read_topic(kafka.bootstrap_servers, topic, 2).items():
            seq, mark = 0, -(2**63)
            for v in vals:
                b = wire.decode(v)
                if isinstance(b, wire.Rows):
                    assert b.partition == part and b.seq == seq and b.ts.min() >= mark
                    assert (wire.partition_of(b.cols[:, s.partition_words], 2) == part).all()
                    seq += b.n
                    got.append(np.column_stack([b.ts, b.cols]))
                else:
                    assert b.seq == seq and b.mark_ns >= mark
                    mark = b.mark_ns
            ends.add(mark)
        assert ends == {wire.END_OF_STREAM}
        got_rows = np.concatenate(got)
        got_rows = got_rows[np.lexsort(got_rows.T[::-1])]
        want = select_oracle(s, parsed)
        want = want[np.lexsort(want.T[::-1])]
        np.testing.assert_array_equal(got_rows, want)
