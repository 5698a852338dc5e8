"""Compaction and roll-up tiers of the results store (issue #30 parts 1-2).

Real Parquet files written by the job's own ResultStore, a real Spark-style ``commits/`` directory,
readers through the API's FileIndex and the real API (TestClient), and real SIGKILLs of the
maintenance pass (``python -m high_level.results.compact``) at its steps. Tiers are checked exactly
against :func:`lowwater_testing.oracle.tier_oracle`, computed from the windows' integer state before
anything was stored.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract import aggregates as A
from contract import query as Q
from contract import results as R
from contract import status as S
from high_level.results import tiers as T
from high_level.results.compact import Compactor, committed_batch
from high_level.results.store import ResultStore
from high_level.serve.fileindex import FileIndex
from lowwater_testing.oracle import tier_oracle
from lowwater_testing.queries import config, query

ROOT = Path(__file__).resolve().parents[1]
QN = "bytes_per_port"
BASE = datetime(2024, 5, 1, 22, 0, tzinfo=UTC)  # 3 hours from 22:00: two days, so day directories split
MIN_NS = 60 * 10**9
GROUPS = 12
CONFIG = config(
    query(
        QN,
        group_by=["dst_port"],
        aggregates=[
            "count as packets",
            "sum(length) as bytes",
            "avg(length) as avg_len",
            "min(length) as min_len",
            "max(length) as max_len",
            "variance(length) as len_var",
            "stddev(length) as len_sd",
        ],
        window="1m",
        tiers=["5m", "1h"],
        retention={"raw": "3650d", "5m": "3650d"},
    )
).text


@pytest.fixture()
def q(tmp_path: Path) -> Q.QuerySpec:
    cfg = tmp_path / "lowwater.yaml"
    cfg.write_text(CONFIG)
    return Q.load(str(cfg)).query(QN)


def _lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(40, 1500, n).astype(np.int64)


def _state(q: Q.QuerySpec, lens: np.ndarray) -> list[int]:
    """The query's state columns over these packet lengths (registry lifts and merges)."""
    out = []
    for a in q.aggregates:
        values = lens if a.field else np.ones(len(lens), np.int64)
        for p in A.REGISTRY[a.fn].parts(a):
            out.append(int(A.MERGE_UFUNCS[p.merge].reduce(A.lift(p, values))))
    return out


def _batches(
    q: Q.QuerySpec, n: int, seed: int = 7
) -> tuple[list[pd.DataFrame], list[tuple[int, int, list[int]]]]:
    """Batch b closes minute b for a random subset of groups; every 4th batch also brings a correction
    of minute b-3 (late records folded in) and every 6th a ``late`` row of minute b-2 (dropped records:
    never part of the value). Returns the generic rows per batch and what the value holds:
    (window_start_ns, port, state) per final or correction row."""
    rng = np.random.default_rng(seed)
    batches, truth = [], []
    base_ns = int(BASE.timestamp()) * 10**9
    for b in range(n):
        rows = []
        for g in sorted(rng.choice(GROUPS, size=rng.integers(3, GROUPS), replace=False).tolist()):
            rows.append(("final", b, 1000 + g, _lengths(rng, int(rng.integers(1, 30)))))
        if b >= 3 and b % 4 == 0:
            rows.append(("correction", b - 3, 1000 + int(rng.integers(0, GROUPS)), _lengths(rng, 3)))
        if b >= 2 and b % 6 == 0:
            rows.append(("late", b - 2, 1000 + int(rng.integers(0, GROUPS)), _lengths(rng, 2)))
        out = []
        for kind, w, port, lens in rows:
            ws = base_ns + w * MIN_NS
            st = _state(q, lens)
            late = len(lens) if kind in ("late", "correction") else 0
            out.append(
                {
                    "query": QN,
                    "partition": 0,
                    "window": w,
                    "window_start_ns": ws,
                    "window_end_ns": ws + MIN_NS,
                    "key": [port],
                    "state": st,
                    "kind": kind,
                    "closed_at_ms": ws // 10**6 + 61_000 + b,
                    "hosts": 2,
                    "hosts_expected": 2,
                    "hosts_in_mark": 2,
                    "late_partials": late,
                    "missing_records": 0,
                    "status": None,
                }
            )
            if kind != "late":
                truth.append((ws, port, st))
        batches.append(pd.DataFrame(out))
    return batches, truth


