"""A fixed-length template's compiled plan decodes its records exactly as the generic per-record path does.

Random v9 and IPFIX templates (the IEs lowwater reads, in any order, at their usual and odd lengths, with
duplicates and unknown IEs) and random record bytes go through two collectors: one decodes with the plans
built when the templates arrived, the other with every plan switched off (``P_OK`` 0: the generic path,
which interprets the template for each record). Rows, weights, rates, error counts and per-exporter
state must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest

from contract import fields as F
from low_level.flows import layout as L
from low_level.flows.source import FlowCollector
from lowwater_testing.flows import flowset, v9

# (IE, lengths it may have): counters, times, addresses, ports, interfaces, AS, and IEs lowwater skips
POOL = [
    (1, (4, 8)), (2, (4, 8)), (85, (8,)), (86, (8,)), (4, (1,)), (5, (1,)), (6, (1, 2)), (7, (2,)),
    (11, (2,)), (8, (4,)), (12, (4,)), (27, (16, 4)), (28, (16,)), (10, (2, 4)), (14, (2, 4)),
    (15, (4,)), (16, (2, 4)), (17, (2, 4)), (21, (4,)), (22, (4,)), (152, (8,)), (153, (8,)),
    (150, (4,)), (151, (4,)), (99, (3, 12)), (2, (4,)),
]  # fmt: skip


def ipfix(domain: int, sets: list[bytes], clock_s: int = 1_700_000_010) -> bytes:
    body = b"".join(sets)
    head = (10).to_bytes(2, "big") + (16 + len(body)).to_bytes(2, "big") + clock_s.to_bytes(4, "big")
    return head + (1).to_bytes(4, "big") + domain.to_bytes(4, "big") + body


def template_set(sid: int, tid: int, fields: list[tuple[int, int]]) -> bytes:
    body = tid.to_bytes(2, "big") + len(fields).to_bytes(2, "big")
    return flowset(sid, body + b"".join(i.to_bytes(2, "big") + n.to_bytes(2, "big") for i, n in fields))


def export(rng: np.random.Generator, version: int) -> list[bytes]:
    """Templates, then data sets of random records (small counters mostly, so most records are kept)."""
    wrap = v9 if version == 9 else ipfix
    tset = 0 if version == 9 else 2
    tmpls, data = [], []
    for k in range(6):
        picks = rng.choice(len(POOL), size=int(rng.integers(1, 14)), replace=True)
        fields = [(POOL[i][0], int(rng.choice(POOL[i][1]))) for i in picks]
        tmpls.append(template_set(tset, 256 + k, fields))
        reclen = sum(n for _, n in fields)
        recs = []
        for _ in range(int(rng.integers(1, 30))):
            b = bytearray(rng.integers(0, 256, size=reclen, dtype=np.uint8).tobytes())
            p = 0
            for ie, n in fields:  # counters small enough to be kept, unless the draw says absurd
                if ie in (1, 2, 85, 86) and rng.random() < 0.9:
                    b[p : p + n] = int(rng.integers(0, 1 << 20)).to_bytes(n, "big")
                elif rng.random() < 0.3:  # the edges: zero, one, all ones
                    b[p : p + n] = (0, 1, (1 << 8 * n) - 1)[int(rng.integers(3))].to_bytes(n, "big")
                p += n
            recs.append(bytes(b))
        data.append(flowset(256 + k, b"".join(recs)))
    return [wrap(7, tmpls)] + [wrap(7, [d]) for d in data] + [wrap(7, data)]


def decoded(datagrams: list[bytes], plans: bool) -> tuple:
    col = FlowCollector()
    col.feed(datagrams[:1])
    col.decode()
    if not plans:
        col.tmpl[:, L.T_PLAN + L.P_OK] = 0
    col.feed(datagrams[1:])
    rows, w, rate = [], [], []
    while col.pending:
        b = col.decode()
        rows.append(b.rows[: b.n].copy())
        w.append(b.weights[: b.n].copy())
        rate.append(b.sampling_rate[: b.n].copy())
    return np.concatenate(rows), np.concatenate(w), np.concatenate(rate), col.errs.copy(), col.doms.copy()


@pytest.mark.parametrize("version", [9, 10])
@pytest.mark.parametrize("seed", range(8))
def test_plan_decodes_like_the_generic_path(version: int, seed: int) -> None:
    datagrams = export(np.random.default_rng(seed), version)
    fast = decoded(datagrams, plans=True)
    slow = decoded(datagrams, plans=False)
    assert len(fast[0]) > 0
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)


def test_plan_is_built_for_fixed_data_templates_only() -> None:
    """Options templates and variable-length ones keep the generic path; a data template gets a plan with
    an entry per stored IE."""
    col = FlowCollector()
    data = template_set(2, 256, [(8, 4), (12, 4), (2, 8), (1, 8), (153, 8), (7, 2), (4, 1)])
    var = template_set(2, 257, [(8, 4), (1, 0xFFFF), (2, 4)])
    col.feed([ipfix(3, [data, var])])
    col.decode()
    valid = col.tmpl[col.tmpl[:, L.T_VALID] == 1]
    by_id = {int(r[L.T_ID]): r for r in valid}
    plan = by_id[256][L.T_PLAN :]
    assert plan[L.P_OK] == 1 and plan[L.P_IPVER] == 4
    ops = {int(plan[L.P_ENTRIES + 3 * e + 2]) for e in range(int(plan[L.P_N]))}
    assert ops == {F.SPORT, L.OP_PROTO, L.OP_SRC4, L.OP_DST4}
    assert by_id[257][L.T_PLAN + L.P_OK] == 0
