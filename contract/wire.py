"""The wire format: compact binary batches that carry partial aggregates and punctuation in Kafka.

One Kafka message is one batch. Layout (little-endian)::

    magic 'LW' | version u8 | kind u8 | query (u16 len + utf-8) | host (u16 len + utf-8)
    | incarnation i64 | partition u32 | seq i64 | body | crc32 u32 (of everything before it)

``seq`` is the number of partial records this host incarnation sent to this partition before the
batch, so a consumer can prove it has everything below a punctuation mark.

PARTIALS body: ``n u32 | kw u8 | na u8 | pane i64[n] | key i64[n*kw] | state i64[n*na]`` (columnar,
so both levels convert with ``numpy.frombuffer`` instead of a per-record loop).

PARTIALS_LZ4 body: ``raw_len u32 | LZ4 frame of a PARTIALS body``. The columns compress well (panes
repeat, IPv4 keys are mostly constant bytes), LZ4 costs little CPU, and every byte saved is a byte
the high level's Kafka source, shuffle and Arrow hand-off do not move: the encoder uses it for any
body of ``COMPRESS_MIN`` bytes or more. The CRC covers the message as sent (compressed); the body
must decompress to exactly ``raw_len`` bytes (at most ``MAX_RAW``), or the batch is rejected.

PUNCT body: ``mark_pane i64 | mark_ns i64 | sent_wall_ns i64`` plus stats ``i64[8]`` (see PUNCT_STATS).
A punctuation with mark_pane P promises: every partial of this host, query and partition with
pane < P has already been sent (it is ordered before the punctuation in the partition).

ROWS body (a select query's rows): ``n u32 | w u8 | ts i64[n] | column 0 i64[n] | ... | column w-1 i64[n]``,
column-major, so the receiver takes each column with one ``numpy.frombuffer`` and the sender writes
the kernel's row block with one transpose; ROWS_LZ4 is ``raw_len u32 | LZ4 frame of a ROWS body``
(from ``COMPRESS_MIN`` bytes, as partials). ``seq`` counts rows. A punctuation on a select topic
carries its mark in nanoseconds (``mark_pane == mark_ns``): every selected row of this host, query and
partition with timestamp < mark was sent before it.
PUNCT_SHED body (kind 6, an extension of PUNCT within wire version 1): the PUNCT body, then
``n u32 | (first_pane i64, last_pane i64, records i64)[n]``: whole panes this host shed from its
uplink backlog (this query and partition) since its previous punctuation, and how many records they
held. "Sent" in the promise above then includes "shed and reported here", and ``seq`` counts shed
records as sent (so a lost punctuation still leaves a visible gap): the high level marks every window
overlapping those panes incomplete. Only a punctuation that reports shed panes uses kind 6, so
a reader of the plain kinds sees no change until a host sheds (an older reader then rejects that one
punctuation as an unknown kind and counts it; the host's next one moves its mark on).

**Version 2** (what this build writes; it still reads version 1) adds PUNCT_LOSS (kind 7): the PUNCT
body, then ``n u32 | (first_pane i64, last_pane i64, cause i64, records i64)[n]``: every loss the host
counted since its previous punctuation of this query, charged to the panes it may have hit (on a
select topic, to nanoseconds). ``cause`` indexes :data:`LOSS_CAUSES`: ``shed`` (backlog or outbox
shedding, as kind 6; counted in ``seq``), ``socket`` (the capture socket's drops, PACKET_STATISTICS
``tp_drops``), ``ring`` (the host's ring was full), ``late`` (packets below the host's own mark) and
``malformed`` (frames the parser rejected: reported, not a loss of the query's records). ``gap``,
``timeout`` and ``job_late`` (indexes 5-7, read by this build on) are the job's own causes, carried
by the closed-window feed of an aggregate query that a join reads, per window start. A count that
cannot be pinned to one pane (socket and ring drops between two reads) is charged to every pane the
interval spanned: flag rather than miss. Stats slot 8 (``reserved`` in version 1, always 0) is
``workers``: how many worker processes the capture host runs (0: not said), so the high level can
wait for every worker ``H/wN`` of an expected host ``H``.

**Version 3** (what this build writes; it still reads 1 and 2) adds ``sent_upto i64`` after the stats of
every PUNCT and PUNCT_LOSS body: the newest pane (on a select topic: the newest timestamp, ns) of
anything this host incarnation sent or shed on this query and partition up to this punctuation, a
running max (``NOT_SAID``: no record yet, or a writer that does not know). It bounds a sequence gap:
the records lost between two punctuations were sent before the later one, so they lie in [previous
mark, its ``sent_upto``] however far they led the mark. A version 1 or 2 punctuation reads as
``sent_upto=None``, and the job falls back to the largest lead it observed (a heuristic).

PUNCT_GROUPS (kind 8, an extension within version 3; group-wise punctuation, OOP App. A): ``n u32 |
kw u8 | key i64[n*kw] | done_pane i64[n]``, column-major like PARTIALS. Each row promises: every
partial of this host, query and partition whose group is ``key`` (its first ``kw`` words, the group
words) and whose pane is < ``done_pane`` was sent before this batch, *and no host will send more*:
the group is done there (a TCP flow's FIN/RST, an exporter's flow end). A query that accepts group
punctuation (``heartbeat.groups``) closes that group's windows early; a later partial of such a window
is late (counted and flagged like any late partial). ``seq`` is the host's partial count, as in PUNCT;
a reader that does not know the kind rejects the batch and counts it (nothing closes early then).

ROW_MARKS (kind 9, an extension within version 3; row windows, ``kind: rows``): ``n u32 | pw u8 |
part i64[n*pw] | rows i64[n] | sent_wall_ns i64``, column-major. A row query's host numbers the rows that
pass its filter per value of ``partition_by`` (``pw`` words; 0: one counter, ``n`` = 1); each row says
"every row of this partition value numbered below ``rows`` was sent before this batch" (its partials,
PARTIALS batches on the same topic and partition: pane = row number // pane rows, key = the partition
words then the group words, one 0 word when both are empty). ``seq`` counts the partial records sent.
A ROW_MARKS body may go on with the host's losses since its previous row marks (row windows' completeness):
``nl u32 | slack i64 | since i64[n] | cause i64[nl] | records i64[nl]`` (``cause`` indexes
:data:`LOSS_CAUSES`: ``socket``, ``ring``, ``malformed``). A dropped packet never gets a row number, so the
loss is charged to row *slots*: a lost row of counter ``i`` would have been numbered in
``[since[i], rows[i] + slack]`` (``since``: the count at the previous row marks; ``slack``: frames still
in the host's ring, numbered after this batch). A batch with losses lists every counter. Without losses the
body ends at ``sent_wall_ns`` as before, so only marks with losses change; a reader from before them rejects
such a batch (its length) and counts it, and the host's next marks move its counters on.

A slide-by-tuple query's topic (``window: {range, every}``) reuses ROWS and PUNCT, no kind of its own: a
ROWS batch carries each row's timestamp as ``ts`` and, as columns, its row number in the host's numbering
of the query's rows, its ``group_by`` words (none without groups), then its lifted state columns (``contract.aggregates.lift``, the query's state
order); a PUNCT carries the host's timestamp mark as a select topic's (``mark_pane == mark_ns``: every row
with timestamp < mark was sent before it; ``END_OF_STREAM``: the incarnation sends no more rows). ``seq``
counts rows, as on a select topic.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

MAGIC = b"LW"
VERSION = 3
READ_VERSIONS = (1, 2, 3)  # 1: no kind 7; 1 and 2: punctuation bodies without sent_upto
KIND_PARTIALS = 1
KIND_PUNCT = 2
KIND_PARTIALS_LZ4 = 3
KIND_ROWS = 4  # selected rows of a select query (see encode_rows)
KIND_ROWS_LZ4 = 5
KIND_PUNCT_SHED = 6
KIND_PUNCT_LOSS = 7  # version 2: a punctuation with loss ranges of every cause (LOSS_CAUSES)
KIND_PUNCT_GROUPS = 8  # version 3: group-wise punctuation (GroupPunctuation)
KIND_ROW_MARKS = 9  # version 3: a row query host's row counts (RowMarks)
MAX_GROUPS = 1 << 20  # groups one group punctuation may carry
# the last three only on a closed-window feed (high_level/join/feed.py): the job's own causes of an input
# window it publishes short (a sequence gap, a host timed out, partials late at the job)
LOSS_CAUSES = ("shed", "socket", "ring", "late", "malformed", "gap", "timeout", "job_late")
MAX_SHED_RANGES = 65_536  # shed pane ranges one punctuation may carry
COMPRESS_MIN = 2048  # bytes of PARTIALS body from which batches are sent compressed
MAX_RAW = 1 << 28  # largest decompressed body accepted (a corrupt length cannot allocate more)
END_OF_STREAM = np.iinfo(np.int64).max  # a mark that closes everything (a finished pcap replay)
NOT_SAID = np.iinfo(np.int64).min  # sent_upto on the wire when the writer states none (decodes to None)

PUNCT_STATS = (
    "packets",
    "matched",
    "late",
    "evictions",
    "ring_drops",
    "backlog_lost",
    "parse_errors",
    "workers",
)

_HEAD = struct.Struct("<2sBB")
_MID = struct.Struct("<qIq")
_PART = struct.Struct("<IBB")
_PUNCT = struct.Struct("<qqq8q")  # versions 1 and 2 (and kind 6 in any version)
_PUNCT3 = struct.Struct("<qqq8qq")  # version 3: ... stats, sent_upto
_CRC = struct.Struct("<I")
_RAW = struct.Struct("<I")
_COUNT = struct.Struct("<I")


class WireError(ValueError):
    """A batch that cannot be decoded: wrong magic, unknown version, truncated or corrupted."""


@dataclass(frozen=True)
class Partials:
    query: str
    host: str
    incarnation: int
    partition: int
    seq: int
    pane: np.ndarray  # int64[n]
    key: np.ndarray  # int64[n, kw]
    state: np.ndarray  # int64[n, na]

    @property
    def n(self) -> int:
        return int(self.pane.shape[0])


@dataclass(frozen=True)
class Punctuation:
    query: str
    host: str
    incarnation: int
    partition: int
    seq: int  # partial records sent to this partition by this incarnation before the punctuation
    mark_pane: int
    mark_ns: int
    sent_wall_ns: int
    stats: dict[str, int] = field(default_factory=dict)
    shed: tuple[tuple[int, int, int], ...] = ()  # (first pane, last pane, records) shed from the backlog
    # (first pane, last pane, cause, records) of the other causes of LOSS_CAUSES (not "shed")
    losses: tuple[tuple[int, int, str, int], ...] = ()
    # newest pane (select: ns) sent or shed so far by this incarnation on this partition; None: not said
    sent_upto: int | None = None


@dataclass(frozen=True)
class GroupPunctuation:
    """Group-wise punctuation: group ``key[i]`` of this host is done up to ``done_pane[i]`` (exclusive)."""

    query: str
    host: str
    incarnation: int
    partition: int
    seq: int
    key: np.ndarray  # int64[n, kw]: the groups (their group words)
    done_pane: np.ndarray  # int64[n]: every partial of the group with pane < done_pane was sent

    @property
    def n(self) -> int:
        return int(self.done_pane.shape[0])


@dataclass(frozen=True)
class RowMarks:
    """Row-number punctuation: every row of partition value ``part[i]`` numbered below ``rows[i]`` was sent."""

    query: str
    host: str
    incarnation: int
    partition: int
    seq: int
    part: np.ndarray  # int64[n, pw]: partition values (pw = 0: the host's one counter)
    rows: np.ndarray  # int64[n]
    sent_wall_ns: int = 0
    # the host's losses since its previous row marks: (cause, records), charged to slots [since, rows + slack]
    losses: tuple[tuple[str, int], ...] = ()
    since: np.ndarray | None = None  # int64[n]: each counter's count at the previous row marks
    slack: int = 0

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])


def _str(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0xFFFF:
        raise WireError("string too long for the wire format")
    return struct.pack("<H", len(b)) + b


def _frame(
    kind: int, query: str, host: str, incarnation: int, partition: int, seq: int, body: bytes
) -> bytes:
    msg = b"".join(
        (
            _HEAD.pack(MAGIC, VERSION, kind),
            _str(query),
            _str(host),
            _MID.pack(incarnation, partition, seq),
            body,
        )
    )
    return msg + _CRC.pack(zlib.crc32(msg))


def encode_partials(
    query: str,
    host: str,
    incarnation: int,
    partition: int,
    seq: int,
    pane: np.ndarray,
    key: np.ndarray,
    state: np.ndarray,
    compress: bool = True,
) -> bytes:
    """One batch of n partial aggregates (arrays are converted to little-endian int64); LZ4-compressed
    (kind PARTIALS_LZ4) when ``compress`` and the body has at least ``COMPRESS_MIN`` bytes."""
    n = int(pane.shape[0])
    key = np.ascontiguousarray(key, dtype="<i8").reshape(n, -1)
    state = np.ascontiguousarray(state, dtype="<i8").reshape(n, -1)
    kw, na = key.shape[1], state.shape[1]
    if not (0 < kw < 256 and 0 < na < 256):
        raise WireError("key and state widths must be 1..255 words")
    body = b"".join(
        (
            _PART.pack(n, kw, na),
            np.ascontiguousarray(pane, dtype="<i8").tobytes(),
            key.tobytes(),
            state.tobytes(),
        )
    )
    if compress and len(body) >= COMPRESS_MIN:
        packed = pa.compress(body, codec="lz4", asbytes=True)
        return _frame(
            KIND_PARTIALS_LZ4, query, host, incarnation, partition, seq, _RAW.pack(len(body)) + packed
        )
    return _frame(KIND_PARTIALS, query, host, incarnation, partition, seq, body)


@dataclass(frozen=True)
class Rows:
    """A batch of selected rows: ``ts[n]`` and ``cols[n, w]`` (the select query's words after the timestamp)."""

    query: str
    host: str
    incarnation: int
    partition: int
    seq: int
    ts: np.ndarray  # int64[n]
    cols: np.ndarray  # int64[n, w] (a column-major view: each column is contiguous)

    @property
    def n(self) -> int:
        return int(self.ts.shape[0])


_ROWS = struct.Struct("<IB")


def encode_rows(
    query: str, host: str, incarnation: int, partition: int, seq: int, rows: np.ndarray, compress: bool = True
) -> bytes:
    """One batch of selected rows from an int64[n, 1 + w] block (timestamp first), column-major on the wire."""
    rows = np.asarray(rows, dtype=np.int64)
    n, w1 = rows.shape
    if not 1 < w1 <= 256:
        raise WireError("a selected row has a timestamp and 1..255 words")
    body = _ROWS.pack(n, w1 - 1) + np.ascontiguousarray(rows.T, dtype="<i8").tobytes()
    if compress and len(body) >= COMPRESS_MIN:
        packed = pa.compress(body, codec="lz4", asbytes=True)
        return _frame(KIND_ROWS_LZ4, query, host, incarnation, partition, seq, _RAW.pack(len(body)) + packed)
    return _frame(KIND_ROWS, query, host, incarnation, partition, seq, body)


def encode_punctuation(p: Punctuation) -> bytes:
    """A punctuation: kind PUNCT, or PUNCT_LOSS when it reports shed panes or other losses."""
    stats = [int(p.stats.get(k, 0)) for k in PUNCT_STATS]
    upto = NOT_SAID if p.sent_upto is None else int(p.sent_upto)
    body = _PUNCT3.pack(p.mark_pane, p.mark_ns, p.sent_wall_ns, *stats, upto)
    if not p.shed and not p.losses:
        return _frame(KIND_PUNCT, p.query, p.host, p.incarnation, p.partition, p.seq, body)
    rows = [(a, b, 0, n) for a, b, n in p.shed]
    for a, b, cause, n in p.losses:
        if cause not in LOSS_CAUSES:
            raise WireError(f"unknown loss cause {cause!r} (one of {LOSS_CAUSES})")
        rows.append((a, b, LOSS_CAUSES.index(cause), n))
    if len(rows) > MAX_SHED_RANGES:
        raise WireError(f"{len(rows)} loss ranges, at most {MAX_SHED_RANGES} per punctuation")
    ranges = np.array(rows, dtype="<i8").reshape(-1, 4)
    if (ranges[:, 0] > ranges[:, 1]).any() or (ranges[:, 3] < 0).any():
        raise WireError("loss ranges need first <= last and records >= 0")
    body += _COUNT.pack(len(ranges)) + ranges.tobytes()
    return _frame(KIND_PUNCT_LOSS, p.query, p.host, p.incarnation, p.partition, p.seq, body)


_GROUPS = struct.Struct("<IB")


def encode_group_punctuation(g: GroupPunctuation) -> bytes:
    """A group-wise punctuation (kind PUNCT_GROUPS) of ``n`` groups (1..MAX_GROUPS, 1..255 key words)."""
    done = np.ascontiguousarray(g.done_pane, dtype="<i8").ravel()
    n = len(done)
    key = np.ascontiguousarray(g.key, dtype="<i8").reshape(n, -1) if n else np.empty((0, 1), "<i8")
    if not 0 < n <= MAX_GROUPS or not 0 < key.shape[1] < 256:
        raise WireError(f"a group punctuation carries 1..{MAX_GROUPS} groups of 1..255 words")
    body = _GROUPS.pack(n, key.shape[1]) + np.ascontiguousarray(key.T).tobytes() + done.tobytes()
    return _frame(KIND_PUNCT_GROUPS, g.query, g.host, g.incarnation, g.partition, g.seq, body)


def encode_row_marks(m: RowMarks) -> bytes:
    """A row-number punctuation (kind ROW_MARKS) of 1..MAX_GROUPS counters of 0..255 partition words."""
    rows = np.ascontiguousarray(m.rows, dtype="<i8").ravel()
    n = len(rows)
    part = np.ascontiguousarray(m.part, dtype="<i8")
    if not 0 < n <= MAX_GROUPS or part.ndim != 2 or part.shape != (n, part.shape[1]) or part.shape[1] > 255:
        raise WireError(f"row marks carry 1..{MAX_GROUPS} counts >= 0 of 0..255 partition words")
    if (rows < 0).any():
        raise WireError(f"row marks carry 1..{MAX_GROUPS} counts >= 0 of 0..255 partition words")
    body = (
        _GROUPS.pack(n, part.shape[1])
        + np.ascontiguousarray(part.T).tobytes()
        + rows.tobytes()
        + struct.pack("<q", m.sent_wall_ns)
    )
    if m.losses:
        since = np.ascontiguousarray(m.since if m.since is not None else np.zeros(n), dtype="<i8").ravel()
        cause = np.array([LOSS_CAUSES.index(c) for c, _ in m.losses], "<i8")
        recs = np.array([r for _, r in m.losses], "<i8")
        if len(since) != n or (since < 0).any() or (since > rows).any() or (recs <= 0).any() or m.slack < 0:
            raise WireError("row-mark losses need 0 <= since <= rows per counter, records > 0, slack >= 0")
        body += _COUNT.pack(len(cause)) + struct.pack("<q", m.slack) + since.tobytes()
        body += cause.tobytes() + recs.tobytes()
    return _frame(KIND_ROW_MARKS, m.query, m.host, m.incarnation, m.partition, m.seq, body)


def _need(buf: bytes | memoryview, pos: int, n: int, what: str) -> None:
    if pos + n > len(buf):
        raise WireError(f"truncated batch: {what} needs {n} bytes at offset {pos}, batch has {len(buf)}")


def _read_str(buf: bytes | memoryview, pos: int, what: str) -> tuple[str, int]:
    _need(buf, pos, 2, what)
    (n,) = struct.unpack_from("<H", buf, pos)
    _need(buf, pos + 2, n, what)
    try:
        return bytes(buf[pos + 2 : pos + 2 + n]).decode(), pos + 2 + n
    except UnicodeDecodeError:
        raise WireError(f"{what} is not UTF-8") from None


def peek(buf: bytes | memoryview) -> tuple[int, str, str, int]:
    """(kind, query, host, seq) of a batch from its header alone, without checking or decoding the body
    (a reader that routes or skips batches before decoding them; :func:`decode` still checks everything)."""
    _need(buf, 0, _HEAD.size, "header")
    magic, _, kind = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}: not a lowwater batch")
    query, pos = _read_str(buf, _HEAD.size, "query name")
    host, pos = _read_str(buf, pos, "host id")
    _need(buf, pos, _MID.size, "batch header")
    return int(kind), query, host, int(_MID.unpack_from(buf, pos)[2])


