"""Loading a config file: YAML with line numbers, every problem reported as file, line, field and reason."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contract.filterlang import OP_LOAD_NET, compile_filter
from contract.query.distincts import DistinctSpec, check_distinct, distinct_query
from contract.query.joins import JoinSpec, check_join, inputs, join_result_query, rows_query
from contract.query.model import ConfigError, QuerySpec
from contract.query.rows import WINDOW_TAGS, RowQuerySpec
from contract.query.selects import SelectSpec


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


_ALIASES = {
    "range_ns": "range",
    "slide_ns": "slide",
    "origin_ns": "origin",
    "interval_ns": "interval",
    "skew_ns": "skew",
    "max_disorder_ns": "max_disorder",
    "landmark_ns": "landmark",
    "update_ns": "update",
}


@dataclass(frozen=True)
class Config:
    path: str
    queries: list[QuerySpec]
    selects: list[SelectSpec] = dc_field(default_factory=list)  # kind: select (contract.query.SelectSpec)
    joins: list[JoinSpec] = dc_field(default_factory=list)  # kind: join
    networks: str | None = None  # the networks file (contract.networks) of the enrichment fields, if any
    source: str | None = (
        None  # the capture source `./lw run` uses without --source (e.g. a generator's options)
    )
    distincts: list[DistinctSpec] = dc_field(default_factory=list)  # kind: distinct
    rows: list[RowQuerySpec] = dc_field(default_factory=list)  # kind: rows (row windows)

    def query(self, name: str) -> QuerySpec:
        for q in self.queries:
            if q.name == name:
                return q
        raise KeyError(name)

    @property
    def stored_queries(self) -> list[QuerySpec]:
        """Every query whose windows go to the results store: the aggregates, then each windowed join's
        aggregate (:func:`join_result_query`), so the store, API and page serve them alike."""
        ins = inputs(self.selects, self.queries)
        return [
            *self.queries,
            *(
                join_result_query(j, ins[j.left], ins[j.right])
                if j.aggregates
                else rows_query(j, ins[j.left], ins[j.right])
                for j in self.joins
            ),
            *(distinct_query(d, self.select(d.input)) for d in self.distincts),
        ]

    def select(self, name: str) -> SelectSpec:
        for s in self.selects:
            if s.name == name:
                return s
        raise KeyError(name)


def _first(seen: dict[str, int], name: str, item: dict, path: str) -> None:
    """Record where query ``name`` is defined (``seen``: name -> line); a second definition is an error."""
    if name in seen:
        raise ConfigError(
            path,
            item["__lines__"].get("name"),
            f"query {name!r}: name",
            f"duplicate query name (first defined on line {seen[name]})",
        )
    seen[name] = item["__lines__"].get("name", 0)


def yaml_with_lines(text: str, path: str) -> Any:
    """A YAML document whose mappings carry ``__lines__`` (key -> line) and ``__line__``, so that every
    file lowwater reads (configs, the interfaces file) reports problems by line; ConfigError otherwise."""
    try:
        loader = _LineLoader(text)
        loader.name = path
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(
            path, mark.line + 1 if mark else None, "", f"YAML syntax error: {exc.problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, "", f"YAML error: {exc}") from None


def load_text(text: str, path: str = "<string>") -> Config:
    """Parse and validate a config document; any problem raises ConfigError(file, line, field, reason)."""
    doc = yaml_with_lines(text, path)
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
            raise ConfigError(
                path, doc["__lines__"]["queries"], f"queries[{idx}]", "each query must be a mapping"
            )
        if item.get("kind") in ("select", "join", "distinct", "rows"):
            other.append(item)
            continue
        if "kind" in item:
            if item["kind"] != "aggregate":
                raise ConfigError(
                    path,
                    item["__lines__"]["kind"],
                    f"query {item.get('name', f'#{idx}')!r}: kind",
                    f"unknown kind {item['kind']!r} (aggregate, select, join, distinct or rows)",
                )
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
        _first(seen, q.name, item, path)
        queries.append(q)
        agg_items.append(item)
    networks = _networks_path(doc, path)
    source = _run_source(doc, path)
    if networks is None:
        for item, q in zip(agg_items, queries, strict=True):
            if uses_enrichment(q):
                raise ConfigError(
                    path,
                    item["__line__"],
                    f"query {q.name!r}",
                    "src_net/dst_net/src_asn/dst_asn need a top-level 'networks:' file",
                )
    if not other:
        return Config(path, queries, networks=networks, source=source)
    rows = load_row_items([it for it in other if it.get("kind") == "rows"], path, seen)
    distincts = [it for it in other if it.get("kind") == "distinct"]
    other = [it for it in other if it.get("kind") not in ("distinct", "rows")]
    selects, joins = load_selects_joins(other, path, seen, queries)
    return Config(
        path,
        queries,
        selects,
        joins,
        networks,
        source,
        load_distincts(distincts, path, seen, selects),
        rows,
    )


_SOURCE_KINDS = ("generator", "pcap", "afpacket", "flows")


def _run_source(doc: dict, path: str) -> str | None:
    """The top-level ``source:``: the agent source `./lw run` uses when not given --source, so a config
    whose queries need particular traffic (configs/handshake.yaml: SYNs answered) runs with it. Its
    options are checked by the agent (low_level.host.agent.parse_source); here only its kind."""
    value = doc.get("source")
    if value is None:
        return None
    if not isinstance(value, str) or value.partition(":")[0] not in _SOURCE_KINDS:
        raise ConfigError(
            path,
            doc["__lines__"].get("source"),
            "source",
            f"must be a source string starting with one of {', '.join(_SOURCE_KINDS)} "
            f"(as lowwater-agent --source takes it), not {value!r}",
        )
    return value


def uses_enrichment(q: QuerySpec) -> bool:
    """Whether the query groups or filters by a networks-file field (contract.networks)."""
    return any(p.field.kind == "enrich" for p in q.key_parts) or bool(
        (compile_filter(q.filter)[:, 0] == OP_LOAD_NET).any()
    )


def _networks_path(doc: dict, path: str) -> str | None:
    """The top-level ``networks:`` file, relative to the config file's directory."""
    value = doc.get("networks")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            path, doc["__lines__"].get("networks"), "networks", "must be the path of a networks file"
        )
    return str(Path(path).parent / value) if not Path(value).is_absolute() and path != "<string>" else value


