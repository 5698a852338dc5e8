"""The results index under a writing job: readers on a thread pool while ``ResultStore`` writes.

The FileIndex is shared by every request thread. A refresh must never edit a listing another thread
is reading (it publishes a new immutable one), and a directory changed within the same mtime tick as
its listing must not be trusted. The stress test writes batches through the real writer (replays
rewrite files, some after deleting them) while several threads read, and checks every answer equals
the fold of the batches it saw, no torn file, and that no batch completed before the read is missed.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from contract import fields as F
from contract import results as R
from contract.query import load
from high_level.results.store import ResultStore
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import FileIndex
from high_level.serve.reader import Reader
from lowwater_testing.store import CONFIG, DST24

QUERY = "bytes_per_dst24"  # sum, count, avg (folded exactly via the count) and max
BASE = datetime(2024, 5, 1, 1, 0, tzinfo=UTC)  # all windows in one day: one file per batch
N_BATCHES = 40
US = 1_000_000


@pytest.fixture()
def qi(tmp_path: Path) -> QueryInfo:
    cfg = tmp_path / "lowwater.yaml"
    cfg.write_text(CONFIG)
    return QueryInfo.of(load(cfg).query(QUERY))


def _lens(w: int, g: int) -> list[int]:
    """Packet lengths of group g in window w (finals); deterministic, so expectations can be rebuilt."""
    return [100 + 10 * g + w + i for i in range(1 + (7 * w + 3 * g) % 5)]


def _batch(b: int) -> list[dict]:
    """Batch b: the finals of window b for every group, and (even b) a correction of window b-1, group 0."""
    rows = [("final", b, g, _lens(b, g)) for g in range(len(DST24))]
    if b and b % 2 == 0:
        rows.append(("correction", b - 1, 0, [1000 + b]))
    return [{"kind": k, "w": w, "g": g, "lens": lens} for k, w, g, lens in rows]


def _generic(b: int) -> pd.DataFrame:
    out = []
    for r in _batch(b):
        ws_ns = int((BASE + timedelta(minutes=r["w"])).timestamp()) * 10**9
        hi, lo = F.ip_to_words(DST24[r["g"]])
        lens = r["lens"]
        out.append(
            {
                "query": QUERY,
                "partition": 0,
                "window": r["w"],
                "window_start_ns": ws_ns,
                "window_end_ns": ws_ns + 60 * 10**9,
                "key": [F.to_int64(hi), F.to_int64(lo)],
                "state": [sum(lens), len(lens), sum(lens), len(lens), max(lens)],
                "kind": r["kind"],
                "closed_at_ms": ws_ns // 10**6 + 61_000 + b,
                "hosts": 2,
                "hosts_expected": 2,
                "hosts_in_mark": 2,
                "late_partials": 0,
                "missing_records": 0,
                "status": None,
            }
        )
    return pd.DataFrame(out)


def _expected(seen: set[int]) -> dict[tuple[int, str], tuple]:
    """(window_start us, dst) -> (bytes, packets, avg_len, max_len, corrections) folded over the batches seen."""
    acc: dict[tuple[int, str], list] = {}
    for b in seen:
        for r in _batch(b):
            k = (int((BASE + timedelta(minutes=r["w"])).timestamp()) * US, DST24[r["g"]])
            a = acc.setdefault(k, [0, 0, 0, 0])
            a[0] += sum(r["lens"])
            a[1] += len(r["lens"])
            a[2] = max(a[2], max(r["lens"]))
            a[3] += r["kind"] == "correction"
    return {k: (s, n, round(s / n, 6), m, c) for k, (s, n, m, c) in acc.items()}


def _got(rows: list[tuple], qi: QueryInfo) -> dict[tuple[int, str], tuple]:
    cols = ["window_start", "window_end", *qi.key_names, *qi.agg_names, "hosts", "closed_at", "corrections"]
    out = {}
    for r in rows:
        d = dict(zip(cols, r, strict=False))
        out[(d["window_start"], d["dst_ip_24"])] = (
            d["bytes"],
            d["packets"],
            round(d["avg_len"], 6),
            d["max_len"],
            d["corrections"],
        )
    return out


def _check_top(rows: list[tuple], qi: QueryInfo) -> None:
    """Top-2 per window (the cached fast path): each window's rows are the top 2 of the fold of the
    batches that can hold it (its own finals, the next batch's correction, or both)."""
    got: dict[int, list] = {}
    for r in rows:
        ws, rank = r[0], r[-1]
        got.setdefault(ws, []).append((rank, r[2], *_got([r[:-1]], qi)[(ws, r[2])]))
    for ws, have in got.items():
        w = (ws - int(BASE.timestamp()) * US) // (60 * US)
        options = []
        for batches in ({w}, {w, w + 1}, {w + 1}):
            exp = sorted(
                ((k[1], v) for k, v in _expected(batches).items() if k[0] == ws),
                key=lambda e: (-e[1][0], e[0]),
            )
            options.append([(i + 1, dst, *v) for i, (dst, v) in enumerate(exp[:2])])
        assert sorted(have) in options, (w, sorted(have), options)


def test_readers_while_the_writer_writes_and_replays(tmp_path: Path, qi: QueryInfo) -> None:
    """4 threads (two sharing a cached Reader, one reading Parquet, one on the bare index; full folds and
    top-2) while the writer writes 40 batches and replays every 4th earlier one (half deleted first)."""
    root = tmp_path / "results"
    writer = ResultStore(root, [qi.spec])
    start, end = BASE, BASE + timedelta(minutes=N_BATCHES + 1)
    cached, parquet = Reader(root), Reader(root, cache_mb=0)
    started: dict[int, float] = {}
    done: dict[int, float] = {}
    absent: list[tuple[int, float, float]] = []  # (batch, deleted at, rewritten at)
    errors: list[BaseException] = []
    reads: list[tuple[float, float, set[int], dict]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def write() -> None:
        try:
            for b in range(N_BATCHES):
                started[b] = time.monotonic()
                writer.write_batch(b, _generic(b))
                done[b] = time.monotonic()
                if b % 4 == 3:  # a replay of an earlier batch: the same file again
                    j = b - 2
                    if b % 8 == 7:
                        t = time.monotonic()
                        os.remove(R.part_path(root, QUERY, BASE.date(), j))
                        writer.write_batch(j, _generic(j))
                        absent.append((j, t, time.monotonic()))
                    else:
                        writer.write_batch(j, _generic(j))
                time.sleep(0.01)
            done[-1] = time.monotonic()  # the last replay included
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            stop.set()

    def read(reader: Reader) -> None:
        try:
            while True:
                last = stop.is_set()
                t0 = time.monotonic()
                got = _got(reader.results(qi, start, end, [], [], None, 10_000, 0).rows, qi)
                t1 = time.monotonic()
                seen = {
                    (ws - int(BASE.timestamp()) * US) // (60 * US) for (ws, dst) in got if dst != DST24[0]
                }
                with lock:
                    reads.append((t0, t1, seen, got))
                _check_top(reader.results(qi, start, end, [], [], 2, 10_000, 0).rows, qi)
                reader.series(qi, start, end, [])
                reader.latest_window(qi)
                if last:
                    return
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def list_files() -> None:
        try:
            while not stop.is_set():
                dirs = [p for _, p in cached.index.date_dirs(QUERY)]
                files = cached.index.files_in(qi.spec, dirs)
                assert len({f.path for f in files}) == len(files)
                assert all(f.min_us is not None and f.batch >= 0 for f in files)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write)]
    threads += [threading.Thread(target=read, args=(r,)) for r in (cached, cached, parquet)]
    threads.append(threading.Thread(target=list_files))
    t_begin = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "threads did not finish"
    assert time.monotonic() - t_begin < 60
    assert not errors, errors[0]
    assert len(reads) >= 6
    for t0, t1, seen, got in reads:
        assert got == _expected(seen)  # exactly the fold of whole batches: nothing torn, nothing doubled
        must = {b for b, t in done.items() if t < t0 and b >= 0} - {
            j for j, a, z in absent if a < t1 and z > t0
        }
        assert must <= seen, f"batches {sorted(must - seen)} were complete before the read but missed"
        assert seen <= {b for b, t in started.items() if t < t1}
    final = [s for t0, _, s, _ in reads if t0 > done[-1]]
    assert len(final) >= 3 and all(s == set(range(N_BATCHES)) for s in final)
    assert cached.index.rejections == parquet.index.rejections == 0
    cached.close()
    parquet.close()


