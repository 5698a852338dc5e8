"""The generated (per query-set) kernel: one host running queries of every shape at once stays exact,
and the generated module is keyed by exactly what its code depends on."""

from __future__ import annotations

from low_level import codegen
from low_level.kernel import Kernel
from low_level.tables import Tables
from tests.packets import make_traffic, merge_partials, oracle
from tests.test_subaggregate import NS, T0, make_query, run_kernel


def mixed_queries() -> list:
    """Five queries whose generated code differs in every specialised part."""
    return [
        make_query("lazy", 1024, name="pairs"),  # two whole addresses, count + sum
        make_query("slow", 128, name="nets", group="[dst_ip/24]", aggs="[{fn: sum, field: length, as: b}]"),
        make_query("iop", 64, name="syn_ports", group="[dst_port]", aggs="[{fn: count, as: n}]",
                   flt="protocol == tcp and tcp_flags & SYN"),
        make_query("lazy", 16, name="total", group="[]",
                   aggs="[{fn: count, as: n}, {fn: min, field: ttl, as: lo}, {fn: max, field: length, as: hi}]"),
        make_query("slow", 256, name="proto_src", group="[protocol, src_port]", window="{range: 4s, slide: 2s}",
                   aggs="[{fn: max, field: ttl, as: hi}]", i=3),
    ]


def test_one_pass_over_mixed_query_shapes_is_exact() -> None:
    queries = mixed_queries()
    traffic = make_traffic(30_000, 1500, T0, 20 * NS, seed=11)
    recs = run_kernel(queries, traffic)
    for i, q in enumerate(queries):
        got = merge_partials(q, *Tables.build([q]).split(0, recs[i]))
        assert got.equals(oracle(q, traffic)), q.name


def test_generated_text_is_a_function_of_shape_only() -> None:
    small, big = Tables.build([make_query("lazy", 64)]), Tables.build([make_query("lazy", 4096, m=5, i=9)])
    assert codegen.kernel_source(codegen.shape_of(small)) == codegen.kernel_source(codegen.shape_of(big))
    assert Kernel(small).compiled is Kernel(big).compiled  # table size, m and i are run-time parameters
    other = Tables.build([make_query("slow", 64)])
    assert codegen.kernel_source(codegen.shape_of(other)) != codegen.kernel_source(codegen.shape_of(small))
    text = codegen.kernel_source(codegen.shape_of(Tables.build(mixed_queries())))
    assert "built against sources" in text and "def aggregate_q4(" in text
    compile(text, "<generated>", "exec")  # valid Python


def test_generated_modules_live_in_the_configured_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOWWATER_KERNEL_CACHE", str(tmp_path))
    assert codegen.cache_dir() == tmp_path
    monkeypatch.setattr(codegen, "_MODULES", {})
    mod = codegen.load(Tables.build([make_query("lazy", 64, group="[dst_port, protocol]")]))
    assert mod.__file__ is not None and mod.__file__.startswith(str(tmp_path))
