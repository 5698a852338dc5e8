"""Roll-up tiers of holistic aggregates (issue #30): count_distinct (exact and HLL) and quantiles.

The job's own ResultStore writes the raw rows (each row keeps its sub-keys and their state, the raw
layout of a query with tiers), the real maintenance pass (Compactor: tiers, then compaction) folds them
into 5m and 1h tiers in two runs, and a reader folds the visible tier files. Every tier row is checked
against an oracle computed from the packets themselves (final and late-corrected ones; dropped ``late``
rows excluded): the exact distinct count, the HLL estimate of the union's registers, the quantile
sketch's nearest-rank bucket over all the packets, and the bounded aggregates riding along.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract import aggregates as A
from contract import query as Q
from contract import results as R
from contract import sketch
from high_level.results import tiers as T
from high_level.results.compact import Compactor
from high_level.results.store import ResultStore
from lowwater_testing.hosts import step_rows
from lowwater_testing.queries import config, query

BASE = datetime(2024, 5, 1, 23, 0, tzinfo=UTC)  # two days: the tiers' day directories split
MIN_NS = 60 * 10**9
PORTS = 5
HLL_P = 6
ACC = 0.02
Q_LIST = [0.5, 0.9, 0.99]
QUERIES = {
    "distinct_exact": {"fn": "count_distinct", "field": "src_port", "as": "d"},
    "distinct_hll": {
        "fn": "count_distinct",
        "field": "src_port",
        "approx": "hll",
        "precision": HLL_P,
        "as": "d",
    },
    "quantiles": {"fn": "quantiles", "field": "length", "q": Q_LIST, "accuracy": ACC, "as": "len"},
}


def _spec(tmp_path: Path, name: str) -> Q.QuerySpec:
    cfg = tmp_path / "q.yaml"
    aggs = ["count as packets", QUERIES[name], "variance(length) as len_var"]
    cfg.write_text(
        config(query(name, group_by=["dst_port"], aggregates=aggs, window="1m", tiers=["5m", "1h"])).text
    )
    return Q.load(str(cfg)).query(name)


def _subkey(q: Q.QuerySpec, src: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per packet: its holistic sub-key word and what it adds to the holistic state (registry lift)."""
    h = Q.holistic(q)
    assert h is not None
    if h.fn == "quantiles":
        return sketch.log_bucket(length, ACC), np.ones(len(length), np.int64)
    if h.approx == "hll":
        return sketch.hll_register_rank(src[:, None], HLL_P)
    return src, np.ones(len(src), np.int64)


def _rows(
    q: Q.QuerySpec, kind: str, w: int, port: int, src: np.ndarray, length: np.ndarray, b: int
) -> pd.DataFrame:
    """The generic rows the stateful step emits for one (window, kind, group): one per sub-key, the
    bounded aggregates' state over that sub-key's packets, then the holistic state."""
    sub, lifted = _subkey(q, src, length)
    merge = A.MERGE_UFUNCS[A.REGISTRY[Q.holistic(q).fn].parts(Q.holistic(q))[-1].merge]
    ws = int(BASE.timestamp()) * 10**9 + w * MIN_NS
    keys, states, late = [], [], []
    for s in np.unique(sub).tolist():
        m = sub == s
        state = []
        for a in q.aggregates:
            if a.holistic:
                continue
            values = length[m] if a.field else np.ones(int(m.sum()), np.int64)
            state += [
                int(A.MERGE_UFUNCS[p.merge].reduce(A.lift(p, values))) for p in A.REGISTRY[a.fn].parts(a)
            ]
        state.append(int(merge.reduce(lifted[m])))
        keys.append([port, int(s)])
        states.append(state)
        late.append(int(m.sum()) if kind != "final" else 0)
    n = len(keys)
    rows = step_rows(
        q, [w] * n, [ws] * n, [ws + MIN_NS] * n, keys, states, [kind] * n, ws // 10**6 + 61_000 + b
    )
    rows["late_partials"] = late
    return rows


def _traffic(q: Q.QuerySpec, n: int, seed: int = 5) -> tuple[list[pd.DataFrame], pd.DataFrame]:
    """Batch b closes minute b for some ports; every 4th also corrects minute b-3 (late packets folded
    in), every 6th drops late packets of minute b-2 (a ``late`` row: never part of a value). Returns
    the generic rows per batch and the packets the values hold (window, port, src_port, length)."""
    rng = np.random.default_rng(seed)
    batches, packets = [], []
    for b in range(n):
        rows: list[pd.DataFrame] = []
        todo = [
            ("final", b, int(p))
            for p in rng.choice(PORTS, size=int(rng.integers(2, PORTS + 1)), replace=False)
        ]
        if b >= 3 and b % 4 == 0:
            todo.append(("correction", b - 3, int(rng.integers(0, PORTS))))
        if b >= 2 and b % 6 == 0:
            todo.append(("late", b - 2, int(rng.integers(0, PORTS))))
        for kind, w, port in todo:
            k = int(rng.integers(1, 60)) if kind == "final" else 4
            src = rng.integers(1000, 1400 if kind == "final" else 5000, k).astype(np.int64)
            length = rng.integers(40, 1500, k).astype(np.int64)
            rows.append(_rows(q, kind, w, 1000 + port, src, length, b))
            if kind != "late":
                packets.append(pd.DataFrame({"w": w, "port": 1000 + port, "src": src, "length": length}))
        batches.append(pd.concat(rows, ignore_index=True))
    return batches, pd.concat(packets, ignore_index=True)


