"""The product's shape, checked from its imports and sizes (issue #28): no import circle between modules, the
layer contracts of pyproject's ``[tool.importlinter]`` (the two levels never import each other, ``contract``
imports neither, the product never imports ``local_stack``, ``lowwater_testing``, ``tests`` or
``benchmarks``), and no product module over 600 lines. Pure and fast: it reads files, runs nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("contract", "low_level", "high_level")
MAX_LINES = 600
OVER_600_ALLOWED: set[str] = set()  # none: low_level/flows/decode.py is split per format (issue #29)


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative): each is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    circles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    circles.append(sorted(comp))
    return circles


def test_the_circle_finder_finds_a_circle_and_only_circles() -> None:
    g = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e")]:
        g.add_import(importer=a, imported=b)
    assert import_circles(g) == [["p.a", "p.b", "p.c"]]
    g.remove_import(importer="p.c", imported="p.a")
    assert import_circles(g) == []


def test_no_import_circle_between_product_modules() -> None:
    graph = grimp.build_graph(*PRODUCT, cache_dir=None)
    assert len(graph.modules) > 100  # the whole product was read, not an empty graph
    circles = import_circles(graph)
    loops = [
        (graph.find_shortest_chain(importer=c[0], imported=c[1]), graph.find_shortest_chain(c[1], c[0]))
        for c in circles
    ]
    assert circles == [], f"import circles: {circles}; each closes as (there, back): {loops}"


def test_layer_contracts() -> None:
    """pyproject's import-linter contracts; on failure its report (the offending import chains) is shown.

    In a child process: import-linter configures logging with ``dictConfig``, which disables every logger
    that exists already, and in-process that silenced the log records later tests assert on."""
    lint = Path(sys.executable).with_name("lint-imports")  # the console script of the same environment
    run = subprocess.run(
        [str(lint), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    out = run.stdout + run.stderr
    assert "Contracts: 3 kept, 0 broken." in out, out  # all three read and kept (a new one: update here)
    assert run.returncode == 0, out


def test_no_product_module_over_600_lines() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines())
        for pkg in PRODUCT
        for p in (REPO / pkg).rglob("*.py")
    }
    assert len(sizes) > 100
    over = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in OVER_600_ALLOWED}
    assert over == {}, f"split these modules (at most {MAX_LINES} lines): {over}"
