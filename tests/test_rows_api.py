"""Row-window results (``kind: rows``) served by the API: the same query endpoints on a store written by the
row pipeline's own writer (``high_level.rows.pipeline.write_rows``) from the job's row processor, fed by a
capture host's real row numbering (``RowPanes``) with one partials batch lost on the way (a sequence gap),
so the store holds complete and flagged windows. Against the stored rows: filters, complete, order, paging,
CSV, the newest window per stream; bad requests are 4xx, a file that breaks the layout is skipped and counted."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

with warnings.catch_warnings():  # starlette's note that its TestClient will move to httpx2
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from contract import query as Q
from contract import results as R
from contract import wire
from high_level.rows.pipeline import write_rows
from high_level.rows.processor import RowProcessor, from_ipc, ipc_bytes
from high_level.serve.api import create_app
from low_level.kernel.rowpanes import RowPanes
from lowwater_testing.traffic import NS, T0, make_traffic
from tests.test_rows_agent import CONFIG, selected

AGG = """  - name: bytes_per_second
    group_by: [dst_port]
    aggregates: [{fn: count}]
    window: {range: 1s}
"""
CLOSED_MS = int(datetime(2026, 11, 28, 12, tzinfo=UTC).timestamp() * 1000)  # batch b closes at + b minutes


@dataclass
class Batch:
    """What ``write_rows`` takes from Spark: the step's output rows (query, Arrow IPC)."""

    rows: list[dict]

    def collect(self) -> list[dict]:
        return self.rows


@dataclass
class RowStore:
    config: Path
    root: Path
    spec: Q.RowQuerySpec
    table: pa.Table  # every row written


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RowStore:
    """Two capture hosts' rows through the processor in 4 micro-batches, each written as the job does."""
    tmp = tmp_path_factory.mktemp("rowsapi")
    cfg = tmp / "q.yaml"
    cfg.write_text(CONFIG + AGG)
    spec = Q.load(cfg).rows[0]
    sent: dict[int, list[bytes]] = {}
    for i, host in enumerate(("cap-1", "cap-2")):
        rp = RowPanes(spec, host, 10 + i)
        rows = selected(spec, make_traffic(2500, 20, T0, 10 * NS, seed=3 + i).rows())
        for a in range(0, len(rows), 100):
            rp.submit(rows[a : a + 100])
            rp.punctuate()
        rp.punctuate(every=True)
        out: list[bytes] = []
        rp.pump(lambda topic, p, v, out=out: out.append(v) or True)
        if host == "cap-2":  # one partials batch lost on the way: a sequence gap flags its windows
            lost = [k for k, v in enumerate(out) if isinstance(wire.decode(v), wire.Partials)][-2]
            out.pop(lost)
        sent.setdefault(rp.partition, []).extend(out)
    proc, written = RowProcessor(spec), []
    for b in range(4):
        part = {p: list(np.array_split(np.array(v, dtype=object), 4)[b]) for p, v in sent.items()}
        res = proc.process_packed(part, CLOSED_MS + b * 60_000)
        table = from_ipc(res["ipc"][0])
        written.append(table)
        write_rows(
            str(tmp / "res"), {spec.name: spec}, Batch([{"query": spec.name, "ipc": ipc_bytes(table)}]), b
        )
    table = pa.concat_tables(written)
    assert 0 < proc.incomplete < table.num_rows
    return RowStore(cfg, tmp / "res", spec, table)


@pytest.fixture(scope="module")
def client(store: RowStore) -> Iterator[TestClient]:
    with TestClient(create_app(store.config, store.root)) as c:
        yield c


def get(c: TestClient, path: str, **params: str) -> dict:
    r = c.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def keyed(rows: list[dict]) -> dict[tuple, dict]:
    out = {(r["host"], r["dst_ip"], r["window"], r["dst_port"]): r for r in rows}
    assert len(out) == len(rows)
    return out


def test_the_query_list_and_definition_show_the_row_query(client: TestClient, store: RowStore) -> None:
    body = get(client, "/queries")
    assert [q["name"] for q in body["queries"]] == ["bytes_per_second"]
    (rq,) = body["row_queries"]
    assert rq["kind"] == "rows" and rq["window"] == {"rows": 12, "slide": 8, "partition_by": ["dst_ip"]}
    assert "missing_records" in rq["result_columns"] and "complete" in rq["result_columns"]
    assert get(client, f"/queries/{store.spec.name}") == rq


