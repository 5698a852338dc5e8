"""The interfaces file: (exporter, ifIndex) -> interface name and speed, like Akvorado's static metadata
provider, so that results grouped by ``exporter`` and ``in_iface`` / ``out_iface`` read as router ports.

Flow records carry the exporter's address and SNMP ifIndexes only; the names live with the operator.
YAML (not CSV) because an exporter has a name and a default beside its interfaces, and because the
config loader's line numbers (:func:`contract.query.configfile.yaml_with_lines`) then point at the bad
line, as they do for a query::

    exporters:
      192.0.2.1:                      # the exporter's IPv4 address (sFlow: the agent address)
        name: edge-1                  # optional
        default: {name: unknown}      # optional: any ifIndex not listed below
        interfaces:
          5: {name: xe-0/0/5, speed: 10000, description: transit A}   # speed in Mbit/s (ifHighSpeed)
          6: {name: xe-0/0/6, speed: 10000}

* An interface needs a ``name`` (1..64 characters); ``speed`` (Mbit/s, default 0: unknown) and
  ``description`` are optional. ifIndex is 0 .. 2^32-1.
* A bad line (not an IPv4 address, an unknown key, a duplicate key, a missing name, a bad speed) is a
  :class:`~contract.query.ConfigError` with the file and line number.

Only the API reads it (``high_level.serve.ifnames``): the names never travel in partials, so a rename
needs no restart of a capture host, only SIGHUP to the API.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.query import ConfigError
from contract.query.configfile import read_text, yaml_with_lines

_IFACE_KEYS = {"name", "speed", "description"}
_EXPORTER_KEYS = {"name", "default", "interfaces"}


@dataclass(frozen=True)
class Interface:
    """One interface of one exporter."""

    name: str
    speed: int = 0  # Mbit/s; 0 when not known
    description: str = ""


@dataclass(frozen=True)
class Interfaces:
    """A parsed interfaces file: exporter (IPv4 as u32, as the ``exporter`` field holds it) -> ports."""

    path: str
    ports: dict[tuple[int, int], Interface]
    defaults: dict[int, Interface]
    exporter_names: dict[int, str]

    def lookup(self, exporter: int, ifindex: int) -> Interface | None:
        """The interface ``ifindex`` of ``exporter``, its exporter's default, or None."""
        got = self.ports.get((int(exporter), int(ifindex)))
        return got if got is not None else self.defaults.get(int(exporter))

    def __len__(self) -> int:
        return len(self.ports)


def _lines(node: Any) -> dict:
    return node.get("__lines__", {}) if isinstance(node, dict) else {}


def _keys(node: dict) -> list:
    return [k for k in node if k not in ("__lines__", "__line__")]


def _interface(node: Any, path: str, line: int | None, where: str) -> Interface:
    if not isinstance(node, dict):
        raise ConfigError(path, line, where, "must be a mapping like {name: xe-0/0/5, speed: 10000}")
    for k in _keys(node):
        if k not in _IFACE_KEYS:
            raise ConfigError(
                path, _lines(node).get(k, line), f"{where}.{k}", "unknown key (name, speed, description)"
            )
    name = node.get("name")
    if not isinstance(name, str | int) or not 1 <= len(str(name)) <= 64:
        raise ConfigError(
            path, _lines(node).get("name", line), f"{where}.name", "a name of 1 to 64 characters is required"
        )
    speed = node.get("speed", 0)
    if isinstance(speed, bool) or not isinstance(speed, int) or not 0 <= speed < 1 << 32:
        raise ConfigError(
            path,
            _lines(node).get("speed", line),
            f"{where}.speed",
            f"{speed!r} is not a speed in Mbit/s (0 .. 2^32-1)",
        )
    desc = node.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(path, _lines(node).get("description", line), f"{where}.description", "must be text")
    return Interface(str(name), int(speed), desc)


def parse_text(text: str, path: str = "<interfaces>") -> Interfaces:
    """Parse an interfaces file's text; the first bad line raises ConfigError(path, line, ...)."""
    doc = yaml_with_lines(text, path)
    if not isinstance(doc, dict) or "exporters" not in doc:
        raise ConfigError(path, 1, "exporters", "the document must be a mapping with an 'exporters' mapping")
    for k in _keys(doc):
        if k != "exporters":
            raise ConfigError(path, _lines(doc).get(k), k, "unknown top-level key (exporters)")
    exps = doc["exporters"]
    if not isinstance(exps, dict):
        raise ConfigError(
            path, _lines(doc).get("exporters"), "exporters", "must map exporter addresses to exporters"
        )
    ports: dict[tuple[int, int], Interface] = {}
    defaults: dict[int, Interface] = {}
    names: dict[int, str] = {}
    seen: dict[int, int] = {}
    for addr in _keys(exps):
        line = _lines(exps).get(addr)
        try:
            ip = ipaddress.IPv4Address(str(addr))
        except ValueError:
            raise ConfigError(
                path, line, "exporters", f"{addr!r} is not an IPv4 address (the exporter field is IPv4)"
            ) from None
        exp = int(ip)
        if exp in seen:
            raise ConfigError(path, line, f"exporters.{addr}", f"the same exporter as line {seen[exp]}")
        seen[exp] = line or 0
        node = exps[addr]
        where = f"exporters.{addr}"
        if not isinstance(node, dict):
            raise ConfigError(
                path, line, where, "must be a mapping with 'interfaces' (and optional name, default)"
            )
        for k in _keys(node):
            if k not in _EXPORTER_KEYS:
                raise ConfigError(
                    path, _lines(node).get(k, line), f"{where}.{k}", "unknown key (name, default, interfaces)"
                )
        if "name" in node:
            if not isinstance(node["name"], str) or not 1 <= len(node["name"]) <= 64:
                raise ConfigError(
                    path, _lines(node).get("name", line), f"{where}.name", "a name of 1 to 64 characters"
                )
            names[exp] = node["name"]
        if "default" in node:
            defaults[exp] = _interface(
                node["default"], path, _lines(node).get("default", line), f"{where}.default"
            )
        ifs = node.get("interfaces", {})
        if_line = _lines(node).get("interfaces", line)
        if not isinstance(ifs, dict):
            raise ConfigError(path, if_line, f"{where}.interfaces", "must map ifIndexes to interfaces")
        for idx in _keys(ifs):
            il = _lines(ifs).get(idx, if_line)
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 1 << 32:
                raise ConfigError(path, il, f"{where}.interfaces", f"{idx!r} is not an ifIndex (0 .. 2^32-1)")
            ports[(exp, idx)] = _interface(ifs[idx], path, il, f"{where}.interfaces.{idx}")
    return Interfaces(path, ports, defaults, names)


def load(path: str | Path) -> Interfaces:
    """Load an interfaces file; a missing file or a bad line raises ConfigError with the file (and line)."""
    return parse_text(read_text(path, "interfaces"), str(Path(path)))
