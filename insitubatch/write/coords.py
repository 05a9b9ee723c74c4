"""Coordinates of a write layout: stored with it, labelling slots, and addressing writes by value.

``LayoutSpec(coords={"time": valid_times})`` names the values labelling a
dimension of the output. ``create_layout`` stores each as a 1-D array named
after its dimension, encoded as xarray encodes it (dates as int64
``"<unit> since <first date>"`` with their calendar), so ``xarray.open_zarr``
of the output decodes it; the layout record names the one on the index axis.
:class:`IndexCoordinate` is that one read back: it labels slots by value
(plans and status show them) and maps ``SlotWriter.write(at=...)`` values to
indices.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..io.dates import NS, TimeAxis, format_bound, is_time
from ..io.times import decode_time_coordinate, encode_time_coordinate

__all__ = ["IndexCoordinate", "coordinate_values", "encode_coordinate", "read_index_coordinate"]


def coordinate_values(name: str, values: Any) -> np.ndarray:
    """Values a user gives for coordinate ``name`` as a 1-D array of dates (``datetime64[ns]``, ``cftime``) or numbers.

    ISO strings and ``datetime`` objects become ``datetime64[ns]``.

    Raises
    ------
    ValueError
        Not 1-D, or neither dates nor numbers.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"coords[{name!r}] must be 1-D, got shape {arr.shape}")
    if is_time(arr) and arr.dtype == object:
        return arr  # cftime dates keep their calendar
    if arr.dtype.kind in "MUSO":
        try:
            return arr.astype(NS)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"coords[{name!r}] must hold dates or numbers: {exc}") from exc
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"coords[{name!r}] must hold dates or numbers, got dtype {arr.dtype}")
    return arr


def encode_coordinate(values: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """What the store holds for coordinate ``values``: dates CF-encoded with their attributes, numbers as they are."""
    if is_time(values):
        return encode_time_coordinate(values)
    return values, {}


def _show(value: Any) -> str:
    """A value a user passed, as an error message names it."""
    text = format_bound(value) if isinstance(value, np.datetime64 | str) or hasattr(value, "isoformat") else None
    return repr(text) if text is not None else repr(value.item() if isinstance(value, np.generic) else value)


@dataclass(frozen=True, eq=False)
class IndexCoordinate:
    """The index axis's coordinate of a write layout: its name and its values (decoded, one per index)."""

    name: str
    values: np.ndarray

    @functools.cached_property
    def axis(self) -> TimeAxis | None:
        """The dates' axis, or ``None`` for a numeric coordinate."""
        return TimeAxis.of(self.values) if is_time(self.values) else None

    def label(self, index: int) -> str:
        """The coordinate at ``index``, as text (a short ISO date for dates)."""
        value = self.values[index]
        return self.axis.format(value) if self.axis is not None else str(value.item())

    def span(self, start: int, stop: int) -> tuple[str | None, str | None]:
        """The labels of the first and last index of ``[start, stop)`` (``None`` when it is empty)."""
        if stop <= start:
            return None, None
        return self.label(start), self.label(stop - 1)

    def describe(self, start: int, stop: int) -> str:
        """``[start, stop)`` with the coordinate of its first and last index."""
        first, last = self.span(start, stop)
        return f"[{start}, {stop})" + ("" if first is None else f" ({self.name} {first} .. {last})")

    @functools.cached_property
    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        comparable = self.axis.values(self.values) if self.axis is not None else self.values
        order = np.argsort(comparable, kind="stable")
        return order, comparable[order]

    def _key(self, value: Any) -> Any:
        if self.axis is not None:
            return self.axis.instant(value)
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
            raise TypeError(f"{_show(value)} is not a number, and coordinate {self.name!r} holds numbers")
        return value

    def locate(self, at: Any) -> tuple[list[Any], np.ndarray]:
        """The values of ``at`` (one value or a 1-D sequence) and the index of each, ``-1`` where absent.

        Raises
        ------
        TypeError
            A value of the wrong kind (a number for dates, a date for numbers).
        ValueError
            ``at`` is not 1-D, or a string is no date of the coordinate's calendar.
        """
        given = np.asarray(at) if not isinstance(at, list | tuple) else np.asarray(at, dtype=object)
        if given.ndim > 1:
            raise ValueError(f"at= must be one value or a 1-D sequence of values, got shape {given.shape}")
        items = list(given.reshape(-1))
        if not items or not len(self.values):
            return items, np.full(len(items), -1, dtype=np.int64)
        if self.axis is not None and not self.axis.is_cftime and given.dtype.kind == "M":
            keys = given.reshape(-1).astype(NS)
        else:
            keys = np.array([self._key(v) for v in items], dtype=object if self.axis and self.axis.is_cftime else None)
        order, ordered = self._sorted
        pos = np.clip(np.searchsorted(ordered, keys), 0, len(ordered) - 1)
        found = np.asarray(ordered[pos] == keys, dtype=bool)
        return items, np.where(found, order[pos], -1).astype(np.int64)

    def show(self, value: Any) -> str:
        """A value a user passed, as messages name it."""
        return _show(value)


def read_index_coordinate(array: zarr.Array) -> IndexCoordinate:
    """The index coordinate stored in ``array`` (a 1-D array named after its dimension), decoded."""
    raw = np.asarray(array[...])
    decoded = decode_time_coordinate(raw, dict(array.attrs), name=array.path)
    return IndexCoordinate(array.path.rsplit("/", 1)[-1], raw if decoded is None else decoded)
