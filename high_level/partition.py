"""One Kafka partition's high-level processor: decode batches, merge partials, meld punctuation, close.

This is the body of the Spark stateful step, kept free of Spark so it can be tested directly and
replayed offline. Everything it decides depends only on (its saved state, the messages in offset
order, ``now_ms``), and Spark supplies ``now_ms`` from the batch timestamp recorded in the offset
log, so a replayed micro-batch produces byte-identical output (exactly-once with an idempotent sink).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from contract import wire
from high_level import codec
from high_level.meld import Meld
from high_level.rollup import I64, Layout, QueryRollup, Windows

LATE_POLICIES = ("drop", "correction")
MAX_INCARNATIONS = 4  # per host: record counters kept for the newest few incarnations

# The generic output schema of the stateful step (one schema for all queries).
OUTPUT_COLUMNS = ("query", "partition", "window", "window_start_ns", "window_end_ns", "key", "state",
                  "kind", "closed_at_ms", "hosts", "status")  # fmt: skip
GENERIC_SCHEMA = pa.schema([
    ("query", pa.string()), ("partition", pa.int32()), ("window", pa.int64()), ("window_start_ns", pa.int64()),
    ("window_end_ns", pa.int64()), ("key", pa.list_(pa.int64())), ("state", pa.list_(pa.int64())),
    ("kind", pa.string()), ("closed_at_ms", pa.int64()), ("hosts", pa.int32()), ("status", pa.string()),
])  # fmt: skip
OUTPUT_DDL = (
    "query string, partition int, window long, window_start_ns long, window_end_ns long, "
    "key array<bigint>, state array<bigint>, kind string, closed_at_ms long, hosts int, status string"
)


@dataclass(frozen=True)
class Settings:
    """Job-level settings the processor needs (same on every worker)."""

    host_timeout_ms: int = 10_000
    expected_hosts: tuple[str, ...] = ()
    late_policy: str = "drop"
    max_gap_ms: int | None = None

    def __post_init__(self) -> None:
        if self.late_policy not in LATE_POLICIES:
            raise ValueError(f"late policy must be one of {LATE_POLICIES}, got {self.late_policy!r}")


class _QueryState:
    """Roll-up + meld + counters of one query on one partition."""

    def __init__(self, layout: Layout, settings: Settings) -> None:
        self.layout = layout
        self.rollup = QueryRollup(layout)
        self.meld = Meld(settings.host_timeout_ms, settings.expected_hosts, settings.max_gap_ms)
        # host -> {"late": n, "records": n, "inc": {str(incarnation): [received, sent, missing]}}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.windows_closed = 0
        self.records = 0

    def host(self, name: str) -> dict[str, Any]:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = {"late": 0, "records": 0, "inc": {}}
        return h

    def incarnation(self, name: str, inc: int) -> list[int]:
        incs = self.host(name)["inc"]
        key = str(inc)
        if key not in incs:
            incs[key] = [0, 0, 0]
            if len(incs) > MAX_INCARNATIONS:
                for old in sorted(incs, key=int)[: len(incs) - MAX_INCARNATIONS]:
                    del incs[old]
        return incs[key]


class PartitionProcessor:
    """The state and logic for one (topic, Kafka partition): bytes in, closed windows out."""

    def __init__(self, layouts: Sequence[Layout], partition: int, settings: Settings) -> None:
        self.partition = int(partition)
        self.settings = settings
        self.layouts = {lay.name: lay for lay in layouts}
        self.queries: dict[str, _QueryState] = {n: _QueryState(lay, settings) for n, lay in self.layouts.items()}
        self.errors = {"bad_messages": 0, "unknown_query": 0, "misrouted": 0, "bad_layout": 0}
        self.last_error = ""

    # -- state bytes ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        meta: dict[str, Any] = {"partition": self.partition, "errors": self.errors, "last_error": self.last_error,
                                "queries": {}}  # fmt: skip
        arrays: dict[str, np.ndarray] = {}
        for name, qs in self.queries.items():
            r = qs.rollup
            meta["queries"][name] = {
                "closed": r.closed, "meld": qs.meld.to_dict(), "hosts": qs.hosts,
                "windows_closed": qs.windows_closed, "records": qs.records,
            }  # fmt: skip
            arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"] = r.pane, r.key, r.state
        return codec.pack(meta, arrays)

    @classmethod
    def from_bytes(cls, buf: bytes, layouts: Sequence[Layout], settings: Settings) -> PartitionProcessor:
        meta, arrays = codec.unpack(buf)
        p = cls(layouts, meta["partition"], settings)
        p.errors.update(meta.get("errors", {}))
        p.last_error = meta.get("last_error", "")
        for name, qm in meta["queries"].items():
            qs = p.queries.get(name)
            if qs is None:  # query removed from the config: its state is dropped
                continue
            lay = qs.layout
            pane, key, state = arrays[f"{name}/pane"], arrays[f"{name}/key"], arrays[f"{name}/state"]
            if key.shape[1:] != (lay.kw,) or state.shape[1:] != (lay.na,):
                raise codec.CodecError(f"query {name!r} changed its key/state layout; use a new checkpoint")
            qs.rollup.pane, qs.rollup.key, qs.rollup.state = pane, key, state
            qs.rollup.closed = qm["closed"]
            qs.meld.load_dict(qm["meld"])
            qs.hosts = qm["hosts"]
            qs.windows_closed = qm.get("windows_closed", 0)
            qs.records = qm.get("records", 0)
        return p

    # -- processing -----------------------------------------------------------------------------
    def process(self, values: Iterable[bytes], now_ms: int) -> pd.DataFrame:
        """Apply one micro-batch of Kafka message values (in offset order) at processing time ``now_ms``.

        Returns rows in the generic output schema: 'final' windows, 'correction' rows and one
        'status' row per query.
        """
        for qs in self.queries.values():
            qs.meld.advance(now_ms)
        pending: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {n: [] for n in self.queries}
        batch = {n: {"messages": 0, "records": 0, "punctuations": 0} for n in self.queries}
        for value in values:
            try:
                b = wire.decode(value)
            except wire.WireError as exc:
                self.errors["bad_messages"] += 1
                self.last_error = str(exc)
                continue
            qs = self.queries.get(b.query)
            if qs is None:
                self.errors["unknown_query"] += 1
                self.last_error = f"unknown query {b.query!r}"
                continue
            if b.partition != self.partition:
                self.errors["misrouted"] += 1
            bq = batch[b.query]
            bq["messages"] += 1
            inc = qs.incarnation(b.host, b.incarnation)
            if isinstance(b, wire.Partials):
                if b.key.shape[1] != qs.layout.kw or b.state.shape[1] != qs.layout.na:
                    self.errors["bad_layout"] += 1
                    self.last_error = f"{b.query}: key/state width {b.key.shape[1]}/{b.state.shape[1]} from {b.host}"
                    continue
                pending[b.query].append((b.host, b.pane, b.key, b.state))
                inc[0] += b.n
                qs.host(b.host)["records"] += b.n
                bq["records"] += b.n
            else:
                inc[1] = int(b.seq)
                inc[2] = max(0, int(b.seq) - inc[0])
                prev = qs.meld.hosts.get(b.host)
                if prev is not None and prev.incarnation != b.incarnation:
                    # the agent restarted: what its old incarnation held unflushed (panes from its last
                    # mark on) is lost; report the range of windows that may be incomplete
                    h = qs.host(b.host)
                    h["restarts"] = h.get("restarts", 0) + 1
                    h["last_restart"] = {"old_incarnation": prev.incarnation, "new_incarnation": b.incarnation,
                                         "incomplete_from_pane": prev.mark_pane, "new_mark_pane": int(b.mark_pane)}
                qs.meld.observe(b.host, b.incarnation, b.mark_pane, b.mark_ns, b.sent_wall_ns, now_ms)
                bq["punctuations"] += 1
        frames = []
        for name, qs in self.queries.items():
            frames.append(self._finish(qs, pending[name], batch[name], now_ms))
        out = pd.concat(frames, ignore_index=True) if frames else empty_output()
        return out

    def _finish(self, qs: _QueryState, pending: list, batch: dict[str, int], now_ms: int) -> pd.DataFrame:
        lay = qs.layout
        late_batch: dict[str, int] = {}
        parts = []
        if pending:
            hosts = sorted({p[0] for p in pending})
            hix = {h: i for i, h in enumerate(hosts)}
            pane = np.concatenate([p[1] for p in pending])
            key = np.concatenate([p[2] for p in pending])
            state = np.concatenate([p[3] for p in pending])
            host_idx = np.repeat(np.array([hix[p[0]] for p in pending], I64), [len(p[1]) for p in pending])
            res = qs.rollup.add(pane, key, state, host_idx, len(hosts), self.settings.late_policy == "correction")
            for h, n in zip(hosts, res.late_per_host.tolist(), strict=True):
                if n:
                    qs.host(h)["late"] += n
                    late_batch[h] = n
            if res.corrections is not None and len(res.corrections):
                parts.append(self._rows(lay, res.corrections, "correction", now_ms, len(qs.meld.live_hosts())))
            qs.records += len(pane)
        lwm = qs.meld.low_water_mark()
        closed = qs.rollup.close(lwm)
        n_live = len(qs.meld.live_hosts())
        if len(closed):
            qs.windows_closed += len(closed)
            parts.append(self._rows(lay, closed, "final", now_ms, n_live))
        status = self.status(qs, now_ms, batch, late_batch, len(closed))
        parts.append(pd.DataFrame({
            "query": [lay.name], "partition": np.array([self.partition], np.int32), "window": np.array([-1], I64),
            "window_start_ns": np.array([0], I64), "window_end_ns": np.array([0], I64),
            "key": [np.empty(0, I64)], "state": [np.empty(0, I64)], "kind": ["status"],
            "closed_at_ms": np.array([now_ms], I64), "hosts": np.array([n_live], np.int32),
            "status": [json.dumps(status, separators=(",", ":"))],
        }))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    def _rows(self, lay: Layout, w: Windows, kind: str, now_ms: int, hosts: int) -> pd.DataFrame:
        n = len(w)
        return pd.DataFrame({
            "query": np.full(n, lay.name, object), "partition": np.full(n, self.partition, np.int32),
            "window": w.window, "window_start_ns": lay.window_start_ns(w.window),
            "window_end_ns": lay.window_end_ns(w.window), "key": list(w.key), "state": list(w.state),
            "kind": np.full(n, kind, object), "closed_at_ms": np.full(n, now_ms, I64),
            "hosts": np.full(n, hosts, np.int32), "status": np.full(n, None, object),
        })  # fmt: skip

    def status(self, qs: _QueryState, now_ms: int, batch: dict[str, int] | None = None,
               late_batch: dict[str, int] | None = None, closed_batch: int = 0) -> dict[str, Any]:  # fmt: skip
        """A JSON-able snapshot: per-host marks, liveness, lag, late and missing records, open windows."""
        lay, meld = qs.layout, qs.meld
        lwm = meld.low_water_mark()
        hosts: dict[str, Any] = {}
        for name in sorted(set(meld.hosts) | set(qs.hosts) | set(meld.expected)):
            hm = meld.hosts.get(name)
            hc = qs.hosts.get(name, {"late": 0, "records": 0, "inc": {}})
            incs = hc["inc"]
            cur = str(hm.incarnation) if hm else (max(incs, key=int) if incs else None)
            hosts[name] = {
                "live": meld.is_live(name),
                "expected": name in meld.expected,
                "mark_pane": hm.mark_pane if hm else None,
                "mark_ns": hm.mark_ns if hm else None,
                "lag_s": (now_ms * 1_000_000 - hm.mark_ns) / 1e9 if hm and 0 < hm.mark_ns < wire.END_OF_STREAM else None,
                "last_heard_ms": hm.last_heard_ms if hm else None,
                "silent_s": hm.silent_ms / 1e3 if hm else None,
                "punctuations": hm.punctuations if hm else 0,
                "incarnation": int(cur) if cur is not None else None,
                "records": hc["records"],
                "sent_records": incs[cur][1] if cur in incs else 0,
                "received_records": incs[cur][0] if cur in incs else 0,
                "missing_records": sum(v[2] for v in incs.values()),
                "late_partials": hc["late"],
                "restarts": hc.get("restarts", 0),
                "last_restart": hc.get("last_restart"),
                "late_batch": (late_batch or {}).get(name, 0),
            }
        return {
            "query": lay.name, "partition": self.partition, "now_ms": now_ms,
            "low_water_mark_pane": lwm,
            "low_water_mark_ns": _pane_ns(lay, lwm),
            "closed_before_window": qs.rollup.closed,
            "blocked_by": meld.blocking_hosts(),
            "live_hosts": len(meld.live_hosts()),
            "open_windows": qs.rollup.open_windows(), "state_rows": len(qs.rollup),
            "windows_closed": qs.windows_closed, "windows_closed_batch": closed_batch,
            "records": qs.records, "batch": batch or {}, "errors": dict(self.errors), "last_error": self.last_error,
            "hosts": hosts,
        }  # fmt: skip


def _pane_ns(lay: Layout, pane: int | None) -> int | None:
    """Start time of a pane in ns, None when unknown or beyond int64 (END_OF_STREAM)."""
    if pane is None:
        return None
    ns = lay.origin_ns + pane * lay.pane_ns
    return ns if -(2**63) <= ns < 2**63 - 1 else None


def empty_output() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in OUTPUT_COLUMNS})
