"""Dates as users write them and as a time coordinate holds them: ``TimeAxis``.

A decoded time coordinate (``io.times``) holds ``datetime64[ns]`` (the
standard calendars) or ``cftime`` dates (any other calendar). A
:class:`TimeAxis` reads a date-like against it (an ISO string at any
resolution, a ``datetime``/``date``, ``numpy.datetime64``, a ``cftime`` date)
as the first and last instant it names, the way pandas and xarray slice:
``"2015-12-31"`` runs through the last instant of that day, ``"2015"``
through the year; a ``datetime``/``datetime64`` is the one instant it holds.
It also prints instants back as short ISO strings.

``cftime`` is optional and imported only where a coordinate needs it.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FIELDS", "NS", "TimeAxis", "components_to_numpy", "format_bound", "import_cftime", "is_time"]

NS = np.dtype("datetime64[ns]")
# The instants datetime64[ns] holds, to the microsecond (xarray's borders for the same test).
_NS_RANGE = (np.datetime64("1677-09-21T00:12:43.145225", "us"), np.datetime64("2262-04-11T23:47:16.854775", "us"))

# An ISO 8601 date at any resolution, as pandas/xarray read slice bounds: "2015",
# "2015-12", "2015-12-31", then "T" or a space and "18", "18:30", "18:30:15", "18:30:15.25".
_ISO = re.compile(
    r"^(?P<year>[+-]?\d{4,5})(?:-(?P<month>\d{1,2})(?:-(?P<day>\d{1,2})"
    r"(?:[T ](?P<hour>\d{1,2})(?::(?P<minute>\d{2})(?::(?P<second>\d{2})(?:[.,](?P<fraction>\d{1,9}))?)?)?)?)?)?$"
)
# The compact form: "20151231", "20151231T18", "20151231T1830", "20151231T183015".
_ISO_BASIC = re.compile(
    r"^(?P<year>\d{4})(?P<month>\d{2})(?P<day>\d{2})"
    r"(?:T(?P<hour>\d{2})(?:(?P<minute>\d{2})(?:(?P<second>\d{2}))?)?)?$"
)
FIELDS = ("year", "month", "day", "hour", "minute", "second")


def import_cftime() -> Any:
    """The ``cftime`` module, or ``None`` when it is not installed."""
    try:
        import cftime
    except ImportError:
        return None
    return cftime


def is_cftime_array(values: np.ndarray) -> bool:
    """Whether ``values`` hold ``cftime`` dates (an object array whose first item is one)."""
    if values.dtype != object or values.size == 0:
        return False
    first = values.flat[0]
    return hasattr(first, "calendar") and hasattr(first, "timetuple")


def is_time(values: np.ndarray) -> bool:
    """Whether decoded coordinate ``values`` are dates (``datetime64`` or ``cftime`` objects)."""
    return values.dtype.kind == "M" or is_cftime_array(values)


def components_to_numpy(parts: Sequence[int], ns: int = 0) -> np.datetime64:
    """``datetime64[ns]`` of (year, month, day, hour, minute, second) plus ``ns`` nanoseconds.

    Raises ``ValueError`` for an invalid date and ``OverflowError`` outside datetime64[ns]'s range.
    """
    year, month, day, hour, minute, second = parts
    sign = "-" if year < 0 else ""
    iso = f"{sign}{abs(year):04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return _to_ns(np.datetime64(iso, "us")) + np.timedelta64(ns, "ns")


def _to_ns(value: np.datetime64) -> np.datetime64:
    """``value`` as ``datetime64[ns]``, refusing what would wrap around (numpy's cast does not check)."""
    coarse = value.astype("datetime64[us]")
    if not _NS_RANGE[0] <= coarse <= _NS_RANGE[1]:
        raise OverflowError(f"{value} is outside what datetime64[ns] holds ({_NS_RANGE[0]} to {_NS_RANGE[1]})")
    return value.astype(NS)


def _parse_iso(text: str) -> tuple[list[int], int, str]:
    """An ISO date string as its fields (year..second), nanoseconds, and the finest field given."""
    stripped = text.strip()
    m = _ISO.match(stripped) or _ISO_BASIC.match(stripped)
    if m is None:
        raise ValueError(
            f"{text!r} is not an ISO 8601 date (YYYY, YYYY-MM, YYYY-MM-DD, YYYY-MM-DDTHH[:MM[:SS[.fff]]]); "
            "time zones are not supported: the time axis has none"
        )
    groups = m.groupdict()
    resolution = "year"
    parts = []
    for f in FIELDS:
        value = groups.get(f)
        if value is not None:
            resolution = f
        parts.append(int(value) if value is not None else (1 if f in ("month", "day") else 0))
    fraction = groups.get("fraction")
    ns = 0
    if fraction:
        resolution = {1: "ms", 2: "ms", 3: "ms", 4: "us", 5: "us", 6: "us"}.get(len(fraction), "ns")
        ns = int(fraction.ljust(9, "0"))
    return parts, ns, resolution


# How far the interval a string names reaches past its first instant, for each finest field.
_STEP_NS = {"day": 86_400 * 10**9, "hour": 3_600 * 10**9, "minute": 60 * 10**9, "second": 10**9}
_STEP_NS.update({"ms": 10**6, "us": 10**3, "ns": 1})


@dataclass(frozen=True)
class TimeAxis:
    """The kind of dates a time coordinate holds: ``datetime64`` (``calendar`` None) or ``cftime`` dates.

    Turns what users type into instants comparable with the coordinate's values.
    """

    calendar: str | None = None
    date_type: Any = None

    @classmethod
    def of(cls, values: np.ndarray) -> TimeAxis | None:
        """The axis of decoded coordinate ``values``; ``None`` when they are not dates."""
        if values.dtype.kind == "M":
            return cls()
        if is_cftime_array(values):
            first = next(v for v in values.flat if v is not None)
            return cls(calendar=str(first.calendar), date_type=type(first))
        return None

    @property
    def is_cftime(self) -> bool:
        return self.calendar is not None

    def values(self, coord: np.ndarray) -> np.ndarray:
        """``coord`` in the form comparisons use (``datetime64[ns]``, or the ``cftime`` objects)."""
        return coord.astype(NS) if not self.is_cftime else coord

    def bounds(self, value: Any) -> tuple[Any, Any]:
        """The first and last instant date-like ``value`` names (a string names its whole resolution).

        Raises
        ------
        TypeError
            ``value`` is no date-like.
        ValueError
            A string that is not an ISO 8601 date, or not a date of this calendar.
        """
        if isinstance(value, str):
            parts, ns, resolution = _parse_iso(value)
            try:
                return self._string_bounds(parts, ns, resolution)
            except (ValueError, OverflowError) as exc:
                raise ValueError(f"{value!r} is not a valid date{self._in_calendar()}: {exc}") from exc
        instant = self.instant(value)
        return instant, instant

    def instant(self, value: Any) -> Any:
        """The one instant date-like ``value`` holds (a string: the first instant it names).

        Raises
        ------
        TypeError
            ``value`` is no date-like.
        ValueError
            A string that is not an ISO 8601 date, a NaT, or not a date of this calendar.
        """
        if isinstance(value, str):
            return self.bounds(value)[0]
        if isinstance(value, np.datetime64):
            if np.isnat(value):
                raise ValueError("NaT is not a date")
            if not self.is_cftime:
                try:
                    return _to_ns(value)
                except OverflowError as exc:
                    raise ValueError(str(exc)) from exc
            value = value.astype("datetime64[us]").item()
        if hasattr(value, "calendar") and hasattr(value, "timetuple"):  # a cftime date
            if self.is_cftime and value.calendar == self.calendar:
                return value
            parts = [value.year, value.month, value.day, value.hour, value.minute, value.second]
            return self._from_parts(parts, value.microsecond * 1000, f"a {value.calendar!r} date")
        if isinstance(value, _dt.datetime):
            if value.tzinfo is not None:
                raise ValueError(f"{value!r} carries a time zone; the time axis has none (pass a naive datetime)")
            ns = value.microsecond * 1000 + int(getattr(value, "nanosecond", 0))
            parts = [value.year, value.month, value.day, value.hour, value.minute, value.second]
            return self._from_parts(parts, ns, repr(value))
        if isinstance(value, _dt.date):
            return self._from_parts([value.year, value.month, value.day, 0, 0, 0], 0, repr(value))
        raise TypeError(
            f"{value!r} ({type(value).__name__}) is not a date: pass an ISO string ('2016-01-01'), "
            "a datetime/date, a numpy.datetime64" + (" or a cftime date" if self.is_cftime else "")
        )

    def _in_calendar(self) -> str:
        return f" in the {self.calendar!r} calendar" if self.is_cftime else ""

    def _from_parts(self, parts: list[int], ns: int, what: str) -> Any:
        try:
            if self.is_cftime:
                return self.date_type(*parts, ns // 1000)
            return components_to_numpy(parts, ns)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{what} is not a valid date{self._in_calendar()}: {exc}") from exc

    def _string_bounds(self, parts: list[int], ns: int, resolution: str) -> tuple[Any, Any]:
        first = self._from_parts(parts, ns, "the date")
        year, month = parts[0], parts[1]
        if resolution in ("year", "month"):
            if resolution == "year":
                after = [year + 1, 1, 1, 0, 0, 0]
            else:
                after = [year + month // 12, month % 12 + 1, 1, 0, 0, 0]
            end = self._from_parts(after, 0, "the date")
            return first, self._before(end)
        step = _STEP_NS[resolution]
        if self.is_cftime:
            # cftime counts microseconds: a finer string names one instant
            end = first + _dt.timedelta(microseconds=max(step // 1000, 1))
            return first, self._before(end)
        return first, first + np.timedelta64(step - 1, "ns")

    def _before(self, end: Any) -> Any:
        """The last instant before ``end`` (one tick of the axis's resolution)."""
        if self.is_cftime:
            return end - _dt.timedelta(microseconds=1)
        return end - np.timedelta64(1, "ns")

    def format(self, value: Any) -> str:
        """An instant as a short ISO string (trailing zero fields dropped)."""
        if self.is_cftime:
            text = f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
            clock = (value.hour, value.minute, value.second, value.microsecond)
            if any(clock):
                text += f"T{value.hour:02d}:{value.minute:02d}"
                if value.second or value.microsecond:
                    text += f":{value.second:02d}" + (f".{value.microsecond:06d}" if value.microsecond else "")
            return text
        return str(np.datetime_as_string(np.datetime64(value, "ns"), unit="auto"))


def format_bound(value: Any) -> str | None:
    """A split bound as the manifest records it: strings as written, dates in ISO, ``None`` as is."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="auto"))
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)
