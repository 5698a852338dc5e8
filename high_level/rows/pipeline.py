"""The row-window queries' streams in the Spark job: Kafka (the query's topic: row-pane partials and row
marks, ``contract.wire``) -> one state group per query (:class:`high_level.rows.processor.RowProcessor`,
every partition) -> Parquet in the results store, one streaming query each, checkpoint
``<checkpoint>/rows-<name>``.

Why its own writer and not the sink's: a row window has no time span, so its rows have their own schema
(:func:`contract.rowresults.row_schema`), no HAVING, tiers or live values. The driver writes the batch's
file ``query=<q>/date=<day of closed_at>/part-<batch>.parquet`` atomically; a replayed batch restores the
state the checkpoint saved before it and rewrites the same name, so each window is stored once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from contract import query as Q
from contract import results as R
from contract.query.rows import RowQuerySpec
from contract.query.windows import TupleSlideSpec
from contract.rowresults import row_schema
from high_level.join.pipeline import packed_state_function, start_state_stream
from high_level.pipeline import Pipeline
from high_level.results.store import atomic_write_bytes
from high_level.rows.processor import OUTPUT_DDL, RowProcessor, from_ipc
from high_level.rows.tupleprocessor import TupleProcessor

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink

log = logging.getLogger("lowwater.job.rows")


def write_rows(root: str, specs: dict[str, RowQuerySpec], batch: Any, batch_id: int) -> int:
    """Store one micro-batch's closed row windows; returns the rows written."""
    written = 0
    for row in batch.collect():
        if not row["ipc"]:
            continue
        table = from_ipc(bytes(row["ipc"]))
        spec = specs[row["query"]]
        if table.schema != row_schema(spec):  # one layout, never cast
            raise R.ResultsLayoutError(
                f"row query {spec.name!r}: batch {batch_id} does not follow the layout"
            )
        day = table["closed_at"][0].as_py().date()
        path = R.part_path(root, spec.name, day, batch_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        out = pa.BufferOutputStream()
        pq.write_table(table, out)
        atomic_write_bytes(path, out.getvalue().to_pybytes())
        written += len(table)
    return written


class RowPipeline(Pipeline):
    """The ``kind: rows`` queries of a config (row windows), one stream each."""

    def __init__(self, config: Q.Config) -> None:
        self.config = config

    def topics(self) -> dict[str, int]:
        return {r.topic: r.kafka.partitions for r in self.config.rows}

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        specs = {r.name: r for r in self.config.rows}
        streams = []
        for r in self.config.rows:
            proc = TupleProcessor if isinstance(r.window, TupleSlideSpec) else RowProcessor
            fn = packed_state_function(
                lambda r=r, proc=proc: proc(r),
                lambda buf, r=r, proc=proc: proc.from_bytes(buf, r),
                opts.trigger_ms,
            )

            def write(batch: Any, batch_id: int, root: str = str(opts.results)) -> None:
                n = write_rows(root, specs, batch, batch_id)
                if n:
                    log.info("batch %d: %d row windows stored", batch_id, n)

            streams.append(
                start_state_stream(spark, opts, sink, [r.topic], "rows", r.name, fn, OUTPUT_DDL, write)
            )
            log.info("row query %s: window %s", r.name, r.window)
        return streams
