"""The networks file: CIDR -> (network name, ASN), for the enrichment fields ``src_net``, ``dst_net``,
``src_asn`` and ``dst_asn``.

Defined once here because both levels read it: the low level matches every packet's addresses against
it (longest prefix, ``low_level.kernel.lpm``) and groups by the resulting integers; the high level and the API
map a net's integer back to its name through the same file.

Format (pmacct's ``networks_file``, plus an optional name), one network per line::

    ! comments start with '!' or '#'; blank lines are ignored
    [<name>,]<asn>,<prefix>/<len>
    office,64500,192.0.2.0/24
    64501,2001:db8::/32            # no name: the name is the prefix's text

* ``asn`` is a decimal 0 .. 2^32-1 (0 when the network has no AS of its own); ``prefix`` IPv4 or
  IPv6 (host bits must be zero). A name is letters, digits and ``. _ - : /`` (at most 64).
* The most specific prefix that holds the address wins (longest-prefix match, both families in one
  128-bit space: IPv4 as ``::ffff:0:0/96``, as everywhere in lowwater).
* ``*_net`` is the net's **id**: a stable 62-bit hash of its name (:func:`net_id`), so an id means the
  same network in every process and across reloads that keep the name, whatever the line order;
  ``*_asn`` is the ASN itself. Both are 0 for an address no prefix holds (and for non-IP frames).
  Several prefixes may share one name (one net, several prefixes).
* A bad line (syntax, bad prefix, host bits set, a prefix given twice, two names on one id) is a
  :class:`~contract.query.ConfigError` with the file and line number.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from contract.fields import IPV4_MAPPED_PREFIX
from contract.query import ConfigError
from contract.query.configfile import read_text

_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,64}")


def net_id(name: str) -> int:
    """A net's id: 62 bits of BLAKE2b of its name (positive, never 0: 0 means no match)."""
    return (int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 2) or 1


@dataclass(frozen=True)
class Network:
    """One line of the networks file, its prefix in lowwater's 128-bit address space."""

    value: int  # the prefix's first address (128-bit)
    length: int  # prefix length in the 128-bit space (IPv4: 96 + len)
    name: str
    asn: int
    line: int

    @property
    def id(self) -> int:
        return net_id(self.name)

    @property
    def last(self) -> int:
        return self.value | ((1 << (128 - self.length)) - 1)


@dataclass(frozen=True)
class Networks:
    """A parsed networks file."""

    path: str
    networks: tuple[Network, ...]

    def names(self) -> dict[int, str]:
        """Net id -> name, to print a ``*_net`` column."""
        return {n.id: n.name for n in self.networks}

    def name_of(self, ident: int) -> str:
        """The name of a net id; ``""`` for 0 (no match) and ``net#<id>`` for an id this file does not know."""
        if ident == 0:
            return ""
        return self.names().get(int(ident), f"net#{int(ident)}")

    def match(self, address: str) -> Network | None:
        """Longest-prefix match in plain Python (the reference the Numba lookup is tested against)."""
        addr = ipaddress.ip_address(address)
        v = (IPV4_MAPPED_PREFIX | int(addr)) if addr.version == 4 else int(addr)
        best = None
        for n in self.networks:
            if n.value <= v <= n.last and (best is None or n.length > best.length):
                best = n
        return best


def parse_text(text: str, path: str = "<networks>") -> Networks:
    """Parse a networks file's text; the first bad line raises ConfigError(path, line, ...)."""
    nets: list[Network] = []
    seen: dict[tuple[int, int], int] = {}
    names: dict[int, str] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        line = re.split(r"\s[#!]|^[#!]", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            asn_text, cidr = parts
            name = None
        elif len(parts) == 3:
            name, asn_text, cidr = parts
            if not _NAME.fullmatch(name):
                raise ConfigError(
                    path, no, "name", f"{name!r} is not a name (letters, digits, . _ : / -, at most 64)"
                )
        else:
            raise ConfigError(path, no, "line", "expected [<name>,]<asn>,<prefix>/<len>")
        if not re.fullmatch(r"\d{1,10}", asn_text) or int(asn_text) >= 1 << 32:
            raise ConfigError(path, no, "asn", f"{asn_text!r} is not an AS number (0 .. 4294967295)")
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise ConfigError(path, no, "prefix", f"{cidr!r}: {exc}") from None
        if net.version == 4:
            value, length = IPV4_MAPPED_PREFIX | int(net.network_address), 96 + net.prefixlen
        else:
            value, length = int(net.network_address), net.prefixlen
        if (value, length) in seen:
            raise ConfigError(path, no, "prefix", f"{cidr} is already given on line {seen[(value, length)]}")
        seen[(value, length)] = no
        name = name or str(net)
        ident = net_id(name)
        if names.setdefault(ident, name) != name:  # a 62-bit collision: not expected, but never silent
            raise ConfigError(path, no, "name", f"{name!r} hashes to the id of {names[ident]!r}; rename one")
        nets.append(Network(value, length, name, int(asn_text), no))
    return Networks(path, tuple(nets))


def load(path: str | Path) -> Networks:
    """Load a networks file; a missing file or a bad line raises ConfigError with the file (and line)."""
    return parse_text(read_text(path, "networks"), str(Path(path)))
