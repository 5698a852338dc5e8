"""Results as Prometheus series: the last closed window's top groups of every query with ``export``.

Why in the job: it is where a window becomes final, so a series is never a half-arrived window. The
store hands each batch's stored rows to :meth:`ResultExporter.observe`; a scrape of the job's
``/metrics`` then yields, per exported query,

* ``lowwater_job_result{query, aggregate, <group-by columns>}``: the top ``export.top`` groups by
  ``export.by`` of the newest closed window, one series per group and aggregate;
* ``lowwater_job_result_all_groups{query, aggregate}``: the aggregate over every group of that window
  (sum for count/sum, min/max for min/max; avg has no total);
* ``lowwater_job_result_window_end_timestamp_seconds{query}``: which window those are (its end).

The samples carry no timestamp of their own (Prometheus stamps them at the scrape): an explicit
timestamp turns off staleness handling, so a group that left the top N lingered ~5 minutes, and
samples stamped over an hour back were refused. A graph lags the traffic by the window's close
delay; the window end series says by how much. Cardinality is bounded by ``top`` x aggregates per
query: a new window replaces the old series, it does not add to them. Scrape at least once per
exported window (``deploy/prometheus/prometheus.yml``), or windows go unseen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import GaugeMetricFamily

from contract import aggregates as A
from contract import query as Q
from contract import results as R


@dataclass(frozen=True)
class _Window:
    end_ms: int
    top: pa.Table  # key columns + aggregate columns, at most ``top`` rows
    totals: dict[str, float]


class ResultExporter:
    """Keeps the newest closed window per exported query; a prometheus_client collector."""

    def __init__(self, queries: Sequence[Q.QuerySpec]) -> None:
        self.queries = {q.name: q for q in queries if q.export is not None}
        self._last: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def observe(self, q: Q.QuerySpec, rows: pa.Table) -> None:
        """Rows the store just wrote for ``q``: keep the newest window's final rows, if newer."""
        got = self.summarize(q, rows)
        if got is not None:
            self.merge(q, [got])

    def summarize(self, q: Q.QuerySpec, rows: pa.Table) -> tuple[int, pa.Table, dict[str, float]] | None:
        """(end ms, top groups, totals) of the newest window among ``rows``' finals, None if none: what a
        Spark task sends the driver instead of its rows (high_level/results/tasks.py)."""
        spec = q.export
        if spec is None or q.name not in self.queries or rows.num_rows == 0:
            return None
        final = rows.filter(pc.equal(rows["kind"], "final"))
        if final.num_rows == 0:
            return None
        end_us = final["window_end"].cast(pa.int64())
        newest = pc.max(end_us).as_py()
        win = final.filter(pc.equal(end_us, newest))
        aggs = R.aggregate_columns(q)
        keys = [n for n, _ in R.key_columns(q)]
        totals: dict[str, float] = {}
        for a, fn in aggs:
            total = A.RESULT_KINDS[fn].total  # a pyarrow.compute function, if the kind has a total
            if total is not None:
                v = getattr(pc, total)(win[a]).as_py()
                if v is not None or total == "sum":
                    totals[a] = float(v or 0)
        return newest // 1000, self._top(q, win.select(keys + [a for a, _ in aggs])), totals

    def _top(self, q: Q.QuerySpec, win: pa.Table) -> pa.Table:
        spec = q.export
        assert spec is not None
        by = spec.by or R.aggregate_columns(q)[0][0]
        order = np.argsort(
            -np.nan_to_num(win[by].to_numpy(zero_copy_only=False).astype(np.float64), nan=-np.inf),
            kind="stable",
        )[: spec.top]
        return win.take(pa.array(order))

    def merge(self, q: Q.QuerySpec, parts: Sequence[tuple[int, pa.Table, dict[str, float]]]) -> None:
        """Keep the newest window of ``parts`` (summaries of disjoint groups: each task's, or one
        batch's), if not older than the one kept: its top groups over all parts, totals folded."""
        if not parts or q.name not in self.queries:
            return
        newest = max(p[0] for p in parts)
        mine = [p for p in parts if p[0] == newest]
        totals: dict[str, float] = {}
        for a, fn in R.aggregate_columns(q):
            vals = [p[2][a] for p in mine if a in p[2]]
            if vals:
                total = A.RESULT_KINDS[fn].total
                totals[a] = min(vals) if total == "min" else max(vals) if total == "max" else float(sum(vals))
        top = self._top(q, pa.concat_tables([p[1] for p in mine]))
        with self._lock:
            prev = self._last.get(q.name)
            if prev is None or prev.end_ms <= newest:
                self._last[q.name] = _Window(newest, top, totals)

    def describe(self) -> list:
        return []  # do not let the registry call collect() at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            last = dict(self._last)
        values = GaugeMetricFamily(
            "lowwater_job_result",
            "Top groups of the newest closed window of an exported query",
        )
        totals = GaugeMetricFamily(
            "lowwater_job_result_all_groups",
            "An aggregate over every group of the newest closed window of an exported query",
        )
        ends = GaugeMetricFamily(
            "lowwater_job_result_window_end_timestamp_seconds",
            "End of the window the result series of an exported query are of",
            labels=["query"],
        )
        for name, w in sorted(last.items()):
            q = self.queries[name]
            keys = [n for n, _ in R.key_columns(q)]
            cols = {c: w.top[c].to_pylist() for c in w.top.column_names}
            for a, _fn in R.aggregate_columns(q):
                for i in range(w.top.num_rows):
                    v = cols[a][i]
                    if v is None:
                        continue
                    labels = {"query": name, "aggregate": a, **{k: str(cols[k][i]) for k in keys}}
                    values.add_sample("lowwater_job_result", labels, float(v))
                if a in w.totals:
                    totals.add_sample(
                        "lowwater_job_result_all_groups", {"query": name, "aggregate": a}, w.totals[a]
                    )
            ends.add_metric([name], w.end_ms / 1000)
        yield values
        yield totals
        yield ends
