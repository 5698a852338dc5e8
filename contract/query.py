"""The query model: what a query asks for, loaded from YAML and validated with precise errors.

A query is a windowed group-by aggregate over packets. The low level computes per-pane partial
aggregates (pane = gcd(range, slide), the dissertation's paned WID) and the high level assembles
windows from panes; a query may also keep only the windows that pass a HAVING condition and declare
alert rules over closed windows (:mod:`contract.condlang`). Both levels derive every layout (group-key words, aggregate state columns) from
this one model, so they cannot disagree.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contract import condlang, sketch
from contract import fields as F
from contract.filterlang import FilterError, compile_filter

NS = 1_000_000_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|min|h|d)?\s*$")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": NS, "m": 60 * NS, "min": 60 * NS, "h": 3600 * NS, "d": 86400 * NS}


class ConfigError(ValueError):
    """A config that cannot be used: names the file, the line, the field and the reason."""

    def __init__(self, file: str, line: int | None, field: str, reason: str) -> None:
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")
        self.file, self.line, self.field, self.reason = file, line, field, reason


def parse_duration_ns(value: Any) -> int:
    """'10s', '1m', '500ms', or a number of seconds -> nanoseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '10s', '1m', '500ms'")
    if isinstance(value, int | float):
        ns = int(round(value * NS))
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        ns = int(round(float(m.group(1)) * _UNIT_NS[m.group(2) or "s"]))
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. '10s', '1m', '500ms')")
    return ns


