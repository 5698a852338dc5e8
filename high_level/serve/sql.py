"""The SQL text of result requests: DuckDB macros, key filters, folding corrections, top-N ranking.

Nothing a user typed is spliced in: columns are checked against the query's known columns by
:mod:`high_level.serve.params` before they get here (and quoted by :func:`q`), values go as ``$``
parameters. Every function returns SQL text for the :class:`~high_level.serve.reader.Reader` to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract import aggregates as A
from contract import results as R
from high_level.serve.columns import QueryInfo
from high_level.serve.params import KeyFilter, OrderTerm

_U64 = (1 << 64) - 1
COMPLETENESS = list(R.COMPLETENESS_COLUMNS)
VALUE_ROWS = "kind <> 'late'"  # rows whose aggregates count: a late row only annotates its final row
FOLDED_KINDS = "kind IN ('correction', 'late')"  # rows that belong to a final row of the same (window, key)

MACROS = [
    # dotted IPv4 text -> integer (NULL for anything else); used for prefixes not on octet boundaries
    """CREATE OR REPLACE MACRO lw_ip4num(s) AS
         CASE WHEN regexp_full_match(s, '[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}') THEN
           (TRY_CAST(split_part(s, '.', 1) AS BIGINT) << 24) + (TRY_CAST(split_part(s, '.', 2) AS BIGINT) << 16)
           + (TRY_CAST(split_part(s, '.', 3) AS BIGINT) << 8) + TRY_CAST(split_part(s, '.', 4) AS BIGINT)
         END""",
    # IPv6 text (any '::' compression) -> 32 lower-case hex digits, comparable as a string
    """CREATE OR REPLACE MACRO lw_hex_groups(part) AS
         array_to_string(list_transform(list_filter(string_split(part, ':'), lambda g: g <> ''),
                                        lambda g: lpad(lower(g), 4, '0')), '')""",
    """CREATE OR REPLACE MACRO lw_ip6hex(s) AS
         CASE WHEN NOT contains(s, '::') THEN lw_hex_groups(s)
              ELSE lw_hex_groups(split_part(s, '::', 1))
                   || repeat('0', greatest(0, 32 - length(lw_hex_groups(split_part(s, '::', 1)))
                                              - length(lw_hex_groups(split_part(s, '::', 2)))))
                   || lw_hex_groups(split_part(s, '::', 2))
         END""",
]


def q(ident: str) -> str:
    """Quote an identifier that was already validated against the query's known columns."""
    return '"' + ident.replace('"', '""') + '"'


@dataclass
class Source:
    """Where a request's rows come from: relation SQL text (``lw_src`` or a read_parquet subquery)."""

    rel: str
    params: dict[str, Any]
    cached: bool  # True: prepared tables (``_rank``, ``_wkh``, address words)
    wkh: str = "_wkh"  # the window-and-key hash: a column, or an expression computed where needed


def parquet_source(qi: QueryInfo, paths: list[str], extra: list[str] | None = None) -> Source:
    """The files read by DuckDB directly: their columns are exactly the contract's (the index checked);
    ``extra``: more columns of a tier file (:func:`contract.results.tier_schema`)."""
    cols = ", ".join(q(c) for c in [*(f.name for f in qi.schema), *(extra or [])])
    rel = f"(SELECT {cols} FROM read_parquet($files, hive_partitioning = false))"
    return Source(rel, {"files": paths}, False, key_hash(qi))


def rank_value(qi: QueryInfo) -> str:
    """The value ranking groups: the first aggregate (an avg's NaN ranks last, as NULL)."""
    a, fn = qi.aggs[0]
    return f"CASE WHEN isfinite({q(a)}) THEN {q(a)} END" if A.RESULT_KINDS[fn].float else q(a)


def key_hash(qi: QueryInfo) -> str:
    """One integer per (window, key): matching corrections to finals compares it, not the key strings."""
    return f"hash({', '.join(['window_start', *(q(k) for k in qi.key_names)])})"


def numeric_prefix(f: KeyFilter, i: int, params: dict[str, Any]) -> str:
    """An address prefix as a range over the (hi, lo) words of lowwater's 128-bit address space."""
    lo, hi = f.bounds  # type: ignore[misc]
    h, w = q(f"_ip_{f.column}_hi"), q(f"_ip_{f.column}_lo")
    mapped = f"({h} = 0 AND ({w} >> 32) = 65535)"
    if lo >> 64 == hi >> 64:  # same high word: a range of the low word
        params[f"f{i}h"], params[f"f{i}a"], params[f"f{i}b"] = lo >> 64, lo & _U64, hi & _U64
        cond = f"({h} = $f{i}h AND {w} BETWEEN $f{i}a AND $f{i}b)"
    else:  # a prefix of at most 64 bits: a range of the high word
        params[f"f{i}a"], params[f"f{i}b"] = lo >> 64, hi >> 64
        cond = f"({h} BETWEEN $f{i}a AND $f{i}b)"
    # IPv6 prefixes never match IPv4 rows (as with text: an IPv4 row is never written as ::ffff:a.b.c.d)
    return cond if f.op.startswith("v4") else f"({cond} AND NOT {mapped})"


