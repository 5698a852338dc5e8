"""Specialise the fused per-packet pass for one host's query set (Gigascope compiles its queries too).

A generic pass reads every query's shape (filter, key words, key columns and masks, state columns
and their merge, probe window, flush policy) from parameter arrays per packet and interprets them;
Numba can fold none of it. Here the shape is written into the source of a small module as literals:
the filter becomes straight-line statements (low_level.kernel.filter), key extraction plain loads, the
probe window's cache lines a fixed list of prefetches, the fold one statement per state column, and
every policy branch not taken disappears. Values that do not change the code's shape (table base
and size, pane length, m, i) stay in ``qp`` so that tables of different sizes share one kernel.

The module text is a pure function of the shapes, so its file name is the text's hash: it is written
once into the cache directory of this source tree (low_level.jit.cache), where Numba's ``cache=True``
keeps its machine code too. A new shape costs one compilation of a few seconds; restarts load it
from disk.
"""

from __future__ import annotations

from types import ModuleType

from contract import fields as F
from contract import sketch
from contract.filterlang import OP_IP_MATCH, OP_LOAD, OP_LOAD_DSCP, OP_LOAD_NET, compile_filter
from contract.query import (
    KEY_BUCKET,
    KEY_HLL,
    KEY_IP,
    MERGE_MAX,
    MERGE_MIN,
    MERGE_SUM,
    SRC_COMPUTED,
    SRC_DSCP,
    SRC_ONE,
    SelectSpec,
    decode_computed,
    state_columns,
)
from contract.query import key_program as query_key_program
from low_level.jit import cache as jitcache
from low_level.kernel import groupclose
from low_level.kernel.filter import statements as filter_statements
from low_level.kernel.parse import EXTRA_COLUMNS
from low_level.kernel.selection import SS_BASE, SS_LATE, SS_LATE_MIN, SS_MARK, SS_MATCHED, SS_MAXTS, SS_N
from low_level.kernel.tables import QP_IFMASK, QP_KW, QP_NA, QP_POLICY, QP_PROBES, QP_STRIDE, Tables

BLOCK = 128  # packets per block: parsed, filtered, keyed and hashed first, then folded query by query


def shape_of(tables: Tables) -> list[dict]:
    """What the generated code depends on, per query (everything else is read from ``qp`` at run time)."""
    shapes = []
    for i, q in enumerate(tables.queries):
        qp = tables.qp[i]
        close = {"close": True} if q.heartbeat.close is not None else {}  # absent: old shapes' text stays
        shapes.append(
            close
            | {
                "kw": int(qp[QP_KW]),
                "na": int(qp[QP_NA]),
                "stride": int(qp[QP_STRIDE]),
                "probes": int(qp[QP_PROBES]),
                "policy": int(qp[QP_POLICY]),
                "key": query_key_program(q).tolist(),
                "state": [[c.source, c.merge] for c in state_columns(q)],
                "square": [i for i, c in enumerate(state_columns(q)) if c.square],
                "filter": compile_filter(q.filter).tolist(),
                "iface": int(qp[QP_IFMASK]) != -1,
            }
        )
    return shapes


def _key_lines(shape: dict, ind: str) -> list[str]:
    """Straight-line key extraction of the parsed ``row`` into keys[ko:]."""
    out = []
    if not shape["key"]:
        return [f"{ind}keys[ko] = 0"]
    w = 0
    for col, kind, m4h, m4l, m6h, m6l in shape["key"]:
        src = "row[F.TOS] >> 2" if col == SRC_DSCP else f"row[{col}]"
        if col in F.ENRICH_SOURCES:  # longest-prefix match in the networks file (low_level.kernel.lpm)
            src = "enrich(nets, row, {}, {})".format(*F.ENRICH_SOURCES[col])
        if kind == KEY_HLL:  # register index of the hashed value (m4h = value words, m4l = precision)
            h = f"value_hash2(row[{col}], row[{col + 1}])" if m4h == 2 else f"value_hash1({src})"
            out.append(f"{ind}keys[ko + {w}] = hll_register({h}, {m4l})")
            w += 1
        elif kind == KEY_BUCKET:  # DDSketch bucket of the value (m4h = accuracy in parts per 10^9)
            out.append(f"{ind}keys[ko + {w}] = log_bucket({src}, {sketch.inv_log_gamma(m4h / 1e9)!r})")
            w += 1
        elif kind == KEY_IP:
            if m4h == m4l == m6h == m6l == -1:  # whole addresses: no family test, no masking
                out.append(f"{ind}keys[ko + {w}] = row[{col}]")
                out.append(f"{ind}keys[ko + {w + 1}] = row[{col + 1}]")
            else:
                out.append(f"{ind}if row[{F.FAMILY_COLUMN[col]}] == 4:")
                out.append(f"{ind}    keys[ko + {w}] = row[{col}] & np.int64({m4h})")
                out.append(f"{ind}    keys[ko + {w + 1}] = row[{col + 1}] & np.int64({m4l})")
                out.append(f"{ind}else:")
                out.append(f"{ind}    keys[ko + {w}] = row[{col}] & np.int64({m6h})")
                out.append(f"{ind}    keys[ko + {w + 1}] = row[{col + 1}] & np.int64({m6l})")
            w += 2
        else:
            out.append(f"{ind}keys[ko + {w}] = {src}")
            w += 1
    return out