def _write(root: Path, q: Q.QuerySpec, batches: list[pd.DataFrame], first: int = 0) -> None:
    store = ResultStore(root, [q])
    for b, rows in enumerate(batches[first:], start=first):
        store.write_batch(b, rows)


def _commit(ckpt: Path, through: int) -> None:
    """Spark's commit log of the OOP stream: one file per committed batch."""
    d = ckpt / "oop-chunked" / "commits"
    d.mkdir(parents=True, exist_ok=True)
    for b in range(through + 1):
        (d / str(b)).touch()


def _visible(folder: Path, ranged=R.batch_range) -> list[Path]:
    named = {e.name: r for e in os.scandir(folder) if (r := ranged(e.name)) is not None}
    return [folder / n for n in R.visible_files(named)]


def _row_hashes(paths: list) -> Counter:
    """The multiset of the rows of these files (a hash per row, every column)."""
    rows: Counter = Counter()
    for p in paths:
        rows.update(pd.util.hash_pandas_object(pq.read_table(p).to_pandas(), index=False).tolist())
    return rows


def _raw_rows(root: Path, q: Q.QuerySpec) -> Counter:
    """The multiset of raw rows a reader sees (visible files of every day)."""
    return _row_hashes([f for _day, d in R.date_dirs(root, q.name) for f in _visible(d)])


def _tier_fold(root: Path, q: Q.QuerySpec, tier: str) -> pd.DataFrame:
    """A reader's fold of a tier: its visible files' rows per (window, key), by the registry's merges."""
    files = [f for _d, d in R.tier_date_dirs(root, q.name, tier) for f in _visible(d, R.tier_batch_range)]
    for f in files:
        R.check_tier_schema(q, tier, pq.read_schema(f), where=str(f))
    tbl = pa.concat_tables([pq.read_table(f) for f in files])
    t = tbl.to_pandas()
    t["window_start_ns"] = np.asarray(tbl["window_start"].cast(pa.int64()).to_numpy(), np.int64) * 1000
    g = t.groupby(["window_start_ns", "dst_port"], as_index=False).agg(
        packets=("packets", "sum"),
        bytes=("bytes", "sum"),
        s=("avg_len.sum", "sum"),
        n=("avg_len.count", "sum"),
        min_len=("min_len", "min"),
        max_len=("max_len", "max"),
        windows=("windows", "sum"),
        **{f"{a}_{p}": (f"{a}.{p}", "sum") for a in ("len_var", "len_sd") for p in ("count", "sum", "sumsq")},
    )
    g["avg_len"] = g["s"] / g["n"]
    for a, fn in (("len_var", "variance"), ("len_sd", "stddev")):  # the spread of the summed (n, sum, sum2)
        g[a] = A.REGISTRY[fn].finalize(*(g[f"{a}_{p}"].to_numpy(np.int64) for p in ("count", "sum", "sumsq")))
    return g.sort_values(["window_start_ns", "dst_port"]).reset_index(drop=True)


def _oracle(q: Q.QuerySpec, truth: list, width_ns: int) -> pd.DataFrame:
    starts = np.array([t[0] for t in truth], np.int64)
    key = np.array([[t[1]] for t in truth], np.int64)
    state = np.array([t[2] for t in truth], np.int64)
    o = tier_oracle(q, starts, key, state, width_ns).rename(columns={"k0": "dst_port"})
    return o.sort_values(["window_start_ns", "dst_port"]).reset_index(drop=True)


