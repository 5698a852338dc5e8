"""The executors' half of the sink: each Spark task writes the closed rows it holds and hands the driver
a small summary instead of the rows.

Why: collecting every micro-batch's closed windows to the driver (``toArrow``) put every row through
one process: its Parquet encoding, HAVING, alerts, the export and the holistic second stage. Here the
task that ran the stateful step for a set of Kafka partitions writes their rows
(``part-<batch>-<task>.parquet``, :func:`contract.results.part_name`) with the same
:class:`high_level.results.store.ResultStore` code, per partition: HAVING and the holistic second stage
need nothing of another partition (a group, and a holistic group's sub-keys, are placed in one Kafka
partition by the agents). The driver then commits the batch (:meth:`high_level.results.sink.ResultSink.
commit`); until then the files are invisible, and a replay rewrites the same names.

With live values on, the task also publishes them (:mod:`high_level.live.publish`): every provisional
row it holds and the finals of the rows it wrote, with their tombstones, so the driver handles no row
of the live topics either.

What a task returns, in the packed schema (:data:`high_level.aggregate.packed.OUTPUT_DDL`): the rows it
did not write (status and flagged-window rows, and the rows of the queries the driver writes itself:
window totals, joins' feed, watchers) unchanged, plus

* one ``written`` row: JSON of the files, rows per query, HAVING drops, finals/corrections, the
  close time of each window end (the latency metric) and what it published live;
* an ``alerts`` row if a rule fired (its rows, :data:`contract.results.ALERT_SCHEMA`, as Arrow IPC);
* an ``export`` row per exported query: the newest window's top groups and totals of this task
  (:meth:`high_level.results.export.ResultExporter.summarize`), merged on the driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from contract import query as Q
from contract import results as R
from high_level.aggregate.packed import PACKED_COLUMNS, PACKED_SCHEMA, QueryWindows, unpack_windows
from high_level.kafkaclients import KafkaClients
from high_level.live.publish import LIVE_KINDS, LivePublisher, split_provisional
from high_level.results.export import ResultExporter
from high_level.results.store import ResultStore

WRITTEN_KIND, ALERTS_KIND, EXPORT_KIND = "written", "alerts", "export"  # a task's summary rows
SUMMARY_KINDS = (WRITTEN_KIND, ALERTS_KIND, EXPORT_KIND)


def ipc_bytes(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as wr:
        wr.write_table(t)
    return sink.getvalue().to_pybytes()


def ipc_table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def closed_windows(q: Q.QuerySpec, w: QueryWindows) -> int:
    """Final windows and groups of ``w`` (a holistic query's rows are (group, sub-key): groups count once)."""
    n = int(np.count_nonzero(w.final))
    if n and Q.holistic(q) is not None:
        n = len(
            np.unique(np.column_stack([w.window[w.final], w.key[w.final][:, : Q.group_width(q)]]), axis=0)
        )
    return n


def latest_close(end_ns: np.ndarray, closed_at_ms: np.ndarray) -> list[list[int]]:
    """[window end ns, its latest close ms] per window end: one latency observation each."""
    if not len(end_ns):
        return []
    last = pd.Series(closed_at_ms).groupby(end_ns, sort=False).max()
    return [[int(e), int(a)] for e, a in zip(last.index.tolist(), last.tolist(), strict=True)]


def _row(kind: str, query: str, task: int, status: str, data: bytes = b"") -> dict:
    """A summary row in the packed schema (its counts zero: it carries no windows)."""
    fixed = {"query": query, "partition": task, "kind": kind, "status": status, "data": data}
    return {c: fixed.get(c, 0) for c in PACKED_COLUMNS}


def write_task(
    root: str,
    queries: Sequence[Q.QuerySpec],
    batch_id: int,
    task: int,
    packed: pa.Table,
    local: frozenset[str],
    live: KafkaClients | None = None,
    producer: object = None,
) -> pa.Table:
    """Write the rows of the ``local`` queries in ``packed`` (one task's output) as the task's files;
    returns the rest of ``packed`` and the summary rows (module docstring). With ``live`` (or a
    ``producer``, tests), publish the provisional rows and the written finals to the live topics."""
    store = ResultStore(root, queries)
    layouts = store.layouts
    prov = None
    if live is not None or producer is not None:
        prov_packed, packed = split_provisional(packed)
        prov, _ = unpack_windows(prov_packed, layouts, LIVE_KINDS)
    mine = pc.fill_null(
        pc.and_(
            pc.is_in(packed["kind"], pa.array(list(R.ROW_KINDS))),
            pc.is_in(packed["query"], pa.array(sorted(local), pa.string())),
        ),
        False,
    )
    rest = packed.filter(pc.invert(mine))
    wins, _ = unpack_windows(packed.filter(mine), layouts)
    exporter = ResultExporter(queries)
    exports: dict[str, tuple] = {}
    if exporter.queries:

        def keep(q: Q.QuerySpec, typed: pa.Table) -> None:
            got = exporter.summarize(q, typed)
            if got is not None and (q.name not in exports or exports[q.name][0] <= got[0]):
                exports[q.name] = got

        store.on_written.append(keep)
    summary: dict = {"task": task, "written": {}, "finals": {}, "corrections": {}, "latency": {}}
    for name in sorted(wins):
        w, q = wins[name], store.queries.get(name)
        if q is None:
            continue
        summary["written"][name] = store.write_query(batch_id, q, w, task)
        summary["finals"][name] = closed_windows(q, w)
        summary["corrections"][name] = int(np.count_nonzero(w.correction))
        end_ns = layouts[name].window_end_ns(w.window)
        summary["latency"][name] = latest_close(end_ns[w.final], w.closed_at_ms[w.final])
    if prov or (prov is not None and wins):  # after the files: a final is published once written
        pub = LivePublisher(
            queries,
            live,
            producer=producer,
            keys_dir=lambda name: R.live_keys_dir(root, name, task),
            shared=True,  # one producer per Python worker, built inside publish's error handling
        )
        pub.publish(batch_id, prov, wins)
        summary["live"] = pub.counts()
    if not wins and not exports and "live" not in summary:
        return rest.cast(PACKED_SCHEMA)
    summary["files"] = store.files
    summary["having_dropped"] = store.having_dropped
    rows = [_row(WRITTEN_KIND, "", task, json.dumps(summary, separators=(",", ":")))]
    if store.fired:
        rows.append(_row(ALERTS_KIND, "", task, "", ipc_bytes(pa.concat_tables(store.fired))))
    for name, (end_ms, top, totals) in sorted(exports.items()):
        doc = json.dumps({"end_ms": end_ms, "totals": totals}, separators=(",", ":"))
        rows.append(_row(EXPORT_KIND, name, task, doc, ipc_bytes(top)))
    return pa.concat_tables([rest.cast(PACKED_SCHEMA), pa.Table.from_pylist(rows, schema=PACKED_SCHEMA)])


def task_writer(
    root: str | Path,
    queries: Sequence[Q.QuerySpec],
    batch_id: int,
    local: frozenset[str],
    live: KafkaClients | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` body of one micro-batch: each task writes its rows (:func:`write_task`).
    Files are named by the task's partition id, which the checkpoint's shuffle partitioning keeps fixed,
    so a replayed batch writes the same names."""
    root, queries = str(root), list(queries)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        got = [b for b in batches if b.num_rows]
        packed = pa.Table.from_batches(got).cast(PACKED_SCHEMA) if got else PACKED_SCHEMA.empty_table()
        out = write_task(root, queries, batch_id, TaskContext.get().partitionId(), packed, local, live)
        yield from out.combine_chunks().to_batches()

    return fn