def _computed_value(src: int, row: str) -> str:
    """The expression of a computed state source (the HLL rank of the value words) over ``row[...]``."""
    col, dscp, words, p = decode_computed(src)
    if words == 2:
        h = f"value_hash2({row}[{col}], {row}[{col + 1}])"
    else:
        h = f"value_hash1({row}[{col}] >> 2)" if dscp else f"value_hash1({row}[{col}])"
    return f"hll_rank({h}, {p})"


def _source_columns(src: int) -> set[int]:
    """Parsed-packet columns a state source reads."""
    if src == SRC_ONE:
        return set()
    if src == SRC_DSCP:
        return {F.TOS}
    if src <= SRC_COMPUTED:
        col, _, words, _ = decode_computed(src)
        return {col, col + 1} if words == 2 else {col}
    return {src}


def _phase1(q: int, shape: dict, ind: str) -> list[str]:
    """Per-query selection of one parsed packet: interface mask, filter, key, hash, prefetch."""
    conds = []
    lines = [f"{ind}# query {q}"]
    if shape["iface"]:
        conds.append(f"((not use_iface) or (qp[{q}, QP_IFMASK] >> row[F.IFACE]) & 1 != 0)")
    if shape["filter"]:
        flines, result = filter_statements(shape["filter"], f"f{q}_")
        lines += [ind + line for line in flines]
        conds.append(f"{result} != 0")
    body = ind
    if conds:
        lines.append(f"{ind}if {' and '.join(conds)}:")
        body = ind + "    "
    window = shape["probes"] * shape["stride"]  # words of the probe window
    lines += [f"{body}j = c{q}", f"{body}ko = ({q} * BLOCK + j) * MAXKW"]
    lines += _key_lines(shape, body)
    lines += [
        f"{body}h = slot_hash_at(keys, ko, {shape['kw']})",
        f"{body}sel[{q}, j] = i",
        f"{body}hs[{q}, j] = h",
        f"{body}pos = base{q} + np.int64(h & umask{q}) * {shape['stride']}",
        f"{body}if pos + {window - 1} >= ntab:  # (prefetches never fault, but stay in the array)",
        f"{body}    pos = max(ntab - {window}, 0)",
    ]
    if shape.get("close"):  # a connection's FIN/RST: note its close (low_level.kernel.groupclose)
        lines += [
            f"{body}if row[F.PROTO] == {groupclose.TCP} and (row[F.TCP_FLAGS] & {groupclose.FIN_RST}) != 0:",
            f"{body}    note_close({q}, row[F.TS], keys, ko, h, qp, qs, tab)",
        ]
    # every cache line of the probe window: one prefetch per 8 words, and the window's last word
    lines += [f"{body}prefetch_w(tab, pos + {k})" for k in range(0, window, 8)]
    if (window - 1) % 8:
        lines.append(f"{body}prefetch_w(tab, pos + {window - 1})")
    lines.append(f"{body}c{q} = j + 1")
    return lines


def _fold_lines(shape: dict, ind: str) -> list[str]:
    """Merge the packet into the state words at tab[spos:], one statement per state column."""
    out = []
    for c, (src, merge) in enumerate(shape["state"]):
        if src == SRC_ONE:
            v = "np.int64(1)"
        elif src == SRC_DSCP:
            v = "rows[ro + F.TOS] >> 2"
        elif src <= SRC_COMPUTED:
            v = _computed_value(src, "rows").replace("rows[", "rows[ro + ")
        else:
            v = f"rows[ro + {src}]"
        out.append(f"{ind}v = {v}")
        if c in shape.get("square", ()):  # the square of the value (contract.aggregates.LIFT_SQUARE)
            out.append(f"{ind}v = v * v")
        out.append(f"{ind}if fresh:")
        out.append(f"{ind}    tab[spos + {c}] = v")
        if merge == MERGE_SUM:
            out.append(f"{ind}else:")
            out.append(f"{ind}    tab[spos + {c}] += v")
        elif merge == MERGE_MIN:
            out.append(f"{ind}elif v < tab[spos + {c}]:")
            out.append(f"{ind}    tab[spos + {c}] = v")
        elif merge == MERGE_MAX:
            out.append(f"{ind}elif v > tab[spos + {c}]:")
            out.append(f"{ind}    tab[spos + {c}] = v")
    return out


