"""What the API knows about one query's result columns, taken from the results contract.

Names, kinds and the file schema all come from :mod:`contract.results` (itself derived from the
query's :class:`~contract.query.QuerySpec`), so the API never spells a column the job does not write.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa

from contract import results as R
from contract.query import QuerySpec


@dataclass(frozen=True)
class QueryInfo:
    """A query's result columns: keys as (column, 'ip' | 'int'), aggregates as (column, fn)."""

    spec: QuerySpec
    keys: tuple[tuple[str, str], ...]
    aggs: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, spec: QuerySpec) -> QueryInfo:
        return cls(spec, tuple(R.key_columns(spec)), tuple(R.aggregate_columns(spec)))

    @property
    def name(self) -> str:
        return self.spec.name

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The exact schema of every result file of the query (the contract's; built once)."""
        return R.schema(self.spec)

    @property
    def key_names(self) -> list[str]:
        return [k for k, _ in self.keys]

    @property
    def key_kinds(self) -> dict[str, str]:
        return dict(self.keys)

    @property
    def agg_names(self) -> list[str]:
        return [a for a, _ in self.aggs]

    @property
    def count_col(self) -> str | None:
        """The first count aggregate: the weight that lets avg be folded exactly."""
        return next((a for a, fn in self.aggs if fn == "count"), None)

    @property
    def order_columns(self) -> list[str]:
        return ["window_start", "window_end", *self.agg_names, *self.key_names]

    @property
    def output_columns(self) -> list[str]:
        return [
            "window_start",
            "window_end",
            *self.key_names,
            *self.agg_names,
            "hosts",
            "closed_at",
            "corrections",
            *R.COMPLETENESS_COLUMNS,
        ]
