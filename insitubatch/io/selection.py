"""Selections on an array's field axes: which positions of each axis a view keeps, and in what order.

``ArrayGeometry.isel`` / ``sel`` (and the static fields' equivalents) turn
what a user writes into one ``AxisSelection`` per selected axis: the source
positions, in output order, and whether a scalar dropped the axis. The rules
are xarray's: a scalar drops the axis, a list keeps it in the given order, a
positional slice follows Python (a negative step reverses), a label slice
follows the coordinate's own order (``slice(60, 30)`` on a descending
latitude), and ``method="nearest"`` picks the closest label within
``tolerance``. One extension: a label slice whose start is past its stop on
a periodic axis (a longitude spanning 360 degrees) wraps across the seam,
``slice(350, 20)`` being 350..359.75 followed by 0..20.

Everything here is O(axis length) numpy on the coordinate, once per view.
"""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["AxisSelection", "SelectMethod", "isel_axis", "sel_positions"]

SelectMethod = Literal["nearest"] | None
# A coordinate whose ascending values (plus one spacing) span this many degrees, to within
# PERIOD_TOLERANCE of it, wraps around: a longitude.
PERIOD_DEGREES = 360.0
PERIOD_TOLERANCE = 1e-6
# How many labels an error message offers as the nearest valid ones.
NEAREST_SHOWN = 3


@dataclass(frozen=True)
class AxisSelection:
    """The positions a view keeps along one physical axis, in output order.

    ``drop`` marks a scalar selection: one position, and the axis leaves the view.
    """

    axis: int
    dim: str | None
    indices: tuple[int, ...]
    drop: bool = False

    @functools.cached_property
    def array(self) -> np.ndarray:
        return np.asarray(self.indices, dtype=np.intp)

    @property
    def size(self) -> int:
        return len(self.indices)

    @property
    def name(self) -> str:
        return self.dim if self.dim is not None else f"axis{self.axis}"

    def text(self) -> str:
        """Compact and canonical: ``3``, ``10:20``, ``::-1`` style runs joined by ``,``."""
        if self.drop:
            return str(self.indices[0])
        return ",".join(_run_text(start, count, step) for start, count, step in _runs(self.array))


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """``idx`` as maximal arithmetic runs ``(start, count, step)``."""
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(idx)
    while i < n:
        if i + 1 == n:
            runs.append((int(idx[i]), 1, 1))
            break
        step = int(idx[i + 1] - idx[i])
        j = i + 1
        while j + 1 < n and int(idx[j + 1] - idx[j]) == step and step != 0:
            j += 1
        runs.append((int(idx[i]), j - i + 1, step if step != 0 else 1))
        i = j + 1
    return runs


def _run_text(start: int, count: int, step: int) -> str:
    if count == 1:
        return str(start)
    stop = start + step * count
    if step == 1:
        return f"{start}:{stop}"
    return f"{start}:{stop if stop >= 0 else ''}:{step}"


def _fail(exc_type: type[Exception], where: str, dim: str, message: str) -> Exception:
    return exc_type(f"{where}, dimension {dim!r}: {message}")


