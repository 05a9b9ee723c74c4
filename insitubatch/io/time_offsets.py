"""Offsets in time along a sample axis: ``"6h"`` resolved against the axis's decoded time coordinate.

Users say "the step six hours ahead"; the engine reads ``anchor + k``. On a
regular axis (every step the same) a duration is a whole number of steps,
resolved once: the view is exactly the step form. On an axis with gaps or
irregular steps no step count means a fixed time, so each anchor's read index
is looked up once, vectorised, in a :class:`TimeRows` table (``-1`` where the
time it wants is not stored: that anchor is dropped, or in inference raises).

A duration is ``"6h"``, ``"-6h"``, ``"30min"``, ``"1d"``, ``"2w"``,
``numpy.timedelta64`` or ``datetime.timedelta``.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TimeAxisError
from .dates import TimeAxis, is_time

__all__ = [
    "UNSTORED_ROWS",
    "StepAxis",
    "TimeRows",
    "exact_text",
    "format_duration",
    "in_time",
    "is_duration",
    "mixed_offsets",
    "parse_duration",
    "sample_time_axis",
    "unstored_rows",
]

# Nanoseconds per duration unit a user may write ("m" alone is refused: minutes or months?).
_UNIT_NS = {
    "w": 7 * 86_400 * 10**9,
    "d": 86_400 * 10**9,
    "h": 3_600 * 10**9,
    "min": 60 * 10**9,
    "s": 10**9,
    "ms": 10**6,
    "us": 10**3,
    "ns": 1,
}
_DURATION = re.compile(r"^\s*(?P<count>[+-]?\d+)\s*(?P<unit>w|d|h|min|s|ms|us|ns)\s*$", re.IGNORECASE)
# how many missing times an error or a report names before "and N more"
NAMED_TIMES = 5
# The array attribute naming rows of a dimension that no store holds (``{"dim": name, "rows": [[start, stop], ...]}``):
# ``concat_stores`` pads each store to a chunk boundary with them, and no pass draws an anchor that reads one.
UNSTORED_ROWS = "insitubatch_unstored_rows"


def unstored_rows(attributes: Any, dim: str | None, n: int) -> np.ndarray | None:
    """``(n,)``: the rows along ``dim`` that an array's ``attributes`` declare no store holds, or ``None``."""
    declared = attributes.get(UNSTORED_ROWS) if isinstance(attributes, dict) else None
    if not isinstance(declared, dict) or dim is None or declared.get("dim") != dim:
        return None
    out = np.zeros(n, dtype=bool)
    for start, stop in declared.get("rows", []):
        out[int(start) : int(stop)] = True
    return out if out.any() else None


def is_duration(value: Any) -> bool:
    """Whether ``value`` is written as a duration (a string, ``timedelta64`` or ``timedelta``), not a step count."""
    return isinstance(value, str | np.timedelta64 | _dt.timedelta)


def parse_duration(value: Any, what: str) -> int:
    """``value`` as integer nanoseconds.

    Raises
    ------
    ValueError
        A string that is not ``<int><unit>`` (units w, d, h, min, s, ms, us, ns), or a NaT.
    TypeError
        ``value`` is no duration.
    """
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(
                f"{what}: {value!r} is not a duration; write <int><unit> with unit w, d, h, min, s, ms, us or ns "
                "('6h', '-6h', '30min', '1d')"
            )
        return int(m["count"]) * _UNIT_NS[m["unit"].lower()]
    if isinstance(value, np.timedelta64):
        if np.isnat(value):
            raise ValueError(f"{what}: NaT is not a duration")
        return int(value.astype("timedelta64[ns]").astype(np.int64))
    if isinstance(value, _dt.timedelta):
        return (value.days * 86_400 + value.seconds) * 10**9 + value.microseconds * 1000
    raise TypeError(f"{what}: {value!r} ({type(value).__name__}) is not a duration ('6h', numpy.timedelta64)")


