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
    """Up to ``vlen`` datagrams per call into slots of a numpy buffer; sender addresses decoded once each."""

    def __init__(self, sock: socket.socket, vlen: int = 64, slot: int = 65536) -> None:
        self.sock, self.vlen, self.slot = sock, vlen, slot
        self.msgs = (_Mmsghdr * vlen)()
        self.iovs = (_Iovec * vlen)()
        self.names = ctypes.create_string_buffer(_NAME * vlen)
        self._addr: dict[bytes, tuple[str, int]] = {}
        base = ctypes.addressof(self.names)
        for k in range(vlen):
            h = self.msgs[k].msg_hdr
            h.msg_name = base + k * _NAME
            h.msg_iov = ctypes.pointer(self.iovs[k])
            h.msg_iovlen = 1

    def receive(self, buf: np.ndarray, off: int) -> list[tuple[int, int, tuple[str, int]]]:
        """Datagrams received now (without waiting) into buf from off, one slot each: a list of
        (offset, length, sender)."""
        n = min(self.vlen, (buf.shape[0] - off) // self.slot)
        if n <= 0:
            return []
        base = buf.ctypes.data + off
        for k in range(n):
            self.iovs[k].iov_base = base + k * self.slot
            self.iovs[k].iov_len = self.slot
            self.msgs[k].msg_hdr.msg_namelen = _NAME
        got = _recvmmsg(self.sock.fileno(), self.msgs, n, MSG_DONTWAIT, None)
        if got < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            raise OSError(e, "recvmmsg failed")
        out = []
        for k in range(got):
            m = self.msgs[k]
            key = ctypes.string_at(m.msg_hdr.msg_name, m.msg_hdr.msg_namelen)
            addr = self._addr.get(key)
            if addr is None:
                addr = self._addr[key] = _sockaddr(key)
            out.append((off + k * self.slot, int(m.msg_len), addr))
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
