"""The query model: example configs load, and malformed configs fail naming file, line, field, reason."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from contract import fields as F
from contract import query as Q
from contract.filterlang import FilterError, compile_filter, evaluate
from low_level.kernel.filter import predicate
from lowwater_testing.queries import FILTERS

REPO = Path(__file__).resolve().parents[1]


def test_example_configs_load() -> None:
    for path in (REPO / "configs").glob("*.yaml"):
        cfg = Q.load(path)
        assert cfg.queries or cfg.stored_queries
    cfg = Q.load(REPO / "configs" / "default.yaml")
    q4 = cfg.query("q4_pairs")
    assert q4.window.tumbling and q4.window.pane_ns == 60 * Q.NS and Q.key_width(q4) == 4
    syn = cfg.query("syn_per_port")
    assert syn.window.panes_per_window == 6 and syn.window.pane_ns == 10 * Q.NS
    dst = cfg.query("bytes_per_dst24")
    assert [c.name for c in Q.state_columns(dst)] == [
        "bytes",
        "packets",
        "avg_len.sum",
        "avg_len.count",
        "max_len",
    ]


BASE = """queries:
  - name: ok
    group_by: [src_ip]
    aggregates:
      - {fn: count}
    window: {range: 1m}
"""


def _agg(text: str, reason: str, field: str = "aggregates.0", line: int = 5) -> tuple:
    """BASE with ``text`` as its one aggregate, rejected at ``line`` and ``field`` for ``reason``."""
    return (BASE.replace("{fn: count}", text), line, field, reason)


MALFORMED = [
    # (document, line, field fragment, reason fragment)
    (BASE.replace("group_by: [src_ip]", "group_by: [src_mca]"), 3, "group_by", "unknown field 'src_mca'"),
    _agg("{fn: median}", "Input should be", "aggregates.0.fn"),
    _agg("{fn: sum, field: src_ip}", "numeric field"),
    _agg("{fn: sum}", "needs a field"),
    (
        BASE.replace("{range: 1m}", "{range: 1m, slide: 7ms}"),
        6,
        "window",
        "more than 1024 panes per window (pane = gcd",
    ),
    (BASE.replace("{range: 1m}", "{range: 10s, slide: 1m}"), 6, "window", "gaps"),
    (BASE.replace("{range: 1m}", "{range: soon}"), 6, "window.range", "not a duration"),
    (BASE + "    table: {size: 1000}\n", 7, "table.size", "power of two"),
    (BASE + '    filter: "protocol == "\n', 7, "filter", "filter syntax error"),
    (BASE + "    filter: \"__import__('os')\"\n", 7, "filter", "unexpected character"),
    (BASE + "    flush: {policy: eager}\n", 7, "flush.policy", "Input should be"),
    (BASE + "    flush: {policy: lazy, m: 0}\n", 7, "flush", "between 1 and 32"),
    (BASE + "    colour: blue\n", 7, "colour", "unknown field"),
    (BASE + "    kafka: {topic: 'bad topic!'}\n", 7, "kafka.topic", "letters, digits"),
    (BASE + BASE.split("\n", 1)[1], 7, "name", "duplicate query name"),
    (BASE.replace("name: ok", "name: Bad-Name"), 2, "name", "lower-case"),
    (BASE.replace("    window: {range: 1m}\n", ""), 2, "window", "required field is missing"),
    (BASE.replace("[src_ip]", "[src_ip"), None, "", "YAML syntax error"),
    ("queries: 3\n", 1, "queries", "non-empty list"),
    (BASE + "    heartbeat: {interval: 1ms}\n", 7, "heartbeat.interval", "at least 10ms"),
    (
        BASE.replace("group_by: [src_ip]", "group_by: [dst_port/24]"),
        3,
        "group_by",
        "prefix applies to an address",
    ),
    (
        BASE + "    having: syns > 1000\n",
        7,
        "having",
        "unknown aggregate 'syns' (the query's aggregates: count)",
    ),
    (BASE + "    having: count\n", 7, "having", "a condition must compare"),
    (BASE + '    having: "count > 1; import os"\n', 7, "having", "unexpected character ';'"),
    (
        BASE + "    alerts:\n      - {name: flood, when: syns > 1}\n",
        7,
        "alerts",
        "alert 'flood' (#0) when: unknown aggregate",
    ),
    (
        BASE + "    alerts:\n      - {name: flood, when: count > 1, severity: loud}\n",
        8,
        "alerts.0.severity",
        "Input should be",
    ),
    (
        BASE + "    alerts:\n      - {name: flood, when: count > 1, labels: {src_ip: x}}\n",
        2,
        "query",
        "clash with the group-by columns",
    ),
    (
        BASE + "    alerts:\n      - {name: a, when: count > 1}\n      - {name: a, when: count > 2}\n",
        7,
        "alerts",
        "duplicate alert names",
    ),
    # holistic aggregates (count_distinct, quantiles, top): parameters checked, one per query
    (
        BASE.replace(
            "{fn: count}", "{fn: count_distinct, field: dst_ip}\n      - {fn: top, field: dst_port, k: 3}"
        ),
        4,
        "aggregates",
        "at most one holistic aggregate",
    ),
    _agg("{fn: count_distinct, field: dst_ip, k: 3}", "'k' is a parameter of top, not of count_distinct"),
    _agg("{fn: count_distinct, field: dst_ip, colour: 3}", "unknown field", "aggregates.0.colour"),
    _agg("{fn: quantiles, field: length, q: [0.5, 1.5]}", "quantile 1.5 is outside (0, 1)"),
    _agg("{fn: quantiles, field: length, q: [0]}", "outside (0, 1)"),
    _agg("{fn: quantiles, field: length}", "needs q"),
    _agg("{fn: quantiles, field: src_ip, q: [0.5]}", "numeric field"),
    _agg("{fn: count_distinct, field: dst_ip, approx: hll, precision: 3}", "precision must be 4..18"),
    _agg("{fn: count_distinct, field: dst_ip, approx: hll, precision: 19}", "precision must be 4..18"),
    _agg("{fn: count_distinct, field: dst_ip, precision: 12}", "precision applies to approx: hll"),
    _agg("{fn: count_distinct, field: dst_ip, approx: kmv}", "Input should be", "aggregates.0.approx"),
    _agg("{fn: top, field: dst_ip, k: 0}", "k >= 1"),
    _agg("{fn: top, field: dst_ip, k: 5, by: src_ip}", "top by needs a numeric field"),
    _agg("{fn: top, field: src_ip, k: 5}", "clashes with a group-by column", "query", 2),
    _agg("{fn: top, field: dst_ip, k: 5, capacity: 4}", "top capacity must be an integer k (5) .. 1000000"),
    _agg("{fn: top, field: dst_ip, k: 5, capacity: 2000000}", "top capacity must be"),
    _agg(
        "{fn: top, field: dst_ip, k: 5, capacity: 10.5}",
        "Input should be a valid integer",
        "aggregates.0.capacity",
    ),
    _agg("{fn: count, capacity: 10}", "'capacity' is a parameter of top"),
    (
        BASE.replace("{fn: count}", "{fn: quantiles, field: length, q: [0.5], as: len}")
        + "    having: len > 1\n",
        7,
        "having",
        "unknown aggregate 'len' (the query's aggregates: len_p50)",
    ),
]


def test_holistic_names_work_in_having_alerts_and_export() -> None:
    doc = BASE.replace("{fn: count}", "{fn: count}\n      - {fn: count_distinct, field: dst_ip, as: dsts}")
    doc += "    having: dsts > 100 and count > 5\n    alerts:\n      - {name: scan, when: dsts >= 1000}\n"
    doc += "    export: {by: dsts}\n"
    q = Q.load_text(doc).queries[0]
    assert Q.result_names(q) == ["count", "dsts"] and Q.key_width(q) == 4 and Q.partition_width(q) == 2
    doc = BASE.replace("{fn: count}", "{fn: quantiles, field: length, q: [0.5, 0.99], as: len}")
    q = Q.load_text(doc + "    having: len_p99 > 1000\n").queries[0]
    assert Q.result_names(q) == ["len_p50", "len_p99"]


@pytest.mark.parametrize(("doc", "line", "field", "reason"), MALFORMED)
def test_malformed_configs_are_rejected_precisely(
    doc: str, line: int | None, field: str, reason: str
) -> None:
    with pytest.raises(Q.ConfigError) as info:
        Q.load_text(doc, "bad.yaml")
    err = info.value
    assert err.file == "bad.yaml"
    if line is not None:
        assert err.line == line, str(err)
    assert field in err.field, str(err)
    assert reason in err.reason, str(err)
    assert str(err).startswith("bad.yaml")


def test_range_not_a_multiple_of_slide_uses_gcd_panes() -> None:
    """The dissertation's RANGE 9 / SLIDE 6: panes of 3, 3 panes per window, windows every 2 panes."""
    w = Q.load_text(BASE.replace("{range: 1m}", "{range: 9m, slide: 6m}")).queries[0].window
    assert (w.pane_ns, w.panes_per_window, w.panes_per_slide) == (180 * Q.NS, 3, 2)
    w = Q.load_text(BASE.replace("{range: 1m}", "{range: 1m, slide: 10s}")).queries[0].window
    assert (w.pane_ns, w.panes_per_window, w.panes_per_slide) == (10 * Q.NS, 6, 1)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(Q.ConfigError, match="cannot read"):
        Q.load(tmp_path / "nope.yaml")