def _oracle(q: Q.QuerySpec, packets: pd.DataFrame, width_ns: int) -> pd.DataFrame:
    """Per (tier window, port) from the packets: what one window over all of them would answer."""
    h = Q.holistic(q)
    out = []
    ws = int(BASE.timestamp()) * 10**9 + packets["w"].to_numpy() * MIN_NS
    packets = packets.assign(tw=ws // width_ns * width_ns)
    for (tw, port), g in packets.groupby(["tw", "port"]):
        src, length = g["src"].to_numpy(np.int64), g["length"].to_numpy(np.int64)
        row = {"window_start_ns": tw, "dst_port": port, "packets": len(g)}
        n, s, sq = len(length), int(length.sum()), int((length * length).sum())
        row["len_var"] = (n * sq - s * s) / (n * n)
        if h.fn == "quantiles":
            buckets = np.sort(sketch.log_bucket(length, ACC))
            for x in Q_LIST:
                rank = int(np.ceil(round(x * n, 9)))
                row[f"len_{A.quantile_suffix(x)}"] = float(
                    sketch.bucket_value(buckets[rank - 1 : rank], ACC)[0]
                )
        elif h.approx == "hll":
            reg, rank = sketch.hll_register_rank(src[:, None], HLL_P)
            regs = pd.Series(rank).groupby(reg).max()
            est = sketch.hll_estimate(
                np.array([np.ldexp(1.0, -regs.to_numpy()).sum()]), np.array([len(regs)]), HLL_P
            )
            row["d"] = int(np.rint(est[0]))
            row["true_d"] = len(np.unique(src))
        else:
            row["d"] = len(np.unique(src))
        out.append(row)
    return pd.DataFrame(out).sort_values(["window_start_ns", "dst_port"]).reset_index(drop=True)


def _reader_fold(root: Path, q: Q.QuerySpec, tier: str) -> pd.DataFrame:
    """A reader's view of a tier: its visible files, every (tier window, key) folded across them."""
    files = []
    for _day, d in R.tier_date_dirs(root, q.name, tier):
        named = {e.name: r for e in os.scandir(d) if (r := R.tier_batch_range(e.name)) is not None}
        files += [d / n for n in R.visible_files(named)]
    for f in files:
        R.check_tier_schema(q, tier, pq.read_schema(f), where=str(f))
    tbl = T.fold(q, tier, pa.concat_tables([pq.read_table(f) for f in files]))
    t = tbl.drop_columns(R.subkey_columns(q)).to_pandas()
    t["window_start_ns"] = np.asarray(tbl["window_start"].cast(pa.int64()).to_numpy(), np.int64) * 1000
    return t.sort_values(["window_start_ns", "dst_port"]).reset_index(drop=True)


def _commit(ckpt: Path, through: int) -> None:
    d = ckpt / "oop-chunked" / "commits"
    d.mkdir(parents=True, exist_ok=True)
    for b in range(through + 1):
        (d / str(b)).touch()


@pytest.mark.parametrize("name", list(QUERIES))
def test_holistic_tiers_against_the_packets(tmp_path: Path, name: str) -> None:
    q = _spec(tmp_path, name)
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    batches, packets = _traffic(q, 75)
    store = ResultStore(root, [q])
    for b, rows in enumerate(batches[:40]):
        store.write_batch(b, rows)
    raw = pq.read_table(next(f for _d, d in R.date_dirs(root, q.name) for f in d.iterdir()))
    assert raw.schema == R.schema(q) and {c for c in R.subkey_columns(q)} <= set(raw.column_names)
    _commit(ckpt, 39)
    c = Compactor(root, [q], ckpt, grace_s=0)
    c.run_once()  # the tiers of batches 0..38; the windows these corrections reach get a second file
    for b, rows in enumerate(batches[40:], start=40):
        store.write_batch(b, rows)
    _commit(ckpt, len(batches))
    c.run_once()
    assert T.folded_through(root, q.name) == len(batches) - 1
    h = Q.holistic(q)
    for width in q.tiers:
        got = _reader_fold(root, q, R.tier_name(width))
        exp = _oracle(q, packets, width)
        assert len(got) == len(exp) > 0, width
        for col in ("window_start_ns", "dst_port", "packets"):
            assert got[col].astype("int64").tolist() == exp[col].astype("int64").tolist(), (width, col)
        assert np.allclose(got["len_var"], exp["len_var"], rtol=1e-12), width  # merged (n, sum, sum2)
        for col, _ in h.output_columns():
            assert got[col].tolist() == exp[col].tolist(), (width, col)  # the same sketch / exact set
        if h.fn == "count_distinct" and h.approx == "hll":  # and so the HLL's bound vs the true count
            true = exp["true_d"].to_numpy()
            assert (
                np.abs(got["d"].to_numpy() - true)
                <= np.maximum(4, 4 * sketch.hll_relative_error(HLL_P) * true)
            ).all()
        if h.fn == "count_distinct" and h.approx is None:  # more than one window's worth: the union
            assert (got["d"] > got["d"].min()).any()


def test_top_in_tiers_is_refused_with_the_reason() -> None:
    text = config(
        query(
            "t",
            group_by=["dst_port"],
            aggregates=[{"fn": "top", "field": "src_ip", "k": 3, "as": "b"}, "count as n"],
            window="1m",
            tiers=["5m"],
        )
    ).text
    with pytest.raises(Q.ConfigError) as e:
        Q.load_text(text, "t.yaml")
    assert "top: its stored rows are the k kept items" in str(e.value) and "t.yaml:" in str(e.value)
