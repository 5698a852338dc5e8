"""Placement of the state groups: the Python Murmur3 must be Spark's own ``hash`` bit for bit, or the
salts spread nothing (and the round-robin placement silently degrades to Spark's collisions)."""

from __future__ import annotations

import random
import string

import pytest

from high_level.cluster.placement import placement_salts, spark_hash


def _values() -> list[tuple]:
    rng = random.Random(7)
    texts = ["", "a", "ab", "abc", "abcd", "abcde", "lowwater.q4_pairs", "ünïcödé-τοπικό", "\x7f\x80\xff"]
    texts += ["".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40))) for _ in range(40)]
    ints = [0, 1, -1, 2**31 - 1, -(2**31), 42] + [rng.randrange(-(2**31), 2**31) for _ in range(40)]
    rows = [
        (t, i, rng.randrange(64))
        for t, i in zip(texts * 2, ints + ints[: 2 * len(texts) - len(ints)], strict=False)
    ]
    return rows + [(t,) for t in texts] + [(i,) for i in ints]


def test_spark_hash_equals_sparks_hash_on_a_real_session(spark) -> None:
    from pyspark.sql import functions as F

    rows = _values()
    three = [r for r in rows if len(r) == 3]
    df = spark.createDataFrame(three, "t string, p int, s int")
    got = {
        (r["t"], r["p"], r["s"]): r["h"]
        for r in df.select("t", "p", "s", F.hash("t", "p", "s").alias("h")).collect()
    }
    assert got == {r: spark_hash(*r) for r in three}
    texts = [r[0] for r in rows if len(r) == 1 and isinstance(r[0], str)]
    one = (
        spark.createDataFrame([(t,) for t in texts], "t string").select("t", F.hash("t").alias("h")).collect()
    )
    assert {r["t"]: r["h"] for r in one} == {t: spark_hash(t) for t in texts}
    ints = [r[0] for r in rows if len(r) == 1 and isinstance(r[0], int)]
    two = spark.createDataFrame([(i,) for i in ints], "i int").select("i", F.hash("i").alias("h")).collect()
    assert {r["i"]: r["h"] for r in two} == {i: spark_hash(i) for i in ints}


def test_salts_place_partitions_round_robin() -> None:
    parts = {"lowwater.q4_pairs": 4, "lowwater.syn": 2}
    salts = placement_salts(parts, 2)
    assert set(salts) == {(t, p) for t, n in parts.items() for p in range(n)}
    for t, n in parts.items():
        tasks = [spark_hash(t, p, salts[(t, p)]) % 2 for p in range(n)]
        assert sorted(tasks) == sorted([0, 1] * (n // 2)), tasks  # each task gets its share


def test_spark_hash_rejects_what_spark_would_hash_as_long() -> None:
    with pytest.raises(ValueError):
        spark_hash(2**31)
