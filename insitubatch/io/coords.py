"""Coordinate arrays: the 1-D array that labels each named dimension, read from the store once.

An xarray/CF group stores beside each data variable one 1-D array per
dimension, named after it (``time``, ``latitude``, ``level``...). A
``CoordinateSource`` finds the one a variable's dimension refers to (next to
the variable, then in each parent group up to the root, as xarray resolves
them), reads it whole on first use and keeps it: coordinates are tiny next to
the data, and selections, splits and batch coordinates all consult them.
Time coordinates are decoded to ``datetime64`` (``io.times``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr
import zarr.errors

from ..errors import StoreReadError
from .dates import is_time
from .times import decode_time_coordinate

__all__ = ["Coordinate", "CoordinateSource", "parent_groups"]

# What zarr raises when a path is not an array (missing, a group, unreadable metadata).
_NOT_AN_ARRAY = (FileNotFoundError, KeyError, ValueError, TypeError, zarr.errors.NodeTypeValidationError)


def parent_groups(path: str) -> list[str]:
    """The groups a coordinate of array ``path`` may live in, nearest first (``""`` is the root)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[:k]) for k in range(len(parts), -1, -1)]


@dataclass(frozen=True)
class Coordinate:
    """One dimension's coordinate: the stored values, their attributes and their decoded form.

    ``values`` are decoded (``datetime64`` for a time coordinate, else as
    stored); ``raw`` is what the store holds.
    """

    dim: str
    path: str
    raw: np.ndarray
    attrs: Mapping[str, Any]
    values: np.ndarray

    @property
    def is_time(self) -> bool:
        """Whether the values are dates (``datetime64``, or ``cftime`` objects in another calendar)."""
        return is_time(self.values)


@dataclass(eq=False)
class CoordinateSource:
    """Finds and reads the coordinate arrays of one store, each at most once.

    ``opened`` holds arrays whose metadata is already in hand (from a
    listing or consolidated metadata), by store path: reading a coordinate
    among them costs one round trip (its data), not two. One whose shape
    disagrees (consolidated metadata older than the array) is opened afresh.
    """

    store: Any
    opened: Mapping[str, zarr.Array] = field(default_factory=dict)
    _found: dict[tuple[str, str, int], Coordinate | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def coordinate(self, dim: str, length: int, near: str) -> Coordinate | None:
        """The coordinate of dimension ``dim`` (``length`` long) for the array at ``near``, else ``None``.

        Looks for a 1-D array named ``dim`` of that length beside ``near``,
        then in each parent group. The result (found or not) is kept.

        Raises
        ------
        StoreReadError
            The store failed while reading a coordinate it holds.
        """
        for group in parent_groups(near):
            path = f"{group}/{dim}" if group else dim
            key = (path, dim, int(length))
            with self._lock:
                if key in self._found:
                    found = self._found[key]
                    if found is not None:
                        return found
                    continue
            found = self._read(path, dim, int(length))
            with self._lock:
                self._found[key] = found
            if found is not None:
                return found
        return None

    def _read(self, path: str, dim: str, length: int) -> Coordinate | None:
        arr = self.opened.get(path)
        if arr is None or arr.shape != (length,):
            try:
                arr = zarr.open_array(store=self.store, path=path, mode="r")
            except _NOT_AN_ARRAY:
                return None
        if arr.ndim != 1 or arr.shape[0] != length:
            return None
        try:
            raw = np.asarray(arr[...])
        except Exception as exc:  # any backend's failure, named for the user
            raise StoreReadError(f"reading coordinate array {path!r} failed: {type(exc).__name__}: {exc}") from exc
        attrs = dict(arr.attrs)
        decoded = decode_time_coordinate(raw, attrs, name=path)
        return Coordinate(dim, path, raw, attrs, raw if decoded is None else decoded)
