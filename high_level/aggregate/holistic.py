"""The second stage of holistic aggregates: (window, group, sub-key) rows -> one result per group.

The low level groups a holistic query by (group, sub-key) per pane (:mod:`contract.sketch`), the
roll-up merges panes into windows per (window, group, sub-key) like any key, and this module reduces
the sub-keys of every (window, kind, group) of a micro-batch when its rows are written:

* ``count_distinct`` exact: the number of sub-keys (distinct values); HLL: the estimate from the
  registers present (absent registers are 0);
* ``quantiles``: cumulative counts over the sorted buckets, the bucket holding rank
  :func:`contract.sketch.quantile_rank` (nearest rank), its representative value;
* ``top``: the k sub-keys (items) of largest weight (ties: smaller item first), one row each with
  its rank; the item stays in the key. With ``capacity`` the roll-up keeps a Misra-Gries summary
  (:func:`high_level.aggregate.rollup.misra_gries`): its error rows are not ranked, their sum is ``<name>_error``.

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
from contract import sketch
from high_level.aggregate.rollup import ERROR_ITEM

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
    group) and, for top, by rank."""
    h = Q.holistic(q)
    assert h is not None, f"query {q.name!r} has no holistic aggregate"
    gw, sw = Q.group_width(q), Q.subkey_width(q)
    cols = Q.state_columns(q)
    n = len(window)
    hid = state[:, -1] if n else np.zeros(0, I64)
    sub = [key[:, gw + j] for j in range(sw)]
    grp = [key[:, j] for j in range(gw)]
    bounded = h.fn == "top" and h.capacity is not None
    err = np.all(key[:, gw:] == ERROR_ITEM, axis=1) if bounded and n else np.zeros(n, bool)
    if h.fn == "top":  # items by weight, descending, then by item words; a bounded top's error row first
        order = np.lexsort((*reversed(sub), -hid, ~err, *reversed(grp), kind, window))
    else:
        order = np.lexsort((*reversed(sub), *reversed(grp), kind, window))
    key, state, hid, err = key[order], state[order], hid[order], err[order]
    w, kd = window[order], kind[order]
    new = np.ones(n, bool)
    if n > 1:
        same = (w[1:] == w[:-1]) & (kd[1:] == kd[:-1])
        for j in range(gw):
            same &= key[1:, j] == key[:-1, j]
        new[1:] = ~same
    starts = np.flatnonzero(new)
    counts = np.diff(np.r_[starts, n])
    if h.fn == "top":
        ne = np.add.reduceat(err.astype(I64), starts) if n else np.zeros(0, I64)
        pos = np.arange(n) - np.repeat(starts + ne, counts)  # 0-based rank within the group
        keep = (pos < (h.k or 1)) & ~err
        sel = np.flatnonzero(keep)
        vals = _finalize_plain(q, state[sel][:, : len(cols) - 1])
        vals[h.name] = hid[sel]
        vals[f"{h.name}_rank"] = (pos[sel] + 1).astype(I64)
        if bounded:  # the group's Misra-Gries error (sum of its error rows): 0 = exact
            eg = np.add.reduceat(np.where(err, hid, 0), starts) if n else np.zeros(0, I64)
            vals[f"{h.name}_error"] = np.repeat(eg, counts)[sel]
        rows = order[sel]
        return Reduced(
            rows,
            key[sel],
            _ordered(q, vals),
            hosts[rows],
            hosts_expected[rows],
            comp[rows],
            closed_at_ms[rows],
        )
    merged = np.empty((len(starts), len(cols) - 1), I64)
    for j, c in enumerate(cols[:-1]):
        merged[:, j] = A.MERGE_UFUNCS[c.merge].reduceat(state[:, j], starts) if n else np.empty(0, I64)
    vals = _finalize_plain(q, merged)
    if h.fn == "count_distinct":
        if h.hll_precision is None:
            vals[h.name] = counts.astype(I64)
        else:
            z = np.add.reduceat(np.ldexp(1.0, -hid), starts) if n else np.zeros(0)
            est = sketch.hll_estimate(z, counts, h.hll_precision)
            vals[h.name] = np.rint(est).astype(I64)
    else:  # quantiles: the bucket holding each rank
        cum = np.cumsum(hid)
        before = cum[starts] - hid[starts]
        total = cum[np.r_[starts[1:], n] - 1] - before if n else np.zeros(0, I64)
        bucket = key[:, gw]
        for x, (cname, _) in zip(h.q or [], h.output_columns(), strict=True):
            r = sketch.quantile_rank(x, total)
            idx = np.searchsorted(cum, before + r, side="left")
            vals[cname] = sketch.bucket_value(bucket[idx], h.quantile_accuracy)
    rows = order[starts]
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
    return Reduced(rows, key[starts][:, :gw], _ordered(q, vals), hs, he, cm, cl)


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
