"""The query model: what an aggregate query asks for, validated with precise errors.

A query is a windowed group-by aggregate over packets. The low level computes per-pane partial
aggregates (pane = gcd(range, slide), the dissertation's paned WID) and the high level assembles
windows from panes; a query may also keep only the windows that pass a HAVING condition and declare
alert rules over closed windows (:mod:`contract.condlang`). Every layout both levels use is derived from
this model (:mod:`contract.query.layout`), so they cannot disagree.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from contract import aggregates as A
from contract import condlang, sketch
from contract import fields as F
from contract.aggregates import DEFAULT_ACCURACY
from contract.filterlang import FilterError, compile_filter
from contract.query import tiers
from contract.query.durations import NS, duration_name, parse_duration_ns
from contract.query.windows import WindowSpec, _Strict, strategy_refusal

RAW_TIER = "raw"  # the retention key of the store's own (per micro-batch, then compacted) files


class ConfigError(ValueError):
    """A config that cannot be used: names the file, the line, the field and the reason."""

    def __init__(self, file: str, line: int | None, field: str, reason: str) -> None:
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")
        self.file, self.line, self.field, self.reason = file, line, field, reason


Duration = Annotated[int, Field(description="duration; YAML accepts '10s', '1m', '500ms' or seconds")]


class TableSpec(_Strict):
    size: int = 65536
    probes: int = Field(default=4, ge=1, le=16)

    @field_validator("size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v < 16 or v & (v - 1):
            raise ValueError(f"table size must be a power of two >= 16, got {v}")
        if v > 1 << 26:
            raise ValueError("table size above 2^26 slots is not supported")
        return v


class FlushSpec(_Strict):
    policy: Literal["lazy", "slow", "iop"] = "lazy"
    m: int = 2
    i: int = 160

    @model_validator(mode="after")
    def _check(self) -> FlushSpec:
        if not 1 <= self.m <= 32:
            raise ValueError("m (windows of extra delay) must be between 1 and 32")
        if self.i < 1:
            raise ValueError("i (packets per slow flush) must be >= 1")
        return self


# group-by fields that stay the same over a TCP connection: a key of these plus the connection's
# addresses and ports still names one connection, so its FIN/RST closes the whole group
CONNECTION_FIELDS = ("src_ip", "dst_ip", "src_port", "dst_port")
CONNECTION_EXTRA = ("protocol", "ip_version", "vlan", "interface", "ethertype", "src_mac", "dst_mac")


class GroupCloseSpec(_Strict):
    """The agent's built-in group-wise punctuation rule (``heartbeat: {groups: {on: tcp_close, grace: 2s}}``):
    a group's first RST or FIN, at stream time c, closes it; once the host's clock passes c + grace, the
    agent drains the group's entries and says "done below the pane holding c + grace". The grace covers
    what follows a FIN on a directed key (the peer's FIN-ACK, the final ACK) and the disorder such packets
    may have; a packet of the group below that pane arriving later is a late partial (counted, flagged)."""

    on: Literal["tcp_close"]
    grace_ns: int = Field(default=2 * NS, alias="grace", ge=0)

    @field_validator("grace_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)


class HeartbeatSpec(_Strict):
    """How a capture host punctuates. ``max_disorder``: how far back a busy host's packet timestamps may
    go (capture out of order, e.g. flow-sorted blocks); its mark stays that far behind its data clock,
    so such packets are not late (cost: windows close that much later). The default is the default
    skew: block-sorted disorder up to it loses nothing (benchmarks/bench_disorder.py). 0 is the
    strict rule (the mark follows the table's oldest pane).

    ``groups`` (OOP App. A): the job honours group-wise punctuation from the query's hosts (wire kind
    PUNCT_GROUPS, "group g is done up to t": a flow's FIN/RST, an exporter's flow end) and closes that
    group's windows at once, the low-water mark still closing the rest; a later partial of such a window
    is late (counted, flagged). Off: such punctuation is counted and ignored."""

    interval_ns: int = Field(default=NS, alias="interval")
    skew_ns: int = Field(default=2 * NS, alias="skew")
    max_disorder_ns: int = Field(default=2 * NS, alias="max_disorder", ge=0)
    on_demand: bool = True
    groups: bool = False
    # the agent's built-in rule that sends it (``groups: {on: tcp_close, grace: 2s}`` sets both)
    close: GroupCloseSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _rule(cls, data: Any) -> Any:
        g = data.get("groups") if isinstance(data, dict) else None
        if isinstance(g, dict):  # YAML 1.1 reads a bare ``on`` key as true
            rule = {("on" if k is True else k): v for k, v in g.items()}
            data = {**data, "groups": True, "close": rule}
        return data

    @field_validator("interval_ns", "skew_ns", "max_disorder_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)

    @field_validator("interval_ns")
    @classmethod
    def _pos(cls, v: int) -> int:
        if v < 10_000_000:
            raise ValueError("heartbeat interval must be at least 10ms")
        return v


class ExportSpec(_Strict):
    """Export the last closed window's top ``top`` groups by aggregate ``by`` as Prometheus series.

    Bounded on purpose: at most ``top`` series per aggregate of the query, replaced at every window.
    """

    top: int = Field(default=10, ge=1, le=1000)
    by: str | None = None  # default: the first aggregate


class KafkaSpec(_Strict):
    topic: str | None = None
    partitions: int = Field(default=1, ge=1, le=256)

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", v):
            raise ValueError("a Kafka topic uses only letters, digits, '.', '_' and '-'")
        return v


HOLISTIC = A.HOLISTIC  # two-stage: a sub-key per (group, value), reduced at close


class AggregateSpec(_Strict):
    """One aggregate of a query; what each ``fn`` is, takes and keeps is its :mod:`contract.aggregates` entry."""

    fn: Literal[A.NAMES]  # type: ignore[valid-type]
    field: str | None = None
    alias: str | None = Field(default=None, alias="as")
    # holistic parameters (contract.sketch): count_distinct approx/precision, quantiles q/accuracy, top k/by
    approx: Literal["hll"] | None = None
    precision: int | None = None
    q: list[float] | None = None
    accuracy: float | None = None
    k: int | None = None
    by: str | None = None
    capacity: int | None = None  # top: Misra-Gries summary of at most this many items per (pane, group)

    @model_validator(mode="after")
    def _check(self) -> AggregateSpec:
        agg = A.REGISTRY[self.fn]
        for param in A.PARAMS:
            if getattr(self, param) is not None and param not in agg.params:
                fns = [a.fn for a in A.REGISTRY.values() if param in a.params]
                raise ValueError(f"{param!r} is a parameter of {' / '.join(fns)}, not of {self.fn}")
        if not agg.field_kinds:
            if self.field is not None:
                raise ValueError(f"{self.fn} takes no field (it counts packets)")
        else:
            if self.field is None:
                raise ValueError(f"{self.fn} needs a field")
            fld = F.CATALOG.get(self.field)
            if fld is None:
                raise ValueError(f"unknown field {self.field!r}; known: {', '.join(sorted(F.CATALOG))}")
            if fld.kind not in agg.field_kinds:
                kinds = " or ".join({"int": "numeric", "ip": "address"}[k] for k in agg.field_kinds)
                raise ValueError(f"{self.fn} needs a {kinds} field, {self.field!r} is {fld.kind}")
        if agg.check is not None:
            agg.check(self)
        return self

    @property
    def name(self) -> str:
        if self.alias:
            return self.alias
        prefix = A.REGISTRY[self.fn].prefix or self.fn
        return prefix if self.field is None else f"{prefix}_{self.field}"

    @property
    def holistic(self) -> bool:
        return A.REGISTRY[self.fn].holistic

    @property
    def hll_precision(self) -> int | None:
        """HLL precision of an approximate distinct count, None when exact."""
        return (self.precision or sketch.HLL_DEFAULT_P) if self.approx == "hll" else None

    @property
    def quantile_accuracy(self) -> float:
        """The relative accuracy as both levels use it (rounded to parts per 10^9, as the kernel's literal)."""
        return accuracy_ppb(DEFAULT_ACCURACY if self.accuracy is None else self.accuracy) / 1e9

    def output_columns(self) -> list[tuple[str, str]]:
        """(result column, kind) this aggregate writes: quantiles one per q (``<name>_p95``), top its
        weight and rank; a kind's type is :data:`contract.aggregates.RESULT_KINDS`'."""
        outputs = A.REGISTRY[self.fn].outputs
        return outputs(self) if outputs is not None else [(self.name, self.fn)]


SEVERITIES = ("critical", "warning", "info")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,62}")


class AlertSpec(_Strict):
    """An alert rule: fires once per (window, group) whose closed window satisfies ``when``."""

    name: str
    when: str
    severity: Literal["critical", "warning", "info"] = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    summary: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _LABEL.fullmatch(v):
            raise ValueError("an alert name is letters, digits and '_' (starting with a letter or '_')")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _LABEL.fullmatch(k) or k.startswith("__"):
                raise ValueError(f"label name {k!r} is not a Prometheus label name")
            if k in ALERT_LABELS:
                raise ValueError(f"label {k!r} is set by lowwater (reserved: {', '.join(ALERT_LABELS)})")
        return v


# labels every alert carries (Alertmanager groups and deduplicates by labels)
ALERT_LABELS = ("alertname", "severity", "query", "window_start", "window_end")


_GROUP_RE = re.compile(r"^([a-z_]+)(?:/(\d{1,3})(?:/(\d{1,3}))?)?$")


@dataclass(frozen=True)
class KeyPart:
    """One group-by component: a field, optionally reduced to an address prefix."""

    name: str
    field: F.Field
    prefix4: int | None
    prefix6: int | None

    @property
    def words(self) -> int:
        return 2 if self.field.kind == "ip" else 1


def _parse_group(item: Any) -> KeyPart:
    if isinstance(item, dict):
        allowed = {"field", "prefix4", "prefix6", "as"}
        extra = set(item) - allowed
        if extra:
            raise ValueError(f"unknown key(s) {sorted(extra)} in group-by item; allowed {sorted(allowed)}")
        fname = item.get("field")
        p4, p6, alias = item.get("prefix4"), item.get("prefix6"), item.get("as")
    elif isinstance(item, str):
        m = _GROUP_RE.match(item.strip())
        if not m:
            raise ValueError(f"{item!r} is not a field or 'field/prefix'")
        fname = m.group(1)
        p4 = int(m.group(2)) if m.group(2) else None
        p6 = int(m.group(3)) if m.group(3) else (64 if p4 is not None else None)
        alias = None
    else:
        raise ValueError(f"group-by item must be a field name, got {item!r}")
    fld = F.CATALOG.get(fname or "")
    if fld is None:
        raise ValueError(f"unknown field {fname!r}; known: {', '.join(sorted(F.CATALOG))}")
    if fld.kind == "time":
        raise ValueError("group by the window, not by timestamp")
    if p4 is not None or p6 is not None:
        if fld.kind != "ip":
            raise ValueError(f"a prefix applies to an address field, not {fname!r}")
        p4 = 32 if p4 is None else p4
        p6 = 128 if p6 is None else p6
        if not (isinstance(p4, int) and 0 <= p4 <= 32):
            raise ValueError(f"IPv4 prefix length must be 0..32, got {p4}")
        if not (isinstance(p6, int) and 0 <= p6 <= 128):
            raise ValueError(f"IPv6 prefix length must be 0..128, got {p6}")
    name = alias or (fname if p4 is None else f"{fname}_{p4}")
    return KeyPart(str(name), fld, p4, p6)


class QuerySpec(_Strict):
    name: str
    description: str = ""
    # capture hosts that run this query: glob patterns over host ids ("cap-*", "edge-1/*" for every worker
    # of edge-1); the default runs it everywhere
    sources: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    filter: str | None = None
    group_by: list[Any] = Field(default_factory=list)
    aggregates: list[AggregateSpec]
    having: str | None = None
    alerts: list[AlertSpec] = Field(default_factory=list)
    export: ExportSpec | None = None
    window: WindowSpec
    table: TableSpec = TableSpec()
    flush: FlushSpec = FlushSpec()
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    kafka: KafkaSpec = KafkaSpec()
    tiers: tuple[int, ...] = ()  # roll-up widths (ns), ascending (contract/query/tiers.py)
    retention: dict[str, int] = Field(default_factory=dict)  # ns by tier name ("raw", "5m"); none: kept

    @field_validator("tiers", mode="before")
    @classmethod
    def _tier_widths(cls, v: Any) -> Any:
        return tiers.parse_tiers(v)

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: tuple[int, ...], info: Any) -> tuple[int, ...]:
        return tiers.check_tiers(v, info.data.get("window"), info.data.get("aggregates"))

    @field_validator("retention", mode="before")
    @classmethod
    def _retention_in(cls, v: Any) -> Any:
        return tiers.parse_retention(v, RAW_TIER)

    @field_validator("retention")
    @classmethod
    def _retention(cls, v: dict[str, int], info: Any) -> dict[str, int]:
        return tiers.check_retention(v, info.data.get("tiers") or (), RAW_TIER)

    @property
    def tier_names(self) -> list[str]:
        return [duration_name(t) for t in self.tiers]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", v):
            raise ValueError("a query name is lower-case letters, digits and '_' (starting with a letter)")
        return v

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        for pat in v:
            if not re.fullmatch(r"[A-Za-z0-9._:/*?\[\]-]{1,128}", pat):
                raise ValueError(
                    f"source {pat!r}: a host-id glob pattern (letters, digits, . _ : / - and * ? [ ])"
                )
        return v

    def runs_on(self, host: str) -> bool:
        """Whether the capture host ``host`` runs this query (its id matches one of ``sources``)."""
        return any(fnmatch.fnmatchcase(host, pat) for pat in self.sources)

    @field_validator("filter")
    @classmethod
    def _filter(cls, v: str | None) -> str | None:
        try:
            compile_filter(v)
        except FilterError as exc:
            raise ValueError(f"filter syntax error: {exc}") from None
        return v

    @field_validator("group_by")
    @classmethod
    def _group(cls, v: list[Any]) -> list[Any]:
        parts = [_parse_group(item) for item in v]
        names = [p.name for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate group-by names {names}")
        if sum(p.words for p in parts) > 8:
            raise ValueError("group key too wide (at most 8 words: e.g. 4 addresses)")
        return v

    @field_validator("aggregates")
    @classmethod
    def _aggs(cls, v: list[AggregateSpec]) -> list[AggregateSpec]:
        if not v:
            raise ValueError("at least one aggregate is needed")
        names = [n for a in v for n, _ in a.output_columns()]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate aggregate names {names}")
        hol = [a for a in v if a.holistic]
        if len(hol) > 1:
            raise ValueError(
                f"at most one holistic aggregate (count_distinct, quantiles, top) per query, got "
                f"{', '.join(a.name for a in hol)}: split them into queries"
            )
        return v

    @field_validator("having")
    @classmethod
    def _having(cls, v: str | None, info: Any) -> str | None:
        if v is not None:
            _check_condition(v, info.data.get("aggregates"))
        return v

    @field_validator("alerts")
    @classmethod
    def _alerts(cls, v: list[AlertSpec], info: Any) -> list[AlertSpec]:
        names = [a.name for a in v]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate alert names {names}")
        for i, a in enumerate(v):
            try:
                _check_condition(a.when, info.data.get("aggregates"))
            except ValueError as exc:
                raise ValueError(f"alert {a.name!r} (#{i}) when: {exc}") from None
        return v

    @model_validator(mode="after")
    def _export(self) -> QuerySpec:
        names = result_names(self)
        if self.export is not None and self.export.by is not None and self.export.by not in names:
            raise ValueError(
                f"export.by: {self.export.by!r} is not an aggregate of the query ({', '.join(names)})"
            )
        return self

    @model_validator(mode="after")
    def _differential(self) -> QuerySpec:
        if self.window.differential and not differential(self, want=True):
            if not self.window.sliding:
                raise ValueError(
                    "window.differential needs a sliding window (range a multiple > 1 of a pane)"
                )
            bad = [a.fn for a in self.aggregates if a.fn not in A.SUBTRACTABLE]
            raise ValueError(
                f"window.differential: {', '.join(bad)} cannot subtract an expired pane; "
                f"subtractable: {', '.join(A.SUBTRACTABLE)}"
            )
        return self

    @model_validator(mode="after")
    def _group_punctuation(self) -> QuerySpec:
        if self.heartbeat.groups and not self.group_by:
            raise ValueError("heartbeat.groups needs a group_by (group-wise punctuation names a group)")
        if self.heartbeat.groups and self.window.landmark_ns is not None:
            raise ValueError("heartbeat.groups needs a sliding or tumbling window, not a landmark")
        if self.heartbeat.close is not None:
            why = connection_key_refusal(self.key_parts)
            if why is None and holistic(self) is not None:  # the table keys (group, sub-key): a FIN
                why = "needs a query without a holistic aggregate (its table keys each group's sub-keys)"
            if why:
                raise ValueError(f"heartbeat.groups: on: tcp_close {why}")
        return self

    @model_validator(mode="after")
    def _window_strategy(self) -> QuerySpec:
        h = holistic(self)
        why = strategy_refusal(
            self.window.strategy,
            self.window.landmark,
            self.window.differential is True,
            h is not None and h.fn == "top" and h.capacity is not None,
            self.heartbeat.groups,
        )
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _total_window(self) -> QuerySpec:
        if self.window.landmark_ns is not None and window_totals(self):
            raise ValueError(
                "total() needs a sliding or tumbling window: a landmark window's update rows are not a "
                "closed window's groups"
            )
        return self

    @model_validator(mode="after")
    def _alert_labels(self) -> QuerySpec:
        keys = {p.name for p in self.key_parts}
        h = holistic(self)
        if h is not None and h.fn == "top" and h.field in keys:
            raise ValueError(
                f"top's item column {h.field!r} clashes with a group-by column (group by it 'as' another name)"
            )
        if h is not None and h.fn == "top":
            keys.add(h.field or "")
        for a in self.alerts:
            clash = sorted(set(a.labels) & keys)
            if clash:
                raise ValueError(f"alert {a.name!r}: labels {clash} clash with the group-by columns")
        return self

    @property
    def key_parts(self) -> list[KeyPart]:
        return [_parse_group(item) for item in self.group_by]

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"lowwater.{self.name}"


def connection_key_refusal(parts: list[KeyPart]) -> str | None:
    """Why a group key does not name one TCP connection (None when it does): whole addresses and both
    ports, plus only fields that stay the same over a connection."""
    whole = {p.field.name for p in parts if p.prefix4 is None or (p.prefix4, p.prefix6) == (32, 128)}
    missing = [f for f in CONNECTION_FIELDS if f not in whole]
    other = [p.name for p in parts if p.field.name not in (*CONNECTION_FIELDS, *CONNECTION_EXTRA)]
    if missing:
        return f"needs a group_by naming one connection: whole {', '.join(missing)} missing"
    if other:
        return f"needs a group_by naming one connection: {', '.join(other)} may change within one"
    return None


def _check_condition(text: str, aggs: list[AggregateSpec] | None) -> None:
    """A HAVING/alert condition must parse and name only the query's aggregates."""
    if aggs is None:  # the aggregates themselves are invalid: that error is reported instead
        return
    try:
        condlang.parse(text, [n for a in aggs for n, _ in a.output_columns()], _totalled(aggs))
    except condlang.ConditionError as exc:
        raise ValueError(str(exc)) from None


def _totalled(aggs: list[AggregateSpec]) -> list[str]:
    """Result columns that have a window total (their kind's ``total`` in the registry). None in a query
    with a holistic aggregate: its rows are (group, sub-key) pairs, so a sum over rows is no total."""
    if any(a.holistic for a in aggs):
        return []
    return [n for a in aggs for n, fn in a.output_columns() if A.RESULT_KINDS[fn].total]


def condition(q: QuerySpec, text: str) -> condlang.Cond:
    """A validated condition of ``q`` (its HAVING or an alert's ``when``) as an AST."""
    return condlang.parse(text, result_names(q), _totalled(q.aggregates))


def window_totals(q: QuerySpec) -> dict[str, str]:
    """Result column -> its total's function (``sum``/``min``/``max``) for every ``total(x)`` that the
    query's HAVING or alerts read; empty for a query that reads none (its windows are written at close)."""
    texts = [q.having] if q.having else []
    used: set[str] = set()
    for text in [*texts, *(a.when for a in q.alerts)]:
        used |= condlang.totals(condition(q, text))
    kinds = {n: fn for a in q.aggregates for n, fn in a.output_columns()}
    return {n: str(A.RESULT_KINDS[kinds[n]].total) for n in sorted(used)}


def result_names(q: QuerySpec) -> list[str]:
    """The aggregate result columns of ``q`` (what HAVING, alerts and export may name)."""
    return [n for a in q.aggregates for n, _ in a.output_columns()]


# Below this many windows per pane (range / slide) the default re-merges: keeping the running windows
# costs a sort of their +/- events per close, which re-merging k panes beats for small k (measured:
# benchmarks/bench_differential.py, break-even near 8 panes per window).
DIFFERENTIAL_FROM = 8


def differential(q: QuerySpec, want: bool | None = None) -> bool:
    """Whether the high level keeps ``q``'s windows running (adds the new panes, subtracts the expired
    ones) rather than re-merging them: a sliding window and every aggregate subtractable, and either
    asked for (``window.differential: true``) or, by default, at least :data:`DIFFERENTIAL_FROM` windows
    per pane. ``want`` overrides the query's own setting."""
    w = q.window
    want = w.differential if want is None else want
    if want is None and w.strategy != "lazy":
        return False  # eager and adaptive keep window aggregates of their own (contract.query.windows)
    if not w.sliding or not all(a.fn in A.SUBTRACTABLE for a in q.aggregates) or want is False:
        return False
    return want is True or w.panes_per_window // w.panes_per_slide >= DIFFERENTIAL_FROM


def holistic(q: QuerySpec) -> AggregateSpec | None:
    """The query's holistic aggregate (at most one), whose sub-key extends the group key."""
    return next((a for a in q.aggregates if a.holistic), None)


def accuracy_ppb(accuracy: float) -> int:
    """A relative accuracy in parts per 10^9: the integer the kernel's bucket literal carries."""
    return int(round(accuracy * 1e9))