_AGGREGATE = '''
@njit(cache=True, nogil=True)
def aggregate_q{q}({args}):
    """Fold query {q}'s selected packets of one block, in arrival order, into its table."""
    q = {q}
    base = qp[q, QP_BASE]
    umask = np.uint64(qp[q, QP_SIZE] - 1)
    origin, pane_ns = qp[q, QP_ORIGIN], qp[q, QP_PANE_NS]
    m, every = qp[q, QP_M], qp[q, QP_I]
    mark = qs[q, QS_MARK]
    started, cur = qs[q, QS_STARTED], qs[q, QS_CUR]
    late, matched, maxts = qs[q, QS_LATE], qs[q, QS_MATCHED], qs[q, QS_MAXTS]
    evict, overdue, tick = qs[q, QS_EVICT], qs[q, QS_OVERDUE], qs[q, QS_TICK]
    # pane of the last timestamp seen, valid for ts in [plo, phi): saves the division for most packets
    plo, phi, lpane = np.int64(1), np.int64(0), np.int64(0)
    for j in range(cnt):
        ro = sel[q, j] * NF
        ko = (q * BLOCK + j) * MAXKW
        t = rows[ro + F.TS]
        if t >= plo and t < phi:
            pane = lpane
        else:
            pane = (t - origin) // pane_ns
            lpane = pane
            plo = origin + pane * pane_ns
            phi = plo + pane_ns
        if pane < mark:
            late += 1  # punctuation already promised this pane is complete: grammatical drop
            if pane < qs[q, QS_LATE_MIN]:
                qs[q, QS_LATE_MIN] = pane  # the oldest pane that lost a packet (charged to its windows)
            continue
        matched += 1
        if t > maxts:
            maxts = t
        if started == 0:
            started = 1
            cur = pane
            qs[q, QS_STARTED] = 1
            qs[q, QS_CUR] = pane
        elif pane > cur:
            old = cur
            cur = pane
            qs[q, QS_CUR] = pane
            flush.on_advance(q, old, pane, qp, qs, tab, out, pane_counts)
        if pane < cur - m:
            # older than the table's horizon but not late: ship it as its own one-packet partial
            emit_packet_at(q, pane, keys, ko, rows, ro, qp, qs, out, scols)
            overdue += 1
            continue
        s0 = hs[q, j] & umask
        burst = {iop}
        probing = True
        while probing:
            probing = False
            match = -1
            empty = -1
            victim = -1
            victim_pane = PANE_MAX
            for jj in range({probes}):
                pos = base + np.int64((s0 + np.uint64(jj)) & umask) * {stride}
                sp = tab[pos]
                if sp == EMPTY:
                    if empty < 0:
                        empty = pos
                else:
                    if sp == pane and {key_eq}:
                        match = pos
                        break
                    if sp < victim_pane:  # the oldest probed entry (first on ties) is the victim
                        victim_pane = sp
                        victim = pos
            if match < 0 and empty < 0 and burst and victim_pane >= cur:
                # IOP: a current-pane entry would leave while old ones remain: flush them, re-probe
                flush.iop_burst(q, qp, qs, tab, out, pane_counts)
                burst = False
                probing = True
        fresh = match < 0
        if fresh:
            if empty < 0:
                emit_slot(q, victim, qp, qs, tab, out, pane_counts)
                evict += 1
                empty = victim
            match = empty
            tab[match] = pane
{key_store}
            pane_counts[q, pane & (PANE_RING - 1)] += 1
            qs[q, QS_OCC] += 1
        spos = match + {soff}
{fold}
{policy}
    qs[q, QS_LATE], qs[q, QS_MATCHED], qs[q, QS_MAXTS] = late, matched, maxts
    qs[q, QS_EVICT], qs[q, QS_OVERDUE], qs[q, QS_TICK] = evict, overdue, tick
{pins}
'''

