"""Bulk fuzzing of the inputs lowwater takes from outside: 10^6 random and mutated frames through
the Numba parser, and mutated YAML configs through the loader.

The parser check for "never reads past the captured length": every fuzzed frame sits in a slot
whose bytes after caplen are 0x00 in one copy and 0xFF in another; both copies must parse to
identical rows and statuses. Every frame must be accounted for (ok + counted errors == n).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from contract import query as Q
from contract.fields import NFIELDS
from low_level.kernel.parse import NERR, parse_batch
from lowwater_testing.frames import BASE

SLOT = 160
N_FRAMES = 1_000_000
REPO = Path(__file__).resolve().parents[1]


def fuzz_frames(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n frames of SLOT bytes: 1/4 random, 3/4 valid frames with random byte flips and truncation."""
    rng = np.random.default_rng(seed)
    base = [np.frombuffer(f[:SLOT], dtype=np.uint8) for f in BASE.values()]
    data = rng.integers(0, 256, (n, SLOT), dtype=np.uint8)
    caplen = rng.integers(0, SLOT + 1, n).astype(np.int64)
    mutated = rng.random(n) < 0.75
    which = rng.integers(0, len(base), n)
    for b, frame in enumerate(base):
        sel = mutated & (which == b)
        data[sel, : len(frame)] = frame
        caplen[sel] = np.minimum(caplen[sel], len(frame)) if rng.random() < 0.5 else len(frame)
    # flip 1-4 random bytes of each mutated frame, biased to the headers
    for _ in range(4):
        rows = np.flatnonzero(mutated & (rng.random(n) < 0.6))
        pos = np.minimum(rng.geometric(1 / 30, len(rows)), SLOT - 1)
        data[rows, pos] ^= rng.integers(1, 256, len(rows), dtype=np.uint8)
    return data, caplen


def parse_all(
    data: np.ndarray, caplen: np.ndarray, fill: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    n = len(caplen)
    buf = data.copy()
    cols = np.arange(SLOT)
    buf[cols[None, :] >= caplen[:, None]] = fill
    flat = buf.reshape(-1)
    offsets = np.arange(n, dtype=np.int64) * SLOT
    out = np.zeros((n, NFIELDS), dtype=np.int64)
    status = np.zeros(n, dtype=np.int64)
    errs = np.zeros(NERR, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    ok = parse_batch(flat, offsets, caplen, caplen + 10, zeros, zeros, n, out, status, errs)
    return out, status, errs, ok


@pytest.mark.parametrize("seed", [1, 2])
def test_million_fuzzed_frames_parse_safely_and_are_all_counted(seed: int) -> None:
    n = N_FRAMES // 2
    data, caplen = fuzz_frames(n, seed)
    out0, st0, err0, ok0 = parse_all(data, caplen, 0x00)
    out1, st1, err1, ok1 = parse_all(data, caplen, 0xFF)
    assert ok0 + err0.sum() == n, "every frame is either parsed or counted with a reason"
    assert np.array_equal(st0, st1), "status depends on bytes past caplen"
    assert np.array_equal(out0[st0 == 0], out1[st1 == 0]), "fields depend on bytes past caplen"
    assert ok0 > n // 20 and err0[1:].sum() > n // 20, "the corpus exercises both outcomes"
    assert (err0 > 0).sum() >= 6, "most error reasons are reached"


def mutate_yaml(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        line = lines[i]
        if op == 0:
            lines[i] = line.replace(":", "", 1)
        elif op == 1:
            lines[i] = " " * rng.randint(0, 6) + line.lstrip()
        elif op == 2 and line.strip():
            j = rng.randrange(len(line))
            lines[i] = line[:j] + rng.choice("{}[]:,-'\"#&*!|>%@` \t0x") + line[j + 1 :]
        elif op == 3:
            lines.insert(
                i,
                rng.choice(
                    [
                        "    bogus: 1",
                        "  - name: x",
                        "    window: {range: -1s}",
                        "    table: {size: 3}",
                        '    filter: "ttl >"',
                        "queries: []",
                    ]
                ),
            )
        elif op == 4:
            del lines[i]
        else:
            lines[i] = line.replace("1m", rng.choice(["0s", "1y", "-5", "1e99", "''"]))
    return "\n".join(lines) + "\n"


def test_mutated_configs_fail_only_with_config_errors() -> None:
    text = (REPO / "configs" / "default.yaml").read_text()
    rng = random.Random(5)
    rejected = 0
    for i in range(1500):
        doc = mutate_yaml(text, rng)
        try:
            Q.load_text(doc, f"fuzz-{i}.yaml")
        except Q.ConfigError as exc:
            rejected += 1
            assert exc.file == f"fuzz-{i}.yaml" and exc.reason
    assert rejected > 300
