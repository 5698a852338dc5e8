"""Where each Kafka partition's state group runs: Spark's hash placement, made round-robin by a salt.

Why its own module: the salt must be computed exactly as Spark's hash partitioning computes it (a
bit-exact Murmur3 of Spark SQL's ``hash``), and it is fixed per checkpoint (the shuffle partition
count a checkpoint was started with). ``tests/test_placement.py`` checks :func:`spark_hash` against
Spark's own ``hash`` on a real session.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path


def checkpoint_shuffle_partitions(checkpoint: Path) -> int | None:
    """The shuffle partition count a checkpoint was started with (Spark restores it on restart)."""
    offsets = checkpoint / "offsets"
    ids = sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit()) if offsets.is_dir() else []
    for i in reversed(ids):
        try:
            meta = json.loads((offsets / str(i)).read_text().splitlines()[1])
            return int(meta["conf"]["spark.sql.shuffle.partitions"])
        except (OSError, IndexError, KeyError, ValueError):
            continue
    return None


_M32 = 0xFFFFFFFF


def _mix_k1(k: int) -> int:
    k = (k * 0xCC9E2D51) & _M32
    return (((k << 15) | (k >> 17)) & _M32) * 0x1B873593 & _M32


def _mix_h1(h: int, k: int) -> int:
    h ^= k
    return (((h << 13) | (h >> 19)) & _M32) * 5 + 0xE6546B64 & _M32


def _fmix(h: int, n: int) -> int:
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def spark_hash(*values: str | int) -> int:
    """Spark SQL's ``hash(...)`` (Murmur3Hash, seed 42) of strings and ints, computed in Python.

    Bit-exact with Spark: strings (UTF8_BINARY) use ``Murmur3_x86_32.hashUnsafeBytes`` (4-byte
    little-endian words, then each tail byte sign-extended on its own), ints ``hashInt``; each
    value seeds the next. Placement must not need a Spark job at start.
    """
    h = 42
    for v in values:
        if isinstance(v, str):
            b = v.encode()
            n4 = len(b) - len(b) % 4
            for i in range(0, n4, 4):
                h = _mix_h1(h, _mix_k1(int.from_bytes(b[i : i + 4], "little")))
            for x in b[n4:]:
                h = _mix_h1(h, _mix_k1((x - 256 if x > 127 else x) & _M32))
            h = _fmix(h, len(b))
        else:
            if not -(2**31) <= int(v) < 2**31:
                raise ValueError(f"{v} is not a 32-bit int")
            h = _fmix(_mix_h1(h, _mix_k1(int(v) & _M32)), 4)
    return h - (1 << 32) if h >= 1 << 31 else h


def placement_salts(partitions: dict[str, int], n_tasks: int, tries: int = 64) -> dict[tuple[str, int], int]:
    """A salt per (topic, Kafka partition) that spreads the stateful groups evenly over Spark tasks.

    Why: Spark places group (topic, partition) on task pmod(murmur3(topic, partition), N); with as
    many Kafka partitions as cores two of them collide half the time and one core does all the work.
    Grouping by (topic, partition, salt) with the smallest salt that hashes to task
    ``(partition + crc32(topic)) % N`` makes the placement round-robin. The salt depends only on
    (topic, partition, N) and N is fixed per checkpoint, so a group's state key never changes.
    Computed with Spark's own ``hash`` function (the one hash partitioning uses), reimplemented
    bit-exactly in :func:`spark_hash` so that starting the job runs no Spark job.
    """
    out: dict[tuple[str, int], int] = {}
    for t, n in sorted(partitions.items()):
        for p in range(n):
            want = (p + zlib.crc32(t.encode())) % n_tasks
            for salt in range(tries):
                if spark_hash(t, p, salt) % n_tasks == want:  # Python's % is pmod for n_tasks > 0
                    out[(t, p)] = salt
                    break
    return out
