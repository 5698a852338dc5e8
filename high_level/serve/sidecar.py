"""Small Parquet side files of the store (alerts, flagged windows): read once, kept while unchanged.

Why: the API reads them on every request, but the job rewrites a file only when a batch adds to it, so a
file is re-read only when its size or mtime moved. A file that breaks its schema is skipped, logged once
with the reason and counted (``rejected``, shown in ``/health``), never cast or guessed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from contract import results as R

log = logging.getLogger("lowwater.api")


class SidecarFiles:
    """A cache of validated tables keyed by file, for one kind of side file (``what`` names it in logs)."""

    def __init__(self, check: Callable[[pa.Schema, str], None], what: str) -> None:
        self._check = check
        self._what = what
        self._lock = threading.Lock()
        self._files: dict[str, tuple[tuple[int, int], pa.Table]] = {}
        self.rejected: dict[str, str] = {}

    def read(self, files: Iterable[tuple[str, Path]], complete: bool = False) -> list[pa.Table]:
        """The tables of ``files`` ((name, path) pairs) that pass the schema check. ``complete``: the
        listing is every file of the kind, so cached files missing from it (deleted by retention) go."""
        files = list(files)
        tables = []
        with self._lock:
            for name, path in files:
                try:
                    st = path.stat()
                    sig = (st.st_size, st.st_mtime_ns)
                    hit = self._files.get(name)
                    if hit is None or hit[0] != sig:
                        t = pq.read_table(path)
                        self._check(t.schema, str(path))
                        self._files[name] = hit = (sig, t)
                        self.rejected.pop(name, None)
                    tables.append(hit[1])
                except FileNotFoundError:  # retention deleted it after the listing
                    continue
                except (OSError, pa.ArrowException, R.ResultsLayoutError) as exc:
                    if name not in self.rejected:
                        log.warning("%s file %s skipped: %s", self._what, path, exc)
                    self.rejected[name] = str(exc)
            if complete:
                for gone in set(self._files) - {name for name, _ in files}:
                    del self._files[gone]
        return tables


class SidecarReader:
    """The side files of one kind in one results directory (``root``); ``rejected``: the files skipped,
    with why (``/health``)."""

    def __init__(self, root: str | Path, check: Callable[[pa.Schema, str], None], what: str) -> None:
        self.root = Path(root)
        self._files = SidecarFiles(check, what)

    @property
    def rejected(self) -> dict[str, str]:
        return self._files.rejected
