"""Slide-by-tuple windows with FCA bins (dissertation §5.1.5, §6.1.4) against a brute-force oracle: every
``every``-th row's window over the rows of the last RANGE, rows arriving shuffled within each punctuation, restarts
between them."""

from __future__ import annotations

import numpy as np
import pytest

from contract import aggregates as A
from contract.query.configfile import ConfigError, load_rows
from high_level.rows.bytuple import SlideByTuple

OPS = (A.MERGE_SUM, A.MERGE_SUM, A.MERGE_MIN, A.MERGE_MAX)  # count, sum, min, max of a value


def _lift(v: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(v), np.int64), v, v, v])


@pytest.mark.parametrize(
    ("range_ns", "every", "step", "seed"),
    [(50, 1, 5, 1), (200, 7, 5, 2), (1_000, 3, 5, 3), (30, 25, 5, 4), (5_000, 1, 500, 5), (900, 4, 100, 6)],
)
def test_slide_by_tuple_matches_oracle(range_ns: int, every: int, step: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 2_000
    ts = np.cumsum(rng.integers(0, step, n)) + rng.integers(
        -4 * step, 4 * step + 1, n
    )  # capture order, disordered
    ts[rng.random(n) < 0.05] = ts[0]  # and equal timestamps
    v = rng.integers(40, 1500, n)
    op = SlideByTuple(range_ns, every, OPS)
    got, i = [], 0
    while i < n:
        j = min(n, i + int(rng.integers(1, 200)))
        sel = rng.permutation(np.arange(i, j))  # arrival disorder within the chunk
        for part in np.array_split(sel, int(rng.integers(1, 4))):
            op.add(ts[part], part, _lift(v[part]))
        mark = int(ts[j:].min()) if j < n else int(ts.max()) + 1  # every row below it has been sent
        if i == 0 or rng.random() < 0.1:  # a restart: the state saved and restored into a new operator
            blob, op = op.snapshot(), SlideByTuple(range_ns, every, OPS)
            op.restore(blob)
        t, r, _, st = op.close(mark)
        got += list(zip(t, r, st, strict=True))
        i = j
    assert op.late == 0
    want = []
    for r in range(every - 1, n, every):
        inside = (ts > ts[r] - range_ns) & (ts <= ts[r])
        lifted = _lift(v[inside])
        want.append((ts[r], r, tuple(int(A.MERGE_UFUNCS[o].reduce(lifted[:, c])) for c, o in enumerate(OPS))))
    got_t = sorted((int(t), int(r), tuple(int(x) for x in s)) for t, r, s in got)
    assert len(got_t) == n // every
    assert sorted(got_t, key=lambda x: x[1]) == sorted(want, key=lambda x: x[1])


@pytest.mark.parametrize(
    ("range_ns", "every", "groups", "seed"), [(200, 7, 4, 7), (1_000, 1, 3, 8), (60, 3, 40, 9)]
)
def test_grouped_slide_by_tuple_matches_oracle(range_ns: int, every: int, groups: int, seed: int) -> None:
    """Windows are the host's (every ``every``-th row of all groups); each reports every group with rows in
    its RANGE. Shuffled arrival, equal timestamps, restarts, groups first seen late."""
    rng = np.random.default_rng(seed)
    n = 1_500
    ts = np.cumsum(rng.integers(0, 5, n)) + rng.integers(-20, 21, n)
    ts[rng.random(n) < 0.05] = ts[0]
    v = rng.integers(40, 1500, n)
    key = np.column_stack([rng.integers(0, groups, n), rng.integers(0, 2, n) * 7])
    op, got, i = SlideByTuple(range_ns, every, OPS, key_words=2), [], 0
    while i < n:
        j = min(n, i + int(rng.integers(1, 150)))
        sel = rng.permutation(np.arange(i, j))
        op.add(ts[sel], sel, _lift(v[sel]), key[sel])
        if rng.random() < 0.2:
            blob, op = op.snapshot(), SlideByTuple(range_ns, every, OPS, key_words=2)
            op.restore(blob)
        t, r, k, st = op.close(int(ts[j:].min()) if j < n else int(ts.max()) + 1)
        got += [
            (int(a), int(b), tuple(c.tolist()), tuple(d.tolist()))
            for a, b, c, d in zip(t, r, k, st, strict=True)
        ]
        i = j
    want = []
    for r in range(every - 1, n, every):
        inside = (ts > ts[r] - range_ns) & (ts <= ts[r])
        for g in np.unique(key[inside], axis=0):
            sel = inside & (key == g).all(axis=1)
            lifted = _lift(v[sel])
            want.append(
                (
                    int(ts[r]),
                    r,
                    tuple(g.tolist()),
                    tuple(int(A.MERGE_UFUNCS[o].reduce(lifted[:, c])) for c, o in enumerate(OPS)),
                )
            )
    assert op.late == 0 and len(want) > n // every
    assert sorted(got) == sorted(want)


def test_state_is_bins_of_the_last_range() -> None:
    """Two bins per row of the last RANGE and the open windows, never the whole stream."""
    op = SlideByTuple(100, 1, OPS)
    for k in range(50):
        ts = np.arange(k * 100, (k + 1) * 100)
        op.add(ts, ts, _lift(ts))
        op.close(int(ts[-1]) + 1)
        assert op.state_rows <= 2 * 100 + 2


def test_grouped_state_is_the_groups_of_the_last_range() -> None:
    """Groups that leave the last RANGE leave no bin and no key behind: the state follows the live groups."""
    op = SlideByTuple(100, 1, OPS, key_words=1)
    for k in range(50):
        ts = np.arange(k * 100, (k + 1) * 100)
        op.add(ts, ts, _lift(ts), np.full((100, 1), k))  # a new group each RANGE
        op.close(int(ts[-1]) + 1)
        assert op.state_rows <= 2 * 100 + 2 + 2 and len(op.keys) <= 2


def test_a_row_after_the_purge_starts_from_the_bin_below_the_mark() -> None:
    """Rows at 0, 10, 20 (RANGE 100); the mark at 25 purges their start bins; a row at 30 must still count
    them (its new bin splits the kept bin below the mark)."""
    op = SlideByTuple(100, 1, (A.MERGE_SUM,))
    op.add(np.array([0, 10, 20]), np.array([0, 1, 2]), np.ones((3, 1), np.int64))
    assert op.close(25)[3].ravel().tolist() == [1, 2, 3]
    op.add(np.array([30]), np.array([3]), np.ones((1, 1), np.int64))
    assert op.close(31)[3].ravel().tolist() == [4]


BY_TUPLE_YAML = """queries:
  - kind: rows
    name: max_len_5m_every_10
    aggregates: [{fn: count}, {fn: max, field: length}]
    window:
      range: 5m
      every: 10
"""


def test_config_and_operator_of_a_query() -> None:
    (q,) = load_rows(BY_TUPLE_YAML, "q.yaml")
    op = SlideByTuple.of(q)
    assert (op.range_ns, op.every, tuple(op.ops)) == (
        300 * 10**9,
        10,
        (A.MERGE_SUM, A.MERGE_MAX, A.MERGE_SUM),
    )


@pytest.mark.parametrize(
    ("old", "new", "line", "reason"),
    [
        ("every: 10", "every: 0", 7, "greater than 0"),
        ("range: 5m", "range: 5 parsecs", 6, ""),
        ("    aggregates:", "    group_by: [no_such]\n    aggregates:", 4, "unknown field"),
        ("every: 10", "every: 10\n      slide: 3", 8, "unknown field"),
    ],
)
def test_config_errors_name_file_and_line(old: str, new: str, line: int, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rows(BY_TUPLE_YAML.replace(old, new), "q.yaml")
    assert err.value.line == line and reason in str(err.value), str(err.value)


def test_a_row_below_the_mark_is_counted_late_not_merged() -> None:
    op = SlideByTuple(100, 1, (A.MERGE_SUM,))
    op.add(np.array([10]), np.array([0]), np.ones((1, 1), np.int64))
    assert op.close(20)[3].ravel().tolist() == [1]
    op.add(np.array([15]), np.array([1]), np.ones((1, 1), np.int64))
    assert op.late == 1 and op.close(30)[0].size == 0