def filter_sql(filters: list[KeyFilter], params: dict[str, Any], numeric: bool = False) -> list[str]:
    """AND across columns, OR between several filters on the same column.

    ``numeric``: the source has the addresses as words (``_ip_<col>_hi``/``_lo``, prepared in the
    cache), so prefixes are integer ranges instead of text parsing per row.
    """
    by_col: dict[str, list[str]] = {}
    for i, f in enumerate(filters):
        c = q(f.column)
        if numeric and f.bounds is not None:
            by_col.setdefault(f.column, []).append(numeric_prefix(f, i, params))
            continue
        if f.op == "eq":
            params[f"f{i}"] = f.value
            cond = f"{c} = $f{i}"
        elif f.op == "v4prefix":
            params[f"f{i}"] = f.value
            cond = f"starts_with({c}, $f{i})"
        elif f.op == "v4range":
            lo, hi = f.value  # type: ignore[misc]
            params[f"f{i}a"], params[f"f{i}b"] = lo, hi
            cond = f"(NOT contains({c}, ':') AND lw_ip4num({c}) BETWEEN $f{i}a AND $f{i}b)"
        elif f.op == "v6range":
            lo, hi = f.value  # type: ignore[misc]
            params[f"f{i}a"], params[f"f{i}b"] = lo, hi
            cond = f"(contains({c}, ':') AND lw_ip6hex({c}) BETWEEN $f{i}a AND $f{i}b)"
        elif f.op == "v4all":
            cond = f"({c} IS NOT NULL AND NOT contains({c}, ':'))"
        elif f.op == "v6all":
            cond = f"contains({c}, ':')"
        else:  # pragma: no cover - params only produces the ops above
            raise ValueError(f.op)
        by_col.setdefault(f.column, []).append(cond)
    return ["(" + " OR ".join(cs) + ")" for cs in by_col.values()]


def plain_cols(qi: QueryInfo) -> list[str]:
    """A row that needs no folding, in the folded column order."""
    cols = ["window_start", "window_end", *[q(k) for k in qi.key_names]]
    for a, fn in qi.aggs:
        cols.append(
            f"CASE WHEN isfinite({q(a)}) THEN {q(a)} END AS {q(a)}" if A.RESULT_KINDS[fn].nan else q(a)
        )
    return [*cols, "hosts", "closed_at", "CAST(0 AS BIGINT) AS corrections", *COMPLETENESS]


def fold(f: A.Fold, column: str, w: str | None) -> str:
    """A fold of the aggregate registry over ``column`` of a group's rows; ``w`` the quoted count column."""
    c = q(column)
    ok = f"{w} > 0 AND isfinite({c}) AND {VALUE_ROWS}"
    return f.render(w, c=c, val=f"FILTER (WHERE {VALUE_ROWS})", fin="kind = 'final'", ok=ok)


def fold_cols(qi: QueryInfo) -> list[str]:
    """Aggregates folding finals, corrections and late rows of one (window, key) group, each by its
    result kind's fold (:data:`contract.aggregates.RESULT_KINDS`).

    avg is the count-weighted mean when the query has a count aggregate (exact); without one the
    layout carries nothing to weight by, so the final row's avg is kept (``avg_exact`` false). Late
    rows add nothing to the values; they add their ``late_partials`` and make the group incomplete.
    """
    fin = "kind = 'final'"
    w = q(qi.count_col) if qi.count_col else None
    cols = ["window_start", "max(window_end) AS window_end", *[q(k) for k in qi.key_names]]
    for a, fn in qi.aggs:
        cols.append(f"{fold(A.RESULT_KINDS[fn].fold, a, w)} AS {q(a)}")
    return [
        *cols,
        f"coalesce(max(hosts) FILTER (WHERE {fin}), max(hosts)) AS hosts",
        f"coalesce(max(closed_at) FILTER (WHERE {fin}), max(closed_at)) AS closed_at",
        "count(*) FILTER (WHERE kind = 'correction') AS corrections",
        f"coalesce(max(hosts_expected) FILTER (WHERE {fin}), max(hosts_expected)) AS hosts_expected",
        f"coalesce(max(hosts_in_mark) FILTER (WHERE {fin}), max(hosts_in_mark)) AS hosts_in_mark",
        "CAST(sum(late_partials) AS BIGINT) AS late_partials",
        f"coalesce(max(missing_records) FILTER (WHERE {fin}), max(missing_records)) AS missing_records",
        "coalesce(bool_and(complete) FILTER (WHERE kind IN ('final', 'late')), bool_and(complete)) AS complete",
    ]


def scan(src: Source, filters: list[KeyFilter], params: dict[str, Any]) -> str:
    """The rows of the range (and filters) as a subquery; inlined, not a CTE, so it is never copied."""
    where = ["window_start >= $start", "window_start < $end", *filter_sql(filters, params, src.cached)]
    return f"(SELECT * FROM {src.rel} WHERE {' AND '.join(where)})"


