"""The query the benchmarks measure: the OOP paper's Q4, packets per (src_ip, dst_ip) per window."""

from __future__ import annotations

from contract import query as Q
from lowwater_testing.queries import spec

FLUSH = {
    "iop": {"policy": "iop", "m": 2},
    "slow": {"policy": "slow", "i": 160, "m": 2},
    "lazy": {"policy": "lazy", "m": 2},
}


def q4(
    table: int, policy: str = "lazy", topic: str | None = None, partitions: int = 1, window: str = "1m"
) -> Q.QuerySpec:
    """Q4 with a given table size, flush policy (m = 2, i = 160 as in the paper) and Kafka topic."""
    return spec(
        "q4",
        group_by=["src_ip", "dst_ip"],
        window=window,
        table=table,
        flush=FLUSH[policy],
        topic=topic,
        partitions=partitions,
    )
