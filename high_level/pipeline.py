"""The job's one extension point: a :class:`Pipeline` starts the streams of one query kind.

The job (:mod:`high_level.job`) holds a list of pipelines (chosen by ``--mode``) and does the same with
each: provision its topics, collect its Kafka publishers (:class:`Outputs`, fed by the sink after a
batch is stored), check it, start it. A pipeline knows its queries and nothing of the job: it reads the
options and writes every micro-batch through the one :class:`high_level.results.sink.ResultSink`.
Implemented by the aggregates (:mod:`high_level.aggregate.pipeline`, blob or chunked state), the joins
(:mod:`high_level.join.pipeline`) and the watermark baseline (:mod:`high_level.aggregate.watermark`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from high_level.join.feed import FeedPublisher
    from high_level.live.publish import LivePublisher
    from high_level.ondemand import PunctuationAsker
    from high_level.options import JobOptions
    from high_level.results.sink import ResultSink


@dataclass(frozen=True)
class Outputs:
    """A pipeline's Kafka publishers that the sink feeds after each stored batch (each optional)."""

    asker: PunctuationAsker | None = None  # punctuation requests to the hosts blocking a window
    live: LivePublisher | None = None  # provisional and final values (contract/live.py)
    feed: FeedPublisher | None = None  # aggregate queries' closed windows, for the joins that read them

    def __or__(self, other: Outputs) -> Outputs:
        asker = self.asker.merge(other.asker) if self.asker and other.asker else self.asker or other.asker
        return Outputs(asker, self.live or other.live, self.feed or other.feed)

    def close(self) -> None:
        for out in (self.asker, self.live, self.feed):
            if out is not None:
                out.close()


class Pipeline:
    """The streams of one query kind. Subclasses implement :meth:`start`; the rest defaults to nothing."""

    def topics(self) -> dict[str, int]:
        """Topic -> partitions this pipeline reads or writes, to create before it starts."""
        return {}

    def provision(self, admin: Any, opts: JobOptions) -> dict[str, str]:
        """Topics needing more than a partition count (e.g. compacted); topic -> action."""
        return {}

    def outputs(self, opts: JobOptions) -> Outputs:
        """The Kafka publishers this pipeline's batches feed (built once, when the job is built)."""
        return Outputs()

    def check(self, opts: JobOptions) -> None:
        """Raise before any stream of the job starts if this pipeline cannot run (nothing emitted)."""

    def start(self, spark: Any, opts: JobOptions, sink: ResultSink) -> list[Any]:
        """Start this pipeline's streaming queries; each micro-batch goes to ``sink``."""
        raise NotImplementedError
