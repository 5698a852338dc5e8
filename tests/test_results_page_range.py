"""The results page over long ranges in a real headless Chromium against the real API (uvicorn).

A ~60-day store (lowwater_testing/rangestore.py): the time-range picker from the URL hash (relative
and absolute), the step chosen from the range, top groups over the range, one line per selected group,
and drill-down by a click on a bucket and by a drag (real mouse events sent by the page's
``#demo_click`` / ``#demo_drag`` hooks, since ``--dump-dom`` cannot move a mouse). The 30-day view is
kept as ``benchmarks/results/results_page_range.png``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from lowwater_testing.page import CHROMIUM, REPO, chromium, serve_api, stop
from lowwater_testing.rangestore import RangeStore, make_range_store, with_tiers, write_tier

ARTIFACT = REPO / "benchmarks" / "results" / "results_page_range.png"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium, or ./lw setup)"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RangeStore:
    return make_range_store(tmp_path_factory.mktemp("page_range") / "results")


@pytest.fixture(scope="module")
def server(store: RangeStore) -> Iterator[str]:
    proc, base = serve_api(store)  # type: ignore[arg-type]
    try:
        yield base
    finally:
        stop(proc)


def _card(dom: str, name: str) -> str:
    i = dom.index(f'id="q-{name}"')
    j = dom.find('<section class="card query"', i + 1)
    return dom[i : j if j > 0 else len(dom)]


def test_relative_30_days_with_the_top_3_groups_charted(server: str, tmp_path: Path) -> None:
    dom = chromium(f"{server}/ui#range=30d&groups=3", tmp_path / "p", "--dump-dom", budget_ms=8000).stdout
    assert 'class="rbtn active">30d<' in dom
    c = _card(dom, "bytes_per_dst24")
    assert "per 3h step" in c and "tier raw" in c and "3 selected groups" in c  # 30 d / 240 points -> 3 h
    assert c.count('class="line group-line"') == 3 and c.count('class="lg"') == 3
    assert c.count('class="range-row selected"') == 3 and "top 10 over the range by bytes" in c
    q4 = _card(dom, "q4_pairs")
    assert q4.count('class="line group-line"') == 3 and "per 3h step" in q4
    # a query without count/sum has no range top, but still a chart
    assert "needs a count or sum aggregate" in _card(dom, "avg_only")
    assert "Could not refresh" not in dom


def test_absolute_range_picks_a_finer_step_and_total_line(
    server: str, store: RangeStore, tmp_path: Path
) -> None:
    day = _busy_day(store)
    url = f"{server}/ui#from={day.isoformat()}&to={(day + timedelta(days=1)).isoformat()}"
    dom = chromium(url, tmp_path / "p", "--dump-dom", budget_ms=8000).stdout
    c = _card(dom, "bytes_per_dst24")
    assert "per 15m step" in c and 'data-zoom="drag"' in c  # 1 d / 240 -> 15 min (a multiple of 1 min)
    assert c.count('class="line"') == 1 and "group-line" not in c
    assert 'data-bucket="zoom"' in c and "range-row" in c


def _busy_day(store: RangeStore) -> pd.Timestamp:
    ws = store.rows["bytes_per_dst24"]["window_start"]
    days = ws.dt.floor("1D").value_counts()
    return days.index[0]


def test_click_on_a_bucket_drills_down(server: str, store: RangeStore, tmp_path: Path) -> None:
    day = _busy_day(store)
    first = store.rows["bytes_per_dst24"]["window_start"]
    first = first[(first >= day) & (first < day + timedelta(days=1))].min().floor("15min")
    url = f"{server}/ui#from={day.isoformat()}&to={(day + timedelta(days=1)).isoformat()}&demo_click=0"
    dom = chromium(url, tmp_path / "p", "--dump-dom", budget_ms=10000).stdout
    c = _card(dom, "bytes_per_dst24")
    assert "per 1m step" in c, c[:3000]  # the 15-min bucket, at 1-min windows
    note = re.search(r'id="range-note">([^<]*)<', dom).group(1)
    assert (
        note.startswith(first.strftime("%H:%M")) and (first + timedelta(minutes=15)).strftime("%H:%M") in note
    )
    assert ">zoom out<" in dom


def test_drag_zooms_to_the_dragged_span(server: str, store: RangeStore, tmp_path: Path) -> None:
    day = _busy_day(store)
    url = f"{server}/ui#from={day.isoformat()}&to={(day + timedelta(days=1)).isoformat()}&demo_drag=0.25,0.5"
    dom = chromium(url, tmp_path / "p", "--dump-dom", budget_ms=10000).stdout
    c = _card(dom, "bytes_per_dst24")
    assert "per 5m step" in c  # about 6 h dragged -> 5 min steps
    note = re.search(r'id="range-note">([^<]*)<', dom).group(1)
    a, b = (int(x[:2]) for x in re.findall(r"\d\d:\d\d", note)[:2])
    assert 5 <= a <= 7 and 11 <= b <= 13, note
    assert ">zoom out<" in dom


def test_range_page_screenshot_artifact(server: str, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    out = chromium(f"{server}/ui#range=30d&groups=3", tmp_path / "p", f"--screenshot={shot}", budget_ms=8000)
    assert shot.exists() and shot.stat().st_size > 10_000, out.stderr[-2000:]
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)


@pytest.fixture(scope="module")
def tiered_server(store: RangeStore) -> Iterator[tuple[str, RangeStore]]:
    """The same store with 1h/1d tiers written and raw windows kept 7 days (as a month's store holds
    them), served with that config (the other server's config has no tiers: it never reads them)."""
    from dataclasses import replace

    from contract.query import load

    cfg = with_tiers(store, "bytes_per_dst24", ["1h", "1d"], {"raw": "7d", "1h": "40d"})
    spec = {q.name: q for q in load(cfg).stored_queries}["bytes_per_dst24"]
    write_tier(store, spec, "1h", split=False)
    write_tier(store, spec, "1d", split=False)
    st = replace(store, config=cfg)
    proc, base = serve_api(st)  # type: ignore[arg-type]
    try:
        yield base, st
    finally:
        stop(proc)


def test_a_day_older_than_raw_retention_is_charted_in_tier_steps(
    tiered_server: tuple[str, RangeStore], tmp_path: Path
) -> None:
    """Raw windows are kept 7 days: a drill-down into a day 20 days back asks 1h steps (the finest
    tier kept there), where a raw 15-min step would chart windows the store no longer holds."""
    base, st = tiered_server
    ws = st.rows["bytes_per_dst24"]["window_start"]
    span = (ws < ws.max() - timedelta(days=15)) & (ws > ws.max() - timedelta(days=35))  # 1h kept 40 days
    old = ws[span].dt.floor("1D").value_counts().index[0]
    url = f"{base}/ui#from={old.isoformat()}&to={(old + timedelta(days=1)).isoformat()}&groups=2"
    dom = chromium(url, tmp_path / "p", "--dump-dom", budget_ms=8000).stdout
    c = _card(dom, "bytes_per_dst24")
    assert "per 1h step" in c and "2 selected groups" in c, c[:2000]
    assert c.count('class="line group-line"') == 2 and "Could not refresh" not in dom
