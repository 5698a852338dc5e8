"""The seeds' join experiments at a tiny scale (``benchmarks/bench_band_join.py``, ``bench_late_join.py``):
every plan's window counts equal the brute-force count, and the memory ordering the figures rest on holds
(OA below OPIB below OPOB; OOP below IOP once C is late, equal when it is not). Virtual time: no load
sensitivity. A few seconds."""

from __future__ import annotations

from benchmarks import bench_band_join as band
from benchmarks import bench_late_join as late


def _exact(r: dict, oracle: dict[int, int]) -> bool:
    return {k: n for k, n in r.pop("_counts").items() if n} == oracle


def test_band_join_plans_exact_and_ordered_by_memory() -> None:
    data = band.streams(14, seed=7, rate=1000, flows=500)
    oracle = band.oracle(*data, 2 * band.NS)
    rows = {v: band.run(v, 2, data, 14) for v in band.VARIANTS}
    assert all(_exact(r, oracle) for r in rows.values())
    assert sum(oracle.values()) > 10_000
    assert rows["OA"]["peak_rows"] < rows["OPIB"]["peak_rows"] < rows["OPOB"]["peak_rows"]
    assert rows["OA"]["latency_median_s"] == rows["OPOB"]["latency_median_s"] == 2.0  # the band is the floor


def test_late_join_oop_holds_less_than_iop_when_c_is_late() -> None:
    data = late.data(12, seed=7, rate=1000, flows=500)
    oracle = late.oracle(data)
    on_time = {v: late.run(v, 0, data, 12) for v in late.VARIANTS}
    delayed = {v: late.run(v, 4, data, 12) for v in late.VARIANTS}
    assert all(_exact(r, oracle) for r in (*on_time.values(), *delayed.values()))
    assert on_time["OOP"]["peak_rows"] == on_time["IOP"]["peak_rows"]
    assert delayed["OOP"]["peak_rows"] < 0.8 * delayed["IOP"]["peak_rows"]
    assert delayed["OOP"]["late_rows"] == delayed["IOP"]["late_rows"] == 0
