"""The serving layer's REST API against a fixture results store (see lowwater_testing/store.py).

Every endpoint, key filters (exact, IPv4 and IPv6 prefixes), ordering, top-N, paging, CSV, the latest
window, status, auth, metrics, 4xx for bad parameters and injection attempts, and fuzzing (hypothesis
over parameter dicts, schemathesis over the OpenAPI schema when installed) asserting no 5xx. Result
tests run twice: with the in-memory cache (the fast paths) and with it disabled (DuckDB over Parquet).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # starlette's note that its TestClient will move to httpx2
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from contract import results as R
from contract.query import load
from high_level.serve.api import create_app
from high_level.serve.columns import QueryInfo
from high_level.serve.params import parse_filters
from high_level.serve.reader import Reader
from lowwater_testing.store import (
    DST24,
    INCOMPLETE_DEAD,
    INCOMPLETE_LATE,
    PORTS,
    Store,
    folded,
    iso,
    make_store,
    result_schema,
    write_status,
)

Q4_KEYS = ["src_ip", "dst_ip"]
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return make_store(tmp_path_factory.mktemp("api") / "results")


@pytest.fixture(scope="module")
def plain(store: Store) -> Iterator[TestClient]:
    """One client (cached) for tests that do not depend on the read path."""
    with TestClient(create_app(store.config, store.root)) as c:
        yield c


@pytest.fixture(scope="module")
def authed(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(store.config, store.root, token=TOKEN)) as c:
        yield c


def all_rows(c: TestClient, query: str, **params: str) -> dict:
    r = c.get(f"/queries/{query}/results", params={"limit": "10000", **params})
    assert r.status_code == 200, r.text
    return r.json()


def frame(body: dict) -> pd.DataFrame:
    return pd.DataFrame(body["rows"], columns=body["columns"])


def expected_q4(store: Store) -> pd.DataFrame:
    e = folded(store, "q4_pairs", Q4_KEYS)
    e["window_start"] = e["window_start"].map(iso)
    return e


# ---- health, queries
def test_health_is_open(authed: TestClient) -> None:
    r = authed.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_queries_list_definitions_windows_columns(plain: TestClient) -> None:
    body = plain.get("/queries").json()
    by = {q["name"]: q for q in body["queries"]}
    assert list(by) == ["q4_pairs", "bytes_per_dst24", "syn_per_port", "avg_only"]
    q4 = by["q4_pairs"]
    assert q4["definition"]["group_by"] == ["src_ip", "dst_ip"]
    assert "name: q4_pairs" in q4["yaml"] and "filter: ip_version == 4" in q4["yaml"]
    assert q4["window"]["range_ns"] == 60 * 10**9 and q4["window"]["tumbling"] is True
    assert [(k["name"], k["kind"], k["type"]) for k in q4["key_columns"]] == [
        ("src_ip", "ip", "string"),
        ("dst_ip", "ip", "string"),
    ]
    assert [(a["name"], a["fn"], a["type"]) for a in q4["aggregate_columns"]] == [
        ("packets", "count", "int64")
    ]
    b = by["bytes_per_dst24"]
    assert [k["name"] for k in b["key_columns"]] == ["dst_ip_24"] and b["key_columns"][0]["prefix4"] == 24
    assert {a["name"]: a["type"] for a in b["aggregate_columns"]}["avg_len"] == "float64"
    assert b["avg_exact"] is True and by["avg_only"]["avg_exact"] is False
    s = by["syn_per_port"]
    assert s["window"]["slide_ns"] == 10 * 10**9 and not s["window"]["tumbling"]
    assert s["key_columns"][0]["type"] == "int64"
    assert "results" in q4["links"]


def test_query_one_and_unknown(plain: TestClient) -> None:
    assert plain.get("/queries/syn_per_port").json()["name"] == "syn_per_port"
    r = plain.get("/queries/nope")
    assert r.status_code == 404 and "unknown query" in r.json()["detail"]
    for path in ("/queries/nope/results", "/queries/nope/latest", "/queries/nope/series"):
        assert plain.get(path).status_code == 404


# ---- results
def test_results_default_range_with_corrections_folded(client: TestClient, store: Store) -> None:
    body = all_rows(client, "q4_pairs")
    got = frame(body)
    exp = expected_q4(store)
    assert body["paging"]["total"] == len(exp) == len(got)
    merged = got.merge(exp, on=["window_start", *Q4_KEYS], suffixes=("", "_exp"))
    assert len(merged) == len(exp)
    assert (merged["packets"] == merged["packets_exp"]).all()
    assert (merged["corrections"] == merged["corrections_exp"]).all()
    assert got["corrections"].sum() == 8
    only = got[got["src_ip"] == "10.77.0.1"]  # a group that only exists as corrections
    assert len(only) == 2 and set(only["packets"]) == {5}
    assert set(got.columns) >= {"window_end", "hosts", "closed_at"}
    assert got["window_end"].iloc[0].endswith("Z") and got["hosts"].iloc[0] == 2


def test_fold_sum_count_max_and_weighted_avg(client: TestClient, store: Store) -> None:
    got = frame(all_rows(client, "bytes_per_dst24"))
    exp = folded(store, "bytes_per_dst24", ["dst_ip_24"])
    exp["window_start"] = exp["window_start"].map(iso)
    m = got.merge(exp, on=["window_start", "dst_ip_24"], suffixes=("", "_exp"))
    assert len(m) == len(exp) == len(got)
    for c in ("bytes", "packets", "max_len", "corrections"):
        assert (m[c] == m[f"{c}_exp"]).all(), c
    assert np.allclose(m["avg_len"], m["avg_len_exp"])
    row = m[
        (m["window_start"] == iso(store.first + timedelta(minutes=2))) & (m["dst_ip_24"] == DST24[1])
    ].iloc[0]
    assert row["corrections"] == 1 and row["max_len"] >= 1450


def test_avg_without_count_keeps_the_final_value(client: TestClient, store: Store) -> None:
    got = frame(all_rows(client, "avg_only"))
    row = got[
        (got["window_start"] == iso(store.first + timedelta(minutes=5))) & (got["src_port"] == PORTS[0])
    ].iloc[0]
    final = store.rows["avg_only"]
    fin = final[
        (final["kind"] == "final")
        & (final["src_port"] == PORTS[0])
        & (final["window_start"] == pd.Timestamp(store.first + timedelta(minutes=5)))
    ]["avg_len"].iloc[0]
    assert row["avg_len"] == fin != 9999.0  # documented: avg cannot be folded without a count
    assert row["min_ttl"] == 1 and row["corrections"] == 1  # min is folded


@pytest.mark.parametrize("fmt", ["iso", "epoch", "naive", "offset"])
def test_time_range_parameters(client: TestClient, store: Store, fmt: str) -> None:
    s, e = store.first + timedelta(minutes=5), store.first + timedelta(minutes=8)
    conv = {
        "iso": lambda t: iso(t),
        "epoch": lambda t: str(int(t.timestamp())),
        "naive": lambda t: t.replace(tzinfo=None).isoformat(),
        "offset": lambda t: t.astimezone(__import__("datetime").timezone(timedelta(hours=2))).isoformat(),
    }[fmt]
    body = all_rows(client, "q4_pairs", start=conv(s), end=conv(e))
    wins = sorted(set(frame(body)["window_start"]))
    assert wins == [iso(s + timedelta(minutes=i)) for i in range(3)]  # [start, end): end is exclusive
    assert body["start"] == iso(s) and body["end"] == iso(e)


def test_relative_time(client: TestClient) -> None:
    body = all_rows(client, "q4_pairs", start="now-3m")
    assert body["paging"]["total"] == 0  # the newest fixture window started > 3 minutes ago
    assert all_rows(client, "q4_pairs", start="-90m", end="now")["paging"]["total"] > 0


def test_default_range_follows_the_newest_window_of_a_replay(tmp_path: Path) -> None:
    """A store whose windows are three days old (a replayed or stopped capture): without start/end, /results,
    /series and /incomplete cover the hour up to its newest closed window, not the last hour of the clock."""
    old = make_store(tmp_path / "results", now=datetime.now(UTC) - timedelta(days=3))
    with TestClient(create_app(old.config, old.root)) as c:
        body = all_rows(c, "q4_pairs")
        exp = expected_q4(old)
        assert body["paging"]["total"] == len(exp) > 0
        assert set(frame(body)["window_start"]) == set(exp["window_start"])
        newest = max(exp["window_start"])
        assert body["end"] == iso(
            datetime.fromisoformat(newest.replace("Z", "+00:00")) + timedelta(minutes=1)
        )
        series = c.get("/queries/q4_pairs/series").json()
        assert {r["window_start"] for r in series["rows"]} == set(exp["window_start"])
        assert c.get("/queries/q4_pairs/incomplete").json()["end"] == body["end"]
        assert (
            all_rows(c, "q4_pairs", start="-1h")["paging"]["total"] == 0
        )  # an explicit range is the clock's
        assert all_rows(c, "q4_pairs", end="now")["paging"]["total"] == 0


def _matches(value: str, flt: str) -> bool:
    addr = ipaddress.ip_address(value)
    if "/" in flt:
        net = ipaddress.ip_network(flt, strict=False)
        if net.version == 6 and net.prefixlen >= 96 and net.network_address.ipv4_mapped:
            net = ipaddress.ip_network((net.network_address.ipv4_mapped, net.prefixlen - 96), strict=False)
        return addr.version == net.version and addr in net
    other = ipaddress.ip_address(flt)
    return addr == (other.ipv4_mapped or other) if other.version == 6 else addr == other


@pytest.mark.parametrize(
    "params, col, values",
    [
        ({"key.src_ip": "10.0.0.1"}, "src_ip", ["10.0.0.1"]),
        ({"filter": "src_ip:10.0.0.0/8"}, "src_ip", ["10.0.0.0/8"]),
        ({"filter": "src_ip:10.0.0.0/15"}, "src_ip", ["10.0.0.0/15"]),  # not on an octet boundary
        ({"key.src_ip": "10.0.0.2/32"}, "src_ip", ["10.0.0.2"]),
        ({"key.src_ip": "0.0.0.0/0"}, "src_ip", ["0.0.0.0/0"]),
        ({"key.src_ip": "::ffff:10.0.0.0/104"}, "src_ip", ["10.0.0.0/8"]),
        ({"key.src_ip": "2001:DB8:0::1"}, "src_ip", ["2001:db8::1"]),  # not canonical text
        ({"key.src_ip": "2001:db8::/32"}, "src_ip", ["2001:db8::/32"]),
        ({"filter": "src_ip:2001:db8::/48"}, "src_ip", ["2001:db8::/48"]),
        ({"key.src_ip": "2001:db8::/126"}, "src_ip", ["2001:db8::/126"]),  # longer than 64 bits
        ({"key.src_ip": "fd00::/8"}, "src_ip", ["fd00::/8"]),
        ({"key.src_ip": "::/0"}, "src_ip", ["::/0"]),
        ({"key.dst_ip": "2001:db8:aa::53"}, "dst_ip", ["2001:db8:aa::53"]),
    ],
)
def test_key_filters(client: TestClient, store: Store, params: dict, col: str, values: list[str]) -> None:
    got = frame(all_rows(client, "q4_pairs", **params))
    exp = expected_q4(store)
    exp = exp[exp[col].map(lambda v: any(_matches(v, f) for f in values))]
    assert len(exp) > 0
    assert sorted(map(tuple, got[["window_start", *Q4_KEYS, "packets"]].values.tolist())) == sorted(
        map(tuple, exp[["window_start", *Q4_KEYS, "packets"]].values.tolist())
    )


def test_filters_or_within_a_column_and_across_columns(client: TestClient, store: Store) -> None:
    r = client.get(
        "/queries/q4_pairs/results",
        params=[
            ("filter", "dst_ip:8.8.8.8"),
            ("filter", "dst_ip:10.9.9.9"),
            ("key.src_ip", "10.0.0.0/8"),
            ("limit", "10000"),
        ],
    )
    got = frame(r.json())
    exp = expected_q4(store)
    exp = exp[exp["dst_ip"].isin(["8.8.8.8", "10.9.9.9"]) & exp["src_ip"].str.startswith("10.")]
    assert len(got) == len(exp) > 0 and set(got["dst_ip"]) == {"8.8.8.8", "10.9.9.9"}
    assert r.json()["filters"] == ["dst_ip:8.8.8.8", "dst_ip:10.9.9.9", "src_ip:10.0.0.0/8"]


def test_int_key_filter(client: TestClient, store: Store) -> None:
    got = frame(all_rows(client, "syn_per_port", **{"key.dst_port": "443"}))
    assert set(got["dst_port"]) == {443} and len(got) == 120
    r = client.get(
        "/queries/syn_per_port/results",
        params=[("filter", "dst_port:80"), ("filter", "dst_port:443"), ("limit", "10000")],
    )
    assert set(frame(r.json())["dst_port"]) == {80, 443}


@pytest.mark.parametrize(
    "order_by, cols, asc",
    [
        ("-packets", ["packets", "window_start", "src_ip", "dst_ip"], [False, True, True, True]),
        ("packets", ["packets", "window_start", "src_ip", "dst_ip"], [True, True, True, True]),
        (
            "-window_start,-packets",
            ["window_start", "packets", "src_ip", "dst_ip"],
            [False, False, True, True],
        ),
        ("dst_ip,-packets", ["dst_ip", "packets", "window_start", "src_ip"], [True, False, True, True]),
        (None, ["window_start", "src_ip", "dst_ip"], [True, True, True]),
    ],
)
def test_order_by(
    client: TestClient, store: Store, order_by: str | None, cols: list[str], asc: list[bool]
) -> None:
    params = {"order_by": order_by} if order_by else {}
    got = frame(all_rows(client, "q4_pairs", **params))
    exp = expected_q4(store).sort_values(cols, ascending=asc)
    assert (
        got[["window_start", *Q4_KEYS, "packets"]].values.tolist()
        == exp[["window_start", *Q4_KEYS, "packets"]].values.tolist()
    )


def _top(exp: pd.DataFrame, n: int, col: str, desc: bool, keys: list[str]) -> pd.DataFrame:
    e = exp.sort_values(["window_start", col, *keys], ascending=[True, not desc, *[True] * len(keys)])
    e = e.groupby("window_start", sort=False).head(n).copy()
    e["rank"] = e.groupby("window_start").cumcount() + 1
    return e


@pytest.mark.parametrize("n", [1, 3, 40])
def test_top_n_per_window(client: TestClient, store: Store, n: int) -> None:
    body = all_rows(client, "q4_pairs", top=str(n))
    got = frame(body)
    exp = _top(expected_q4(store), n, "packets", True, Q4_KEYS)
    cols = ["window_start", *Q4_KEYS, "packets", "rank"]
    assert got[cols].values.tolist() == exp[cols].values.tolist()
    assert body["paging"]["total"] == len(exp)


@pytest.mark.parametrize(
    "params",
    [
        {"top": "3", "order_by": "packets"},  # bottom 3: the general path
        {
            "top": "3",
            "key.src_ip": "0.0.0.0/0",
            "filter": "src_ip:::/0",
        },  # filters (matching all): general path
        {"top": "3", "order_by": "-window_start"},
    ],
)
def test_top_variants(client: TestClient, store: Store, params: dict) -> None:
    got = frame(all_rows(client, "q4_pairs", **params))
    desc = params.get("order_by") != "packets"
    exp = _top(expected_q4(store), 3, "packets", desc, Q4_KEYS)
    if params.get("order_by") == "-window_start":
        exp = exp.sort_values(["window_start", "rank"], ascending=[False, True])
    cols = ["window_start", *Q4_KEYS, "packets", "rank"]
    assert got[cols].values.tolist() == exp[cols].values.tolist()


def test_top_on_sliding_windows_and_other_aggregates(client: TestClient, store: Store) -> None:
    got = frame(all_rows(client, "syn_per_port", top="2"))
    exp = store.rows["syn_per_port"].copy()
    exp["window_start"] = exp["window_start"].map(iso)
    exp = _top(exp, 2, "syns", True, ["dst_port"])
    assert (
        got[["window_start", "dst_port", "syns", "rank"]].values.tolist()
        == exp[["window_start", "dst_port", "syns", "rank"]].values.tolist()
    )
    got = frame(all_rows(client, "bytes_per_dst24", top="2", order_by="-max_len"))
    exp = folded(store, "bytes_per_dst24", ["dst_ip_24"])
    exp["window_start"] = exp["window_start"].map(iso)
    exp = _top(exp, 2, "max_len", True, ["dst_ip_24"])
    assert (
        got[["window_start", "dst_ip_24", "max_len"]].values.tolist()
        == exp[["window_start", "dst_ip_24", "max_len"]].values.tolist()
    )


@pytest.mark.parametrize("extra", [{}, {"top": "4"}, {"order_by": "-packets"}])
def test_pagination(client: TestClient, extra: dict) -> None:
    full = all_rows(client, "q4_pairs", **extra)
    total = full["paging"]["total"]
    pages, offset = [], 0
    while offset is not None:
        body = client.get(
            "/queries/q4_pairs/results", params={"limit": "37", "offset": str(offset), **extra}
        ).json()
        assert body["paging"]["total"] == total and body["paging"]["limit"] == 37
        pages += body["rows"]
        offset = body["paging"]["next_offset"]
    assert pages == full["rows"]
    past = client.get(
        "/queries/q4_pairs/results", params={"limit": "10", "offset": str(total + 5), **extra}
    ).json()
    assert past["rows"] == [] and past["paging"]["total"] == total and past["paging"]["next_offset"] is None


def test_csv(client: TestClient, store: Store) -> None:
    r = client.get("/queries/q4_pairs/results", params={"format": "csv", "top": "2", "limit": "15"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = r.text.strip().split("\n")
    assert lines[0] == (
        "window_start,window_end,src_ip,dst_ip,packets,hosts,closed_at,corrections,"
        "hosts_expected,hosts_in_mark,late_partials,missing_records,complete,rank"
    )
    assert len(lines) == 16 and int(r.headers["x-total-count"]) == 2 * 20
    first = lines[1].split(",")
    assert first[0] == iso(store.first) and first[-1] == "1"


# ---- latest, series
def test_latest_window(client: TestClient, store: Store) -> None:
    body = client.get("/queries/q4_pairs/latest").json()
    assert body["window_start"] == iso(store.last) and body["window_end"] == iso(
        store.last + timedelta(minutes=1)
    )
    exp = expected_q4(store)
    exp = exp[exp["window_start"] == iso(store.last)]
    assert body["paging"]["total"] == len(exp) == len(body["rows"])
    top = client.get("/queries/q4_pairs/latest", params={"top": "5"}).json()
    assert [r["rank"] for r in top["rows"]] == [1, 2, 3, 4, 5]
    assert [r["packets"] for r in top["rows"]] == sorted(exp["packets"], reverse=True)[:5]
    s = client.get("/queries/syn_per_port/latest", params={"top": "1", "format": "csv"})
    assert s.status_code == 200 and iso(store.last + timedelta(seconds=50)) in s.text


def test_series_totals(client: TestClient, store: Store) -> None:
    body = client.get("/queries/q4_pairs/series").json()
    assert body["columns"] == [
        "window_start",
        "window_end",
        "groups",
        "packets",
        "complete",
        "incomplete_groups",
        "hosts_expected",
        "hosts_in_mark",
        "late_partials",
        "missing_records",
        "shed_records",
        "flagged",
        "loss_causes",
    ]
    assert not any(r["flagged"] or r["shed_records"] for r in body["rows"])  # nothing flagged in this store
    df = store.rows["q4_pairs"]
    exp = df[df["kind"] != "late"].groupby("window_start")["packets"].sum()  # late rows are no value
    groups = df[df["kind"] == "final"].groupby("window_start").size()
    assert [r["packets"] for r in body["rows"]] == exp.tolist()
    assert [r["groups"] for r in body["rows"]] == groups.tolist()
    assert [r["window_start"] for r in body["rows"]] == [iso(t) for t in exp.index]
    b = client.get("/queries/bytes_per_dst24/series").json()["rows"]
    d = store.rows["bytes_per_dst24"]
    w = (d["avg_len"] * d["packets"]).groupby(d["window_start"]).sum() / d.groupby("window_start")[
        "packets"
    ].sum()
    assert np.allclose([r["avg_len"] for r in b], w.tolist())
    assert client.get("/queries/q4_pairs/series", params={"format": "csv"}).text.startswith(
        "window_start,window_end,groups,packets"
    )


# ---- completeness
def test_results_complete_filter_and_columns(client: TestClient, store: Store) -> None:
    """complete=true|false splits the rows exactly; a late row marks only its group and adds nothing."""
    everything = frame(all_rows(client, "q4_pairs"))
    exp = expected_q4(store)
    merged = everything.merge(exp, on=["window_start", *Q4_KEYS], suffixes=("", "_exp"))
    assert len(merged) == len(exp) == len(everything)
    assert (merged["complete"] == merged["complete_exp"]).all()
    assert (merged["late_partials"] == merged["late_partials_exp"]).all()
    assert (merged["packets"] == merged["packets_exp"]).all()  # the late row's 999 packets are not added
    dead, late = (
        iso(store.first + timedelta(minutes=INCOMPLETE_DEAD)),
        iso(store.first + timedelta(minutes=INCOMPLETE_LATE)),
    )
    bad = everything[~everything["complete"]]
    assert set(bad["window_start"]) == {dead, late}
    assert (bad[bad["window_start"] == dead]["hosts_in_mark"] == 1).all()
    assert (
        len(bad[bad["window_start"] == late]) == 1
        and bad[bad["window_start"] == late]["late_partials"].iloc[0] == 3
    )
    yes, no = (
        frame(all_rows(client, "q4_pairs", complete="true")),
        frame(all_rows(client, "q4_pairs", complete="false")),
    )
    assert yes["complete"].all() and not no["complete"].any() and len(yes) + len(no) == len(everything)
    assert len(no) == len(bad)
    top = frame(all_rows(client, "q4_pairs", complete="true", top="3"))  # ranked among complete rows only
    assert top["complete"].all() and set(top.groupby("window_start").size()) == {3}
    assert dead not in set(top["window_start"])


def test_series_and_latest_complete_filter(client: TestClient, store: Store) -> None:
    dead, late = (
        iso(store.first + timedelta(minutes=INCOMPLETE_DEAD)),
        iso(store.first + timedelta(minutes=INCOMPLETE_LATE)),
    )
    rows = client.get("/queries/q4_pairs/series").json()["rows"]
    assert {r["window_start"] for r in rows if not r["complete"]} == {dead, late}
    assert {r["window_start"]: r["incomplete_groups"] for r in rows}[late] == 1
    assert {r["window_start"]: r["late_partials"] for r in rows}[late] == 3
    no = client.get("/queries/q4_pairs/series", params={"complete": "false"}).json()["rows"]
    assert [r["window_start"] for r in no] == [dead, late]
    yes = client.get("/queries/q4_pairs/series", params={"complete": "true"}).json()["rows"]
    assert len(yes) + len(no) == len(rows) and all(r["complete"] for r in yes)
    latest = client.get("/queries/q4_pairs/latest", params={"complete": "false"}).json()
    assert latest["complete"] is False and latest["rows"] == []  # the newest window is complete
    assert client.get("/queries/q4_pairs/latest", params={"complete": "true"}).json()["rows"]


@pytest.mark.parametrize("path", ["results", "latest", "series"])
@pytest.mark.parametrize("value", ["yes", "1", "", "TRUE1"])
def test_complete_parameter_rejects_anything_but_true_false(plain: TestClient, path: str, value: str) -> None:
    r = plain.get(f"/queries/q4_pairs/{path}", params={"complete": value})
    assert r.status_code == 400 and "complete" in r.json()["detail"]


# ---- status
def test_status(plain: TestClient, store: Store) -> None:
    """/status serves the job's validated document: hosts counted as hosts (not partitions), the
    per-host figures the job summed, partitions listed separately."""
    write_status(
        store.root, datetime.now(UTC)
    )  # fresh: the module's earlier tests may take over a minute under load
    body = plain.get("/status").json()
    assert body["available"] is True and body["stale"] is False and body["updated_at"].endswith("Z")
    hosts = {h["host"]: h for h in body["hosts"]}
    assert hosts["cap-a"]["live"] is True and hosts["cap-b"]["live"] is False
    assert hosts["cap-b"]["lag_s"] == 95.0 and hosts["cap-a"]["lag_s"] == 2.0
    assert hosts["cap-a"]["late_partials"] == 4 and hosts["cap-b"]["missing_records"] == 4
    assert hosts["cap-a"]["queries"] == ["bytes_per_dst24", "q4_pairs"] or hosts["cap-a"]["queries"] == [
        "q4_pairs"
    ]
    q = body["queries"]["q4_pairs"]
    assert (
        q["open_windows"] == 3
        and q["hosts_total"] == 2
        and q["hosts_live"] == 1
        and q["partitions_total"] == 2
    )
    assert (
        sorted(q["partitions"]) == ["0", "1"]
        and q["partitions"]["0"]["hosts"]["cap-b"]["missing_records"] == 4
    )
    assert body == {
        **json.loads((store.root / "_status.json").read_text()),
        **{k: body[k] for k in ("available", "error", "updated_at", "age_s", "stale")},
        "live": {"enabled": False, "received": 0, "consumers": []},
    }


@pytest.mark.parametrize(
    "content",
    [
        None,
        "{not json",
        "[1, 2]",
        '{"updated_at": "yesterday", "queries": {"q": 5}}',
        '{"queries": {"q": {"partitions": {"0": {"hosts": {"h": {"lag_s": NaN, "live": "yes"}}}}}}}',
    ],
)
def test_status_missing_or_not_in_the_contract(tmp_path: Path, store: Store, content: str | None) -> None:
    """A missing file, or one that does not validate against the status contract, is unavailable with the
    reason: nothing is guessed from a document of another shape."""
    (tmp_path / "r").mkdir()
    if content is not None:
        (tmp_path / "r" / "_status.json").write_text(content)
    with TestClient(create_app(store.config, tmp_path / "r")) as c:
        r = c.get("/status")
        assert r.status_code == 200
        body = r.json()
        assert body["available"] is False and "queries" not in body
        assert (
            ("no _status.json yet" in body["error"])
            if content is None
            else ("status contract" in body["error"])
        )


# ---- auth and metrics
GUARDED = [
    "/queries",
    "/queries/q4_pairs",
    "/queries/q4_pairs/results",
    "/queries/q4_pairs/latest",
    "/queries/q4_pairs/series",
    "/status",
    "/metrics",
]


@pytest.mark.parametrize("path", GUARDED)
def test_auth(authed: TestClient, path: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
    ):
        r = authed.get(path, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert r.headers.get("www-authenticate") == "Bearer"
    assert authed.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_auth_leaves_health_and_page_shells_open(authed: TestClient) -> None:
    for path in ("/health", "/", "/ui", "/ui/app.js", "/docs", "/openapi.json"):
        assert authed.get(path).status_code == 200, path
    spec = authed.get("/openapi.json").json()
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_docs_page_needs_no_cdn(plain: TestClient) -> None:
    from high_level.serve import api

    html = plain.get("/docs").text
    if api.SWAGGER_UI is None:
        pytest.skip("swagger-ui-bundle-v2 is not installed: /docs uses FastAPI's default CDN assets")
    assert "/docs/assets/swagger-ui-bundle.js" in html and "cdn.jsdelivr" not in html
    assert plain.get("/docs/assets/swagger-ui-bundle.js").status_code == 200
    assert plain.get("/docs/assets/swagger-ui.css").status_code == 200


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    from high_level.serve import api

    seen = {}
    monkeypatch.setenv(api.TOKEN_ENV, "from-env")
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(app=app, **kw))
    api.main(["--config", str(store.config), "--results", str(store.root), "--port", "8181"])
    assert seen["port"] == 8181 and seen["host"] == "127.0.0.1"
    with TestClient(seen["app"]) as c:
        assert c.get("/queries").status_code == 401
        assert c.get("/queries", headers={"Authorization": "Bearer from-env"}).status_code == 200


def test_metrics(plain: TestClient) -> None:
    plain.get("/queries/q4_pairs/results", params={"top": "1"})
    plain.get("/queries/q4_pairs/results", params={"limit": "0"})
    plain.get("/no/such/path")
    text = plain.get("/metrics").text
    assert 'lowwater_api_requests_total{method="GET",route="/queries/{name}/results",status="200"}' in text
    assert 'lowwater_api_requests_total{method="GET",route="/queries/{name}/results",status="400"}' in text
    assert 'lowwater_api_requests_total{method="GET",route="<unmatched>",status="404"}' in text
    assert 'lowwater_api_request_duration_seconds_bucket{le="0.1",route="/queries/{name}/results"}' in text
    assert "# TYPE lowwater_api_request_duration_seconds histogram" in text


# ---- bad parameters
BAD = [
    ("results", {"start": "not-a-time"}, "not a time"),
    ("results", {"start": "2024-13-01"}, "not a time"),
    ("results", {"start": "now", "end": "-1h"}, "before end"),
    ("results", {"start": "2024-01-01T00:00:00Z", "end": "2024-01-09T00:00:00Z"}, "longer than the maximum"),
    ("results", {"start": "99999999999999"}, "outside"),
    ("results", {"end": "-99999999999d"}, "not a time"),
    ("results", {"limit": "0"}, "limit"),
    ("results", {"limit": "10001"}, "limit"),
    ("results", {"limit": "many"}, "limit"),
    ("results", {"top": "0"}, "top"),
    ("results", {"top": "1001"}, "top"),
    ("results", {"offset": "-1"}, "offset"),
    ("results", {"order_by": "nope"}, "unknown column"),
    ("results", {"order_by": "-hosts"}, "unknown column"),
    ("results", {"filter": "nope:1"}, "not a group-key column"),
    ("results", {"filter": "src_ip"}, "column:value"),
    ("results", {"filter": "src_ip:999.1.1.1"}, "not an IP address"),
    ("results", {"filter": "src_ip:10.0.0.0/33"}, "not an IP address"),
    ("results", {"key.dst_port": "80"}, "not a group-key column"),
    ("results", {"format": "xml"}, "format"),
    ("results", {"lmit": "5"}, "unknown parameter"),
    ("latest", {"start": "-1h"}, "unknown parameter"),
    ("latest", {"top": "-3"}, "top"),
    ("series", {"top": "3"}, "unknown parameter"),
    ("series", {"end": "yesterday"}, "not a time"),
]


@pytest.mark.parametrize("endpoint, params, hint", BAD)
def test_bad_parameters_are_400_with_a_message(
    plain: TestClient, endpoint: str, params: dict, hint: str
) -> None:
    r = plain.get(f"/queries/q4_pairs/{endpoint}", params=params)
    assert r.status_code == 400, r.text
    assert hint in r.json()["detail"]


@pytest.mark.parametrize("value", ["abc", "1e3", "99999999999999999999999", "80; DROP TABLE x", ""])
def test_bad_int_key(plain: TestClient, value: str) -> None:
    r = plain.get("/queries/syn_per_port/results", params={"key.dst_port": value})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "integer" in detail or "int64" in detail, detail


INJECTIONS = [
    "'; DROP TABLE results; --",
    "1 OR 1=1",
    '" OR ""="',
    "window_start; SELECT 1",
    "packets DESC, (SELECT 1)",
    "$files",
    "?",
    "0.0.0.0/0' OR '1'='1",
    "read_parquet('/etc/passwd')",
    "\x00",
    "%00",
    "𝔡𝔯𝔬𝔭",
    "-packets--",
    "window_start) UNION SELECT * FROM duckdb_settings() --",
    "10.0.0.1' --",
    "1; COPY (SELECT 1) TO '/tmp/x'",
]


@pytest.mark.parametrize(
    "param",
    [
        "start",
        "end",
        "order_by",
        "filter",
        "key.src_ip",
        "format",
        "top",
        "limit",
        "offset",
        "key.src_ip' --",
        "name",
    ],
)
def test_sql_injection_attempts_are_rejected(plain: TestClient, param: str) -> None:
    before = all_rows(plain, "q4_pairs")["paging"]["total"]
    for payload in INJECTIONS:
        if param == "name":
            r = plain.get(f"/queries/{quote(payload, safe='')}/results")
            assert r.status_code in (404, 405), (payload, r.status_code)
            continue
        value = f"src_ip:{payload}" if param == "filter" else payload
        r = plain.get("/queries/q4_pairs/results", params={param: value})
        assert r.status_code == 400, (param, payload, r.status_code, r.text)
    assert all_rows(plain, "q4_pairs")["paging"]["total"] == before


# ---- robustness of the store
def test_empty_or_missing_store(tmp_path: Path, store: Store) -> None:
    with TestClient(create_app(store.config, tmp_path / "does-not-exist")) as c:
        assert c.get("/health").json()["results_dir_exists"] is False
        body = c.get("/queries/q4_pairs/results").json()
        assert body["rows"] == [] and body["paging"]["total"] == 0
        assert c.get("/queries/q4_pairs/results", params={"top": "3"}).json()["rows"] == []
        latest = c.get("/queries/q4_pairs/latest", params={"top": "3"}).json()
        assert latest["window_start"] is None and latest["rows"] == []
        assert c.get("/queries/q4_pairs/series").json()["rows"] == []
        assert c.get("/status").json()["available"] is False


def test_unreadable_and_temporary_files_are_skipped(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "results"
    shutil.copytree(store.root, root)
    day = next((root / "query=q4_pairs").iterdir())
    (day / "part-000000099999.parquet").write_bytes(b"PAR1 half written")
    (day / ".part-000000099998.parquet.tmp").write_bytes(b"junk")
    (day / "_SUCCESS").write_text("")
    pq.write_table(pa.table({"x": [1]}), day / "part-000000099997.parquet")  # no window_start at all
    with TestClient(create_app(store.config, root)) as c:
        body = all_rows(c, "q4_pairs")
        assert body["paging"]["total"] == len(expected_q4(store))
        assert c.get("/queries/q4_pairs/latest").status_code == 200
        assert c.get("/health").json()["rejected_files"] == {"total": 2, "current": 2}
        rejected = (
            c.app.state.reader.index.rejected()
        )  # the reasons: in the log and here, not in open /health
    # the two part files are rejected with their reason; temporary and marker files are not results at all
    assert {Path(p).name for p in rejected} == {"part-000000099999.parquet", "part-000000099997.parquet"}
    assert "unreadable Parquet footer" in rejected[str(day / "part-000000099999.parquet")]
    assert "missing ['window_start'" in rejected[str(day / "part-000000099997.parquet")]


def _q4_table(store: Store, ws: pd.Timestamp, pairs: list[tuple[str, int]], kind: str) -> pa.Table:
    """q4_pairs rows in the contract's schema (what the job writes), one per (src_ip, packets)."""
    n = len(pairs)
    return pa.table(
        {
            "window_start": [ws] * n,
            "window_end": [ws + pd.Timedelta(minutes=1)] * n,
            "src_ip": [p[0] for p in pairs],
            "dst_ip": ["8.8.8.8"] * n,
            "packets": [p[1] for p in pairs],
            "closed_at": [ws + pd.Timedelta(minutes=2)] * n,
            "hosts": [2] * n,
            "hosts_expected": [2] * n,
            "hosts_in_mark": [2] * n,
            "late_partials": [0] * n,
            "missing_records": [0] * n,
            "complete": [True] * n,
            "kind": [kind] * n,
        },
        schema=R.schema(load(store.config).query("q4_pairs")),
    )


