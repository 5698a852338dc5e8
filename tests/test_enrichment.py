"""Enrichment from the networks file: the Numba longest-prefix match equals a plain ``ipaddress`` reference,
bad lines are reported with their line, group-by and filters on src/dst_net/asn are exact in the
generated kernel, and a reload swaps the table without losing the tables' state."""

from __future__ import annotations

import ipaddress
import os
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from contract import fields as F
from contract import networks as N
from contract import query as Q
from contract import wire
from contract.filterlang import compile_filter, evaluate
from low_level.kernel import lpm
from low_level.kernel.tables import Tables
from lowwater_testing.agent import run_agent
from lowwater_testing.capture import run_kernel
from lowwater_testing.queries import config, query
from lowwater_testing.traffic import make_mixed_traffic

NS = 1_000_000_000
T0 = 1_700_000_000 * NS

NETWORKS = """\
! the test networks (pmacct networks_file lines, some named)
ten,64496,10.0.0.0/8
64497,192.168.0.0/16
small,64498,192.168.0.0/22    # nested twice
64499,192.168.4.0/24
64500,2001:db8::/32
site1,64501,2001:db8:1::/48
64502,2001:db8:1:2::/64
"""


def _random_networks(rng: np.random.Generator, n: int) -> str:
    """n random prefixes, nested on purpose: drawn around a few hot addresses of both families."""
    hot4 = [int(ipaddress.IPv4Address("10.20.30.40")), int(ipaddress.IPv4Address("192.0.2.200"))]
    hot6 = [int(ipaddress.IPv6Address("2001:db8:aaaa:bbbb::1"))]
    lines, seen = [], set()
    while len(lines) < n:
        if rng.random() < 0.6:
            plen = int(rng.integers(0, 33))
            base = hot4[int(rng.integers(0, 2))] if rng.random() < 0.7 else int(rng.integers(0, 1 << 32))
            net = ipaddress.IPv4Network((base >> (32 - plen) << (32 - plen), plen))
        else:
            plen = int(rng.integers(0, 129))
            base = hot6[0] if rng.random() < 0.7 else int(rng.integers(0, 1 << 62)) << 66
            net = ipaddress.IPv6Network((base >> (128 - plen) << (128 - plen), plen))
        if net in seen:
            continue
        seen.add(net)
        lines.append(f"n{len(lines)},{int(rng.integers(1, 1 << 32))},{net}")
    return "\n".join(lines)