def test_durations() -> None:
    assert Q.parse_duration_ns("500ms") == 500_000_000
    assert Q.parse_duration_ns("1m") == 60 * Q.NS
    assert Q.parse_duration_ns(2) == 2 * Q.NS
    with pytest.raises(ValueError):
        Q.parse_duration_ns("ten seconds")


@pytest.mark.parametrize("expr", FILTERS)
def test_compiled_filter_matches_reference_interpreter(expr: str) -> None:
    """The filter as generated Numba statements (what the kernel runs) against filterlang.evaluate."""
    prog = compile_filter(expr)
    rng = np.random.default_rng(zlib.crc32(expr.encode()))  # str hash() is salted per process
    rows = np.zeros((500, F.NFIELDS), dtype=np.int64)
    v4 = rng.random(500) < 0.7
    rows[:, F.IPVER] = np.where(v4, 4, 6)
    choices4 = [F.ip_to_words(a)[1] for a in ("10.1.2.3", "10.9.9.9", "192.168.4.4", "8.8.8.8")]
    choices6 = [F.ip_to_words(a) for a in ("2001:db8::1", "2001:db9::1", "fe80::1")]
    for col_hi, col_lo in ((F.SRC_HI, F.SRC_LO), (F.DST_HI, F.DST_LO)):
        pick4 = rng.integers(0, len(choices4), 500)
        pick6 = rng.integers(0, len(choices6), 500)
        rows[:, col_lo] = np.where(v4, np.array(choices4)[pick4], [F.to_int64(choices6[p][1]) for p in pick6])
        rows[:, col_hi] = np.where(v4, 0, [F.to_int64(choices6[p][0]) for p in pick6])
    rows[:, F.PROTO] = rng.choice([1, 6, 17], 500)
    rows[:, F.TCP_FLAGS] = rng.choice([2, 16, 18, 0], 500)
    rows[:, F.SPORT] = rng.choice([22, 53, 1000, 5000], 500)
    rows[:, F.DPORT] = rng.choice([53, 80, 443, 8080], 500)
    rows[:, F.TTL] = rng.integers(1, 255, 500)
    rows[:, F.LEN] = rng.integers(60, 1500, 500)
    rows[:, F.TOS] = rng.choice([0, 0, 46 << 2], 500)
    rows[:, F.VLAN] = rng.choice([0, 10], 500)
    accept = predicate(prog)
    got = [accept(r) for r in rows]
    want = [evaluate(prog, r) for r in rows]
    assert got == want
    assert 0 < sum(want) < len(want), "the sample should exercise both outcomes"


