"""Row windows (OOP §5.2, dissertation §5.1.2-3): host row numbering + the pane operator against a brute-force
oracle that numbers each host's rows in capture order, under shuffled arrival, 1-4 partitions and a restart."""

from __future__ import annotations

import numpy as np
import pytest

from contract import aggregates as A
from contract.query.configfile import ConfigError, load_rows, load_text
from contract.query.rows import row_query
from high_level.aggregate.merge import group_reduce
from high_level.rows.windows import RowWindows
from low_level.kernel.rownum import RowCounter

AGGS = [{"fn": "count"}, {"fn": "sum", "field": "length"}, {"fn": "max", "field": "length"}]
AGGS += [{"fn": "min", "field": "length"}, {"fn": "avg", "field": "length"}]


def _spec(rows: int, slide: int, partitioned: bool, grouped: bool = True):
    win = {"rows": rows, "slide": slide, **({"partition_by": ["src_ip"]} if partitioned else {})}
    return row_query(
        {"name": "r", "group_by": ["dst_port"] if grouped else [], "aggregates": AGGS, "window": win}
    )


def _lifted(spec, length: np.ndarray) -> np.ndarray:
    cols = [A.lift(p, length) for a in spec.aggregates for p in A.REGISTRY[a.fn].parts(a)]
    return np.column_stack(cols).astype(np.int64)


def _capture(rng: np.random.Generator, n: int, grouped: bool) -> dict[str, np.ndarray]:
    """One host's rows that passed the filter, in capture order."""
    return {
        "part": rng.integers(1, 5, n).reshape(-1, 1),
        "key": rng.integers(0, 3 if grouped else 1, n).reshape(-1, 1),
        "length": rng.integers(40, 1500, n),
    }


def _host_messages(spec, host: str, rows: dict, rng: np.random.Generator, partitioned: bool) -> list:
    """What one capture host sends: per batch its row-pane partials (split into shuffled messages), then
    its punctuation (the partitions' row counts)."""
    counter = RowCounter(1 if partitioned else 0)
    n, out, i = len(rows["length"]), [], 0
    while i < n:
        j = min(n, i + int(rng.integers(1, 300)))
        part = rows["part"][i:j] if partitioned else np.zeros((j - i, 0), np.int64)
        pane = counter.number(part) // spec.window.pane_rows
        keys, st = group_reduce(
            np.column_stack([part, pane, rows["key"][i:j]]), _lifted(spec, rows["length"][i:j]), spec.ops
        )
        pieces = np.array_split(rng.permutation(len(keys)), int(rng.integers(1, 4)))
        msgs = [("add", host, keys[p, :-2], keys[p, -2], keys[p, -1:], st[p]) for p in pieces]
        rng.shuffle(msgs)  # arrival disorder within the batch
        out += msgs
        out.append(("punct", host, *counter.punctuation()))
        i = j
    return out


