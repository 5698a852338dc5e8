"""The runtime layout derived from a query: key words, state columns and their merge ops, sources.

This is what the kernel generator (``low_level``) and the roll-up (``high_level``) ask of a query, one
definition for both levels so a partial's words mean the same on either side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import aggregates as A
from contract import fields as F
from contract.query.model import AggregateSpec, QuerySpec, accuracy_ppb, holistic

SRC_ONE = -1  # count: add 1 per packet
SRC_DSCP = -2  # tos >> 2
# computed sources (holistic aggregates): SRC_COMPUTED - code, code = col << 7 | dscp << 6 | (words - 1) << 5 | p
SRC_COMPUTED = -16  # HLL rank of the hashed value words (contract.sketch.hll_register_rank)
# key program kinds (column 1 of a key program row)
KEY_INT, KEY_IP, KEY_HLL, KEY_BUCKET = 0, 1, 2, 3


def hll_rank_source(field_name: str, p: int) -> int:
    """The state source 'HLL rank of this field's value at precision p' as one int."""
    fld = F.CATALOG[field_name]
    dscp = field_name == "dscp"
    col = F.TOS if dscp else fld.columns[0]
    return SRC_COMPUTED - ((col << 7) | (int(dscp) << 6) | ((2 if fld.kind == "ip" else 1) - 1) << 5 | p)


def decode_computed(src: int) -> tuple[int, bool, int, int]:
    """(column, dscp, words, precision) of a computed source (src <= SRC_COMPUTED)."""
    c = SRC_COMPUTED - src
    return c >> 7, bool((c >> 6) & 1), ((c >> 5) & 1) + 1, c & 31


@dataclass(frozen=True)
class StateColumn:
    name: str
    merge: int  # MERGE_SUM | MERGE_MIN | MERGE_MAX
    source: int  # packet column, or SRC_ONE / SRC_DSCP / an enrichment field / a computed source
    square: bool = False  # a packet adds the square of the source's value (contract.aggregates.LIFT_SQUARE)


def _source_of(field_name: str) -> int:
    if field_name in F.ENRICH_FIELDS:  # looked up in the networks file (contract.networks)
        return F.ENRICH_FIELDS[field_name]
    return SRC_DSCP if field_name == "dscp" else F.CATALOG[field_name].columns[0]


def state_columns(q: QuerySpec) -> list[StateColumn]:
    """The aggregate state one partial carries, as each aggregate's registry entry declares it (avg
    travels as (sum, count) so it merges exactly); a holistic aggregate's state per sub-key comes last
    (high_level.aggregate.holistic reads it there)."""
    h = holistic(q)
    return [
        c for a in [*(a for a in q.aggregates if not a.holistic), *([h] if h else [])] for c in _columns(a)
    ]


def _columns(a: AggregateSpec) -> list[StateColumn]:
    cols = []
    for p in A.REGISTRY[a.fn].parts(a):
        fname = (a.by if p.of == "by" else a.field) or ""
        if p.lift == A.LIFT_ONE:
            src = SRC_ONE
        elif p.lift == A.LIFT_HLL_RANK:
            src = hll_rank_source(fname, a.hll_precision or 0)
        else:
            src = _source_of(fname)
        cols.append(StateColumn(p.column(a.name), p.merge, src, p.lift == A.LIFT_SQUARE))
    return cols


def group_width(q: QuerySpec) -> int:
    """Words of the group key proper. At least 1 for plain queries (one constant word without
    group-by); a holistic query's key is group words + sub-key, and 0 group words is fine there."""
    w = sum(p.words for p in q.key_parts)
    return w if holistic(q) is not None else max(1, w)


def subkey_width(q: QuerySpec) -> int:
    """Words of the holistic sub-key: the value (1 or 2 words), its HLL register or its bucket."""
    h = holistic(q)
    if h is None:
        return 0
    if h.fn == "count_distinct" and h.hll_precision is not None:
        return 1
    return 2 if F.CATALOG[h.field or ""].kind == "ip" else 1


def key_width(q: QuerySpec) -> int:
    """Key words per partial: the group key, then a holistic aggregate's sub-key."""
    return group_width(q) + subkey_width(q)


def partition_width(q: QuerySpec) -> int:
    """Leading key words the Kafka partition is a hash of: the whole key of a plain query (unchanged),
    the group words only of a holistic one, so every sub-key of a (window, group) meets in one
    partition and the second stage sees all of them."""
    return group_width(q) if holistic(q) is not None else key_width(q)


def key_program(q: QuerySpec) -> np.ndarray:
    """Key extraction for the kernel: rows [column, is_ip, v4 mask hi, v4 mask lo, v6 mask hi, v6 mask lo]."""
    rows = []
    for p in q.key_parts:
        if p.field.kind == "ip":
            p4 = 32 if p.prefix4 is None else p.prefix4
            p6 = 128 if p.prefix6 is None else p.prefix6
            m4 = ((1 << 128) - 1) ^ ((1 << (32 - p4)) - 1)
            m6 = ((1 << 128) - 1) ^ ((1 << (128 - p6)) - 1) if p6 else 0
            rows.append(
                [
                    p.field.columns[0],
                    1,
                    F.to_int64(m4 >> 64),
                    F.to_int64(m4),
                    F.to_int64(m6 >> 64),
                    F.to_int64(m6),
                ]
            )
        else:
            rows.append([_source_of(p.field.name), 0, 0, 0, 0, 0])
    h = holistic(q)
    if h is not None:
        rows.append(_subkey_row(h))
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def _subkey_row(h: AggregateSpec) -> list[int]:
    """The key program row of a holistic sub-key: [source, kind, a, b, 0, 0] with KEY_HLL a = value
    words, b = precision; KEY_BUCKET a = accuracy in parts per 10^9; plain value rows as group parts."""
    fld = F.CATALOG[h.field or ""]
    src = _source_of(fld.name) if fld.kind != "ip" else fld.columns[0]
    if h.fn == "count_distinct" and h.hll_precision is not None:
        return [src, KEY_HLL, 2 if fld.kind == "ip" else 1, h.hll_precision, 0, 0]
    if h.fn == "quantiles" and h.quantile_accuracy > 0:
        return [src, KEY_BUCKET, accuracy_ppb(h.quantile_accuracy), 0, 0, 0]
    if fld.kind == "ip":
        return [src, KEY_IP, -1, -1, -1, -1]
    return [src, KEY_INT, 0, 0, 0, 0]


def merge_ops(q: QuerySpec) -> np.ndarray:
    return np.array([c.merge for c in state_columns(q)], dtype=np.int64)


def decode_key(q: QuerySpec, words: np.ndarray) -> dict[str, Any]:
    """Group-key words -> named values (addresses as text)."""
    out: dict[str, Any] = {}
    i = 0
    for p in q.key_parts:
        if p.field.kind == "ip":
            out[p.name] = F.words_to_ip(int(words[i]), int(words[i + 1]))
            i += 2
        else:
            out[p.name] = int(words[i])
            i += 1
    return out


def finalize(q: QuerySpec, state: np.ndarray) -> dict[str, float | int]:
    """Merged state columns of one group -> the aggregates the user asked for (avg = sum / count)."""
    out = A.finalize([(a.fn, a.name) for a in q.aggregates], np.asarray(state, np.int64).reshape(1, -1))
    return {name: v[0].item() for name, v in out.items()}
