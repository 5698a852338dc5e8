"""Queries built in code: the tests and benchmarks describe a query in one call instead of an inline YAML copy.

The builder makes the same document an operator writes (``configs/*.yaml``) and hands it to the real loader
(:func:`contract.query.load_text`), so every built query is validated exactly like a file::

    q = spec("pairs", group_by=["src_ip", "dst_ip"], aggregates=["count as packets", "sum(length) as bytes"],
             window="2s", table=1024, flush="lazy", topic=topic, partitions=3)
    path = config(query("pairs", ...), select("syn", ...)).write(tmp_path / "q.yaml")  # for a subprocess

Aggregates are written ``"fn as name"`` or ``"fn(field) as name"``; a dict is passed through as is (for the
holistic parameters: ``{"fn": "quantiles", "field": "length", "q": [0.5], "as": "p"}``). Problems in the
*loader's* YAML handling (line numbers, bad syntax) are tested with literal YAML in ``tests/test_query_model.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contract import query as Q

_AGG = re.compile(r"\s*(\w+)\s*(?:\(\s*(\w+)\s*\))?\s*(?:as\s+(\w+))?\s*")


def agg(text: str | dict[str, Any]) -> dict[str, Any]:
    """``"count as n"`` / ``"sum(length) as bytes"`` -> the aggregate's mapping (a dict is returned as is)."""
    if isinstance(text, dict):
        return text
    m = _AGG.fullmatch(text)
    if not m:
        raise ValueError(f"aggregate {text!r}: write 'fn as name' or 'fn(field) as name'")
    fn, field, alias = m.groups()
    out: dict[str, Any] = {"fn": fn}
    if field:
        out["field"] = field
    if alias:
        out["as"] = alias
    return out


def query(
    name: str,
    *,
    group_by: list[Any] | tuple = (),
    aggregates: list[str | dict] | tuple = ("count as packets",),
    window: str | dict[str, Any] = "10s",
    table: int | dict[str, Any] | None = None,
    flush: str | dict[str, Any] | None = None,
    topic: str | None = None,
    partitions: int | None = None,
    **more: Any,
) -> dict[str, Any]:
    """One aggregate query's mapping.

    ``window``: ``"10s"`` is ``{range: 10s}``; a dict is passed through. ``table``: a size or a dict.
    ``flush``: a policy name or a dict. ``topic``/``partitions`` fill the ``kafka`` block; any other keyword
    (``filter``, ``having``, ``alerts``, ``heartbeat``, ``sources``, ``export``, ``kafka``...) is copied as is.
    """
    doc: dict[str, Any] = {"name": name}
    if more.get("filter") is not None:
        doc["filter"] = more.pop("filter")
    doc["group_by"] = list(group_by)
    doc["aggregates"] = [agg(a) for a in aggregates]
    doc["window"] = {"range": window} if isinstance(window, str) else dict(window)
    if table is not None:
        doc["table"] = {"size": table} if isinstance(table, int) else dict(table)
    if flush is not None:
        doc["flush"] = {"policy": flush} if isinstance(flush, str) else dict(flush)
    kafka = dict(more.pop("kafka", {}) or {})
    if topic is not None:
        kafka["topic"] = topic
    if partitions is not None:
        kafka["partitions"] = partitions
    if kafka:
        doc["kafka"] = kafka
    doc.update({k: v for k, v in more.items() if v is not None})
    return doc


def pairs(**kw: Any) -> dict[str, Any]:
    """The agent tests' query ``pairs``: packets per (src_ip, dst_ip) per 2 s, a 1024-slot table, lazy
    flush with m = 2; ``kw`` (``topic``, ``partitions``, ``window``, ...) overrides or adds."""
    base = {
        "group_by": ["src_ip", "dst_ip"],
        "window": "2s",
        "table": 1024,
        "flush": {"policy": "lazy", "m": 2},
    }
    return query("pairs", **(base | kw))


