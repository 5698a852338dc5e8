"""Batched UDP receive: Linux ``recvmmsg(2)`` through ctypes, many datagrams per system call.

Why: one ``recvfrom_into`` per datagram costs a system call and a Python round trip each; flow export
arrives as a stream of small datagrams, so the collector's CPU per record was mostly that loop. Here one
call fills up to ``vlen`` slots of the caller's buffer (64 KiB each: no UDP datagram is longer) with the
sender addresses alongside. Unavailable (not Linux, no libc
symbol) -> :data:`AVAILABLE` is False and callers keep ``recvfrom_into``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket

import numpy as np

MSG_DONTWAIT = 0x40
_NAME = 128  # sockaddr_storage


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


try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _recvmmsg = _libc.recvmmsg
    _recvmmsg.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Mmsghdr),
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    _recvmmsg.restype = ctypes.c_int
    AVAILABLE = True
except (OSError, AttributeError):
    AVAILABLE = False


class BatchReceiver:
    """Up to ``vlen`` datagrams per call into fixed landing slots, then packed into the caller's buffer.

    The slots' iovecs are set once (a per-call Python loop over every slot cost more than the system
    calls saved); each received datagram is then copied once to where the caller wants it, end to end.
    """

    def __init__(self, sock: socket.socket, vlen: int = 64, slot: int = 65536) -> None:
        self.sock, self.vlen, self.slot = sock, vlen, slot
        self.land = np.zeros(vlen * slot, dtype=np.uint8)
        self.msgs = (_Mmsghdr * vlen)()
        self.iovs = (_Iovec * vlen)()
        self.names = ctypes.create_string_buffer(_NAME * vlen)
        self._addr: dict[bytes, tuple[str, int]] = {}
        base = ctypes.addressof(self.names)
        for k in range(vlen):
            self.iovs[k].iov_base = self.land.ctypes.data + k * slot
            self.iovs[k].iov_len = slot
            h = self.msgs[k].msg_hdr
            h.msg_name = base + k * _NAME
            h.msg_namelen = _NAME
            h.msg_iov = ctypes.pointer(self.iovs[k])
            h.msg_iovlen = 1

    def receive(self, buf: np.ndarray, off: int) -> list[tuple[int, int, tuple[str, int]]]:
        """Datagrams received now (without waiting), packed into buf from off while they fit: a list of
        (offset, length, sender). A datagram that does not fit waits in its slot for the next call."""
        got = _recvmmsg(self.sock.fileno(), self.msgs, self.vlen, MSG_DONTWAIT, None)
        if got < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            raise OSError(e, "recvmmsg failed")
        out = []
        for k in range(got):
            m = self.msgs[k]
            n = int(m.msg_len)
            h = m.msg_hdr
            key = ctypes.string_at(h.msg_name, h.msg_namelen)
            h.msg_namelen = _NAME
            addr = self._addr.get(key)
            if addr is None:
                addr = self._addr[key] = _sockaddr(key)
            buf[off : off + n] = self.land[k * self.slot : k * self.slot + n]
            out.append((off, n, addr))
            off += n
        return out


def _sockaddr(raw: bytes) -> tuple[str, int]:
    """(host, port) of a sockaddr_in / sockaddr_in6, as ``recvfrom`` gives it."""
    fam = int.from_bytes(raw[:2], "little")
    port = int.from_bytes(raw[2:4], "big")
    if fam == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
    if fam == socket.AF_INET6 and len(raw) >= 24:
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    return "?", port
