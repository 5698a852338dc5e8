"""Fixture data for the serving-layer tests: a small results store in the agreed layout, plus a config.

Used by ``tests/test_api.py``, ``tests/test_results_page.py``, the live-page and concurrency tests. The store mimics what the high-level job writes: ``query=<q>/date=YYYY-MM-DD/part-<batch>.parquet``
with window_start/window_end (timestamp[us, UTC]), key columns, aggregate columns, closed_at, hosts
and kind ('final' | 'correction'), one file per batch, plus ``_status.json``. Windows end within the
last hour so the API's default range covers them; expectations are computed from the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R
from lowwater_testing.queries import config, q4, query, tcp_ports

CONFIG = config(
    q4(description="packet count per (srcIP, dstIP) per minute"),
    query(
        "bytes_per_dst24",
        description="bytes and packets per destination /24",
        group_by=["dst_ip/24"],
        aggregates=[
            "sum(length) as bytes",
            "count as packets",
            "avg(length) as avg_len",
            "max(length) as max_len",
        ],
        window="1m",
    ),
    tcp_ports(
        "syn_per_port",
        description="TCP SYNs per destination port, 1 minute sliding every 10 s",
        filter="protocol == tcp and tcp_flags & SYN and not tcp_flags & ACK",
        window={"range": "1m", "slide": "10s"},
    ),
    query(
        "avg_only",
        description="average length per source port (no count aggregate)",
        group_by=["src_port"],
        aggregates=["avg(length) as avg_len", "min(ttl) as min_ttl"],
        window="1m",
    ),
).text

SRC = [
    "10.0.0.1",
    "10.0.0.2",
    "10.1.2.3",
    "10.200.0.9",
    "192.168.1.10",
    "172.16.5.4",
    "2001:db8::1",
    "2001:db8::2",
    "2001:db8:1::7",
    "fd00::1:2",
    "2001:db8::ffff:1",
]
DST = ["10.9.9.9", "8.8.8.8", "2001:db8:aa::53"]
DST24 = ["10.9.9.0", "8.8.8.0", "192.0.2.0", "2001:db8:aa::", "2001:db8:bb::"]
PORTS = [22, 53, 80, 443, 8080, 3306]
TS = pa.timestamp("us", tz="UTC")
N_WINDOWS = 20
INCOMPLETE_DEAD = 12  # q4_pairs: the window closed while a host was dead (every group incomplete)
INCOMPLETE_LATE = 15  # q4_pairs: one group of this window lost 3 late partials (policy drop)


@dataclass
class Store:
    """A written fixture store: where it is, and every row written (for expectations)."""

    root: Path
    config: Path
    rows: dict[str, pd.DataFrame]  # query -> all rows (finals and corrections)
    first: datetime  # window_start of the first window
    last: datetime  # window_start of the newest window with finals


def _write(root: Path, query: str, batch: int, df: pd.DataFrame, schema: pa.Schema) -> None:
    day = df["window_start"].min().date().isoformat()
    d = root / f"query={query}" / f"date={day}"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pandas(df, schema=schema, preserve_index=False), d / f"part-{batch:012d}.parquet"
    )


def result_schema(keys: list[tuple[str, pa.DataType]], aggs: list[tuple[str, pa.DataType]]) -> pa.Schema:
    """A stored result file's schema: the window, ``keys``, ``aggs`` and the product's closing columns."""
    return pa.schema([("window_start", TS), ("window_end", TS), *keys, *aggs, *R.CLOSING_FIELDS])


def frame(ws: datetime, range_s: int, recs: list[dict], kind: str) -> pd.DataFrame:
    """Stored rows of one window (``recs``: keys and values) with the closing columns of a complete
    window on two hosts; a correction closes 40 s after the window's finals."""
    df = pd.DataFrame(recs)
    df.insert(0, "window_start", pd.Timestamp(ws))
    df.insert(1, "window_end", pd.Timestamp(ws + timedelta(seconds=range_s)))
    df["closed_at"] = pd.Timestamp(ws + timedelta(seconds=range_s + 3 + (40 if kind == "correction" else 0)))
    df["hosts"] = np.int32(2)
    df["hosts_expected"] = np.int32(2)
    df["hosts_in_mark"] = np.int32(2)
    df["late_partials"] = np.int64(0)
    df["missing_records"] = np.int64(0)
    df["complete"] = True
    df["kind"] = kind
    return df


