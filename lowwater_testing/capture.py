"""The low level driven in process: the fused kernel over built frames, frames pushed into an agent's ring,
and a producer that records what the agent sends (for pure-logic tests without Kafka)."""

from __future__ import annotations

from typing import Any

import numpy as np
import yaml

from contract import query as Q
from contract import wire
from low_level.capture.ring import HEAD, Ring
from low_level.host.agent import Agent
from low_level.kernel.fused import Kernel
from low_level.kernel.tables import Tables
from lowwater_testing.queries import spec
from lowwater_testing.traffic import build_frames


def run_kernel(
    queries: list[Q.QuerySpec], traffic, chunk: int = 512, check=None, nets: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """The fused kernel over the traffic's frames, chunk by chunk, each query's partials drained after
    every chunk and flushed at the end. ``check(tables)`` runs after each chunk; with ``nets`` (LPM
    tables) the kernel switches to the next table at each equal share of the traffic."""
    tables = Tables.build(queries, chunk=chunk)
    k = Kernel(tables, nets=nets[0] if nets else None)
    frames, cap, wl, ts = build_frames(traffic)
    out: list[list[np.ndarray]] = [[] for _ in queries]
    share = -(-len(traffic) // len(nets)) if nets else 0
    for s in range(0, len(traffic), chunk):
        if nets:
            k.set_networks(nets[min(s // share, len(nets) - 1)])
        k.run_arrays(frames, cap, wl, ts, s, min(len(traffic), s + chunk))
        if check:
            check(tables)
        for i in range(len(queries)):
            out[i].append(tables.drain(i))
    for i in range(len(queries)):
        k.flush_below(i, wire.END_OF_STREAM)
        out[i].append(tables.drain(i))
    return [np.concatenate(o) for o in out]


class RecordingProducer:
    """Stands in for Kafka in this pure-logic test: records what the agent sends, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes]] = []

    def send(self, topic: str, value: bytes, partition: int):
        self.sent.append((topic, partition, value))
        return None


def push_frames(ring: Ring, frames, cap, wl, ts) -> None:
    n = len(ts)
    head = int(ring.ctr[HEAD])
    slots = (head + np.arange(n)) & (ring.nslots - 1)
    view = ring.frames.reshape(ring.nslots, ring.snaplen)
    view[slots, : frames.shape[1]] = frames
    ring.caplen[slots], ring.wirelen[slots], ring.ts[slots] = cap, wl, ts
    ring.iface[slots] = 0
    ring.ctr[HEAD] = head + n


def kafka_agent(q: Q.QuerySpec, host: str, bootstrap: str, **emitter_opts: Any) -> Agent:
    """An in-process agent for one query sending to a real broker (an 8192-slot ring, 2048-packet chunks),
    fed with :func:`feed`; ``emitter_opts`` bound its backlog (``merge_at``, ``max_records``)."""
    return Agent([q], None, host, bootstrap, ring_slots=1 << 13, chunk=2048, emitter_opts=emitter_opts)


def drain(agent: Agent, timeout: float = 90) -> None:
    """End the agent's capture, wait until Kafka acknowledged everything it sent (within ``timeout``), close."""
    agent.finish()
    assert agent.emitter.flush(timeout), f"the agent's records not delivered in {timeout} s"
    agent.emitter.close()


def feed(agent: Agent, traffic, start: int, stop: int, burst: int = 2000) -> None:
    frames, cap, wl, ts = build_frames(traffic.take(np.arange(start, stop)))
    for s in range(0, stop - start, burst):
        e = min(stop - start, s + burst)
        push_frames(agent.ring, frames[s:e], cap[s:e], wl[s:e], ts[s:e])
        while agent.ring.fill:
            agent.step()


def pairs_query(topic: str, partitions: int = 2) -> Q.QuerySpec:
    """Count, bytes and max length per (src, dst) per second, lazy flush: the fault and shedding tests' query."""
    return spec(
        "pairs",
        group_by=["src_ip", "dst_ip"],
        aggregates=["count as n", "sum(length) as bytes", "max(length) as mx"],
        window="1s",
        table=256,
        flush={"policy": "lazy", "m": 2},
        topic=topic,
        partitions=partitions,
        heartbeat={"max_disorder": "0s"},
    )  # in-order capture: the mark follows the table


def make_query(
    policy: str,
    size: int,
    *,
    name: str = "q",
    window: str = "{range: 10s}",
    group: str = "[src_ip, dst_ip]",
    aggs: str = "[{fn: count, as: packets}, {fn: sum, field: length, as: bytes}]",
    flt: str = "",
    m: int = 2,
    i: int = 16,
    partitions: int = 1,
) -> Q.QuerySpec:
    """One query for the kernel tests; ``window``, ``group`` and ``aggs`` are YAML flow snippets as in a file."""
    return spec(
        name,
        group_by=yaml.safe_load(group),
        aggregates=yaml.safe_load(aggs),
        window=yaml.safe_load(window),
        table=size,
        flush={"policy": policy, "m": m, "i": i},
        partitions=partitions,
        filter=flt or None,
    )