def read_text(path: str | Path, field: str = "") -> str:
    """A config file's text (the query config, the networks or interfaces file): one place says that a
    missing or unreadable file is a ConfigError naming the file, with no line."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(str(Path(path)), None, field, f"cannot read: {reason}") from None


def load(path: str | Path) -> Config:
    """Load a YAML config file (see ``configs/``)."""
    return load_text(read_text(path), str(Path(path)))


def load_distincts(items: list[dict], path: str, seen: dict[str, int], selects: list[SelectSpec]) -> list:
    """Validate the ``kind: distinct`` items (after the selects they read)."""
    out: list[DistinctSpec] = []
    by_name = {s.name: s for s in selects}
    for idx, item in enumerate(items):
        try:
            spec = DistinctSpec.model_validate(_strip(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(
                {"within_ns": "within"}.get(_ALIASES.get(p, p), _ALIASES.get(p, p))
                if isinstance(p, str)
                else p
                for p in err["loc"]
            )
            reason = err["msg"].removeprefix("Value error, ")
            reason = {"extra_forbidden": "unknown field", "missing": "required field is missing"}.get(
                err["type"], reason
            )
            field = ".".join(str(p) for p in loc) or "query"
            raise ConfigError(
                path, _line_of(item, loc), f"query {item.get('name', f'#{idx}')!r}: {field}", reason
            ) from None
        _first(seen, spec.name, item, path)
        problem = check_distinct(spec, by_name)
        if problem is not None:
            field, reason = problem
            raise ConfigError(
                path, item["__lines__"].get(field, item["__line__"]), f"query {spec.name!r}: {field}", reason
            )
        out.append(spec)
    return out


def _named(item: dict, loc: tuple, reason: str) -> tuple[tuple, str]:
    """A model-level reason that starts with its field (``slide: ...``) points at that field's line."""
    head, _, rest = reason.partition(": ")
    node: Any = item
    path = (*loc, *head.split("."))
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return loc, reason
        node = node[p]
    return path, rest


def load_row_items(items: list[dict], path: str, seen: dict[str, int]) -> list:
    """Validate the ``kind: rows`` items (row windows and slide-by-tuple windows alike)."""
    out: list[RowQuerySpec] = []
    for idx, item in enumerate(items):
        try:
            spec = RowQuerySpec.model_validate(_strip(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = tuple(_ALIASES.get(p, p) if isinstance(p, str) else p for p in err["loc"])
            loc = tuple(p for p in loc if p not in WINDOW_TAGS)
            reason = err["msg"].removeprefix("Value error, ")
            reason = {"extra_forbidden": "unknown field", "missing": "required field is missing"}.get(
                err["type"], reason
            )
            loc, reason = _named(item, loc, reason)
            field = ".".join(str(p) for p in loc) or "query"
            raise ConfigError(
                path, _line_of(item, loc), f"query {item.get('name', f'#{idx}')!r}: {field}", reason
            ) from None
        _first(seen, spec.name, item, path)
        out.append(spec)
    return out


def load_rows(text: str, path: str = "<string>") -> list[RowQuerySpec]:
    """The ``kind: rows`` queries of a config document, row windows and slide-by-tuple alike (the
    processor-level tests and benchmarks); a problem raises ConfigError(file, line, field, reason)."""
    doc = yaml_with_lines(text, path)
    items = doc.get("queries") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ConfigError(path, None, "queries", "must be a list of queries")
    return load_row_items([it for it in items if isinstance(it, dict) and it.get("kind") == "rows"], path, {})


def load_selects_joins(
    text_doc: list, path: str, aggregate_names: dict[str, int], aggregates: list[QuerySpec] = ()
) -> tuple[list, list]:
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
            loc = tuple(
                {"retain_ns": "retain", "within_ns": "within"}.get(p, p) if isinstance(p, str) else p
                for p in loc
            )
            reason = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                reason = "unknown field"
            elif err["type"] == "missing":
                reason = "required field is missing" + (
                    " (the time band, e.g. 'within: 3s')" if loc == ("within",) else ""
                )
            field = ".".join(str(p) for p in loc) or "query"
            raise ConfigError(
                path, _line_of(item, loc), f"query {item.get('name', f'#{idx}')!r}: {field}", reason
            ) from None
        _first(seen, spec.name, item, path)
        if isinstance(spec, SelectSpec):
            selects.append(spec)
        else:
            joins.append((spec, item))
    by_name = inputs(selects, list(aggregates))
    for j, item in joins:
        problem = check_join(j, by_name)
        if problem is not None:
            field, reason = problem
            raise ConfigError(
                path, item["__lines__"].get(field, item["__line__"]), f"query {j.name!r}: {field}", reason
            )
    return selects, [j for j, _ in joins]
