"""A results store spanning ~60 days for the long-range API tests and the range page test.

1-minute windows of ``bytes_per_dst24`` and ``q4_pairs`` (the fixture config of
:mod:`lowwater_testing.store`), a few windows a day at random minutes, some whole days empty, with
correction and late rows, one file per window in the contract's layout; every row is kept for oracles.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R
from contract.query import load
from lowwater_testing.store import CONFIG

DAYS = 60
Q = "bytes_per_dst24"
KEYS = ["10.9.9.0", "8.8.8.0", "192.0.2.0", "2001:db8:aa::", "2001:db8:bb::", "198.51.100.0"]
PAIR_SRC = [f"10.0.{i}.{j}" for i in range(3) for j in range(4)]
PAIR_DST = ["8.8.8.8", "2001:db8:aa::53", "10.9.9.9"]


@dataclass
class RangeStore:
    root: Path
    config: Path
    rows: dict[str, pd.DataFrame]
    first_day: datetime
    now: datetime


def frame(ws: datetime, recs: list[dict], kind: str) -> pd.DataFrame:
    df = pd.DataFrame(recs)
    df.insert(0, "window_start", pd.Timestamp(ws))
    df.insert(1, "window_end", pd.Timestamp(ws + timedelta(minutes=1)))
    df["closed_at"] = pd.Timestamp(ws + timedelta(minutes=1, seconds=3))
    df["hosts"] = np.int32(2)
    df["hosts_expected"] = np.int32(2)
    df["hosts_in_mark"] = np.int32(2)
    df["late_partials"] = np.int64(0)
    df["missing_records"] = np.int64(0)
    df["complete"] = True
    df["kind"] = kind
    return df


def write_part(root: Path, spec: object, query: str, batch: int, df: pd.DataFrame) -> None:
    day = df["window_start"].min().date()
    path = R.part_path(root, query, day, batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, schema=R.schema(spec), preserve_index=False), path)


def make_range_store(root: Path, seed: int = 11) -> RangeStore:
    """~DAYS days, 3-5 windows a day at random minutes, one file per window, corrections and late rows."""
    rng = np.random.default_rng(seed)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    first_day = (now - timedelta(days=DAYS)).replace(hour=0, minute=0)
    root.mkdir(parents=True, exist_ok=True)
    config = root.parent / "lowwater-range.yaml"
    config.write_text(CONFIG)
    specs = {q.name: q for q in load(config).stored_queries}
    frames: dict[str, list[pd.DataFrame]] = {Q: [], "q4_pairs": []}
    batch = 0
    for d in range(DAYS):
        day = first_day + timedelta(days=d)
        if d % 9 == 4:  # whole days without rows: empty steps
            continue
        minutes = np.sort(rng.choice(24 * 60, int(rng.integers(3, 6)), replace=False))
        for m in minutes.tolist():
            ws = day + timedelta(minutes=m)
            if ws >= now - timedelta(minutes=2):
                continue
            recs = []
            for k in KEYS:
                if rng.random() < 0.75:
                    n = int(rng.integers(1, 200))
                    recs.append(
                        {
                            "dst_ip_24": k,
                            "bytes": n * int(rng.integers(40, 1500)),
                            "packets": n,
                            "avg_len": float(rng.integers(40, 1500)),
                            "max_len": int(rng.integers(40, 1500)),
                        }
                    )
            if not recs:
                continue
            df = frame(ws, recs, "final")
            write_part(root, specs[Q], Q, batch, df)
            frames[Q].append(df)
            batch += 1
            pairs = [
                {"src_ip": s, "dst_ip": t, "packets": int(rng.integers(1, 9))}
                for s in PAIR_SRC
                for t in PAIR_DST
                if rng.random() < 0.5
            ]
            if pairs:
                pdf = frame(ws, pairs, "final")
                write_part(root, specs["q4_pairs"], "q4_pairs", batch, pdf)
                frames["q4_pairs"].append(pdf)
                batch += 1
            if rng.random() < 0.3:  # a correction of this window (one group may exist only as one)
                k = KEYS[int(rng.integers(0, len(KEYS)))]
                c = frame(
                    ws,
                    [{"dst_ip_24": k, "bytes": 1000, "packets": 3, "avg_len": 333.0, "max_len": 1499}],
                    "correction",
                )
                write_part(root, specs[Q], Q, batch, c)
                frames[Q].append(c)
                batch += 1
            if rng.random() < 0.1:  # a late row: annotates, adds nothing
                late = frame(
                    ws,
                    [{"dst_ip_24": KEYS[0], "bytes": 10**9, "packets": 10**6, "avg_len": 1.0, "max_len": 1}],
                    "late",
                )
                late["late_partials"] = np.int64(2)
                late["complete"] = False
                write_part(root, specs[Q], Q, batch, late)
                frames[Q].append(late)
                batch += 1
    rows = {q: pd.concat(fs, ignore_index=True) for q, fs in frames.items()}
    return RangeStore(root, config, rows, first_day, now)