def isel_axis(
    length: int, current: AxisSelection | None, key: Any, *, axis: int, dim: str | None, where: str
) -> AxisSelection:
    """Compose ``key`` (int, slice or list of ints) with the current selection of an axis of ``length``.

    Positions in ``key`` count within what ``current`` already keeps.

    Raises
    ------
    ValueError
        The axis was already dropped by a scalar, a position is out of range,
        or the selection is empty.
    TypeError
        ``key`` is none of int, slice, list of ints.
    """
    name = dim if dim is not None else f"axis{axis}"
    if current is not None and current.drop:
        raise _fail(
            ValueError, where, name, f"was already selected by the scalar {current.indices[0]}; it has no axis left"
        )
    base = current.array if current is not None else np.arange(length, dtype=np.intp)
    n = len(base)
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"{where}: isel({name}=...) takes an int, a slice or a list of ints, got {key!r}")
    if isinstance(key, (int, np.integer)):
        k = int(key)
        if not -n <= k < n:
            raise _fail(ValueError, where, name, f"position {k} is out of range for its {n} positions")
        return AxisSelection(axis, dim, (int(base[k]),), drop=True)
    if isinstance(key, slice):
        for part in (key.start, key.stop, key.step):
            if part is not None and (isinstance(part, bool) or not isinstance(part, (int, np.integer))):
                raise TypeError(
                    f"{where}: isel({name}={key!r}) slices by position, with ints; use sel() to slice by label"
                )
        if key.step == 0:
            raise _fail(ValueError, where, name, "a slice step cannot be zero")
        picked = base[key]
    else:
        try:
            positions = np.asarray(key)
        except Exception as exc:
            raise TypeError(f"{where}: isel({name}=...) takes an int, a slice or a list of ints, got {key!r}") from exc
        if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
            raise TypeError(f"{where}: isel({name}=...) takes an int, a slice or a 1-D list of ints, got {key!r}")
        positions = positions.astype(np.intp)
        bad = (positions < -n) | (positions >= n)
        if bad.any():
            raise _fail(
                ValueError, where, name, f"position {int(positions[bad][0])} is out of range for its {n} positions"
            )
        picked = base[positions]
    if picked.size == 0:
        raise _fail(ValueError, where, name, f"the selection {key!r} is empty; an empty batch axis is never served")
    return AxisSelection(axis, dim, tuple(int(i) for i in picked), drop=False)


# -- labels --------------------------------------------------------------------------------
def _as_label(value: Any, values: np.ndarray, where: str, dim: str) -> Any:
    """``value`` in the coordinate's terms (a date-like becomes ``datetime64`` on a time coordinate)."""
    if values.dtype.kind == "M":
        if isinstance(value, (str, datetime.date, np.datetime64)):
            try:
                return np.datetime64(value).astype(values.dtype)
            except ValueError as exc:
                raise _fail(KeyError, where, dim, f"{value!r} is not a date") from exc
        raise _fail(TypeError, where, dim, f"a time coordinate is selected with dates, got {value!r}")
    if values.dtype.kind in "iuf" and isinstance(value, (bool, np.bool_)):
        raise _fail(TypeError, where, dim, f"{value!r} is not a number")
    return value


def _distance(values: np.ndarray, label: Any) -> np.ndarray:
    if values.dtype.kind == "M":
        return np.abs((values - label).astype("timedelta64[ns]").astype(np.float64))
    return np.abs(values.astype(np.float64) - float(label))


def _nearest_text(values: np.ndarray, label: Any) -> str:
    try:
        order = np.argsort(_distance(values, label), kind="stable")[:NEAREST_SHOWN]
    except (TypeError, ValueError):
        order = np.arange(min(NEAREST_SHOWN, len(values)))
    return ", ".join(repr(_plain(values[i])) for i in sorted(order.tolist()))


def _plain(v: Any) -> Any:
    return (
        v.item() if isinstance(v, np.generic) and v.dtype.kind != "M" else (str(v) if isinstance(v, np.generic) else v)
    )


def _position(values: np.ndarray, label: Any, method: SelectMethod, tolerance: Any, where: str, dim: str) -> int:
    label = _as_label(label, values, where, dim)
    if method is None:
        hits = np.flatnonzero(values == label)
        if hits.size == 0:
            raise _fail(
                KeyError,
                where,
                dim,
                f"label {_plain(label)!r} is not in the coordinate; nearest labels: "
                f"{_nearest_text(values, label)} (or pass method='nearest')",
            )
        return int(hits[0])
    distance = _distance(values, label)
    k = int(np.argmin(distance))
    if tolerance is not None:
        limit = _tolerance(tolerance, values)
        if distance[k] > limit:
            raise _fail(
                KeyError,
                where,
                dim,
                f"the nearest label to {_plain(label)!r} is {_plain(values[k])!r}, beyond tolerance={tolerance!r}",
            )
    return k


def _tolerance(tolerance: Any, values: np.ndarray) -> float:
    if values.dtype.kind == "M":
        return float(np.timedelta64(tolerance).astype("timedelta64[ns]").astype(np.int64))
    return float(tolerance)