def _words(addrs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    w = [F.ip_to_words(a) for a in addrs]
    return np.array([F.to_int64(h) for h, _ in w], np.int64), np.array(
        [F.to_int64(lo) for _, lo in w], np.int64
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lpm_equals_the_ipaddress_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nets = N.parse_text(_random_networks(rng, 300))
    table = lpm.build(nets)
    # addresses inside, at the edges of and outside the prefixes, both families
    addrs: list[str] = []
    for n in nets.networks[:150]:
        for v in (n.value, n.last, n.value - 1, n.last + 1, (n.value + n.last) // 2):
            if 0 <= v < 1 << 128:
                addrs.append(F.words_to_ip(v >> 64, v & ((1 << 64) - 1)))
    addrs += [str(ipaddress.IPv4Address(int(x))) for x in rng.integers(0, 1 << 32, 300)]
    addrs += ["10.20.30.40", "10.20.30.41", "2001:db8:aaaa:bbbb::1", "::", "0.0.0.0", "255.255.255.255"]
    hi, lo = _words(addrs)
    for which, attr in ((F.LPM_NET, "id"), (F.LPM_ASN, "asn")):
        out = np.zeros(len(addrs), np.int64)
        lpm.lookup_batch(table, hi, lo, which, out)
        want = [getattr(m, attr) if (m := nets.match(a)) else 0 for a in addrs]
        assert out.tolist() == want
    assert table.shape[1] <= 2 * len(nets.networks) + 1


def test_names_map_back_and_ids_are_stable() -> None:
    nets = N.parse_text(NETWORKS)
    reordered = N.parse_text("\n".join(reversed(NETWORKS.splitlines())))
    assert nets.names() == reordered.names()  # ids follow names, not line order
    assert nets.name_of(N.net_id("small")) == "small"
    assert nets.name_of(N.net_id("192.168.0.0/16")) == "192.168.0.0/16"  # unnamed: the prefix is the name
    assert nets.name_of(0) == "" and nets.name_of(5).startswith("net#")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("64500,10.0.0.1/8", "prefix"),  # host bits set
        ("x y,64500,10.0.0.0/8", "name"),
        ("64500", "line"),
        ("4294967296,10.0.0.0/8", "asn"),
        ("64500,10.0.0.0/33", "prefix"),
        ("64500,10.0.0.0/8", "prefix"),  # the prefix of line 2 again
    ],
)
def test_bad_lines_are_reported_with_their_line(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "nets.txt"
    path.write_text(f"! header\nok,1,10.0.0.0/8\n\n{line}\n")
    with pytest.raises(Q.ConfigError) as err:
        N.load(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 4, field)


def test_config_needs_a_networks_file_for_enrichment_fields(tmp_path: Path) -> None:
    body = """
queries:
  - name: by_asn
    group_by: [dst_asn]
    aggregates: [{fn: count}]
    window: {range: 1s}
"""
    with pytest.raises(Q.ConfigError, match="networks") as err:
        Q.load_text(body)
    assert err.value.line == 3
    (tmp_path / "nets.txt").write_text(NETWORKS)
    (tmp_path / "q.yaml").write_text("networks: nets.txt\n" + body)
    cfg = Q.load(tmp_path / "q.yaml")
    assert cfg.networks == str(tmp_path / "nets.txt")  # relative to the config file
    with pytest.raises(Q.ConfigError, match="numeric"):
        Q.load_text("networks: x\n" + body.replace("[{fn: count}]", "[{fn: sum, field: dst_asn}]"))


def _query(name: str, group: str, flt: str = "") -> Q.QuerySpec:
    """``group``: the group_by list as YAML (``"[src_net, {field: dst_net, as: to}]"``)."""
    return (
        config(
            query(
                name,
                group_by=yaml.safe_load(group),
                aggregates=["count as n", "sum(length) as b"],
                window="2s",
                table=256,
                flush={"policy": "lazy", "m": 2},
                filter=flt or None,
            ),
            networks="/nonexistent/only-the-kernel-table-matters",
        )
        .load()
        .queries[0]
    )


def _enrich_reference(nets: N.Networks, rows: np.ndarray) -> dict[int, np.ndarray]:
    """Per row, each enrichment source's value from the plain-Python match (cached per address)."""
    cache: dict[tuple[int, int], tuple[int, int]] = {}
    out = {s: np.zeros(len(rows), np.int64) for s in F.ENRICH_SOURCES}
    for i, r in enumerate(rows):
        for src, (col, which) in F.ENRICH_SOURCES.items():
            k = (int(r[col]), int(r[col + 1]))
            if k not in cache:
                m = nets.match(F.words_to_ip(*k))
                cache[k] = (m.id, m.asn) if m else (0, 0)
            out[src][i] = cache[k][0 if which == F.LPM_NET else 1]
    return out


def _merged(q: Q.QuerySpec, recs: np.ndarray) -> Counter:
    pane, key, state = Tables.build([q]).split(0, recs)
    got: Counter = Counter()
    for p, k, s in zip(pane, key, state, strict=True):
        got[(int(p), *map(int, k))] += int(s[0])
        got[("bytes", int(p), *map(int, k))] += int(s[1])
    return got


def test_group_by_and_filter_on_enrichment_fields_is_exact() -> None:
    nets = N.parse_text(NETWORKS)
    traffic = make_mixed_traffic(20_000, 800, T0, 10 * NS, seed=5, v6_share=0.4)
    queries = [
        _query("by_asn", "[dst_asn]"),
        _query("net_pairs", "[src_net, dst_net, protocol]"),
        _query("from_ten", "[dst_ip/24]", flt="src_asn == 64496 and dst_net != 0"),
    ]
    recs = run_kernel(queries, traffic, nets=[lpm.build(nets)])
    rows = traffic.rows()
    ref = _enrich_reference(nets, rows)
    pane = (rows[:, F.TS] - queries[0].window.origin_ns) // queries[0].window.pane_ns
    want = [Counter(), Counter(), Counter()]
    for i in range(len(rows)):
        keys = [
            (int(ref[F.DST_ASN][i]),),
            (int(ref[F.SRC_NET][i]), int(ref[F.DST_NET][i]), int(rows[i, F.PROTO])),
        ]
        prog = compile_filter(queries[2].filter)
        if evaluate(prog, rows[i], lambda src, _r, i=i: ref[src][i]):
            d = int(rows[i, F.DST_LO]) & ~0xFF
            keys.append((0, d))
        for qi, k in enumerate(keys):
            want[qi][(int(pane[i]), *k)] += 1
            want[qi][("bytes", int(pane[i]), *k)] += int(rows[i, F.LEN])
    for qi, q in enumerate(queries):
        assert _merged(q, recs[qi]) == want[qi], q.name
    asns = {k[1] for k in want[0] if k[0] != "bytes"}
    assert asns >= {64497, 64498, 64499, 64500, 64501, 64502}  # every level of nesting is hit
    assert sum(v for k, v in want[2].items() if k[0] != "bytes") > 0  # the filter keeps some packets


def test_a_reload_swaps_the_table_and_keeps_the_state(tmp_path: Path) -> None:
    """Half the packets under one file, half under another: each packet carries the ASN of the table
    it was matched with, and no packet is lost or counted twice across the swap."""
    old, new = N.parse_text("64497,192.168.0.0/16"), N.parse_text("65001,192.168.0.0/16\n65002,2001:db8::/32")
    traffic = make_mixed_traffic(8_000, 300, T0, 4 * NS, seed=9, v6_share=0.3)
    q = _query("by_asn", "[dst_asn]")
    got = _merged(q, run_kernel([q], traffic, chunk=500, nets=[lpm.build(old), lpm.build(new)])[0])
    rows = traffic.rows()
    pane = (rows[:, F.TS] - q.window.origin_ns) // q.window.pane_ns
    half = 4_000
    want: Counter = Counter()
    for part, nets in ((slice(0, half), old), (slice(half, None), new)):
        ref = _enrich_reference(nets, rows[part])
        for p, a in zip(pane[part], ref[F.DST_ASN], strict=True):
            want[(int(p), int(a))] += 1
    assert {k: v for k, v in got.items() if k[0] != "bytes"} == want
    assert any(k[1] == 65002 for k in want) and any(k[1] == 64497 for k in want)


def test_sighup_reloads_the_agent_networks_file(tmp_path: Path) -> None:
    from low_level.host.agent import Agent
    from low_level.host.loop import watch_sighup

    path = tmp_path / "nets.txt"
    path.write_text("64497,192.168.0.0/16\n")
    q = _query("by_asn", "[dst_asn]")
    agent = Agent([q], None, "cap-1", None, producer=_NullProducer(), networks=str(path))
    hi, lo = _words(["192.168.1.1"])

    def asn() -> int:
        out = np.zeros(1, np.int64)
        lpm.lookup_batch(agent.kernel.nets, hi, lo, F.LPM_ASN, out)
        return int(out[0])

    assert asn() == 64497
    previous = signal.getsignal(signal.SIGHUP)
    try:
        watch_sighup(agent)
        path.write_text("65001,192.168.0.0/16\n")
        os.kill(os.getpid(), signal.SIGHUP)
        agent.step()
        assert asn() == 65001 and agent.networks_reloads == 1
        path.write_text("ok,1,10.0.0.0/8\nbad line\n")  # a bad file: reported, the table stays
        os.kill(os.getpid(), signal.SIGHUP)
        agent.step()
        assert asn() == 65001 and agent.networks_reload_errors == 1
    finally:
        signal.signal(signal.SIGHUP, previous)
        agent.emitter.close()


class _NullProducer:
    """A Kafka producer stand-in for an agent that sends nothing in this unit test."""

    def send(self, *a: object, **k: object) -> None:
        return None

    def flush(self, *a: object, **k: object) -> None:
        return None

    def close(self, *a: object, **k: object) -> None:
        return None


def test_agent_groups_by_dst_asn_end_to_end(kafka, topic_factory, tmp_path: Path) -> None:
    """pcap -> agent (networks file from the config) -> Kafka: per-pane packets per dst_asn equal the
    reference match of dpkt's reading of the same file."""

    from lowwater_testing.agent import dpkt_oracle, write_pcap
    from lowwater_testing.topics import read_all

    topic = topic_factory(partitions=2)
    (tmp_path / "nets.txt").write_text(
        "64497,192.168.0.0/16\nsmall,64498,192.168.0.0/22\n64499,192.168.4.0/24\n"
    )
    cfg = tmp_path / "q.yaml"
    config(
        query("by_asn", group_by=["dst_asn"], window="2s", table=64, topic=topic, partitions=2),
        networks="nets.txt",
    ).write(cfg)
    pcap = tmp_path / "t.pcap"
    write_pcap(pcap, 6_000, 900, 8, seed=3)
    run_agent(cfg, f"pcap:{pcap}", bootstrap=kafka.bootstrap_servers)
    nets = N.load(tmp_path / "nets.txt")
    want: Counter = Counter()
    for (pane, _src, dst), n in dpkt_oracle(pcap, Q.load(cfg).queries[0].window.pane_ns).items():
        m = nets.match(F.words_to_ip(0, dst))
        want[(pane, m.asn if m else 0)] += n
    got: Counter = Counter()
    for _part, b in read_all(kafka.bootstrap_servers, topic, 2):
        if isinstance(b, wire.Partials):
            for p, k, s in zip(b.pane, b.key, b.state, strict=True):
                got[(int(p), int(k[0]))] += int(s[0])
    assert got == want
    assert {a for _, a in want} == {64497, 64498, 64499}


def test_agent_refuses_a_bad_networks_file_with_its_line(tmp_path: Path) -> None:

    (tmp_path / "nets.txt").write_text("64497,192.168.0.0/16\n64498,192.168.0.1/24\n")
    cfg = tmp_path / "q.yaml"
    cfg.write_text(
        "networks: nets.txt\nqueries:\n  - name: a\n    group_by: [dst_asn]\n"
        "    aggregates: [{fn: count}]\n    window: {range: 2s}\n"
    )
    proc = run_agent(cfg, "generator", host=None, extra=("--duration", "1"), check=False)
    assert proc.returncode != 0
    assert f"{tmp_path / 'nets.txt'}:2: prefix" in proc.stderr


def test_the_api_names_net_ids_from_the_same_file(tmp_path: Path) -> None:
    from high_level.serve.netnames import NetNames

    path = tmp_path / "nets.txt"
    path.write_text(NETWORKS)
    q = _query("net_pairs", "[src_net, {field: dst_net, as: to}, protocol]")
    names = NetNames(str(path))
    rows = [(N.net_id("ten"), N.net_id("small"), 6), (0, 12345, 17)]
    got = names.for_rows(q, ["src_net", "to", "protocol"], rows)
    assert got == {
        "src_net": {str(N.net_id("ten")): "ten", "0": ""},
        "to": {str(N.net_id("small")): "small", "12345": "net#12345"},
    }
    path.write_text("tiny,1,192.168.0.0/22\n")  # renamed: re-read on change
    assert names.for_rows(q, ["src_net", "to", "protocol"], rows)["to"][
        str(N.net_id("small"))
    ] == "net#" + str(N.net_id("small"))
    assert NetNames(None).for_rows(q, ["src_net"], rows) == {}
