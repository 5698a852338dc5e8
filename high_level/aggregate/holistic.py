"""The second stage of holistic aggregates: (window, group, sub-key) rows -> one result per group.

The low level groups a holistic query by (group, sub-key) per pane (:mod:`contract.sketch`), the
roll-up merges panes into windows per (window, group, sub-key) like any key, and this module reduces
the sub-keys of every (window, kind, group) of a micro-batch when its rows are written:
each function's :class:`contract.aggregates.SecondStage` (in the registry, the one place that names
them) turns a group's sorted sub-keys into its result columns: one row per group (``count_distinct``,
``quantiles``), or for a ranked function one row per item it keeps (``top``: the k items of largest
weight, ties smaller item first, the item staying in the key; with ``capacity`` the roll-up keeps a
Misra-Gries summary, :func:`high_level.aggregate.rollup.misra_gries`).

The other aggregates of the query ride along per sub-key and are merged here across the sub-keys
(sum of sums, min of mins, ...), so they stay exact. Why at write time, on the driver: the Kafka
partition is a hash of the group words only, so all sub-keys of a (window, group) close together in
one partition and one micro-batch; the rows the stateful step emits are deterministic and a replayed
batch rewrites the same files, so the reduction inherits exactly-once from the store without any
state of its own. Rows of other kinds (``correction``, ``late``, ``update``) are reduced within
their kind: a correction's distinct count counts only its late values (documented in the README).
Vectorised numpy throughout: a sort and ``reduceat`` per batch, no Python per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import aggregates as A
from contract import query as Q

I64 = np.int64


@dataclass(frozen=True)
class Reduced:
    """One output row per (window, kind, group) (per item for top): ``rows`` indexes the input row
    whose window, kind and times it carries; ``key`` its stored key words; ``values`` every aggregate
    result column (contract.results.aggregate_columns order); ``comp`` / ``hosts`` merged over the
    sub-keys (min of hosts, sum of late partials, max of missing records)."""

    rows: np.ndarray
    key: np.ndarray
    values: dict[str, np.ndarray]
    hosts: np.ndarray
    hosts_expected: np.ndarray
    comp: np.ndarray
    closed_at_ms: np.ndarray
    # per output row (one per group) its sub-keys, rows offsets[i]:offsets[i+1] of ``sub`` int64[m, w]
    # and ``sub_state`` int64[m] (what a roll-up tier merges: contract.results.subkey_columns)
    offsets: np.ndarray | None = None
    sub: np.ndarray | None = None
    sub_state: np.ndarray | None = None
    merged: np.ndarray | None = None  # per output row the bounded aggregates' merged state columns


def _finalize_plain(q: Q.QuerySpec, merged: np.ndarray) -> dict[str, np.ndarray]:
    """The non-holistic aggregates from their merged state columns (contract.aggregates)."""
    return A.finalize([(a.fn, a.name) for a in q.aggregates], merged)


def reduce(
    q: Q.QuerySpec,
    window: np.ndarray,
    kind: np.ndarray,
    key: np.ndarray,
    state: np.ndarray,
    hosts: np.ndarray,
    hosts_expected: np.ndarray,
    comp: np.ndarray,
    closed_at_ms: np.ndarray,
) -> Reduced:
    """Reduce one query's rows of a batch (``window`` any per-window id, ``kind`` an int per row kind,
    ``key`` int64[n, key_width], ``state`` int64[n, state columns]); output sorted by (window, kind,
    group) and, for a ranked aggregate (top), by rank."""
    h = Q.holistic(q)
    assert h is not None, f"query {q.name!r} has no holistic aggregate"
    stage = A.REGISTRY[h.fn].second
    assert stage is not None
    gw, sw = Q.group_width(q), Q.subkey_width(q)
    cols = Q.state_columns(q)
    n = len(window)
    hid = state[:, -1] if n else np.zeros(0, I64)
    sub = [key[:, gw + j] for j in reversed(range(sw))]  # lexsort: the last key first
    grp = [key[:, j] for j in range(gw - 1, -1, -1)]
    weight = [-hid] if stage.ranked else []  # a ranked aggregate's items by weight, descending
    order = np.lexsort((*sub, *weight, *grp, kind, window))
    key, state, hid = key[order], state[order], hid[order]
    w, kd = window[order], kind[order]
    new = np.ones(n, bool)
    if n > 1:
        same = (w[1:] == w[:-1]) & (kd[1:] == kd[:-1])
        for j in range(gw):
            same &= key[1:, j] == key[:-1, j]
        new[1:] = ~same
    starts = np.flatnonzero(new)
    counts = np.diff(np.r_[starts, n])
    out, vals = stage.reduce(h, A.Groups(key[:, gw : gw + sw], hid, starts, counts))
    if stage.ranked:  # one row per kept item: the other aggregates of its own sub-key
        vals = {**_finalize_plain(q, state[out][:, : len(cols) - 1]), **vals}
        rows = order[out]
        return Reduced(
            rows,
            key[out],
            _ordered(q, vals),
            hosts[rows],
            hosts_expected[rows],
            comp[rows],
            closed_at_ms[rows],
        )
    merged = np.empty((len(starts), len(cols) - 1), I64)
    for j, c in enumerate(cols[:-1]):
        merged[:, j] = A.MERGE_UFUNCS[c.merge].reduceat(state[:, j], starts) if n else np.empty(0, I64)
    vals = {**_finalize_plain(q, merged), **vals}
    rows = order[out]
    hs = np.minimum.reduceat(hosts[order], starts) if n else hosts[:0]
    he = np.minimum.reduceat(hosts_expected[order], starts) if n else hosts_expected[:0]
    co = comp[order]
    cm = (
        np.column_stack(
            [
                np.minimum.reduceat(co[:, 0], starts),
                np.add.reduceat(co[:, 1], starts),
                np.maximum.reduceat(co[:, 2], starts),
            ]
        )
        if n
        else comp[:0]
    )
    cl = np.maximum.reduceat(closed_at_ms[order], starts) if n else closed_at_ms[:0]
    offsets = np.r_[starts, n].astype(np.int64)
    return Reduced(
        rows,
        key[starts][:, :gw],
        _ordered(q, vals),
        hs,
        he,
        cm,
        cl,
        offsets,
        key[:, gw : gw + sw],
        hid,
        merged,
    )


def _ordered(q: Q.QuerySpec, vals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = Q.result_names(q)
    return {n: vals[n] for n in names}


def offline(q: Q.QuerySpec, window: np.ndarray, key: np.ndarray, state: np.ndarray) -> pd.DataFrame:
    """Stage 2 over (window, key, state) rows of final kind (tests, benchmarks): a frame with
    ``window``, the stored key words ``k0..`` and the result columns, sorted."""
    n = len(window)
    z = np.zeros(n, I64)
    red = reduce(
        q,
        np.asarray(window, I64),
        z,
        key,
        state,
        z.astype(np.int32),
        z.astype(np.int32),
        np.zeros((n, 3), I64),
        z,
    )
    out = {"window": np.asarray(window, I64)[red.rows]}
    out.update({f"k{j}": red.key[:, j] for j in range(red.key.shape[1])})
    out.update(red.values)
    return pd.DataFrame(out)
