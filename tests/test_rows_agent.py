"""Row windows end to end (OOP §5.2, dissertation §5.1.3): the capture host numbers its rows per partition
value and ships row-pane partials and row marks (``contract.wire`` kind ROW_MARKS), the job closes a window
when its host's mark passed its end. Against a brute-force oracle that numbers each host's packets in
capture order: the host's step and the job's processor in process (two hosts, any block sizes, batches
interleaved across hosts, a restart from saved state), then a real agent, real Kafka and the real job.
Disorder, partitions and restart of the pane operator itself: tests/test_rows.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract import fields as F
from contract import query as Q
from contract import wire
from contract.rowresults import row_schema
from high_level.rows.processor import RowProcessor, from_ipc
from low_level.kernel.rowpanes import RowPanes
from lowwater_testing.traffic import NS, T0, make_traffic

CONFIG = """queries:
  - kind: rows
    name: last_per_destination
    filter: protocol == tcp
    group_by: [dst_port]
    aggregates: [{fn: count}, {fn: sum, field: length, as: bytes}, {fn: max, field: length, as: longest}, {fn: avg, field: length, as: mean}]
    window: {rows: 12, slide: 8, partition_by: [dst_ip]}
    kafka: {partitions: 2}
"""


def spec_of(text: str = CONFIG) -> Q.RowQuerySpec:
    (spec,) = Q.load_text(text, "rows.yaml").rows
    return spec


def selected(spec: Q.RowQuerySpec, parsed: np.ndarray) -> np.ndarray:
    """The rows the query's select passes (tcp), as the kernel drains them: timestamp, then its words."""
    keep = parsed[parsed[:, F.PROTO] == 6]
    return keep[:, [F.TS] + [c for _, c in spec.selection.columns]]