def format_duration(ns: int) -> str:
    """Nanoseconds as the coarsest whole unit: ``21600000000000`` is ``"6h"``."""
    for unit, per in _UNIT_NS.items():
        if ns % per == 0:
            return f"{ns // per}{unit}"
    return f"{ns}ns"  # pragma: no cover - every int is a whole number of ns


def exact_text(axis: TimeAxis, instant: Any) -> str:
    """An instant as ISO text that reads back as that one instant (to the second, finer only when needed).

    ``TimeAxis.format`` drops trailing zero fields, and ``"2000-01-02"`` read
    back names the whole day; a declared missing date must name the step alone.
    """
    if axis.is_cftime:
        text = f"{instant.year:04d}-{instant.month:02d}-{instant.day:02d}T"
        text += f"{instant.hour:02d}:{instant.minute:02d}:{instant.second:02d}"
        return text + (f".{instant.microsecond:06d}" if instant.microsecond else "")
    ns = np.datetime64(instant, "ns")
    return str(np.datetime_as_string(ns, unit="s" if int(ns.astype(np.int64)) % 10**9 == 0 else "ns"))


@dataclass(frozen=True, eq=False)
class StepAxis:
    """A decoded time coordinate as integer nanoseconds, and its step.

    ``ticks`` are nanoseconds (from the first date for ``cftime`` dates,
    since 1970 for ``datetime64``); ``stored`` is False where the coordinate
    holds NaT. ``step`` is the smallest step between stored times;
    ``first_gap`` the first index after which the next step differs from it
    (``None`` on a regular axis).
    """

    values: np.ndarray
    axis: TimeAxis
    ticks: np.ndarray
    stored: np.ndarray
    step: int
    first_gap: int | None

    @classmethod
    def of(cls, values: np.ndarray) -> StepAxis | None:
        """The axis of decoded coordinate ``values``; ``None`` when they are not dates."""
        if not is_time(values):
            return None
        axis = TimeAxis.of(values)
        if axis is None:  # pragma: no cover - is_time said dates
            return None
        if axis.is_cftime:
            stored = np.array([v is not None for v in values], dtype=bool)
            origin = next((v for v in values if v is not None), None)
            tick = _dt.timedelta(microseconds=1)
            ticks = np.array([(v - origin) // tick * 1000 if v is not None else 0 for v in values], dtype=np.int64)
        else:
            ns = values.astype("datetime64[ns]")
            stored = ~np.isnat(ns)
            ticks = ns.astype(np.int64)
        kept = ticks[stored]
        diffs = np.diff(kept)
        positive = diffs[diffs > 0]
        step = int(positive.min()) if positive.size else 0
        gap = None
        odd = np.flatnonzero(diffs != step) if step else np.zeros(0, np.int64)
        if odd.size or not stored.all():
            where = np.flatnonzero(stored)
            gap = int(where[odd[0]]) if odd.size else int(np.flatnonzero(~stored)[0])
        return cls(values, axis, ticks, stored, step, gap)

    @property
    def regular(self) -> bool:
        return self.first_gap is None

    def instant(self, tick: int) -> Any:
        """The date ``tick`` nanoseconds stands for on this axis (``datetime64[ns]`` or a ``cftime`` date)."""
        if self.axis.is_cftime:
            origin = next(v for v in self.values if v is not None)
            return origin + _dt.timedelta(microseconds=int(tick) // 1000)
        return np.datetime64(int(tick), "ns")

    def format(self, tick: int) -> str:
        """An instant given in ticks, as a short ISO string."""
        return self.axis.format(self.instant(tick))

    def exact(self, tick: int) -> str:
        """An instant given in ticks, as ISO text to the second (what ``missing=`` reads back as that instant)."""
        return exact_text(self.axis, self.instant(tick))

    def gap_text(self) -> str:
        """The first gap, in words: the two stored times around it and the step between them."""
        i = self.first_gap
        if i is None:
            return "none"
        if not self.stored[i]:
            return f"index {i} holds no date (NaT)"
        j = i + 1 + int(np.argmax(self.stored[i + 1 :]))
        step = int(self.ticks[j] - self.ticks[i])
        return (
            f"{self.format(self.ticks[i])} is followed by {self.format(self.ticks[j])} "
            f"({format_duration(step)}, not the {format_duration(self.step)} step)"
        )

    def steps_of(self, ns: int) -> int | None:
        """The whole number of steps ``ns`` is on a regular axis, else ``None``."""
        if not self.regular or not self.step or ns % self.step:
            return None
        return ns // self.step

    def rows(self, offsets: tuple[int, ...]) -> np.ndarray:
        """``(n, len(offsets))``: the index holding ``time[i] + offset`` for each anchor ``i``, or ``-1``."""
        where = np.flatnonzero(self.stored)
        kept = self.ticks[where]
        out = np.full((len(self.ticks), len(offsets)), -1, dtype=np.int64)
        for j, off in enumerate(offsets):
            wanted = self.ticks + off
            k = np.clip(np.searchsorted(kept, wanted), 0, max(len(kept) - 1, 0))
            hit = self.stored & (kept[k] == wanted) if len(kept) else np.zeros(len(wanted), bool)
            out[hit, j] = where[k[hit]]
        return out


@dataclass(frozen=True, eq=False)
class TimeRows:
    """A view's offsets in time on an irregular axis: each anchor's read index per step, looked up once.

    ``offsets`` are nanoseconds, one per step (one for a shift, several for a
    window); ``shift`` is the view's shift in ns (added to each step);
    ``windowed`` whether rows are ``(steps, *inner)``. ``rows[i, s]`` is the
    index whose time is ``time[i] + offsets[s]``, ``-1`` when none is stored.
    """

    axis: StepAxis
    shift: int
    steps: tuple[int, ...]
    windowed: bool
    rows: np.ndarray
    # the axis ``rows`` index when it is not ``axis`` (a joined store's variable: its own store's time axis),
    # and its first and last stored instants in ``axis``'s ticks
    read_axis: StepAxis | None = None
    read_span: tuple[int, int] | None = None

    @classmethod
    def build(cls, axis: StepAxis, shift: int, steps: tuple[int, ...], windowed: bool) -> TimeRows:
        return cls(axis, shift, steps, windowed, axis.rows(tuple(shift + s for s in steps)))

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(self.shift + s for s in self.steps)

    @property
    def nominal(self) -> tuple[int, tuple[int, ...]]:
        """The shift and steps in whole steps of the axis's smallest step (what ``Batch.offsets`` reports)."""
        step = self.axis.step or 1
        return round(self.shift / step), tuple(round(s / step) for s in self.steps)

    @property
    def reach(self) -> tuple[int, int]:
        """Anchors ``[lo, hi)`` whose every wanted time lies within the axis's first and last stored time.

        Outside it a window runs off the archive, as a step window runs off the
        array: those anchors are no loss of time, just the edge.
        """
        kept = self.axis.ticks[self.axis.stored]
        if not len(kept):
            return 0, 0
        first, last = self.read_span if self.read_span is not None else (kept[0], kept[-1])
        lo_t, hi_t = first - min(self.offsets), last - max(self.offsets)
        inside = self.axis.stored & (self.axis.ticks >= lo_t) & (self.axis.ticks <= hi_t)
        if not inside.any():
            return 0, 0
        return int(np.argmax(inside)), len(inside) - int(np.argmax(inside[::-1]))

    def valid(self) -> np.ndarray:
        """``(n,)``: anchors whose every time is stored."""
        return np.asarray((self.rows >= 0).all(axis=1))

    def missing_times(self, anchors: np.ndarray) -> list[str]:
        """The times ``anchors`` want that the axis does not store, sorted, unique, as ISO text to the second."""
        anchors = np.asarray(anchors, dtype=np.int64)
        bad = (self.rows[anchors] < 0) & self.axis.stored[anchors][:, None]  # an anchor without a date wants none
        wanted = self.axis.ticks[anchors][:, None] + np.asarray(self.offsets, dtype=np.int64)[None, :]
        return [self.axis.exact(t) for t in np.unique(wanted[bad]).tolist()]

    def describe(self) -> str:
        words = [format_duration(o) for o in self.offsets]
        return f"[{', '.join(words)}]" if self.windowed else words[0]


def sample_time_axis(values: np.ndarray | None, path: str, dim: str | None, n: int, what: str) -> StepAxis:
    """The :class:`StepAxis` of array ``path``'s sample-axis coordinate ``values`` (``None``: it has none).

    Raises
    ------
    TimeAxisError
        No dimension name, no coordinate, or a coordinate that holds no dates; the message names the array.
    """
    if not dim:
        raise TimeAxisError(
            f"{what}: array {path!r} has no dimension names, so its sample axis has no time coordinate; "
            "give the offset in steps (shift(1), window([-1, 0]))"
        )
    if values is None:
        raise TimeAxisError(
            f"{what}: array {path!r} has no time coordinate along its sample axis {dim!r} (no 1-D array "
            f"{dim!r} of length {n} beside it or in a parent group); give the offset in steps"
        )
    axis = StepAxis.of(values)
    if axis is None:
        raise TimeAxisError(
            f"{what}: coordinate {dim!r} of array {path!r} holds no dates (dtype {values.dtype}, no CF time "
            "units); give the offset in steps"
        )
    kept = axis.ticks[axis.stored]
    if len(kept) > 1 and not (kept[1:] > kept[:-1]).all():
        k = int(np.flatnonzero(kept[1:] <= kept[:-1])[0])
        raise TimeAxisError(
            f"{what}: time coordinate {dim!r} of array {path!r} does not increase ({axis.format(kept[k])} is "
            f"followed by {axis.format(kept[k + 1])}), so no time names one step"
        )
    return axis


def mixed_offsets(what: str, path: str) -> str:
    """The message for a step count and a duration combined in one view on an irregular axis."""
    return (
        f"{what}: array {path!r}'s view already has offsets of the other kind (steps or durations) on a time "
        "axis with gaps, where a step is no fixed time; give every offset as a duration ('6h')"
    )


def in_time(
    axis: StepAxis,
    what: str,
    shift: int | None,
    steps: tuple[int, ...] | None,
    rows: TimeRows | None,
    has_steps: bool,
    path: str,
) -> tuple[int, tuple[int, ...], TimeRows | None]:
    """A shift (``shift`` ns) or window (``steps`` ns) of a view, resolved against ``axis``.

    Returns ``(offset, window_steps, None)`` in whole steps on a regular axis
    (the offset to add; no window: ``()``), else the nominal ones and the
    view's new :class:`TimeRows` (``rows`` is the view's current one;
    ``has_steps`` says it already holds step-count offsets; ``path`` names its array).

    Raises
    ------
    TimeAxisError
        A duration that is no whole number of a regular axis's steps.
    TypeError
        Step counts and durations in one view on an irregular axis.
    """
    asked = ((shift,) if shift is not None else ()) + (steps or ())
    if axis.regular:
        odd = [ns for ns in asked if axis.steps_of(ns) is None]
        if odd:
            raise TimeAxisError(
                f"{what}: {format_duration(odd[0])} is no whole number of the time axis's "
                f"{format_duration(axis.step)} steps, so no anchor has a stored time that far away"
            )
        counts = tuple(ns // axis.step for ns in asked)
        return (counts[0], (), None) if shift is not None else (0, counts, None)
    if has_steps:
        raise TypeError(mixed_offsets(what, path))
    total = (rows.shift if rows is not None else 0) + (shift or 0)
    windowed = steps is not None or (rows is not None and rows.windowed)
    table = TimeRows.build(axis, total, steps or (rows.steps if rows is not None else (0,)), windowed)
    nominal, nominal_steps = table.nominal
    return nominal, nominal_steps if windowed else (), table
