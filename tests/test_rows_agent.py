"""Row windows end to end (OOP §5.2, dissertation §5.1.3): the capture host numbers its rows per partition
value and ships row-pane partials and row marks (``contract.wire`` kind ROW_MARKS), the job closes a window
when its host's mark passed its end. Against a brute-force oracle that numbers each host's packets in
capture order: the host's step and the job's processor in process (two hosts, any block sizes, batches
interleaved across hosts, a restart from saved state), then a real agent, real Kafka and the real job.
Completeness: a real agent whose small ring drops frames (charged to row slots on its row marks) and a lost
partials batch (a sequence gap): every window a lost row would have sat in is flagged.
Disorder, partitions and restart of the pane operator itself: tests/test_rows.py."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
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


def test_row_marks_carry_losses_charged_to_row_slots() -> None:
    """Losses ride on row marks (additive: marks without them encode as before) and bad ones are refused."""
    part = np.array([[0, 1], [0, 2]], np.int64)
    m = wire.RowMarks("q", "h", 1, 0, 5, part, np.array([12, 5], np.int64), 9)
    plain = wire.encode_row_marks(m)
    lossy = replace(m, losses=(("ring", 3), ("malformed", 1)), since=np.array([10, 0]), slack=4)
    got = wire.decode(wire.encode_row_marks(lossy))
    assert got.losses == (("ring", 3), ("malformed", 1)) and got.slack == 4 and got.since.tolist() == [10, 0]
    assert len(wire.encode_row_marks(lossy)) == len(plain) + 4 + 8 + 8 * 2 + 8 * 2 * 2
    assert wire.decode(plain).losses == () and wire.decode(plain).since is None
    for bad in (dict(since=np.array([13, 0])), dict(losses=(("ring", 0),))):
        with pytest.raises(wire.WireError, match="row-mark losses"):
            wire.encode_row_marks(replace(lossy, **bad))
    cut = bytearray(wire.encode_row_marks(lossy))
    body = bytes(cut[:-12])  # the last loss count cut off, the checksum made right again
    with pytest.raises(wire.WireError, match="row-mark losses"):
        wire.decode(body + zlib.crc32(body).to_bytes(4, "little"))


def test_marks_merged_while_kafka_is_away_keep_their_losses() -> None:
    """Row marks queued while Kafka is away are merged in place; the losses they carried survive the merge
    (causes summed, each counter's slots from its oldest start), so no flag is lost to an outage."""
    spec = spec_of()
    rows = selected(spec, make_traffic(600, 5, T0, NS, seed=3).rows())
    rp = RowPanes(spec, "h", 1)
    rp.submit(rows[:200])
    rp.punctuate()
    before = dict(zip(map(tuple, rp.counter.keys.tolist()), rp.counter.count.tolist(), strict=True))
    rp.submit(rows[200:300])
    rp.punctuate(losses=(("ring", 4),), slack=2)
    rp.submit(rows[300:])
    rp.punctuate(losses=(("ring", 1), ("socket", 2)))
    rp._compact()
    (m,) = [x for x in rp.fifo if isinstance(x, wire.RowMarks)]
    sent: list[bytes] = []
    rp.pump(lambda topic, p, v: sent.append(v) or True)
    got = wire.decode(sent[-1])
    assert dict(got.losses) == {"ring": 5, "socket": 2} and got.slack == 2
    for key, since in zip(map(tuple, got.part.tolist()), got.since.tolist(), strict=True):
        assert since == before.get(key, 0)  # the first lossy marks' start: the count before them


def lossy_host(spec: Q.RowQuerySpec, bootstrap: str, host: str = "h-ring", seed: int = 41) -> tuple:
    """A real in-process agent with a small ring: bursts of frames pushed faster than it drains, so its
    ring drops some (each frame pushed as a source does, the dropped ones known); a row punctuation after
    every drain, as its timer would. Returns (parsed rows, dropped mask, ring drops counted)."""
    from low_level.capture.ring import ring_push
    from low_level.host.agent import Agent
    from lowwater_testing.traffic import build_frames

    traffic = make_traffic(6000, 30, T0, 10 * NS, seed=seed)
    frames, cap, wl, ts = build_frames(traffic)
    agent = Agent([], None, host, bootstrap, ring_slots=1 << 8, chunk=256, rows=[spec])
    arrs, width, flat = agent.ring.arrays(), frames.shape[1], np.ascontiguousarray(frames).ravel()
    dropped = np.zeros(len(ts), bool)
    a, k = 0, 0
    while a < len(ts):
        b = min(len(ts), a + (400 if k % 16 == 8 else 100))  # now and then a burst the ring cannot hold
        for i in range(a, b):
            dropped[i] = not ring_push(arrs, flat, i * width, int(cap[i]), int(wl[i]), int(ts[i]), 0)
        while agent.ring.fill:
            agent.step()
        agent.punctuate_row(0, idle=False)
        agent.emitter.pump()
        a, k = b, k + 1
    agent.finish()
    assert agent.emitter.flush(60)
    agent.emitter.close()
    return traffic.rows(), dropped, int(agent.ring.drops)


def slots_of_drops(parsed: np.ndarray, dropped: np.ndarray) -> dict[tuple, np.ndarray]:
    """dst_ip words -> the slots of its dropped rows: the numbers they would have had among those received."""
    tcp = parsed[:, F.PROTO] == 6
    dst = parsed[:, [F.DST_HI, F.DST_LO]]
    out = {}
    for v in np.unique(dst[tcp], axis=0):
        mine = tcp & (dst == v).all(axis=1)
        received_before = np.cumsum(mine & ~dropped) - (mine & ~dropped)
        out[tuple(int(x) for x in v)] = received_before[mine & dropped]
    return out


def check_flags(
    spec: Q.RowQuerySpec, table: pa.Table, host: str, parsed: np.ndarray, dropped: np.ndarray
) -> None:
    """Values exact over the rows the host numbered; every window holding a dropped row's slot flagged;
    the windows far from any loss complete."""
    mine = table.filter(pa.compute.equal(table["host"], host))
    same(stored(spec, mine), oracle(spec, {host: parsed[~dropped]}))
    d = mine.select(["dst_ip", "first_row", "end_row", "missing_records", "complete"]).to_pandas()
    assert (d["complete"] == (d["missing_records"] == 0)).all()
    d["v"] = [F.ip_to_words(x) for x in d["dst_ip"]]
    slots = slots_of_drops(parsed, dropped)
    held = 0
    for v, w in d.groupby("v"):
        s = slots.get(v, np.zeros(0, np.int64))
        hold = ((w["first_row"].to_numpy()[:, None] <= s) & (s < w["end_row"].to_numpy()[:, None])).any(
            axis=1
        )
        held += int(hold.sum())
        assert not w["complete"].to_numpy()[hold].any(), (
            f"{v}: a window holding a lost row's slot is complete"
        )
    flagged = int((~d["complete"]).sum())
    assert held > 20 and held <= flagged < 0.6 * len(d), (held, flagged, len(d))


def test_ring_drops_flag_the_row_windows_holding_their_slots(kafka, topic_factory) -> None:
    """A real agent whose small ring drops frames, real Kafka, the job's row processor (saved and restored
    between micro-batches): windows are exact over the rows numbered, and every window a lost row would
    have sat in says so (``missing_records``, ``complete``)."""
    from lowwater_testing.faults import consume

    topic = topic_factory(partitions=2)
    spec = spec_of(CONFIG.replace("kafka: {partitions: 2}", f"kafka: {{topic: {topic}, partitions: 2}}"))
    parsed, dropped, counted = lossy_host(spec, kafka.bootstrap_servers)
    assert dropped.sum() > 50 and counted == dropped.sum()
    values = consume(kafka.bootstrap_servers, [topic])
    proc, got = RowProcessor(spec), []
    for p, vals in values.items():
        for chunk in np.array_split(np.arange(len(vals)), 5):
            proc = RowProcessor.from_bytes(proc.to_bytes(), spec)
            out = proc.process_packed({p[1]: [vals[i] for i in chunk]}, 1_700_000_000_000)
            if out["ipc"][0]:
                got.append(from_ipc(out["ipc"][0]))
    table = pa.concat_tables(got)
    assert table.schema == row_schema(spec)
    check_flags(spec, table, "h-ring", parsed, dropped)
    assert proc.lost["ring"] == counted and proc.gaps == 0 and proc.incomplete > 0


def test_a_sequence_gap_flags_every_window_it_leaves_short() -> None:
    """A partials batch lost between host and job (a sequence gap): every window whose value is not the
    oracle's says so, and the windows before the gap stay complete (processor level, pure)."""
    spec = spec_of()
    parsed = make_traffic(3000, 30, T0, 10 * NS, seed=7).rows()
    rows, rp, sent = selected(spec, parsed), RowPanes(spec, "a", 5), []
    for i in range(0, len(rows), 150):
        rp.submit(rows[i : i + 150])
        rp.punctuate()
        rp.pump(lambda topic, p, v: sent.append(v) or True)
    rp.punctuate(every=True)
    rp.pump(lambda topic, p, v: sent.append(v) or True)
    partials = [i for i, v in enumerate(sent) if isinstance(wire.decode(v), wire.Partials)]
    lost = partials[len(partials) // 2]
    proc = RowProcessor(spec)
    out = proc.process_packed({rp.partition: sent[:lost] + sent[lost + 1 :]}, 1_700_000_000_000)
    table = from_ipc(out["ipc"][0])
    got, want = stored(spec, table), oracle(spec, {"a": parsed})
    d = table.to_pydict()
    complete = {
        (d["host"][i], F.ip_to_words(d["dst_ip"][i]), d["window"][i], d["dst_port"][i]): d["complete"][i]
        for i in range(table.num_rows)
    }
    wrong = [k for k in want if got.get(k, (None,))[:3] != want[k][:3]]
    assert wrong and not any(complete.get(k, False) for k in wrong)
    assert proc.gaps == wire.decode(sent[lost]).n and 0 < proc.incomplete < 0.5 * proc.windows


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
    spark, kafka, topic_factory, tmp_path, config: str, packets: int, during: Any = None
) -> tuple[Q.RowQuerySpec, np.ndarray, pa.Table, Any]:
    """One row query's config (its ``kafka: {partitions: 2}`` on a fresh topic): two real agents replay one pcap
    as two capture hosts (each its own incarnation and row numbers) into real Kafka, ``during(spec, bootstrap)``
    runs while they do, the real job stores the windows: (the query, the parsed packets, every stored row,
    what ``during`` returned)."""
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
    extra = during(spec, kafka.bootstrap_servers) if during else None  # e.g. a third host, in-process
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    opts = job_options(kafka.bootstrap_servers, tmp_path, "t-rows", create_topics=False)
    run_to_end(HighLevelJob(spark, [], opts, config=cfg))
    files = sorted((tmp_path / "res" / f"query={spec.name}").rglob("part-*.parquet"))
    assert files
    table = pa.concat_tables([pq.read_table(f) for f in files])
    assert table.schema.equals(row_schema(spec), check_metadata=False)
    return spec, traffic.rows(), table, extra


def test_row_windows_through_a_real_agent_kafka_and_the_job(spark, kafka, topic_factory, tmp_path) -> None:
    """The real agent replays a pcap as two capture hosts (each its own incarnation and row numbers) into
    real Kafka; the real job stores every closed window of each (host, destination), equal to the oracle,
    each once, complete (restarts: the processor test above and tests/test_rows.py). A third host's ring
    drops frames: the job flags the windows its lost rows would have sat in."""
    spec, parsed, table, (lossy, dropped, _) = through_agents_and_job(
        spark, kafka, topic_factory, tmp_path, CONFIG, 4000, during=lossy_host
    )
    caps = table.filter(pa.compute.not_equal(table["host"], "h-ring"))
    same(stored(spec, caps), oracle(spec, {"cap-1": parsed, "cap-2": parsed}))
    assert pa.compute.all(caps["complete"]).as_py() and pa.compute.sum(caps["missing_records"]).as_py() == 0
    check_flags(spec, table, "h-ring", lossy, dropped)  # the job flags what the host lost