def _check_exact(root: Path, q: Q.QuerySpec, truth: list) -> None:
    for width in q.tiers:
        got = _tier_fold(root, q, R.tier_name(width))
        exp = _oracle(q, truth, width)
        assert len(got) == len(exp) > 0
        for c in ("window_start_ns", "dst_port", "packets", "bytes", "min_len", "max_len"):
            assert got[c].astype("int64").tolist() == exp[c].astype("int64").tolist(), (width, c)
        assert got["avg_len"].tolist() == exp["avg_len"].tolist()  # the same exact integers divided once
        for a in ("len_var", "len_sd"):  # exact: the tier merged the windows' (n, sum, sum2), late rows in
            assert np.array_equal(got[a].to_numpy(), exp[a].to_numpy(), equal_nan=True), (width, a)
        assert got["len_var"].notna().all() and (got["len_var"] > 0).any()


def test_config_tiers_and_retention_errors_name_file_and_line(tmp_path: Path) -> None:
    good = config(
        query("t", aggregates=["count as n", "avg(length) as a"], window="1m", tiers=["5m", "1h"])
    ).text
    spec = Q.load_text(good, "t.yaml").queries[0]
    assert spec.tiers == (300 * 10**9, 3600 * 10**9) and spec.tier_names == ["5m", "1h"]
    cases = [
        (dict(aggregates=["count as n"], window="1m", tiers=["5m", "7m"]), "multiple of the tier before"),
        (dict(aggregates=["count as n"], window="1m", tiers=["90s"]), "multiple of the window"),
        (dict(aggregates=["avg(length) as a"], window="1m", tiers=["5m"]), "needs a count"),
        (
            dict(
                aggregates=["count as n", {"fn": "top", "field": "src_ip", "k": 3, "as": "t"}],
                window="1m",
                tiers=["5m"],
            ),
            "re-merge",
        ),
        (dict(aggregates=["count as n"], window={"range": "1m", "slide": "10s"}, tiers=["5m"]), "tumbling"),
        (dict(aggregates=["count as n"], window="1m", tiers=["5m"], retention={"1h": "1d"}), "not a tier"),
    ]
    for kw, reason in cases:
        with pytest.raises(Q.ConfigError) as e:
            Q.load_text(config(query("t", **kw)).text, "t.yaml")
        assert reason in str(e.value) and "t.yaml:" in str(e.value), str(e.value)


def test_raw_layout_keeps_spread_state_only_with_tiers() -> None:
    """variance/stddev keep (count, sum, sum2) next to their value in the raw files of a query with tiers
    (what its tiers merge); a query without tiers keeps the layout it had."""
    aggs = ["count as n", "variance(length) as v", "stddev(ttl) as s", "avg(length) as a"]
    tiered = Q.load_text(
        config(query("t", aggregates=aggs, window="1m", tiers=["5m"])).text, "t.yaml"
    ).queries[0]
    plain = Q.load_text(config(query("t", aggregates=aggs, window="1m")).text, "t.yaml").queries[0]
    parts = [f"{a}.{p}" for a in ("v", "s") for p in ("count", "sum", "sumsq")]
    assert [c for c, _, _ in R.raw_state_columns(tiered)] == parts
    assert [f.name for f in R.schema(tiered) if "." in f.name] == parts
    assert [f.name for f in R.schema(plain) if "." in f.name] == [] and R.raw_state_columns(plain) == []
    tier = [f.name for f in R.tier_schema(tiered, "5m") if "." in f.name]
    assert tier == [*parts, "a.sum", "a.count"]  # avg's parts are the tier's own, recovered from rows


def test_tiers_exact_and_compaction_keeps_every_row(tmp_path: Path, q: Q.QuerySpec) -> None:
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    batches, truth = _batches(q, 180)
    _write(root, q, batches[:100])
    _commit(ckpt, 99)
    before = _raw_rows(root, q)
    c = Compactor(root, [q], ckpt, grace_s=0)
    c.run_once()  # batches 0..98 final: tiers, then compacted
    assert T.folded_through(root, q.name) == 98
    assert _raw_rows(root, q) == before
    assert any(n.startswith("compact-") for _d, d in R.date_dirs(root, q.name) for n in os.listdir(d))
    _write(root, q, batches, first=100)
    _commit(ckpt, 180)  # 179 batches (0..179) written, all committed
    before = _raw_rows(root, q)
    c.run_once()
    assert T.folded_through(root, q.name) == 179
    assert _raw_rows(root, q) == before
    _check_exact(root, q, truth)
    # covered files are gone; a finished day is one file
    for day, d in R.date_dirs(root, q.name):
        names = os.listdir(d)
        assert set(names) == {p.name for p in _visible(d)}, names
        if day < datetime.now(UTC).date():
            assert len(names) == 1 and names[0].startswith("compact-")
    sizes = c.tier_bytes()[q.name]
    assert set(sizes) == {"raw", "5m", "1h"} and all(v > 0 for v in sizes.values())
    assert c.status.runs == 2 and c.status.files_deleted > 0 and c.status.tier_rows > 0


