"""The API over long ranges: stepped series, top-N over a range, the billing percentile, cursor paging.

A store of 1-minute windows spread over ~60 days (a few windows per day, with corrections and late
rows), written in the contract's layout; every answer is checked exactly against a pandas/numpy oracle
over the same rows, both from the Arrow cache and from Parquet directly.
"""

from __future__ import annotations

import base64
import json
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from contract import results as R
from contract.query import load
from high_level.serve import tierpick
from high_level.serve.api import create_app
from high_level.serve.ranges import GroupIds, nearest_rank_over_steps
from lowwater_testing.rangestore import (
    DAYS,
    Q,
    RangeStore,
    frame,
    make_range_store,
    with_tiers,
    write_part,
    write_tier,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RangeStore:
    return make_range_store(tmp_path_factory.mktemp("range") / "results")


def iso(t: datetime | pd.Timestamp) -> str:
    return pd.Timestamp(t).tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


def _values(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose values count (finals and corrections; a late row only annotates)."""
    return df[df["kind"].isin(["final", "correction"])]


def _span(store: RangeStore) -> tuple[datetime, datetime]:
    return store.first_day, store.first_day + timedelta(days=DAYS + 1)


# ---- ranges and steps
def test_long_range_needs_a_step(client: TestClient, store: RangeStore) -> None:
    s, e = _span(store)
    r = client.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e)})
    assert r.status_code == 400 and "add a step" in r.json()["detail"]
    r = client.get(f"/queries/{Q}/results", params={"start": iso(s), "end": iso(e)})
    assert r.status_code == 400 and "step" in r.json()["detail"]
    r = client.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e), "step": "1d"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tier"] == "raw" and body["step"] == "86400s" and body["start"] == iso(s)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"step": "7s"}, "multiple of the query's window slide"),
        ({"step": "abc"}, "not a duration"),
        ({"step": "0s"}, "between"),
        ({"step": "1m", "start": "-60d"}, "use a larger step"),
        ({"step": "1d", "start": "-500d"}, "longer than the maximum"),
        ({"step": "1h", "start": "now", "end": "-1h"}, "must be before"),
    ],
)
def test_bad_steps_are_400(client: TestClient, params: dict, needle: str) -> None:
    for path in ("series", "top", "percentile"):
        r = client.get(f"/queries/{Q}/{path}", params=params)
        assert r.status_code == 400 and needle in r.json()["detail"], (path, r.text)


@pytest.mark.parametrize(
    ("path", "params", "needle"),
    [
        ("top", {"by": "avg_len"}, "not an additive aggregate"),
        ("top", {"by": "nope"}, "not an additive aggregate"),
        ("top", {"n": "0"}, ""),
        ("top", {"n": "1001"}, ""),
        ("percentile", {"p": "0"}, "must be in (0, 100]"),
        ("percentile", {"p": "x"}, "not a number"),
        ("percentile", {"column": "max_len"}, "not an additive aggregate"),
        ("percentile", {"bogus": "1"}, "unknown parameter"),
        ("series", {"step": "1h", "filter": "nope:1"}, "cannot filter on"),
    ],
)
def test_bad_range_parameters_are_400(client: TestClient, path: str, params: dict, needle: str) -> None:
    r = client.get(f"/queries/{Q}/{path}", params=params)
    assert r.status_code in (400, 422), r.text
    assert needle in r.text


def test_steps_widen_the_range_to_whole_steps(client: TestClient, store: RangeStore) -> None:
    s = store.first_day + timedelta(days=3, hours=5, minutes=7)
    e = s + timedelta(days=10, minutes=1)
    body = client.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e), "step": "1d"}).json()
    assert body["start"] == iso(store.first_day + timedelta(days=3))
    assert body["end"] == iso(store.first_day + timedelta(days=14))


def _stepped_oracle(df: pd.DataFrame, s: datetime, step: timedelta) -> pd.DataFrame:
    v = _values(df).copy()
    b = pd.Timestamp(s) + ((v["window_start"] - pd.Timestamp(s)) // step) * step
    v["b"] = b
    v["_w"] = v["avg_len"] * v["packets"]
    g = v.groupby("b")
    out = pd.DataFrame(
        {
            "bytes": g["bytes"].sum(),
            "packets": g["packets"].sum(),
            "max_len": g["max_len"].max(),
            "avg_len": g["_w"].sum() / g["packets"].sum(),
        }
    )
    return out


@pytest.mark.parametrize("step", ["1d", "6h", "1h"])
def test_stepped_series_equals_the_oracle(client: TestClient, store: RangeStore, step: str) -> None:
    s, e = _span(store)
    if step == "1h":
        s, e = e - timedelta(days=20), e
    body = client.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e), "step": step}).json()
    got = pd.DataFrame(body["rows"], columns=body["columns"])
    width = pd.Timedelta(step)
    df = store.rows[Q]
    df = df[(df["window_start"] >= pd.Timestamp(s)) & (df["window_start"] < pd.Timestamp(e))]
    exp = _stepped_oracle(df, s, width)
    assert list(got["window_start"]) == [iso(b) for b in exp.index]
    assert list(got["window_end"]) == [iso(b + width) for b in exp.index]
    assert "groups" not in got.columns  # distinct groups do not add up across windows
    for c in ("bytes", "packets", "max_len"):
        assert got[c].tolist() == exp[c].astype(int).tolist(), c
    np.testing.assert_allclose(got["avg_len"].to_numpy(float), exp["avg_len"].to_numpy(float), rtol=1e-12)
    assert set(got["complete"]) <= {True, False}


# ---- top-N over a range
@pytest.mark.parametrize(
    ("params", "by"),
    [
        ({}, "bytes"),
        ({"by": "packets"}, "packets"),
        ({"step": "1d"}, "bytes"),
        ({"filter": "dst_ip_24:10.0.0.0/8"}, "bytes"),
    ],
)
def test_top_over_a_range_equals_the_oracle(
    client: TestClient, store: RangeStore, params: dict, by: str
) -> None:
    s, e = _span(store)
    if "step" not in params:
        s = e - timedelta(days=7)
    r = client.get(f"/queries/{Q}/top", params={"start": iso(s), "end": iso(e), "n": "4", **params})
    assert r.status_code == 200, r.text
    body = r.json()
    got = pd.DataFrame(body["rows"], columns=body["columns"])
    df = store.rows[Q]
    df = df[
        (df["window_start"] >= pd.Timestamp(body["start"])) & (df["window_start"] < pd.Timestamp(body["end"]))
    ]
    if "filter" in params:
        df = df[df["dst_ip_24"].str.startswith("10.")]
    v = _values(df)
    exp = v.groupby("dst_ip_24").agg(bytes=("bytes", "sum"), packets=("packets", "sum")).reset_index()
    exp["windows"] = exp["dst_ip_24"].map(
        v[v["kind"] == "final"].groupby("dst_ip_24")["window_start"].nunique()
    )
    exp["windows"] = exp["windows"].fillna(0).astype(int)
    exp = exp.sort_values([by, "dst_ip_24"], ascending=[False, True]).head(4)
    assert body["by"] == by and body["tier"] == "raw"
    assert got.columns.tolist() == ["dst_ip_24", "bytes", "packets", "windows", "rank"]
    assert got["dst_ip_24"].tolist() == exp["dst_ip_24"].tolist()
    assert (
        got[["bytes", "packets", "windows"]].values.tolist()
        == exp[["bytes", "packets", "windows"]].values.tolist()
    )
    assert got["rank"].tolist() == list(range(1, len(exp) + 1))
    # the late rows (10**9 bytes) never count
    assert got["bytes"].max() < 10**9


def test_top_over_a_range_of_two_key_columns(client: TestClient, store: RangeStore) -> None:
    s, e = _span(store)
    body = client.get(
        "/queries/q4_pairs/top", params={"start": iso(s), "end": iso(e), "step": "1d", "n": "5"}
    ).json()
    v = store.rows["q4_pairs"]
    exp = v.groupby(["src_ip", "dst_ip"], as_index=False)["packets"].sum()
    exp = exp.sort_values(["packets", "src_ip", "dst_ip"], ascending=[False, True, True]).head(5)
    got = [(r["src_ip"], r["dst_ip"], r["packets"]) for r in body["rows"]]
    assert got == list(exp.itertuples(index=False, name=None))


def test_top_group_ids_reset_keeps_the_answer(store: RangeStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense group ids a range top adds into are reset past max_groups (a new generation): sums
    computed with the old ids are never mixed with new ones, so the answer stays the oracle's."""
    monkeypatch.setattr(GroupIds, "max_groups", 4)  # fewer than the 6 groups: a reset on every file
    s, e = _span(store)
    with TestClient(create_app(store.config, store.root)) as c:
        for n in ("3", "6"):
            body = c.get(
                f"/queries/{Q}/top", params={"start": iso(s), "end": iso(e), "step": "1d", "n": n}
            ).json()
            v = _values(store.rows[Q])
            exp = v.groupby("dst_ip_24")["bytes"].sum().reset_index()
            exp = exp.sort_values(["bytes", "dst_ip_24"], ascending=[False, True]).head(int(n))
            assert [(r["dst_ip_24"], r["bytes"]) for r in body["rows"]] == list(
                exp.itertuples(index=False, name=None)
            )


def test_group_ids_tell_null_and_text_apart() -> None:
    """A key's parts as text, a null apart from any text, two columns never run together."""
    ids = GroupIds(["a", "b"])
    t = pa.table(
        {"a": pa.array(["x", None, "x", "", "xy"]), "b": pa.array([1, 1, None, 1, None], pa.int64())}
    )
    gen, got = ids.ids(t)
    assert len(set(got.tolist())) == 5
    _, again = ids.ids(t.take(pa.array([4, 3, 2, 1, 0])))
    assert again.tolist() == got.tolist()[::-1]
    assert ids.keys_of(got[[1, 2]]).to_pylist() == [{"a": None, "b": 1}, {"a": "x", "b": None}]


# ---- billing percentile
def test_nearest_rank_is_numpys_inverted_cdf() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        vals = rng.integers(0, 50, n)
        p = float(rng.choice([50, 90, 95, 99, 99.9, 100, 1, 33.3]))
        got = nearest_rank_over_steps({i * 10: int(v) for i, v in enumerate(vals)}, 0, n * 10, 10, p)
        assert got.value == int(np.percentile(vals, p, method="inverted_cdf")), (n, p)
        assert got.steps == n and got.max == vals.max()
        assert vals[got.at_us // 10] == got.value
    # empty steps count as zero samples
    got = nearest_rank_over_steps({0: 5}, 0, 100, 10, 95)
    assert (got.value, got.steps, got.empty) == (5, 10, 9)
    got = nearest_rank_over_steps({0: 5}, 0, 100, 10, 50)
    assert got.value == 0


@pytest.mark.parametrize(
    ("step", "p", "flt"),
    [("1h", "95", None), ("1d", "95", None), ("6h", "50", "8.8.8.0"), ("1h", "99", "10.9.9.0")],
)
def test_percentile_over_a_range_equals_numpy(
    client: TestClient, store: RangeStore, step: str, p: str, flt: str | None
) -> None:
    s, e = _span(store)
    params = {"start": iso(s), "end": iso(e), "step": step, "p": p, "column": "bytes"}
    if flt:
        params["filter"] = f"dst_ip_24:{flt}"
    r = client.get(f"/queries/{Q}/percentile", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    width = pd.Timedelta(step)
    s0, e0 = pd.Timestamp(body["start"]), pd.Timestamp(body["end"])
    v = _values(store.rows[Q])
    if flt:
        v = v[v["dst_ip_24"] == flt]
    v = v[(v["window_start"] >= s0) & (v["window_start"] < e0)]
    per = v.groupby(s0 + ((v["window_start"] - s0) // width) * width)["bytes"].sum()
    steps = pd.date_range(s0, e0, freq=width, inclusive="left")
    samples = np.array([int(per.get(t, 0)) for t in steps])
    assert body["steps"] == len(samples) and body["empty_steps"] == int((~steps.isin(per.index)).sum())
    assert body["method"] == "nearest-rank" and body["tier"] == "raw"
    assert body["value"] == int(np.percentile(samples, float(p), method="inverted_cdf"))
    assert body["max"] == samples.max()
    assert per.get(pd.Timestamp(body["at"]), 0) == body["value"]


# ---- cursor paging
def _walk(c: TestClient, query: str, params: dict, between: object = None) -> list[dict]:
    out: list[dict] = []
    r = c.get(f"/queries/{query}/results", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    pages = 0
    while True:
        out += body["rows"]
        pages += 1
        cur = body["paging"]["next_cursor"]
        if cur is None:
            return out
        if between is not None and pages == 2:
            between()  # type: ignore[operator]
        nxt = {k: v for k, v in params.items() if k not in ("start", "end")}
        r = c.get(f"/queries/{query}/results", params={**nxt, "cursor": cur})
        assert r.status_code == 200, r.text
        body = r.json()
        assert pages < 1000


@pytest.mark.parametrize("order_by", [None, "-packets", "dst_ip,-window_start", "packets,src_ip"])
def test_cursor_pages_cover_every_row_once(
    client: TestClient, store: RangeStore, order_by: str | None
) -> None:
    s = store.now - timedelta(days=5)
    params = {"start": iso(s), "end": iso(store.now), "limit": "7"}
    if order_by:
        params["order_by"] = order_by
    whole = client.get("/queries/q4_pairs/results", params={**params, "limit": "10000"}).json()
    assert whole["paging"]["next_cursor"] is None
    got = _walk(client, "q4_pairs", params)
    assert len(got) == len(whole["rows"]) > 20
    assert got == whole["rows"]  # same rows in the same order


def test_cursor_is_stable_under_concurrent_writes(tmp_path: Path) -> None:
    """A window written before the cursor's position shifts offset pages (a row seen twice); cursor
    pages see every original row exactly once and nothing twice."""
    st = make_range_store(tmp_path / "results", seed=4)
    spec = {q.name: q for q in load(st.config).stored_queries}["q4_pairs"]
    s = st.now - timedelta(days=6)
    original = st.rows["q4_pairs"]
    original = original[original["window_start"] >= pd.Timestamp(s)]

    def insert() -> None:  # a late-arriving window at the very start of the range
        df = frame(
            s + timedelta(minutes=1), 60, [{"src_ip": "10.0.0.0", "dst_ip": "1.1.1.1", "packets": 4}], "final"
        )
        write_part(st.root, spec, "q4_pairs", 10**6, df)

    with TestClient(create_app(st.config, st.root, cache_mb=0)) as c:
        params = {"start": iso(s), "end": iso(st.now), "limit": "5"}
        got = _walk(c, "q4_pairs", params, between=insert)
    seen = [(r["window_start"], r["src_ip"], r["dst_ip"]) for r in got]
    assert len(seen) == len(set(seen))
    exp = {
        (iso(w), a, b) for w, a, b in original[["window_start", "src_ip", "dst_ip"]].itertuples(index=False)
    }
    assert exp <= set(seen)


def test_cursor_misuse_is_400(client: TestClient, store: RangeStore) -> None:
    s = store.now - timedelta(days=5)
    body = client.get("/queries/q4_pairs/results", params={"start": iso(s), "limit": "3"}).json()
    cur = body["paging"]["next_cursor"]
    assert cur and body["paging"]["next_offset"] == 3
    for extra, needle in [
        ({"offset": "3"}, "not with top or offset"),
        ({"top": "2"}, "not with top or offset"),
        ({"filter": "src_ip:10.0.0.0/8"}, "another request"),
        ({"order_by": "-packets"}, "another request"),
    ]:
        r = client.get("/queries/q4_pairs/results", params={"cursor": cur, "limit": "3", **extra})
        assert r.status_code == 400 and needle in r.json()["detail"], extra
    doc = json.loads(base64.urlsafe_b64decode(cur + "=" * (-len(cur) % 4)))
    forged = [
        {**doc, "k": doc["k"][:-1]},
        {**doc, "k": ["x", *doc["k"][1:]]},
        {**doc, "k": [*doc["k"][:-1], 5]},
    ]
    forged_text = [base64.urlsafe_b64encode(json.dumps(d).encode()).decode() for d in forged]
    for bad in ["x", "e30", cur[:-3], "eyJmIjoxfQ", *forged_text]:
        r = client.get("/queries/q4_pairs/results", params={"cursor": bad})
        assert r.status_code == 400 and "cursor" in r.json()["detail"], bad


# ---- tier choice
def test_tier_choice_is_the_coarsest_not_coarser_than_the_step_that_covers_the_range() -> None:
    m, h, d = 60 * 10**9, 3600 * 10**9, 86400 * 10**9
    opts = [
        tierpick.TierOption("5m", 5 * m, 30 * d),
        tierpick.TierOption("1h", h, 400 * d),
        tierpick.TierOption("1d", d, None),
    ]
    now = 1000 * d
    assert tierpick.choose(opts, now - 10 * d, None, now) is None  # no step: raw
    assert tierpick.choose(opts, now - 10 * d, m, now) is None  # finer than every tier
    assert tierpick.choose(opts, now - 10 * d, 5 * m, now).name == "5m"
    assert tierpick.choose(opts, now - 10 * d, 30 * m, now).name == "5m"
    assert tierpick.choose(opts, now - 10 * d, h, now).name == "1h"
    assert tierpick.choose(opts, now - 10 * d, 7 * d, now).name == "1d"
    assert tierpick.choose(opts, now - 40 * d, 5 * m, now) is None  # 5m kept 30 days only
    assert tierpick.choose(opts, now - 500 * d, h, now) is None  # 1h kept 400 days
    assert tierpick.choose(opts, now - 500 * d, d, now).name == "1d"
    assert tierpick.choose(opts, now - 10 * d + m, h, now) is None  # not aligned to the tier
    assert tierpick.choose(opts, now - 10 * d, 7 * m, now) is None  # 7m is no multiple of 5m


# ---- answered from roll-up tiers (contract.results layout), exactly as from raw windows
@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, RangeStore]]:
    st = make_range_store(tmp_path_factory.mktemp("tiers") / "results", seed=8)
    cfg = with_tiers(st, Q, ["1h", "1d"], {"raw": "7d", "1h": "40d"})
    spec = {q.name: q for q in load(cfg).stored_queries}[Q]
    write_tier(st, spec, "1h")
    write_tier(st, spec, "1d")
    with TestClient(create_app(cfg, st.root)) as c:
        yield c, st


@pytest.mark.parametrize(
    ("step", "days", "tier"), [("1d", 61, "1d"), ("1h", 20, "1h"), ("1h", 50, "raw"), ("3h", 30, "1h")]
)
def test_stepped_series_from_a_tier_equals_the_raw_oracle(
    tiered: tuple[TestClient, RangeStore], step: str, days: int, tier: str
) -> None:
    c, st = tiered
    e = st.first_day + timedelta(days=DAYS + 1)
    s = e - timedelta(days=days)
    body = c.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e), "step": step}).json()
    assert body["tier"] == tier, body.get("detail")
    got = pd.DataFrame(body["rows"], columns=body["columns"])
    df = st.rows[Q]
    df = df[(df["window_start"] >= pd.Timestamp(s)) & (df["window_start"] < pd.Timestamp(e))]
    exp = _stepped_oracle(df, s, pd.Timedelta(step))
    assert list(got["window_start"]) == [iso(b) for b in exp.index]
    for col in ("bytes", "packets", "max_len"):
        assert got[col].tolist() == exp[col].astype(int).tolist(), col
    assert got["bytes"].max() < 10**12  # the covered tier file is never read
    np.testing.assert_allclose(got["avg_len"].to_numpy(float), exp["avg_len"].to_numpy(float), rtol=1e-9)


def test_top_and_percentile_from_a_tier_equal_the_raw_oracle(tiered: tuple[TestClient, RangeStore]) -> None:
    c, st = tiered
    s, e = st.first_day, st.first_day + timedelta(days=DAYS + 1)
    body = c.get(f"/queries/{Q}/top", params={"start": iso(s), "end": iso(e), "step": "1d", "n": "6"}).json()
    assert body["tier"] == "1d"
    v = _values(st.rows[Q])
    exp = v.groupby("dst_ip_24").agg(bytes=("bytes", "sum"), packets=("packets", "sum")).reset_index()
    exp = exp.sort_values(["bytes", "dst_ip_24"], ascending=[False, True])
    got = [(r["dst_ip_24"], r["bytes"], r["packets"]) for r in body["rows"]]
    assert got == list(exp.itertuples(index=False, name=None))
    windows = v.groupby("dst_ip_24")["window_start"].nunique()
    assert [r["windows"] for r in body["rows"]] == [int(windows[k]) for k in exp["dst_ip_24"]]
    body = c.get(f"/queries/{Q}/percentile", params={"start": iso(s), "end": iso(e), "step": "1d"}).json()
    assert body["tier"] == "1d"
    per = v.groupby(v["window_start"].dt.floor("1D"))["bytes"].sum()
    steps = pd.date_range(pd.Timestamp(body["start"]), pd.Timestamp(body["end"]), freq="1D", inclusive="left")
    samples = np.array([int(per.get(t, 0)) for t in steps])
    assert body["value"] == int(np.percentile(samples, 95, method="inverted_cdf"))


# ---- fuzzing the new parameters: never a 5xx
_KEYS = [
    "start",
    "end",
    "step",
    "by",
    "n",
    "p",
    "column",
    "filter",
    "cursor",
    "limit",
    "offset",
    "order_by",
    "top",
]
_VALS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["1h", "1d", "5m", "0", "-1", "1e308", "nan", "7s", "400d", "-60d", "now", "bytes", "packets"]
    ),
    st.sampled_from(
        ["eyJmIjoiIiwicyI6MCwiZSI6MSwiayI6W119", "eyJrIjpbW11dfQ", "x" * 50, "dst_ip_24:10.0.0.0/8"]
    ),
    st.integers(-(10**20), 10**20).map(str),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    endpoint=st.sampled_from(["series", "top", "percentile", "results"]),
    params=st.lists(st.tuples(st.sampled_from(_KEYS), _VALS), max_size=5),
)
def test_fuzz_range_parameters_never_5xx(client: TestClient, endpoint: str, params: list) -> None:
    try:
        r = client.get(f"/queries/{Q}/{endpoint}", params=params)
    except UnicodeEncodeError:
        return
    assert r.status_code < 500, (endpoint, params, r.text)


