"""Time coordinates as xarray stores them: decoded to dates when read, encoded to CF when written.

:func:`decode_time_coordinate` turns a stored coordinate into dates the way
``xarray.open_zarr`` does: native ``datetime64`` passes through; CF numeric
time (``units: "<unit> since <date>"``, int or float) in the
``standard``/``gregorian``/``proleptic_gregorian`` calendars becomes
``datetime64[ns]``; any other calendar becomes ``cftime`` dates when
``cftime`` is installed, and a :class:`~insitubatch.errors.CalendarError`
saying to install it when it is not. ``io.coords`` calls it on every
coordinate it reads; ``None`` means "not time".

:func:`encode_time_coordinate` turns dates into integers plus CF attributes
the way ``xarray.Dataset.to_zarr`` does (the coarsest unit that divides every
step, counted from the first date), so xarray decodes what the writer stores.

No pandas: numpy's ``datetime64`` does the standard calendars, and ``cftime``
(optional, imported only when a coordinate needs it) the others.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CalendarError
from .dates import FIELDS, NS, TimeAxis, components_to_numpy, import_cftime

__all__ = ["NS_PER_UNIT", "STANDARD_CALENDARS", "decode_time_coordinate", "encode_time_coordinate"]

# Calendars numpy's datetime64 represents; xarray decodes these to datetime64[ns].
STANDARD_CALENDARS = ("standard", "gregorian", "proleptic_gregorian")
# What CF (and xarray) assume when a time coordinate names no calendar.
DEFAULT_CALENDAR = "standard"
# Nanoseconds per CF time unit: the units xarray decodes without cftime, finest last.
NS_PER_UNIT = {
    "days": 86_400 * 10**9,
    "hours": 3_600 * 10**9,
    "minutes": 60 * 10**9,
    "seconds": 10**9,
    "milliseconds": 10**6,
    "microseconds": 10**3,
    "nanoseconds": 1,
}
_INT64 = np.iinfo(np.int64)
# A CF reference date: "1979-01-01", "1979-1-1 00:00:00", "1900-01-01T00:00:00.0Z", "... +05:30".
_REFERENCE = re.compile(
    r"^(?P<year>[+-]?\d{1,5})-(?P<month>\d{1,2})-(?P<day>\d{1,2})"
    r"(?:[T ]+(?P<hour>\d{1,2})(?::(?P<minute>\d{1,2})(?::(?P<second>\d{1,2})(?:\.(?P<fraction>\d*))?)?)?)?"
    r"\s*(?P<tz>Z|UTC|GMT|[+-]\d{1,2}(?::?\d{2})?)?$",
    re.IGNORECASE,
)


class _NotNumpyTime(Exception):
    """CF time numpy cannot hold (a calendar, unit or range): the reason, for cftime or the error."""


# -- decoding ------------------------------------------------------------------------
def decode_time_coordinate(values: np.ndarray, attrs: Mapping[str, Any], *, name: str = "") -> np.ndarray | None:
    """``values`` as dates when they are a time coordinate, else ``None``.

    Native ``datetime64`` arrays pass through. CF numeric time decodes as
    ``xarray.open_zarr`` decodes it: ``datetime64[ns]`` in the standard
    calendars, ``cftime`` objects in the others (and for standard-calendar
    dates numpy cannot hold). Missing values (NaN, ``_FillValue``,
    ``missing_value``, the int64 NaT pattern) become NaT (``None`` in a
    ``cftime`` array).

    Raises
    ------
    CalendarError
        The coordinate needs ``cftime`` and it is not installed, or its units
        are not CF time units; the message names the array (``name``), its
        units and calendar.
    """
    if values.dtype.kind == "M":
        return values
    units = attrs.get("units")
    if not isinstance(units, str) or " since " not in units or values.dtype.kind not in "iuf":
        return None
    calendar = str(attrs.get("calendar", DEFAULT_CALENDAR)).strip().lower()
    missing = _missing(values, attrs)
    where = f"time coordinate {name!r} (units {units!r}, calendar {calendar!r})"
    reason = f"the {calendar!r} calendar has dates numpy's datetime64 cannot represent"
    if calendar in STANDARD_CALENDARS:
        try:
            return _decode_numpy(values, missing, units, calendar)
        except _NotNumpyTime as exc:
            reason = str(exc)
    cftime = import_cftime()
    if cftime is None:
        raise CalendarError(
            f"{where} cannot be decoded without cftime: {reason}. Install it (pip install cftime) "
            "and dates in this calendar decode to cftime objects, as xarray decodes them"
        )
    return _decode_cftime(cftime, values, missing, units, calendar, calendar in STANDARD_CALENDARS, where)


def _fill_value(raw: Any, dtype: np.dtype) -> Any:
    """A ``_FillValue``/``missing_value`` attribute as a number (xarray writes zarr v3 floats base64-encoded)."""
    if isinstance(raw, str):
        try:
            data = base64.b64decode(raw, validate=True)
        except ValueError:
            return None
        return np.frombuffer(data, dtype=dtype)[0] if len(data) == dtype.itemsize else None
    if isinstance(raw, (int, float, np.number)) and not isinstance(raw, bool):
        return raw
    return None


def _missing(values: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """Where ``values`` hold no date: NaN, the int64 NaT pattern, a declared fill or missing value."""
    if values.dtype.kind == "f":
        missing = np.isnan(values)
    elif values.dtype == np.int64:
        missing = values == _INT64.min
    else:
        missing = np.zeros(values.shape, dtype=bool)
    for key in ("_FillValue", "missing_value"):
        fill = _fill_value(attrs.get(key), values.dtype)
        if fill is not None and not (isinstance(fill, float | np.floating) and math.isnan(fill)):
            missing |= values == fill
    return missing


def _split_units(units: str) -> tuple[str, str]:
    match = re.match(r"(.+) since (.+)", units)
    if match is None:
        raise _NotNumpyTime(f"units {units!r} are not '<unit> since <date>'")
    unit, reference = (s.strip() for s in match.groups())
    unit = unit.lower()
    return (unit if unit.endswith("s") else f"{unit}s"), reference


def _reference_ns(text: str) -> int:
    """A CF reference date as nanoseconds since 1970 (UTC when it carries an offset)."""
    m = _REFERENCE.match(text.strip())
    if m is None:
        raise _NotNumpyTime(f"reference date {text!r} is not an ISO date numpy can read")
    parts = [int(m[f] or (1 if f in ("month", "day") else 0)) for f in FIELDS]
    fraction = (m["fraction"] or "").ljust(9, "0")[:9]
    try:
        ns = int(components_to_numpy(parts).astype(np.int64)) + int(fraction)
    except (ValueError, OverflowError) as exc:
        raise _NotNumpyTime(f"reference date {text!r} is outside what datetime64[ns] holds") from exc
    tz = (m["tz"] or "").upper()
    if tz and tz not in ("Z", "UTC", "GMT"):
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        hours, minutes = (int(digits), 0) if len(digits) <= 2 else (int(digits[:-2]), int(digits[-2:]))
        ns -= sign * (hours * 60 + minutes) * 60 * 10**9
    return ns


def _decode_numpy(values: np.ndarray, missing: np.ndarray, units: str, calendar: str) -> np.ndarray:
    """Standard-calendar CF time to ``datetime64[ns]``, with xarray's arithmetic (floats truncate to ns)."""
    unit, reference = _split_units(units)
    if unit not in NS_PER_UNIT:
        raise _NotNumpyTime(f"unit {unit!r} is not one of {list(NS_PER_UNIT)}")
    # standard/gregorian are Julian before the 1582 reform and proleptic_gregorian after it: they
    # differ only before 1677, which datetime64[ns] does not reach (cftime decodes those dates)
    ref = _reference_ns(reference)
    per = NS_PER_UNIT[unit]
    present = values[~missing]
    if present.size:
        lo, hi = float(present.min()) * per + ref, float(present.max()) * per + ref
        # a margin of one unit in 2**53 keeps float rounding on the safe side of the int64 limits
        if not (_INT64.min < lo and hi < _INT64.max * (1 - 2.0**-52)):
            raise _NotNumpyTime("dates fall outside what datetime64[ns] holds (years 1678-2261)")
    with np.errstate(invalid="ignore"):
        if values.dtype.kind == "f":
            ticks = (values.astype(np.float64) * np.int64(per)).astype(np.int64)
        else:
            ticks = values.astype(np.int64) * np.int64(per)
    ticks = ticks + np.int64(ref)
    ticks[missing] = _INT64.min
    return ticks.view(NS)


