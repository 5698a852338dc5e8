"""The shared layout of flow decoding: error reasons, information elements, and the template, source and
interface-counter tables (int64 arrays the Numba decoders read and write), defined once for every format.

A flow record becomes one parsed-packet row (``contract.fields`` layout) plus a weight (its packets); the
formats (``netflow_v5``, ``templates`` for v9/IPFIX, ``sflow``) only fill that row differently.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# error / event counters (index into FLOW_ERROR_NAMES)
E_OK, E_SHORT, E_VERSION, E_SET_LENGTH, E_UNKNOWN_TEMPLATE, E_BAD_TEMPLATE, E_TABLE_FULL = 0, 1, 2, 3, 4, 5, 6
E_V5_COUNT, E_EXPIRED, E_NO_END_TIME, E_ABSURD = 7, 8, 9, 10
E_SF_SAMPLE, E_SF_NO_HEADER, E_SF_HEADER_PROTO, E_SF_UNKNOWN = 11, 12, 13, 14
E_CUT = 15  # longer than the receive slot (low_level.flows.receive): the slots grow, this one is lost
FLOW_ERROR_NAMES: tuple[str, ...] = (
    "ok",
    "truncated",
    "wrong_version",
    "bad_set_length",
    "unknown_template",
    "bad_template",
    "template_table_full",
    "bad_v5_count",
    "expired_template",
    "no_end_time",
    "absurd_counter",
    "sflow_bad_sample",
    "sflow_no_header",
    "sflow_header_not_ethernet",
    "sflow_unknown_sample",
    "cut_at_receive",
)
NFLOWERR = len(FLOW_ERROR_NAMES)

# information elements read (IANA IPFIX ids == NetFlow v9 field types below 128)
IE_BYTES, IE_PKTS, IE_PROTO, IE_TOS, IE_FLAGS, IE_SPORT, IE_SRC4, IE_IN_IF, IE_DPORT, IE_DST4 = range(10)
IE_LAST, IE_FIRST, IE_SRC6, IE_DST6, IE_START_MS, IE_END_MS, IE_START_S, IE_END_S = range(10, 18)
IE_BYTES_TOTAL, IE_PKTS_TOTAL, IE_SAMPLING, IE_SPI, IE_SPS, IE_SYSINIT, IE_RANDOM_INTERVAL = range(18, 25)
IE_OUT_IF, IE_NEXT_HOP4, IE_SRC_AS, IE_DST_AS = range(25, 29)
NIE = 29
_IE_IDS = (1, 2, 4, 5, 6, 7, 8, 10, 11, 12, 21, 22, 27, 28, 152, 153, 150, 151, 85, 86, 34, 305, 306, 160, 50)
_IE_IDS += (14, 15, 16, 17)
IE_INDEX = np.full(512, -1, dtype=np.int64)
for _k, _ie in enumerate(_IE_IDS):
    IE_INDEX[_ie] = _k

# template table: one row per template
T_VALID, T_EXP, T_DOM, T_ID, T_RECLEN, T_SEEN, T_OPT, T_VAR, T_NF = range(9)
T_FIELDS = 9  # then (offset, length) per IE; offset -1 when the template lacks it
# then, for templates with variable-length fields (T_VAR 1), (length, IE index or -1) of each field in
# order: such a record is walked field by field (RFC 7011 7: length 65535, a 1- or 3-byte prefix)
T_LIST = T_FIELDS + 2 * NIE
MAX_VAR_FIELDS = 64
VARLEN = 0xFFFF
# then a fixed-length data template's compiled plan (``templates.compile_plan``, built once when the
# template arrives): P_OK 1 when the record is decoded by the plan; the (offset, length) of the packet,
# byte and end-time IEs in the order they are tried (offset -1: absent); the address family the record
# gets; then P_N entries (offset, length, op), one per stored IE: op < NFIELDS stores the value (>= 0)
# in that row column, OP_PROTO stores it as is, OP_SRC4/OP_DST4 an IPv4 address, OP_SRC6/OP_DST6 a
# 16-byte one
T_PLAN = T_LIST + 2 * MAX_VAR_FIELDS
P_OK, P_PKTS, P_PKTS_TOTAL, P_BYTES, P_BYTES_TOTAL, P_END_MS, P_END_S, P_LAST = range(0, 15, 2)
P_IPVER, P_N, P_ENTRIES = 16, 17, 18
P_MAX = 16  # entries: more than the IEs a data record stores
OP_PROTO, OP_SRC4, OP_DST4, OP_SRC6, OP_DST6 = 100, 101, 102, 103, 104
TW = T_PLAN + P_ENTRIES + 3 * P_MAX
# per (exporter, domain) state; an sFlow source (D_KIND 1) is (agent address, sub-agent): D_DOM holds the
# sub-agent id, D_AGENT_HI/LO the agent address (lowwater's 128-bit words), D_EXP the datagrams' sender
D_VALID, D_EXP, D_DOM, D_RATE, D_SYSINIT, D_CLOCK, D_RECORDS, D_KIND, D_AGENT_HI, D_AGENT_LO = range(10)
D_DATAGRAMS = 10
DW = 11
KIND_NETFLOW, KIND_SFLOW = 0, 1
# sFlow interface counter rows (generic interface counters, record 0:1): the latest per (source, ifIndex)
C_TS, C_DOM, C_IFINDEX, C_SPEED, C_STATUS, C_IN_OCTETS, C_IN_PKTS, C_IN_ERRORS, C_IN_DISCARDS = range(9)
C_OUT_OCTETS, C_OUT_PKTS, C_OUT_ERRORS, C_OUT_DISCARDS = range(9, 13)
CW = 13
COUNTER_NAMES: tuple[str, ...] = (
    "in_octets",
    "in_packets",
    "in_errors",
    "in_discards",
    "out_octets",
    "out_packets",
    "out_errors",
    "out_discards",
)

MAX_RECORD_PACKETS = 1 << 40  # a counter above this (after sampling) is absurd: counted and dropped
NS = 1_000_000_000


def new_state(max_templates: int = 1024, max_domains: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Empty template and domain tables."""
    return np.zeros((max_templates, TW), dtype=np.int64), np.zeros((max_domains, DW), dtype=np.int64)


