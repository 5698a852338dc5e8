"""A filtered series over roll-up tier files: only the row groups whose key range may hold the filter's
keys are read (high_level/serve/tierfiles.py), and the answer equals the raw windows' oracle exactly.

Tiers are built by the store's own roll-up (high_level/results/tiers.py) in two runs, with tiny row
groups so one group's rows span two row groups and two files; every filter kind (an address, a prefix
on octets, a CIDR range, an IPv6 range, several values of one column, a later key column alone) is
checked against pandas over the raw rows, and against DuckDB's plain scan of the same files.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from contract import results as R
from contract.query import load
from high_level.results import tiers as T
from high_level.serve import params as P
from high_level.serve.api import create_app
from high_level.serve.tierfiles import KeyStats, TierFiles, may_hold, text_prefix
from lowwater_testing.rangestore import DAYS, Q, RangeStore, make_range_store, with_tiers

PAIRS = "q4_pairs"


def iso(t: object) -> str:
    return pd.Timestamp(t).tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, RangeStore]]:
    st = make_range_store(tmp_path_factory.mktemp("series") / "results", seed=5)
    cfg = with_tiers(st, [Q, PAIRS], ["1h", "1d"], {"raw": "7d", "1h": "40d"})
    specs = {q.name: q for q in load(cfg).stored_queries}
    last = max(R.parse_part_name(p.name) or 0 for p in st.root.rglob("part-*.parquet"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "ROW_GROUP", 4)  # a group's rows over two row groups, many row groups per file
        for q in (Q, PAIRS):
            assert T.build(st.root, specs[q], last // 2) > 0 and T.build(st.root, specs[q], last) > 0
    with TestClient(create_app(cfg, st.root, cache_mb=0)) as c:
        yield c, st


def _match(df: pd.DataFrame, column: str, text: str) -> pd.Series:
    """The oracle of one filter value: an address or a prefix, by Python's ipaddress."""
    import ipaddress

    net = ipaddress.ip_network(text, strict=False)
    return df[column].map(lambda a: a is not None and ipaddress.ip_address(a) in net)


