"""Roll-up tiers: a query's closed windows folded into longer ones (5m, 1h, 1d) with the registry's merges.

Why from batch ranges: a tier file holds the raw rows of micro-batches [first, last] folded per (tier
window, key), so each run reads only the batches committed since the last one (a late correction is a
row of a later batch and lands in a later tier file), and a reader folds the rows of one (tier window,
key) across files with the same merge ops. Layout and schema: :mod:`contract.results` (``tier_schema``);
what merges how: :data:`contract.aggregates.TIER_STATES`.

Exactly once across kills: the batches folded so far are recorded in ``query=<q>/_tiers.json`` only
after every tier file of a run is in place (each written to a temporary name and renamed). A run killed
before that is redone from the same first batch: its files get the same name (same range: replaced) or
a larger range with the same first batch, which covers the older file (``contract.results.visible_files``),
so a reader never folds a batch twice; the compactor deletes covered tier files.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import aggregates as A
from contract import query as Q
from contract import results as R

PROGRESS_FILE = "_tiers.json"
# A test's kill points: the maintenance pass stops itself there (SIGSTOP), so a test can SIGKILL it at a
# known step (tests/test_compaction.py). Unset in production.
STOP_AT_ENV = "LOWWATER_COMPACT_STOP_AT"


def stop_at(point: str) -> None:
    if os.environ.get(STOP_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGSTOP)


US_PER_DAY = 86_400_000_000
# rows per Parquet row group of a tier file: files are sorted by key, so its min/max statistics let a
# one-group read (a series of one link over a month) skip all but a row group or two per file; small,
# as decoding a row group is most of such a read (4,096 rows ~0.4 ms, 16,384 ~1.3 ms; the footer grows)
ROW_GROUP = 4_096
_MERGE_AGG = {A.MERGE_SUM: "sum", A.MERGE_MIN: "min", A.MERGE_MAX: "max"}


def progress_path(root: str | Path, query: str) -> Path:
    return R.query_dir(root, query) / PROGRESS_FILE


def folded_through(root: str | Path, query: str) -> int:
    """The last raw batch folded into every tier of ``query`` (-1: none yet)."""
    try:
        return int(json.loads(progress_path(root, query).read_text())["through"])
    except FileNotFoundError:
        return -1


def _set_folded_through(root: str | Path, query: str, batch: int) -> None:
    path = progress_path(root, query)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"through": batch}))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _us(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(col.combine_chunks().cast(pa.int64()).to_numpy(), np.int64)


def state_rows(q: Q.QuerySpec, raw: pa.Table, width_ns: int) -> pa.Table:
    """Raw rows (:func:`contract.results.schema`) -> tier-schema rows, one per raw row, in the tier's
    windows (not yet folded). ``late`` rows keep only their completeness (their values are not part of
    the stored value); ``final`` rows count as one window each."""
    kind = raw["kind"].combine_chunks()
    late = np.asarray(pc.equal(kind, "late").to_numpy(zero_copy_only=False), bool)
    final = np.asarray(pc.equal(kind, "final").to_numpy(zero_copy_only=False), bool)
    origin_us = q.window.origin_ns // 1000
    w_us = width_ns // 1000
    start = _us(raw["window_start"])
    tstart = origin_us + (start - origin_us) // w_us * w_us
    cols: dict[str, pa.Array] = {
        "window_start": pa.array(tstart, pa.int64()).cast(R.TIMESTAMP),
        "window_end": pa.array(tstart + w_us, pa.int64()).cast(R.TIMESTAMP),
    }
    for name, _ in R.key_columns(q):
        cols[name] = raw[name].combine_chunks()
    count_name = next((a.name for a in q.aggregates if a.fn == "count"), None)
    count = np.asarray(raw[count_name].to_numpy(), np.int64) if count_name else None
    parts: dict[str, np.ndarray] = {}
    for a in q.aggregates:
        ts = A.TIER_STATES[a.fn]
        if ts.subkeys:  # the values are recomputed from the merged sub-keys; a late row's are not in them
            for c, _ in a.output_columns():
                cols[c] = pa.nulls(raw.num_rows, raw.schema.field(c).type)
            for c in R.subkey_columns(q):
                cols[c] = _emptied(raw[c].combine_chunks(), late)
            continue
        v = raw[a.name].combine_chunks()
        if ts.merge is not None:
            cols[a.name] = pc.if_else(pa.array(late), pa.nulls(len(v), v.type), v)
        elif ts.stored:  # the window's state, written by the store next to the value
            for col, _ in ts.columns(a.name):
                parts[col] = np.where(late, 0, np.asarray(raw[col].to_numpy(), np.int64))
            cols[a.name] = pa.nulls(len(v), v.type)
        else:
            vals = ts.from_row(np.nan_to_num(np.asarray(v.to_numpy(zero_copy_only=False), np.float64)), count)
            for (col, _), x in zip(ts.columns(a.name), vals, strict=True):
                parts[col] = np.where(late, 0, x)
            cols[a.name] = pa.nulls(len(v), v.type)  # recomputed from the parts when folded
    for c in ("closed_at", "hosts", "hosts_expected", "hosts_in_mark", "late_partials", "missing_records"):
        cols[c] = raw[c].combine_chunks()
    cols["complete"] = raw["complete"].combine_chunks()
    cols["kind"] = pa.array(["final"] * raw.num_rows, pa.string())
    for col, _, _ in R.tier_parts(q):
        cols[col] = pa.array(parts[col], pa.int64())
    cols["windows"] = pa.array(final.astype(np.int64))
    return pa.table(cols)


def _emptied(lists: pa.Array, drop: np.ndarray) -> pa.Array:
    """The same lists with those of the ``drop`` rows emptied."""
    lengths = np.asarray(pc.list_value_length(lists).fill_null(0).to_numpy(), np.int64)
    parent = np.asarray(pc.list_parent_indices(lists).to_numpy(), np.int64)
    values = pc.list_flatten(lists).filter(pa.array(~drop[parent]))
    offsets = np.r_[0, np.cumsum(np.where(drop, 0, lengths))].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _flat(lists: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(row index, value) of every element of a list<int64> column."""
    arr = lists.combine_chunks()
    parent = np.asarray(pc.list_parent_indices(arr).to_numpy(), np.int64)
    return parent, np.asarray(pc.list_flatten(arr).to_numpy(), np.int64)


