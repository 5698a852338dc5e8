"""The results page in a real headless Chromium against the real API (uvicorn in a subprocess).

Fixture data as in tests/test_api.py. The page is rendered with ``--dump-dom`` (the DOM after the
scripts ran: query cards, top-N rows, SVG charts, host table) and with ``--screenshot``; the
screenshot is kept as ``benchmarks/results/results_page.png``. Needs the Debian ``chromium`` package
(``./lw setup`` installs it); skipped, saying so, when it is not there.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from lowwater_testing.page import CHROMIUM, REPO, chromium, serve_api, stop
from lowwater_testing.store import Store, make_store, write_flagged

ARTIFACT = REPO / "benchmarks" / "results" / "results_page.png"
TOKEN = "page-token"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium, or ./lw setup)"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = make_store(tmp_path_factory.mktemp("page") / "results")
    # a q4_pairs window whose every record a capture host shed: no rows, flagged all the same
    write_flagged(s.root, "q4_pairs", s.first - timedelta(minutes=1), 60, "cap-b", 1234)
    return s


@pytest.fixture(scope="module")
def server(store: Store) -> Iterator[str]:
    proc, base = serve_api(store)
    try:
        yield base
    finally:
        stop(proc)


def test_page_renders_queries_top_rows_chart_and_hosts(server: str, tmp_path: Path) -> None:
    out = chromium(f"{server}/ui", tmp_path / "profile", "--dump-dom")
    dom = out.stdout
    assert "<html" in dom, out.stderr[-2000:]
    for name in ("q4_pairs", "bytes_per_dst24", "syn_per_port", "avg_only"):
        assert f'id="q-{name}"' in dom, name
    # ten top-N rows per query (avg_only has only six groups), with the fixture's addresses
    assert dom.count('class="top-row"') == 10 + 5 + 6 + 6
    assert "2001:db8:aa::" in dom and "10.0.0.1" in dom
    assert len(re.findall(r'<svg class="chart"', dom)) == 4
    assert dom.count('class="line"') == 4 and 'class="area"' in dom
    # q4_pairs' two incomplete windows are hatched points saying why (a dead host, late partials)
    assert dom.count('class="dot incomplete"') == 2
    assert (
        "incomplete: 1 of 2 capture hosts had not passed the window" in dom
        and "3 late partial records" in dom
    )
    # ... and the window whose every record was shed is a hatched mark on the axis, saying so
    assert dom.count('class="dot incomplete empty"') == 1
    assert "no rows: every record of this window was shed or lost; 1,234 records shed" in dom
    assert "1 flagged short (shed or lost records), 1 with no rows" in dom
    assert "cap-a" in dom and "cap-b" in dom and "dot-dead" in dom and "dot-live" in dom
    assert 'id="error" style="display: none;"' in dom or "Could not refresh" not in dom


def test_page_screenshot_artifact(server: str, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    out = chromium(f"{server}/ui", tmp_path / "profile", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10_000, out.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)


def test_page_root_and_token_from_the_url_fragment(store: Store, tmp_path: Path) -> None:
    proc, base = serve_api(store, token=TOKEN)
    try:
        locked = chromium(f"{base}/", tmp_path / "p1", "--dump-dom").stdout
        assert 'id="auth" style="display: block;"' in locked and 'class="top-row"' not in locked
        dom = chromium(f"{base}/ui#token={TOKEN}", tmp_path / "p2", "--dump-dom").stdout
        assert 'id="q-q4_pairs"' in dom and 'class="top-row"' in dom and '<svg class="chart"' in dom
    finally:
        stop(proc)