_POLICY = {
    0: "",
    1: """        tick += 1
        if tick >= every:
            tick = 0
            if qs[q, QS_OCC] - pane_counts[q, cur & (PANE_RING - 1)] > 0:
                flush.slow_tick(q, qp, qs, tab, out, pane_counts)""",
    2: """        if qs[q, QS_OCC] - pane_counts[q, cur & (PANE_RING - 1)] > 0:
            flush.slow_tick(q, qp, qs, tab, out, pane_counts)""",
}

_HEADER = '''"""Generated by low_level.kernel.codegen for one query-set shape; do not edit (the file name is its hash)."""
# ruff: noqa
import numpy as np
from numba import njit

from contract import fields as F
from low_level.kernel import flush
from low_level.kernel.groupclose import note_close
from low_level.kernel.lpm import enrich
from low_level.kernel.parse import PARSE_OK, parse_frame, parse_frame_lean
from low_level.capture.ring import HEAD, TAIL
from low_level.jit.refcount import pin
from low_level.kernel.sketchkey import hll_rank, hll_register, log_bucket, value_hash1, value_hash2
from low_level.kernel.subaggregate import PANE_MAX, emit_packet_at, emit_slot, prefetch_w, slot_hash_at
from low_level.kernel.tables import (EMPTY, MAXKW, PANE_RING, QP_BASE, QP_I, QP_IFMASK, QP_M,
                              QP_ORIGIN, QP_PANE_NS, QP_SIZE, QS_CUR, QS_EVICT, QS_LATE, QS_MARK, QS_MATCHED,
                              QS_LATE_MIN, QS_MAXTS, QS_OCC, QS_OVERDUE, QS_STARTED, QS_TICK)

NF = {nf}  # row stride of the block's copied rows: up to the columns this kernel's parser writes
BLOCK = {block}
HC_PACKETS, HC_PARSED_OK = 0, 1
'''

_FUSED = '''
@njit(cache=True, nogil=True)
def fused_pass({args}):
    """Frames seq0 .. seq0+n-1 (frame seq in slot ``seq & smask``), block by block: phase 1 parses each
    frame once and selects, keys, hashes and prefetches it per query; phase 2 folds each query's
    selection in order (queries share no state, so per-query order is all the semantics need)."""
    ntab = tab.shape[0]
    nok = 0
{loop}
    hc[HC_PACKETS] += n
    hc[HC_PARSED_OK] += nok
    err_counts[PARSE_OK] += nok
{pins}


@njit(cache=True, nogil=True)
def process_frames(frames, offs, snaplen, caplen, wirelen, ts, iface, ctr, limit,
                   qp, qs, tab, out, pane_counts, scols, err_counts, hc, row, rows, keys, sel, hs, sout, sst, nets):
    """Consume up to ``limit`` frames from the ring (advancing its TAIL); returns how many. A non-empty
    ``offs`` gives each slot's frame offset in ``frames`` (a ring over a mapped file, Ring.over)."""
    nslots = caplen.shape[0]
    start = ctr[TAIL]
    avail = ctr[HEAD] - start
    n = avail if avail < limit else limit
    fused_pass(frames, offs, offs.shape[0] != 0, snaplen, caplen, wirelen, ts, iface, True, start, n, nslots - 1,
               qp, qs, tab, out, pane_counts, scols, err_counts, hc, row, rows, keys, sel, hs, sout, sst, nets)
    ctr[TAIL] = start + n
    return n


@njit(cache=True, nogil=True)
def process_arrays(frames2d, caplen, wirelen, ts, start, stop,
                   qp, qs, tab, out, pane_counts, scols, err_counts, hc, row, rows, keys, sel, hs, sout, sst, nets):
    """Same pass over frames held in plain arrays (benchmarks, tests); frames2d is (n, snaplen)."""
    flat = frames2d.reshape(-1)
    fused_pass(flat, caplen, False, frames2d.shape[1], caplen, wirelen, ts, caplen, False, start, stop - start, -1,
               qp, qs, tab, out, pane_counts, scols, err_counts, hc, row, rows, keys, sel, hs, sout, sst, nets)
    return stop - start
'''

# one record of the packet pass: parse the frame, then phase 1 of every query and select query
_FUSED_RECORD = """            slot = (seq0 + b0 + i) & smask
            ifc = iface[slot] if use_iface else 0
            fo = offs[slot] if use_offs else slot * snaplen
            status = {parse}(frames, fo, caplen[slot], wirelen[slot], ts[slot], ifc, row)
            if status == PARSE_OK:
                nok += 1
                ro = i * NF
{copy}
{select}
{selects}
            else:
                err_counts[status] += 1"""

