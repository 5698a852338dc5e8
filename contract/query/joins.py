"""Join queries (``kind: join``): the band-join model, its checks against its inputs, and what a join
reads and writes beyond two selects: aggregate queries' closed windows as inputs, and
raw joined rows as its output. Defined once here because the job (which publishes and joins them) and the
config loader and the API (which check and serve them) must agree on every word and column.

**Closed windows as a join input.** A join may name an aggregate query as ``left`` or ``right``. The job
then publishes every ``final`` row of that query, once it is in the results store, to the *closed-window
feed* topic :func:`closed_topic` in the wire format of select rows (:func:`contract.wire.encode_rows`),
so the join reads it exactly as it reads a select:

* one row per closed (window, group): timestamp = the window's **start** (ns), then the query's group
  words (an address two words, ``<name>.hi`` / ``<name>.lo``, as a select's) and then one word per
  integer aggregate (count, sum, min, max; an avg travels as its sum and count and cannot be joined on:
  a ratio has no exact value to compare or add up, so a join naming it is a config error);
* punctuation: the roll-up's closed frontier, i.e. every window ``< c`` of every Kafka partition of the
  query is closed, so every future row starts at or after ``window_start(c)``: that is the mark
  (``mark_ns``), sent by one publisher (:data:`FEED_HOST`) after the batch's rows. A closed window is
  final, so the join's anti rows are exact as soon as the other input's frontier passes them;
* ``seq`` of a rows batch is the job's micro-batch id: a replayed batch (the job restarted between
  publishing and committing) republishes identical rows with the same ``seq``; the join keeps the highest
  ``seq`` it applied per feed and skips the replay (exactly once);
* one Kafka partition (closed rows are one per window and group, few); a join that mixes a feed with a
  select therefore needs that select on one partition too (the config check says so).

``within: window`` joins two aggregate queries with the same window on the same window (band 0 on the
window starts); a time band between two feeds compares window starts. Only ``final`` rows are
published: a late ``correction`` of a closed window (``--late-policy correction``) does not reach the join
(its frontier has passed and what the join emitted cannot be taken back); the publisher counts and logs them.

**Raw joined rows as output.** A join without ``aggregates`` stores its output rows themselves: one
column per field of each side (``left_<field>``, ``right_<field>``; an anti join only the left side),
both timestamps (``left_timestamp``, ``right_timestamp``, ns), for a ``left`` join ``matched`` (1 or 0;
the right columns and timestamp are 0 on an unmatched row) and ``rows``: how many identical output rows
the window holds (the same SYN retransmitted at the same nanosecond, say). Rows are filed in the window
of their left timestamp (``window_on: right``: their right one; the join's ``window``, by default tumbling :data:`DEFAULT_ROWS_WINDOW`) and
written when the join's output punctuation closes that window, like every stored window: the API and
page serve them as any query's rows (``/queries/<join>/results``, ``/latest``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from contract import aggregates as A
from contract import fields as F
from contract.query.layout import state_columns
from contract.query.model import (
    NS,
    AggregateSpec,
    FlushSpec,
    HeartbeatSpec,
    KafkaSpec,
    QuerySpec,
    TableSpec,
    WindowSpec,
    _Strict,
    holistic,
    parse_duration_ns,
)
from contract.query.selects import SelectSpec

_SIDE_FIELD = re.compile(r"^(left|right)\.([a-z_]+)$")

FEED_HOST = "lowwater-job"  # the publisher id of every closed-window feed's punctuation
FEED_SUFFIX = ".closed."
DEFAULT_ROWS_WINDOW = {"range": "1m"}
NEVER = 2**62  # retain of a feed: a closed window never expires from the join's point of view


def signed_duration_ns(v: Any) -> int:
    """A duration that may be negative ('-2s'): one end of a two-sided band."""
    if isinstance(v, str) and v.strip().startswith("-"):
        return -parse_duration_ns(v.strip()[1:])
    return parse_duration_ns(v)


def closed_topic(q: QuerySpec) -> str:
    """The closed-window feed topic of an aggregate query (next to its partials topic, named by the query)."""
    return f"{q.topic}{FEED_SUFFIX}{q.name}"


@dataclass(frozen=True)
class _Kafka:
    partitions: int = 1


@dataclass(frozen=True)
class ClosedInput:
    """An aggregate query seen as a join input: the same interface a join uses of a :class:`SelectSpec`
    (name, topic, fields, words, partitions, retain) over the rows of :func:`closed_topic`."""

    query: QuerySpec

    @property
    def name(self) -> str:
        return self.query.name

    @property
    def topic(self) -> str:
        return closed_topic(self.query)

    @property
    def kafka(self) -> _Kafka:
        return _Kafka(1)

    @property
    def partition_by(self) -> list[str]:
        return []

    @property
    def retain_ns(self) -> int:
        return NEVER

    @property
    def window(self) -> WindowSpec:
        return self.query.window

    @property
    def columns(self) -> list[tuple[str, str]]:
        """Row words after the timestamp: (word name, field name); group words first, then aggregates."""
        out: list[tuple[str, str]] = []
        for p in self.query.key_parts:
            out += (
                [(f"{p.name}.hi", p.name), (f"{p.name}.lo", p.name)] if p.words == 2 else [(p.name, p.name)]
            )
        if not self.query.key_parts:
            out.append(("_", "_"))  # the constant word of a query without group-by
        out += [(c.name, c.name) for c in state_columns(self.query)]
        return out

    @property
    def fields(self) -> list[str]:
        """Names a join may use: group-by columns and integer aggregates."""
        return [p.name for p in self.query.key_parts] + [
            a.name for a in self.query.aggregates if A.REGISTRY[a.fn].exact_int
        ]

    @property
    def width(self) -> int:
        return len(self.columns)

    def word_index(self, name: str) -> list[int]:
        return [i for i, (_, f) in enumerate(self.columns) if f == name]

    def field_type(self, name: str) -> tuple[str, int, Any]:
        """(kind, words, prefix) of a field: what must agree between two join keys."""
        for p in self.query.key_parts:
            if p.name == name:
                return (p.field.kind, p.words, (p.prefix4, p.prefix6) if p.prefix4 is not None else None)
        return ("int", 1, None)

    def group_item(self, name: str, alias: str) -> dict:
        """The group-by item that stores this field's words under ``alias`` (raw rows output)."""
        for p in self.query.key_parts:
            if p.name == name:
                item: dict = {"field": p.field.name, "as": alias}
                if p.prefix4 is not None:
                    item |= {"prefix4": p.prefix4, "prefix6": p.prefix6}
                return item
        return {"field": "length", "as": alias}  # an integer aggregate: one int64 word


