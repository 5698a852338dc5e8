"""Selection queries (``kind: select``): filtered packets' timestamps and fields as rows, no grouping."""

from __future__ import annotations

import fnmatch
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from contract import fields as F
from contract.query.model import NS, HeartbeatSpec, KafkaSpec, QuerySpec, _Strict, parse_duration_ns


def _projectable(name: str) -> F.Field:
    fld = F.CATALOG.get(name)
    if fld is None:
        raise ValueError(f"unknown field {name!r}; known: {', '.join(sorted(F.CATALOG))}")
    if fld.kind == "time":
        raise ValueError("timestamp is always selected (it is the row's first column); do not list it")
    if name == "dscp":
        raise ValueError("select tos and shift it (dscp is not a packet column of its own)")
    return fld


class SelectSpec(_Strict):
    """A selection: the timestamp and ``fields`` of every packet that passes ``filter``, no grouping.

    Rows go to Kafka partitioned by ``partition_by`` (fields of the row, in the declared order: two
    selects that declare the same words in the same order land equal keys in the same partition, which is
    how a SYN and its SYN-ACK meet: one side declares ``[src_ip, src_port, dst_ip, dst_port]``, the
    other ``[dst_ip, dst_port, src_ip, src_port]``). ``retain`` bounds how far back a join may hold this
    input's rows: a join's band must not exceed it.
    """

    kind: Literal["select"]
    name: str
    description: str = ""
    sources: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    filter: str | None = None
    fields: list[str] = Field(min_length=1)
    partition_by: list[str] = Field(default_factory=list)
    retain_ns: int = Field(default=60 * NS, alias="retain")
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    kafka: KafkaSpec = KafkaSpec()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return QuerySpec._name(v)

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        return QuerySpec._sources(v)

    @field_validator("filter")
    @classmethod
    def _filter(cls, v: str | None) -> str | None:
        return QuerySpec._filter(v)

    def runs_on(self, host: str) -> bool:
        """Whether the capture host ``host`` runs this selection (its id matches one of ``sources``)."""
        return any(fnmatch.fnmatchcase(host, pat) for pat in self.sources)

    @field_validator("retain_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: list[str]) -> list[str]:
        for name in v:
            _projectable(name)
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate fields {v}")
        if sum(2 if F.CATALOG[n].kind == "ip" else 1 for n in v) > 32:
            raise ValueError("a selected row holds at most 32 words (an address takes 2)")
        return v

    @model_validator(mode="after")
    def _partition(self) -> SelectSpec:
        missing = [f for f in self.partition_by if f not in self.fields]
        if missing:
            raise ValueError(f"partition_by: {missing} not among the selected fields {self.fields}")
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError(f"partition_by: duplicate fields {self.partition_by}")
        if self.retain_ns <= 0:
            raise ValueError("retain must be positive")
        return self

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"lowwater.{self.name}"

    @property
    def columns(self) -> list[tuple[str, int]]:
        """The row's words after the timestamp: (name, parsed-packet column); an address is ``name.hi``/``name.lo``."""
        out: list[tuple[str, int]] = []
        for n in self.fields:
            fld = F.CATALOG[n]
            if fld.kind == "ip":
                out += [(f"{n}.hi", fld.columns[0]), (f"{n}.lo", fld.columns[1])]
            else:
                out.append((n, fld.columns[0]))
        return out

    @property
    def width(self) -> int:
        """Words per row after the timestamp."""
        return len(self.columns)

    def word_index(self, name: str) -> list[int]:
        """Row-word indices (0 = first word after the timestamp) of a selected field."""
        return [i for i, (c, _) in enumerate(self.columns) if c == name or c.startswith(name + ".")]

    @property
    def partition_words(self) -> list[int]:
        """Row-word indices hashed for the Kafka partition, in ``partition_by`` order."""
        return [i for n in self.partition_by for i in self.word_index(n)]
