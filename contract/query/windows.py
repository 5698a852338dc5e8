"""The window of an aggregate query: time-based sliding/tumbling (panes = gcd(range, slide)) or landmark.

Its own module because the window is one concept with its own rules (the dissertation's WID semantics,
§5.1): the query model (:mod:`contract.query.model`) and the joins read it, and both levels derive their
pane arithmetic from it.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.query.durations import NS, parse_duration_ns

STRATEGIES = ("lazy", "eager", "adaptive")  # window strategies (WindowSpec.strategy); lazy: the default


def strategy_refusal(
    strategy: str, landmark: bool, differential: bool, top_capacity: bool, groups: bool
) -> str | None:
    """Why a query with these properties cannot run window ``strategy`` (None: it can). The one rule
    the loader and the high level's AdaptWID (``high_level/aggregate/adaptwid.py``) both apply: each
    refused feature keeps its own per-group state, which eager window aggregates would not keep."""
    if strategy == "lazy":
        return None
    if landmark:
        return f"window.strategy {strategy}: a landmark window keeps one running row per group already"
    if differential:
        return f"window.strategy {strategy}: differential sliding windows keep running sums already"
    if top_capacity:
        return (
            f"window.strategy {strategy}: top with a capacity bounds its panes (Misra-Gries), not its windows"
        )
    if groups:
        return f"window.strategy {strategy}: group-wise punctuation (heartbeat.groups) closes a group's panes"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WindowSpec(_Strict):
    """Sliding/tumbling (range, slide) or landmark (from origin + n*landmark, updated every ``update``).

    A landmark window (``{landmark: 1d, update: 1m}``: per-day totals) is a tumbling window of the
    landmark's length whose panes are the update interval: every pane the low-water mark passes
    emits ``update`` rows (the totals so far), the landmark's end the ``final`` rows; closed by
    punctuation like every window.

    ``differential`` (sliding windows, dissertation §6.2.2.2-3): keep each group's running window and
    take the expired panes out again instead of re-merging every pane of every window. ``None`` (the
    default) uses it when every aggregate of the query is subtractable
    (:data:`contract.aggregates.SUBTRACTABLE`) and a pane is in enough windows for it to pay
    (:func:`contract.query.model.differential`); ``true`` insists (a query that cannot is refused);
    ``false`` re-merges (the baseline).

    ``strategy`` (dissertation §6.3, ``high_level/aggregate/adaptwid.py``): how the high level keeps a
    window's state until it closes. ``lazy`` (the default) keeps pane rows and builds the windows at the
    close; ``eager`` folds every partial into each open window it belongs to; ``adaptive`` (AdaptWID)
    picks one of the two per group at every close from the memory each would hold. Same results.
    """

    range_ns: int = Field(alias="range")
    slide_ns: int | None = Field(default=None, alias="slide")
    origin_ns: int = Field(default=0, alias="origin")
    landmark_ns: int | None = Field(default=None, alias="landmark")
    update_ns: int | None = Field(default=None, alias="update")
    differential: bool | None = None
    strategy: str = "lazy"

    @model_validator(mode="before")
    @classmethod
    def _landmark_range(cls, data: Any) -> Any:
        """A landmark window's range and slide are the landmark (given or not)."""
        if isinstance(data, dict) and data.get("landmark") is not None:
            lm = data["landmark"]
            for k in ("range", "slide"):
                if data.get(k) is not None and parse_duration_ns(data[k]) != parse_duration_ns(lm):
                    raise ValueError(f"a landmark window takes 'landmark' and 'update', not {k!r}")
            if data.get("update") is None:
                raise ValueError("a landmark window needs 'update' (how often its totals so far are emitted)")
            data = {**data, "range": lm, "slide": lm}
        elif isinstance(data, dict) and data.get("update") is not None:
            raise ValueError("'update' belongs to a landmark window ({landmark: 1d, update: 1m})")
        return data

    @field_validator("range_ns", "slide_ns", "origin_ns", "landmark_ns", "update_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return None if v is None else parse_duration_ns(v)

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.range_ns <= 0:
            raise ValueError("range must be positive")
        slide = self.slide
        if slide <= 0:
            raise ValueError("slide must be positive")
        if slide > self.range_ns:
            raise ValueError("slide larger than range would leave gaps between windows")
        if self.update_ns is not None:
            if self.update_ns <= 0 or self.range_ns % self.update_ns:
                raise ValueError(
                    f"update ({self.update_ns / NS:g}s) must divide the landmark ({self.range_ns / NS:g}s)"
                )
            if self.range_ns // self.update_ns > 86_400:
                raise ValueError("more than 86400 updates per landmark window; use a larger update")
        elif self.range_ns // self.pane_ns > 1024:
            raise ValueError(
                f"more than 1024 panes per window (pane = gcd(range, slide) = {self.pane_ns / NS:g}s); "
                "use a larger slide or a range that is a multiple of it"
            )
        if self.pane_ns < 1_000_000:
            raise ValueError("pane (gcd of range and slide) below 1 ms is not supported")
        return self

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str, info: Any) -> str:
        if v not in STRATEGIES:
            raise ValueError(f"{v!r} is not a window strategy ({', '.join(STRATEGIES)})")
        why = strategy_refusal(
            v, info.data.get("landmark_ns") is not None, info.data.get("differential") is True, False, False
        )
        if why:
            raise ValueError(why)
        return v

    @property
    def slide(self) -> int:
        return self.slide_ns if self.slide_ns is not None else self.range_ns

    @property
    def pane_ns(self) -> int:
        """The low level's aggregation unit: gcd(range, slide), the slide when range is a multiple of it
        (RANGE 9 / SLIDE 6 -> panes of 3, windows of 3 panes sliding by 2); a landmark's update."""
        return self.update_ns if self.update_ns is not None else math.gcd(self.range_ns, self.slide)

    @property
    def landmark(self) -> bool:
        return self.landmark_ns is not None

    @property
    def panes_per_window(self) -> int:
        return self.range_ns // self.pane_ns

    @property
    def panes_per_slide(self) -> int:
        """Windows start every this many panes (at origin + n*slide); 1 unless range % slide != 0."""
        return self.slide // self.pane_ns

    @property
    def sliding(self) -> bool:
        """Overlapping windows: a pane belongs to more than one (not tumbling, not landmark)."""
        return not self.landmark and self.panes_per_window > self.panes_per_slide

    @property
    def tumbling(self) -> bool:
        return self.range_ns == self.slide