def unsupported(q: QuerySpec) -> str | None:
    """Why an aggregate query cannot feed a join, or None."""
    if holistic(q) is not None:
        return f"aggregate query {q.name!r} has a holistic aggregate; only count/sum/min/max/avg queries can feed a join"
    if q.having:
        return f"aggregate query {q.name!r} has 'having': its stored windows are a subset; join the query without it"
    if q.window.landmark:
        return f"aggregate query {q.name!r} has a landmark window; join a sliding or tumbling one"
    return None


def field_type(inp: Any, name: str) -> tuple[str, int, Any]:
    """(kind, words, prefix) of a field of a join input (select or closed windows)."""
    if isinstance(inp, ClosedInput):
        return inp.field_type(name)
    if name == "timestamp":
        return ("time", 1, None)
    fld = F.CATALOG[name]
    return (fld.kind, len(fld.columns), None)


def inputs(selects: list[SelectSpec], queries: list[QuerySpec]) -> dict[str, Any]:
    """Every query a join may read, by name: selects, and aggregates as :class:`ClosedInput`."""
    return {**{q.name: ClosedInput(q) for q in queries}, **{s.name: s for s in selects}}


def _group_item(inp: Any, name: str, alias: str) -> dict:
    if isinstance(inp, ClosedInput):
        return inp.group_item(name, alias)
    return {"field": name, "as": alias}