def _row_losses(
    view: bytes | memoryview, pos: int, end: int, rows: np.ndarray
) -> tuple[tuple[tuple[str, int], ...], np.ndarray | None, int]:
    """The optional losses after a ROW_MARKS body's ``sent_wall_ns``: (losses, since, slack)."""
    if pos == end:
        return (), None, 0
    n = len(rows)
    _need(view, pos, _COUNT.size + 8, "row-mark losses header")
    (nl,) = _COUNT.unpack_from(view, pos)
    (slack,) = struct.unpack_from("<q", view, pos + _COUNT.size)
    pos += _COUNT.size + 8
    if nl == 0 or nl > len(LOSS_CAUSES) or end - pos != 8 * (n + 2 * nl) or slack < 0:
        raise WireError(f"row-mark losses are {end - pos} bytes for {n} counters and {nl} causes")
    arr = np.frombuffer(bytes(view[pos:end]), dtype="<i8").astype(np.int64, copy=False)
    since, cause, recs = arr[:n], arr[n : n + nl], arr[n + nl :]
    if (since < 0).any() or (since > rows).any() or (recs <= 0).any() or (cause < 0).any():
        raise WireError("row-mark losses need 0 <= since <= rows per counter and records > 0")
    if (cause >= len(LOSS_CAUSES)).any():
        raise WireError(f"row-mark loss cause out of range (this build knows {len(LOSS_CAUSES)})")
    losses = tuple((LOSS_CAUSES[int(c)], int(r)) for c, r in zip(cause, recs, strict=True))
    return losses, since, int(slack)


