"""Packet sources: producers that fill a :class:`~low_level.capture.ring.Ring` from a thread.

* ``pcap``: :class:`PcapSource`, replay of a pcap/pcapng file (fast or paced, looped, rebased).
* ``generator``: :class:`GeneratorSource`, synthetic traffic with known aggregates.
* ``afpacket``: :class:`AfPacketSource`, live Linux capture (TPACKET_V3).

:func:`open_source` builds one from a config dict, so agent configs stay plain data.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from low_level.capture.ring import Ring
from low_level.capture.sources.afpacket import AfPacketSource
from low_level.capture.sources.base import Source
from low_level.capture.sources.generator import GeneratorSource, generate_frames
from low_level.capture.sources.pcap.format import UnsupportedLinktypeError
from low_level.capture.sources.pcap.source import PcapSource
from low_level.capture.sources.synth.model import group_tuple, group_tuple_nb

__all__ = [
    "AfPacketSource",
    "GeneratorSource",
    "PcapSource",
    "Source",
    "UnsupportedLinktypeError",
    "generate_frames",
    "group_tuple",
    "group_tuple_nb",
    "open_source",
    "SOURCE_TYPES",
]

SOURCE_TYPES: dict[str, type[Source]] = {
    "pcap": PcapSource,
    "generator": GeneratorSource,
    "afpacket": AfPacketSource,
}
_REQUIRED = {"pcap": ("path",), "afpacket": ("interfaces",), "generator": ()}


def _options(cls: type[Source]) -> list[str]:
    return [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "ring")]


def open_source(spec: Mapping[str, Any], ring: Ring) -> Source:
    """Build a (not yet started) source from ``{"type": ..., **options}``.

    The options are the constructor's keyword arguments, e.g. ``{"type": "pcap", "path": "x.pcap",
    "mode": "fast", "loop": False}``, ``{"type": "afpacket", "interfaces": ["eth0"], "promiscuous":
    True}``; lists are accepted where tuples are expected (YAML/JSON have no tuples). Unknown types,
    unknown or missing options raise ValueError naming them.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"source spec must be a mapping with a 'type' key, not {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in SOURCE_TYPES:
        raise ValueError(f"source spec: unknown type {kind!r}; expected one of {sorted(SOURCE_TYPES)}")
    cls = SOURCE_TYPES[kind]
    allowed = _options(cls)
    opts = {k: v for k, v in spec.items() if k != "type"}
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise ValueError(f"{kind} source spec: unknown option(s) {unknown}; allowed: {allowed}")
    missing = [k for k in _REQUIRED[kind] if k not in opts]
    if missing:
        raise ValueError(f"{kind} source spec: missing required option(s) {missing}")
    if kind == "generator" and isinstance(opts.get("sizes"), list):
        opts["sizes"] = tuple(opts["sizes"])
    if kind == "afpacket" and isinstance(opts.get("interfaces"), str):
        raise ValueError(
            f"afpacket source spec: interfaces must be a list of names, not the string {opts['interfaces']!r}"
        )
    try:
        return cls(ring=ring, **opts)
    except TypeError as exc:  # a wrongly typed value that the constructor could not take
        raise ValueError(f"{kind} source spec: {exc}") from exc
