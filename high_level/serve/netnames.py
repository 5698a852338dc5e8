"""Names of the ``src_net`` / ``dst_net`` result columns: the low level groups by a net's id, the API says
which network that is, from the same networks file (``contract.networks``) the config names.

The file is re-read when it changes (the capture hosts reload it on SIGHUP), so a renamed or added net
shows up without restarting the API; an id the file no longer knows prints as ``net#<id>``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from contract import networks
from contract.query import ConfigError, QuerySpec

log = logging.getLogger(__name__)


class NetNames:
    """Net id -> name, from one networks file (or none)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._nets: networks.Networks | None = None

    def current(self) -> networks.Networks | None:
        """The file's networks, re-read if it changed since the last call (a bad file keeps the last good one)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._nets = networks.load(self.path)
                self._stamp = stamp
        except (OSError, ConfigError) as exc:
            log.warning("networks file not (re)read, net names may be stale: %s", exc)
        return self._nets

    def for_rows(self, spec: QuerySpec, columns: list[str], rows: list[Any]) -> dict[str, dict[str, str]]:
        """``{column: {id: name}}`` for the net columns of these rows (ids as strings, JSON keys)."""
        net_cols = [p.name for p in spec.key_parts if p.field.name in ("src_net", "dst_net")]
        idx = {c: columns.index(c) for c in net_cols if c in columns}
        nets = self.current() if idx else None
        if nets is None:
            return {}
        return {
            c: {str(r[i]): nets.name_of(int(r[i])) for r in rows if r[i] is not None} for c, i in idx.items()
        }
