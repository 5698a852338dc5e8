"""bench_scaling's figures from its rows (pure logic, no Spark): repeats give medians and their spread, and a
missed efficiency goal is set against the machine's own ceiling (benchmarks/cpuref.py)."""

from __future__ import annotations

import pytest

from benchmarks.bench_scaling import _conf, executor_model, summarize


def _row(w: int, p: int, exec_cpu: float, rep: int, rate: int = 1_000_000) -> dict:
    return {
        "kind": "scale",
        "workers": w,
        "partitions": p,
        "rep": rep,
        "batches": 3,
        "first_batch_records": 1_000_000,
        "sustained_records": 2_000_000,
        "sustained_records_per_s": rate,
        "executor_cpu_seconds": exec_cpu,
        "driver_cpu_seconds": 0.5,
        "sustained_driver_cpu_seconds": 0.2,
        "executor_cores_busy": 1.0 + rep,
        "machine_cores_busy": 1.2,
    }


HEAD = {"machine": {"cores": 2}, "load_avg": [1.0, 2.0]}


def test_repeats_give_medians_and_runs() -> None:
    rows = [
        _row(1, 1, 3.0, 0),  # 1.0M records per executor CPU-s
        _row(2, 2, 4.0, 0),  # 0.75M
        _row(1, 1, 3.0, 1),
        _row(2, 2, 3.0, 1),  # 1.0M
        _row(1, 1, 3.0, 2),
        _row(2, 2, 3.75, 2),  # 0.8M
    ]
    res = summarize(rows, dict(HEAD))
    assert res["records_per_executor_cpu_s_runs"]["w2_p2"] == [750_000, 1_000_000, 800_000]
    assert res["records_per_executor_cpu_s"]["w2_p2"] == 800_000  # the median, not the last run
    assert res["per_cpu_efficiency_p2"] == 0.8
    assert res["per_cpu_efficiency_p2_runs"] == [0.75, 1.0, 0.8]
    assert res["executor_cores_busy"] == {"w1_p1": 2.0, "w2_p2": 2.0}


def test_efficiency_gap_names_the_machine_ceiling() -> None:
    ref = {
        "memory": {"per_cpu_efficiency_2_vs_1": 0.85},
        "compute": {"per_cpu_efficiency_2_vs_1": 0.97},
    }
    rows = [_row(1, 1, 3.0, 0), _row(2, 2, 3.75, 0)]
    gap = summarize(rows, {**HEAD, "machine_per_cpu_efficiency": ref})["goal_gaps"]["per_cpu_efficiency_p2"]
    assert gap["measured"] == 0.8
    assert gap["machine_ceiling"] == {"memory": 0.85, "compute": 0.97}
    assert gap["of_machine_ceiling"] == round(0.8 / 0.85, 3)
    assert "benchmarks/cpuref.py" in gap["why"]
    met = summarize([_row(1, 1, 3.0, 0), _row(2, 2, 3.1, 0)], dict(HEAD))["goal_gaps"]
    assert "per_cpu_efficiency_p2" not in met


def test_spark_conf_flag() -> None:
    assert _conf("spark.a.b=1=2") == ("spark.a.b", "1=2")
    with pytest.raises(Exception, match="KEY=VALUE"):
        _conf("spark.a.b")


def test_executor_model_splits_fixed_and_per_record_cost() -> None:
    """E = tasks x f + records x c from a small-batch and a large-batch run: f = 0.5 CPU-s per task and
    batch, c = 1 CPU-s per million; (2, 2) doubles the tasks, so at 1M-record batches 1.5 / 2 = 0.75."""
    plan = {**_row(1, 1, 10 * 0.5 + 1.0, 0), "kind": "plan", "queries": 1, "batches": 10}
    plan.update(first_batch_records=100_000, sustained_records=900_000, batch_records=100_000)
    big = {**_row(1, 1, 3 * 0.5 + 3.0, 0), "batch_records": 1_000_000}
    out = executor_model([plan, big])
    assert out["executor_fixed_cpu_s_per_task_batch"] == 0.5
    assert out["executor_cpu_s_per_million_records"] == 1.0
    assert out["per_cpu_efficiency_p2_from_fixed_costs"] == 0.75
    assert executor_model([big]) == {}  # no small-batch run: nothing to split
