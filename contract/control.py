"""The control topic: the high level asks a capture host for punctuation (on-demand, as the seed means it).

In the on-demand punctuation paper the *blocked consumer* asks its idle input for a timestamp. Here
the consumer is a (query, Kafka partition) of the high-level job, whose low-water mark is held back
by the hosts in ``blocked_by``; it writes one request per such host to the control topic, which
every agent reads. The agent answers with an ordinary punctuation on the query's topic (flushing
what the new mark needs first), so nothing else in the data path changes.

A request is idempotent: it says "I wait on pane ``waiting_pane`` of this query and partition";
answering twice, or answering a request the host already satisfied, only re-sends a mark the high
level already has (the agent sends on demand only when its mark moved). Both sides rate-limit:
the job asks each (query, partition, host) at most every ``min_gap``, the agent punctuates on
request at most every ``on_demand_gap_s``.

Layout (little-endian), one Kafka message per request, key = host (utf-8)::

    magic 'LC' | version u8 | kind u8 (1 = punctuation request) | query (u16 len + utf-8)
    | host (u16 len + utf-8) | partition u32 | waiting_pane i64 | sent_wall_ns i64 | crc32 u32
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

CONTROL_TOPIC = "lowwater.control"
MAGIC = b"LC"
VERSION = 1
KIND_PUNCT_REQUEST = 1
MAX_NAME = 1024  # bytes of a query or host name
_HEAD = struct.Struct("<2sBB")
_TAIL = struct.Struct("<Iqq")
_LEN = struct.Struct("<H")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class PunctuationRequest:
    """'Host ``host``: (query, partition) waits on your mark; punctuate if you can.'"""

    query: str
    host: str
    partition: int
    waiting_pane: int  # the low-water mark the consumer has (windows >= it are open)
    sent_wall_ns: int


class ControlError(ValueError):
    """A control message that cannot be decoded: wrong magic or version, truncated or corrupted."""


def _name(text: str, what: str) -> bytes:
    raw = text.encode()
    if not raw or len(raw) > MAX_NAME:
        raise ControlError(f"{what} must be 1..{MAX_NAME} bytes of utf-8, got {len(raw)}")
    return _LEN.pack(len(raw)) + raw


def encode_request(r: PunctuationRequest) -> bytes:
    if not 0 <= r.partition < 1 << 32:
        raise ControlError(f"partition out of range: {r.partition}")
    body = (
        _HEAD.pack(MAGIC, VERSION, KIND_PUNCT_REQUEST)
        + _name(r.query, "query")
        + _name(r.host, "host")
        + _TAIL.pack(r.partition, r.waiting_pane, r.sent_wall_ns)
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_request(buf: bytes | memoryview) -> PunctuationRequest:
    """Bytes -> request; anything else (any mutation, truncation, trailing bytes) -> ControlError."""
    b = bytes(buf)
    if len(b) < _HEAD.size + 2 * _LEN.size + _TAIL.size + _CRC.size:
        raise ControlError("control message truncated")
    (crc,) = _CRC.unpack_from(b, len(b) - _CRC.size)
    if zlib.crc32(b[: -_CRC.size]) != crc:
        raise ControlError("control message checksum mismatch")
    magic, version, kind = _HEAD.unpack_from(b, 0)
    if magic != MAGIC or version != VERSION or kind != KIND_PUNCT_REQUEST:
        raise ControlError(f"not a punctuation request: magic {magic!r} version {version} kind {kind}")
    pos = _HEAD.size
    names = []
    for what in ("query", "host"):
        if pos + _LEN.size > len(b):
            raise ControlError(f"control message truncated in {what}")
        (n,) = _LEN.unpack_from(b, pos)
        pos += _LEN.size
        if n == 0 or pos + n > len(b) - _CRC.size:
            raise ControlError(f"bad {what} length {n}")
        try:
            names.append(b[pos : pos + n].decode())
        except UnicodeDecodeError as exc:
            raise ControlError(f"{what} is not utf-8") from exc
        pos += n
    if pos + _TAIL.size != len(b) - _CRC.size:
        raise ControlError("control message has the wrong length")
    partition, waiting, sent = _TAIL.unpack_from(b, pos)
    return PunctuationRequest(names[0], names[1], partition, waiting, sent)
