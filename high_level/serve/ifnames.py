"""Names and speeds of the ``in_iface`` / ``out_iface`` result columns of queries that also group by
``exporter``: the low level groups by SNMP ifIndex, the API says which port that is, from the interfaces
file (``contract.interfaces``, ``lowwater-api --interfaces FILE``).

Re-read on SIGHUP (:meth:`IfNames.reload`), not per request: an operator edits the file, then signals the
API, as with the capture hosts' networks file. A bad file is logged and counted and the last good map stays:
a typo must not blank every name on the page.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from contract import interfaces
from contract.query import ConfigError, QuerySpec

log = logging.getLogger(__name__)

IFACE_COLUMNS = ("in_iface", "out_iface", "interface")  # interface is in_iface's alias


class IfNames:
    """(exporter, ifIndex) -> name and speed, from one interfaces file (or none)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.last_error = ""
        self._ifs: interfaces.Interfaces | None = interfaces.load(path) if path else None

    def current(self) -> interfaces.Interfaces | None:
        return self._ifs

    def reload(self) -> bool:
        """Re-read the file; on a bad file keep the old map, log and count it. True when it was replaced."""
        if self.path is None:
            return False
        try:
            self._ifs = interfaces.load(self.path)
        except ConfigError as exc:
            self.reloads_failed += 1
            self.last_error = str(exc)
            log.error("interfaces file not reloaded, the previous names stay: %s", exc)
            return False
        self.reloads_ok += 1
        self.last_error = ""
        log.info("interfaces file reloaded: %d interfaces from %s", len(self._ifs), self.path)
        return True

    def columns(self, spec: QuerySpec, columns: list[str]) -> list[tuple[str, int, int]]:
        """``(column, its index, the exporter column's index)`` of the interface columns a name applies to:
        only a query that also groups by ``exporter`` (an ifIndex alone names no port)."""
        exp = next((p.name for p in spec.key_parts if p.field.name == "exporter"), None)
        if self._ifs is None or exp is None or exp not in columns:
            return []
        return [
            (p.name, columns.index(p.name), columns.index(exp))
            for p in spec.key_parts
            if p.field.name in IFACE_COLUMNS and p.name in columns
        ]

    def annotate(
        self, spec: QuerySpec, columns: list[str], raw: list[Any], rows: list[dict[str, Any]]
    ) -> list[str]:
        """Add ``<column>_name`` and ``<column>_speed`` (Mbit/s) to each JSON row beside its interface
        columns, and ``exporter_name`` when the file names exporters (None where it does not know the
        port or exporter); returns the added keys."""
        cols = self.columns(spec, columns)
        ifs = self._ifs
        if not cols or ifs is None:
            return []
        added = []
        e0 = cols[0][2]
        if ifs.exporter_names:
            exp_col = columns[e0]
            added.append(f"{exp_col}_name")
            for r, out in zip(raw, rows, strict=True):
                out[f"{exp_col}_name"] = None if r[e0] is None else ifs.exporter_names.get(int(r[e0]))
        for c, i, e in cols:
            added += [f"{c}_name", f"{c}_speed"]
            for r, out in zip(raw, rows, strict=True):
                port = None if r[i] is None or r[e] is None else ifs.lookup(int(r[e]), int(r[i]))
                out[f"{c}_name"] = None if port is None else port.name
                out[f"{c}_speed"] = None if port is None else port.speed
        return added


class IfNamesCollector:
    """The interfaces file on the API's /metrics: ports known, reloads by result (a failed one kept the old map)."""

    def __init__(self, names: IfNames) -> None:
        self.names = names

    def collect(self) -> Iterator[Any]:
        ifs = self.names.current()
        yield GaugeMetricFamily(
            "lowwater_api_interfaces",
            "interfaces named by the interfaces file",
            value=0 if ifs is None else len(ifs),
        )
        c = CounterMetricFamily(
            "lowwater_api_interfaces_reloads", "reloads of the interfaces file on SIGHUP", labels=["result"]
        )
        c.add_metric(["ok"], self.names.reloads_ok)
        c.add_metric(["error"], self.names.reloads_failed)
        yield c
