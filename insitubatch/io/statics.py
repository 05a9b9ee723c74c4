"""Static fields: arrays without the sample axis (a land-sea mask, orography), read once per dataset.

A ``StaticField`` is a labelled view like a variable's geometry (``isel`` /
``sel`` / ``coord`` behave the same), but it has no sample axis: the dataset
reads its selected block once when it opens, through zarr itself (only the
chunks the selection touches), and hands the same read-only array to every
batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import zarr

from .._zarr_compat import ArrayV2Metadata, ArrayV3Metadata
from ..errors import StoreReadError
from .coords import CoordinateSource
from .labelled import Labelled
from .selection import AxisSelection

__all__ = ["StaticField", "read_static", "read_statics", "static_of"]


@dataclass(frozen=True)
class StaticField(Labelled):
    """An array read whole (or its selected block) once per dataset; ``value_shape`` is what batches carry.

    Made by ``open_statics``; select with ``isel`` / ``sel`` as a variable's geometry.
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    dimension_names: tuple[str | None, ...] | None = None
    selection: tuple[AxisSelection, ...] = ()
    metadata: ArrayV2Metadata | ArrayV3Metadata | None = field(default=None, compare=False, repr=False, hash=False)
    coords: CoordinateSource | None = field(default=None, compare=False, repr=False, hash=False)
    sample_axis: None = field(default=None, init=False, repr=False)
    origin: None = field(default=None, init=False, repr=False, compare=False)

    @property
    def value_shape(self) -> tuple[int, ...]:
        """The shape of the array a batch carries: the selection applied (a scalar drops its axis)."""
        chosen = self._chosen
        return tuple(
            s if k not in chosen else chosen[k].size
            for k, s in enumerate(self.shape)
            if not (k in chosen and chosen[k].drop)
        )

    @property
    def nbytes(self) -> int:
        return math.prod(self.value_shape) * self.dtype.itemsize


def static_of(arr: zarr.Array, coords: CoordinateSource | None = None) -> StaticField:
    """The ``StaticField`` of an open zarr array."""
    from .arrays import dimension_names_of

    return StaticField(
        path=arr.path,
        shape=tuple(int(s) for s in arr.shape),
        dtype=np.dtype(arr.dtype),
        dimension_names=dimension_names_of(arr),
        metadata=arr.metadata,
        coords=coords if coords is not None else CoordinateSource(arr.store),
    )


def _orthogonal_index(static: StaticField) -> tuple[Any, ...]:
    """zarr's orthogonal index of a static's selection: per axis an int, a list of positions or everything."""
    chosen = {a.axis: a for a in static.selection}
    out: list[Any] = []
    for k in range(static.ndim):
        picked = chosen.get(k)
        if picked is None:
            out.append(slice(None))
        elif picked.drop:
            out.append(picked.indices[0])
        else:
            out.append(picked.array)
    return tuple(out)


def read_static(store: Any, static: StaticField) -> np.ndarray:
    """Read ``static``'s selected block from ``store`` (only the chunks it touches), as a new C-contiguous array.

    Raises
    ------
    StoreReadError
        The store failed, naming the array.
    """
    try:
        arr = zarr.open_array(store=store, path=static.path, mode="r")
        if arr.ndim == 0:
            values = np.asarray(arr[()])
        elif static.selection:
            values = np.asarray(arr.oindex[_orthogonal_index(static)])
        else:
            values = np.asarray(arr[...])
    except Exception as exc:  # any backend's failure, named for the user
        raise StoreReadError(f"reading static array {static.path!r} failed: {type(exc).__name__}: {exc}") from exc
    return np.ascontiguousarray(values, dtype=static.dtype).reshape(static.value_shape)


def read_statics(store: Any, statics: Mapping[str, StaticField]) -> Mapping[str, np.ndarray]:
    """Each static's selected values by label, read once (only the chunks it touches), as read-only arrays."""
    values = {}
    for label, f in statics.items():
        arr = read_static(store, f)
        arr.setflags(write=False)
        values[label] = arr
    return MappingProxyType(values)
