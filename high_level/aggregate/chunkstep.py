"""The chunked state's Spark step: ``transformWithStateInPandas`` per (topic, partition, salt).

Same grouping and the same processor as the blob step (:func:`high_level.aggregate.pipeline.state_function`), but the
state is split: the processor's small part (marks, counters, frontier, pane index) is one ValueState,
the pane tables are chunks in a MapState keyed by (query, pane, seq) (:mod:`high_level.aggregate.chunks`). Spark's
RocksDB state store provider keeps the map per key and, with changelog checkpointing, a micro-batch
commits only the keys it wrote: the cost of a batch follows the batch, not the open groups.

Exactly-once as before: everything depends on (state, messages in offset order, the batch timestamp
from the offset log); a replayed batch starts from the same committed state version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from high_level import codec
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout

META_SCHEMA = "blob binary"
CHUNK_KEY_SCHEMA = "query string, pane long, seq int"
CHUNK_VALUE_SCHEMA = "data binary"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# what the chunked step needs of the session when its query starts (the stream keeps its own copy)
SESSION_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def processing_timers(checkpoint: Path | str) -> bool:
    """Whether the stream checkpoint ``checkpoint`` holds a step written with processing-time timers (its
    operator metadata, ``state/<op>/_metadata/v2/<batch>``: a version line, then JSON whose
    ``operatorPropertiesJson`` names the time mode). A checkpoint that is not on this machine's file
    system cannot be read: it keeps the timers (a wrong guess would fail its restart)."""
    if "://" in str(checkpoint) and not str(checkpoint).startswith("file:"):
        return True
    root = Path(str(checkpoint).removeprefix("file:").removeprefix("//"))
    for f in sorted(root.glob("state/*/_metadata/v2/*")):
        if f.name.startswith("."):
            continue
        try:
            doc = json.loads(f.read_text().splitlines()[1])
            props = json.loads(doc.get("operatorPropertiesJson") or "{}")
        except (OSError, IndexError, ValueError) as exc:
            raise ValueError(f"{f}: unreadable operator metadata of the checkpoint ({exc})") from None
        if str(props.get("timeMode", "")).lower() == "processingtime":
            return True
    return False


class MapChunks:
    """A MapState as :class:`high_level.aggregate.chunks.ChunkStore`."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def put(self, query: str, pane: int, seq: int, data: bytes) -> None:
        self.state.updateValue((query, int(pane), int(seq)), (data,))

    def get(self, query: str, pane: int, seq: int) -> bytes:
        v = self.state.getValue((query, int(pane), int(seq)))
        if v is None:
            raise codec.CodecError(f"chunk {seq} of pane {pane} of {query!r} is missing from the state")
        return bytes(v[0])

    def remove(self, query: str, pane: int, seq: int) -> None:
        self.state.removeKey((query, int(pane), int(seq)))


class ChunkedStep(StatefulProcessor):
    """The stateful processor: restore the small state, feed the batch in offset order, save it.

    Time: the micro-batch's timestamp from the offset log (the same on a replay), so a host times out
    identically whenever a batch runs. ``timers=False`` (time mode None, new checkpoints) reads it from the
    ``now_ms`` column (``current_timestamp()``, which a streaming query resolves to that timestamp) and
    evaluates a partition only when its topic partition brought messages. Why: Spark rebuilds the
    processing-time timer encoders every time a planning rule copies the step's plan node, a large part of the
    driver's fixed CPU per batch (404 -> 272 CPU-ms, docs/design.md). What the timer added: a partition none of whose hosts
    punctuates any more was still evaluated, so its status showed them dead; without any live host nothing
    closes there anyway (high_level.aggregate.meld), and every live host punctuates every partition each
    second, so a partition with a live host is never silent. ``timers=True``: a checkpoint written with
    processing-time timers keeps them (Spark refuses to change the time mode of a checkpoint)."""

    def __init__(
        self, layouts: Sequence[Layout], settings: Settings, tick_ms: int, timers: bool = True
    ) -> None:
        self.by_topic: dict[str, list[Layout]] = {}
        for lay in layouts:
            self.by_topic.setdefault(lay.topic, []).append(lay)
        self.settings = settings
        self.tick_ms = int(tick_ms)
        self.timers = timers

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.meta = handle.getValueState("meta", META_SCHEMA)
        self.chunks = MapChunks(handle.getMapState("chunks", CHUNK_KEY_SCHEMA, CHUNK_VALUE_SCHEMA))

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        frames = [df for df in rows if len(df)]
        values: list[bytes] = []
        if frames:
            df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
            values = df.sort_values("offset", kind="stable")["value"].tolist()
        if not self.timers:
            if frames:  # no timer, no rows: nothing to evaluate (Spark calls a key with rows only)
                yield self._run(key, values, int(frames[0]["now_ms"].iat[0]))
            return
        for t in list(self.handle.listTimers()):  # the data evaluates the partition now: no timer due
            self.handle.deleteTimer(t)
        yield self._run(key, values, int(timerValues.getCurrentProcessingTimeInMs()))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield self._run(key, [], int(timerValues.getCurrentProcessingTimeInMs()))

    def _run(self, key: Any, values: list[bytes], now_ms: int) -> pd.DataFrame:
        topic, partition = str(key[0]), int(key[1])  # key[2] is the placement salt
        lays = self.by_topic[topic]
        if self.meta.exists():
            proc = PartitionProcessor.from_bytes(self.meta.get()[0], lays, self.settings, self.chunks)
        else:
            proc = PartitionProcessor(lays, partition, self.settings, self.chunks)
        out = proc.process_packed(values, now_ms)
        self.meta.update((proc.to_bytes(),))
        if self.timers:
            self.handle.registerTimer(now_ms + self.tick_ms)
        return out

    def close(self) -> None:
        pass