def test_reads_what_the_real_tier_writer_writes(tmp_path: Path) -> None:
    """Tiers built by the store's own roll-up (high_level/results/tiers.py) in two runs, so rows of one
    (tier window, key) lie in two files: the API's tier answers equal the raw oracle."""
    from high_level.results import tiers as T

    st = make_range_store(tmp_path / "results", seed=6)
    cfg = with_tiers(st, Q, ["1h", "1d"], {"raw": "7d", "1h": "40d"})
    spec = {q.name: q for q in load(cfg).stored_queries}[Q]
    last = max(R.parse_part_name(p.name) or 0 for p in st.root.rglob("part-*.parquet"))
    assert T.build(st.root, spec, last // 2) > 0 and T.build(st.root, spec, last) > 0
    s, e = st.first_day, st.first_day + timedelta(days=DAYS + 1)
    v = _values(st.rows[Q])
    with TestClient(create_app(cfg, st.root, cache_mb=0)) as c:
        body = c.get(f"/queries/{Q}/series", params={"start": iso(s), "end": iso(e), "step": "1d"}).json()
        assert body["tier"] == "1d"
        exp = _stepped_oracle(st.rows[Q], s, pd.Timedelta("1d"))
        got = pd.DataFrame(body["rows"], columns=body["columns"])
        assert got["bytes"].tolist() == exp["bytes"].astype(int).tolist()
        assert got["max_len"].tolist() == exp["max_len"].astype(int).tolist()
        np.testing.assert_allclose(got["avg_len"].to_numpy(float), exp["avg_len"].to_numpy(float), rtol=1e-9)
        # a top sums whole days from 1d, the edges from 1h (kept 40 days) or raw windows
        for start, step, parts in [
            (s, "1h", ["1d"]),  # 1h kept 40 days: not for a 61-day range; its whole days from 1d
            (e - timedelta(days=30, hours=-5), "1h", ["1h", "1d"]),
            (e - timedelta(days=30, hours=-5, minutes=-7), "1m", ["raw", "1h", "1d"]),
        ]:
            params = {"start": iso(start), "end": iso(e), "n": "3", **({"step": step} if step else {})}
            top = c.get(f"/queries/{Q}/top", params=params).json()
            assert [p["tier"] for p in top["tiers"]] == parts and top["tier"] == "1d"
            w = v[v["window_start"] >= pd.Timestamp(top["start"])]
            exp_top = (
                w.groupby("dst_ip_24")["bytes"]
                .sum()
                .reset_index()
                .sort_values(["bytes", "dst_ip_24"], ascending=[False, True])
            )
            assert [(r["dst_ip_24"], r["bytes"]) for r in top["rows"]] == list(
                exp_top.head(3).itertuples(index=False, name=None)
            )