def rows_columns(j: JoinSpec, left: Any, right: Any) -> list[tuple[str, str, str]]:
    """(column, side, field) of a raw-rows join's key columns in order; side 'matched' is the flag.
    Fields of each side in the input's order, then its timestamp."""
    out: list[tuple[str, str, str]] = []
    sides = [("left", left)] + ([] if j.type == "anti" else [("right", right)])
    for side, inp in sides:
        out += [(f"{side}_{f}", side, f) for f in inp.fields]
        out.append((f"{side}_timestamp", side, "timestamp"))
    if j.type == "left":
        out.append(("matched", "matched", ""))
    return out


ROWS_COLUMN = "rows"


def rows_query(j: JoinSpec, left: Any, right: Any) -> QuerySpec:
    """The result shape of a raw-rows join as an aggregate query (as :func:`join_result_query` does for an
    aggregated join): every output column a group-by column, ``rows`` a count, so the store's schema, the
    roll-up and the API derive from it unchanged. A timestamp or an aggregate's value is stored as an
    integer column (an int field aliased), never sent to a capture host."""
    by = {"left": left, "right": right}
    group = []
    for col, side, f in rows_columns(j, left, right):
        if side == "matched" or f == "timestamp":
            group.append({"field": "length", "as": col})
        else:
            group.append(_group_item(by[side], f, col))
    window = j.window or WindowSpec.model_validate(DEFAULT_ROWS_WINDOW)
    aggs = [AggregateSpec.model_construct(fn="count", field=None, alias=ROWS_COLUMN)]
    return QuerySpec.model_construct(
        name=j.name,
        description=j.description or f"{j.type} join rows of {left.name} and {right.name}",
        sources=["*"],
        filter=None,
        group_by=group,
        aggregates=aggs,
        having=None,
        alerts=[],
        export=None,
        window=window,
        table=TableSpec(),
        flush=FlushSpec(),
        heartbeat=HeartbeatSpec(),
        kafka=KafkaSpec(topic=f"lowwater.join.{j.name}", partitions=1),
    )


class JoinOn(_Strict):
    left: list[str] = Field(min_length=1)
    right: list[str] = Field(min_length=1)


class JoinAggregate(_Strict):
    """An aggregate over the join output: ``expr`` is ``left.f``, ``right.f`` or a sum/difference of them."""

    fn: Literal[A.JOIN_FNS]  # type: ignore[valid-type]
    expr: str | None = None
    alias: str = Field(alias="as")

    @model_validator(mode="after")
    def _check(self) -> JoinAggregate:
        takes_expr = bool(A.REGISTRY[self.fn].field_kinds)
        if not takes_expr and self.expr is not None:
            raise ValueError(f"{self.fn} takes no expr (it counts joined rows)")
        if takes_expr and self.expr is None:
            raise ValueError(f"{self.fn} needs an expr such as 'right.timestamp - left.timestamp'")
        return self


def parse_join_expr(text: str) -> list[tuple[int, str, str]]:
    """'right.timestamp - left.timestamp' -> [(+1, 'right', 'timestamp'), (-1, 'left', 'timestamp')]."""
    toks = re.findall(r"[+-]|[a-z_]+\.[a-z_]+|\S+", text)
    terms: list[tuple[int, str, str]] = []
    sign, want_term = 1, True
    for t in toks:
        if want_term:
            if t in "+-":
                sign = -sign if t == "-" else sign
                continue
            m = _SIDE_FIELD.match(t)
            if not m:
                raise ValueError(f"{t!r} is not left.<field> or right.<field>")
            terms.append((sign, m.group(1), m.group(2)))
            want_term = False
        else:
            if t not in "+-" or not t:
                raise ValueError(f"expected + or - after a term, got {t!r}")
            sign, want_term = (1 if t == "+" else -1), True
    if want_term:
        raise ValueError(f"expression {text!r} is incomplete")
    return terms