class RowWindowSpec(_Strict):
    """A row window (OOP §5.2, dissertation §5.1.2-3): ``ROWS N SLIDE M`` over the row number a capture
    host gives each row that passes the query's filter (its point of entry: several hosts have no global
    row order without ordering them). ``partition_by`` numbers the rows per value of those fields
    instead (the last N rows per source). Windows are the time windows' rules with rows for time: panes of
    gcd(N, M) rows, window ``w`` ends at row ``(w+1)*pane`` and starts ``rows`` before it (rows below 0
    are none: the first windows hold fewer), and closes when the host's row count passes its end.
    """

    rows: int
    slide: int | None = None
    partition_by: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> RowWindowSpec:
        if self.rows <= 0:
            raise ValueError("rows: must be positive")
        if self.step <= 0:
            raise ValueError("slide: must be positive")
        if self.step > self.rows:
            raise ValueError("slide: larger than rows would leave rows outside every window")
        if self.panes[0] > 4096:
            raise ValueError(
                f"more than 4096 panes per window (pane = gcd(rows, slide) = {self.pane_rows} rows); "
                "use a larger slide or rows a multiple of it"
            )
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError(f"partition_by: duplicate fields {self.partition_by}")
        return self

    @property
    def step(self) -> int:
        """Rows between window ends: the slide, or the rows when none is given (tumbling)."""
        return self.rows if self.slide is None else self.slide

    @property
    def pane_rows(self) -> int:
        """Rows per pane: gcd(rows, slide), the unit the capture host sub-aggregates."""
        return math.gcd(self.rows, self.step)

    @property
    def panes(self) -> tuple[int, int]:
        """(panes per window, panes per slide): the WID arithmetic of the time windows, in rows."""
        return self.rows // self.pane_rows, self.step // self.pane_rows


class TupleSlideSpec(_Strict):
    """A slide-by-tuple window (dissertation §5.1.5, Eq. 5.13-5.15): ``range`` over the timestamp, a window
    every ``every``-th row of a capture host, ending at that row's timestamp (``every: 1``: one per row).
    Forward-context aware: a row's windows depend on rows still to come (FCA bins, §6.1.4)."""

    range_ns: int = Field(alias="range", gt=0)
    every: int = Field(default=1, gt=0)

    @field_validator("range_ns", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration_ns(v)
