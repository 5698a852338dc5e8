"""The distinct queries' streams in the Spark job: Kafka (the input select's topic) -> one state group per
distinct (:class:`high_level.distinct.dupelim.DistinctProcessor`, every partition) -> the job's sink and
store, like the joins. One streaming query per distinct, checkpoint ``<checkpoint>/distinct-<name>``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from contract import query as Q
from contract.topics import wanted_topics
from high_level.distinct.dupelim import DistinctLayout, DistinctProcessor
from high_level.join.pipeline import packed_state_function, start_state_stream
from high_level.pipeline import Pipeline

if TYPE_CHECKING:
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink

log = logging.getLogger("lowwater.job.distinct")


class MissingDistinctInput(RuntimeError):
    """A distinct's input topic does not exist on the broker (or has another partition count)."""


def layouts(cfg: Q.Config) -> list[DistinctLayout]:
    return [DistinctLayout.of(d, cfg.select(d.input)) for d in cfg.distincts]


class DistinctPipeline(Pipeline):
    """The distinct queries of a config, one stream each."""

    def __init__(self, config: Q.Config) -> None:
        self.config = config

    def topics(self) -> dict[str, int]:
        return wanted_topics([self.config.select(d.input) for d in self.config.distincts])

    def check(self, opts: JobOptions) -> None:
        """A missing input topic is an error before any stream starts (nothing emitted)."""
        from contract.topics import existing_partitions

        lays = layouts(self.config)
        admin = opts.kafka.admin(30)
        try:
            have = existing_partitions(admin, sorted({lay.topic for lay in lays}))
        finally:
            admin.close()
        for lay in lays:
            if have.get(lay.topic) != lay.partitions:
                raise MissingDistinctInput(
                    f"distinct {lay.name!r}: input topic {lay.topic!r} "
                    + (
                        "does not exist (start the capture agents or create it)"
                        if lay.topic not in have
                        else f"has {have[lay.topic]} partitions, select {lay.input!r} declares {lay.partitions}"
                    )
                )

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        streams = []
        for lay in layouts(self.config):
            fn = packed_state_function(
                lambda lay=lay: DistinctProcessor(lay, opts.settings),
                lambda buf, lay=lay: DistinctProcessor.from_bytes(buf, lay, opts.settings),
                opts.trigger_ms,
            )
            streams.append(start_state_stream(spark, opts, sink, [lay.topic], "distinct", lay.name, fn))
            log.info("distinct %s of %s within %.6f s", lay.name, lay.input, lay.within_ns / 1e9)
        return streams
