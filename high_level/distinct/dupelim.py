"""Order-insensitive duplicate elimination (``kind: distinct``, OOP section 5.4), purged by punctuation.

The definition is :mod:`contract.query.distincts`: a row is kept when no copy of it (equal ``fields``)
has a timestamp in ``[ts - within, ts]`` before it. Per Kafka partition, vectorised per micro-batch
(numpy lexsort; no Python per row):

* Rows wait in ``pending`` until the input's low-water mark ``b`` (min over its live hosts'
  punctuation, :class:`high_level.aggregate.meld.Meld`) passes their timestamp: then every row that could
  precede them has arrived, and each is decided against ``hist`` and the other decided rows. A row
  below ``b`` on arrival is late: counted, charged to its time range, never decided.
* ``hist`` keeps the identity and timestamp of decided rows while ``ts >= b - within`` (a later row could
  still be their copy), so the state is bounded by the mark, not by the disorder.
* The output punctuation is ``b`` (Dupelim passes punctuation through); the kept rows are filed in the
  window of their timestamp by one roll-up (:class:`DistinctProcessor`), which closes a window when every
  partition's mark has passed its end, like every stored window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from contract import query as Q
from contract import wire
from contract.query.distincts import DistinctSpec, distinct_query
from high_level import codec
from high_level.aggregate.meld import Meld
from high_level.aggregate.packed import Part, pack_parts
from high_level.aggregate.processor import Settings
from high_level.aggregate.rollup import Layout, QueryRollup
from high_level.join.step import charge_losses, close_output, live_hosts, mark_pane, partition_status

I64 = np.int64
ZMAGIC = b"LWDZ"  # a zstd-compressed codec blob follows


@dataclass(frozen=True)
class DistinctLayout:
    """What a distinct needs of its spec and input (plain data, cheap to ship to Spark workers)."""

    name: str
    input: str
    topic: str
    width: int  # words of an input row after the timestamp
    key: tuple[int, ...]  # row words of the identity fields
    within_ns: int
    partitions: int
    rollup: Layout

    @classmethod
    def of(cls, d: DistinctSpec, sel: Q.SelectSpec) -> DistinctLayout:
        key = tuple(w for f in d.identity(sel) for w in sel.word_index(f))
        return cls(
            d.name,
            sel.name,
            sel.topic,
            sel.width,
            key,
            d.within_ns,
            sel.kafka.partitions,
            Layout.of(distinct_query(d, sel)),
        )


def keep_mask(
    hist_ts: np.ndarray, hist_key: np.ndarray, ts: np.ndarray, key: np.ndarray, within: int
) -> np.ndarray:
    """bool[len(ts)]: which candidate rows have no copy in ``[ts - within, ts]`` before them among the
    history and the candidates (equal rows: the first one). Sorted by identity then time, a row's only
    possible copy-predecessor is the row just before it."""
    all_ts = np.concatenate([hist_ts, ts])
    all_key = np.concatenate([hist_key, key]).reshape(len(all_ts), key.shape[1])
    cand = np.concatenate([np.zeros(len(hist_ts), bool), np.ones(len(ts), bool)])
    order = np.lexsort((cand, all_ts, *all_key.T[::-1]))  # identity, time, history first among equals
    sk, st = all_key[order], all_ts[order]
    dup = np.zeros(len(st), bool)
    if len(st) > 1:
        dup[1:] = (sk[1:] == sk[:-1]).all(axis=1) & (st[1:] - st[:-1] <= within)
    keep = np.empty(len(st), bool)
    keep[order] = ~dup
    return keep[len(hist_ts) :]


class DupElim:
    """One distinct's state on one Kafka partition (a pure, serialisable object)."""

    def __init__(self, layout: DistinctLayout, settings: Settings) -> None:
        self.layout = layout
        self.meld = Meld(settings.host_timeout_ms, settings.expected_hosts, settings.max_gap_ms)
        self.b: int | None = None
        self.late = 0
        self.p_ts, self.p_cols = np.empty(0, I64), np.empty((0, layout.width), I64)
        self.h_ts, self.h_key = np.empty(0, I64), np.empty((0, len(layout.key)), I64)
        self.losses: list[list[Any]] = []  # [first ns, last ns, rows, host, cause]

    def process(self, values: list[bytes], now_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """One micro-batch of this partition's messages; the rows decided and kept (ts, cols)."""
        self.meld.advance(now_ms)
        for v in values:
            m = wire.decode(v)
            if m.query != self.layout.input:
                continue
            if isinstance(m, wire.Rows):
                self.add(m.ts, m.cols)
            elif isinstance(m, wire.Punctuation):
                for lo, hi, n in m.shed:
                    self.losses.append([int(lo), int(hi), int(n), m.host, "shed"])
                for lo, hi, cause, n in m.losses:
                    if cause != "malformed":
                        self.losses.append([int(lo), int(hi), int(n), m.host, cause])
                self.meld.observe(m.host, m.incarnation, m.mark_ns, m.mark_ns, m.sent_wall_ns, now_ms)
                if m.stats.get("workers", 0) > 0:
                    self.meld.workers_of(m.host, int(m.stats["workers"]))
        return self.step()

    def add(self, ts: np.ndarray, cols: np.ndarray) -> None:
        """Rows in any order; rows below the mark are late: counted and charged, never decided."""
        ts = np.asarray(ts, I64)
        cols = np.asarray(cols, I64).reshape(len(ts), -1)
        if self.b is not None and not (ok := ts >= self.b).all():
            lt = ts[~ok]
            self.late += len(lt)
            self.losses.append([int(lt.min()), int(lt.max()), len(lt), "", "job_late"])
            ts, cols = ts[ok], cols[ok]
        self.p_ts, self.p_cols = np.concatenate([self.p_ts, ts]), np.concatenate([self.p_cols, cols])

    def step(self, now_ms: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Apply the mark: decide the pending rows below it, purge the history below ``b - within``."""
        if now_ms is not None:
            self.meld.advance(now_ms)
        lwm = self.meld.low_water_mark()
        if lwm is not None and (self.b is None or lwm > self.b):
            self.b = int(lwm)
        if self.b is None:
            return np.empty(0, I64), np.empty((0, self.layout.width), I64)
        end = self.b >= wire.END_OF_STREAM
        due = np.ones(len(self.p_ts), bool) if end else self.p_ts < self.b
        ts, cols = self.p_ts[due], self.p_cols[due]
        self.p_ts, self.p_cols = self.p_ts[~due], self.p_cols[~due]
        key = cols[:, list(self.layout.key)]
        keep = keep_mask(self.h_ts, self.h_key, ts, key, self.layout.within_ns)
        h_ts, h_key = np.concatenate([self.h_ts, ts]), np.concatenate([self.h_key, key])
        live = np.zeros(len(h_ts), bool) if end else h_ts >= self.b - self.layout.within_ns
        self.h_ts, self.h_key = h_ts[live], h_key[live]
        return ts[keep], cols[keep]

    @property
    def mark_ns(self) -> int | None:
        return self.b

    @property
    def state_rows(self) -> int:
        return len(self.p_ts) + len(self.h_ts)

    @property
    def state_bytes(self) -> int:
        return int(self.p_ts.nbytes + self.p_cols.nbytes + self.h_ts.nbytes + self.h_key.nbytes)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        head = {"b": self.b, "late": self.late, "meld": self.meld.to_dict(), "losses": self.losses}
        arrays = {"p_ts": self.p_ts, "p_cols": self.p_cols, "h_ts": self.h_ts, "h_key": self.h_key}
        return head, arrays

    def load(self, head: dict[str, Any], z: dict[str, np.ndarray]) -> None:
        self.b, self.late, self.losses = head["b"], head["late"], [list(x) for x in head["losses"]]
        self.meld.load_dict(head["meld"])
        self.p_ts, self.p_cols = z["p_ts"], z["p_cols"].reshape(-1, self.layout.width)
        self.h_ts, self.h_key = z["h_ts"], z["h_key"].reshape(-1, len(self.layout.key))


class DistinctProcessor:
    """One distinct's state in the job: every partition's :class:`DupElim` and the roll-up of kept rows."""

    def __init__(self, layout: DistinctLayout, settings: Settings) -> None:
        self.layout = layout
        self.settings = settings
        self.parts = {p: DupElim(layout, settings) for p in range(layout.partitions)}
        self.rollup = QueryRollup(layout.rollup)
        self.windows_closed = 0
        self.records = 0
        self.gaps: list[list] = []  # [first pane, last pane, records, host, cause] of output windows

    def to_bytes(self) -> bytes:
        r = self.rollup
        head: dict = {
            "closed": r.closed,
            "wc": self.windows_closed,
            "records": self.records,
            "gaps": self.gaps,
        }
        arrays = {"pane": r.pane, "key": r.key, "state": r.state}
        head["parts"] = {}
        for p, d in self.parts.items():
            h, a = d.state()
            head["parts"][str(p)] = h
            arrays |= {f"p{p}/{k}": v for k, v in a.items()}
        return codec.compress(codec.pack(head, arrays), ZMAGIC)

    @classmethod
    def from_bytes(cls, buf: bytes, layout: DistinctLayout, settings: Settings) -> DistinctProcessor:
        dp = cls(layout, settings)
        head, z = codec.unpack(codec.decompress(buf, ZMAGIC))
        dp.rollup.pane, dp.rollup.key, dp.rollup.state = z["pane"], z["key"], z["state"]
        dp.rollup.closed = head["closed"]
        dp.windows_closed, dp.records, dp.gaps = head["wc"], head["records"], [list(g) for g in head["gaps"]]
        for p, d in dp.parts.items():
            d.load(
                head["parts"][str(p)], {k.split("/", 1)[1]: v for k, v in z.items() if k.startswith(f"p{p}/")}
            )
        return dp

    def process_packed(self, values: dict[int, list[bytes]], now_ms: int) -> pd.DataFrame:
        """Messages of the input topic by Kafka partition (each in offset order) -> packed output rows."""
        rl = self.layout.rollup
        errors: dict[int, str] = {}
        for p, d in self.parts.items():
            try:
                ts, cols = d.process(values.get(p, []), now_ms)
            except wire.WireError as exc:  # a damaged batch: counted per partition, never a crash
                errors[p] = str(exc)
                ts, cols = d.step(now_ms)
            if len(ts):
                key = np.column_stack([cols[:, list(self.layout.key)], ts])
                self.records += len(ts)
                self.rollup.add((ts - rl.origin_ns) // rl.pane_ns, key, np.ones((len(ts), 1), I64))
        new_from = len(self.gaps)
        for d in self.parts.values():
            charge_losses(rl, self.gaps, d.losses, self.layout.within_ns)
            d.losses = []
        melds = [d.meld for d in self.parts.values()]
        out = close_output(
            self, rl, mark_pane(rl, [d.mark_ns for d in self.parts.values()]), new_from, melds, now_ms
        )
        live = len(live_hosts(melds))
        for p, d in self.parts.items():
            out.append(
                Part(rl, p, "status", now_ms, live, None, self.status(p, d, now_ms, errors.get(p, "")))
            )
        return pack_parts(out)

    def status(self, p: int, d: DupElim, now_ms: int, error: str) -> str:
        batch = {"late": d.late, "pending": len(d.p_ts), "history": len(d.h_ts)}
        state = (d.state_rows, d.state_bytes)
        return partition_status(
            self, p, d.mark_ns, [d.meld], state, batch, error, now_ms, {}
        ).model_dump_json()