def fold_subkeys(q: Q.QuerySpec, rows: pa.Table, gid: np.ndarray, out_gid: np.ndarray) -> dict[str, pa.Array]:
    """The holistic aggregate of rows grouped by ``gid``: their sub-keys merged per (group, sub-key)
    with the state's merge op, reduced by the aggregate's second stage (contract.aggregates), for the
    output groups ``out_gid``; its result columns and the merged sub-key lists. A group without
    sub-keys (only late rows) counts 0 distinct values and has no quantiles (NaN)."""
    h = Q.holistic(q)
    assert h is not None and h.fn in A.TIER_STATES and A.TIER_STATES[h.fn].subkeys
    names = R.subkey_columns(q)
    parent, _ = _flat(rows[names[0]])
    vals = [_flat(rows[c])[1] for c in names]
    words, st = vals[:-1], vals[-1]
    eg = gid[parent]
    order = np.lexsort((*reversed(words), eg))
    eg, st, words = eg[order], st[order], [w[order] for w in words]
    new = np.ones(len(eg), bool)
    if len(eg) > 1:
        same = eg[1:] == eg[:-1]
        for w in words:
            same &= w[1:] == w[:-1]
        new[1:] = ~same
    starts = np.flatnonzero(new)
    merge = A.REGISTRY[h.fn].parts(h)[-1].merge
    st = A.MERGE_UFUNCS[merge].reduceat(st, starts) if len(starts) else st[:0]
    ug, words = eg[starts], [w[starts] for w in words]
    gnew = np.ones(len(ug), bool)
    gnew[1:] = ug[1:] != ug[:-1]
    gstarts = np.flatnonzero(gnew)
    gcounts = np.diff(np.r_[gstarts, len(ug)])
    stage = A.REGISTRY[h.fn].second
    assert stage is not None and not stage.ranked
    sub = np.column_stack(words) if words else np.zeros((len(ug), 0), np.int64)
    _, reduced = stage.reduce(h, A.Groups(sub, st, gstarts, gcounts))
    at = np.full(int(max(gid.max(initial=-1), out_gid.max(initial=-1))) + 1, -1, np.int64)
    at[ug[gstarts]] = np.arange(len(gstarts))
    idx = at[out_gid]
    ok = idx >= 0
    safe = np.maximum(idx, 0)
    out: dict[str, pa.Array] = {}
    for c, kind in h.output_columns():
        v = reduced[c][safe] if len(gstarts) else np.zeros(len(idx))
        empty = np.nan if A.RESULT_KINDS[kind].float else 0
        out[c] = pa.array(np.where(ok, v, empty))
    lens = np.where(ok, gcounts[safe] if len(gstarts) else 0, 0)
    offsets = np.r_[0, np.cumsum(lens)]
    first = np.where(ok, gstarts[safe] if len(gstarts) else 0, 0)
    elem = np.repeat(first - offsets[:-1], lens) + np.arange(offsets[-1])
    off = pa.array(offsets.astype(np.int32))
    for c, w in zip(names, [*words, st], strict=True):
        out[c] = pa.ListArray.from_arrays(off, pa.array(w[elem], pa.int64()))
    return out


