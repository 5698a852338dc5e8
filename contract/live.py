"""Live results: the one definition of what the job publishes for open windows and what the API reads.

The job and the API otherwise meet in the results store (:mod:`contract.results`); live values of open
windows change every micro-batch, so they travel on a compacted Kafka topic per query instead:

* topic ``lowwater.live.<query>`` (:func:`live_topic`), created by the job with :data:`TOPIC_CONFIG`
  (``cleanup.policy=compact``): Kafka keeps the newest message per key, so a reader that starts from
  the beginning sees the current value of every recent (window, group) and then every change;
* key: :func:`key_bytes`, the canonical JSON ``[window_start_us, [group values in key order]]``;
* value: one :class:`LiveUpdate` as JSON. ``final=False`` is a provisional value of an open window;
  ``final=True`` the value at close (the same as the store's ``final`` row), after which the job
  publishes nothing more for that key. ``version`` (the micro-batch id) grows per key: a reader keeps
  the highest version per key and ignores older ones (a replayed batch publishes the same values).

Coverage of a provisional value: ``hosts_in_mark`` of ``hosts_expected`` known capture hosts have a
mark past the window's end (as in the store's completeness columns); ``complete`` is only ever true
for a final value (:mod:`contract.results` defines it). A message that does not validate or does not
match its query's columns is refused with the reason (:class:`LiveFormatError`), never guessed at.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contract import query as Q
from contract import results as R

LIVE_TOPIC_PREFIX = "lowwater.live."
# compaction keeps the newest value per key; the job tombstones long-closed windows' keys (removed after
# delete.retention.ms), and segments older than retention.ms go whatever they hold (keys of a job that
# stopped before tombstoning them)
TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": "86400000",
    "min.cleanable.dirty.ratio": "0.1",
    "segment.ms": "600000",
    "delete.retention.ms": "3600000",
}
PROVISIONAL_KIND = "provisional"  # the stateful step's output rows that carry provisional values
TOPIC_PARTITIONS = 1  # one reader (the API) wants the whole query in order of publication


class LiveFormatError(ValueError):
    """A live message that does not follow this module's format (or its query's columns)."""


def live_topic(query: str) -> str:
    return LIVE_TOPIC_PREFIX + query


def query_of_topic(topic: str) -> str | None:
    return topic[len(LIVE_TOPIC_PREFIX) :] if topic.startswith(LIVE_TOPIC_PREFIX) else None


class LiveUpdate(BaseModel):
    """The value of one (window, group) of one query, provisional or final."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    query: str
    window_start_us: int
    window_end_us: int
    group: dict[str, str | int]  # key column -> value, in the query's key order
    values: dict[str, int | float | None]  # aggregate column -> value (avg of an empty group: None)
    final: bool
    version: int = Field(ge=0)  # the micro-batch that computed it: grows per key
    published_ms: int = Field(ge=0)  # the batch clock
    hosts_in_mark: int = Field(ge=0)
    hosts_expected: int = Field(ge=0)
    complete: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> LiveUpdate:
        if self.window_end_us <= self.window_start_us:
            raise ValueError("window_end_us must be after window_start_us")
        if self.complete and not self.final:
            raise ValueError("a provisional value is never complete")
        return self

    @property
    def key(self) -> tuple[int, tuple]:
        return (self.window_start_us, tuple(self.group.values()))


def key_bytes(u: LiveUpdate) -> bytes:
    return json.dumps([u.window_start_us, list(u.group.values())], separators=(",", ":")).encode()


def window_of_key(key: bytes) -> int:
    """The window start (us) of a live key (``[start,[group...]]``, :func:`key_bytes`), without
    decoding the rest; ValueError when it is not one."""
    return int(key[1 : key.index(b",")])


def encode(u: LiveUpdate) -> tuple[bytes, bytes]:
    """(Kafka key, value) of an update."""
    return key_bytes(u), u.model_dump_json().encode()


def decode(key: bytes | None, value: bytes | None) -> LiveUpdate:
    """A live message -> :class:`LiveUpdate`, or :class:`LiveFormatError` saying why not."""
    if value is None:
        raise LiveFormatError("tombstone (no value)")
    try:
        u = LiveUpdate.model_validate_json(value)
    except ValidationError as exc:
        raise LiveFormatError(
            f"not a live update: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from exc
    if key is not None and key != key_bytes(u):
        raise LiveFormatError(f"key {key[:80]!r} does not match the value's window and group")
    return u


def check_query(u: LiveUpdate, q: Q.QuerySpec) -> None:
    """The update's group and value columns must be exactly the query's (names and order)."""
    want_g = [n for n, _ in R.key_columns(q)]
    want_v = [n for n, _ in R.aggregate_columns(q)]
    if u.query != q.name or list(u.group) != want_g or list(u.values) != want_v:
        raise LiveFormatError(
            f"update of {u.query!r} with group {list(u.group)} / values {list(u.values)} does not match query "
            f"{q.name!r} (group {want_g}, values {want_v})"
        )
