"""Results as Prometheus series: the newest closed window's top groups, bounded, stamped with the
window's end, from the rows the store really writes (after HAVING)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from contract import query as Q
from high_level.aggregate.packed import QueryWindows
from high_level.job import HighLevelJob, JobOptions
from lowwater_testing.queries import config, query

CONFIG = config(
    query(
        "ports",
        group_by=["dst_port"],
        aggregates=["count as packets", "sum(length) as bytes", "max(length) as biggest"],
        export={"top": 3, "by": "bytes"},
    ),
    query("quiet", group_by=["dst_port"], aggregates=["count as packets"]),
).text


def _write(job: HighLevelJob, q: Q.QuerySpec, batch: int, window: int, rows: list[tuple[int, ...]]) -> None:
    n = len(rows)
    key = np.array([[r[0]] for r in rows], np.int64)
    state = np.array([list(r[1:]) for r in rows], np.int64)
    w = QueryWindows(
        np.full(n, window, np.int64),
        np.ones(n, np.int8),
        key,
        state,
        np.full(n, 1),
        np.ones(n, np.int32),
        np.ones(n, np.int32),
        np.tile(np.array([1, 0, 0], np.int64), (n, 1)),
    )  # complete: 1 of 1 host, nothing late or missing
    job.store.write_query(batch, q, w)


def _scrape(job: HighLevelJob) -> dict[str, list]:
    text = generate_latest(job.metrics.registry).decode()
    return {
        f.name: f.samples
        for f in text_string_to_metric_families(text)
        if f.name.startswith("lowwater_job_result")
    }


def test_top_groups_of_the_newest_window_bounded_and_unstamped(tmp_path) -> None:
    cfg = Q.load_text(CONFIG)
    ports = cfg.query("ports")
    job = HighLevelJob(
        None,
        cfg.queries,
        JobOptions(bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "c")),
    )
    w0 = (1_700_000_000 * 10**9 - ports.window.origin_ns) // ports.window.pane_ns
    _write(
        job,
        ports,
        1,
        w0,
        [(80, 5, 5000, 1500), (443, 9, 900, 100), (22, 1, 60, 60), (53, 2, 200, 100), (25, 1, 40, 40)],
    )
    _write(job, cfg.query("quiet"), 1, w0, [(80, 5)])
    s = _scrape(job)
    top = [x for x in s["lowwater_job_result"] if x.labels["aggregate"] == "bytes"]
    assert [(x.labels["dst_port"], x.value) for x in top] == [
        ("80", 5000),
        ("443", 900),
        ("53", 200),
    ]  # top 3 by bytes
    assert (
        len(s["lowwater_job_result"]) == 3 * 3
    )  # bounded: top x aggregates, the other groups are not exported
    end_s = (ports.window.origin_ns + (w0 + 1) * ports.window.pane_ns) / 1e9
    # no explicit timestamps (they turn off Prometheus' staleness handling): the window end is its own series
    assert {x.timestamp for x in s["lowwater_job_result"]} == {None}
    ends = {x.labels["query"]: x.value for x in s["lowwater_job_result_window_end_timestamp_seconds"]}
    assert ends == {"ports": end_s}
    totals = {x.labels["aggregate"]: x.value for x in s["lowwater_job_result_all_groups"]}
    assert totals == {"packets": 18, "bytes": 6200, "biggest": 1500}
    assert not any(
        x.labels["query"] == "quiet" for x in s["lowwater_job_result"]
    )  # no `export`: nothing exported
    # a newer window replaces the series; an older one arriving later (a batch with a late window) does not
    _write(job, ports, 2, w0 + 1, [(8080, 1, 10, 10)])
    _write(job, ports, 3, w0 - 5, [(80, 100, 10**6, 1500)])
    s = _scrape(job)
    assert [(x.labels["dst_port"], x.labels["aggregate"], x.value) for x in s["lowwater_job_result"]] == [
        ("8080", "packets", 1),
        ("8080", "bytes", 10),
        ("8080", "biggest", 10),
    ]
    assert [x.value for x in s["lowwater_job_result_window_end_timestamp_seconds"]] == [end_s + 10]


def test_export_by_must_name_an_aggregate() -> None:
    with pytest.raises(Q.ConfigError, match="export.by"):
        Q.load_text(CONFIG.replace("by: bytes", "by: bites"))
    with pytest.raises(Q.ConfigError, match="top"):
        Q.load_text(CONFIG.replace("top: 3", "top: 100000"))