def fold(q: Q.QuerySpec, tier: str, rows: pa.Table) -> pa.Table:
    """Tier-schema rows -> one row per (tier window, key), merged with the registry's ops; the same
    fold serves raw rows (after :func:`state_rows`) and tier files merged together."""
    keys = ["window_start", *[n for n, _ in R.key_columns(q)]]
    aggs: list[tuple[str, str]] = [("window_end", "max")]
    for a in q.aggregates:
        ts = A.TIER_STATES[a.fn]
        if ts.merge is not None:
            aggs.append((a.name, _MERGE_AGG[ts.merge]))
    aggs += [(c, _MERGE_AGG[m]) for c, _, m in R.tier_parts(q)]
    aggs += [
        ("closed_at", "max"),
        ("hosts", "min"),
        ("hosts_expected", "max"),
        ("hosts_in_mark", "min"),
        ("late_partials", "sum"),
        ("missing_records", "max"),
        ("complete", "all"),
        ("windows", "sum"),
    ]
    subkeys = bool(R.subkey_columns(q))
    if subkeys:  # a group id per row, to merge the sub-key lists of each output row's rows
        kdf = rows.select(keys).to_pandas()
        gid = kdf.groupby(keys, dropna=False, sort=False).ngroup().to_numpy(np.int64)
        rows = rows.append_column("_g", pa.array(gid))
        aggs.append(("_g", "min"))
    # group_by treats null keys as a group of their own, as the store's rows do (a key part may be null)
    g = rows.group_by(keys, use_threads=False).aggregate(aggs)
    out: dict[str, pa.Array] = {}
    names = {f"{c}_{fn}": c for c, fn in aggs}
    got = {names.get(n, n): g[n] for n in g.column_names}
    schema = R.tier_schema(q, tier)
    if subkeys:
        got.update(fold_subkeys(q, rows, gid, np.asarray(got["_g"].to_numpy(), np.int64)))
    for a in q.aggregates:
        ts = A.TIER_STATES[a.fn]
        if ts.subkeys:
            continue
        if ts.merge is None:
            state = [np.asarray(got[c].to_numpy(), np.int64) for c, _ in ts.columns(a.name)]
            got[a.name] = pa.array(ts.finalize(*state), pa.float64())
    for f in schema:
        col = got[f.name] if f.name != "kind" else pa.array(["final"] * g.num_rows, pa.string())
        out[f.name] = col.cast(f.type) if col.type != f.type else col
    tbl = pa.table(out, schema=schema)
    # by key, then window: with small row groups (ROW_GROUP) a one-group series reads few of them
    return tbl.sort_by([(k, "ascending") for k in [*keys[1:], keys[0]]])


def raw_files(root: Path, q: Q.QuerySpec, after: int, through: int) -> list[Path]:
    """The visible raw files (parts or compacted) of batches in (after, through], every day."""
    out = []
    upto = R.committed_batch(root, q.name)
    for _day, d in R.date_dirs(root, q.name):
        named = {e.name: r for e in os.scandir(d) if (r := R.batch_range(e.name)) is not None}
        for name in R.visible_files(named, upto):
            a, b = named[name]
            if a > after and b <= through:
                out.append(d / name)
            elif a <= after < b:
                raise AssertionError(f"{d / name} straddles the tiers' progress (batch {after})")
    return out


def build(root: str | Path, q: Q.QuerySpec, through: int) -> int:
    """Fold the raw batches after the last folded one up to ``through`` (all committed) into every tier
    of ``q``; returns the tier rows written. Idempotent: a killed run is redone (module docstring)."""
    root = Path(root)
    if not q.tiers:
        return 0
    after = folded_through(root, q.name)
    if through <= after:
        return 0
    files = raw_files(root, q, after, through)
    written = 0
    if files:
        raw = pa.concat_tables([pq.read_table(f, schema=R.schema(q)) for f in files])
        for width in q.tiers:
            tier = R.tier_name(width)
            folded = fold(q, tier, state_rows(q, raw, width))
            day = _us(folded["window_start"]) // US_PER_DAY
            for d in np.unique(day).tolist():
                part = folded.filter(pa.array(day == d))
                path = R.tier_part_path(
                    root, q.name, tier, datetime.fromtimestamp(d * 86400, tz=UTC).date(), after + 1, through
                )
                write_atomic(part, path)
                written += part.num_rows
                stop_at("tier_written")
    _set_folded_through(root, q.name, through)
    return written


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write to a hidden temporary name, fsync, rename: a reader sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP, write_statistics=True)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def merge_files(q: Q.QuerySpec, tier: str, paths: list[Path]) -> pa.Table:
    """Several tier files of one directory folded into one table (the compactor's merge of a tier)."""
    return fold(q, tier, pa.concat_tables([pq.read_table(p, schema=R.tier_schema(q, tier)) for p in paths]))
