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
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contract import condlang
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
    interval_ns: int = Field(default=NS, alias="interval")
    skew_ns: int = Field(default=2 * NS, alias="skew")
    on_demand: bool = True

    @field_validator("interval_ns", "skew_ns", mode="before")
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


class AggregateSpec(_Strict):
    fn: Literal["count", "sum", "min", "max", "avg"]
    field: str | None = None
    alias: str | None = Field(default=None, alias="as")

    @model_validator(mode="after")
    def _check(self) -> AggregateSpec:
        if self.fn == "count":
            if self.field is not None:
                raise ValueError("count takes no field (it counts packets)")
        else:
            if self.field is None:
                raise ValueError(f"{self.fn} needs a field")
            fld = F.CATALOG.get(self.field)
            if fld is None:
                raise ValueError(f"unknown field {self.field!r}; known: {', '.join(sorted(F.CATALOG))}")
            if fld.kind != "int":
                raise ValueError(f"{self.fn} needs a numeric field, {self.field!r} is {fld.kind}")
        return self

    @property
    def name(self) -> str:
        return self.alias or (self.fn if self.field is None else f"{self.fn}_{self.field}")


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
        names = [a.name for a in v]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate aggregate names {names}")
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
        names = [a.name for a in self.aggregates]
        if self.export is not None and self.export.by is not None and self.export.by not in names:
            raise ValueError(f"export.by: {self.export.by!r} is not an aggregate of the query ({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _alert_labels(self) -> QuerySpec:
        keys = {p.name for p in self.key_parts}
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
        condlang.parse(text, [a.name for a in aggs])
    except condlang.ConditionError as exc:
        raise ValueError(str(exc)) from None


def condition(q: QuerySpec, text: str) -> condlang.Cond:
    """A validated condition of ``q`` (its HAVING or an alert's ``when``) as an AST."""
    return condlang.parse(text, [a.name for a in q.aggregates])


# --- layouts derived from the model, shared by both levels
MERGE_SUM, MERGE_MIN, MERGE_MAX = 0, 1, 2
SRC_ONE = -1  # count: add 1 per packet
SRC_DSCP = -2  # tos >> 2


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
        else:  # avg
            cols.append(StateColumn(f"{a.name}.sum", MERGE_SUM, _source_of(a.field or "")))
            cols.append(StateColumn(f"{a.name}.count", MERGE_SUM, SRC_ONE))
    return cols


def key_width(q: QuerySpec) -> int:
    """Group-key words per partial (at least 1: a query without group-by has one constant word)."""
    return max(1, sum(p.words for p in q.key_parts))


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
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


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
            "landmark_ns": "landmark", "update_ns": "update"}


@dataclass(frozen=True)
class Config:
    path: str
    queries: list[QuerySpec]
    networks: str | None = None  # the networks file (contract.networks) of the enrichment fields, if any

    def query(self, name: str) -> QuerySpec:
        for q in self.queries:
            if q.name == name:
                return q
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
    extra = set(_strip(doc)) - {"queries", "networks"}
    if extra:
        key = sorted(extra)[0]
        raise ConfigError(path, doc["__lines__"].get(key), key, "unknown top-level key")
    items = doc["queries"]
    if not isinstance(items, list) or not items:
        raise ConfigError(path, doc["__lines__"]["queries"], "queries", "must be a non-empty list of queries")
    queries: list[QuerySpec] = []
    seen: dict[str, int] = {}
    for idx, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(path, doc["__lines__"]["queries"], f"queries[{idx}]", "each query must be a mapping")
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
    networks = _networks_path(doc, path)
    if networks is None:
        for item, q in zip(items, queries, strict=True):
            if uses_enrichment(q):
                raise ConfigError(path, item["__line__"], f"query {q.name!r}",
                                  "src_net/dst_net/src_asn/dst_asn need a top-level 'networks:' file")
    return Config(path, queries, networks)


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
