"""Saving a row operator's state for a restart: its numpy arrays and its small plain fields, in one blob."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np


def snapshot(op: Any, arrays: tuple[str, ...], plain: tuple[str, ...]) -> bytes:
    """``op``'s attributes ``arrays`` (numpy) and ``plain`` (JSON: ints, lists of str) as bytes."""
    buf = io.BytesIO()
    doc = json.dumps({n: getattr(op, n) for n in plain}).encode()
    np.savez(buf, _plain=np.frombuffer(doc, np.uint8), **{n: getattr(op, n) for n in arrays})
    return buf.getvalue()


def restore(op: Any, blob: bytes, arrays: tuple[str, ...]) -> None:
    """Set what :func:`snapshot` saved back on ``op`` (a fresh operator of the same query)."""
    with np.load(io.BytesIO(blob)) as z:
        for n in arrays:
            setattr(op, n, z[n])
        for n, v in json.loads(z["_plain"].tobytes().decode()).items():
            setattr(op, n, v)