def _decode_cftime(
    cftime: Any, values: np.ndarray, missing: np.ndarray, units: str, calendar: str, standard: bool, where: str
) -> np.ndarray:
    numbers = np.where(missing, 0, values).astype(np.float64)
    try:
        dates = np.asarray(cftime.num2date(numbers, units, calendar, only_use_cftime_datetimes=True), dtype=object)
    except (ValueError, TypeError, OverflowError) as exc:
        raise CalendarError(f"{where} cannot be decoded: {exc}") from exc
    dates[missing] = None
    if standard:  # in range for datetime64 after all (xarray converts these back)
        try:
            return _cftime_to_numpy(dates, missing)
        except (ValueError, OverflowError):
            pass
    return dates


def _cftime_to_numpy(dates: np.ndarray, missing: np.ndarray) -> np.ndarray:
    out = np.full(dates.shape, np.datetime64("NaT", "ns"), dtype=NS)
    for i, d in enumerate(dates):
        if not missing[i]:
            out[i] = components_to_numpy((d.year, d.month, d.day, d.hour, d.minute, d.second), d.microsecond * 1000)
    return out


# -- encoding ------------------------------------------------------------------------
def encode_time_coordinate(values: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """Dates as CF integers and their attributes, as ``xarray.Dataset.to_zarr`` writes them.

    The unit is the coarsest of days, hours, minutes, seconds, milliseconds,
    microseconds and nanoseconds that divides every step; the reference date
    is the first date. ``datetime64`` gets the ``proleptic_gregorian``
    calendar; ``cftime`` dates keep theirs (encoded with ``cftime``).

    Raises
    ------
    ValueError
        ``values`` are not dates, hold a missing date, or are empty.
    """
    values = np.asarray(values)
    axis = TimeAxis.of(values) if values.size else None
    if axis is None:
        raise ValueError(f"expected a non-empty array of dates (datetime64 or cftime), got dtype {values.dtype}")
    if axis.is_cftime:
        return _encode_cftime(values, axis)
    ns = values.astype(NS)
    if np.isnat(ns).any():
        raise ValueError("a coordinate may not hold NaT: every index needs its date")
    ticks = ns.astype(np.int64)
    steps = np.unique(np.diff(ticks) if ticks.size > 1 else np.zeros(0, np.int64))
    unit = next(u for u, per in NS_PER_UNIT.items() if not (steps % per).any())
    reference = int(ticks[0])
    encoded = (ticks - reference) // NS_PER_UNIT[unit]
    return encoded, {"units": f"{unit} since {_reference_text(reference)}", "calendar": "proleptic_gregorian"}


def _reference_text(ns: int) -> str:
    """A reference instant as pandas prints a timestamp ("1979-01-01 00:00:00", fractions only when present)."""
    day, clock = divmod(ns, 86_400 * 10**9)
    date = np.datetime64(day, "D")
    seconds, fraction = divmod(clock, 10**9)
    text = f"{date} {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if fraction:
        text += f".{fraction:09d}".rstrip("0") if fraction % 1000 else f".{fraction // 1000:06d}"
    return text


def _encode_cftime(values: np.ndarray, axis: TimeAxis) -> tuple[np.ndarray, dict[str, str]]:
    cftime = import_cftime()
    if cftime is None:  # pragma: no cover - cftime dates exist only where cftime is installed
        raise CalendarError("encoding cftime dates needs cftime")
    if any(v is None for v in values):
        raise ValueError("a coordinate may not hold a missing date: every index needs its date")
    micro = {"days": 86_400 * 10**6, "hours": 3_600 * 10**6, "minutes": 60 * 10**6, "seconds": 10**6}
    micro.update({"milliseconds": 10**3, "microseconds": 1})
    steps = {(b - a) // _dt.timedelta(microseconds=1) for a, b in zip(values[:-1], values[1:])}
    unit = next(u for u, per in micro.items() if all(s % per == 0 for s in steps))
    first = values[0]
    reference = (
        f"{first.year:04d}-{first.month:02d}-{first.day:02d} "
        f"{first.hour:02d}:{first.minute:02d}:{first.second:02d}.{first.microsecond:06d}"
    )
    units = f"{unit} since {reference}"
    encoded = np.asarray(cftime.date2num(list(values), units, axis.calendar), dtype=np.float64)
    return np.rint(encoded).astype(np.int64), {"units": units, "calendar": str(axis.calendar)}