def _monotonic(values: np.ndarray) -> int:
    """+1 ascending, -1 descending, 0 neither (one value counts as ascending)."""
    if len(values) < 2:
        return 1
    diff = np.diff(values)
    if values.dtype.kind == "M":
        diff = diff.astype(np.int64)
    if (diff > 0).all():
        return 1
    if (diff < 0).all():
        return -1
    return 0


def _periodic(values: np.ndarray) -> bool:
    """Ascending numbers spanning a full circle of degrees (plus one spacing): a longitude."""
    if values.dtype.kind not in "iuf" or len(values) < 2:
        return False
    v = values.astype(np.float64)
    span = v[-1] - v[0] + float(np.median(np.diff(v)))
    return math.isclose(span, PERIOD_DEGREES, rel_tol=PERIOD_TOLERANCE, abs_tol=PERIOD_TOLERANCE)


def _label_slice(values: np.ndarray, key: slice, where: str, dim: str) -> np.ndarray:
    """Positions a label slice keeps, in the coordinate's order (wrapping on a periodic axis)."""
    order = _monotonic(values)
    if order == 0:
        raise _fail(
            ValueError,
            where,
            dim,
            f"cannot slice by label {key!r}: the coordinate is not monotonic; select positions with isel or a list of labels",
        )
    step = 1 if key.step is None else key.step
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step == 0:
        raise _fail(ValueError, where, dim, f"a label slice step must be a non-zero int, got {key.step!r}")
    n = len(values)
    if step < 0:  # the same slice over the reversed coordinate, mapped back
        rev = _label_slice(values[::-1], slice(key.start, key.stop, -step), where, dim)
        return (n - 1 - rev).astype(np.intp)
    start = None if key.start is None else _as_label(key.start, values, where, dim)
    stop = None if key.stop is None else _as_label(key.stop, values, where, dim)
    asc = values if order > 0 else values[::-1]
    if order > 0:
        lo = 0 if start is None else int(np.searchsorted(asc, start, side="left"))
        hi = n if stop is None else int(np.searchsorted(asc, stop, side="right"))
        if start is not None and stop is not None and start > stop and _periodic(values):
            return np.concatenate([np.arange(lo, n), np.arange(0, hi)]).astype(np.intp)[::step]
        picked = np.arange(lo, max(lo, hi), dtype=np.intp)
    else:  # descending: start is the upper label
        lo = 0 if start is None else n - int(np.searchsorted(asc, start, side="right"))
        hi = n if stop is None else n - int(np.searchsorted(asc, stop, side="left"))
        picked = np.arange(lo, max(lo, hi), dtype=np.intp)
    return picked[::step]


def sel_positions(
    values: np.ndarray, key: Any, *, method: SelectMethod, tolerance: Any, where: str, dim: str
) -> int | slice | list[int]:
    """Positions (within ``values``, the view's coordinate) that label ``key`` selects, for ``isel_axis``.

    Raises
    ------
    KeyError
        A label not in the coordinate (naming the nearest ones), or beyond ``tolerance``.
    ValueError
        A label slice over a non-monotonic coordinate, or one that selects nothing.
    """
    if method not in (None, "nearest"):
        raise ValueError(f"{where}: method={method!r} must be None or 'nearest'")
    if isinstance(key, slice):
        if method is not None:
            raise ValueError(f"{where}: method={method!r} cannot be used with a slice of labels")
        picked = _label_slice(values, key, where, dim)
        if picked.size == 0:
            ends = f"{_plain(values[0])!r} to {_plain(values[-1])!r}" if len(values) else "nothing"
            raise _fail(
                ValueError, where, dim, f"the label slice {key!r} selects nothing; the coordinate runs from {ends}"
            )
        return [int(p) for p in picked]
    if isinstance(key, (list, tuple, np.ndarray)) and not isinstance(key, str):
        labels: Sequence[Any] = list(np.asarray(key).tolist()) if isinstance(key, np.ndarray) else list(key)
        if not labels:
            raise _fail(ValueError, where, dim, "an empty list of labels selects nothing")
        return [_position(values, lb, method, tolerance, where, dim) for lb in labels]
    return _position(values, key, method, tolerance, where, dim)