# the block loop both passes share: per block of up to BLOCK records, phase 1 record by record, then
# phase 2 query by query
_BLOCK_LOOP = """{bases}
    b0 = 0
    while b0 < n:
        bn = n - b0 if n - b0 < BLOCK else BLOCK
{zero}
        for i in range(bn):
{record}
{fold}
        b0 += bn"""


def _pins(args: str) -> str:
    """pin() of every array argument at the function's single exit (see low_level.jit.refcount)."""
    scalars = {"cnt", "snaplen", "use_iface", "use_offs", "seq0", "n", "smask"}
    return "\n".join(f"    pin({a.strip()})" for a in args.split(",") if a.strip() not in scalars)


def select_shape(s: SelectSpec) -> dict:
    """What the generated code depends on for one select query: its filter and the columns it copies."""
    return {"filter": compile_filter(s.filter).tolist(), "cols": [c for _, c in s.columns]}


def _select_lines(k: int, shape: dict, ind: str) -> list[str]:
    """Select query k on one parsed packet: filter, then its row (timestamp, columns) appended to sout.

    Rows below the query's last punctuation mark are late (counted, never sent: the mark promised them
    away). The output region holds one chunk of rows, and a call never takes more than a chunk.
    """
    # the clock is every parsed packet's time, not only the selected ones': a select that matches rarely
    # still punctuates as far as the host's traffic has gone
    lines = [
        f"{ind}# select {k}",
        f"{ind}if row[F.TS] > sst[{k}, {SS_MAXTS}]:",
        f"{ind}    sst[{k}, {SS_MAXTS}] = row[F.TS]",
    ]
    body = ind
    if shape["filter"]:
        flines, result = filter_statements(shape["filter"], f"s{k}_")
        lines += [ind + line for line in flines]
        lines.append(f"{ind}if {result} != 0:")
        body = ind + "    "
    w1 = 1 + len(shape["cols"])
    lines += [
        f"{body}st_t = row[F.TS]",
        f"{body}if st_t < sst[{k}, {SS_MARK}]:",
        f"{body}    sst[{k}, {SS_LATE}] += 1",
        f"{body}    if st_t < sst[{k}, {SS_LATE_MIN}]:",
        f"{body}        sst[{k}, {SS_LATE_MIN}] = st_t",
        f"{body}else:",
        f"{body}    st_n = sst[{k}, {SS_N}]",
        f"{body}    st_o = sst[{k}, {SS_BASE}] + st_n * {w1}",
        f"{body}    sout[st_o] = st_t",
    ]
    lines += [f"{body}    sout[st_o + {i + 1}] = row[{c}]" for i, c in enumerate(shape["cols"])]
    lines += [
        f"{body}    sst[{k}, {SS_N}] = st_n + 1",
        f"{body}    sst[{k}, {SS_MATCHED}] += 1",
    ]
    return lines


def _select_columns(select_shapes: list[dict]) -> set[int]:
    cols: set[int] = set()
    for s in select_shapes:
        cols |= set(s["cols"])
        cols |= columns_read([{"key": [], "state": [], "filter": s["filter"]}])
    return cols


_AGG_ARGS = "cnt, rows, keys, sel, hs, qp, qs, tab, out, pane_counts, scols"
_FUSED_ARGS = (
    "frames, offs, use_offs, snaplen, caplen, wirelen, ts, iface, use_iface, seq0, n, smask, "
    "qp, qs, tab, out, pane_counts, scols, err_counts, hc, row, rows, keys, sel, hs, sout, sst, nets"
)


def columns_read(shapes: list[dict]) -> set[int]:
    """Parsed-packet columns the queries' filters, keys and states read (decides which parser to call)."""
    cols: set[int] = set()
    for s in shapes:
        for col, kind, m4h, *_ in s["key"]:
            if col in F.ENRICH_SOURCES:  # the address the networks file is looked up with
                addr = F.ENRICH_SOURCES[col][0]
                cols |= {addr, addr + 1, F.IPVER}
            elif kind == KEY_IP:
                cols |= {col, col + 1, F.FAMILY_COLUMN[col]}
            elif kind == KEY_HLL and m4h == 2:
                cols |= {col, col + 1}
            else:
                cols |= {F.TOS if col == SRC_DSCP else col}
        for src, _ in s["state"]:
            cols |= _source_columns(src)
        if s.get("close"):
            cols |= {F.PROTO, F.TCP_FLAGS}
        for op, a0, *_ in s["filter"]:
            if op == OP_LOAD:
                cols.add(a0)
            elif op == OP_LOAD_NET:
                addr = F.ENRICH_SOURCES[a0][0]
                cols |= {addr, addr + 1, F.IPVER}
            elif op == OP_IP_MATCH:
                cols |= {a0, a0 + 1}
            elif op == OP_LOAD_DSCP:
                cols.add(F.TOS)
    return cols


