"""Batched UDP receive for the flow collector: Linux ``recvmmsg(2)`` through ctypes, many datagrams per call.

Why: flow export is a stream of small datagrams, and one ``recvfrom`` per datagram costs a system call
and a Python round trip each. Here one call fills up to ``vlen`` slots of one contiguous buffer, with
their lengths and sender addresses in arrays set up once: nothing is done per datagram in Python, the
decoder reads the slots where they landed.

**Dense slots.** A slot is as long as the largest datagram seen (rounded up to a power of two, at least
``MIN_SLOT``), not 64 KiB: export datagrams fit a path MTU, and 64 KiB slots spread a batch over
thousands of pages whose starts all fall into the same cache sets, so the decoder read every datagram
from cold memory. ``MSG_TRUNC`` makes the kernel report a datagram's real length, so a datagram longer
than its slot is known: it is counted (``cut_at_receive``) and the slots grow for the next call, never
silently decoded short.

**Gathering a batch.** ``receive(wait_s)`` with a wait gathers up to ``vlen`` datagrams over at most
``wait_s``: it takes what the socket holds, naps (``nap_s``) while the socket's buffer gathers more,
takes again into the next free slots, and returns when the batch is full, the wait has passed, or nothing
came for ``gap_s`` (the export paused). A slow export then costs one Python turn per batch, not one
per nap. Each nap is bounded so that, at the rate just seen, the buffer fills at most half way
(a burst meanwhile still has the other half; what overflows is counted: ``socket_drops``). Why naps and
not one blocking ``recvmmsg`` (the kernel filling the batch as datagrams arrive): that wakes the
process for almost every datagram (about 4,700 wake-ups a second at 250K records/s), which cost more CPU
per record than the naps (100 a second) it saves; measured both ways on the flow bench's export.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket
import struct
import time

import numpy as np

MIN_SLOT = 2048  # bytes: a 1500-byte MTU's datagram (NetFlow, IPFIX, sFlow exporters' default)
MAX_SLOT = 65536  # no UDP datagram is longer
NAME = 128  # bytes per sender address (sockaddr_storage)
MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20
SO_MEMINFO = 55  # Linux: the socket's memory counters, SK_MEMINFO_DROPS (index 8) among them
SK_MEMINFO_DROPS = 8


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_recvmmsg = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).recvmmsg  # Linux
_recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int


_MSZ = ctypes.sizeof(_Mmsghdr)


def slot_for(length: int) -> int:
    """The slot that holds a datagram this long: a power of two from MIN_SLOT to MAX_SLOT."""
    s = MIN_SLOT
    while s < min(length, MAX_SLOT):
        s *= 2
    return s


class BatchReceiver:
    """Datagrams k = 0 .. got-1 of a call land in ``buf[k * slot:]``, ``lens[k]`` long (their real length:
    longer than ``slot`` when cut), sent from the sockaddr in ``names[k]``."""

    def __init__(
        self, sock: socket.socket, vlen: int, slot: int = MIN_SLOT, nap_s: float = 0.01, gap_s: float = 0.02
    ) -> None:
        self.sock, self.vlen = sock, vlen
        self.fd = sock.fileno()
        self.nap_s, self.gap_s = nap_s, gap_s
        # the kernel's grant (twice what was asked, up to net.core.rmem_max): a nap fills at most half
        self.rcvbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        self.naps = 0  # naps taken while gathering batches (a counter for profiles)
        self._since = time.monotonic()  # when the previous call returned: the rate seen since
        self.names = np.zeros((vlen, NAME), dtype=np.uint8)
        self.iovs = (_Iovec * vlen)()
        self.msgs = (_Mmsghdr * vlen)()
        for k in range(vlen):
            h = self.msgs[k].msg_hdr
            h.msg_name = self.names.ctypes.data + k * NAME
            h.msg_namelen = NAME
            h.msg_iov = ctypes.pointer(self.iovs[k])
            h.msg_iovlen = 1
        # the kernel writes each message's length and rewrites its address length: numpy views of both
        words = np.frombuffer(self.msgs, dtype=np.uint32).reshape(vlen, ctypes.sizeof(_Mmsghdr) // 4)
        self.lens = words[:, _Mmsghdr.msg_len.offset // 4]
        self.namelen = words[:, _Msghdr.msg_namelen.offset // 4]
        self._msgs_at = ctypes.addressof(self.msgs)
        self.slot = 0
        self.buf = np.zeros(0, dtype=np.uint8)
        self.resize(slot)

    def resize(self, slot: int) -> None:
        """Slots of this many bytes from the next call on (a new buffer: no datagram may be waiting in it)."""
        self.slot = slot
        self.buf = np.zeros(self.vlen * slot, dtype=np.uint8)
        base = self.buf.ctypes.data
        for k in range(self.vlen):
            self.iovs[k].iov_base = base + k * slot
            self.iovs[k].iov_len = slot

    def receive(self, wait_s: float = 0.0) -> int:
        """Take up to vlen datagrams; returns how many (0: none came). Without a wait: what the socket holds
        now. With one: gather until vlen are in, wait_s has passed or none came for gap_s (module doc), so
        a datagram waits here at most about wait_s."""
        got = self._take(0)
        if wait_s > 0 and got < self.vlen:
            now = time.monotonic()
            end, heard = now + wait_s, now
            # a nap lets at most half the socket's buffer fill at the rate seen (a datagram holds about
            # its slot plus the kernel's overhead), and takes no longer than filling the batch would
            rate = got / max(now - self._since, 1e-6)
            room = self.rcvbuf / (2 * (self.slot + 1024))
            while got < self.vlen and now < end and now - heard < self.gap_s:
                nap = min(self.nap_s, end - now)
                if rate > 0:
                    nap = min(nap, room / rate, (self.vlen - got) / rate)
                time.sleep(nap)
                self.naps += 1
                k = self._take(got)
                now = time.monotonic()
                if k:
                    got, heard = got + k, now
        self._since = time.monotonic()
        return got

    def _take(self, first: int) -> int:
        """What the socket holds now, into slots first .. vlen-1 (one system call)."""
        got = _recvmmsg(
            self.fd, self._msgs_at + first * _MSZ, self.vlen - first, MSG_DONTWAIT | MSG_TRUNC, None
        )
        if got < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return 0
            raise OSError(e, f"recvmmsg: {errno.errorcode.get(e, e)}")
        return got


def socket_drops(sock: socket.socket) -> int:
    """Datagrams the kernel dropped at this socket (its buffer was full): SO_MEMINFO's drop counter, the
    per-socket count /proc/net/udp shows, read in one call."""
    raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (SK_MEMINFO_DROPS + 1))
    return struct.unpack_from("@I", raw, 4 * SK_MEMINFO_DROPS)[0]


def sender(name: np.ndarray) -> tuple:
    """A sockaddr_in / sockaddr_in6 as ``recvfrom`` names it: (host, port), IPv6 with flow info and scope."""
    raw = name.tobytes()
    fam = int.from_bytes(raw[:2], "little")
    port = int.from_bytes(raw[2:4], "big")
    if fam == socket.AF_INET6:
        host = socket.inet_ntop(socket.AF_INET6, raw[8:24])
        return host, port, int.from_bytes(raw[4:8], "big"), int.from_bytes(raw[24:28], "little")
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
