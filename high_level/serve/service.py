"""What every route of the API shares, built once per app: the config's queries, the readers of the
result store, the live hub and the metrics, and how a route answers (JSON or CSV, paging).

Its own module so that the routes (:mod:`high_level.serve.routes`) are small functions of one resource
each, and :func:`high_level.serve.api.create_app` only assembles them (auth, errors, lifespan).
"""

from __future__ import annotations

import csv
import io
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response

from contract import results as R
from contract.query import Config
from high_level.live.hub import LiveHub
from high_level.serve.alerts import AlertReader
from high_level.serve.columns import QueryInfo
from high_level.serve.ifnames import IfNames, IfNamesCollector
from high_level.serve.incomplete import IncompleteReader
from high_level.serve.metrics import ApiMetrics
from high_level.serve.netnames import NetNames
from high_level.serve.params import ParamError
from high_level.serve.ranges import RangeReader
from high_level.serve.reader import Reader, ResultSet
from high_level.serve.rowreader import RowInfo, RowReader
from high_level.serve.tierpick import TierOption
from high_level.serve.timefmt import iso_of_us


def yaml_fragments(path: str | Path) -> dict[str, Any]:
    """The original YAML mapping of each query (what the operator wrote), by name."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        return {q["name"]: q for q in doc.get("queries", []) if isinstance(q, dict) and "name" in q}
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return {}


def _converters(rs: ResultSet) -> list[Callable[[Any], Any]]:
    cache: dict[int, str] = {}

    def ts(v: Any) -> Any:
        if v is None:
            return None
        s = cache.get(v)
        if s is None:
            s = cache[v] = iso_of_us(int(v))
        return s

    def num(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return [ts if c in rs.time_columns else num for c in rs.columns]


def _rows(rs: ResultSet) -> list[dict[str, Any]]:
    conv = _converters(rs)
    cols = rs.columns
    return [{c: f(v) for c, f, v in zip(cols, conv, r, strict=True)} for r in rs.rows]


def _csv(rs: ResultSet) -> str:
    conv = _converters(rs)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(rs.columns)
    for r in rs.rows:
        w.writerow(["" if v is None else v for v in (f(x) for f, x in zip(conv, r, strict=True))])
    return buf.getvalue()


@dataclass
class ApiService:
    """The state the routes read (one per app)."""

    cfg: Config
    fragments: dict[str, Any]
    results: Path
    reader: Reader
    metrics: ApiMetrics
    hub: LiveHub
    live_source: Any = None  # the reader of the live topics (anything with start/stop), None: live off
    interfaces: str | None = None  # the interfaces file (contract.interfaces), None: no port names
    infos: dict[str, QueryInfo] = field(init=False)  # aggregates and windowed joins
    net_names: NetNames = field(init=False)
    if_names: IfNames = field(init=False)
    alert_reader: AlertReader = field(init=False)
    flagged: IncompleteReader = field(init=False)  # windows known short, rows or not (contract.results)
    ranges: RangeReader = field(init=False)  # stepped series and top-N over long ranges
    row_infos: dict[str, RowInfo] = field(init=False)  # row-window queries (kind: rows)
    rows: RowReader = field(init=False)
    warmed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.infos = {q.name: QueryInfo.of(q) for q in self.cfg.stored_queries}
        self.net_names = NetNames(self.cfg.networks)
        self.if_names = IfNames(self.interfaces)  # a bad file at start: ConfigError, the API refuses to start
        self.metrics.registry.register(IfNamesCollector(self.if_names))
        self.alert_reader = AlertReader(self.results)
        self.flagged = IncompleteReader(self.results)
        self.ranges = RangeReader(self.reader)
        self.row_infos = {r.name: RowInfo(r) for r in self.cfg.rows}
        self.rows = RowReader(self.results)

    def info(self, name: str) -> QueryInfo:
        """The query called ``name``, or 404 naming the known ones."""
        qi = self.infos.get(name)
        if qi is None and name in self.row_infos:  # the row routes answer results and latest first
            raise ParamError(
                f"query {name!r} has row windows (kind: rows), which have no time span: this endpoint does "
                f"not apply; ask /queries/{name}/results or /latest"
            )
        if qi is None:
            known = ", ".join([*self.infos, *self.row_infos])
            raise HTTPException(404, f"unknown query {name!r}; known: {known}")
        return qi

    def tier_options(self, qi: QueryInfo) -> list[TierOption]:
        """The roll-up tiers the query keeps, with their retention (contract.results)."""
        spec = qi.spec
        return [
            TierOption(n, w, R.retention_ns(spec, n))
            for n, w in zip(spec.tier_names, spec.tiers, strict=True)
        ]

    @staticmethod
    def now() -> datetime:
        return datetime.now(UTC)

    def newest_end(self, qi: QueryInfo, start: str | None, end: str | None) -> datetime | None:
        """The end of the query's newest closed window, when a request gives no range (None otherwise)."""
        if start is not None or end is not None:
            return None
        ws = self.reader.latest_window(qi)
        return None if ws is None else ws + timedelta(microseconds=qi.spec.window.range_ns // 1000)

    def respond(
        self, body: dict[str, Any], rs: ResultSet, fmt: str, filename: str, qi: QueryInfo | None = None
    ) -> Response:
        """``body`` with the rows as JSON, or the rows as CSV (total in X-Total-Count)."""
        if fmt == "csv":
            headers = {
                "X-Total-Count": str(rs.total),
                "Content-Disposition": f'inline; filename="{filename}.csv"',
            }
            return Response(_csv(rs), media_type="text/csv; charset=utf-8", headers=headers)
        body["columns"] = rs.columns
        body["rows"] = rows = _rows(rs)
        if qi is not None and self.interfaces:  # exporter + in_iface/out_iface -> port names (serve.ifnames)
            added = self.if_names.annotate(qi.spec, rs.columns, rs.rows, rows)
            if added:
                body["name_columns"] = added
        if qi is not None and self.cfg.networks:  # src_net / dst_net ids -> names (high_level.serve.netnames)
            body["net_names"] = self.net_names.for_rows(qi.spec, rs.columns, rs.rows)
        return JSONResponse(body)

    @staticmethod
    def paging(rs: ResultSet, limit: int, offset: int) -> dict[str, Any]:
        nxt = offset + len(rs.rows)
        return {
            "limit": limit,
            "offset": offset,
            "returned": len(rs.rows),
            "total": rs.total,
            "next_offset": nxt if nxt < rs.total else None,
        }