@pytest.mark.parametrize("cache_mb", [512, 0])
def test_files_that_break_the_layout_are_rejected_and_counted(
    tmp_path: Path, store: Store, cache_mb: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing is cast or guessed: a file whose columns are not the contract's is skipped, logged once
    with the reason and counted in /health; the files that follow the layout are still served."""
    root = tmp_path / "results"
    d = root / "query=q4_pairs" / f"date={store.last.date().isoformat()}"
    d.mkdir(parents=True)
    ws = pd.Timestamp(store.last)
    good = _q4_table(store, ws, [("10.0.0.1", 3), ("10.0.0.2", 2)], "final")
    pq.write_table(good, d / "part-000000000001.parquet")
    # an older writer: ns timestamps, int32 counts, no kind/hosts/closed_at (was silently cast before)
    pq.write_table(
        pa.table(
            {
                "window_start": pa.array([ws.value] * 2, pa.timestamp("ns", tz="UTC")),
                "window_end": pa.array([ws.value + 60 * 10**9] * 2, pa.timestamp("ns", tz="UTC")),
                "src_ip": ["10.0.0.9", "2001:db8::1"],
                "dst_ip": ["8.8.8.8", "8.8.8.8"],
                "packets": pa.array([30, 40], pa.int32()),
            }
        ),
        d / "part-000000000002.parquet",
    )
    pq.write_table(
        good.set_column(4, "packets", good.column("packets").cast(pa.int32())),
        d / "part-000000000003.parquet",
    )
    pq.write_table(good.append_column("extra", pa.array([1, 2])), d / "part-000000000004.parquet")
    kind_at = good.schema.get_field_index("kind")
    pq.write_table(
        good.set_column(kind_at, "kind", pa.array(["final", "bogus"])), d / "part-000000000005.parquet"
    )
    # the layout before completeness columns: rejected and counted like any other (no second version)
    pq.write_table(
        good.select([c for c in good.column_names if c not in R.COMPLETENESS_COLUMNS]),
        d / "part-000000000006.parquet",
    )
    reasons = {
        "part-000000000002.parquet": "missing ['closed_at', 'hosts', 'hosts_expected', 'hosts_in_mark', "
        "'late_partials', 'missing_records', 'complete', 'kind']; "
        "window_start: timestamp[ns, tz=UTC]",
        "part-000000000006.parquet": "missing ['hosts_expected', 'hosts_in_mark', 'late_partials', "
        "'missing_records', 'complete']",
        "part-000000000003.parquet": "packets: int32 (want int64)",
        "part-000000000004.parquet": "unexpected ['extra']",
        "part-000000000005.parquet": "row kinds ['bogus', 'final']",
    }
    with (
        caplog.at_level("WARNING", logger="lowwater.api"),
        TestClient(create_app(store.config, root, cache_mb=cache_mb)) as c,
    ):
        for _ in range(2):
            rows = all_rows(c, "q4_pairs")["rows"]
            assert sorted((r["src_ip"], r["packets"], r["hosts"]) for r in rows) == [
                ("10.0.0.1", 3, 2),
                ("10.0.0.2", 2, 2),
            ]
        assert c.get("/queries/q4_pairs/latest").json()["window_start"] == iso(store.last)
        assert c.get("/health").json()["rejected_files"] == {"total": 5, "current": 5}
        now = {Path(p).name: why for p, why in c.app.state.reader.index.rejected().items()}
    assert set(now) == set(reasons)
    for name, why in reasons.items():
        assert why in now[name], (name, now[name])
        logged = [r.getMessage() for r in caplog.records if name in r.getMessage()]
        assert len(logged) == 1 and why in logged[0], logged  # once per file version, with the reason


# ---- the fast top-N path against the general one, on random stores
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_windows=st.integers(1, 5),
    groups=st.integers(1, 12),
    split=st.booleans(),
    top=st.integers(1, 6),
    per_file=st.integers(1, 3),
    first_in_range=st.integers(0, 2),
    corrections=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 14), st.integers(-5, 50)), max_size=8),
    seed=st.integers(0, 10**6),
)
def test_fast_top_equals_general_path(
    tmp_path_factory: pytest.TempPathFactory,
    store: Store,
    n_windows: int,
    groups: int,
    split: bool,
    top: int,
    per_file: int,
    first_in_range: int,
    corrections: list,
    seed: int,
) -> None:
    """Windows in one or several files, files with several windows, ranges cutting through files."""
    rng = np.random.default_rng(seed)
    root = tmp_path_factory.mktemp("fast") / "results"
    base = store.first
    schema = result_schema([("src_ip", pa.string()), ("dst_ip", pa.string())], [("packets", pa.int64())])
    batch = 0

    def write(recs: list[dict]) -> None:
        nonlocal batch
        d = root / "query=q4_pairs" / f"date={base.date().isoformat()}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(recs, schema=schema), d / f"part-{batch:012d}.parquet")
        batch += 1

    def rec(w: int, g: int, p: int, kind: str) -> dict:
        ws = base + timedelta(minutes=w)
        return {
            "window_start": ws,
            "window_end": ws + timedelta(minutes=1),
            "src_ip": f"10.0.{g // 7}.{g}",
            "dst_ip": "8.8.8.8" if g % 2 else "2001:db8::5",
            "packets": p,
            "closed_at": ws,
            "hosts": 1,
            "hosts_expected": 1,
            "hosts_in_mark": 1,
            "late_partials": int(kind != "final"),
            "missing_records": 0,
            "complete": kind != "late",
            "kind": kind,
        }

    for w0 in range(0, n_windows, per_file):
        recs = [
            rec(w, g, int(rng.integers(1, 8)), "final")  # small values: many ties
            for w in range(w0, min(n_windows, w0 + per_file))
            for g in range(groups)
        ]
        if split and len(recs) > 1:
            write(recs[::2])
            write(recs[1::2])
        else:
            write(recs)
    if corrections:
        # every third one a late row (policy drop): no value, marks its group incomplete
        write([rec(w % n_windows, g, p, "late" if p % 3 == 0 else "correction") for w, g, p in corrections])
    qi = QueryInfo.of(load(store.config).query("q4_pairs"))
    start, end = base + timedelta(minutes=first_in_range), base + timedelta(minutes=10)
    fast = Reader(root).results(qi, start, end, [], [], top, 10000, 0)
    general = Reader(root, cache_mb=0).results(qi, start, end, [], [], top, 10000, 0)
    everything = parse_filters([("src_ip", "0.0.0.0/0"), ("src_ip", "::/0")], qi.key_kinds)
    cached_general = Reader(root).results(qi, start, end, everything, [], top, 10000, 0)
    assert fast.rows == general.rows == cached_general.rows
    assert fast.total == general.total == cached_general.total
    page = Reader(root).results(qi, start, end, [], [], top, 3, 2)
    assert page.rows == fast.rows[2:5] and page.total == fast.total


# ---- fuzzing: no parameter combination may produce a 5xx
NAMES = ["q4_pairs", "bytes_per_dst24", "syn_per_port", "avg_only"]
PARAM_KEYS = [
    *("start", "end", "filter", "order_by", "top", "limit", "offset", "format"),
    *(f"key.{k}" for k in ("src_ip", "dst_port", "dst_ip_24", "", "src_port")),  # key filters, "key." too
    "x",
]
VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "now",
            "-1h",
            "now-15m",
            "0",
            "1714564800.5",
            "2024-05-01T12:00:00Z",
            "2024-05-01",
            "-1",
            "1e309",
            "10.0.0.0/8",
            "src_ip:10.0.0.0/8",
            "dst_port:443",
            "2001:db8::/32",
            "::/0",
            "-packets",
            "window_start",
            "packets,-window_start",
            "csv",
            "json",
            "NaN",
            "inf",
            "9" * 30,
            "443",
        ]
    ),
    st.integers(-(10**20), 10**20).map(str),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.one_of(st.sampled_from(NAMES), st.text(max_size=10)),
    endpoint=st.sampled_from(["results", "latest", "series", ""]),
    params=st.lists(st.tuples(st.sampled_from(PARAM_KEYS), VALUES), max_size=6),
)
def test_fuzz_parameters_never_5xx(plain: TestClient, name: str, endpoint: str, params: list) -> None:
    name = quote(name, safe="")
    path = f"/queries/{name}/{endpoint}" if endpoint else f"/queries/{name}"
    try:
        r = plain.get(path, params=params)
    except UnicodeEncodeError:  # httpx cannot even send lone surrogates: nothing reaches the server
        return
    assert r.status_code < 500, (path, params, r.text)


def test_schemathesis_no_5xx(plain: TestClient) -> None:
    """Schema-driven fuzzing of every operation (skipped when schemathesis is not installed)."""
    schemathesis = pytest.importorskip("schemathesis")
    schema = schemathesis.openapi.from_asgi("/openapi.json", plain.app)
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        strategy = op.as_strategy()
        if "{name}" in op.path:  # mostly real query names, so the deeper code runs, plus random ones
            strategy = st.tuples(
                strategy, st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=8))
            ).map(lambda cn: cn[0].path_parameters.update(name=cn[1]) or cn[0])

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case: object) -> None:
            r = case.call()  # type: ignore[attr-defined]
            if r.status_code >= 500:
                failures.append(f"{case.path} {case.path_parameters} {case.query} -> {r.status_code}")  # type: ignore[attr-defined]

        run()
    assert not failures, failures[:5]


def test_status_file_written_later_is_picked_up(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "r"
    root.mkdir()
    with TestClient(create_app(store.config, root)) as c:
        assert c.get("/status").json()["available"] is False
        write_status(root, datetime.now(UTC))
        assert c.get("/status").json()["available"] is True


def test_concurrent_requests_on_a_cold_cache(store: Store) -> None:
    """Requests run in FastAPI's thread pool: one DuckDB cursor each, a shared cache filled concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    app = create_app(store.config, store.root)
    c = TestClient(app)  # no lifespan: nothing warmed, the threads fill the cache themselves
    calls = [
        ("/queries/q4_pairs/results", {"top": "3"}),
        ("/queries/q4_pairs/results", {"key.src_ip": "10.0.0.0/8"}),
        ("/queries/bytes_per_dst24/latest", {}),
        ("/queries/syn_per_port/series", {}),
        ("/status", {}),
        ("/queries/avg_only/results", {"order_by": "-avg_len"}),
    ] * 8
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda pc: c.get(pc[0], params=pc[1]), calls))
    assert [r.status_code for r in responses] == [200] * len(calls)
    first = {(p, tuple(sorted(q.items()))): r.json() for (p, q), r in zip(calls, responses, strict=True)}
    for (p, q), r in zip(calls, responses, strict=True):
        body = r.json()
        if p != "/status":
            assert body["rows"] == first[(p, tuple(sorted(q.items())))]["rows"]
    app.state.reader.close()


