"""A batch of flow datagrams (NetFlow v5, v9, IPFIX, sFlow v5) -> weighted flow rows, in one Numba call.

A flow record becomes one parsed-packet row (``contract.fields`` layout) plus a weight, so it enters
the same sub-aggregation as packets (``low_level.flows.kernel``): ``count`` adds the record's packets
(the weight), ``sum(length)`` its bytes (the row's LEN), both multiplied by the exporter's sampling
rate. TS is the record's **end** time: a record is complete only when the exporter sends it, its end
is the last moment it covers, and the exporter's clock minus its inactive timeout bounds how old the
end time of any record still to come can be (``low_level.flows.source``); spreading a record over its
duration would need the start time to be trustworthy and would put one record's bytes in panes whose
low-water mark may already have passed.

The formats live apart (``netflow_v5``, ``templates`` for v9/IPFIX, ``sflow``) over one shared layout
(``layout``); this module dispatches each datagram of a batch on its version, and maps a batch's sender
addresses (``recvmmsg``'s sockaddrs) to exporter ids, so that receiving and decoding cost one Python
call per batch, not per datagram.

Bad input never raises: a datagram or set that cannot be read is counted under one of
``FLOW_ERROR_NAMES`` and skipped (the rest of the datagram is still read when its framing is intact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from contract import fields as F
from low_level.flows.layout import E_OK, E_SF_SAMPLE, E_SHORT, E_VERSION, TW, uint
from low_level.flows.netflow_v5 import v5
from low_level.flows.sflow import sflow
from low_level.flows.templates import v9_ipfix
from low_level.jit.refcount import pin

AF_INET, AF_INET6 = 2, 10


@njit(cache=True, nogil=True)
def sender_key(name):
    """A sender's sockaddr_in / sockaddr_in6 bytes -> (family and port, address words): one exporter."""
    fam = np.int64(name[0]) | (np.int64(name[1]) << 8)
    k0 = (fam << 16) | uint(name, 2, 2)
    if fam == AF_INET6:
        return k0, uint(name, 8, 8), uint(name, 16, 8)
    return k0, uint(name, 4, 4), np.int64(0)


@njit(cache=True, nogil=True)
def take_batch(got, slot, lens, namelen, names, keys, nkeys, q, now_ns, name_bytes, res):
    """Queue the got datagrams a recvmmsg call left in slots of ``slot`` bytes: q[0..3, j] = (offset,
    length, exporter id, arrival) of the j-th datagram kept; the exporter found by sender_key among
    keys[:nkeys] (key words, then exporter id), -1 for a sender not seen before (the caller registers
    it, a rare slow path, finding its sockaddr at names[offset // slot]). A datagram longer than its slot
    (lens holds real lengths: MSG_TRUNC) is left out. Resets the address lengths for the next call.

    res[0] = datagrams kept, res[1] = unknown senders, res[2] = cut datagrams, res[3] = the longest
    datagram, res[4] = bytes kept."""
    unknown = 0
    cut = 0
    longest = 0
    nbytes = 0
    j = 0
    last = 0
    for i in range(got):
        namelen[i] = name_bytes
        n = np.int64(lens[i])
        longest = max(longest, n)
        if n > slot:
            cut += 1
            continue
        nbytes += n
        k0, k1, k2 = sender_key(names[i])
        e = -1
        if last < nkeys and keys[last, 0] == k0 and keys[last, 1] == k1 and keys[last, 2] == k2:
            e = last  # runs of datagrams from one exporter are the common case
        else:
            for k in range(nkeys):
                if keys[k, 0] == k0 and keys[k, 1] == k1 and keys[k, 2] == k2:
                    e = k
                    break
        q[0, j] = i * slot
        q[1, j] = n
        q[3, j] = now_ns
        if e < 0:
            q[2, j] = -1
            unknown += 1
        else:
            q[2, j] = keys[e, 3]
            last = e
        j += 1
    pin(names)
    pin(keys)
    res[0] = j
    res[1] = unknown
    res[2] = cut
    res[3] = longest
    res[4] = nbytes
    return j


@njit(cache=True, nogil=True)
def decode(
    buf,
    offs,
    lens,
    exporters,
    arrival,
    n,
    tmpl,
    doms,
    template_timeout_s,
    rows,
    w,
    rate_out,
    ctrs,
    errs,
    res,
    exp_addr,
    stop_at,
):
    """Decode datagrams 0..n-1 (datagram i is buf[offs[i]:offs[i]+lens[i]], from exporter id exporters[i]
    whose IPv4 address is exp_addr[exporters[i]] as u32 (0 when not IPv4), received at arrival[i] ns).

    Writes records to rows / w (packets, sampled-up) / rate_out, at most ``rows.shape[0]``, and sFlow
    interface counters to ctrs; res[0] gets the records written, res[1] the datagrams consumed (less
    than n when rows is full, or once ``stop_at`` records are written: call again), res[2] the counter
    rows. errs[E_OK] counts the datagrams read whole.
    """
    cap = rows.shape[0]
    r = 0
    i = 0
    res[2] = 0
    row = np.zeros(F.NFIELDS, dtype=np.int64)
    one = np.zeros((1, TW), dtype=np.int64)
    while i < n and r < stop_at:
        p0 = offs[i]
        end = p0 + lens[i]
        if end > buf.shape[0] or p0 < 0:
            end = buf.shape[0]
        exporter = exporters[i]
        addr = exp_addr[exporter] if 0 <= exporter < exp_addr.shape[0] else np.int64(0)
        if p0 + 4 > end:
            errs[E_SHORT] += 1
            i += 1
            continue
        version = uint(buf, p0, 2)
        if version == 0 and uint(buf, p0, 4) == 5:  # sFlow v5: a 32-bit version word
            got = sflow(
                buf, p0, end, exporter, arrival[i], doms, row, rows, w, rate_out, r, cap, ctrs, res, errs
            )
            if got < 0:
                if r == 0 and res[2] == 0:  # could never fit: count it rather than loop
                    errs[E_SF_SAMPLE] += 1
                    i += 1
                    continue
                break
            if res[3] == 0:
                errs[E_OK] += 1
        elif version == 5:
            got = v5(buf, p0, end, exporter, addr, doms, rows, w, rate_out, r, cap, errs)
            if got < 0:
                break  # rows full: this datagram goes in the next call
            if got > 0:
                errs[E_OK] += 1
        elif version == 9 or version == 10:
            got = v9_ipfix(
                buf,
                p0,
                end,
                version,
                exporter,
                addr,
                tmpl,
                doms,
                template_timeout_s,
                rows,
                w,
                rate_out,
                r,
                errs,
                one,
            )
            if got < 0:
                break
        else:
            errs[E_VERSION] += 1
            got = 0
        r += got
        i += 1
    res[0] = r
    res[1] = i
    pin(buf)
    pin(rows)
    pin(tmpl)
    pin(doms)
    return r
