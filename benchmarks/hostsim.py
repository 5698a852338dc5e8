"""Virtual-time capture hosts and union around lowwater's real components, for the union benchmarks.

Why virtual time: the punctuation experiments of the seeds (on-demand punctuation Fig. 7/8, OOP N3)
run for minutes of stream time with one input at 0.05 packets/s; on the wall clock that is minutes
per setting on a shared 2-core machine. Here every host runs the real Numba kernel
(``low_level.kernel.fused.Kernel``: parse, sub-aggregate, lazy flush) and the real punctuation rule
(``low_level.host.punctuate.advance``, given the virtual clock), with the agent's heartbeat logic of
``low_level.host.agent.Agent.step`` (timer every ``interval``, on demand when idle for 5 ms, at most every
10 ms); messages are real wire batches; the union is the real high-level processor
(``high_level.aggregate.processor.PartitionProcessor``: meld, roll-up, close). The clock advances in 1-ms
ticks; a tick's messages reach the union ``delay`` later (0 unless a host is delayed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import yaml

from contract import query as Q
from contract import wire
from high_level.aggregate.processor import PartitionProcessor, Settings
from high_level.aggregate.rollup import Layout, QueryRollup
from low_level.capture.sources.generator import DEFAULT_START_NS, generate_frames
from low_level.host.punctuate import advance
from low_level.kernel.fused import Kernel
from low_level.kernel.tables import QS_CUR, QS_LATE, QS_OCC, Tables
from lowwater_testing.queries import spec

NS = 1_000_000_000
MS = 1_000_000
TICK = MS
T0 = DEFAULT_START_NS
BLOCK = 1 << 16
IDLE_AFTER = 5 * MS
ON_DEMAND_GAP = 10 * MS
MODES = ("eos", "periodic", "on_demand", "latent", "on_request")


def query(
    window: str, m: int = 1, interval: str = "1s", on_demand: bool = True, skew: str = "100ms"
) -> Q.QuerySpec:
    """A count per (src_ip, dst_ip) with the given window, lazy flush m and heartbeat settings."""
    return spec(
        "union",
        group_by=["src_ip", "dst_ip"],
        window=yaml.safe_load(window),
        table=65536,
        flush={"policy": "lazy", "m": m},
        heartbeat={"interval": interval, "skew": skew, "on_demand": on_demand},
    )


@dataclass
class SimHost:
    """One capture host on the virtual clock: Poisson packets -> real kernel -> partials + punctuation."""

    name: str
    q: Q.QuerySpec
    rate: float
    seconds: float
    mode: str  # see MODES: when this host punctuates
    delay_ns: int = 0
    seed: int = 0
    sweep_on_timer: bool = False  # flush below the data clock at every heartbeat (busy or not)
    groups: int = 2000
    punctuations: int = 0
    asked: bool = False
    arrivals: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng((self.seed, 99))
        n = rng.poisson(self.rate * self.seconds)
        self.arrivals = np.sort(T0 + rng.integers(0, int(self.seconds * NS), n)).astype(np.int64)
        self.tables = Tables.build([self.q], chunk=4096)
        self.kernel = Kernel(self.tables)
        f, c, w, _ = generate_frames(BLOCK, groups=self.groups, seed=self.seed + 1)
        self.frames, self.caplen, self.wirelen = f, c, w
        self.ts = np.zeros(BLOCK, np.int64)
        self.next_pkt = 0
        self.seq = 0
        self.last_packet = -(1 << 62)
        # the heartbeat timer starts at a random phase, as an agent's does (aligned with the pane
        # boundaries it would always fire just before the pane's data is in: the worst case)
        self.next_timer = T0 + int(rng.integers(0, self.q.heartbeat.interval_ns))
        self.last_on_demand = -(1 << 62)
        self.mark_pane: int | None = None
        self.mark_ns = 0

    def _run(self, a: int, b: int) -> None:
        while a < b:
            s = a % BLOCK
            e = min(BLOCK, s + (b - a), s + 4096)
            self.ts[s:e] = self.arrivals[a : a + (e - s)]
            self.kernel.run_arrays(self.frames, self.caplen, self.wirelen, self.ts, s, e)
            a += e - s

    def _drain(self, out: list[bytes]) -> None:
        recs = self.tables.drain(0)
        if len(recs):
            pane, key, state = self.tables.split(0, recs)
            out.append(
                wire.encode_partials(self.q.name, self.name, 1, 0, self.seq, pane, key, state, compress=False)
            )
            self.seq += len(recs)

    def _punctuate(self, now: int, idle: bool, timer: bool, out: list[bytes], eos: bool = False) -> None:
        m = advance(self.kernel, 0, now, idle, True, eos)
        self._drain(out)
        if m is not None and m.ns:
            self.mark_pane, self.mark_ns = m.pane, m.ns
        elif not timer or self.mark_pane is None:
            return
        out.append(
            wire.encode_punctuation(
                wire.Punctuation(
                    self.q.name, self.name, 1, 0, self.seq, int(self.mark_pane), int(self.mark_ns), now, {}
                )
            )
        )
        self.punctuations += 1

    def step(self, now: int) -> list[bytes]:
        """Packets that arrived before ``now``, then heartbeats as the agent would send them."""
        out: list[bytes] = []
        b = int(np.searchsorted(self.arrivals, now, side="left"))
        if b > self.next_pkt:
            self._run(self.next_pkt, b)
            self.next_pkt = b
            self.last_packet = now
            self._drain(out)
        idle = now - self.last_packet >= IDLE_AFTER
        hb = self.q.heartbeat
        if self.mode == "eos":
            return out
        if self.mode == "latent":  # the ideal: this input's progress is known without a message
            self._punctuate(now, True, False, out)
            return out
        if self.sweep_on_timer and now >= self.next_timer and not idle:
            self.kernel.flush_below(0, int(self.kernel.t.qs[0, QS_CUR]))  # below the current data pane
        if now >= self.next_timer:
            self.next_timer = now + hb.interval_ns
            self._punctuate(now, idle, True, out)
        elif self.mode == "on_request" and self.asked and now - self.last_on_demand >= ON_DEMAND_GAP:
            self.asked = False
            self.last_on_demand = now
            self._punctuate(now, True, False, out)
        elif (
            self.mode == "on_demand" and hb.on_demand and idle and now - self.last_on_demand >= ON_DEMAND_GAP
        ):
            self.last_on_demand = now
            self._punctuate(now, idle, False, out)
        return out

    def finish(self, now: int) -> list[bytes]:
        out: list[bytes] = []
        self._punctuate(now, True, False, out, eos=True)
        return out

    @property
    def occupancy(self) -> int:
        return int(self.tables.qs[0, QS_OCC])

    @property
    def late(self) -> int:
        return int(self.tables.qs[0, QS_LATE])


def first_due_end(r: QueryRollup) -> int | None:
    """End of the earliest window that holds data and is not emitted yet (None when there is none)."""
    if len(r) == 0:
        return None
    w = int(r.pane.min()) if r.closed is None else max(int(r.pane.min()), int(r.closed))
    return int(r.layout.window_end_ns(np.array([w]))[0])


@dataclass
class Result:
    """What one union run measured."""

    latency_s: list[float]
    rows_peak: int  # state: the union's pane rows + the hosts' table entries, sampled every 10 ms
    rows_mean: float
    wait_fraction: float  # of the time, a window holding data had ended but was not emitted yet
    punctuations_per_s: float
    late_records: int
    windows: int
    packets_expected: int  # over the measured windows (a packet counts once per window it lies in)
    packets_missing: int

    def figures(self) -> dict[str, float | int]:
        """The row every union benchmark writes for one run (latency NaN when no window closed)."""
        lat = np.array(self.latency_s) if self.latency_s else np.array([np.nan])
        return {
            "windows": len(self.latency_s),
            "latency_mean_s": float(np.mean(lat)),
            "latency_p50_s": float(np.median(lat)),
            "latency_max_s": float(np.max(lat)),
            "wait_fraction": self.wait_fraction,
            "rows_peak": self.rows_peak,
            "rows_mean": self.rows_mean,
            "punctuations_per_s": self.punctuations_per_s,
            "late_records": self.late_records,
            "packets_expected": self.packets_expected,
            "packets_missing": self.packets_missing,
        }


def run(
    hosts: list[SimHost],
    seconds: float,
    *,
    union: str = "punct",
    watermark_delay_ns: int = 0,
    latent: tuple[str, ...] = (),
    margin_s: float = 5.0,
    warm_s: float = 2.0,
    ask: bool = False,
) -> Result:
    """Run the hosts and a union for ``seconds`` of virtual time, then end of stream.

    ``union``: ``punct`` = the real processor (windows close by the min over hosts' punctuation; hosts
    in ``latent`` do not count, their progress being known); ``watermark`` = the same roll-up closed
    by max event time seen - ``watermark_delay_ns`` (Spark's rule, event time = pane start), late
    partials dropped. ``ask``: the union asks the hosts that block it for punctuation (on request).
    """
    q = hosts[0].q
    lay = Layout.of(q)
    expected = tuple(h.name for h in hosts if h.name not in latent)
    proc = PartitionProcessor([lay], 0, Settings(host_timeout_ms=3_600_000, expected_hosts=expected))
    qs = proc.queries[q.name]
    wm_roll = QueryRollup(lay)
    max_pane = None
    late_wm = 0
    inflight: list[tuple[int, int, list[bytes]]] = []  # (deliver at, order, messages)
    closed_at: dict[int, int] = {}
    rows: list[int] = []
    rows_peak = 0
    wait_ns = 0
    due_end: int | None = None
    counted: dict[int, int] = {}
    end = T0 + int(seconds * NS)
    now = T0
    order = 0
    while now <= end + TICK:
        for h in hosts:
            msgs = h.finish(now) if now > end else h.step(now)
            if msgs:
                inflight.append(
                    (
                        now + h.delay_ns,
                        order,
                        [
                            m
                            for m in msgs
                            if h.name not in latent or not isinstance(wire.decode(m), wire.Punctuation)
                        ],
                    )
                )
                order += 1
        due = [x for x in inflight if x[0] <= now]
        if due or now > end:
            inflight = [x for x in inflight if x[0] > now] if now <= end else []
            batch = [m for _, _, ms in sorted(due if now <= end else due + inflight) for m in ms]
            if union == "punct":
                out = proc.process(batch, now_ms=now // MS)
                fin = out[out["kind"] == "final"]
                if len(fin):
                    w = fin["window"].to_numpy(np.int64)
                    st = np.stack(fin["state"].to_numpy())[:, 0]
                    for wi in np.unique(w).tolist():
                        closed_at.setdefault(int(wi), now)
                        counted[int(wi)] = counted.get(int(wi), 0) + int(st[w == wi].sum())
                n_rows = len(qs.rollup)
                due_end = first_due_end(qs.rollup)
            else:
                for m in batch:
                    b = wire.decode(m)
                    if isinstance(b, wire.Partials) and b.n:
                        res = wm_roll.add(b.pane, b.key, b.state)
                        late_wm += int(res.late_per_host.sum())
                        pm = int(b.pane.max())
                        max_pane = pm if max_pane is None else max(max_pane, pm)
                lwm = None
                if max_pane is not None:
                    wm_ns = lay.origin_ns + max_pane * lay.pane_ns - watermark_delay_ns
                    lwm = (wm_ns - lay.origin_ns) // lay.pane_ns
                if now > end:
                    lwm = wire.END_OF_STREAM // 2
                out_w = wm_roll.close(lwm)
                for wi in np.unique(out_w.window).tolist():
                    closed_at.setdefault(int(wi), now)
                    counted[int(wi)] = counted.get(int(wi), 0) + int(out_w.state[out_w.window == wi, 0].sum())
                n_rows = len(wm_roll)
                due_end = first_due_end(wm_roll)
        if ask and union == "punct":  # the union asks the hosts that hold its low-water mark back
            blocking = set(qs.meld.blocking_hosts())
            if qs.rollup.open_windows() > 0:
                for h in hosts:
                    if h.name in blocking:
                        h.asked = True
        if due_end is not None and due_end <= now:
            wait_ns += TICK
        if (now - T0) % (10 * MS) == 0:  # state: the union's rows + the hosts' table entries
            n_rows = (len(qs.rollup) if union == "punct" else len(wm_roll)) + sum(h.occupancy for h in hosts)
            rows.append(n_rows)
            rows_peak = max(rows_peak, n_rows)
        now += TICK
    lo, hi = T0 + int(warm_s * NS), end - int(margin_s * NS)
    lat = []
    allts = np.sort(np.concatenate([h.arrivals for h in hosts]))
    w_lo = (lo - lay.origin_ns) // lay.pane_ns
    w_hi = (hi - lay.origin_ns) // lay.pane_ns - 1
    exp_total = missing = 0
    for w in range(int(w_lo), int(w_hi) + 1):
        w_end = int(lay.window_end_ns(np.array([w]))[0])
        exp = int(np.searchsorted(allts, w_end) - np.searchsorted(allts, w_end - lay.range_ns))
        exp_total += exp
        missing += exp - counted.get(w, 0)
        if w in closed_at:
            lat.append((closed_at[w] - w_end) / NS)
    sent = 0
    for h in hosts:
        sent += h.punctuations
    late = sum(h.late for h in hosts) + late_wm + sum(int(v["late"]) for v in qs.hosts.values())
    return Result(
        lat,
        rows_peak,
        float(np.mean(rows)) if rows else 0.0,
        wait_ns / (end - T0),
        sent / seconds,
        late,
        len(lat),
        exp_total,
        missing,
    )