def tcp_ports(name: str, counted: str = "syns", **kw: Any) -> dict[str, Any]:
    """TCP packets per destination port (``count as <counted>``) and their smallest TTL, 9 s sliding every
    3 s; ``kw`` (``filter``, ``window``, ``description``, ...) overrides or adds."""
    kw = {"filter": "protocol == tcp", "window": {"range": "9s", "slide": "3s"}} | kw
    return query(name, group_by=["dst_port"], aggregates=[f"count as {counted}", "min(ttl) as min_ttl"], **kw)


def q4(name: str = "q4_pairs", **kw: Any) -> dict[str, Any]:
    """The OOP paper's Q4: packets per (src_ip, dst_ip) per 1-minute tumbling window of IPv4 traffic;
    ``kw`` (``filter``, ``aggregates``, ``tiers``, ``table``, ...) overrides or adds."""
    base = {
        "description": "packet count per (srcIP, dstIP) per minute (OOP paper Q4)",
        "filter": "ip_version == 4",
        "group_by": ["src_ip", "dst_ip"],
        "window": "1m",
    }
    return query(name, **(base | kw))


def on_demand_query(name: str, topic: str, interval: str, table: int, on_demand: bool = False) -> Q.QuerySpec:
    """Packets per (src_ip, dst_ip) per second on one partition, punctuated every ``interval`` (100 ms
    skew), ``on_demand`` or not: the on-demand punctuation tests' and benchmark's query."""
    return spec(
        name,
        group_by=["src_ip", "dst_ip"],
        window="1s",
        table=table,
        flush={"policy": "lazy", "m": 1},
        heartbeat={"interval": interval, "skew": "100ms", "on_demand": on_demand},
        topic=topic,
        partitions=1,
    )


def select(name: str, **fields: Any) -> dict[str, Any]:
    """One ``kind: select`` mapping (``filter``, ``project``, ``kafka``...: copied as is)."""
    return {"name": name, "kind": "select", **fields}


def join(name: str, **fields: Any) -> dict[str, Any]:
    """One ``kind: join`` mapping (``left``, ``right``, ``on``, ``within``, ``aggregates``...: copied as is)."""
    if "aggregates" in fields:
        fields["aggregates"] = [agg(a) for a in fields["aggregates"]]
    return {"name": name, "kind": "join", **fields}


@dataclass(frozen=True)
class ConfigDoc:
    """A whole config document: its YAML text, loaded by the real loader or written for a subprocess."""

    doc: dict[str, Any]

    @property
    def text(self) -> str:
        return yaml.safe_dump(self.doc, sort_keys=False, default_flow_style=None, width=1000)

    def load(self, path: str = "<built>") -> Q.Config:
        """Validated by :func:`contract.query.load_text`, as a file would be."""
        return Q.load_text(self.text, path)

    def write(self, path: str | Path) -> Path:
        """Write the YAML (for ``--config`` of a real agent or job process) and return the path."""
        p = Path(path)
        p.write_text(self.text)
        self.load(str(p))  # a bad document fails here, not in the subprocess
        return p


def config(*items: dict[str, Any], **top: Any) -> ConfigDoc:
    """A config document of the given query/select/join mappings; ``top`` adds top-level keys
    (``networks``, ``source``)."""
    return ConfigDoc({"queries": list(items), **top})


def spec(name: str, **kw: Any) -> Q.QuerySpec:
    """One validated :class:`contract.query.QuerySpec` (``kw`` as for :func:`query`)."""
    return config(query(name, **kw)).load().queries[0]


FILTERS = [
    "protocol == tcp",
    "protocol == tcp and tcp_flags & SYN and not tcp_flags & ACK",
    "dst_port in [53, 80, 443] or src_port < 1024",
    "dst_ip in 10.0.0.0/8",
    "src_ip == 10.1.2.3 or dst_ip in [192.168.0.0/16, 2001:db8::/32]",
    "not (ttl >= 64) and length > 100",
    "dscp != 0 or vlan == 10",
    "ip_version == 6 and dst_ip in 2001:db8::/32",
]