def folded(qi: QueryInfo, src: Source, rows: str, corrections: bool) -> tuple[str, str]:
    """(CTE prefix, subquery) of one row per (window, key) with corrections folded into finals.

    Grouping every row is the costly part and corrections are rare, so: rows of windows without
    corrections (``cw``) pass through; in windows with corrections, rows of groups without
    corrections (``ck``, matched on the window-and-key hash) pass through; only the rest is grouped.
    ``corrections``: whether the files may hold any (False: the footers say they hold finals only).
    """
    keys = [q(k) for k in qi.key_names]
    plain = ", ".join(plain_cols(qi))
    if not corrections:
        return "", f"(SELECT {plain} FROM {rows} WHERE kind = 'final')"
    ctes = (
        f", cw AS (SELECT DISTINCT window_start FROM {rows} WHERE {FOLDED_KINDS})"
        f", ck AS (SELECT DISTINCT {src.wkh} AS _h FROM {rows} WHERE {FOLDED_KINDS})"
    )
    inw = f"(SELECT *, {src.wkh} AS _h FROM (SELECT * FROM {rows} SEMI JOIN cw USING (window_start)))"
    sub = (
        f"(SELECT {plain} FROM {rows} ANTI JOIN cw USING (window_start) WHERE kind = 'final'"
        f" UNION ALL SELECT {plain} FROM {inw} ANTI JOIN ck USING (_h) WHERE kind = 'final'"
        f" UNION ALL SELECT {', '.join(fold_cols(qi))} FROM (SELECT * FROM {inw} SEMI JOIN ck USING (_h))"
        f" GROUP BY {', '.join(['window_start', *keys])} HAVING count(*) FILTER (WHERE {VALUE_ROWS}) > 0)"
    )
    return ctes, sub


def only_complete(sub: str, complete: bool | None, params: dict[str, Any]) -> str:
    """Folded rows restricted to complete (True) or incomplete (False) ones; None: all of them."""
    if complete is None:
        return sub
    params["complete"] = complete
    return f"(SELECT * FROM {sub} WHERE complete = $complete)"


def ranked_sql(
    qi: QueryInfo,
    src: Source,
    rows: str,
    term: OrderTerm,
    n: int,
    narrow: bool,
    corrections: bool,
    complete: bool | None = None,
    params: dict[str, Any] | None = None,
) -> str:
    """``WITH ... ranked AS (...)``: the top-n folded rows of every window, with ``rank``.

    ``narrow``: first bound the candidates by the n-th value of each window (ties stay in), so
    the window function sorts only those rows. ``complete``: rank only the complete (True) or
    incomplete (False) rows (its value goes into ``params``).
    """
    v = q(term.column)
    rdir = "DESC" if term.descending else "ASC"
    keys = "".join(", " + q(k) for k in qi.key_names)
    ctes, cand = folded(qi, src, rows, corrections)
    cand = only_complete(cand, complete, params if params is not None else {})
    if narrow:
        pick, cmp, ext = ("max", ">=", "list_min") if term.descending else ("min", "<=", "list_max")
        ctes += (
            f", th AS (SELECT window_start, CASE WHEN count({v}) >= {n}"
            f" THEN {ext}({pick}({v}, {n})) END AS t FROM {cand} GROUP BY window_start)"
        )
        cand = f"(SELECT f.* FROM {cand} AS f JOIN th USING (window_start) WHERE th.t IS NULL OR f.{v} {cmp} th.t)"
    return (
        f"WITH _ AS (SELECT 1){ctes}, ranked AS (SELECT *, row_number() OVER (PARTITION BY window_start"
        f" ORDER BY {v} {rdir} NULLS LAST{keys}) AS rank FROM {cand} QUALIFY rank <= {n})"
    )


TIME_COLUMNS = frozenset({"window_start", "window_end", "closed_at"})


def _value(column: str) -> str:
    """A sort column as the cursor holds it (timestamps as epoch microseconds)."""
    return f"epoch_us({q(column)})" if column in TIME_COLUMNS else q(column)


def after_sql(terms: list[tuple[str, bool]], key: list, params: dict[str, Any]) -> str:
    """Rows strictly after ``key`` in the order of ``terms`` ((column, descending), NULLS LAST each):
    the keyset condition of cursor paging, expanded lexicographically (mixed directions and NULLs)."""
    cond = "FALSE"
    for i in range(len(terms) - 1, -1, -1):
        col, desc = terms[i]
        x, v = _value(col), key[i]
        if v is None:
            strictly, equal = "FALSE", f"{x} IS NULL"
        else:
            params[f"c{i}"] = v
            strictly = f"({x} {'<' if desc else '>'} $c{i} OR {x} IS NULL)"
            equal = f"{x} = $c{i}"
        cond = f"({strictly} OR ({equal} AND {cond}))"
    return cond


def bucket_sql(step_us: int) -> str:
    """The start (epoch us) of a window's step bucket; buckets are aligned to ``$s_us`` (itself aligned
    to the epoch by :func:`high_level.serve.params.stepped_range`)."""
    return f"(epoch_us(window_start) - (epoch_us(window_start) - $s_us) % {int(step_us)})"
