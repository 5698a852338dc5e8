"""Wire format round trips, and rejection of anything malformed (never garbage out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract import wire


def sample(n: int = 5, kw: int = 3, na: int = 2) -> bytes:
    rng = np.random.default_rng(n)
    return wire.encode_partials(
        "q4_pairs",
        "host-a",
        123,
        1,
        77,
        rng.integers(-5, 5, n),
        rng.integers(-(2**63), 2**63 - 1, (n, kw), dtype=np.int64),
        rng.integers(0, 1000, (n, na)),
    )


def test_partials_round_trip() -> None:
    pane = np.array([-1, 0, 7], dtype=np.int64)
    key = np.array([[1, -2], [3, 4], [2**62, -(2**63)]], dtype=np.int64)
    state = np.array([[10], [20], [30]], dtype=np.int64)
    b = wire.decode(wire.encode_partials("q", "h", 9, 2, 5, pane, key, state))
    assert isinstance(b, wire.Partials)
    assert (b.query, b.host, b.incarnation, b.partition, b.seq, b.n) == ("q", "h", 9, 2, 5, 3)
    assert np.array_equal(b.pane, pane) and np.array_equal(b.key, key) and np.array_equal(b.state, state)


def big_sample(n: int = 3000) -> tuple[bytes, bytes, tuple]:
    """(compressed, plain) encodings of one IPv4-like batch large enough to be compressed."""
    rng = np.random.default_rng(3)
    cols = (
        np.full(n, 28_333_333),
        np.column_stack(
            [
                np.zeros(n, np.int64),
                0xFFFF_0A00_0000 + rng.integers(0, 4096, n),
                np.zeros(n, np.int64),
                0xFFFF_C0A8_0000 + rng.integers(0, 4096, n),
            ]
        ),
        rng.integers(1, 50, (n, 2)),
    )
    return (
        wire.encode_partials("q", "h", 1, 0, 0, *cols),
        wire.encode_partials("q", "h", 1, 0, 0, *cols, compress=False),
        cols,
    )


def _with_crc(body: bytes) -> bytes:
    """A message with a valid CRC again (what a buggy or hostile producer could send)."""
    import struct
    import zlib

    return body + struct.pack("<I", zlib.crc32(body))


def test_large_batches_travel_compressed_and_decode_identically() -> None:
    packed, plain, (pane, key, state) = big_sample()
    assert packed[3] == wire.KIND_PARTIALS_LZ4 and plain[3] == wire.KIND_PARTIALS
    assert len(packed) * 3 < len(plain)  # IPv4 keys and repeated panes compress well
    for buf in (packed, plain):
        b = wire.decode(buf)
        assert isinstance(b, wire.Partials)
        assert np.array_equal(b.pane, pane) and np.array_equal(b.key, key) and np.array_equal(b.state, state)
    assert wire.decode(sample())  # small batches stay plain
    assert sample()[3] == wire.KIND_PARTIALS


def test_bad_compressed_bodies_are_rejected_even_with_a_valid_crc() -> None:
    import struct

    packed, _, _ = big_sample()
    msg = packed[:-4]
    head = msg.index(b"h") + 1 + struct.calcsize("<qIq")  # end of the batch header: raw_len follows
    (raw_len,) = struct.unpack_from("<I", msg, head)
    garbled = bytearray(msg)
    for i in range(head + 8, len(garbled), 7):
        garbled[i] ^= 0x5A
    cases = {
        "garbled LZ4 frame": bytes(garbled),
        "length too large": msg[:head] + struct.pack("<I", wire.MAX_RAW + 1) + msg[head + 4 :],
        "length off by one": msg[:head] + struct.pack("<I", raw_len + 1) + msg[head + 4 :],
        "frame cut short": msg[: len(msg) - 100],
    }
    for what, body in cases.items():
        with pytest.raises(wire.WireError):
            wire.decode(_with_crc(body))
            pytest.fail(what)


def test_punctuation_round_trip() -> None:
    p = wire.Punctuation(
        "q", "h-ü", 1, 3, 42, wire.END_OF_STREAM, 5, 6, {k: i for i, k in enumerate(wire.PUNCT_STATS)}
    )
    assert wire.decode(wire.encode_punctuation(p)) == p


def test_punctuation_states_what_it_sent_upto_and_older_versions_still_read() -> None:
    import struct
    import zlib

    losses = ((3, 9, "socket", 5),)
    for p in (
        wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, dict.fromkeys(wire.PUNCT_STATS, 0), sent_upto=42),
        wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, dict.fromkeys(wire.PUNCT_STATS, 0), (), losses, -3),
        wire.Punctuation("q", "h", 1, 0, 5, 10, 100, 7, dict.fromkeys(wire.PUNCT_STATS, 0)),  # not said
    ):
        buf = wire.encode_punctuation(p)
        assert buf[2] == wire.VERSION == 3 and wire.decode(buf) == p
        # the same punctuation as a version 2 agent wrote it (no sent_upto): read, and says nothing of it
        head = len(buf) - 4 - (32 * len(p.losses) + 4 if p.losses else 0) - 8
        v2 = bytearray(buf[:head] + buf[head + 8 : -4])
        v2[2] = 2
        v2 += struct.pack("<I", zlib.crc32(bytes(v2)))
        assert wire.decode(bytes(v2)) == replace(p, sent_upto=None)


@pytest.mark.parametrize("cut", [1, 3, 10, 40, -1, -5])
def test_truncated_batches_are_rejected(cut: int) -> None:
    buf = sample()
    with pytest.raises(wire.WireError):
        wire.decode(buf[:cut])


def test_unknown_version_is_rejected() -> None:
    buf = bytearray(sample())
    buf[2] = 9
    with pytest.raises(wire.WireError, match="unsupported wire version 9"):
        wire.decode(bytes(buf))


def test_corruption_is_rejected() -> None:
    buf = bytearray(sample())
    buf[len(buf) // 2] ^= 0xFF
    with pytest.raises(wire.WireError, match="checksum"):
        wire.decode(bytes(buf))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_decode_to_garbage(data: bytes) -> None:
    """Random bytes fail the magic, version, length or checksum check: rejected, never decoded."""
    with pytest.raises(wire.WireError):
        wire.decode(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255), st.integers(1, 20))
def test_mutated_batches_are_rejected(pos: int, xor: int, n: int) -> None:
    buf = bytearray(sample(n))
    if xor and pos < len(buf):
        buf[pos] ^= xor
        with pytest.raises(wire.WireError):
            wire.decode(bytes(buf))


def test_partition_hash_is_stable_across_processes() -> None:
    """Python's hash() is salted per process; ours must not be."""
    code = (
        "import numpy as np; from contract import wire; "
        "print(wire.partition_of(np.arange(40, dtype=np.int64).reshape(10, 4), 7).tolist())"
    )
    outs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1
    assert wire.partition_of(np.arange(40, dtype=np.int64).reshape(10, 4), 7).tolist() == json.loads(
        outs.pop()
    )