class JoinSpec(_Strict):
    """An order-agnostic band join of two selections (``high_level.join.band``), closed by punctuation.

    Rows match when the ``on`` words are equal and ``0 <= right.timestamp - left.timestamp <= within``
    (``band: [lo, hi]``: between lo and hi, lo may be negative; ``within: window`` between two selects:
    both timestamps in the same window of the join's tumbling ``window``);
    ``type``: ``inner`` (matching pairs), ``left`` (pairs, and left rows without a match), ``anti``
    (only left rows without a match). With ``aggregates`` the output is aggregated per window and
    ``group_by`` (``left.f`` / ``right.f``), windows on the left row's timestamp (``window_on``); without, the joined
    rows themselves are stored (below); ``window_on: right`` (inner joins) files them by the right
    row's timestamp instead. An input may be an aggregate query's closed
    windows; ``within: window`` joins two of them on the same window.
    """

    kind: Literal["join"]
    name: str
    description: str = ""
    left: str
    right: str
    on: JoinOn
    within_ns: int = Field(default=-1, alias="within")
    # ``band: [lo, hi]`` (RANGE0/RANGE1): lo <= right.timestamp - left.timestamp <= hi; ``within: w`` is [0, w]
    band_ns: tuple[int, int] | None = Field(default=None, alias="band")
    same_window: bool = False  # ``within: window``: rows (or two aggregates' windows) of the same window
    type: Literal["inner", "left", "anti"] = "inner"
    group_by: list[str] = Field(default_factory=list)
    aggregates: list[JoinAggregate] = Field(default_factory=list)
    window: WindowSpec | None = None
    # which timestamp of an output row files it in ``window`` (OOP section 7, query Q3): the join closes
    # the windows by that component of its joint punctuation (high_level.join.band)
    window_on: Literal["left", "right"] = "left"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return QuerySpec._name(v)

    @model_validator(mode="before")
    @classmethod
    def _same_window(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("within") == "window":
            data = {**data, "within": 0, "same_window": True}
        return data

    @field_validator("within_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)

    @field_validator("band_ns", mode="before")
    @classmethod
    def _band(cls, v: Any) -> Any:
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise ValueError("band is [lo, hi], e.g. [-2s, 5s]: right.timestamp - left.timestamp in [lo, hi]")
        lo, hi = (signed_duration_ns(x) for x in v)
        if lo > hi:
            raise ValueError(f"band [{v[0]}, {v[1]}]: lo is above hi")
        return (lo, hi)

    @property
    def band_lo_ns(self) -> int:
        """Lowest right.timestamp - left.timestamp of a match (0 for ``within``)."""
        return 0 if self.band_ns is None else self.band_ns[0]

    @property
    def band_hi_ns(self) -> int:
        """Highest right.timestamp - left.timestamp of a match (``within``)."""
        return self.within_ns if self.band_ns is None else self.band_ns[1]

    @property
    def reach_ns(self) -> int:
        """How far apart in time two matching rows may be (what an input must retain)."""
        if self.same_window and self.window is not None:
            return self.window.range_ns
        return max(abs(self.band_lo_ns), abs(self.band_hi_ns))

    @field_validator("group_by")
    @classmethod
    def _group(cls, v: list[str]) -> list[str]:
        for g in v:
            if not _SIDE_FIELD.match(g):
                raise ValueError(f"group-by item {g!r} must be left.<field> or right.<field>")
        names = [g.split(".")[1] for g in v]
        if len(set(names)) != len(names):
            raise ValueError(f"group-by names {names} are not distinct")
        return v

    @model_validator(mode="after")
    def _check(self) -> JoinSpec:
        if self.band_ns is not None and "within_ns" in self.model_fields_set:
            raise ValueError("give either 'within' or 'band', not both")
        if self.band_ns is None and "within_ns" not in self.model_fields_set:
            raise ValueError(
                "a join needs its time band: 'within: 3s', 'band: [-2s, 5s]' or 'within: window'"
            )
        if self.band_ns is not None:
            object.__setattr__(self, "within_ns", self.band_ns[1])  # frozen model: set once, here
        elif self.within_ns < 0:
            raise ValueError("within must not be negative")
        if len(self.on.left) != len(self.on.right):
            raise ValueError(f"on: {len(self.on.left)} left keys but {len(self.on.right)} right keys")
        if self.aggregates and self.window is None:
            raise ValueError("aggregates over a join need a window")
        for a in self.aggregates:
            if a.expr is not None:
                parse_join_expr(a.expr)
        names = [a.alias for a in self.aggregates]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate aggregate names {names}")
        if self.window_on == "right" and self.type != "inner":
            raise ValueError(
                f"window_on: right needs an inner join: a {self.type} join's rows without a match have no "
                "right timestamp to file them by"
            )
        if self.type != "inner":
            for item in [*self.group_by, *(a.expr or "" for a in self.aggregates)]:
                if "right." in item:
                    raise ValueError(
                        f"a {self.type} join's aggregates see left rows without a match too: "
                        f"{item!r} reads the right side (aggregate it with an inner join)"
                    )
        return self


def check_join(j: JoinSpec, selects: dict[str, Any]) -> tuple[str, str] | None:
    """Cross-query checks of a join against its inputs (selects, or aggregates' closed windows as
    :class:`ClosedInput`): (field, reason) of the first problem, or None."""
    for side in ("left", "right"):
        if getattr(j, side) not in selects:
            return side, (
                f"unknown query {getattr(j, side)!r} (a join reads select or aggregate queries: "
                f"{sorted(selects) or 'none'})"
            )
        inp = selects[getattr(j, side)]
        if isinstance(inp, ClosedInput) and (why := unsupported(inp.query)):
            return side, why
    sl, sr = selects[j.left], selects[j.right]
    closed = [isinstance(s, ClosedInput) for s in (sl, sr)]
    if j.same_window and any(closed) and not all(closed):
        return (
            "within",
            "'within: window' joins two aggregate queries' closed windows or two selects' rows; "
            "give a select joined with an aggregate a time band",
        )
    if j.same_window and not any(closed):
        w = j.window
        if w is None or w.landmark or w.slide != w.range_ns:
            return "window", (
                "'within: window' between two selects joins rows of the same tumbling window: "
                "give the join a tumbling 'window: {range: ...}'"
            )
    if all(closed) and sl.window != sr.window:
        return "right", (
            f"aggregate queries {sl.name!r} and {sr.name!r} have different windows "
            f"({_window_text(sl.window)} vs {_window_text(sr.window)}): a join of closed windows "
            "compares window starts, give both the same window"
        )
    for lk, rk in zip(j.on.left, j.on.right, strict=True):
        for side, s, k in (("left", sl, lk), ("right", sr, rk)):
            if k != "timestamp" and k not in s.fields:
                kind = "aggregate query" if isinstance(s, ClosedInput) else "select"
                return "on", _avg_reason(
                    s, k
                ) or f"{side} key {k!r} is not a field of {kind} {s.name!r} ({s.fields})"
        tl, tr = field_type(sl, lk), field_type(sr, rk)
        if tl != tr:
            return (
                "on",
                f"keys {lk!r} and {rk!r} differ in type or width ({_type_text(tl)} vs {_type_text(tr)})",
            )
    for s in (sl, sr):
        if j.reach_ns > s.retain_ns:
            return "band" if j.band_ns is not None else "within", (
                f"{'window' if j.same_window else 'band'} {j.reach_ns / NS:g}s is larger than what input "
                f"{s.name!r} can hold "
                f"(retain {s.retain_ns / NS:g}s)"
            )
    if sl.kafka.partitions != sr.kafka.partitions:
        return "right", (
            f"inputs have {sl.kafka.partitions} and {sr.kafka.partitions} Kafka partitions: "
            "equal keys must meet in the same partition"
        )
    if sl.kafka.partitions > 1:
        pl, pr = sl.partition_by, sr.partition_by
        pairs = dict(zip(j.on.left, j.on.right, strict=True))
        if not pl or len(pl) != len(pr) or any(pairs.get(a) != b for a, b in zip(pl, pr, strict=True)):
            return "on", (
                f"the inputs' partition_by ({pl} / {pr}) must be join keys in the same order on both "
                "sides, so that matching rows land in the same partition"
            )
    for item in [
        *j.group_by,
        *(t for a in j.aggregates if a.expr for t in (f"{s}.{f}" for _, s, f in parse_join_expr(a.expr))),
    ]:
        side, fname = item.split(".")
        s = sl if side == "left" else sr
        if fname != "timestamp" and fname not in s.fields:
            return "group_by", _avg_reason(
                s, fname
            ) or f"{item!r}: {fname!r} is not a field of {s.name!r} ({s.fields})"
        if fname != "timestamp" and field_type(s, fname)[0] == "ip" and item not in j.group_by:
            return "aggregates", f"{item!r}: an address cannot be summed"
    return None


def _avg_reason(inp: Any, name: str) -> str | None:
    """Why an avg of an aggregate query is no join field: an average is a ratio with no exact integer
    word to compare (``on``) or add up (a join's aggregates); its sum and count are."""
    if not isinstance(inp, ClosedInput):
        return None
    for a in inp.query.aggregates:
        if a.name == name and a.fn == "avg":
            return (
                f"{name!r} is an avg of aggregate query {inp.name!r}: an average (sum / count) has no exact "
                f"value to compare or add up in a join; give {inp.name!r} a sum and a count of "
                f"{a.field!r} and join on those (or compute their ratio from the join's rows)"
            )
    return None


def _window_text(w: WindowSpec) -> str:
    return f"range {w.range_ns / NS:g}s, slide {w.slide / NS:g}s, origin {w.origin_ns / NS:g}s"


def _type_text(t: tuple) -> str:
    kind, words, prefix = t
    return f"{kind}{'' if prefix is None else f' /{prefix[0]}/{prefix[1]}'}, {words} word{'s' if words > 1 else ''}"


def join_result_query(j: JoinSpec, left: SelectSpec, right: SelectSpec) -> QuerySpec:
    """The result shape of a windowed join as an aggregate query: its group-by columns (``left.dst_port``
    -> ``dst_port``) and aggregates (avg as sum + count), so the store's schema, the roll-up layout and the
    API derive from it unchanged. Built without validation (an aggregate's ``field`` stands for the join
    expression: its state column is the expression's value), never sent to a capture host."""
    assert j.window is not None
    aggs = [
        AggregateSpec.model_construct(
            fn=a.fn, field="length" if A.REGISTRY[a.fn].field_kinds else None, alias=a.alias
        )
        for a in j.aggregates
    ]
    return QuerySpec.model_construct(
        name=j.name,
        description=j.description or f"{j.type} join of {left.name} and {right.name}",
        sources=["*"],
        filter=None,
        group_by=[g.split(".")[1] for g in j.group_by],
        aggregates=aggs,
        having=None,
        alerts=[],
        export=None,
        window=j.window,
        table=TableSpec(),
        flush=FlushSpec(),
        heartbeat=HeartbeatSpec(),
        kafka=KafkaSpec(topic=f"lowwater.join.{j.name}", partitions=1),
    )