def _oracle(spec, hosts: dict[str, dict], partitioned: bool) -> dict:
    """Brute force: number each (host, partition)'s rows in capture order, aggregate every closed window."""
    w, out = spec.window, {}
    for host, rows in hosts.items():
        parts = rows["part"][:, 0] if partitioned else np.zeros(len(rows["length"]), np.int64)
        for v in np.unique(parts):
            idx = np.flatnonzero(parts == v)
            for wid in range(len(idx) // w.pane_rows):
                if (wid - w.panes[0] + 1) % w.panes[1]:
                    continue
                end = (wid + 1) * w.pane_rows
                sel = idx[max(0, end - w.rows) : end]
                for key in np.unique(rows["key"][sel, 0]):
                    g = sel[rows["key"][sel, 0] == key]
                    lifted = _lifted(spec, rows["length"][g])
                    st = tuple(int(A.MERGE_UFUNCS[op].reduce(lifted[:, c])) for c, op in enumerate(spec.ops))
                    out[(host, (int(v),) if partitioned else (), wid, int(key))] = st
    return out


def _run(
    spec, msgs: list, partitions: int, rng: np.random.Generator, restart_at: int | None, pw: int
) -> dict:
    """Route partials by group to ``partitions`` processors, punctuation to all; close at random times."""
    procs = [RowWindows(spec, pw, 1) for _ in range(partitions)]
    got: dict = {}

    def collect(res) -> None:
        for i in range(len(res)):
            k = (res.host[i], tuple(int(x) for x in res.part[i]), int(res.window[i]), int(res.key[i, 0]))
            assert k not in got, f"window emitted twice: {k}"
            got[k] = tuple(int(x) for x in res.state[i])

    for m, msg in enumerate(msgs):
        if m == restart_at:  # a restart: each processor's state saved and restored into a new one
            blobs = [p.snapshot() for p in procs]
            procs = [RowWindows(spec, pw, 1) for _ in range(partitions)]
            for p, b in zip(procs, blobs, strict=True):
                p.restore(b)
        if msg[0] == "add":
            _, host, part, pane, key, st = msg
            dest = (key[:, 0] * 7919 + (part[:, 0] if pw else 0)) % partitions
            for q in range(partitions):
                s = dest == q
                if s.any():
                    procs[q].add(host, part[s], pane[s], key[s], st[s])
        else:
            for p in procs:
                p.punctuate(msg[1], msg[2], msg[3])
        if rng.random() < 0.2:
            for p in procs:
                collect(p.close())
    for p in procs:
        collect(p.close())
        assert p.late == 0
    return got


def _interleave(per_host: list[list], rng: np.random.Generator) -> list:
    """Hosts' messages interleaved at random, each host's own order kept (its Kafka partition's order)."""
    order = rng.permutation(np.repeat(np.arange(len(per_host)), [len(m) for m in per_host]))
    its = [iter(m) for m in per_host]
    return [next(its[h]) for h in order]


@pytest.mark.parametrize(
    ("rows", "slide", "partitioned", "partitions", "seed"),
    [
        (50, 20, False, 1, 1),
        (50, 20, False, 3, 2),
        (60, 60, False, 2, 3),
        (40, 10, True, 1, 4),
        (45, 30, True, 4, 5),
        (7, 3, True, 2, 6),
    ],
)
def test_row_windows_match_oracle(
    rows: int, slide: int, partitioned: bool, partitions: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    spec = _spec(rows, slide, partitioned)
    hosts = {f"cap-{h}": _capture(rng, int(rng.integers(800, 2000)), True) for h in range(3)}
    msgs = _interleave([_host_messages(spec, h, r, rng, partitioned) for h, r in hosts.items()], rng)
    want = _oracle(spec, hosts, partitioned)
    got = _run(
        spec, msgs, partitions, rng, restart_at=int(rng.integers(1, len(msgs))), pw=1 if partitioned else 0
    )
    assert len(want) > 100
    assert got == want


def test_values_are_the_registry_finalize() -> None:
    """One stream, one group: the last 10 rows every 5, values read back against numpy."""
    spec = _spec(10, 5, False, grouped=False)
    length = np.arange(1, 26, dtype=np.int64)
    c = RowCounter(0)
    pane = c.number(np.zeros((25, 0), np.int64)) // spec.window.pane_rows
    keys, st = group_reduce(np.column_stack([pane, np.zeros(25, np.int64)]), _lifted(spec, length), spec.ops)
    op = RowWindows(spec, 0, 1)
    op.add("h", np.zeros((len(keys), 0), np.int64), keys[:, 0], keys[:, 1:], st)
    op.punctuate("h", *c.punctuation())
    res = op.close()
    assert list(res.window) == [0, 1, 2, 3, 4] and list(res.first_row) == [0, 0, 5, 10, 15]
    assert list(res.values["count"]) == [5, 10, 10, 10, 10]
    assert list(res.values["max_length"]) == [5, 10, 15, 20, 25]
    assert res.values["avg_length"][-1] == pytest.approx(np.mean(length[15:25]))
    assert op.state_rows == 1  # only the pane the next window still needs


def test_state_is_the_open_panes() -> None:
    """The operator holds the open panes, not the rows (rows 20000, slide 1000: at most 20 panes per group)."""
    spec = _spec(20_000, 1_000, False)
    rng = np.random.default_rng(0)
    c, op = RowCounter(0), RowWindows(spec, 0, 1)
    for _ in range(50):
        n = 5_000
        pane = c.number(np.zeros((n, 0), np.int64)) // spec.window.pane_rows
        keys, st = group_reduce(
            np.column_stack([pane, rng.integers(0, 3, n)]), _lifted(spec, rng.integers(40, 1500, n)), spec.ops
        )
        op.add("h", np.zeros((len(keys), 0), np.int64), keys[:, 0], keys[:, 1:], st)
        op.punctuate("h", *c.punctuation())
        op.close()
        assert op.state_rows <= 3 * spec.window.panes[0]


def test_counter_numbers_per_partition_across_batches() -> None:
    c = RowCounter(1)
    assert list(c.number(np.array([[5], [7], [5]]))) == [0, 0, 1]
    assert list(c.number(np.array([[7], [5], [9]]))) == [1, 2, 0]
    keys, counts = c.punctuation()
    assert keys[:, 0].tolist() == [5, 7, 9] and counts.tolist() == [3, 2, 1]
    c.number(np.array([[9]]))
    keys, counts = c.punctuation()  # only what changed since
    assert keys[:, 0].tolist() == [9] and counts.tolist() == [2]


ROWS_YAML = """queries:
  - kind: rows
    name: last_1000_per_source
    group_by: [dst_port]
    aggregates: [{fn: count}, {fn: max, field: length}]
    window:
      rows: 1000
      slide: 100
      partition_by: [src_ip]
"""


def test_config_syntax() -> None:
    (q,) = load_rows(ROWS_YAML, "rows.yaml")
    assert q.window.pane_rows == 100 and q.window.partition_by == ["src_ip"]


@pytest.mark.parametrize(
    ("old", "new", "line", "reason"),
    [
        ("slide: 100", "slide: 2000", 8, "larger than rows"),
        ("rows: 1000", "rows: 0", 7, "must be positive"),
        ("partition_by: [src_ip]", "partition_by: [nope]", 9, "unknown field 'nope'"),
        ("partition_by: [src_ip]", "partition_by: [dst_port]", 9, "['dst_port'] also in group_by"),
        ("{fn: max, field: length}", "{fn: quantiles, field: length, q: [0.5]}", 5, "bounded aggregates"),
        ("slide: 100", "slide: 100\n      size: 3", 9, "unknown field"),
        ("rows: 1000", "rows: 1000001", 6, "more than 4096 panes"),
    ],
)
def test_config_errors_name_file_and_line(old: str, new: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rows(ROWS_YAML.replace(old, new), "rows.yaml")
    assert err.value.line == line, str(err.value)
    assert reason in str(err.value) and "rows.yaml" in str(err.value)


def test_main_loader_takes_row_windows_and_slide_by_tuple_and_refuses_partitions_with_the_reason() -> None:
    """Row windows and slide-by-tuple windows (with groups) run in the agent and the job: the main loader
    takes them beside the aggregates; what does not run (a slide-by-tuple window partitioned: its windows
    are the host's) is refused with file, line and reason, never ignored."""
    cfg = load_text(ROWS_YAML, "rows.yaml")
    assert [r.name for r in cfg.rows] == ["last_1000_per_source"] and cfg.queries == []
    partitioned = ROWS_YAML.replace("rows: 1000\n      slide: 100\n", "range: 5m\n      every: 10\n")
    with pytest.raises(ConfigError) as err:
        load_text(partitioned, "rows.yaml")
    assert "rows.yaml" in str(err.value) and "unknown field" in str(err.value)
    assert err.value.line == partitioned.splitlines().index("      partition_by: [src_ip]") + 1
    (q,) = load_text(partitioned.replace("      partition_by: [src_ip]\n", ""), "rows.yaml").rows
    assert (q.window.range_ns, q.window.every, q.group_by) == (300 * 10**9, 10, ["dst_port"])
    with pytest.raises(ConfigError) as err:  # one namespace of query names
        load_text(ROWS_YAML + ROWS_YAML.split("queries:\n")[1], "rows.yaml")
    assert err.value.line == 11 and "duplicate query name" in str(err.value)


def test_a_partial_of_an_emitted_window_is_counted_late_not_merged() -> None:
    """A host that breaks its promise (a partial below its punctuated count) changes no emitted window."""
    spec = _spec(10, 5, False, grouped=False)
    op = RowWindows(spec, 0, 1)
    none, key = np.zeros((1, 0), np.int64), np.zeros((1, 1), np.int64)
    op.add("h", none, np.array([0]), key, _lifted(spec, np.array([7])))
    op.punctuate("h", none, np.array([5]))
    assert op.close().values["count"].tolist() == [1]
    op.add("h", none, np.array([0]), key, _lifted(spec, np.array([9])))
    assert op.late == 1 and op.state_rows == 1
