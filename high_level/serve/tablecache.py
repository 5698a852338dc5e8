"""In-memory copies of result files, prepared once for cheap top-N selection, in a bounded LRU.

Why: decoding Parquet (strings above all) dominates a request, and a result file never changes once
written (a replay rewrites identical content), so each file is decoded once into Arrow, ranked and
hashed (see :class:`high_level.serve.reader.Reader`) and kept; requests whose files do not fit read
Parquet directly.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contract import fields as F
from contract import results as R
from high_level.serve.columns import QueryInfo
from high_level.serve.fileindex import FileStats, StoreError

log = logging.getLogger("lowwater.api")


def load_table(qi: QueryInfo, path: str) -> pa.Table:
    """One result file as a table of the contract's schema; ResultsLayoutError if it does not follow it.

    Checked again on load: the file may have been replaced since the index looked at its footer. The
    types are never cast; only nullability and metadata are taken from the contract, so the tables
    of all files concatenate without copies.
    """
    table = pq.read_table(path)
    R.check_file_schema(qi.spec, table.schema, where=path)
    return pa.Table.from_arrays(table.columns, schema=qi.schema)


def add_ip_words(table: pa.Table, columns: list[str]) -> pa.Table:
    """Add ``_ip_<col>_hi``/``_lo`` (uint64 words, IPv4 mapped) per address column; NULL if unparsable.

    Parsed once per distinct address of the file (dictionary encoding), so prefix filters on cached
    data compare integers instead of parsing text on every request.
    """
    for c in columns:
        enc = pc.dictionary_encode(table.column(c)).combine_chunks()
        his, los = [], []
        for text in enc.dictionary.to_pylist():
            try:
                h, w = F.ip_to_words(text)
            except (ValueError, TypeError):
                h = w = None
            his.append(h)
            los.append(w)
        idx = enc.indices
        table = table.append_column(f"_ip_{c}_hi", pa.array(his, pa.uint64()).take(idx))
        table = table.append_column(f"_ip_{c}_lo", pa.array(los, pa.uint64()).take(idx))
    return table


@dataclass(frozen=True)
class Prepared:
    """One file in memory, prepared for cheap top-N selection.

    ``table``: all rows, finals first sorted by ``_rank`` (so "rank <= k" is a prefix), then the
    corrections and late rows; ``corr``: those alone (both belong to a final row of their group); ``ranks``: ``_rank`` of the finals (ascending);
    ``wkh_sorted`` / ``wkh_order``: the finals' window-and-key hashes sorted, and their row numbers;
    ``final_windows``: the windows the file has finals of.
    """

    table: pa.Table
    corr: pa.Table
    ranks: np.ndarray
    wkh_sorted: np.ndarray
    wkh_order: np.ndarray
    final_windows: np.ndarray  # window_start (us) of the windows this file has final rows of, unique

    @classmethod
    def of(cls, table: pa.Table) -> Prepared:
        """``table`` must already be sorted by ``_rank`` (nulls, i.e. corrections, last)."""
        table = table.combine_chunks()
        folded = pc.is_in(table.column("kind"), value_set=pa.array(["correction", "late"]))
        n = table.num_rows - pc.sum(folded).as_py() if table.num_rows else 0
        ranks = table.column("_rank").slice(0, n).to_numpy()
        wkh = table.column("_wkh").slice(0, n).to_numpy()
        order = np.argsort(wkh, kind="stable")
        windows = np.unique(table.column("window_start").slice(0, n).cast(pa.int64()).to_numpy())
        return cls(table, table.slice(n), ranks, wkh[order], order, windows)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.ranks.nbytes + self.wkh_sorted.nbytes + self.wkh_order.nbytes

    def top_rows(self, k: int, corrected: np.ndarray | None) -> pa.Table:
        """Finals ranked <= k, plus the finals whose hash is in ``corrected`` (sorted unique)."""
        cut = int(np.searchsorted(self.ranks, k, side="right"))
        head = self.table.slice(0, cut)
        if corrected is None or not len(self.wkh_sorted):
            return head
        lo = np.searchsorted(self.wkh_sorted, corrected, "left")
        hi = np.searchsorted(self.wkh_sorted, corrected, "right")
        counts = hi - lo
        if not counts.any():
            return head
        starts = np.repeat(lo, counts)
        idx = self.wkh_order[
            starts + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
        ]
        idx = np.sort(idx[idx >= cut])
        return pa.concat_tables([head, self.table.take(pa.array(idx))]) if len(idx) else head


class TableCache:
    """LRU of prepared files by (path, size, mtime), bounded by ``max_bytes``; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, tuple[int, int, Prepared]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, f: FileStats, load: Callable[[str], Prepared]) -> Prepared | None:
        """The prepared file (``load(path)`` on a miss); None if it cannot be read now."""
        with self._lock:
            got = self._tables.get(f.path)
            if got is not None and got[0] == f.size and got[1] == f.mtime_ns:
                self._tables.move_to_end(f.path)
                return got[2]
        try:
            table = load(f.path)
        except FileNotFoundError:  # compacted or expired since the listing: list again (the reader retries)
            raise StoreError(f"{f.path} vanished since it was listed") from None
        except (OSError, pa.ArrowException, ValueError, duckdb.Error) as exc:
            log.warning("skipping unreadable results file %s: %s", f.path, exc)
            return None
        with self._lock:
            old = self._tables.pop(f.path, None)
            if old is not None:
                self._bytes -= old[2].nbytes
            self._tables[f.path] = (f.size, f.mtime_ns, table)
            self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                _, (_, _, t) = self._tables.popitem(last=False)
                self._bytes -= t.nbytes
        return table