def test_results_return_every_stored_row_window_with_its_completeness(
    client: TestClient, store: RowStore
) -> None:
    name = store.spec.name
    body = get(
        client,
        f"/queries/{name}/results",
        start="2026-11-28T00:00:00Z",
        end="2026-11-29T00:00:00Z",
        limit="10000",
    )
    want = store.table.to_pylist()
    got = keyed(body["rows"])
    assert body["paging"]["total"] == len(want) == len(got)
    for w in want:
        r = got[(w["host"], w["dst_ip"], w["window"], w["dst_port"])]
        assert (
            r["count"],
            r["bytes"],
            r["first_row"],
            r["end_row"],
            r["missing_records"],
            r["complete"],
        ) == (w["count"], w["bytes"], w["first_row"], w["end_row"], w["missing_records"], w["complete"])
        assert r["closed_at"] == w["closed_at"].isoformat().replace("+00:00", "Z")
    # the default range: the hour up to the newest window stored
    assert get(client, f"/queries/{name}/results", limit="10000")["paging"]["total"] == len(want)
    flagged = [w for w in want if not w["complete"]]
    only = get(client, f"/queries/{name}/results", complete="false", limit="10000")
    assert flagged and {k for k in keyed(only["rows"])} == {
        (w["host"], w["dst_ip"], w["window"], w["dst_port"]) for w in flagged
    }
    assert {r["host"] for r in only["rows"]} == {"cap-2"}


def test_filters_order_paging_and_csv(client: TestClient, store: RowStore) -> None:
    name, want = store.spec.name, store.table.to_pylist()
    ip = want[0]["dst_ip"]
    body = get(
        client, f"/queries/{name}/results", **{"key.dst_ip": ip, "filter": "host:cap-1", "limit": "10000"}
    )
    assert body["rows"] and {(r["dst_ip"], r["host"]) for r in body["rows"]} == {(ip, "cap-1")}
    assert len(body["rows"]) == sum(w["dst_ip"] == ip and w["host"] == "cap-1" for w in want)
    prefix = get(client, f"/queries/{name}/results", filter="dst_ip:192.168.0.0/16", limit="10000")
    assert prefix["paging"]["total"] == len(want)
    top = get(client, f"/queries/{name}/results", order_by="-bytes", limit="5")
    assert [r["bytes"] for r in top["rows"]] == sorted((w["bytes"] for w in want), reverse=True)[:5]
    page2 = get(client, f"/queries/{name}/results", order_by="-bytes", limit="5", offset="5")
    assert page2["paging"]["offset"] == 5 and page2["rows"][0]["bytes"] <= top["rows"][-1]["bytes"]
    r = client.get(f"/queries/{name}/results", params={"format": "csv", "limit": "10000"})
    assert r.status_code == 200 and int(r.headers["X-Total-Count"]) == len(want)
    assert r.text.splitlines()[0].split(",")[:3] == ["host", "incarnation", "dst_ip"]


def test_latest_is_the_newest_window_of_each_stream(client: TestClient, store: RowStore) -> None:
    t = store.table.to_pandas()
    newest = t.groupby(["host", "incarnation", "dst_ip"])["window"].transform("max")
    want = t[t["window"] == newest]
    body = get(client, f"/queries/{store.spec.name}/latest", limit="10000")
    got = keyed(body["rows"])
    assert set(got) == {(r.host, r.dst_ip, r.window, r.dst_port) for r in want.itertuples()}


@pytest.mark.parametrize(
    ("path", "params", "says"),
    [
        ("/results", {"top": "3"}, "no time span"),
        ("/results", {"cursor": "x"}, "no time span"),
        ("/latest", {"top": "3"}, "no time span"),
        ("/series", {}, "no time span"),
        ("/incomplete", {}, "no time span"),
        ("/results", {"filter": "src_ip:10.0.0.1"}, "cannot filter on 'src_ip'"),
        ("/results", {"key.dst_ip": "nope"}, "not an IP address"),
        ("/results", {"order_by": "window_start"}, "unknown column"),
        ("/results", {"complete": "maybe"}, "not true or false"),
        ("/results", {"limit": "0"}, "limit"),
        ("/results", {"start": "yesterday-ish"}, "start"),
        ("/results", {"bogus": "1"}, "unknown parameter"),
    ],
)
def test_bad_requests_are_400_saying_why(
    client: TestClient, store: RowStore, path: str, params: dict, says: str
) -> None:
    r = client.get(f"/queries/{store.spec.name}{path}", params=params)
    assert r.status_code == 400 and says in r.json()["detail"], r.text


