"""Slide-by-tuple windows end to end (dissertation §5.1.5, §6.1.4): the capture host numbers its rows and sends
each row's timestamp, number and lifted state (wire ROWS) and its timestamp mark (PUNCT); the job keeps FCA
bins per host incarnation and closes a window once its host's mark passed the window's timestamp. Against a
brute-force oracle over each host's rows in capture order: the host's stage and the job's processor in
process (two hosts, capture order not time order, batches interleaved across hosts, an agent restart, a
job restart from saved state), then two real agents, real Kafka and the real job. The bins themselves
against disorder and restarts: tests/test_rows_bytuple.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from contract import fields as F
from contract import query as Q
from contract import wire
from contract.rowresults import row_schema
from high_level.rows.processor import from_ipc
from high_level.rows.tupleprocessor import TupleProcessor
from low_level.kernel.tuplerows import TupleRows, row_stage
from lowwater_testing.traffic import NS, T0, make_traffic
from tests.test_rows_agent import selected, through_agents_and_job

CONFIG = """queries:
  - kind: rows
    name: recent_tcp_every_7
    window: {range: 1s, every: 7}     # every 7th tcp packet of a host: its last second, per port
    filter: protocol == tcp
    group_by: [dst_port]
    aggregates:
      - {fn: count}
      - {fn: sum, field: length, as: bytes}
      - {fn: max, field: length, as: longest}
      - {fn: avg, field: length, as: mean}
    kafka: {partitions: 2}
"""


def oracle(spec: Q.RowQuerySpec, streams: dict[tuple[str, int], np.ndarray]) -> dict[tuple, tuple]:
    """(host, incarnation, row, dst_port) -> (window end ns, count, bytes, max, avg): every ``every``-th row of
    a stream (its packets in capture order) and, per destination port, its rows of the last ``range`` up to
    that row's timestamp."""
    out, w = {}, spec.window
    for (host, inc), parsed in streams.items():
        rows = parsed[parsed[:, F.PROTO] == 6]
        ts, ln, port = rows[:, F.TS], rows[:, F.LEN], rows[:, F.DPORT]
        for r in range(w.every - 1, len(rows), w.every):
            inside = (ts > ts[r] - w.range_ns) & (ts <= ts[r])
            for p in np.unique(port[inside]):
                sel = ln[inside & (port == p)]
                out[(host, inc, r, int(p))] = (
                    int(ts[r]),
                    len(sel),
                    int(sel.sum()),
                    int(sel.max()),
                    sel.mean(),
                )
    return out


def stored(table: pa.Table) -> dict[tuple, tuple]:
    d = table.to_pydict()
    out = {}
    for i in range(table.num_rows):
        key = (d["host"][i], d["incarnation"][i], d["window"][i], d["dst_port"][i])
        assert key not in out, f"window stored twice: {key}"
        end = d["window_end"][i].value if hasattr(d["window_end"][i], "value") else d["window_end"][i]
        out[key] = (int(end), d["count"][i], d["bytes"][i], d["longest"][i], d["mean"][i])
    return out


def same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert got[key][:4] == w[:4] and got[key][4] == pytest.approx(w[4]), key