def make_store(root: Path, now: datetime | None = None, seed: int = 3) -> Store:
    """Write the fixture store under ``root`` (windows in the 25 minutes before ``now``)."""
    now = now or datetime.now(UTC)
    rng = np.random.default_rng(seed)
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=N_WINDOWS + 5)
    root.mkdir(parents=True, exist_ok=True)
    config = root.parent / "lowwater-test.yaml"
    config.write_text(CONFIG)
    written: dict[str, list[pd.DataFrame]] = {}
    batch = 0

    def put(query: str, df: pd.DataFrame, schema: pa.Schema) -> None:
        """``df`` as the next batch's file of ``query``, kept in the rows the fixture expects."""
        nonlocal batch
        _write(root, query, batch, df, schema)
        written.setdefault(query, []).append(df)
        batch += 1

    # q4_pairs: every (src, dst) pair per window, one file per window; window 7 split over two
    # files (two partitions closing it in different batches); corrections for windows 3 and 9,
    # including one group that only ever appears as a correction
    schema = result_schema([("src_ip", pa.string()), ("dst_ip", pa.string())], [("packets", pa.int64())])
    finals = []
    for w in range(N_WINDOWS):
        ws = first + timedelta(minutes=w)
        recs = [
            {"src_ip": s, "dst_ip": d, "packets": int(rng.integers(1, 60)) * (3 if s == "10.0.0.1" else 1)}
            for s in SRC
            for d in DST
            if rng.random() < 0.8
        ]
        recs[0]["packets"] = recs[1]["packets"] = 77  # a tie, broken by the key columns
        df = frame(ws, 60, recs, "final")
        if w == INCOMPLETE_DEAD:  # closed after a host died before its mark passed the window
            df["hosts"] = df["hosts_in_mark"] = np.int32(1)
            df["complete"] = False
        if w == 7:
            put("q4_pairs", df.iloc[: len(df) // 2], schema)
            put("q4_pairs", df.iloc[len(df) // 2 :], schema)
        else:
            put("q4_pairs", df, schema)
        finals.append(df)
        if w in (4, 10):  # corrections for an older window, in a batch of their own
            cw = w - 1 if w == 4 else 9
            base = finals[cw]
            corr = base.iloc[[0, 2, 5]][["src_ip", "dst_ip"]].to_dict("records")
            for i, c in enumerate(corr):
                c["packets"] = 100 + i
            corr.append({"src_ip": "10.77.0.1", "dst_ip": "8.8.8.8", "packets": 5})  # correction-only group
            cdf = frame(first + timedelta(minutes=cw), 60, corr, "correction")
            put("q4_pairs", cdf, schema)
        if w == INCOMPLETE_LATE + 1:  # late partials dropped for one group of the previous window
            ldf = frame(
                first + timedelta(minutes=INCOMPLETE_LATE),
                60,
                [{**finals[INCOMPLETE_LATE].iloc[1][["src_ip", "dst_ip"]].to_dict(), "packets": 999}],
                "late",
            )
            ldf["late_partials"] = np.int64(3)
            ldf["complete"] = False
            put("q4_pairs", ldf, schema)

    # bytes_per_dst24: sum/count/avg/max with corrections (avg folded exactly via the count)
    schema = result_schema(
        [("dst_ip_24", pa.string())],
        [("bytes", pa.int64()), ("packets", pa.int64()), ("avg_len", pa.float64()), ("max_len", pa.int64())],
    )
    for w in range(N_WINDOWS):
        ws = first + timedelta(minutes=w)
        recs = []
        for d in DST24:
            n = int(rng.integers(1, 40))
            lens = rng.integers(60, 1500, n)
            recs.append(
                {
                    "dst_ip_24": d,
                    "bytes": int(lens.sum()),
                    "packets": n,
                    "avg_len": float(lens.mean()),
                    "max_len": int(lens.max()),
                }
            )
        df = frame(ws, 60, recs, "final")
        put("bytes_per_dst24", df, schema)
        if w == 6:
            lens = np.array([1400, 1450])
            cdf = frame(
                first + timedelta(minutes=2),
                60,
                [
                    {
                        "dst_ip_24": DST24[1],
                        "bytes": int(lens.sum()),
                        "packets": 2,
                        "avg_len": float(lens.mean()),
                        "max_len": int(lens.max()),
                    }
                ],
                "correction",
            )
            put("bytes_per_dst24", cdf, schema)

    # syn_per_port: sliding windows (1 m every 10 s): several windows per batch file
    schema = result_schema([("dst_port", pa.int64())], [("syns", pa.int64()), ("min_ttl", pa.int64())])
    for b in range(N_WINDOWS):
        parts = []
        for k in range(6):
            ws = first + timedelta(minutes=b, seconds=10 * k)
            recs = [
                {"dst_port": p, "syns": int(rng.integers(0, 500)), "min_ttl": int(rng.integers(30, 64))}
                for p in PORTS
            ]
            parts.append(frame(ws, 60, recs, "final"))
        df = pd.concat(parts, ignore_index=True)
        put("syn_per_port", df, schema)

    # avg_only: no count aggregate, so corrections cannot be folded into avg (the final's avg stays)
    schema = result_schema([("src_port", pa.int64())], [("avg_len", pa.float64()), ("min_ttl", pa.int64())])
    for w in range(N_WINDOWS):
        ws = first + timedelta(minutes=w)
        recs = [
            {"src_port": p, "avg_len": float(rng.integers(60, 1500)), "min_ttl": int(rng.integers(30, 64))}
            for p in PORTS
        ]
        df = frame(ws, 60, recs, "final")
        put("avg_only", df, schema)
    cdf = frame(
        first + timedelta(minutes=5),
        60,
        [{"src_port": PORTS[0], "avg_len": 9999.0, "min_ttl": 1}],
        "correction",
    )
    put("avg_only", cdf, schema)
    rows = {query: pd.concat(dfs, ignore_index=True) for query, dfs in written.items()}
    write_status(root, now)
    return Store(root, config, rows, first, first + timedelta(minutes=N_WINDOWS - 1))


def write_flagged(
    root: Path, query: str, window_start: datetime, range_s: int, host: str, records: int, batch: int = 10**6
) -> None:
    """A flagged-window file (contract.results.INCOMPLETE_SCHEMA): ``host`` shed every pane of one window."""
    us = int(window_start.timestamp()) * 1_000_000
    end = us + range_s * 1_000_000
    t = pa.table(
        {
            "window_start": [us],
            "window_end": [end],
            "flagged_at": [end + 5_000_000],
            "partition": [0],
            "host": [host],
            "cause": ["shed"],
            "first_pane_start": [us],
            "last_pane_end": [end],
            "records": [records],
            "after_close": [False],
        }
    ).cast(R.INCOMPLETE_SCHEMA)
    path = R.incomplete_part_path(root, query, window_start.date(), batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)


def write_status(root: Path, now: datetime) -> dict:
    """A ``_status.json`` of the status contract, summarised by the job's own functions: two capture
    hosts on q4_pairs' two partitions, cap-b dead and 90 s behind on partition 0."""
    from contract import status as S

    now_ms = int(now.timestamp() * 1000)
    mark = now_ms * 10**6 - 20 * 10**9

    # what every host here shares: heard half a second ago, 9 punctuations, 100 records
    alike = dict(
        expected=False, last_heard_ms=now_ms, silent_s=0.5, punctuations=9, incarnation=1, records=100
    )

    def host(mark_ns: int, live: bool, lag: float, late: int, missing: int) -> S.HostOnPartition:
        return S.HostOnPartition(
            live=live,
            mark_pane=mark_ns // 10**10,
            mark_ns=mark_ns,
            lag_s=lag,
            sent_records=100,
            received_records=100 - missing,
            missing_records=missing,
            late_partials=late,
            **alike,
        )

    def part(
        q: str, p: int, hosts: dict[str, S.HostOnPartition], open_windows: int, lwm: int | None
    ) -> S.PartitionStatus:
        return S.PartitionStatus(
            query=q,
            partition=p,
            now_ms=now_ms,
            low_water_mark_pane=None if lwm is None else lwm // 10**10,
            low_water_mark_ns=lwm,
            closed_before_window=None,
            blocked_by=["cap-a"],
            live_hosts=1,
            open_windows=open_windows,
            state_rows=10 * open_windows,
            windows_closed=5,
            records=100,
            hosts=hosts,
        )

    queries = {
        "q4_pairs": S.summarize_query(
            {
                0: part(
                    "q4_pairs",
                    0,
                    {
                        "cap-a": host(mark, True, 1.5, 3, 0),
                        "cap-b": host(mark - 90 * 10**9, False, 95.0, 10, 4),
                    },
                    2,
                    mark,
                ),
                1: part("q4_pairs", 1, {"cap-a": host(mark, True, 2.0, 1, 0)}, 1, mark),
            }
        ),
        "bytes_per_dst24": S.summarize_query({0: part("bytes_per_dst24", 0, {}, 0, None)}),
    }
    doc = status_document(queries, now_ms, 4, [])
    (root / "_status.json").write_text(doc.model_dump_json())
    return doc.model_dump(mode="json")


def status_document(queries: dict, now_ms: int, batch_id: int, expected_hosts: list[str]) -> Any:
    """A ``contract.status.StatusDocument`` over ``queries`` (query: summary) with these tests' job
    settings: a 1 s trigger, 10 s host timeout, late partials dropped."""
    from contract import status as S

    settings = S.JobSettings(
        trigger_ms=1000,
        host_timeout_ms=10_000,
        expected_hosts=expected_hosts,
        late_policy="drop",
        watermark_delay_ms=10_000,
    )
    return S.StatusDocument(
        mode="oop",
        updated_ms=now_ms,
        batch_id=batch_id,
        settings=settings,
        queries=queries,
        hosts=S.summarize_hosts(queries),
    )


def folded(store: Store, query: str, keys: list[str]) -> pd.DataFrame:
    """Expected rows: corrections folded into finals (count/sum add, min/max, avg weighted by packets);
    late rows add nothing to the values, their late partials, and make their group incomplete."""
    all_rows = store.rows[query]
    flags = all_rows.groupby(["window_start", *keys], as_index=False).agg(
        late_partials=("late_partials", "sum"), complete=("complete", "all")
    )
    df = all_rows[all_rows["kind"] != "late"].copy()
    aggs = {
        c: ("sum" if c in ("packets", "bytes", "syns") else "max" if c.startswith("max") else "min")
        for c in df.columns
        if c in ("packets", "bytes", "syns", "max_len", "min_ttl")
    }
    g = df.groupby(["window_start", *keys], as_index=False)
    out = g.agg({**aggs, "window_end": "max"})
    if "avg_len" in df.columns and "packets" in df.columns:
        df["_w"] = df["avg_len"] * df["packets"]
        w = df.groupby(["window_start", *keys], as_index=False).agg(_w=("_w", "sum"), _n=("packets", "sum"))
        out["avg_len"] = (w["_w"] / w["_n"]).to_numpy()
    elif "avg_len" in df.columns:
        fin = df[df["kind"] == "final"].set_index(["window_start", *keys])["avg_len"]
        out["avg_len"] = [
            fin.get(tuple(r), np.nan) if keys else fin.get(r[0], np.nan)
            for r in out[["window_start", *keys]].itertuples(index=False)
        ]
    out["corrections"] = g["kind"].agg(lambda s: int((s == "correction").sum()))["kind"].to_numpy()
    return out.merge(flags, on=["window_start", *keys], how="left")


def iso(t: datetime | pd.Timestamp) -> str:
    """The API's time text: ISO-8601 UTC with 'Z'."""
    return pd.Timestamp(t).tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