@pytest.mark.parametrize("cache_mb", [512, 0])
def test_top_when_a_correction_pushes_a_group_down(tmp_path: Path, store: Store, cache_mb: int) -> None:
    """A (negative) correction moves a group out of the top: the next group, ranked below the top in
    its file's finals, must come in (the candidate bound grows with the corrections of the window)."""
    root = tmp_path / "results"
    d = root / "query=q4_pairs" / f"date={store.first.date().isoformat()}"
    d.mkdir(parents=True)
    ws = pd.Timestamp(store.first)
    pq.write_table(
        _q4_table(store, ws, [("10.0.0.1", 10), ("10.0.0.2", 9), ("10.0.0.3", 8), ("10.0.0.4", 7)], "final"),
        d / "part-000000000001.parquet",
    )
    pq.write_table(_q4_table(store, ws, [("10.0.0.1", -5)], "correction"), d / "part-000000000002.parquet")
    with TestClient(create_app(store.config, root, cache_mb=cache_mb)) as c:
        rows = all_rows(c, "q4_pairs", top="2", start=iso(ws), end=iso(ws + pd.Timedelta(minutes=1)))["rows"]
    assert [(r["src_ip"], r["packets"], r["corrections"]) for r in rows] == [
        ("10.0.0.2", 9, 0),
        ("10.0.0.3", 8, 0),
    ]