def test_readers_during_compaction_see_every_row_once(tmp_path: Path, q: Q.QuerySpec) -> None:
    """Readers list and read through the API's FileIndex while passes compact under them: every read
    returns the row multiset of the batches written so far (a file that vanished after the listing
    means: list again). Batches are written, as by the job, before their commit, between reads."""
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    batches, _ = _batches(q, 121, seed=11)
    index = FileIndex(root)
    stop = threading.Event()
    locks = [threading.Lock() for _ in range(2)]
    expected: list[Counter] = [Counter()]
    reads, bad = [0], []

    def reader(lock: threading.Lock) -> None:
        while not stop.is_set():
            with lock:  # one whole read against one expectation
                try:
                    dirs = [p for _d, p in index.date_dirs(q.name)]
                    got = _row_hashes([f.path for f in index.files_in(q, dirs)])
                except FileNotFoundError:
                    index.forget()
                    continue
                if got != expected[0]:
                    bad.append((sum(got.values()), sum(expected[0].values())))
                reads[0] += 1

    threads = [threading.Thread(target=reader, args=(lk,)) for lk in locks]
    for t in threads:
        t.start()
    c = Compactor(root, [q], ckpt, grace_s=0.05, min_files=2)
    try:
        for through in range(10, 121, 10):  # the job writes batches, commits; a pass runs meanwhile
            for lk in locks:
                lk.acquire()
            _write(root, q, batches[: through + 1], first=through - 9 if through > 10 else 0)
            _commit(ckpt, through)
            expected[0] = _raw_rows(root, q)
            for lk in locks:
                lk.release()
            before = reads[0]
            c.run_once()
            deadline = time.monotonic() + 30
            while reads[0] < before + 2 and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reads[0] >= 24 and not bad, bad[:3]
    assert c.status.files_deleted > 0


def test_api_answers_the_same_before_and_after_compaction(tmp_path: Path, q: Q.QuerySpec) -> None:
    from fastapi.testclient import TestClient

    from high_level.serve.api import create_app

    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    batches, _ = _batches(q, 150, seed=5)
    _write(root, q, batches)
    cfg = tmp_path / "lowwater.yaml"
    cfg.write_text(CONFIG)
    params = {"start": BASE.isoformat(), "end": (BASE + timedelta(hours=3)).isoformat(), "limit": "10000"}

    def rows(client: TestClient) -> list:
        r = client.get(f"/queries/{QN}/results", params=params)
        assert r.status_code == 200, r.text
        return sorted(map(repr, r.json()["rows"]))

    for cache_mb in (512, 0):
        with TestClient(create_app(cfg, root, cache_mb=cache_mb)) as client:
            before = rows(client)
            _commit(ckpt, 150)
            Compactor(root, [q], ckpt, grace_s=0).run_once()
            assert rows(client) == before and len(before) > 1000
        with TestClient(create_app(cfg, root, cache_mb=cache_mb)) as client:
            assert rows(client) == before


@pytest.mark.parametrize("point", ["tier_written", "before_rename", "after_rename", "before_delete"])
def test_sigkill_at_each_step_then_restart_gives_identical_rows(
    tmp_path: Path, q: Q.QuerySpec, point: str
) -> None:
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    cfg = tmp_path / "lowwater.yaml"
    cfg.write_text(CONFIG)
    batches, truth = _batches(q, 90, seed=3)
    _write(root, q, batches)
    _commit(ckpt, 90)
    expected = _raw_rows(root, q)
    cmd = [
        sys.executable,
        "-m",
        "high_level.results.compact",
        "--results",
        str(root),
        "--checkpoint",
        str(ckpt),
    ]
    cmd += ["--config", str(cfg), "--grace-s", "0"]
    env = {**os.environ, T.STOP_AT_ENV: point}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "T":  # stopped itself at the point
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert state == "T", f"never reached {point}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _raw_rows(root, q) == expected  # readable and exact at the kill
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert _raw_rows(root, q) == expected
    assert T.folded_through(root, q.name) == 89
    _check_exact(root, q, truth)
    leftovers = [n for _d, d in R.date_dirs(root, q.name) for n in os.listdir(d) if n.startswith(".")]
    assert not leftovers
    assert committed_batch(ckpt, q.name) == 90