def test_a_refresh_never_edits_the_published_listing(tmp_path: Path, qi: QueryInfo) -> None:
    """A file vanishing from a directory whose mtime did not change (deleted within the same mtime
    tick): the next request drops it, and the listing other threads hold is left as it was."""
    writer = ResultStore(tmp_path, [qi.spec])
    for b in range(3):
        writer.write_batch(b, _generic(b))
    d = R.date_dir(tmp_path, QUERY, BASE.date())
    old = time.time_ns() - 5 * 10**9  # an mtime well before the listing: the listing is trusted
    os.utime(d, ns=(old, old))
    index = FileIndex(tmp_path)
    assert len(index.files_in(qi.spec, [str(d)])) == 3
    held = index._dirs[str(d)]
    held_files, held_good = dict(held.files), dict(held.good)
    os.remove(R.part_path(tmp_path, QUERY, BASE.date(), 1))
    os.utime(d, ns=(old, old))
    assert sorted(f.batch for f in index.files_in(qi.spec, [str(d)])) == [0, 2]
    assert dict(held.files) == held_files and held.good == held_good and len(held.good[None]) == 3
    assert index._dirs[str(d)] is not held


def test_a_change_in_the_same_mtime_tick_as_the_listing_is_seen(tmp_path: Path, qi: QueryInfo) -> None:
    """A file renamed into a directory right after it was listed may leave the directory's mtime as it
    was (coarse filesystem clocks): a listing that close to the mtime is re-done, not trusted for 30 s."""
    writer = ResultStore(tmp_path, [qi.spec])
    writer.write_batch(0, _generic(0))
    d = R.date_dir(tmp_path, QUERY, BASE.date())
    mtime = os.stat(d).st_mtime_ns  # just written: within the slack of the listing below
    index = FileIndex(tmp_path)
    assert [f.batch for f in index.files_in(qi.spec, [str(d)])] == [0]
    writer.write_batch(1, _generic(1))
    os.utime(d, ns=(mtime, mtime))  # the same tick as before
    assert sorted(f.batch for f in index.files_in(qi.spec, [str(d)])) == [0, 1]
    assert pq.read_metadata(R.part_path(tmp_path, QUERY, BASE.date(), 1)).num_rows == len(_batch(1))
