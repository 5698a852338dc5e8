"""What a join query reads and writes beyond two selects: aggregate queries' closed windows as inputs, and
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
of their left timestamp (the join's ``window``, by default tumbling :data:`DEFAULT_ROWS_WINDOW`) and
written when the join's output punctuation closes that window, like every stored window: the API and
page serve them as any query's rows (``/queries/<join>/results``, ``/latest``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract import fields as F
from contract import query as Q

FEED_HOST = "lowwater-job"  # the publisher id of every closed-window feed's punctuation
FEED_SUFFIX = ".closed."
DEFAULT_ROWS_WINDOW = {"range": "1m"}
NEVER = 2**62  # retain of a feed: a closed window never expires from the join's point of view
INT_AGGS = ("count", "sum", "min", "max")


def closed_topic(q: Q.QuerySpec) -> str:
    """The closed-window feed topic of an aggregate query (next to its partials topic, named by the query)."""
    return f"{q.topic}{FEED_SUFFIX}{q.name}"


@dataclass(frozen=True)
class _Kafka:
    partitions: int = 1


@dataclass(frozen=True)
class ClosedInput:
    """An aggregate query seen as a join input: the same interface a join uses of a :class:`Q.SelectSpec`
    (name, topic, fields, words, partitions, retain) over the rows of :func:`closed_topic`."""

    query: Q.QuerySpec

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
    def window(self) -> Q.WindowSpec:
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
        out += [(c.name, c.name) for c in Q.state_columns(self.query)]
        return out

    @property
    def fields(self) -> list[str]:
        """Names a join may use: group-by columns and integer aggregates."""
        return [p.name for p in self.query.key_parts] + [
            a.name for a in self.query.aggregates if a.fn in INT_AGGS
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


def unsupported(q: Q.QuerySpec) -> str | None:
    """Why an aggregate query cannot feed a join, or None."""
    if Q.holistic(q) is not None:
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


def inputs(selects: list[Q.SelectSpec], queries: list[Q.QuerySpec]) -> dict[str, Any]:
    """Every query a join may read, by name: selects, and aggregates as :class:`ClosedInput`."""
    return {**{q.name: ClosedInput(q) for q in queries}, **{s.name: s for s in selects}}


def _group_item(inp: Any, name: str, alias: str) -> dict:
    if isinstance(inp, ClosedInput):
        return inp.group_item(name, alias)
    return {"field": name, "as": alias}


def rows_columns(j: Q.JoinSpec, left: Any, right: Any) -> list[tuple[str, str, str]]:
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


def rows_query(j: Q.JoinSpec, left: Any, right: Any) -> Q.QuerySpec:
    """The result shape of a raw-rows join as an aggregate query (as :func:`Q.join_result_query` does for an
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
    window = j.window or Q.WindowSpec.model_validate(DEFAULT_ROWS_WINDOW)
    aggs = [Q.AggregateSpec.model_construct(fn="count", field=None, alias=ROWS_COLUMN)]
    return Q.QuerySpec.model_construct(
        name=j.name, description=j.description or f"{j.type} join rows of {left.name} and {right.name}",
        sources=["*"], filter=None, group_by=group, aggregates=aggs, having=None, alerts=[], export=None,
        window=window, table=Q.TableSpec(), flush=Q.FlushSpec(), heartbeat=Q.HeartbeatSpec(),
        kafka=Q.KafkaSpec(topic=f"lowwater.join.{j.name}", partitions=1))  # fmt: skip