def test_retention_per_tier(tmp_path: Path, q: Q.QuerySpec) -> None:
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    spec = Q.load_text(
        CONFIG.replace("raw: 3650d", "raw: 1d").replace("5m: 3650d", "5m: 2d"), "r.yaml"
    ).query(QN)
    batches, _ = _batches(spec, 180)
    _write(root, spec, batches)
    _commit(ckpt, 180)
    # three days after the data: raw (1 day) is gone, 5m (2 days) keeps the second day, 1h (kept) all
    now = (BASE + timedelta(days=3)).timestamp()
    c = Compactor(root, [spec], ckpt, grace_s=0, clock=lambda: now)
    c.run_once()
    assert R.date_dirs(root, spec.name) == []
    assert [d for d, _ in R.tier_date_dirs(root, spec.name, "5m")] == [(BASE + timedelta(days=1)).date()]
    assert len(R.tier_date_dirs(root, spec.name, "1h")) == 2
    assert c.tier_bytes()[spec.name]["raw"] == 0


def test_job_runs_maintenance_and_reports_tiers_in_status_and_metrics(tmp_path: Path, q: Q.QuerySpec) -> None:
    """The job's own thread does the passes; /status (the status document) and the job's Prometheus
    registry carry the store's size per tier."""
    from prometheus_client import generate_latest

    from high_level.job import HighLevelJob, JobOptions

    opts = JobOptions(
        bootstrap="x", results=str(tmp_path / "r"), checkpoint=str(tmp_path / "c"), compact_every_s=0.2
    )
    job = HighLevelJob(None, [q], opts)
    assert job.maintenance is not None
    batches, truth = _batches(q, 40)
    for b, rows in enumerate(batches):
        job.store.write_batch(b, rows)
    _commit(Path(opts.checkpoint), 40)
    job.maintenance.start()
    try:
        deadline = time.monotonic() + 120
        while T.folded_through(job.store.root, q.name) < 39 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        job.maintenance.stop()
    assert T.folded_through(job.store.root, q.name) == 39
    _check_exact(job.store.root, q, truth)
    now_ms = int(time.time() * 1000)
    job.sink.maintain(now_ms, None)
    job.sink.write_status({}, now_ms)
    doc = S.read(job.store.status_path)
    assert set(doc.tier_bytes[q.name]) == {"raw", "5m", "1h"} and doc.tier_bytes[q.name]["5m"] > 0
    assert doc.compaction is not None and doc.compaction.runs >= 1 and doc.compaction.committed_batch == 40
    text = generate_latest(job.metrics.registry).decode()
    assert f'lowwater_job_store_tier_bytes{{query="{q.name}",tier="1h"}}' in text


def test_a_checkpoint_behind_the_store_stops_compaction(tmp_path: Path, q: Q.QuerySpec) -> None:
    """A new checkpoint over old results restarts batch ids: compacting then could hide new files."""
    root, ckpt = tmp_path / "results", tmp_path / "ckpt"
    batches, _ = _batches(q, 30)
    _write(root, q, batches)
    _commit(ckpt, 5)
    names = sorted(n for _d, d in R.date_dirs(root, q.name) for n in os.listdir(d))
    with pytest.raises(RuntimeError, match="checkpoint committed only 5"):
        Compactor(root, [q], ckpt, grace_s=0).run_once()
    assert sorted(n for _d, d in R.date_dirs(root, q.name) for n in os.listdir(d)) == names
    assert T.folded_through(root, q.name) == -1
