"""Emulated capture hosts: turn parsed-packet rows into the Kafka messages real agents would send.

Used by the tests and the roll-up benchmark. Each host aggregates its share of the packets per
(pane, key) and, to mimic hash-table evictions, splits every group into several partial records
(each an exact aggregate over a random subset of its packets). Messages carry a send time in data
time plus the host's skew, so merging hosts by send time reproduces a lagging link. Punctuation
follows the agent's rule: mark P is sent only after every partial with pane < P.
"""

from __future__ import annotations

import heapq
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import aggregates as A
from contract import fields as F
from contract import query as Q
from contract import sketch, wire
from contract.filterlang import compile_filter, evaluate


@dataclass(frozen=True)
class Message:
    """One Kafka message of an emulated host."""

    t_ns: int  # send time (data time + the host's skew)
    host: str
    partition: int
    value: bytes
    mark_pane: int | None = None  # set for punctuation

    @property
    def is_punctuation(self) -> bool:
        return self.mark_pane is not None


def _masked_addresses(
    ver: np.ndarray, hi: np.ndarray, lo: np.ndarray, prefix4: int | None, prefix6: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each address cut to its family's prefix by :mod:`ipaddress`, not by the kernel's mask words
    (``Q.key_program``), so a wrong mask there shows up as a difference; distinct addresses once."""
    triples = np.column_stack([ver, hi, lo]).astype(np.int64)
    uniq, inv = np.unique(triples, axis=0, return_inverse=True)
    out = np.empty((len(uniq), 2), np.int64)
    for i, (v, h, lw) in enumerate(uniq.tolist()):
        if v == 4:
            net = ipaddress.IPv4Network((lw & 0xFFFF_FFFF, 32 if prefix4 is None else prefix4), strict=False)
            value = (F.IPV4_MAPPED_PREFIX << 64 >> 64) | int(net.network_address)
        else:
            addr = ((h & 0xFFFF_FFFF_FFFF_FFFF) << 64) | (lw & 0xFFFF_FFFF_FFFF_FFFF)
            net6 = ipaddress.IPv6Network((addr, 128 if prefix6 is None else prefix6), strict=False)
            value = int(net6.network_address)
        out[i] = F.to_int64(value >> 64), F.to_int64(value)
    inv = inv.reshape(-1)
    return out[inv, 0], out[inv, 1]


def _field_values(r: np.ndarray, name: str) -> np.ndarray:
    """A numeric field per packet row; dscp is the top six bits of the TOS / traffic-class byte."""
    return r[:, F.TOS] >> 2 if name == "dscp" else r[:, F.CATALOG[name].columns[0]]


def packet_partials(
    q: Q.QuerySpec, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per matching packet: (row index, pane, key words, state), the reference the low level must equal.

    Written from the query's own terms (fields, prefixes, aggregate functions), not from the kernel's
    key program or state sources, so the tests compare two independent computations.
    """
    prog = compile_filter(q.filter)
    keep = np.array([evaluate(prog, r) for r in rows], dtype=bool) if len(prog) else np.ones(len(rows), bool)
    idx = np.flatnonzero(keep)
    r = rows[idx]
    pane = (r[:, F.TS] - q.window.origin_ns) // q.window.pane_ns
    words = []
    for p in q.key_parts:
        if p.field.kind == "ip":
            c = p.field.columns[0]
            fam = r[:, F.FAMILY_COLUMN[c]]  # the address's own header's family (inner ones: INNER_IPVER)
            words.extend(_masked_addresses(fam, r[:, c], r[:, c + 1], p.prefix4, p.prefix6))
        else:
            words.append(_field_values(r, p.field.name))
    h = Q.holistic(q)
    if not words and h is None:
        words.append(np.zeros(len(r), np.int64))
    ones = np.ones(len(r), np.int64)
    cols = []
    for a in q.aggregates:  # bounded aggregates: each state column lifted from the field's values
        if not a.holistic:
            values = _field_values(r, a.field) if a.field else ones
            cols.extend(A.lift(p, values) for p in A.REGISTRY[a.fn].parts(a))
    if h is not None:  # the sub-key and its state (contract.sketch), from the aggregate's own terms
        fld = F.CATALOG[h.field or ""]
        value = (
            np.column_stack([r[:, fld.columns[0]], r[:, fld.columns[0] + 1]])
            if fld.kind == "ip"
            else _field_values(r, fld.name).reshape(-1, 1)
        ).astype(np.int64)
        if h.fn == "count_distinct" and h.hll_precision is not None:
            reg, rank = sketch.hll_register_rank(value, h.hll_precision)
            words.append(reg)
            cols.append(rank)
        else:
            if h.fn == "quantiles":
                words.append(sketch.log_bucket(value[:, 0], h.quantile_accuracy))
            else:
                words.extend(value.T)
            cols.append(_field_values(r, h.by) if h.fn == "top" and h.by else ones)
    key = np.column_stack(words) if words else np.zeros((len(r), 0), np.int64)
    return idx, pane.astype(np.int64), key.astype(np.int64), np.column_stack(cols).astype(np.int64)


def aggregate(
    q: Q.QuerySpec, group_cols: dict[str, np.ndarray], key: np.ndarray, state: np.ndarray
) -> pd.DataFrame:
    """One row per (group columns, key words), state columns merged by their merge op, sorted."""
    data = dict(group_cols)
    kcols = [f"k{i}" for i in range(key.shape[1])]
    for i, c in enumerate(kcols):
        data[c] = key[:, i]
    aggs = {}
    for j, c in enumerate(Q.state_columns(q)):
        data[f"s{j}"] = state[:, j]
        aggs[f"s{j}"] = A.MERGE_NAMES[c.merge]
    by = list(group_cols) + kcols
    return pd.DataFrame(data).groupby(by, as_index=False, sort=True).agg(aggs)


def pane_oracle(q: Q.QuerySpec, rows: np.ndarray) -> pd.DataFrame:
    """The exact per-(pane, key) state of ``q`` over parsed-packet ``rows``: THE reference aggregate
    of the test suite (low-level exactness, emulated hosts, the Spark roll-up all compare with it)."""
    _, pane, key, state = packet_partials(q, rows)
    return aggregate(q, {"pane": pane}, key, state)


def host_messages(
    q: Q.QuerySpec,
    rows: np.ndarray,
    host: str,
    *,
    partitions: int,
    incarnation: int = 1,
    punct_every_ns: int = 1_000_000_000,
    evictions: int = 3,
    skew_ns: int = 0,
    end_mark: int | None = None,
    seed: int = 0,
    max_batch: int = 4096,
) -> list[Message]:
    """All messages one host sends for ``q`` over its packets ``rows`` (sorted by send time).

    Partials of pane p leave at data time ``end(p) + e * pane/2`` for eviction round e, so a group's
    partials of one pane are spread over several messages; punctuation every ``punct_every_ns`` of
    data time carries the largest mark all of whose partials already left. ``end_mark`` (e.g.
    ``wire.END_OF_STREAM``) adds a last punctuation after everything.
    """
    rng = np.random.default_rng(seed)
    w = q.window
    _, pane, key, state = packet_partials(q, rows)
    ev = rng.integers(0, evictions, len(pane)) if len(pane) else np.empty(0, np.int64)
    df = aggregate(q, {"pane": pane, "ev": ev}, key, state)
    kw = key.shape[1]
    pk = df["pane"].to_numpy(np.int64)
    kk = df[[f"k{i}" for i in range(kw)]].to_numpy(np.int64).reshape(len(df), kw)
    sk = df[[c for c in df.columns if c.startswith("s")]].to_numpy(np.int64)
    half = w.pane_ns // 2
    send = w.origin_ns + (pk + 1) * w.pane_ns + df["ev"].to_numpy(np.int64) * half
    part = wire.partition_of(kk[:, : Q.partition_width(q)], partitions) if len(df) else np.empty(0, np.int64)
    events: list[tuple[int, int, int, bytes, int | None]] = []  # (t, order, partition, value, mark)
    seq = [0] * partitions
    order = 0
    # partial batches: one message per (send time, partition), capped at max_batch records
    groups = pd.DataFrame({"t": send, "p": part}).groupby(["t", "p"], sort=True).indices if len(df) else {}
    batches = sorted(((int(t), int(p), ix) for (t, p), ix in groups.items()), key=lambda x: (x[0], x[1]))
    pend: list[tuple[int, int, np.ndarray]] = []
    for t, p, ix in batches:
        for s in range(0, len(ix), max_batch):
            pend.append((t, p, ix[s : s + max_batch]))
    max_delay = (evictions - 1) * half
    pend_pane = np.array([int(pk[ix].min()) for _, _, ix in pend], np.int64)
    suffix_min = np.minimum.accumulate(pend_pane[::-1])[::-1] if len(pend) else pend_pane
    t_first = int(send.min()) if len(send) else w.origin_ns
    t_last = int(send.max()) if len(send) else w.origin_ns
    ticks = np.arange(t_first - t_first % punct_every_ns, t_last + punct_every_ns + 1, punct_every_ns)
    pi = 0
    for tick in ticks.tolist():
        while pi < len(pend) and pend[pi][0] <= tick:
            t, p, ix = pend[pi]
            val = wire.encode_partials(q.name, host, incarnation, p, seq[p], pk[ix], kk[ix], sk[ix])
            events.append((t, order, p, val, None))
            seq[p] += len(ix)
            order += 1
            pi += 1
        mark = (tick - max_delay - w.origin_ns) // w.pane_ns  # every pane below has all its partials out
        if pi < len(pend):
            mark = min(mark, int(suffix_min[pi]))
        for p in range(partitions):
            punct = wire.Punctuation(
                q.name, host, incarnation, p, seq[p], int(mark), w.origin_ns + int(mark) * w.pane_ns, tick, {}
            )
            events.append((tick, order, p, wire.encode_punctuation(punct), int(mark)))
            order += 1
    if end_mark is not None:
        for p in range(partitions):
            punct = wire.Punctuation(
                q.name, host, incarnation, p, seq[p], int(end_mark), wire.END_OF_STREAM, 0, {}
            )
            events.append(
                (
                    int(ticks[-1]) + punct_every_ns if len(ticks) else 0,
                    order,
                    p,
                    wire.encode_punctuation(punct),
                    int(end_mark),
                )
            )
            order += 1
    return [Message(t + skew_ns, host, p, v, m) for t, _, p, v, m in events]


def interleave(streams: list[list[Message]], seed: int = 0) -> list[Message]:
    """Merge host streams by send time with random tie-breaks; each stream keeps its own order."""
    rng = np.random.default_rng(seed)
    heap: list[tuple[int, float, int, int]] = []
    for s, msgs in enumerate(streams):
        if msgs:
            heap.append((msgs[0].t_ns, float(rng.random()), s, 0))
    heapq.heapify(heap)
    out: list[Message] = []
    while heap:
        _, _, s, i = heapq.heappop(heap)
        out.append(streams[s][i])
        if i + 1 < len(streams[s]):
            heapq.heappush(heap, (streams[s][i + 1].t_ns, float(rng.random()), s, i + 1))
    return out


def split_hosts(n_packets: int, hosts: int, seed: int = 0) -> np.ndarray:
    """A host index per packet (packets of one group are spread over hosts, like ECMP links)."""
    return np.random.default_rng(seed).integers(0, hosts, n_packets)


def window_oracle(q: Q.QuerySpec, pane_oracle: pd.DataFrame) -> pd.DataFrame:
    """Windows from a per-(pane, key) oracle (:func:`pane_oracle`), by brute force over WIDs."""
    k = q.window.panes_per_window
    kcols = [c for c in pane_oracle.columns if c.startswith("k")]
    scols = [c for c in pane_oracle.columns if c.startswith("s")]
    parts = []
    for j in range(k):  # pane p belongs to windows p .. p+k-1
        d = pane_oracle.copy()
        d["window"] = d["pane"] + j
        parts.append(d)
    d = pd.concat(parts, ignore_index=True)
    aggs = {f"s{j}": A.MERGE_NAMES[c.merge] for j, c in enumerate(Q.state_columns(q))}
    d = d[(d["window"] - (k - 1)) % q.window.panes_per_slide == 0]  # windows start every slide
    out = d.groupby(["window", *kcols], as_index=False).agg({s: aggs[s] for s in scols})
    return out.sort_values(["window", *kcols]).reset_index(drop=True)


def select_messages(
    s: Q.SelectSpec,
    rows: np.ndarray,
    host: str,
    *,
    incarnation: int = 1,
    punct_every_ns: int | None = 1_000_000_000,
    batch_ns: int = 100_000_000,
    skew_ns: int = 0,
    end: bool = True,
) -> list[Message]:
    """What one host sends for select ``s`` over its selected rows (int64[n, 1 + width], timestamp first).

    Rows leave in batches every ``batch_ns`` of data time (at the batch's end), split by the partition of
    their ``partition_by`` words; punctuation every ``punct_every_ns`` (None: only the closing one) carries
    the host's clock, as the agent does: every row below it has left. Send times are data time + skew.
    """
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    parts = s.kafka.partitions
    part = (
        wire.partition_of(rows[:, [1 + i for i in s.partition_words]], parts)
        if s.partition_by and len(rows)
        else np.zeros(len(rows), np.int64)
    )
    events: list[tuple[int, int, int, bytes, int | None]] = []
    seq = [0] * parts
    order = 0
    bt = (rows[:, 0] // batch_ns + 1) * batch_ns if len(rows) else np.empty(0, np.int64)  # batch send time
    ticks: list[int] = []
    if punct_every_ns is not None and len(rows):
        t0, t1 = int(rows[0, 0]), int(bt[-1])
        ticks = list(range(t0 - t0 % punct_every_ns + punct_every_ns, t1 + punct_every_ns, punct_every_ns))
    keys = pd.DataFrame({"t": bt, "p": part}).groupby(["t", "p"], sort=True).indices if len(rows) else {}
    batches = sorted(((int(t), int(p), ix) for (t, p), ix in keys.items()), key=lambda x: (x[0], x[1]))
    bi = 0
    for tick in [*ticks, None]:
        while bi < len(batches) and (tick is None or batches[bi][0] <= tick):
            t, p, ix = batches[bi]
            events.append(
                (t, order, p, wire.encode_rows(s.name, host, incarnation, p, seq[p], rows[ix]), None)
            )
            seq[p] += len(ix)
            order += 1
            bi += 1
        if tick is None:
            break
        # every row below the mark has left: the clock, held below the oldest row still waiting in a batch
        mark = (
            min(tick, int(rows[np.concatenate([ix for _, _, ix in batches[bi:]]), 0].min()))
            if bi < len(batches)
            else tick
        )
        for p in range(parts):
            pu = wire.Punctuation(s.name, host, incarnation, p, seq[p], mark, mark, tick, {})
            events.append((tick, order, p, wire.encode_punctuation(pu), mark))
            order += 1
    if end:
        t_end = (ticks[-1] if ticks else int(bt[-1]) if len(bt) else 0) + 1
        for p in range(parts):
            pu = wire.Punctuation(
                s.name, host, incarnation, p, seq[p], wire.END_OF_STREAM, wire.END_OF_STREAM, 0, {}
            )
            events.append((t_end, order, p, wire.encode_punctuation(pu), wire.END_OF_STREAM))
            order += 1
    return [Message(t + skew_ns, host, p, v, m) for t, _, p, v, m in events]


def select_oracle(s: Q.SelectSpec, parsed: np.ndarray) -> np.ndarray:
    """The rows select ``s`` yields from parsed-packet rows: int64[n, 1 + width], timestamp first."""
    prog = compile_filter(s.filter)
    keep = np.fromiter((evaluate(prog, r) for r in parsed), dtype=bool, count=len(parsed))
    return parsed[keep][:, [F.TS] + [c for _, c in s.columns]]


@dataclass
class Verdict:
    """One window judged against its oracle: wrong (its stored rows differ), flagged (a row says
    incomplete or the job listed it short) and the causes it was flagged for (cause -> records)."""

    window: int
    wrong: bool
    flagged: bool
    causes: dict[str, int]


def window_causes(out: pd.DataFrame, window_start_ns: dict[int, int]) -> dict[int, dict[str, int]]:
    """Per window id: why the job's output (generic rows, incl. its flagged-window rows) says it is short,
    as cause -> count: the flagged windows' causes (records; ``timeout`` counts 1 per host) and the rows'
    own columns (``timeout``: hosts not in mark, ``job_late``: late partials, ``missing``: records)."""
    import json

    rows = out[out["kind"].isin(["final", "late", "correction"])]
    short = rows[
        (rows["hosts_in_mark"] < rows["hosts_expected"])
        | (rows["late_partials"] > 0)
        | (rows["missing_records"] > 0)
    ]
    causes: dict[int, dict[str, int]] = {}
    for w, m, e, late, miss in zip(
        short["window"].tolist(),
        short["hosts_in_mark"].tolist(),
        short["hosts_expected"].tolist(),
        short["late_partials"].tolist(),
        short["missing_records"].tolist(),
        strict=True,
    ):
        c = causes.setdefault(int(w), {})
        for name, n in (("timeout", int(e) - int(m)), ("job_late", int(late)), ("missing", int(miss))):
            if n > 0:
                c[name] = max(c.get(name, 0), n)
    by_start = {v: k for k, v in window_start_ns.items()}
    for text in out[out["kind"] == "incomplete"]["status"].tolist():
        for f in json.loads(text)["windows"]:
            w = by_start.get(int(f[0]))
            if w is not None:
                c = causes.setdefault(w, {})
                c[f[6]] = c.get(f[6], 0) + max(int(f[4]), 1 if f[6] == "timeout" else 0)
    return {w: {k: v for k, v in c.items() if v > 0} for w, c in causes.items()}


def judge(
    got: dict[int, set], exp: dict[int, set], causes: dict[int, dict[str, int]], windows: Iterable[int]
) -> list[Verdict]:
    """One verdict per window of ``windows``: wrong when its stored rows (``got``) differ from the oracle's
    (``exp``), flagged when the job gave it any cause."""
    return [
        Verdict(w, got.get(w, set()) != exp.get(w, set()), bool(causes.get(w)), dict(causes.get(w, {})))
        for w in sorted(windows)
    ]


def judge_windows(
    out: pd.DataFrame, expected: pd.DataFrame, window_start_ns: dict[int, int]
) -> list[Verdict]:
    """Every window of a job's generic output rows (``high_level.aggregate.processor.OUTPUT_COLUMNS``,
    incl. its flagged-window rows) judged against ``expected`` (``window, k0.., s0..``, as
    :func:`window_oracle`): the completeness property is that no window is wrong and unflagged.
    ``window_start_ns`` maps each window id to judge to its start."""
    fin = out[out["kind"] == "final"]
    kcols = [c for c in expected.columns if c.startswith("k")]
    scols = [c for c in expected.columns if c.startswith("s")]
    got: dict[int, set[tuple[int, ...]]] = {}
    for w, k, s in zip(fin["window"].tolist(), fin["key"].tolist(), fin["state"].tolist(), strict=True):
        got.setdefault(int(w), set()).add((*map(int, k), *map(int, s)))
    exp: dict[int, set[tuple[int, ...]]] = {}
    for row in expected[["window", *kcols, *scols]].itertuples(index=False):
        exp.setdefault(int(row[0]), set()).add(tuple(int(x) for x in row[1:]))
    return judge(got, exp, window_causes(out, window_start_ns), window_start_ns)


def tier_oracle(
    q: Q.QuerySpec, window_start_ns: np.ndarray, key: np.ndarray, state: np.ndarray, width_ns: int
) -> pd.DataFrame:
    """A roll-up tier from the windows' integer state (before anything was stored): per (tier window,
    key words) the state columns merged by their ops, then finalized; columns ``window_start_ns``,
    ``k0..``, and the query's aggregate names."""
    tier = q.window.origin_ns + (window_start_ns - q.window.origin_ns) // width_ns * width_ns
    merged = aggregate(q, {"window_start_ns": tier}, key, state)
    scols = [c for c in merged.columns if c.startswith("s")]
    values = A.finalize([(a.fn, a.name) for a in q.aggregates], merged[scols].to_numpy(np.int64))
    out = merged.drop(columns=scols)
    for name, v in values.items():
        out[name] = v
    return out