def oracle(spec: Q.RowQuerySpec, hosts: dict[str, np.ndarray]) -> dict[tuple, tuple]:
    """(host, dst_ip words, window, dst_port) -> (count, bytes, max, avg) of every window a host's rows
    closed: each (host, destination) numbered in capture order, brute force."""
    w, out = spec.window, {}
    k, s = w.panes
    for host, parsed in hosts.items():
        rows = parsed[parsed[:, F.PROTO] == 6]
        src = rows[:, [F.DST_HI, F.DST_LO]]
        for v in np.unique(src, axis=0):
            idx = np.flatnonzero((src == v).all(axis=1))
            for wid in range(len(idx) // w.pane_rows):
                if (wid - k + 1) % s:
                    continue
                end = (wid + 1) * w.pane_rows
                sel = rows[idx[max(0, end - w.rows) : end]]
                for port in np.unique(sel[:, F.DPORT]):
                    ln = sel[sel[:, F.DPORT] == port, F.LEN]
                    out[(host, tuple(v), wid, int(port))] = (len(ln), int(ln.sum()), int(ln.max()), ln.mean())
    return out


def stored(spec: Q.RowQuerySpec, table: pa.Table) -> dict[tuple, tuple]:
    d = table.to_pydict()
    out = {}
    for i in range(table.num_rows):
        v = F.ip_to_words(d["dst_ip"][i])
        key = (d["host"][i], v, d["window"][i], d["dst_port"][i])
        assert key not in out, f"window stored twice: {key}"
        out[key] = (d["count"][i], d["bytes"][i], d["longest"][i], d["mean"][i])
    return out


def same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, (n, b, mx, avg) in want.items():
        assert got[key][:3] == (n, b, mx) and got[key][3] == pytest.approx(avg), key


def test_row_marks_roundtrip_and_reject_corruption() -> None:
    part = np.array([[0, 0xFFFF0A000001], [0, 0xFFFF0A000002]], np.int64)
    m = wire.RowMarks("q", "cap-1", 7, 1, 40, part, np.array([12, 5], np.int64), 99)
    got = wire.decode(wire.encode_row_marks(m))
    assert isinstance(got, wire.RowMarks) and (got.query, got.host, got.seq, got.sent_wall_ns) == (
        "q",
        "cap-1",
        40,
        99,
    )
    np.testing.assert_array_equal(got.part, part)
    assert got.rows.tolist() == [12, 5]
    one = wire.decode(
        wire.encode_row_marks(wire.RowMarks("q", "h", 1, 0, 0, np.zeros((1, 0)), np.array([3])))
    )
    assert one.part.shape == (1, 0) and one.rows.tolist() == [3]
    buf = bytearray(wire.encode_row_marks(m))
    buf[-9] ^= 1
    with pytest.raises(wire.WireError, match="checksum"):
        wire.decode(bytes(buf))
    with pytest.raises(wire.WireError):
        wire.encode_row_marks(wire.RowMarks("q", "h", 1, 0, 0, np.zeros((0, 1)), np.zeros(0)))


@pytest.mark.parametrize("seed", [1, 2])
def test_host_partials_and_marks_through_the_job_processor_equal_the_oracle(seed: int) -> None:
    """Two hosts' drained blocks of any size, their batches interleaved (each host's in order, as one Kafka
    partition keeps them), the processor saved and restored mid-way: every closed window is the oracle's."""
    spec = spec_of()
    rng = np.random.default_rng(seed)
    hosts = {
        h: make_traffic(3000, 30, T0, 10 * NS, seed=seed * 10 + i).rows() for i, h in enumerate(("a", "b"))
    }
    queues = {}
    for h, parsed in hosts.items():
        rp, sent = RowPanes(spec, h, 1000 + seed), []
        rows, i = selected(spec, parsed), 0
        while i < len(rows):
            j = min(len(rows), i + int(rng.integers(1, 400)))
            rp.submit(rows[i:j])
            if rng.random() < 0.5:
                rp.punctuate()
            i = j
        rp.punctuate(every=True)
        rp.pump(lambda topic, p, v, sent=sent: sent.append((p, v)) or True)
        assert all(p == rp.partition for p, _ in sent) and rp.empty
        queues[h] = sent
    order = rng.permutation(np.repeat(np.arange(2), [len(queues["a"]), len(queues["b"])]))
    proc, got, cursor = RowProcessor(spec), [], {"a": 0, "b": 0}
    for step, chunk in enumerate(np.array_split(order, 6)):
        values: dict[int, list[bytes]] = {}
        for which in chunk:
            h = "ab"[which]
            p, v = queues[h][cursor[h]]
            cursor[h] += 1
            values.setdefault(p, []).append(v)
        out = proc.process_packed(values, 1_700_000_000_000)
        if out["ipc"][0]:
            got.append(from_ipc(out["ipc"][0]))
        if step == 2:  # a restart: the state the checkpoint saved
            proc = RowProcessor.from_bytes(proc.to_bytes(), spec)
    want = oracle(spec, hosts)
    assert len(want) > 100 and len({k[1] for k in want}) > 5
    same(stored(spec, pa.concat_tables(got)), want)
    assert proc.gaps == 0 and proc.op.late == 0 and proc.windows == len(want)


def through_agents_and_job(
    spark, kafka, topic_factory, tmp_path, config: str, packets: int
) -> tuple[Q.RowQuerySpec, np.ndarray, pa.Table]:
    """One row query's config (its ``kafka: {partitions: 2}`` on a fresh topic): two real agents replay one pcap
    as two capture hosts (each its own incarnation and row numbers) into real Kafka, the real job stores the
    windows: (the query, the parsed packets, every stored row)."""
    from high_level.job import HighLevelJob
    from lowwater_testing.agent import spawn_agent, traffic_pcap
    from lowwater_testing.spark import job_options
    from tests.test_join import run_to_end

    topic = topic_factory(partitions=2)
    cfg_path = tmp_path / "rows.yaml"
    cfg_path.write_text(config.replace("kafka: {partitions: 2}", f"kafka: {{topic: {topic}, partitions: 2}}"))
    cfg = Q.load(cfg_path)
    spec = cfg.rows[0]
    traffic, pcap = traffic_pcap(tmp_path / "t.pcap", packets, 30, T0, 10 * NS, seed=5)
    procs = [  # two capture hosts at once (the same capture: each numbers its own rows)
        spawn_agent(cfg_path, f"pcap:{pcap}", host=host, bootstrap=kafka.bootstrap_servers)
        for host in ("cap-1", "cap-2")
    ]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    opts = job_options(kafka.bootstrap_servers, tmp_path, "t-rows", create_topics=False)
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    files = sorted((tmp_path / "res" / f"query={spec.name}").rglob("part-*.parquet"))
    assert files
    table = pa.concat_tables([pq.read_table(f) for f in files])
    assert table.schema.equals(row_schema(spec), check_metadata=False)
    return spec, traffic.rows(), table


def test_row_windows_through_a_real_agent_kafka_and_the_job(spark, kafka, topic_factory, tmp_path) -> None:
    """The real agent replays a pcap as two capture hosts (each its own incarnation and row numbers) into
    real Kafka; the real job stores every closed window of each (host, destination), equal to the oracle,
    each once (restarts: the processor test above and tests/test_rows.py)."""
    spec, parsed, table = through_agents_and_job(spark, kafka, topic_factory, tmp_path, CONFIG, 4000)
    same(stored(spec, table), oracle(spec, {"cap-1": parsed, "cap-2": parsed}))
