"""The aggregate functions, one entry each: the one place that says what an aggregate is.

An entry declares the function's state columns (what one packet adds to each and how partial states
merge), how the merged state becomes the result, the result's type, how stored result rows of one
window fold in SQL, which fields and parameters it takes, and whether it is holistic (a sub-key per
value, reduced at close by ``high_level.aggregate.holistic`` with its :class:`SecondStage`) or
bounded (a fixed number of state words per group, dissertation §6.2.2.1). Both levels read it: the query model validates with it, the layout
(:mod:`contract.query.layout`) derives the kernels' state program and the roll-up's merge ops from it,
the job, the store and the joins finalize with it, the API folds stored rows with its SQL and the
oracle (``high_level.simulate``) lifts packets with it.

A bounded aggregate whose state merges by sum, min or max and whose packets add 1, their value or its
square is one entry here; a new merge rule or lift also needs its operation in the generated kernel
(``low_level.codegen`` and ``low_level.subaggregate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import fields as F
from contract import sketch

# How the partial states of a column merge (numbers shared with the generated Numba code).
MERGE_SUM, MERGE_MIN, MERGE_MAX = 0, 1, 2
MERGE_NAMES = {MERGE_SUM: "sum", MERGE_MIN: "min", MERGE_MAX: "max"}  # pandas, Spark SQL and pyarrow names
MERGE_UFUNCS = {MERGE_SUM: np.add, MERGE_MIN: np.minimum, MERGE_MAX: np.maximum}
MERGE_IDENTITY = {MERGE_SUM: 0, MERGE_MIN: np.iinfo(np.int64).max, MERGE_MAX: np.iinfo(np.int64).min}
# The merge ops with an inverse (dissertation §6.2.2.2, "differential"; Arasu and Widom's "subtractable"):
# a sliding window can take its expired pane out again instead of re-merging all its panes. Only the sum:
# min and max have none. Exact on int64 states: addition and subtraction modulo 2^64 cancel exactly.
MERGE_INVERSE = {MERGE_SUM: np.subtract}

# What one packet adds to a state column.
LIFT_ONE = "one"  # 1 (a flow record: its packets)
LIFT_VALUE = "value"  # the field's value
LIFT_SQUARE = "square"  # the square of the field's value
LIFT_HLL_RANK = "hll_rank"  # the HLL rank of the field's hashed value (contract.sketch)

DEFAULT_ACCURACY = 0.01
MAX_TOP_CAPACITY = 1_000_000


@dataclass(frozen=True)
class StatePart:
    """One state column of an aggregate: named ``<name>.<suffix>`` (the aggregate's name when no suffix)."""

    suffix: str
    merge: int
    lift: str
    of: str = "field"  # whose value the lift reads: the aggregate's 'field', or 'by' (top's weight)

    def column(self, name: str) -> str:
        return f"{name}.{self.suffix}" if self.suffix else name


@dataclass(frozen=True)
class Fold:
    """SQL (DuckDB) over the stored rows of a group; ``without_count`` replaces it when the query has
    no count aggregate to weight by. Placeholders: ``{c}`` the quoted column, ``{w}`` the count column,
    ``{val}`` the FILTER of rows whose values count, ``{fin}`` the final-row condition, ``{ok}`` a row
    that can be weighted."""

    sql: str
    without_count: str | None = None

    def render(self, w: str | None, **parts: str) -> str:
        text = self.without_count if w is None and self.without_count is not None else self.sql
        return text.format(w=w, **parts)


_SUM_INT = Fold("CAST(sum({c}) {val} AS BIGINT)")
_FINAL = Fold("max(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin})")
_DECIDED = Fold("coalesce(max({c}) FILTER (WHERE {fin}), max({c}) {val})")  # decided at close
_WEIGHTED = Fold(
    "sum(CASE WHEN {ok} THEN {c} * {w} ELSE 0 END) / nullif(sum(CASE WHEN {ok} THEN {w} ELSE 0 END), 0)",
    _FINAL.sql,
)
_WEIGHTED_SUMMARY = Fold(
    "sum(CASE WHEN {ok} THEN {c} * {w} END) / nullif(sum(CASE WHEN {ok} THEN {w} END), 0)",
    "avg(CASE WHEN isfinite({c}) THEN {c} END) FILTER (WHERE {fin})",
)


@dataclass(frozen=True)
class ResultKind:
    """A kind of result column (an aggregate's, or one of a holistic aggregate's several columns)."""

    float: bool = False  # stored as float64 (else int64)
    nan: bool = False  # NaN for an empty group, served as NULL
    fold: Fold = _DECIDED  # a (window, key)'s final row, its corrections and late rows -> one value
    summary: Fold = _WEIGHTED_SUMMARY  # a window's groups -> one value (the API's per-window summary)
    total: str | None = None  # the total over a window's groups (a pyarrow.compute function), if any


RESULT_KINDS: dict[str, ResultKind] = {
    "count": ResultKind(fold=_SUM_INT, summary=Fold("sum({c}) {val}"), total="sum"),
    "sum": ResultKind(fold=_SUM_INT, summary=Fold("sum({c}) {val}"), total="sum"),
    "min": ResultKind(fold=Fold("min({c}) {val}"), summary=Fold("min({c}) {val}"), total="min"),
    "max": ResultKind(fold=Fold("max({c}) {val}"), summary=Fold("max({c}) {val}"), total="max"),
    "avg": ResultKind(float=True, nan=True, fold=_WEIGHTED),
    # a correction counts only its late values: the sum bounds the distinct count from above
    "count_distinct": ResultKind(fold=_SUM_INT),
    "quantile": ResultKind(float=True),
    "top": ResultKind(),
    "rank": ResultKind(),
    "top_error": ResultKind(),  # the Misra-Gries bound goes with its weight
    # the final row's (a spread has no exact fold from finalized rows)
    "variance": ResultKind(float=True, nan=True, fold=_FINAL),
    "stddev": ResultKind(float=True, nan=True, fold=_FINAL),
}
FLOAT_KINDS = tuple(k for k, r in RESULT_KINDS.items() if r.float)
_TOTAL_UFUNC = {"sum": np.add, "min": np.minimum, "max": np.maximum}


def window_total(total: str, values: np.ndarray, window: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """Per row: the ``total`` (a :class:`ResultKind`'s ``sum``/``min``/``max``) of ``values`` over the
    ``counted`` rows of its window, vectorised (HAVING's ``total(x)``). A window without a counted row
    gets the operation's identity (0, or the extreme of the dtype): such rows are never judged by it."""
    values = np.asarray(values)
    uniq, inv = np.unique(np.asarray(window), return_inverse=True)
    op = _TOTAL_UFUNC[total]
    if total == "sum":
        init = 0
    elif values.dtype.kind == "f":
        init = np.inf if total == "min" else -np.inf
    else:
        info = np.iinfo(values.dtype)
        init = info.max if total == "min" else info.min
    out = np.full(len(uniq), init, values.dtype)
    op.at(out, inv[counted], values[counted])
    return out[inv]


@dataclass(frozen=True)
class Groups:
    """One holistic query's rows of a batch as the second stage (``high_level.aggregate.holistic``) hands
    them to :attr:`SecondStage.reduce`: sorted by (window, kind, group), then for a ranked aggregate by
    weight descending, then by sub-key. ``sub`` the sub-key words int64[n, w], ``state`` the aggregate's
    state column int64[n], ``starts`` / ``counts`` each group's first row and number of rows."""

    sub: np.ndarray
    state: np.ndarray
    starts: np.ndarray
    counts: np.ndarray

    def sum(self, x: np.ndarray) -> np.ndarray:
        """Per group: the sum of ``x`` over its rows."""
        return np.add.reduceat(x, self.starts) if len(self.starts) else np.zeros(0, x.dtype)


@dataclass(frozen=True)
class SecondStage:
    """How a holistic aggregate's sub-keys become its result columns at close. ``reduce(spec, groups)``
    returns the row indexes it outputs and its columns for them: one row per group (its ``starts``), or
    for a ranked aggregate the items it keeps (the query's other aggregates then stay per item)."""

    reduce: Callable[[Any, Groups], tuple[np.ndarray, dict[str, np.ndarray]]]
    ranked: bool = False  # one output row per kept sub-key, sorted by weight, else one per group


@dataclass(frozen=True)
class Aggregate:
    """One aggregate function."""

    fn: str
    state: tuple[StatePart, ...] | Callable[[Any], tuple[StatePart, ...]]  # fixed, or of the AggregateSpec
    finalize: Callable[..., np.ndarray] | None = None  # merged state columns -> result (None: holistic)
    field_kinds: tuple[str, ...] = ("int",)  # kinds of field it takes; () takes none
    params: tuple[str, ...] = ()  # AggregateSpec parameters it takes
    check: Callable[[Any], None] | None = None  # further validation of the AggregateSpec (raises ValueError)
    prefix: str = ""  # the default name's prefix (default: fn)
    outputs: Callable[[Any], list[tuple[str, str]]] | None = (
        None  # (column, result kind); default [(name, fn)]
    )
    over_join: bool = (
        False  # a join may compute it over its output rows (state lifted from the join expression)
    )
    second: SecondStage | None = None  # holistic: how its sub-keys reduce at close

    def __post_init__(self) -> None:
        if (self.finalize is None) != (self.second is not None):
            raise ValueError(
                f"aggregate {self.fn!r}: a finalize (bounded) or a second stage (holistic), not both"
            )

    @property
    def holistic(self) -> bool:
        return self.finalize is None

    @property
    def subtractable(self) -> bool:
        """Every state column has an inverse merge (count, sum, avg, variance, stddev; not min, max or a
        holistic one): a sliding window of it can be kept running, pane in, expired pane out."""
        return not self.holistic and all(p.merge in MERGE_INVERSE for p in self.parts())

    @property
    def exact_int(self) -> bool:
        """Its result is one exact integer word: a join may compare and add it (closed-window inputs)."""
        return not self.holistic and not RESULT_KINDS[self.fn].float

    def parts(self, spec: Any = None) -> tuple[StatePart, ...]:
        return self.state(spec) if callable(self.state) else self.state


def _int(x: np.ndarray) -> np.ndarray:
    return np.array(x, dtype=np.int64)


def _mean(s: np.ndarray, c: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c != 0, s.astype(np.float64) / np.where(c != 0, c, 1), np.nan)


def _variance(n: np.ndarray, s: np.ndarray, sq: np.ndarray) -> np.ndarray:
    """Population variance (n·Σx² − (Σx)²) / n², the exact rational correctly rounded to float64 (NaN
    when n = 0): one IEEE division where numerator and denominator are exact integers below 2^52, else
    Python's integer division (also correctly rounded), so both levels and any oracle agree bit for bit."""
    n, s, sq = (np.asarray(x, np.int64) for x in (n, s, sq))
    out = np.full(n.shape, np.nan)
    nz = n > 0
    small = nz & (n < 2**26) & (n.astype(np.float64) * sq.astype(np.float64) < 2.0**52)
    num = n[small] * sq[small] - s[small] * s[small]
    out[small] = num.astype(np.float64) / (n[small] * n[small]).astype(np.float64)
    for i in np.flatnonzero(nz & ~small):
        ni, si = int(n[i]), int(s[i])
        out[i] = (ni * int(sq[i]) - si * si) / (ni * ni)
    return out


def _stddev(n: np.ndarray, s: np.ndarray, sq: np.ndarray) -> np.ndarray:
    return np.sqrt(_variance(n, s, sq))


_SQUARE_BITS = 16
_WIDE = {"src_mac": 48, "dst_mac": 48, "mpls_label": 20}  # int fields wider than 16 bits


def _check_square(a: Any) -> None:
    if _WIDE.get(a.field, 0) > _SQUARE_BITS:
        raise ValueError(
            f"{a.fn} sums squares in 64 bits: {a.field!r} ({_WIDE[a.field]} bits) is wider than "
            f"{_SQUARE_BITS} bits"
        )


def _check_distinct(a: Any) -> None:
    if a.precision is not None and a.approx is None:
        raise ValueError("precision applies to approx: hll")
    if a.precision is not None and not sketch.HLL_MIN_P <= a.precision <= sketch.HLL_MAX_P:
        raise ValueError(f"precision must be {sketch.HLL_MIN_P}..{sketch.HLL_MAX_P} (HLL registers 2^p)")


def _check_quantiles(a: Any) -> None:
    if not a.q:
        raise ValueError("quantiles needs q: a list of quantiles in (0, 1), e.g. [0.5, 0.95, 0.99]")
    bad = [x for x in a.q if not 0 < x < 1]
    if bad:
        raise ValueError(f"quantile {bad[0]} is outside (0, 1)")
    if any(abs(round(x, 4) - x) > 1e-12 for x in a.q):
        raise ValueError("a quantile has at most 4 decimals (0.5, 0.95, 0.999, 0.9999)")
    if len(set(a.q)) != len(a.q):
        raise ValueError("duplicate quantiles")
    if a.accuracy is not None and not 0 <= a.accuracy <= 0.5:
        raise ValueError("accuracy (relative error) must be 0 (exact) .. 0.5")


def _check_top(a: Any) -> None:
    if a.k is None or a.k < 1:
        raise ValueError("top needs k >= 1 (how many items per group)")
    if a.capacity is not None and not a.k <= a.capacity <= MAX_TOP_CAPACITY:
        raise ValueError(f"top capacity must be an integer k ({a.k}) .. {MAX_TOP_CAPACITY}")
    if a.by is not None:
        b = F.CATALOG.get(a.by)
        if b is None:
            raise ValueError(f"unknown field {a.by!r} in by; known: {', '.join(sorted(F.CATALOG))}")
        if b.kind != "int":
            raise ValueError(f"top by needs a numeric field, {a.by!r} is {b.kind}")


def quantile_suffix(x: float) -> str:
    """0.5 -> 'p50', 0.95 -> 'p95', 0.999 -> 'p99_9'."""
    return "p" + f"{round(x * 100, 6):g}".replace(".", "_")


def _quantile_outputs(a: Any) -> list[tuple[str, str]]:
    return [(f"{a.name}_{quantile_suffix(x)}", "quantile") for x in a.q or []]


def _top_outputs(a: Any) -> list[tuple[str, str]]:
    err = [(f"{a.name}_error", "top_error")] if a.capacity is not None else []
    return [(a.name, "top"), (f"{a.name}_rank", "rank"), *err]


_N = StatePart("n", MERGE_SUM, LIFT_ONE)  # a holistic sub-key's packets


def _distinct_state(a: Any) -> tuple[StatePart, ...]:
    return (StatePart("rank", MERGE_MAX, LIFT_HLL_RANK),) if a.approx == "hll" else (_N,)


def _top_state(a: Any) -> tuple[StatePart, ...]:
    return (StatePart("weight", MERGE_SUM, LIFT_VALUE, of="by"),) if a.by is not None else (_N,)


def _distinct_reduce(a: Any, g: Groups) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Exact: the number of sub-keys (distinct values); HLL: the estimate from the registers present."""
    if a.hll_precision is None:
        return g.starts, {a.name: g.counts.astype(np.int64)}
    est = sketch.hll_estimate(g.sum(np.ldexp(1.0, -g.state)), g.counts, a.hll_precision)
    return g.starts, {a.name: np.rint(est).astype(np.int64)}


def _quantiles_reduce(a: Any, g: Groups) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Cumulative counts over the sorted buckets; per q the bucket holding its nearest rank, as its value."""
    cum = np.cumsum(g.state)
    before = cum[g.starts] - g.state[g.starts]
    total = g.sum(g.state)
    out = {}
    for x, (cname, _) in zip(a.q or [], a.output_columns(), strict=True):
        idx = np.searchsorted(cum, before + sketch.quantile_rank(x, total), side="left")
        out[cname] = sketch.bucket_value(g.sub[idx, 0], a.quantile_accuracy)
    return g.starts, out


def _top_reduce(a: Any, g: Groups) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The k items of largest weight per group with their rank; with ``capacity`` the group's error rows
    (sub-key :data:`contract.sketch.ERROR_ITEM`) are not ranked, their sum is ``<name>_error``."""
    bounded = a.capacity is not None
    err = np.all(g.sub == sketch.ERROR_ITEM, axis=1) if bounded else np.zeros(len(g.state), bool)
    item = (~err).astype(np.int64)
    seen = np.cumsum(item)
    pos = seen - 1 - np.repeat(seen[g.starts] - item[g.starts], g.counts)  # 0-based rank within the group
    sel = np.flatnonzero((pos < (a.k or 1)) & ~err)
    out = {a.name: g.state[sel], f"{a.name}_rank": (pos[sel] + 1).astype(np.int64)}
    if bounded:  # the group's Misra-Gries error: 0 = exact
        out[f"{a.name}_error"] = np.repeat(g.sum(np.where(err, g.state, 0)), g.counts)[sel]
    return sel, out


_COUNT = StatePart("count", MERGE_SUM, LIFT_ONE)
_SUM = StatePart("sum", MERGE_SUM, LIFT_VALUE)
_SUMSQ = StatePart("sumsq", MERGE_SUM, LIFT_SQUARE)

REGISTRY: dict[str, Aggregate] = {
    a.fn: a
    for a in (
        Aggregate("count", (StatePart("", MERGE_SUM, LIFT_ONE),), _int, field_kinds=(), over_join=True),
        Aggregate("sum", (StatePart("", MERGE_SUM, LIFT_VALUE),), _int, over_join=True),
        Aggregate("min", (StatePart("", MERGE_MIN, LIFT_VALUE),), _int, over_join=True),
        Aggregate("max", (StatePart("", MERGE_MAX, LIFT_VALUE),), _int, over_join=True),
        Aggregate("avg", (_SUM, _COUNT), _mean, over_join=True),  # travels as (sum, count): merges exactly
        Aggregate("variance", (_COUNT, _SUM, _SUMSQ), _variance, check=_check_square),  # population
        Aggregate("stddev", (_COUNT, _SUM, _SUMSQ), _stddev, check=_check_square),  # sqrt of the variance
        Aggregate(
            "count_distinct",
            _distinct_state,
            field_kinds=("int", "ip"),
            params=("approx", "precision"),
            check=_check_distinct,
            prefix="distinct",
            second=SecondStage(_distinct_reduce),
        ),
        Aggregate(
            "quantiles",
            (_N,),
            params=("q", "accuracy"),
            check=_check_quantiles,
            outputs=_quantile_outputs,
            second=SecondStage(_quantiles_reduce),
        ),
        Aggregate(
            "top",
            _top_state,
            field_kinds=("int", "ip"),
            params=("k", "by", "capacity"),
            check=_check_top,
            outputs=_top_outputs,
            second=SecondStage(_top_reduce, ranked=True),
        ),
    )
}
NAMES = tuple(REGISTRY)
HOLISTIC = tuple(fn for fn, a in REGISTRY.items() if a.holistic)
PARAMS = tuple(dict.fromkeys(p for a in REGISTRY.values() for p in a.params))
JOIN_FNS = tuple(fn for fn, a in REGISTRY.items() if a.over_join)
SUBTRACTABLE = tuple(fn for fn, a in REGISTRY.items() if a.subtractable)


@dataclass(frozen=True)
class TierState:
    """How an aggregate's stored windows re-merge, exactly, into a roll-up tier's longer windows.

    Why a state: a tier row's value must come from merge operations, never from averaging results.
    ``merge`` folds the value column itself across windows (count/sum/min/max: their value is their
    state); ``parts`` are extra int64 columns ``<name>.<suffix>`` the tier files keep (avg: its sum and
    count), recovered from a stored row by ``from_row(value, count)`` (the query's count aggregate as the
    weight: avg and count count the same packets) and finalized by ``finalize`` after merging. An
    aggregate with no entry (variance, stddev, count_distinct, quantiles, top) is not offered in tiers:
    the store keeps its final value only, no sum of squares, sub-keys or sketch.
    """

    merge: int | None = None  # how the value column folds (None: recomputed from ``parts``)
    parts: tuple[StatePart, ...] = ()
    from_row: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, ...]] | None = None
    finalize: Callable[..., np.ndarray] | None = None
    needs_count: bool = False  # from_row reads the query's count aggregate

    def columns(self, name: str) -> list[tuple[str, int]]:
        """(column, merge) of the state columns a tier file adds for aggregate ``name``."""
        return [(p.column(name), p.merge) for p in self.parts]


# Largest |sum| whose avg x count rounds back to the exact integer (float64 has 53 bits; the product's
# relative error is at most 2^-52): a larger one is refused rather than rounded.
AVG_EXACT_SUM = 2**50


def _avg_from_row(avg: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count = np.asarray(count, np.int64)
    prod = np.where(count != 0, np.asarray(avg, np.float64) * count, 0.0)
    if np.any(np.abs(prod) >= AVG_EXACT_SUM):
        raise ValueError(f"avg x count beyond {AVG_EXACT_SUM}: its sum cannot be recovered exactly")
    return np.rint(prod).astype(np.int64), count


TIER_STATES: dict[str, TierState] = {
    "count": TierState(merge=MERGE_SUM),
    "sum": TierState(merge=MERGE_SUM),
    "min": TierState(merge=MERGE_MIN),
    "max": TierState(merge=MERGE_MAX),
    "avg": TierState(parts=(_SUM, _COUNT), from_row=_avg_from_row, finalize=_mean, needs_count=True),
}


def finalize(aggs: Sequence[tuple[str, str]], state: np.ndarray) -> dict[str, np.ndarray]:
    """Merged state columns (int64[n, columns]) -> the bounded aggregates' results by name, vectorised.
    ``aggs`` are (fn, name) in state order; holistic ones are skipped (their state comes last)."""
    out: dict[str, np.ndarray] = {}
    j = 0
    for fn, name in aggs:
        agg = REGISTRY[fn]
        if agg.finalize is None:
            continue
        k = len(agg.parts())
        out[name] = agg.finalize(*(state[:, j + i] for i in range(k)))
        j += k
    return out


def lift(part: StatePart, values: np.ndarray) -> np.ndarray:
    """What packets with these values add to a state column (the oracle's and a join's lift)."""
    if part.lift == LIFT_ONE:
        return np.ones(len(values), np.int64)
    if part.lift == LIFT_SQUARE:
        return values * values
    if part.lift == LIFT_VALUE:
        return values
    raise ValueError(f"lift {part.lift!r} needs the sketch of the value, not the value")
