"""The generated (per query-set) kernel: one host running queries of every shape at once stays exact,
and the generated module is keyed by exactly what its code depends on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from low_level.jit import cache as jitcache
from low_level.kernel import codegen
from low_level.kernel.fused import Kernel
from low_level.kernel.tables import Tables
from lowwater_testing.capture import make_query, run_kernel
from lowwater_testing.traffic import NS, T0, make_traffic, merge_partials, oracle


def mixed_queries() -> list:
    """Five queries whose generated code differs in every specialised part."""
    return [
        make_query("lazy", 1024, name="pairs"),  # two whole addresses, count + sum
        make_query("slow", 128, name="nets", group="[dst_ip/24]", aggs="[{fn: sum, field: length, as: b}]"),
        make_query(
            "iop",
            64,
            name="syn_ports",
            group="[dst_port]",
            aggs="[{fn: count, as: n}]",
            flt="protocol == tcp and tcp_flags & SYN",
        ),
        make_query(
            "lazy",
            16,
            name="total",
            group="[]",
            aggs="[{fn: count, as: n}, {fn: min, field: ttl, as: lo}, {fn: max, field: length, as: hi}]",
        ),
        make_query(
            "slow",
            256,
            name="proto_src",
            group="[protocol, src_port]",
            window="{range: 4s, slide: 2s}",
            aggs="[{fn: max, field: ttl, as: hi}]",
            i=3,
        ),
    ]


def assert_one_pass_exact(queries: list, traffic) -> None:
    """Run all queries in one generated pass; each query's merged partials equal its own oracle."""
    recs = run_kernel(queries, traffic)
    for i, q in enumerate(queries):
        got = merge_partials(q, *Tables.build([q]).split(0, recs[i]))
        assert got.equals(oracle(q, traffic)), (q.name, q.filter)


def test_one_pass_over_mixed_query_shapes_is_exact() -> None:
    assert_one_pass_exact(mixed_queries(), make_traffic(30_000, 1500, T0, 20 * NS, seed=11))


def test_generated_text_is_a_function_of_shape_only() -> None:
    small, big = Tables.build([make_query("lazy", 64)]), Tables.build([make_query("lazy", 4096, m=5, i=9)])
    assert codegen.kernel_source(codegen.shape_of(small)) == codegen.kernel_source(codegen.shape_of(big))
    assert Kernel(small).compiled is Kernel(big).compiled  # table size, m and i are run-time parameters
    other = Tables.build([make_query("slow", 64)])
    assert codegen.kernel_source(codegen.shape_of(other)) != codegen.kernel_source(codegen.shape_of(small))
    text = codegen.kernel_source(codegen.shape_of(Tables.build(mixed_queries())))
    assert "def aggregate_q4(" in text
    compile(text, "<generated>", "exec")  # valid Python


def test_generated_modules_live_in_the_source_keyed_cache() -> None:
    mod = Kernel(Tables.build([make_query("lazy", 64, group="[dst_port, protocol]")])).compiled
    assert mod.__file__ is not None
    assert Path(mod.__file__).parent == jitcache.directory() / "generated"
    assert jitcache.directory().name == f"jit-{jitcache.sources_digest()}"


def test_a_changed_source_gets_a_fresh_cache(tmp_path: Path) -> None:
    """Numba checks only a function's own file; any change under low_level/ or contract/ must change
    the cache directory, or kernels would run machine code compiled against old constants."""
    import shutil

    root = Path(jitcache.__file__).resolve().parents[2]
    for pkg in ("low_level", "contract"):
        shutil.copytree(root / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from low_level.jit import cache as jitcache; print(jitcache.sources_digest())"
    before = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert before.stdout.strip() == jitcache.sources_digest()
    with (tmp_path / "low_level" / "kernel" / "tables.py").open("a") as f:
        f.write("\n# a comment is enough\n")
    after = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert after.stdout.strip() != before.stdout.strip()


def test_every_filter_form_in_one_generated_pass() -> None:
    """Eight filters as eight queries of one host: each query's statements (named apart by query) select
    exactly the packets the reference interpreter accepts."""
    from lowwater_testing.queries import FILTERS

    queries = [
        make_query("lazy", 256, name=f"f{i}", group="[dst_port]", aggs="[{fn: count, as: n}]", flt=f)
        for i, f in enumerate(FILTERS)
    ]
    assert_one_pass_exact(queries, make_traffic(20_000, 800, T0, 10 * NS, seed=12))


def test_the_agent_compiles_its_kernel_before_capture_starts() -> None:
    """A live source must not drop packets while the first packet waits for the compiler."""
    from low_level.host.agent import Agent
    from lowwater_testing.capture import RecordingProducer

    agent = Agent(
        [make_query("slow", 128, name="warm", group="[src_port]")],
        None,
        "h",
        None,
        ring_slots=1 << 10,
        producer=RecordingProducer(),
    )
    compiled = agent.kernel.compiled
    assert compiled.process_frames.signatures and compiled.process_arrays.signatures
    assert agent.kernel.hc[0] == 0 and agent.ring.fill == 0  # nothing was consumed or counted


def test_the_lean_parser_serves_queries_that_read_no_extra_column() -> None:
    """Columns only the full parser writes (MACs, TCP window, ICMP, MPLS, ethertype) cost nothing
    unless some query of the host reads one: in a filter, a key or an aggregate."""

    def parser(*queries) -> str:
        text = codegen.kernel_source(codegen.shape_of(Tables.build(list(queries))))
        lean = "parse_frame_lean(frames" in text
        # the lean kernel's block of rows has the short stride: only the columns its parser writes
        assert ("NF = 15 " in text) == lean and ("NF = F.NFIELDS " in text) == (not lean)
        return "parse_frame_lean(" if lean else "parse_frame("

    assert parser(*mixed_queries()) == "parse_frame_lean("
    assert (
        parser(make_query("lazy", 64), make_query("lazy", 64, name="w", flt="tcp_window == 0"))
        == "parse_frame("
    )
    assert parser(make_query("lazy", 64, group="[src_mac]")) == "parse_frame("
    assert (
        parser(make_query("lazy", 64, group="[]", aggs="[{fn: max, field: icmp_type, as: t}]"))
        == "parse_frame("
    )
    assert parser(make_query("lazy", 64, flt="src_ip in [10.0.0.0/8] and dscp > 3")) == "parse_frame_lean("