def test_reads_what_the_real_writer_writes(tmp_path: Path, store: Store) -> None:
    """End to end with high_level.results.store.ResultStore: typed Parquet from generic rows, then folded by the API."""
    store_mod = pytest.importorskip("high_level.results.store")
    from contract import fields as F

    cfg = load(store.config)
    q = cfg.query("bytes_per_dst24")
    root = tmp_path / "results"
    writer = store_mod.ResultStore(root, cfg.queries)
    ws_ns = int(pd.Timestamp(store.first).value)

    def row(kind: str, addr: str, lens: list[int], batch_ms: int) -> dict:
        hi, lo = F.ip_to_words(addr)
        state = [
            sum(lens),
            len(lens),
            sum(lens),
            len(lens),
            max(lens),
        ]  # bytes, packets, avg_len.{sum,count}, max_len
        return {
            "query": q.name,
            "partition": 0,
            "window": 0,
            "window_start_ns": ws_ns,
            "window_end_ns": ws_ns + 60 * 10**9,
            "key": [F.to_int64(hi), F.to_int64(lo)],
            "state": state,
            "kind": kind,
            "closed_at_ms": batch_ms,
            "hosts": 2,
            "hosts_expected": 2,
            "hosts_in_mark": 2,
            "late_partials": int(kind != "final"),
            "missing_records": 0,
            "status": None,
        }

    t = ws_ns // 10**6 + 65_000
    writer.write_batch(
        1, pd.DataFrame([row("final", "10.9.9.0", [100, 300], t), row("final", "2001:db8:aa::", [1500], t)])
    )
    writer.write_batch(2, pd.DataFrame([row("correction", "10.9.9.0", [800], t + 5000)]))
    writer.write_batch(
        3, pd.DataFrame([row("late", "2001:db8:aa::", [9000], t + 6000)])
    )  # policy drop: no value
    for cache in (512, 0):
        with TestClient(create_app(store.config, root, cache_mb=cache)) as c:
            rows = all_rows(
                c, q.name, start=iso(store.first), end=iso(store.first + timedelta(minutes=1)), top="5"
            )["rows"]
            got = {
                r["dst_ip_24"]: (r["bytes"], r["packets"], r["avg_len"], r["max_len"], r["corrections"])
                for r in rows
            }
            assert got == {"10.9.9.0": (1200, 3, 400.0, 800, 1), "2001:db8:aa::": (1500, 1, 1500.0, 1500, 0)}
            flags = {r["dst_ip_24"]: (r["complete"], r["late_partials"]) for r in rows}
            assert flags == {
                "10.9.9.0": (True, 1),
                "2001:db8:aa::": (False, 1),
            }  # folded late record / dropped one
            assert c.get(f"/queries/{q.name}/latest").json()["window_start"] == iso(store.first)