def captured(seed: int, n: int = 3000) -> np.ndarray:
    """Parsed packets in capture order: time order disturbed by up to 0.3 s (a host's own disorder)."""
    parsed = make_traffic(n, 30, T0, 10 * NS, seed=seed).rows()
    rng = np.random.default_rng(seed)
    return parsed[np.argsort(parsed[:, F.TS] + rng.integers(0, 3 * NS // 10, n), kind="stable")]


@pytest.mark.parametrize("seed", [1, 2])
def test_host_rows_and_marks_through_the_job_processor_equal_the_oracle(seed: int) -> None:
    """Two hosts (one restarted half-way: a new incarnation numbers from 0), drained blocks of any size, marks
    that the rows still to come never undercut, batches interleaved across hosts, the processor saved and
    restored mid-way: every closed window is the oracle's, once."""
    spec = Q.load_text(CONFIG, "bytuple.yaml").rows[0]
    assert isinstance(row_stage(spec, "h", 1), TupleRows)
    rng = np.random.default_rng(seed)
    a, b = captured(seed * 10), captured(seed * 10 + 1)
    streams = {("a", 1): a[:1400], ("a", 2): a[1400:], ("b", 1): b}
    queues: dict[str, list] = {"a": [], "b": []}
    for (h, inc), parsed in streams.items():
        tr, sent = TupleRows(spec, h, inc), queues[h]
        rows, i = selected(spec, parsed), 0
        while i < len(rows):
            j = min(len(rows), i + int(rng.integers(1, 300)))
            tr.submit(rows[i:j])
            if rng.random() < 0.5 and j < len(rows):
                tr.punctuate(int(rows[j:, 0].min()))  # the host's mark: no row still to come is below it
            i = j
        tr.punctuate(wire.END_OF_STREAM)  # a stop: this incarnation sends no more
        tr.pump(lambda topic, p, v, sent=sent: sent.append((p, v)) or True)
        assert all(p == tr.partition for p, _ in sent) and tr.empty and tr.seq == len(rows)
    order = rng.permutation(np.repeat(np.arange(2), [len(queues["a"]), len(queues["b"])]))
    each = [iter(queues["a"]), iter(queues["b"])]
    arrivals = [next(each[w]) for w in order]  # each host's batches in order, the two interleaved
    proc, got = TupleProcessor(spec), []
    for step, part in enumerate(np.array_split(np.arange(len(arrivals)), 6)):
        values: dict[int, list[bytes]] = {}
        for p, v in (arrivals[i] for i in part):
            values.setdefault(p, []).append(v)
        out = proc.process_packed(values, 1_700_000_000_000)
        if out["ipc"][0]:
            got.append(from_ipc(out["ipc"][0]))
        if step in (1, 3):  # a restart: the state the checkpoint saved
            proc = TupleProcessor.from_bytes(proc.to_bytes(), spec)
    want = oracle(spec, streams)
    assert len(want) > 2000
    table = pa.concat_tables(got)
    assert table.schema.equals(row_schema(spec), check_metadata=False)
    same(stored(table), want)
    assert proc.gaps == 0 and proc.late == 0 and proc.windows == len(want)
    assert not proc.ops and sorted(proc.done) == ["a#1", "a#2", "b#1"]  # finished streams keep no bins


def test_rows_below_a_mark_are_late_and_a_gap_is_counted() -> None:
    """A row under its host's mark is counted and dropped (the kernel drops it at the host already); a lost
    batch shows as a sequence gap."""
    spec = Q.load_text(CONFIG, "bytuple.yaml").rows[0]
    tr, sent = TupleRows(spec, "h", 1), []
    block = np.array([[100, 60], [200, 70], [300, 80]], np.int64)
    block = np.column_stack([block[:, 0], np.zeros((3, len(spec.selection.columns)), np.int64)])
    block[:, 1 + spec.selection.word_index("length")[0]] = [60, 70, 80]
    tr.submit(block)
    tr.punctuate(250)
    tr.submit(block[:1])  # ts 100 < 250: late
    tr.submit(block[2:])
    tr.punctuate(wire.END_OF_STREAM)
    tr.pump(lambda topic, p, v: sent.append(v) or True)
    proc = TupleProcessor(spec)
    proc.feed(sent[:3] + sent[4:])  # the late row's batch is lost on the way
    assert proc.gaps == 1
    proc = TupleProcessor(spec)
    proc.feed(sent)
    assert proc.late == 1 and proc.gaps == 0
    table = proc.close(1_700_000_000_000)
    assert table.num_rows == 0  # 5 rows numbered, every 7: no window (rows below 7 only)


def test_slide_by_tuple_through_real_agents_kafka_and_the_job(spark, kafka, topic_factory, tmp_path) -> None:
    """Two real agents replay a pcap as two capture hosts into real Kafka; the real job stores every window of
    each host, equal to the oracle, each once."""
    spec, parsed, table, _ = through_agents_and_job(spark, kafka, topic_factory, tmp_path, CONFIG, 3000)
    got = stored(table)
    incs = {h: {k[1] for k in got if k[0] == h} for h in ("cap-1", "cap-2")}
    assert all(len(v) == 1 for v in incs.values()), incs  # one incarnation each
    same(got, oracle(spec, {(h, next(iter(incs[h]))): parsed for h in incs}))


def test_shed_rows_and_host_losses_flag_every_window_they_meet() -> None:
    """Kafka away: the host's FIFO keeps at most ``max_queued`` rows and sheds the oldest (never a mark), their
    time range going with the next mark; a mark also carries a host drop range. Every window whose time range
    meets a range says so (``missing_records`` = the records of the ranges it meets, not ``complete``); every
    other window is the oracle's; the shed rows count in ``seq`` (no gap)."""
    spec = Q.load_text(CONFIG, "bytuple.yaml").rows[0]
    parsed = captured(7)
    rows = selected(spec, parsed)
    tr, sent, up = TupleRows(spec, "a", 1), [], True
    tr.max_queued = 300
    # a drop the host counted between its marks after blocks 19 and 20 (ranges start at the mark before)
    drop = (int(rows[2000:, 0].min()), int(rows[2100:, 0].min()) - 1, "ring", 5)
    for n, i in enumerate(range(0, len(rows), 100)):
        tr.submit(rows[i : i + 100])
        later = rows[i + 100 :, 0]
        if len(later):
            tr.punctuate(int(later.min()), losses=(drop,) if n == 20 else ())
        up = not 4 <= n < 12  # Kafka away for eight blocks
        if up:
            tr.pump(lambda topic, p, v: sent.append(v) or True)
    tr.punctuate(wire.END_OF_STREAM)
    tr.pump(lambda topic, p, v: sent.append(v) or True)
    assert tr.lost > 0 and tr.seq == len(rows) and tr.empty
    shed = [r for v in sent if isinstance(m := wire.decode(v), wire.Punctuation) for r in m.shed]
    assert sum(r[2] for r in shed) == tr.lost
    proc = TupleProcessor(spec)
    out = proc.process_packed({tr.partition: sent}, 1_700_000_000_000)
    table = from_ipc(out["ipc"][0])
    d = table.to_pydict()
    ranges = [(lo, hi, n) for lo, hi, n in shed] + [(drop[0], drop[1], drop[3])]
    want = oracle(spec, {("a", 1): parsed})
    got = stored(table)
    flagged = 0
    for i, key in enumerate(got):
        end = got[key][0]
        meets = sum(n for lo, hi, n in ranges if end >= lo and end - spec.window.range_ns < hi)
        assert d["missing_records"][i] == meets and d["complete"][i] == (meets == 0), key
        if meets:
            flagged += 1
        else:
            assert got[key][:4] == want[key][:4], key
    assert flagged and proc.gaps == 0
    assert any(got[k][:4] != want[k][:4] for k in got if k in want), "the shed rows made no window short"
