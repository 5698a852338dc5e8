"""The files of a query's roll-up tier that a request reads (layout: :mod:`contract.results`).

Per ``tier=<name>/date=<d>`` directory: the visible files (:func:`contract.results.visible_files`, so a
file covered by a larger merged one is never read twice), each checked once against
:func:`contract.results.tier_schema` (a file that breaks it is skipped and counted, as raw files are).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from contract import results as R
from contract.query import QuerySpec

_DAY_US = 86_400_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TierFiles:
    """Listing and schema checks of tier files; checks are cached by (path, size, mtime)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._checked: dict[str, tuple[tuple[int, int], str | None]] = {}
        self._lock = threading.Lock()

    def files(self, spec: QuerySpec, tier: str, start_us: int, end_us: int) -> list[str]:
        """Paths of the visible, well-formed files of ``tier`` whose day may hold windows in [start, end)."""
        out: list[str] = []
        for day, d in R.tier_date_dirs(self.root, spec.name, tier):
            day_us = (
                int((datetime(day.year, day.month, day.day, tzinfo=UTC) - _EPOCH).total_seconds()) * 10**6
            )
            if day_us >= end_us or day_us + _DAY_US <= start_us:
                continue
            try:
                names = {p.name: r for p in d.iterdir() if (r := R.tier_batch_range(p.name)) is not None}
            except FileNotFoundError:  # retention removed the day meanwhile
                continue
            for name in R.visible_files(names):
                path = d / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if self._check(spec, tier, path, (st.st_size, st.st_mtime_ns)) is None:
                    out.append(str(path))
        return out

    def stamp(self, path: str) -> tuple[int, int]:
        """(size, mtime) of a listed file as checked: what a cache of its contents keys on."""
        got = self._checked.get(path)
        return got[0] if got is not None else (0, 0)

    def _check(self, spec: QuerySpec, tier: str, path: Path, key: tuple[int, int]) -> str | None:
        got = self._checked.get(str(path))
        if got is not None and got[0] == key:
            return got[1]
        try:
            R.check_tier_schema(spec, tier, pq.read_schema(path), str(path))
            err = None
        except (OSError, ValueError) as exc:
            err = str(exc)
        with self._lock:
            self._checked[str(path)] = (key, err)
        return err

    def rejected(self) -> dict[str, str]:
        """Tier files skipped because they break the layout, with why."""
        return {p: e for p, (_, e) in self._checked.items() if e is not None}