def _oracle(df: pd.DataFrame, s: pd.Timestamp, step: pd.Timedelta, aggs: list[str]) -> pd.DataFrame:
    v = df[df["kind"].isin(["final", "correction"])].copy()
    v["b"] = s + ((v["window_start"] - s) // step) * step
    g = v.groupby("b")
    out = {a: g[a].max() if a == "max_len" else g[a].sum() for a in aggs if a != "avg_len"}
    if "avg_len" in aggs:
        v["_w"] = v["avg_len"] * v["packets"]
        out["avg_len"] = v.groupby("b")["_w"].sum() / g["packets"].sum()
    return pd.DataFrame(out)


CASES = [
    (PAIRS, [("src_ip", "10.0.1.2"), ("dst_ip", "8.8.8.8")]),
    (PAIRS, [("src_ip", "10.0.0.3"), ("src_ip", "10.0.2.0")]),  # OR within a column
    (PAIRS, [("src_ip", "10.0.1.0/24")]),  # a prefix on octets
    (PAIRS, [("src_ip", "10.0.0.0/23"), ("dst_ip", "2001:db8:aa::/48")]),  # a CIDR range, an IPv6 one
    (PAIRS, [("dst_ip", "10.9.9.9")]),  # a later key column alone: the footer narrows nothing
    (Q, [("dst_ip_24", "2001:db8:bb::")]),  # corrections and late rows (late rows only annotate)
    (Q, [("dst_ip_24", "10.9.9.0/24"), ("dst_ip_24", "8.8.0.0/16")]),
]


@pytest.mark.parametrize(("query", "filters"), CASES)
@pytest.mark.parametrize(("step", "days", "tier"), [("1h", 20, "1h"), ("1d", 61, "1d")])
def test_filtered_tier_series_equals_the_raw_oracle(
    tiered: tuple[TestClient, RangeStore], query: str, filters: list, step: str, days: int, tier: str
) -> None:
    c, st = tiered
    e = st.first_day + timedelta(days=DAYS + 1)
    s = e - timedelta(days=days)
    params = [("start", iso(s)), ("end", iso(e)), ("step", step)]
    params += [("filter", f"{col}:{v}") for col, v in filters]
    body = c.get(f"/queries/{query}/series", params=params).json()
    assert body["tier"] == tier, body
    got = pd.DataFrame(body["rows"], columns=body["columns"])
    df = st.rows[query]
    df = df[(df["window_start"] >= pd.Timestamp(s)) & (df["window_start"] < pd.Timestamp(e))]
    keep = pd.Series(True, index=df.index)
    for col in {col for col, _ in filters}:
        keep &= np.logical_or.reduce([_match(df, col, v) for c2, v in filters if c2 == col])
    df = df[keep]
    assert len(df) > 0
    aggs = ["packets"] if query == PAIRS else ["bytes", "packets", "max_len", "avg_len"]
    exp = _oracle(df, pd.Timestamp(s), pd.Timedelta(step), aggs)
    assert list(got["window_start"]) == [iso(b) for b in exp.index]
    for a in aggs:
        if a == "avg_len":
            np.testing.assert_allclose(got[a].to_numpy(float), exp[a].to_numpy(float), rtol=1e-9)
        else:
            assert got[a].tolist() == exp[a].astype(int).tolist(), a
    late = df[df["kind"] == "late"]
    if len(late):  # a step with a late row is incomplete and counts its late partials
        lb = set(
            pd.Timestamp(s)
            + ((late["window_start"] - pd.Timestamp(s)) // pd.Timedelta(step)) * pd.Timedelta(step)
        )
        flagged = got[got["late_partials"] > 0]["window_start"].tolist()
        assert sorted(flagged) == sorted(iso(b) for b in lb)
        assert not got[got["late_partials"] > 0]["complete"].any()


def test_row_group_reads_equal_duckdb_scans(tiered: tuple[TestClient, RangeStore]) -> None:
    """The same series with every file left to DuckDB's scan (no row groups read by pyarrow)."""
    c, st = tiered
    e = st.first_day + timedelta(days=DAYS + 1)
    params = [("start", iso(e - timedelta(days=20))), ("end", iso(e)), ("step", "1h")]
    params += [("filter", "src_ip:10.0.0.0/23"), ("filter", "dst_ip:8.8.8.8")]
    fast = c.get(f"/queries/{PAIRS}/series", params=params).json()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TierFiles, "max_pruned_rows", 0)
        slow = c.get(f"/queries/{PAIRS}/series", params=params).json()
    assert slow.get("rows") and fast["rows"] == slow["rows"]


def test_the_footer_narrows_a_sorted_file_to_the_keys_row_groups(
    tiered: tuple[TestClient, RangeStore],
) -> None:
    """Sorted by key: the row groups picked for one source are exactly those holding its rows."""
    _, st = tiered
    path = max(st.root.glob(f"query={PAIRS}/tier=1d/date=*/part-*.parquet"), key=lambda p: p.stat().st_size)
    ks = KeyStats.of(pq.read_metadata(path), ["src_ip", "dst_ip"])
    src = np.array(pq.read_table(path, columns=["src_ip"])["src_ip"].to_pylist())
    assert len(ks.rows) > 4 and sum(ks.rows) == len(src)
    starts = np.cumsum([0, *ks.rows])
    for a in ("10.0.1.2", "10.0.0.0", "10.0.2.3"):
        rows = np.flatnonzero(src == a)
        assert len(rows)
        holding = sorted({int(np.searchsorted(starts, r, side="right") - 1) for r in rows})
        assert ks.pick([P.KeyFilter("src_ip", "eq", a, a)]) == holding
    assert ks.pick([P.KeyFilter("src_ip", "eq", "10.0.9.9", "x")]) == []
    pre = ks.pick([_f("10.0.1.0/24", "src_ip")])
    assert 0 < len(pre) < len(ks.rows)


def _f(text: str, column: str = "a") -> P.KeyFilter:
    return P.parse_filters([(column, text)], {column: "ip"})[0]


def test_text_bounds_of_filters() -> None:
    assert text_prefix(_f("10.1.0.0/16")) == "10.1."
    assert text_prefix(_f("10.0.0.0/23")) == "10.0."  # octets both ends share
    assert text_prefix(_f("10.0.0.0/7")) is None
    assert text_prefix(_f("2001:db8:aa::/48")) == "2001:db8:aa:"
    assert text_prefix(_f("2001:0:aa::/48")) == "2001:"  # a zero group may print as '::'
    assert text_prefix(_f("::/8")) is None
    assert may_hold(_f("10.1.2.3"), "10.1.0.0", "10.1.9.9")
    assert not may_hold(_f("10.1.2.3"), "10.1.3.0", "10.1.9.9")
    assert may_hold(_f("10.1.0.0/16"), "10.0.0.0", "10.1.0.0")
    assert may_hold(_f("10.1.0.0/16"), "10.1.200.1", "10.2.0.0")
    assert not may_hold(_f("10.1.0.0/16"), "10.10.0.0", "10.2.0.0")  # text order: "10.10." > "10.1."
    assert not may_hold(_f("10.1.0.0/16"), "10.2.0.0", "10.3.0.0")
    assert not may_hold(_f("10.1.0.0/16"), "10.0.0.0", "10.0.9.9")
    assert may_hold(_f("10.1.0.0/17"), "10.1.0.0", "10.1.0.0")  # a range: by its shared octets
    assert may_hold(_f("0.0.0.0/0"), "a", "b") and may_hold(_f("10.1.2.3"), None, None)
    assert may_hold(P.KeyFilter("p", "eq", 443, "443"), 80, 8080)
    assert not may_hold(P.KeyFilter("p", "eq", 443, "443"), 1000, 8080)


def test_a_cached_listing_sees_files_renamed_in_and_out(
    tiered: tuple[TestClient, RangeStore], tmp_path: Path
) -> None:
    """A date directory's listing is kept while its mtime is unchanged (files enter and leave by
    rename or unlink only, which set it): a merged file renamed in, then removed, is seen both times."""
    import os
    import shutil
    import time

    _, st = tiered
    spec = {q.name: q for q in load(st.config.with_name("lowwater-range-tiers.yaml")).stored_queries}[PAIRS]
    src = max(st.root.glob(f"query={PAIRS}/tier=1h/date=*"), key=lambda d: len(list(d.iterdir())))
    root = tmp_path / "r"
    day = root / src.relative_to(st.root)
    shutil.copytree(src, day)
    tf = TierFiles(root)

    def settle() -> None:  # the directory last changed a minute ago: its listing is kept
        ago = time.time_ns() - 60 * 10**9
        os.utime(day, ns=(ago, ago))

    settle()
    before = tf.files(spec, "1h", 0, 1 << 62)
    assert len(before) == 2 and str(day) in tf._listed  # two runs' files
    ranges = [R.tier_batch_range(Path(p).name) for p in before]
    merged = day / R.tier_part_name(min(a for a, _ in ranges), max(b for _, b in ranges))
    T.write_atomic(T.merge_files(spec, "1h", [Path(p) for p in before]), merged)
    assert tf.files(spec, "1h", 0, 1 << 62) == [str(merged)]  # covers both
    settle()
    assert tf.files(spec, "1h", 0, 1 << 62) == [str(merged)] and tf._listed[str(day)][1] == [str(merged)]
    merged.unlink()
    assert tf.files(spec, "1h", 0, 1 << 62) == before


def test_tier_files_are_written_in_small_row_groups(tmp_path: Path) -> None:
    """The tier writer (and the compactor's merge of a tier, which writes through it) cuts files into
    ``ROW_GROUP``-row row groups: what a one-group read's cost rests on."""
    import pyarrow as pa

    T.write_atomic(pa.table({"a": pa.array(range(2 * T.ROW_GROUP + 5))}), tmp_path / "t.parquet")
    meta = pq.read_metadata(tmp_path / "t.parquet")
    rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert rows == [T.ROW_GROUP, T.ROW_GROUP, 5] and T.ROW_GROUP == 4_096
    assert meta.row_group(0).column(0).compression == "ZSTD"
