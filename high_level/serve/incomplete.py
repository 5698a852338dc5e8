"""Flagged windows: the windows the job learned were short, read from the store (:mod:`contract.results`).

Why not only the result rows: a window whose every record was shed by a capture host's backlog (or
lost in a sequence gap) has no row to say ``complete: false``. The job writes a flagged-window row
for every short window, rows or not; this module reads them per query and time range, folds them per
window (``/queries/{q}/incomplete``) and merges them into the per-window listing (``/series``), so such
a window is shown as incomplete, never silently missing.

Each file is validated against :data:`contract.results.INCOMPLETE_SCHEMA` (a file that does not follow
it is skipped and counted, never cast) and cached by (size, mtime): a file is written once per
micro-batch that flagged something, and only a replay rewrites it (with the same rows).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from contract import results as R
from high_level.serve.sidecar import SidecarReader
from high_level.serve.timefmt import iso_of_us

_DAY_US = 86_400 * 1_000_000


class IncompleteReader(SidecarReader):
    """Reads and caches the flagged-window files of one results directory."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root, R.check_incomplete_schema, "flagged-window")

    def table(self, query: str, start_us: int, end_us: int) -> pa.Table:
        """The flagged rows of ``query`` with window_start in [start_us, end_us), by window_start."""
        lo = datetime.fromtimestamp(start_us // _DAY_US * 86_400, UTC).date()
        hi = datetime.fromtimestamp((end_us - 1) // _DAY_US * 86_400, UTC).date()
        files = [
            (str(f), f)
            for day, d in R.incomplete_date_dirs(self.root, query)
            if lo <= day <= hi
            for f in sorted(d.iterdir())
            if R.parse_part_name(f.name) is not None
        ]
        tables = self._files.read(files)
        if not tables:
            return R.INCOMPLETE_SCHEMA.empty_table()
        t = pa.concat_tables(tables)
        ws = t["window_start"].cast(pa.int64())
        t = t.filter(pc.and_(pc.greater_equal(ws, start_us), pc.less(ws, end_us)))
        return t.sort_by(
            [
                ("window_start", "ascending"),
                ("partition", "ascending"),
                ("first_pane_start", "ascending"),
                ("host", "ascending"),
                ("cause", "ascending"),
            ]
        )

    def windows(self, query: str, start_us: int, end_us: int) -> list[dict[str, Any]]:
        """Per flagged window (oldest first): its bounds, ``incomplete: true``, the records the short panes
        held per cause (a range's records count in every window it overlaps, as ``missing_records``
        does), the hosts, whether it was learned after the window closed, and every short pane range."""
        t = self.table(query, start_us, end_us)
        d = t.to_pydict()
        us = {
            c: t[c].cast(pa.int64()).to_pylist()
            for c in ("window_start", "window_end", "flagged_at", "first_pane_start", "last_pane_end")
        }
        out: dict[int, dict[str, Any]] = {}
        flagged: dict[int, int] = {}  # the newest flagged_at per window
        for i in range(t.num_rows):
            ws = us["window_start"][i]
            w = out.get(ws)
            if w is None:
                w = out[ws] = {
                    "window_start": iso_of_us(ws),
                    "window_end": iso_of_us(us["window_end"][i]),
                    "incomplete": True,
                    "shed_records": 0,
                    "gap_records": 0,
                    "causes": {},
                    "hosts": [],
                    "after_close": False,
                    "flagged_at": None,
                    "panes": [],
                }
            cause, host, n = d["cause"][i], d["host"][i], int(d["records"][i])
            w["shed_records" if cause == "shed" else "gap_records"] += n
            w["causes"][cause] = w["causes"].get(cause, 0) + n  # which cause, how many (contract.results)
            if host not in w["hosts"]:
                w["hosts"].append(host)
            w["after_close"] = w["after_close"] or bool(d["after_close"][i])
            flagged[ws] = max(flagged.get(ws, us["flagged_at"][i]), us["flagged_at"][i])
            w["panes"].append(
                {
                    "host": host,
                    "partition": d["partition"][i],
                    "cause": cause,
                    "records": n,
                    "first_pane_start": iso_of_us(us["first_pane_start"][i]),
                    "last_pane_end": iso_of_us(us["last_pane_end"][i]),
                }
            )
        for ws, w in out.items():
            w["hosts"].sort()
            w["flagged_at"] = iso_of_us(flagged[ws])
        return [out[k] for k in sorted(out)]

    def per_window(self, query: str, start_us: int, end_us: int) -> dict[int, tuple[int, int, str]]:
        """window_start (us) -> (shed records, other lost records, "host cause records; ...") of the
        flagged windows in the range (the text is what the page's tooltip says: which host, which cause)."""
        t = self.table(query, start_us, end_us)
        out: dict[int, tuple[int, int, str]] = {}
        why: dict[int, dict[tuple[str, str], int]] = {}
        for ws, host, cause, n in zip(
            t["window_start"].cast(pa.int64()).to_pylist(),
            t["host"].to_pylist(),
            t["cause"].to_pylist(),
            t["records"].to_pylist(),
            strict=True,
        ):
            shed, gap, _ = out.get(ws, (0, 0, ""))
            out[ws] = (shed + n, gap, "") if cause == "shed" else (shed, gap + n, "")
            w = why.setdefault(ws, {})
            w[(host, cause)] = w.get((host, cause), 0) + n
        return {
            ws: (
                a,
                b,
                "; ".join(
                    f"{h or 'job'} {c}" + (f" {n}" if n else "") for (h, c), n in sorted(why[ws].items())
                ),
            )
            for ws, (a, b, _) in out.items()
        }


SERIES_COLUMNS = ("shed_records", "flagged", "loss_causes")  # what the per-window listing (/series) adds


def merge_series(
    columns: list[str],
    rows: list[tuple],
    flags: dict[int, tuple[int, int, str]],
    range_us: int,
    complete: bool | None,
) -> list[tuple]:
    """The per-window rows of ``/series`` (window_start in us first, ``columns`` order) with the flagged
    windows merged in, each row extended by :data:`SERIES_COLUMNS`.

    A flagged window is incomplete whatever its rows say (a shed range learned after it closed does not
    rewrite its rows); one without rows (every record shed or lost) gets a row of its own: no groups,
    no values, ``missing_records`` the records of its short panes. ``complete`` filters after merging.
    """
    ic, im = columns.index("complete"), columns.index("missing_records")
    out = []
    for r in rows:
        f = flags.get(int(r[0]))
        row = list(r)
        if f is not None:
            row[ic] = False
            row[im] = max(int(row[im] or 0), f[0] + f[1])
        out.append((*row, f[0] if f else 0, f is not None, f[2] if f else ""))
    have = {int(r[0]) for r in rows}
    for ws in sorted(set(flags) - have):
        row: list[Any] = [None] * len(columns)
        row[0], row[1] = ws, ws + range_us
        row[columns.index("groups")] = 0
        row[ic], row[columns.index("incomplete_groups")] = False, 0
        row[columns.index("late_partials")], row[im] = 0, flags[ws][0] + flags[ws][1]
        out.append((*row, flags[ws][0], True, flags[ws][2]))
    if len(have) < len(out):
        out.sort(key=lambda r: r[0])
    return out if complete is None else [r for r in out if bool(r[ic]) == complete]