def decode(buf: bytes | memoryview) -> Partials | Punctuation | Rows | GroupPunctuation | RowMarks:
    """Decode one batch; raise WireError on anything malformed (never returns garbage)."""
    _need(buf, 0, _HEAD.size + _CRC.size, "header")
    magic, version, kind = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}: not a lowwater batch")
    if version not in READ_VERSIONS:
        raise WireError(f"unsupported wire version {version} (this build reads versions {READ_VERSIONS})")
    (crc,) = _CRC.unpack_from(buf, len(buf) - _CRC.size)
    if zlib.crc32(bytes(buf[: len(buf) - _CRC.size])) != crc:
        raise WireError("checksum mismatch: batch truncated or corrupted")
    end = len(buf) - _CRC.size
    view = buf[:end]
    query, pos = _read_str(view, _HEAD.size, "query name")
    host, pos = _read_str(view, pos, "host id")
    _need(view, pos, _MID.size, "batch header")
    incarnation, partition, seq = _MID.unpack_from(view, pos)
    pos += _MID.size
    if kind in (KIND_PARTIALS_LZ4, KIND_ROWS_LZ4):
        _need(view, pos, _RAW.size, "compressed partials header")
        (raw_len,) = _RAW.unpack_from(view, pos)
        if raw_len > MAX_RAW:
            raise WireError(f"compressed partials claim {raw_len} bytes, more than the {MAX_RAW} accepted")
        try:
            raw = pa.decompress(
                bytes(view[pos + _RAW.size : end]), decompressed_size=raw_len, codec="lz4", asbytes=True
            )
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise WireError(f"compressed partials do not decompress: {exc}") from None
        if len(raw) != raw_len:
            raise WireError(f"compressed partials decompress to {len(raw)} bytes, header says {raw_len}")
        view, pos, end, kind = raw, 0, len(raw), (KIND_PARTIALS if kind == KIND_PARTIALS_LZ4 else KIND_ROWS)
    if kind == KIND_ROWS:
        _need(view, pos, _ROWS.size, "rows header")
        n, w = _ROWS.unpack_from(view, pos)
        pos += _ROWS.size
        if w == 0:
            raise WireError("a selected row needs at least one word after the timestamp")
        if pos + 8 * n * (1 + w) != end:
            raise WireError(f"rows body is {end - pos} bytes, header says {8 * n * (1 + w)} (n={n}, w={w})")
        arr = np.frombuffer(bytes(view[pos:end]), dtype="<i8").astype(np.int64, copy=False).reshape(1 + w, n)
        return Rows(query, host, incarnation, partition, seq, arr[0], arr[1:].T)
    if kind == KIND_PARTIALS:
        _need(view, pos, _PART.size, "partials header")
        n, kw, na = _PART.unpack_from(view, pos)
        pos += _PART.size
        size = 8 * n * (1 + kw + na)
        if pos + size != end:
            raise WireError(
                f"partials body is {end - pos} bytes, header says {size} (n={n}, kw={kw}, na={na})"
            )
        if kw == 0 or na == 0:
            raise WireError("key and state widths must be at least 1")
        arr = np.frombuffer(bytes(view[pos:end]), dtype="<i8").astype(np.int64, copy=False)
        pane = arr[:n]
        key = arr[n : n + n * kw].reshape(n, kw)
        state = arr[n + n * kw :].reshape(n, na)
        return Partials(query, host, incarnation, partition, seq, pane, key, state)
    if kind == KIND_PUNCT_GROUPS and version >= 3:
        _need(view, pos, _GROUPS.size, "group punctuation header")
        n, kw = _GROUPS.unpack_from(view, pos)
        pos += _GROUPS.size
        if n == 0 or n > MAX_GROUPS or kw == 0 or end - pos != 8 * n * (kw + 1):
            raise WireError(f"group punctuation body is {end - pos} bytes for n={n} groups of kw={kw} words")
        arr = np.frombuffer(bytes(view[pos:end]), dtype="<i8").astype(np.int64, copy=False)
        key = arr[: n * kw].reshape(kw, n).T
        return GroupPunctuation(query, host, incarnation, partition, seq, key, arr[n * kw :])
    if kind == KIND_ROW_MARKS and version >= 3:
        _need(view, pos, _GROUPS.size, "row marks header")
        n, pw = _GROUPS.unpack_from(view, pos)
        pos += _GROUPS.size
        base = 8 * (n * (pw + 1) + 1)
        if n == 0 or n > MAX_GROUPS or end - pos < base:
            raise WireError(f"row marks body is {end - pos} bytes for n={n} counts of pw={pw} words")
        arr = np.frombuffer(bytes(view[pos : pos + base]), dtype="<i8").astype(np.int64, copy=False)
        rows = arr[n * pw : n * pw + n]
        if (rows < 0).any():
            raise WireError("row marks need counts >= 0")
        part = arr[: n * pw].reshape(pw, n).T
        losses, since, slack = _row_losses(view, pos + base, end, rows)
        return RowMarks(
            query, host, incarnation, partition, seq, part, rows, int(arr[-1]), losses, since, slack
        )
    head = _PUNCT3 if version >= 3 else _PUNCT
    if kind == KIND_PUNCT:
        if end - pos != head.size:
            raise WireError(f"punctuation body is {end - pos} bytes, expected {head.size}")
        vals = head.unpack_from(view, pos)
        stats = dict(zip(PUNCT_STATS, vals[3:11], strict=True))
        return Punctuation(
            query, host, incarnation, partition, seq, *vals[:3], stats, sent_upto=_sent_upto(vals)
        )
    if kind == KIND_PUNCT_SHED:
        vals, r = _ranges(view, pos, end, _PUNCT, 3, "shed panes", "shed pane")
        if (r[:, 0] > r[:, 1]).any() or (r[:, 2] < 0).any():
            raise WireError("shed pane ranges need first <= last and records >= 0")
        shed = tuple((int(a), int(b), int(c)) for a, b, c in r.tolist())
        stats = dict(zip(PUNCT_STATS, vals[3:11], strict=True))
        return Punctuation(query, host, incarnation, partition, seq, *vals[:3], stats, shed)
    if kind == KIND_PUNCT_LOSS and version >= 2:
        vals, r = _ranges(view, pos, end, head, 4, "losses", "loss")
        if (
            (r[:, 0] > r[:, 1]).any()
            or (r[:, 3] < 0).any()
            or ((r[:, 2] < 0) | (r[:, 2] >= len(LOSS_CAUSES))).any()
        ):
            raise WireError("loss ranges need first <= last, records >= 0 and a known cause")
        shed = tuple((int(a), int(b), int(c)) for a, b, k, c in r.tolist() if k == 0)
        losses = tuple((int(a), int(b), LOSS_CAUSES[k], int(c)) for a, b, k, c in r.tolist() if k != 0)
        stats = dict(zip(PUNCT_STATS, vals[3:11], strict=True))
        return Punctuation(
            query, host, incarnation, partition, seq, *vals[:3], stats, shed, losses, _sent_upto(vals)
        )
    raise WireError(f"unknown batch kind {kind}")


