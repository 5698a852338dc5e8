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
from lowwater_testing.store import CONFIG, frame

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
            df = frame(ws, 60, recs, "final")
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
                pdf = frame(ws, 60, pairs, "final")
                write_part(root, specs["q4_pairs"], "q4_pairs", batch, pdf)
                frames["q4_pairs"].append(pdf)
                batch += 1
            if rng.random() < 0.3:  # a correction of this window (one group may exist only as one)
                k = KEYS[int(rng.integers(0, len(KEYS)))]
                c = frame(
                    ws,
                    60,
                    [{"dst_ip_24": k, "bytes": 1000, "packets": 3, "avg_len": 333.0, "max_len": 1499}],
                    "correction",
                )
                write_part(root, specs[Q], Q, batch, c)
                frames[Q].append(c)
                batch += 1
            if rng.random() < 0.1:  # a late row: annotates, adds nothing
                late = frame(
                    ws,
                    60,
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


def with_tiers(
    store: RangeStore, query: str | list[str], tiers: list[str], retention: dict[str, str]
) -> Path:
    """A copy of the store's config where ``query`` (one or several) keeps roll-up ``tiers`` with ``retention``."""
    import yaml

    names = {query} if isinstance(query, str) else set(query)
    doc = yaml.safe_load(store.config.read_text())
    for q in doc["queries"]:
        if q["name"] in names:
            q["tiers"], q["retention"] = tiers, retention
    path = store.config.with_name("lowwater-range-tiers.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_tier(store: RangeStore, spec: object, tier: str, split: bool = True) -> pd.DataFrame:
    """Fold the stored rows of ``spec``'s query into ``tier`` windows as the store's roll-up does
    (count/sum add, max folds, avg by its sum and count; late rows only count in late_partials) and
    write them, one file per day; with ``split`` one day is spread over two files (a reader folds
    them), and a covered file of wrong values sits next to them (a reader must skip it). -> the rows."""
    q = spec.name  # type: ignore[attr-defined]
    width = pd.Timedelta(tier)
    df = store.rows[q].copy()
    df["tw"] = df["window_start"].dt.floor(width)
    keys = [k for k, _ in R.key_columns(spec)]  # type: ignore[arg-type]
    v = df[df["kind"] != "late"].copy()
    v["avg_len.sum"] = np.rint(v["avg_len"] * v["packets"]).astype(np.int64)
    v["avg_len.count"] = v["packets"]
    g = v.groupby(["tw", *keys], as_index=False)
    out = g.agg(
        bytes=("bytes", "sum"),
        packets=("packets", "sum"),
        max_len=("max_len", "max"),
        **{"avg_len.sum": ("avg_len.sum", "sum"), "avg_len.count": ("avg_len.count", "sum")},
        closed_at=("closed_at", "max"),
        windows=("window_start", "nunique"),
    )
    out["avg_len"] = out["avg_len.sum"] / out["avg_len.count"]
    late = df.groupby(["tw", *keys], as_index=False).agg(
        late_partials=("late_partials", "sum"), complete=("complete", "all")
    )
    out = out.merge(late, on=["tw", *keys], how="left")
    out = out.rename(columns={"tw": "window_start"})
    out["window_end"] = out["window_start"] + width
    out["hosts"] = out["hosts_expected"] = out["hosts_in_mark"] = np.int32(2)
    out["missing_records"] = np.int64(0)
    out["kind"] = "final"
    schema = R.tier_schema(spec, tier)  # type: ignore[arg-type]
    out = out[[f.name for f in schema]]
    days = sorted(out["window_start"].dt.date.unique())
    batch = 0
    for i, day in enumerate(days):
        part = out[out["window_start"].dt.date == day]
        chunks = [part]
        if split and i == len(days) // 2 and len(part) > 1:  # one (tier window, key) over two files
            a = part.iloc[:1].copy()
            b = part.copy()
            for c in ("bytes", "packets", "avg_len.sum", "avg_len.count", "windows"):
                a[c] = a[c] // 2
                b.loc[b.index[0], c] -= int(a[c].iloc[0])
            b.loc[b.index[0], "avg_len"] = b.loc[b.index[0], "avg_len.sum"] / max(
                1, b.loc[b.index[0], "avg_len.count"]
            )
            a["avg_len"] = a["avg_len.sum"] / a["avg_len.count"].clip(lower=1)
            chunks = [a, b]
        for c in chunks:
            path = R.tier_part_path(store.root, q, tier, day, batch, batch + 9)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pandas(c, schema=schema, preserve_index=False), path)
            if split and i == 0:  # covered by the file just written: never read
                bad = c.copy()
                bad["bytes"] = 10**12
                covered = R.tier_part_path(store.root, q, tier, day, batch + 2, batch + 3)
                pq.write_table(pa.Table.from_pandas(bad, schema=schema, preserve_index=False), covered)
            batch += 10
    return out