Duration = Annotated[int, Field(description="duration; YAML accepts '10s', '1m', '500ms' or seconds")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WindowSpec(_Strict):
    """Sliding/tumbling (range, slide) or landmark (from origin + n*landmark, updated every ``update``).

    A landmark window (``{landmark: 1d, update: 1m}``: per-day totals) is a tumbling window of the
    landmark's length whose panes are the update interval: every pane the low-water mark passes
    emits ``update`` rows (the totals so far), the landmark's end the ``final`` rows; closed by
    punctuation like every window.
    """

    range_ns: int = Field(alias="range")
    slide_ns: int | None = Field(default=None, alias="slide")
    origin_ns: int = Field(default=0, alias="origin")
    landmark_ns: int | None = Field(default=None, alias="landmark")
    update_ns: int | None = Field(default=None, alias="update")

    @model_validator(mode="before")
    @classmethod
    def _landmark_range(cls, data: Any) -> Any:
        """A landmark window's range and slide are the landmark (given or not)."""
        if isinstance(data, dict) and data.get("landmark") is not None:
            lm = data["landmark"]
            for k in ("range", "slide"):
                if data.get(k) is not None and parse_duration_ns(data[k]) != parse_duration_ns(lm):
                    raise ValueError(f"a landmark window takes 'landmark' and 'update', not {k!r}")
            if data.get("update") is None:
                raise ValueError("a landmark window needs 'update' (how often its totals so far are emitted)")
            data = {**data, "range": lm, "slide": lm}
        elif isinstance(data, dict) and data.get("update") is not None:
            raise ValueError("'update' belongs to a landmark window ({landmark: 1d, update: 1m})")
        return data

    @field_validator("range_ns", "slide_ns", "origin_ns", "landmark_ns", "update_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return None if v is None else parse_duration_ns(v)

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.range_ns <= 0:
            raise ValueError("range must be positive")
        slide = self.slide
        if slide <= 0:
            raise ValueError("slide must be positive")
        if slide > self.range_ns:
            raise ValueError("slide larger than range would leave gaps between windows")
        if self.update_ns is not None:
            if self.update_ns <= 0 or self.range_ns % self.update_ns:
                raise ValueError(f"update ({self.update_ns / NS:g}s) must divide the landmark ({self.range_ns / NS:g}s)")
            if self.range_ns // self.update_ns > 86_400:
                raise ValueError("more than 86400 updates per landmark window; use a larger update")
        elif self.range_ns // self.pane_ns > 1024:
            raise ValueError(
                f"more than 1024 panes per window (pane = gcd(range, slide) = {self.pane_ns / NS:g}s); "
                "use a larger slide or a range that is a multiple of it"
            )
        if self.pane_ns < 1_000_000:
            raise ValueError("pane (gcd of range and slide) below 1 ms is not supported")
        return self

    @property
    def slide(self) -> int:
        return self.slide_ns if self.slide_ns is not None else self.range_ns

    @property
    def pane_ns(self) -> int:
        """The low level's aggregation unit: gcd(range, slide), the slide when range is a multiple of it
        (RANGE 9 / SLIDE 6 -> panes of 3, windows of 3 panes sliding by 2); a landmark's update."""
        return self.update_ns if self.update_ns is not None else math.gcd(self.range_ns, self.slide)

    @property
    def landmark(self) -> bool:
        return self.landmark_ns is not None

    @property
    def panes_per_window(self) -> int:
        return self.range_ns // self.pane_ns

    @property
    def panes_per_slide(self) -> int:
        """Windows start every this many panes (at origin + n*slide); 1 unless range % slide != 0."""
        return self.slide // self.pane_ns

    @property
    def tumbling(self) -> bool:
        return self.range_ns == self.slide


class TableSpec(_Strict):
    size: int = 65536
    probes: int = 4

    @field_validator("size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v < 16 or v & (v - 1):
            raise ValueError(f"table size must be a power of two >= 16, got {v}")
        if v > 1 << 26:
            raise ValueError("table size above 2^26 slots is not supported")
        return v

    @field_validator("probes")
    @classmethod
    def _probes(cls, v: int) -> int:
        if not 1 <= v <= 16:
            raise ValueError("probes must be between 1 and 16")
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


class HeartbeatSpec(_Strict):
    """How a capture host punctuates. ``max_disorder``: how far back a busy host's packet timestamps may
    go (capture out of order, e.g. flow-sorted blocks); its mark stays that far behind its data clock,
    so such packets are not late (cost: windows close that much later). The default is the default
    skew: block-sorted disorder up to it loses nothing (benchmarks/bench_disorder.py). 0 is the
    strict rule (the mark follows the table's oldest pane)."""

    interval_ns: int = Field(default=NS, alias="interval")
    skew_ns: int = Field(default=2 * NS, alias="skew")
    max_disorder_ns: int = Field(default=2 * NS, alias="max_disorder")
    on_demand: bool = True

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

    @field_validator("max_disorder_ns")
    @classmethod
    def _nonneg(cls, v: int) -> int:
        if v < 0:
            raise ValueError("max_disorder must be >= 0")
        return v


class ExportSpec(_Strict):
    """Export the last closed window's top ``top`` groups by aggregate ``by`` as Prometheus series.

    Bounded on purpose: at most ``top`` series per aggregate of the query, replaced at every window.
    """

    top: int = Field(default=10, ge=1, le=1000)
    by: str | None = None  # default: the first aggregate


class KafkaSpec(_Strict):
    topic: str | None = None
    partitions: int = 1

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", v):
            raise ValueError("a Kafka topic uses only letters, digits, '.', '_' and '-'")
        return v

    @field_validator("partitions")
    @classmethod
    def _parts(cls, v: int) -> int:
        if not 1 <= v <= 256:
            raise ValueError("partitions must be between 1 and 256")
        return v


AGGREGATES = ("count", "sum", "min", "max", "avg")
HOLISTIC = ("count_distinct", "quantiles", "top")  # two-stage: a sub-key per (group, value), reduced at close
_PARAMS = {"approx": ("count_distinct",), "precision": ("count_distinct",), "q": ("quantiles",),
           "accuracy": ("quantiles",), "k": ("top",), "by": ("top",), "capacity": ("top",)}


class AggregateSpec(_Strict):
    fn: Literal["count", "sum", "min", "max", "avg", "count_distinct", "quantiles", "top"]
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
        for param, fns in _PARAMS.items():
            if getattr(self, param) is not None and self.fn not in fns:
                raise ValueError(f"{param!r} is a parameter of {' / '.join(fns)}, not of {self.fn}")
        if self.fn == "count":
            if self.field is not None:
                raise ValueError("count takes no field (it counts packets)")
        else:
            if self.field is None:
                raise ValueError(f"{self.fn} needs a field")
            fld = F.CATALOG.get(self.field)
            if fld is None:
                raise ValueError(f"unknown field {self.field!r}; known: {', '.join(sorted(F.CATALOG))}")
            if self.fn in ("count_distinct", "top"):
                if fld.kind not in ("int", "ip"):
                    raise ValueError(f"{self.fn} needs a numeric or address field, {self.field!r} is {fld.kind}")
            elif fld.kind != "int":
                raise ValueError(f"{self.fn} needs a numeric field, {self.field!r} is {fld.kind}")
        if self.precision is not None and self.approx is None:
            raise ValueError("precision applies to approx: hll")
        if self.precision is not None and not sketch.HLL_MIN_P <= self.precision <= sketch.HLL_MAX_P:
            raise ValueError(f"precision must be {sketch.HLL_MIN_P}..{sketch.HLL_MAX_P} (HLL registers 2^p)")
        if self.fn == "quantiles":
            if not self.q:
                raise ValueError("quantiles needs q: a list of quantiles in (0, 1), e.g. [0.5, 0.95, 0.99]")
            bad = [x for x in self.q if not 0 < x < 1]
            if bad:
                raise ValueError(f"quantile {bad[0]} is outside (0, 1)")
            if any(abs(round(x, 4) - x) > 1e-12 for x in self.q):
                raise ValueError("a quantile has at most 4 decimals (0.5, 0.95, 0.999, 0.9999)")
            if len(set(self.q)) != len(self.q):
                raise ValueError("duplicate quantiles")
            if self.accuracy is not None and not 0 <= self.accuracy <= 0.5:
                raise ValueError("accuracy (relative error) must be 0 (exact) .. 0.5")
        if self.fn == "top":
            if self.k is None or self.k < 1:
                raise ValueError("top needs k >= 1 (how many items per group)")
            if self.capacity is not None and not self.k <= self.capacity <= MAX_TOP_CAPACITY:
                raise ValueError(f"top capacity must be an integer k ({self.k}) .. {MAX_TOP_CAPACITY}")
            if self.by is not None:
                b = F.CATALOG.get(self.by)
                if b is None:
                    raise ValueError(f"unknown field {self.by!r} in by; known: {', '.join(sorted(F.CATALOG))}")
                if b.kind != "int":
                    raise ValueError(f"top by needs a numeric field, {self.by!r} is {b.kind}")
        return self

    @property
    def name(self) -> str:
        if self.alias:
            return self.alias
        if self.fn in HOLISTIC:
            return f"{'distinct' if self.fn == 'count_distinct' else self.fn}_{self.field}"
        return self.fn if self.field is None else f"{self.fn}_{self.field}"

    @property
    def holistic(self) -> bool:
        return self.fn in HOLISTIC

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
        weight and rank; kind 'avg'/'quantile' are float64, the rest int64."""
        if self.fn == "quantiles":
            return [(f"{self.name}_{quantile_suffix(x)}", "quantile") for x in self.q or []]
        if self.fn == "top":
            err = [(f"{self.name}_error", "top_error")] if self.capacity is not None else []
            return [(self.name, "top"), (f"{self.name}_rank", "rank"), *err]
        return [(self.name, self.fn)]


DEFAULT_ACCURACY = 0.01
MAX_TOP_CAPACITY = 1_000_000


def quantile_suffix(x: float) -> str:
    """0.5 -> 'p50', 0.95 -> 'p95', 0.999 -> 'p99_9'."""
    return "p" + f"{round(x * 100, 6):g}".replace(".", "_")


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
                raise ValueError(f"source {pat!r}: a host-id glob pattern (letters, digits, . _ : / - and * ? [ ])")
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
            raise ValueError(f"at most one holistic aggregate (count_distinct, quantiles, top) per query, got "
                             f"{', '.join(a.name for a in hol)}: split them into queries")
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
            raise ValueError(f"export.by: {self.export.by!r} is not an aggregate of the query ({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _alert_labels(self) -> QuerySpec:
        keys = {p.name for p in self.key_parts}
        h = holistic(self)
        if h is not None and h.fn == "top" and h.field in keys:
            raise ValueError(f"top's item column {h.field!r} clashes with a group-by column (group by it 'as' another name)")
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


def _check_condition(text: str, aggs: list[AggregateSpec] | None) -> None:
    """A HAVING/alert condition must parse and name only the query's aggregates."""
    if aggs is None:  # the aggregates themselves are invalid: that error is reported instead
        return
    try:
        condlang.parse(text, [n for a in aggs for n, _ in a.output_columns()])
    except condlang.ConditionError as exc:
        raise ValueError(str(exc)) from None


def condition(q: QuerySpec, text: str) -> condlang.Cond:
    """A validated condition of ``q`` (its HAVING or an alert's ``when``) as an AST."""
    return condlang.parse(text, result_names(q))


def result_names(q: QuerySpec) -> list[str]:
    """The aggregate result columns of ``q`` (what HAVING, alerts and export may name)."""
    return [n for a in q.aggregates for n, _ in a.output_columns()]


def holistic(q: QuerySpec) -> AggregateSpec | None:
    """The query's holistic aggregate (at most one), whose sub-key extends the group key."""
    return next((a for a in q.aggregates if a.holistic), None)


# --- layouts derived from the model, shared by both levels
MERGE_SUM, MERGE_MIN, MERGE_MAX = 0, 1, 2
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
    source: int  # packet column, or SRC_ONE / SRC_DSCP


def _source_of(field_name: str) -> int:
    if field_name in F.ENRICH_FIELDS:  # looked up in the networks file (contract.networks)
        return F.ENRICH_FIELDS[field_name]
    return SRC_DSCP if field_name == "dscp" else F.CATALOG[field_name].columns[0]


def state_columns(q: QuerySpec) -> list[StateColumn]:
    """The aggregate state one partial carries: avg travels as (sum, count) so it merges exactly."""
    cols: list[StateColumn] = []
    for a in q.aggregates:
        if a.fn == "count":
            cols.append(StateColumn(a.name, MERGE_SUM, SRC_ONE))
        elif a.fn == "sum":
            cols.append(StateColumn(a.name, MERGE_SUM, _source_of(a.field or "")))
        elif a.fn == "min":
            cols.append(StateColumn(a.name, MERGE_MIN, _source_of(a.field or "")))
        elif a.fn == "max":
            cols.append(StateColumn(a.name, MERGE_MAX, _source_of(a.field or "")))
        elif a.fn == "avg":
            cols.append(StateColumn(f"{a.name}.sum", MERGE_SUM, _source_of(a.field or "")))
            cols.append(StateColumn(f"{a.name}.count", MERGE_SUM, SRC_ONE))
    # a holistic aggregate's state per sub-key comes last (high_level.aggregate.holistic reads it there)
    h = holistic(q)
    if h is not None:
        if h.fn == "count_distinct" and h.hll_precision is not None:
            cols.append(StateColumn(f"{h.name}.rank", MERGE_MAX, hll_rank_source(h.field or "", h.hll_precision)))
        elif h.fn == "top" and h.by is not None:
            cols.append(StateColumn(f"{h.name}.weight", MERGE_SUM, _source_of(h.by)))
        else:  # packets per value / bucket / item
            cols.append(StateColumn(f"{h.name}.n", MERGE_SUM, SRC_ONE))
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
            rows.append([p.field.columns[0], 1, F.to_int64(m4 >> 64), F.to_int64(m4), F.to_int64(m6 >> 64), F.to_int64(m6)])
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


def accuracy_ppb(accuracy: float) -> int:
    return int(round(accuracy * 1e9))


def merge_ops(q: QuerySpec) -> np.ndarray:
    return np.array([c.merge for c in state_columns(q)], dtype=np.int64)


def state_identity(q: QuerySpec) -> np.ndarray:
    """The identity element of each state column (0 for sums, +/-inf-like for min/max)."""
    ident = {MERGE_SUM: 0, MERGE_MIN: np.iinfo(np.int64).max, MERGE_MAX: np.iinfo(np.int64).min}
    return np.array([ident[c.merge] for c in state_columns(q)], dtype=np.int64)


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
    """Merged state columns -> the aggregates the user asked for (avg = sum / count)."""
    out: dict[str, float | int] = {}
    j = 0
    for a in q.aggregates:
        if a.fn == "avg":
            s, c = int(state[j]), int(state[j + 1])
            out[a.name] = s / c if c else float("nan")
            j += 2
        else:
            out[a.name] = int(state[j])
            j += 1
    return out


# --- YAML loading with line numbers
class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key and sequence item."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    result: dict = {}
    lines: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise ConfigError(loader.name, key_node.start_mark.line + 1, str(key), "duplicate key")
        result[key] = loader.construct_object(value_node, deep=True)
        lines[key] = key_node.start_mark.line + 1
    result["__lines__"] = lines
    result["__line__"] = node.start_mark.line + 1
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("__lines__", "__line__")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _line_of(obj: Any, loc: tuple) -> int | None:
    """Walk a pydantic error location through the line-annotated document."""
    line = obj.get("__line__") if isinstance(obj, dict) else None
    for part in loc:
        if isinstance(obj, dict) and part in obj:
            line = obj.get("__lines__", {}).get(part, line)
            obj = obj[part]
        elif isinstance(obj, list) and isinstance(part, int) and part < len(obj):
            obj = obj[part]
            if isinstance(obj, dict):
                line = obj.get("__line__", line)
        else:
            break
    return line


_ALIASES = {"range_ns": "range", "slide_ns": "slide", "origin_ns": "origin", "interval_ns": "interval", "skew_ns": "skew",
            "max_disorder_ns": "max_disorder",
            "landmark_ns": "landmark", "update_ns": "update"}


@dataclass(frozen=True)
class Config:
    path: str
    queries: list[QuerySpec]
    selects: list[SelectSpec] = dc_field(default_factory=list)  # kind: select (contract.query.SelectSpec)
    joins: list[JoinSpec] = dc_field(default_factory=list)  # kind: join
    networks: str | None = None  # the networks file (contract.networks) of the enrichment fields, if any
    source: str | None = None  # the capture source `./lw run` uses without --source (e.g. a generator's options)

    def query(self, name: str) -> QuerySpec:
        for q in self.queries:
            if q.name == name:
                return q
        raise KeyError(name)

    @property
    def stored_queries(self) -> list[QuerySpec]:
        """Every query whose windows go to the results store: the aggregates, then each windowed join's
        aggregate (:func:`join_result_query`), so the store, API and page serve them alike."""
        from contract.joininputs import inputs, rows_query

        ins = inputs(self.selects, self.queries)
        return [*self.queries, *(join_result_query(j, ins[j.left], ins[j.right]) if j.aggregates else
                                 rows_query(j, ins[j.left], ins[j.right]) for j in self.joins)]

    def select(self, name: str) -> SelectSpec:
        for s in self.selects:
            if s.name == name:
                return s
        raise KeyError(name)


def load_text(text: str, path: str = "<string>") -> Config:
    """Parse and validate a config document; any problem raises ConfigError(file, line, field, reason)."""
    try:
        loader = _LineLoader(text)
        loader.name = path
        try:
            doc = loader.get_single_data()
        finally:
            loader.dispose()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(path, mark.line + 1 if mark else None, "", f"YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, "", f"YAML error: {exc}") from None
    if not isinstance(doc, dict) or "queries" not in doc:
        raise ConfigError(path, 1, "queries", "the document must be a mapping with a 'queries' list")
    extra = set(_strip(doc)) - {"queries", "networks", "source"}
    if extra:
        key = sorted(extra)[0]
        raise ConfigError(path, doc["__lines__"].get(key), key, "unknown top-level key")
    items = doc["queries"]
    if not isinstance(items, list) or not items:
        raise ConfigError(path, doc["__lines__"]["queries"], "queries", "must be a non-empty list of queries")
    queries: list[QuerySpec] = []
    seen: dict[str, int] = {}
    other: list[dict] = []  # kind: select / join, validated after the aggregates
    agg_items: list[dict] = []  # the aggregate queries' items (for their lines)
    for idx, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(path, doc["__lines__"]["queries"], f"queries[{idx}]", "each query must be a mapping")
        if item.get("kind") in ("select", "join"):
            other.append(item)
            continue
        if "kind" in item:
            if item["kind"] != "aggregate":
                raise ConfigError(path, item["__lines__"]["kind"], f"query {item.get('name', f'#{idx}')!r}: kind",
                                  f"unknown kind {item['kind']!r} (aggregate, select or join)")
            item = {k: v for k, v in item.items() if k != "kind"}
        try:
            q = QuerySpec.model_validate(_strip(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(_ALIASES.get(p, p) if isinstance(p, str) else p for p in err["loc"])
            line = _line_of(item, loc)
            name = item.get("name", f"#{idx}")
            field = ".".join(str(p) for p in loc) or "query"
            reason = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                reason = "unknown field"
            elif err["type"] == "missing":
                reason = "required field is missing"
            raise ConfigError(path, line, f"query {name!r}: {field}", reason) from None
        if q.name in seen:
            raise ConfigError(path, item["__lines__"].get("name"), f"query {q.name!r}: name",
                              f"duplicate query name (first defined on line {seen[q.name]})")
        seen[q.name] = item["__lines__"].get("name", 0)
        queries.append(q)
        agg_items.append(item)
    networks = _networks_path(doc, path)
    source = _run_source(doc, path)
    if networks is None:
        for item, q in zip(agg_items, queries, strict=True):
            if uses_enrichment(q):
                raise ConfigError(path, item["__line__"], f"query {q.name!r}",
                                  "src_net/dst_net/src_asn/dst_asn need a top-level 'networks:' file")
    if not other:
        return Config(path, queries, networks=networks, source=source)
    selects, joins = load_selects_joins(other, path, seen, queries)
    return Config(path, queries, selects, joins, networks, source)


_SOURCE_KINDS = ("generator", "pcap", "afpacket", "flows")


def _run_source(doc: dict, path: str) -> str | None:
    """The top-level ``source:``: the agent source `./lw run` uses when not given --source, so a config
    whose queries need particular traffic (configs/handshake.yaml: SYNs answered) runs with it. Its
    options are checked by the agent (low_level.host.agent.parse_source); here only its kind."""
    value = doc.get("source")
    if value is None:
        return None
    if not isinstance(value, str) or value.partition(":")[0] not in _SOURCE_KINDS:
        raise ConfigError(path, doc["__lines__"].get("source"), "source",
                          f"must be a source string starting with one of {', '.join(_SOURCE_KINDS)} "
                          f"(as lowwater-agent --source takes it), not {value!r}")
    return value


def uses_enrichment(q: QuerySpec) -> bool:
    """Whether the query groups or filters by a networks-file field (contract.networks)."""
    from contract.filterlang import OP_LOAD_NET

    return any(p.field.kind == "enrich" for p in q.key_parts) or bool((compile_filter(q.filter)[:, 0] == OP_LOAD_NET).any())


def _networks_path(doc: dict, path: str) -> str | None:
    """The top-level ``networks:`` file, relative to the config file's directory."""
    value = doc.get("networks")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, doc["__lines__"].get("networks"), "networks", "must be the path of a networks file")
    return str(Path(path).parent / value) if not Path(value).is_absolute() and path != "<string>" else value


def load(path: str | Path) -> Config:
    """Load a YAML config file (see ``configs/``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), None, "", f"cannot read: {exc.strerror}") from None
    return load_text(text, str(p))


# --- selection and join queries (``kind: select`` / ``kind: join``; a query without ``kind`` is an aggregate)
_SIDE_FIELD = re.compile(r"^(left|right)\.([a-z_]+)$")


def _projectable(name: str) -> F.Field:
    fld = F.CATALOG.get(name)
    if fld is None:
        raise ValueError(f"unknown field {name!r}; known: {', '.join(sorted(F.CATALOG))}")
    if fld.kind == "time":
        raise ValueError("timestamp is always selected (it is the row's first column); do not list it")
    if name == "dscp":
        raise ValueError("select tos and shift it (dscp is not a packet column of its own)")
    return fld


class SelectSpec(_Strict):
    """A selection: the timestamp and ``fields`` of every packet that passes ``filter``, no grouping.

    Rows go to Kafka partitioned by ``partition_by`` (fields of the row, in the declared order: two
    selects that declare the same words in the same order land equal keys in the same partition, which is
    how a SYN and its SYN-ACK meet: one side declares ``[src_ip, src_port, dst_ip, dst_port]``, the
    other ``[dst_ip, dst_port, src_ip, src_port]``). ``retain`` bounds how far back a join may hold this
    input's rows: a join's band must not exceed it.
    """

    kind: Literal["select"]
    name: str
    description: str = ""
    sources: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    filter: str | None = None
    fields: list[str] = Field(min_length=1)
    partition_by: list[str] = Field(default_factory=list)
    retain_ns: int = Field(default=60 * NS, alias="retain")
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    kafka: KafkaSpec = KafkaSpec()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return QuerySpec._name(v)

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        return QuerySpec._sources(v)

    @field_validator("filter")
    @classmethod
    def _filter(cls, v: str | None) -> str | None:
        return QuerySpec._filter(v)

    def runs_on(self, host: str) -> bool:
        """Whether the capture host ``host`` runs this selection (its id matches one of ``sources``)."""
        return any(fnmatch.fnmatchcase(host, pat) for pat in self.sources)

    @field_validator("retain_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: list[str]) -> list[str]:
        for name in v:
            _projectable(name)
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate fields {v}")
        if sum(2 if F.CATALOG[n].kind == "ip" else 1 for n in v) > 32:
            raise ValueError("a selected row holds at most 32 words (an address takes 2)")
        return v

    @model_validator(mode="after")
    def _partition(self) -> SelectSpec:
        missing = [f for f in self.partition_by if f not in self.fields]
        if missing:
            raise ValueError(f"partition_by: {missing} not among the selected fields {self.fields}")
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError(f"partition_by: duplicate fields {self.partition_by}")
        if self.retain_ns <= 0:
            raise ValueError("retain must be positive")
        return self

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"lowwater.{self.name}"

    @property
    def columns(self) -> list[tuple[str, int]]:
        """The row's words after the timestamp: (name, parsed-packet column); an address is ``name.hi``/``name.lo``."""
        out: list[tuple[str, int]] = []
        for n in self.fields:
            fld = F.CATALOG[n]
            if fld.kind == "ip":
                out += [(f"{n}.hi", fld.columns[0]), (f"{n}.lo", fld.columns[1])]
            else:
                out.append((n, fld.columns[0]))
        return out

    @property
    def width(self) -> int:
        """Words per row after the timestamp."""
        return len(self.columns)

    def word_index(self, name: str) -> list[int]:
        """Row-word indices (0 = first word after the timestamp) of a selected field."""
        return [i for i, (c, _) in enumerate(self.columns) if c == name or c.startswith(name + ".")]

    @property
    def partition_words(self) -> list[int]:
        """Row-word indices hashed for the Kafka partition, in ``partition_by`` order."""
        return [i for n in self.partition_by for i in self.word_index(n)]


class JoinOn(_Strict):
    left: list[str] = Field(min_length=1)
    right: list[str] = Field(min_length=1)


class JoinAggregate(_Strict):
    """An aggregate over the join output: ``expr`` is ``left.f``, ``right.f`` or a sum/difference of them."""

    fn: Literal["count", "sum", "min", "max", "avg"]
    expr: str | None = None
    alias: str = Field(alias="as")

    @model_validator(mode="after")
    def _check(self) -> JoinAggregate:
        if self.fn == "count" and self.expr is not None:
            raise ValueError("count takes no expr (it counts joined rows)")
        if self.fn != "count" and self.expr is None:
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

    Rows match when the ``on`` words are equal and ``0 <= right.timestamp - left.timestamp <= within``;
    ``type``: ``inner`` (matching pairs), ``left`` (pairs, and left rows without a match), ``anti``
    (only left rows without a match). With ``aggregates`` the output is aggregated per window and
    ``group_by`` (``left.f`` / ``right.f``), windows on the left row's timestamp; without, the joined
    rows themselves are stored (:mod:`contract.joininputs`). An input may be an aggregate query's closed
    windows; ``within: window`` joins two of them on the same window.
    """

    kind: Literal["join"]
    name: str
    description: str = ""
    left: str
    right: str
    on: JoinOn
    within_ns: int = Field(alias="within")
    same_window: bool = False  # ``within: window``: two aggregate inputs joined on the same window (band 0)
    type: Literal["inner", "left", "anti"] = "inner"
    group_by: list[str] = Field(default_factory=list)
    aggregates: list[JoinAggregate] = Field(default_factory=list)
    window: WindowSpec | None = None

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
        if self.within_ns < 0:
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
        if self.type != "inner":
            for item in [*self.group_by, *(a.expr or "" for a in self.aggregates)]:
                if "right." in item:
                    raise ValueError(f"a {self.type} join's aggregates see left rows without a match too: "
                                     f"{item!r} reads the right side (aggregate it with an inner join)")
        return self


def check_join(j: JoinSpec, selects: dict[str, Any]) -> tuple[str, str] | None:
    """Cross-query checks of a join against its inputs (selects, or aggregates' closed windows as
    :class:`contract.joininputs.ClosedInput`): (field, reason) of the first problem, or None."""
    from contract.joininputs import ClosedInput, field_type, unsupported

    for side in ("left", "right"):
        if getattr(j, side) not in selects:
            return side, (f"unknown query {getattr(j, side)!r} (a join reads select or aggregate queries: "
                          f"{sorted(selects) or 'none'})")
        inp = selects[getattr(j, side)]
        if isinstance(inp, ClosedInput) and (why := unsupported(inp.query)):
            return side, why
    sl, sr = selects[j.left], selects[j.right]
    closed = [isinstance(s, ClosedInput) for s in (sl, sr)]
    if j.same_window and not all(closed):
        return "within", "'within: window' joins two aggregate queries' closed windows; give a select a time band"
    if all(closed) and sl.window != sr.window:
        return "right", (f"aggregate queries {sl.name!r} and {sr.name!r} have different windows "
                         f"({_window_text(sl.window)} vs {_window_text(sr.window)}): a join of closed windows "
                         "compares window starts, give both the same window")
    for lk, rk in zip(j.on.left, j.on.right, strict=True):
        for side, s, k in (("left", sl, lk), ("right", sr, rk)):
            if k != "timestamp" and k not in s.fields:
                kind = "aggregate query" if isinstance(s, ClosedInput) else "select"
                return "on", _avg_reason(s, k) or f"{side} key {k!r} is not a field of {kind} {s.name!r} ({s.fields})"
        tl, tr = field_type(sl, lk), field_type(sr, rk)
        if tl != tr:
            return "on", f"keys {lk!r} and {rk!r} differ in type or width ({_type_text(tl)} vs {_type_text(tr)})"
    for s in (sl, sr):
        if j.within_ns > s.retain_ns:
            return "within", (f"band {j.within_ns / NS:g}s is larger than what input {s.name!r} can hold "
                              f"(retain {s.retain_ns / NS:g}s)")
    if sl.kafka.partitions != sr.kafka.partitions:
        return "right", (f"inputs have {sl.kafka.partitions} and {sr.kafka.partitions} Kafka partitions: "
                         "equal keys must meet in the same partition")
    if sl.kafka.partitions > 1:
        pl, pr = sl.partition_by, sr.partition_by
        pairs = dict(zip(j.on.left, j.on.right, strict=True))
        if not pl or len(pl) != len(pr) or any(pairs.get(a) != b for a, b in zip(pl, pr, strict=True)):
            return "on", (f"the inputs' partition_by ({pl} / {pr}) must be join keys in the same order on both "
                          "sides, so that matching rows land in the same partition")
    for item in [*j.group_by, *(t for a in j.aggregates if a.expr for t in
                                (f"{s}.{f}" for _, s, f in parse_join_expr(a.expr)))]:
        side, fname = item.split(".")
        s = sl if side == "left" else sr
        if fname != "timestamp" and fname not in s.fields:
            return "group_by", _avg_reason(s, fname) or f"{item!r}: {fname!r} is not a field of {s.name!r} ({s.fields})"
        if fname != "timestamp" and field_type(s, fname)[0] == "ip" and item not in j.group_by:
            return "aggregates", f"{item!r}: an address cannot be summed"
    return None


def _avg_reason(inp: Any, name: str) -> str | None:
    """Why an avg of an aggregate query is no join field: an average is a ratio with no exact integer
    word to compare (``on``) or add up (a join's aggregates); its sum and count are."""
    from contract.joininputs import ClosedInput

    if not isinstance(inp, ClosedInput):
        return None
    for a in inp.query.aggregates:
        if a.name == name and a.fn == "avg":
            return (f"{name!r} is an avg of aggregate query {inp.name!r}: an average (sum / count) has no exact "
                    f"value to compare or add up in a join; give {inp.name!r} a sum and a count of "
                    f"{a.field!r} and join on those (or compute their ratio from the join's rows)")
    return None


def _window_text(w: WindowSpec) -> str:
    return f"range {w.range_ns / NS:g}s, slide {w.slide / NS:g}s, origin {w.origin_ns / NS:g}s"


def _type_text(t: tuple) -> str:
    kind, words, prefix = t
    return f"{kind}{'' if prefix is None else f' /{prefix[0]}/{prefix[1]}'}, {words} word{'s' if words > 1 else ''}"


def load_selects_joins(text_doc: list, path: str, aggregate_names: dict[str, int],
                       aggregates: list[QuerySpec] = ()) -> tuple[list, list]:  # fmt: skip
    """Validate the ``kind: select`` / ``kind: join`` items of a config (already line-annotated)."""
    selects: list[SelectSpec] = []
    joins: list[tuple[JoinSpec, dict]] = []
    seen = dict(aggregate_names)
    for idx, item in enumerate(text_doc):
        kind = item.get("kind")
        if True in item:  # YAML 1.1 reads the key `on` as the boolean true
            item = {("on" if k is True else k): v for k, v in item.items()}
            item["__lines__"] = {("on" if k is True else k): v for k, v in item["__lines__"].items()}
        cls = SelectSpec if kind == "select" else JoinSpec
        try:
            spec = cls.model_validate(_strip(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(_ALIASES.get(p, p) if isinstance(p, str) else p for p in err["loc"])
            loc = tuple({"retain_ns": "retain", "within_ns": "within"}.get(p, p) if isinstance(p, str) else p
                        for p in loc)
            reason = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                reason = "unknown field"
            elif err["type"] == "missing":
                reason = "required field is missing" + (" (the time band, e.g. 'within: 3s')" if loc == ("within",)
                                                        else "")
            field = ".".join(str(p) for p in loc) or "query"
            raise ConfigError(path, _line_of(item, loc), f"query {item.get('name', f'#{idx}')!r}: {field}",
                              reason) from None
        if spec.name in seen:
            raise ConfigError(path, item["__lines__"].get("name"), f"query {spec.name!r}: name",
                              f"duplicate query name (first defined on line {seen[spec.name]})")
        seen[spec.name] = item["__lines__"].get("name", 0)
        if isinstance(spec, SelectSpec):
            selects.append(spec)
        else:
            joins.append((spec, item))
    from contract.joininputs import inputs

    by_name = inputs(selects, list(aggregates))
    for j, item in joins:
        problem = check_join(j, by_name)
        if problem is not None:
            field, reason = problem
            raise ConfigError(path, item["__lines__"].get(field, item["__line__"]), f"query {j.name!r}: {field}",
                              reason)
    return selects, [j for j, _ in joins]


def join_result_query(j: JoinSpec, left: SelectSpec, right: SelectSpec) -> QuerySpec:
    """The result shape of a windowed join as an aggregate query: its group-by columns (``left.dst_port``
    -> ``dst_port``) and aggregates (avg as sum + count), so the store's schema, the roll-up layout and the
    API derive from it unchanged. Built without validation (an aggregate's ``field`` stands for the join
    expression: its state column is the expression's value), never sent to a capture host."""
    assert j.window is not None
    aggs = [AggregateSpec.model_construct(fn=a.fn, field=None if a.fn == "count" else "length", alias=a.alias)
            for a in j.aggregates]
    return QuerySpec.model_construct(
        name=j.name, description=j.description or f"{j.type} join of {left.name} and {right.name}",
        sources=["*"], filter=None, group_by=[g.split(".")[1] for g in j.group_by], aggregates=aggs, having=None,
        alerts=[], export=None, window=j.window, table=TableSpec(), flush=FlushSpec(), heartbeat=HeartbeatSpec(),
        kafka=KafkaSpec(topic=f"lowwater.join.{j.name}", partitions=1))