def _ranges(
    view: memoryview, pos: int, end: int, head: struct.Struct, width: int, body: str, what: str
) -> tuple[tuple[int, ...], np.ndarray]:
    """A punctuation's head values and its int64[n, width] table of pane ranges (kinds PUNCT_SHED, PUNCT_LOSS)."""
    _need(view, pos, head.size + _COUNT.size, f"punctuation with {body}")
    vals = head.unpack_from(view, pos)
    (n,) = _COUNT.unpack_from(view, pos + head.size)
    at = pos + head.size + _COUNT.size
    if n == 0 or n > MAX_SHED_RANGES or end - at != 8 * width * n:
        raise WireError(f"{what} ranges: {n} claimed, {end - at} bytes of them")
    return vals, np.frombuffer(bytes(view[at:end]), dtype="<i8").reshape(n, width)


def _sent_upto(vals: tuple[int, ...]) -> int | None:
    """A punctuation's sent_upto from its unpacked head (None: version 1 or 2, or not said)."""
    return None if len(vals) < 12 or vals[11] == NOT_SAID else int(vals[11])


# --- partitioning: a stable hash of the group key, identical on every host and process
# splitmix64, shared with the low level, which compiles it with Numba (low_level.jit.splitmix)
MIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_M2 = np.uint64(0x94D049BB133111EB)
MIX_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of a uint64 array (the arithmetic wraps by design). The low level compiles
    this same function with Numba for one uint64 at a time (``low_level.jit.splitmix``)."""
    x = x ^ (x >> np.uint64(30))
    x = x * MIX_M1
    x = x ^ (x >> np.uint64(27))
    x = x * MIX_M2
    return x ^ (x >> np.uint64(31))


def key_hash(key: np.ndarray) -> np.ndarray:
    """64-bit hash of each row of an int64[n, kw] key matrix (not Python's salted ``hash``)."""
    key = np.asarray(key, dtype=np.int64)
    if key.ndim == 1:
        key = key.reshape(-1, 1)
    with np.errstate(over="ignore"):
        h = np.full(key.shape[0], MIX_GOLDEN, dtype=np.uint64)
        for j in range(key.shape[1]):
            h = mix64(h ^ key[:, j].view(np.uint64)) + MIX_GOLDEN
    return h


def partition_of(key: np.ndarray, partitions: int) -> np.ndarray:
    """Kafka partition of each group key: the hash's top 32 bits modulo the partition count."""
    return ((key_hash(key) >> np.uint64(32)) % np.uint64(partitions)).astype(np.int64)