def test_a_file_that_breaks_the_layout_is_skipped_and_counted(store: RowStore, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "res"
    shutil.copytree(store.root, root)
    day = sorted((root / f"query={store.spec.name}").glob("date=*"))[-1]
    bad = store.table.slice(0, 3).drop(["complete"])
    pq.write_table(bad, day / R.part_name(99))
    with TestClient(create_app(store.config, root)) as c:
        body = get(c, f"/queries/{store.spec.name}/results", limit="10000")
        assert body["paging"]["total"] == store.table.num_rows
        assert get(c, "/health")["rejected_row_window_files"] == 1
        assert c.get("/queries/nothing/results").status_code == 404


def test_the_page_shows_the_row_query_newest_windows_incomplete_ones_hatched(
    client: TestClient, store: RowStore, tmp_path: Path
) -> None:
    """The results page in a real headless Chromium against the real API: a card of the row query with a
    table of its streams' newest windows, the incomplete ones hatched with why."""
    from lowwater_testing.page import CHROMIUM, chromium, serve_api, stop

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium, or ./lw setup)")
    name = store.spec.name
    want = get(client, f"/queries/{name}/latest", order_by="-closed_at,host,window", limit="30")["rows"]
    proc, base = serve_api(store)
    try:
        dom = chromium(f"{base}/ui", tmp_path / "profile", "--dump-dom").stdout
    finally:
        stop(proc)
    assert f'id="r-{name}"' in dom and "12 rows sliding every 8" in dom
    assert dom.count('class="row-window') == len(want) == 30
    bad = sum(not r["complete"] for r in want)
    assert bad and dom.count('class="row-window incomplete"') == bad
    assert "records lost where these rows were numbered" in dom


def test_a_slide_by_tuple_query_is_listed_and_served(tmp_path: Path) -> None:
    """A slide-by-tuple query (``window: {range, every}``) has its own columns (``window_end``, no row
    numbers): listed with its window, its windows served by /results and /latest, ordered by ``window_end``,
    each with its completeness, equal to what the job's processor wrote."""
    from high_level.rows.tupleprocessor import TupleProcessor
    from low_level.kernel.tuplerows import TupleRows
    from tests.test_rows_bytuple_agent import CONFIG as TUPLE_CONFIG

    cfg = tmp_path / "q.yaml"
    cfg.write_text(TUPLE_CONFIG + AGG)
    spec = Q.load(cfg).rows[0]
    tr, sent = TupleRows(spec, "cap-1", 3), []
    rows = selected(spec, make_traffic(1500, 20, T0, 10 * NS, seed=9).rows())
    for a in range(0, len(rows), 100):
        tr.submit(rows[a : a + 100])
        if a + 100 < len(rows):
            mark = int(rows[a + 100 :, 0].min())
            tr.punctuate(mark, losses=((int(rows[a:, 0].min()), mark - 1, "ring", 3),) if a == 500 else ())
    tr.punctuate(wire.END_OF_STREAM)
    tr.pump(lambda topic, p, v: sent.append(v) or True)
    res = TupleProcessor(spec).process_packed({tr.partition: sent}, CLOSED_MS)
    table = from_ipc(res["ipc"][0])
    write_rows(
        str(tmp_path / "res"), {spec.name: spec}, Batch([{"query": spec.name, "ipc": ipc_bytes(table)}]), 0
    )
    with TestClient(create_app(cfg, tmp_path / "res")) as c:
        (rq,) = get(c, "/queries")["row_queries"]
        assert rq["window"] == {"range": "1s", "range_ns": NS, "every": 7}
        assert "window_end" in rq["result_columns"] and "first_row" not in rq["result_columns"]
        body = get(
            c,
            f"/queries/{spec.name}/results",
            start="2026-11-28T00:00:00Z",
            end="2026-11-29T00:00:00Z",
            limit="10000",
            order_by="window_end",
        )
        assert body["paging"]["total"] == table.num_rows > 100
        got = [(r["window"], r["dst_port"], r["count"], r["complete"]) for r in body["rows"]]
        want = sorted(table.to_pylist(), key=lambda r: r["window_end"])
        assert sorted(got) == sorted((w["window"], w["dst_port"], w["count"], w["complete"]) for w in want)
        ends = [r["window_end"] for r in body["rows"]]
        assert ends == sorted(ends)
        assert 0 < sum(not r[3] for r in got) < len(got)  # the host's drop flagged the windows it met
        latest = get(c, f"/queries/{spec.name}/latest")["rows"]
        newest = max(w["window"] for w in want)
        assert latest and {r["window"] for r in latest} == {newest}
    from lowwater_testing.page import CHROMIUM, chromium, serve_api, stop

    if CHROMIUM is not None:  # the page's card of it (the row windows' page test skips without chromium too)
        proc, base = serve_api(RowStore(cfg, tmp_path / "res", spec, table))
        try:
            dom = chromium(f"{base}/ui", tmp_path / "profile", "--dump-dom").stdout
        finally:
            stop(proc)
        assert f'id="r-{spec.name}"' in dom and "the last 1s, every 7 rows" in dom
        assert dom.count('class="row-window') == len(latest)