@njit(cache=True, nogil=True, inline="always")
def uint(buf, p, n):
    """Big-endian unsigned integer of n (1..8) bytes at p; caller has bounds-checked."""
    v = np.int64(0)
    for k in range(n):
        v = (v << 8) | np.int64(buf[p + k])
    return v


@njit(cache=True, nogil=True)
def source_row(doms, kind, exporter, dom, agent_hi, agent_lo):
    """Row of a source in doms, created on first sight; -1 when the table is full. A NetFlow/IPFIX source
    is (exporter, domain); an sFlow one is (agent address, sub-agent), whoever sent its datagrams."""
    free = -1
    for d in range(doms.shape[0]):
        if doms[d, D_VALID] == 1:
            if (
                doms[d, D_KIND] == kind
                and doms[d, D_DOM] == dom
                and doms[d, D_AGENT_LO] == agent_lo
                and doms[d, D_AGENT_HI] == agent_hi
                and (kind == KIND_SFLOW or doms[d, D_EXP] == exporter)
            ):
                return d
        elif free < 0:
            free = d
    if free >= 0:
        doms[free, :] = 0
        doms[free, D_VALID] = 1
        doms[free, D_EXP] = exporter
        doms[free, D_DOM] = dom
        doms[free, D_RATE] = 1
        doms[free, D_SYSINIT] = -1
        doms[free, D_KIND] = kind
        doms[free, D_AGENT_HI] = agent_hi
        doms[free, D_AGENT_LO] = agent_lo
    return free


@njit(cache=True, nogil=True)
def heard(doms, kind, exporter, dom, agent_hi, agent_lo, clock, errs):
    """A datagram from a source (see source_row): its row, its datagram counted and its clock advanced;
    -1 when the table is full (counted)."""
    d = source_row(doms, kind, exporter, dom, agent_hi, agent_lo)
    if d < 0:
        errs[E_TABLE_FULL] += 1
        return d
    doms[d, D_DATAGRAMS] += 1
    if clock > doms[d, D_CLOCK]:
        doms[d, D_CLOCK] = clock
    return d
