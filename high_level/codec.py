"""Compact, pickle-free state bytes: a small JSON header plus raw little-endian numpy buffers.

Why not pickle: state lives in Spark's checkpoint for as long as the job runs, so it must be safe to
load (no code execution) and readable by a later build. JSON holds the small per-host metadata, the
arrays (pane tables) travel as raw buffers described by dtype and shape.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pyarrow as pa

MAGIC = b"LWS1"
_LEN = struct.Struct("<I")
_RAWLEN = struct.Struct("<Q")
_DTYPES = {"<i8", "<u8", "<f8", "|b1", "<i4"}


class CodecError(ValueError):
    """State bytes that cannot be decoded (foreign, truncated or from an incompatible build)."""


def pack(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """Serialise JSON-able ``meta`` and named arrays into one byte string."""
    descr = []
    bufs = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        if a.dtype.str not in _DTYPES:
            raise CodecError(f"array {name!r}: dtype {a.dtype.str} not supported")
        b = a.tobytes()
        descr.append([name, a.dtype.str, list(a.shape), len(b)])
        bufs.append(b)
    head = json.dumps({"meta": meta, "arrays": descr}, separators=(",", ":")).encode()
    return b"".join((MAGIC, _LEN.pack(len(head)), head, *bufs))


def unpack(buf: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`; raises CodecError on anything malformed."""
    buf = bytes(buf)
    if buf[:4] != MAGIC or len(buf) < 8:
        raise CodecError("not lowwater state bytes")
    (n,) = _LEN.unpack_from(buf, 4)
    try:
        head = json.loads(buf[8 : 8 + n])
    except ValueError as exc:
        raise CodecError(f"bad state header: {exc}") from None
    pos = 8 + n
    arrays: dict[str, np.ndarray] = {}
    for name, dt, shape, size in head["arrays"]:
        if dt not in _DTYPES or pos + size > len(buf):
            raise CodecError(f"array {name!r} is truncated or of an unknown dtype")
        a = np.frombuffer(buf, dtype=dt, count=size // np.dtype(dt).itemsize, offset=pos)
        arrays[name] = a.reshape(shape).copy()
        pos += size
    if pos != len(buf):
        raise CodecError("trailing bytes after the state arrays")
    return head["meta"], arrays


def compress(raw: bytes, magic: bytes) -> bytes:
    """``magic``, the raw length, then ``raw`` zstd-compressed.

    Why: state bytes cross the Python <-> JVM boundary and land in the state store (and its changelog)
    every micro-batch, at a cost per byte on every hop (protobuf or pickling, the socket, RocksDB);
    zstd shrinks pane tables several times for far less CPU than those hops spend on the raw bytes."""
    return magic + _RAWLEN.pack(len(raw)) + pa.compress(raw, codec="zstd", asbytes=True)


def decompress(buf: bytes, magic: bytes) -> bytes:
    """Inverse of :func:`compress`; bytes that do not start with ``magic`` (written uncompressed by an
    earlier build) are returned as they are."""
    buf = bytes(buf)
    if buf[: len(magic)] != magic:
        return buf
    if len(buf) < len(magic) + _RAWLEN.size:
        raise CodecError("compressed state bytes are truncated")
    (n,) = _RAWLEN.unpack_from(buf, len(magic))
    try:
        return pa.decompress(
            buf[len(magic) + _RAWLEN.size :], decompressed_size=n, codec="zstd", asbytes=True
        )
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CodecError(f"compressed state bytes do not decompress: {exc}") from None
