"""Write frames held in numpy arrays as a classic nanosecond pcap, vectorised (dpkt's per-packet
writer takes longer than the replay being measured)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

REC = np.dtype([("sec", "<u4"), ("frac", "<u4"), ("caplen", "<u4"), ("wirelen", "<u4")])


def write_pcap_ns(
    path: Path, frames: np.ndarray, caplen: np.ndarray, wirelen: np.ndarray, ts: np.ndarray
) -> None:
    """All frames must have caplen == frames.shape[1] (fixed-size records)."""
    n, snap = frames.shape
    if not np.all(caplen == snap):
        raise ValueError("write_pcap_ns needs fixed-size frames (caplen == snaplen)")
    rec = np.zeros(n, dtype=np.dtype([("h", REC), ("d", np.uint8, (snap,))]))
    rec["h"]["sec"] = ts // 1_000_000_000
    rec["h"]["frac"] = ts % 1_000_000_000
    rec["h"]["caplen"] = snap
    rec["h"]["wirelen"] = wirelen
    rec["d"] = frames
    with path.open("wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
        rec.tofile(fh)
