"""The interfaces file (``contract.interfaces``): (exporter, ifIndex) -> name and speed; every bad line is
refused with file and line; the API's names survive a bad reload (logged, counted) and follow a good one."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from contract import interfaces
from contract.query import ConfigError
from high_level.serve.ifnames import IfNames, IfNamesCollector
from lowwater_testing.queries import spec

GOOD = """\
exporters:
  192.0.2.1:
    name: edge-1
    default: {name: unknown}
    interfaces:
      5: {name: xe-0/0/5, speed: 10000, description: transit A}
      6: {name: xe-0/0/6}
  192.0.2.2:
    interfaces:
      5: {name: Ethernet5, speed: 25000}
"""


def _u32(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def test_the_example_file_and_lookups() -> None:
    ex = interfaces.load(Path(__file__).resolve().parents[1] / "configs" / "interfaces" / "interfaces.yaml")
    assert ex.lookup(_u32("192.0.2.1"), 5).name == "xe-0/0/5"
    ifs = interfaces.parse_text(GOOD, "i.yaml")
    a, b = _u32("192.0.2.1"), _u32("192.0.2.2")
    assert ifs.lookup(a, 5) == interfaces.Interface("xe-0/0/5", 10000, "transit A")
    assert ifs.lookup(b, 5) == interfaces.Interface("Ethernet5", 25000)  # same ifIndex, another router
    assert ifs.lookup(a, 6).speed == 0
    assert ifs.lookup(a, 99).name == "unknown"  # the exporter's default
    assert ifs.lookup(b, 99) is None and ifs.lookup(_u32("192.0.2.3"), 5) is None
    assert ifs.exporter_names == {a: "edge-1"} and len(ifs) == 3


@pytest.mark.parametrize(
    ("text", "line", "field", "reason"),
    [
        ("exporters:\n  192.0.2.1:\n    interfaces:\n      5: {speed: 10}\n", 4, "name", "required"),
        (
            "exporters:\n  192.0.2.1:\n    interfaces:\n      5: {name: a, speed: fast}\n",
            4,
            "speed",
            "Mbit/s",
        ),
        (
            "exporters:\n  192.0.2.1:\n    interfaces:\n      5: {name: a, sped: 1}\n",
            4,
            "sped",
            "unknown key",
        ),
        ("exporters:\n  192.0.2.1:\n    interfaces:\n      -1: {name: a}\n", 4, "interfaces", "ifIndex"),
        ("exporters:\n  192.0.2.1:\n    interfaces:\n      eth0: {name: a}\n", 4, "interfaces", "ifIndex"),
        (
            "exporters:\n  192.0.2.1:\n    interfaces:\n      5: {name: a}\n      5: {name: b}\n",
            5,
            "5",
            "duplicate",
        ),
        ("exporters:\n  router-a:\n    interfaces: {}\n", 2, "exporters", "IPv4"),
        ("exporters:\n  2001:db8::1:\n    interfaces: {}\n", 2, "exporters", "IPv4"),
        ("exporters:\n  192.0.2.1:\n    interface: {}\n", 3, "interface", "unknown key"),
        ("exporters:\n  192.0.2.1:\n    interfaces: [1, 2]\n", 3, "interfaces", "map"),
        ("exporters:\n  192.0.2.1:\n    interfaces:\n      5: xe-0/0/5\n", 4, "interfaces.5", "mapping"),
        ("routers: {}\n", 1, "exporters", "mapping"),
        ("exporters:\n  192.0.2.1: {interfaces: {5: {name: a}}\n", 3, "", "YAML"),
    ],
)
def test_every_bad_line_is_refused_with_file_and_line(text: str, line: int, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        interfaces.parse_text(text, "site/interfaces.yaml")
    e = err.value
    assert (e.file, e.line) == ("site/interfaces.yaml", line), str(e)
    assert field in e.field and reason in str(e), str(e)
    assert str(e).startswith(f"site/interfaces.yaml:{line}: ")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        interfaces.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError):  # the API refuses to start on it
        IfNames(str(tmp_path / "nope.yaml"))


def test_reload_keeps_the_old_map_on_a_bad_file_and_counts(tmp_path: Path) -> None:
    f = tmp_path / "interfaces.yaml"
    f.write_text(GOOD)
    names = IfNames(str(f))
    q = spec("by_iface", group_by=["exporter", "in_iface", "out_iface"], aggregates=["count as packets"])
    cols = ["window_start", "exporter", "in_iface", "out_iface", "packets"]
    raw = [(0, _u32("192.0.2.1"), 5, 6, 10), (0, _u32("192.0.2.2"), 5, 7, 3), (0, _u32("192.0.2.3"), 1, 2, 1)]

    def annotated() -> list[dict]:
        rows = [dict(zip(cols, r, strict=True)) for r in raw]
        added = names.annotate(q, cols, raw, rows)
        assert added == [
            "exporter_name",
            "in_iface_name",
            "in_iface_speed",
            "out_iface_name",
            "out_iface_speed",
        ]
        return rows

    r = annotated()
    assert (r[0]["exporter_name"], r[0]["in_iface_name"], r[0]["in_iface_speed"]) == (
        "edge-1",
        "xe-0/0/5",
        10000,
    )
    assert (r[0]["out_iface_name"], r[1]["in_iface_name"], r[1]["out_iface_name"]) == (
        "xe-0/0/6",
        "Ethernet5",
        None,
    )
    assert r[2]["in_iface_name"] is None and r[2]["exporter_name"] is None

    f.write_text(GOOD.replace("xe-0/0/5, speed: 10000", "xe-0/0/5, speed: lots"))
    assert names.reload() is False
    assert names.reloads_failed == 1 and "interfaces.yaml:6" in names.last_error
    assert annotated()[0]["in_iface_name"] == "xe-0/0/5"  # the previous map stays

    f.write_text(GOOD.replace("xe-0/0/5", "xe-0/0/5-renamed"))
    assert names.reload() is True
    assert annotated()[0]["in_iface_name"] == "xe-0/0/5-renamed"
    fams = {m.name: m for m in IfNamesCollector(names).collect()}
    assert fams["lowwater_api_interfaces"].samples[0].value == 3
    by = {s.labels["result"]: s.value for s in fams["lowwater_api_interfaces_reloads"].samples}
    assert by == {"ok": 1, "error": 1}


def test_no_names_without_the_exporter_column(tmp_path: Path) -> None:
    """An ifIndex alone names no port: a query grouped by in_iface only gets no names."""
    f = tmp_path / "interfaces.yaml"
    f.write_text(GOOD)
    q = spec("by_if", group_by=["in_iface"], aggregates=["count as packets"])
    rows = [{"in_iface": 5, "packets": 1}]
    assert IfNames(str(f)).annotate(q, ["in_iface", "packets"], [(5, 1)], rows) == []
    assert rows == [{"in_iface": 5, "packets": 1}]