def kernel_source(shapes: list[dict], select_shapes: list[dict] | None = None) -> str:
    """The generated module's text for these query shapes (deterministic: same shapes and sources, same text)."""
    # The full parser only when a query reads one of the columns the lean one leaves unwritten. Those
    # come last in the row, so a lean kernel also keeps its block of copied rows at the short stride
    # (less cache for the same 128 packets).
    select_shapes = select_shapes or []
    full = bool((columns_read(shapes) | _select_columns(select_shapes)) & set(EXTRA_COLUMNS))
    assert set(EXTRA_COLUMNS) == set(range(min(EXTRA_COLUMNS), F.NFIELDS)), "extra columns must come last"
    parse, nf = ("parse_frame", "F.NFIELDS") if full else ("parse_frame_lean", str(min(EXTRA_COLUMNS)))
    parts = [_HEADER.format(block=BLOCK, nf=nf)]
    for q, s in enumerate(shapes):
        kw = s["kw"]
        key_eq = " and ".join(f"tab[pos + {1 + w}] == keys[ko + {w}]" for w in range(kw))
        key_store = "\n".join(f"            tab[match + {1 + w}] = keys[ko + {w}]" for w in range(kw))
        parts.append(
            _AGGREGATE.format(
                q=q,
                probes=s["probes"],
                stride=s["stride"],
                iop="True" if s["policy"] == 2 else "False",
                key_eq=key_eq,
                key_store=key_store,
                soff=1 + kw,
                fold="\n".join(_fold_lines(s, " " * 8)),
                policy=_POLICY[s["policy"]],
                pins=_pins(_AGG_ARGS),
                args=_AGG_ARGS,
            )
        )
    ind = " " * 16
    selects = [line for k, s in enumerate(select_shapes) for line in _select_lines(k, s, ind)]
    loop = block_loop(shapes, ind, _FUSED_RECORD, parse=parse, selects="\n".join(selects))
    parts.append(_FUSED.format(loop=loop, pins=_pins(_FUSED_ARGS), args=_FUSED_ARGS))
    return "".join(parts)


def block_loop(shapes: list[dict], ind: str, record: str, **fill: str) -> str:
    """The block loop of a pass (the packet pass here, the flow pass in low_level.flows.kernel) around
    ``record``, the text that reads record ``b0 + i`` into ``row``; ``record`` places ``{copy}`` (the row
    columns phase 2 reads) and ``{select}`` (phase 1 of every query: select, key, hash, prefetch, at
    indent ``ind``), and whatever else ``fill`` names."""
    select = [line for q, s in enumerate(shapes) for line in _phase1(q, s, ind)] or [ind + "pass"]
    bases = [
        f"    base{q} = qp[{q}, QP_BASE]\n    umask{q} = np.uint64(qp[{q}, QP_SIZE] - 1)"
        for q in range(len(shapes))
    ]
    zero = [f"        c{q} = 0" for q in range(len(shapes))] or ["        pass"]
    fold = [
        f"        if c{q} > 0:\n            aggregate_q{q}(c{q}, rows, keys, sel, hs, qp, qs, tab, out, pane_counts, scols)"
        for q in range(len(shapes))
    ]
    # phase 2 reads only the timestamp and the state columns' sources of the copied row
    needed = {F.TS} | {c for s in shapes for src, _ in s["state"] for c in _source_columns(src)}
    copy = "\n".join(f"{ind}rows[ro + {f}] = row[{f}]" for f in sorted(needed))
    return _BLOCK_LOOP.format(
        bases="\n".join(bases) or "    pass",
        zero="\n".join(zero),
        fold="\n".join(fold),
        record=record.format(copy=copy, select="\n".join(select), **fill),
    )


def load(tables: Tables, selects: list[SelectSpec] | None = None) -> ModuleType:
    """The compiled kernel module for these tables' query shapes and select queries (generated and imported once)."""
    return jitcache.load_generated(
        kernel_source(shape_of(tables), [select_shape(s) for s in selects or []]), "kernel"
    )