@pytest.mark.parametrize(
    "bad",
    [
        "foo == 1",
        "src_ip > 3",
        "protocol ==",
        "(protocol == 6",
        "ttl == 10.0.0.1",
        "src_ip",
        "dst_port in [1, 10.0.0.0/8]",
        "exec('x')",
        "1 +",
        "ttl = 3",
    ],
)
def test_bad_filters(bad: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(bad)


def test_sources_select_the_capture_hosts_that_run_a_query() -> None:
    """`sources` are host-id patterns: the agent runs only its matching queries, and the job expects only
    matching hosts for a query (an expected host that does not run it would hold it open forever)."""
    from high_level.aggregate.processor import PartitionProcessor, Settings
    from high_level.aggregate.rollup import Layout

    cfg = Q.load_text("""
queries:
  - name: edge
    sources: ["edge-*", "core-1/*"]
    aggregates: [{fn: count}]
    window: {range: 10s}
  - name: everywhere
    aggregates: [{fn: count}]
    window: {range: 10s}
""")
    edge, everywhere = cfg.query("edge"), cfg.query("everywhere")
    assert (
        edge.runs_on("edge-7")
        and edge.runs_on("core-1/w0")
        and not edge.runs_on("core-1")
        and not edge.runs_on("lab")
    )
    assert everywhere.sources == ["*"] and everywhere.runs_on("lab")
    p = PartitionProcessor(
        [Layout.of(edge), Layout.of(everywhere)],
        0,
        Settings(host_timeout_ms=10_000, expected_hosts=("edge-1", "lab")),
    )
    assert p.queries["edge"].meld.expected == ("edge-1",)
    assert p.queries["everywhere"].meld.expected == ("edge-1", "lab")
    with pytest.raises(Q.ConfigError, match="host-id glob pattern"):
        Q.load_text(
            "queries:\n  - {name: x, sources: ['a b'], aggregates: [{fn: count}], window: {range: 10s}}\n"
        )
    with pytest.raises(Q.ConfigError, match="sources"):
        Q.load_text("queries:\n  - {name: x, sources: [], aggregates: [{fn: count}], window: {range: 10s}}\n")
