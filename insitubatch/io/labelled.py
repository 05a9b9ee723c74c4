"""A labelled array view: dimension names, coordinates and selections, shared by variables and statics.

``ArrayGeometry`` (a variable, sampled along one axis) and ``StaticField``
(an array read whole once) are both ``Labelled``: a path, a shape, dimension
names, the store's coordinate arrays and a selection per axis, with the same
``isel`` / ``sel`` / ``coord`` behind both. The rules of a selection live in
``io.selection``; this class names the axes and keeps the result.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Self, cast

import numpy as np

from .coords import Coordinate, CoordinateSource
from .selection import AxisSelection, SelectMethod, isel_axis, sel_positions

__all__ = ["Labelled"]


class Labelled:
    """Dimension names, coordinates and selections of a frozen array-view dataclass.

    Subclasses are frozen dataclasses with the fields below; ``sample_axis``
    names the one axis selections may not touch (None: every axis is a field).
    """

    path: str
    shape: tuple[int, ...]
    dimension_names: tuple[str | None, ...] | None
    coords: CoordinateSource | None
    selection: tuple[AxisSelection, ...]
    sample_axis: int | None
    origin: str | None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @functools.cached_property
    def _chosen(self) -> dict[int, AxisSelection]:
        return {a.axis: a for a in self.selection}

    # -- dimensions and coordinates ---------------------------------------------
    @property
    def dims(self) -> tuple[str | None, ...] | None:
        """Dimension names in physical order (v3 ``dimension_names`` or xarray's ``_ARRAY_DIMENSIONS``), or None."""
        return self.dimension_names

    def _dim_index(self, dim: str) -> int:
        dims = self.dimension_names
        if not dims or any(d is None for d in dims):
            raise ValueError(
                f"array {self.path!r} has no dimension names (neither zarr v3 dimension_names nor xarray's "
                f"_ARRAY_DIMENSIONS), so dimension {dim!r} cannot be found; select by position with isel"
            )
        if dim not in dims:
            raise KeyError(f"array {self.path!r} has no dimension {dim!r}; its dimensions are {list(dims)}")
        return dims.index(dim)

    def _coordinate(self, dim: str) -> Coordinate | None:
        """The store's coordinate array of dimension ``dim`` (read once), or None when it has none."""
        axis = self._dim_index(dim)
        if self.coords is None:
            return None
        return self.coords.coordinate(dim, self.shape[axis], self.path)

    def coord(self, dim: str) -> np.ndarray:
        """The values labelling dimension ``dim`` in this view: its coordinate array, decoded (time as ``datetime64``).

        A selected dimension gives the selected values (a 0-d array after a scalar selection).

        Raises
        ------
        KeyError
            The array has no such dimension, or the store no coordinate array for it.
        """
        values = self.coord_or_none(dim)
        if values is None:
            raise KeyError(
                f"array {self.path!r}: dimension {dim!r} has no coordinate array in the store "
                f"(looked for a 1-D array {dim!r} of length {self.shape[self._dim_index(dim)]} next to it "
                "and in its parent groups)"
            )
        return values

    def coord_or_none(self, dim: str) -> np.ndarray | None:
        """Like :meth:`coord`, but None when the store has no coordinate array for ``dim``.

        Raises
        ------
        KeyError
            The array has no such dimension.
        ValueError
            The array has no dimension names.
        """
        found = self._coordinate(dim)
        if found is None:
            return None
        picked = self._chosen.get(self._dim_index(dim))
        if picked is None:
            return found.values
        return found.values[picked.indices[0]] if picked.drop else found.values[picked.array]

    def inner_coords(self) -> dict[str, np.ndarray]:
        """The coordinate values of each named field dimension of this view that the store labels."""
        out = {}
        for k, name in enumerate(self.dimension_names or ()):
            if k != self.sample_axis and name is not None and self._coordinate(name) is not None:
                out[name] = self.coord(name)
        return out

    # -- selections ----------------------------------------------------------------
    @property
    def source(self) -> str:
        """What this view reads: the array path, plus its selection (``t[level=3, lat=0:90]``).

        Views with one source share their reads and pool entries; the disk cache keys chunks by it.
        """
        if self.origin is not None:
            return self.origin
        if not self.selection:
            return self.path
        return f"{self.path}[{', '.join(f'{a.name}={a.text()}' for a in self.selection)}]"

    def _field_axis(self, dim: str | int, verb: str) -> int:
        """The physical axis ``dim`` names (a name, or a physical axis number), never the sample axis."""
        if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
            axis = int(dim)
            if not -self.ndim <= axis < self.ndim:
                raise ValueError(f"array {self.path!r}: axis {axis} is out of range for its {self.ndim} dims")
            axis %= self.ndim
        else:
            axis = self._dim_index(str(dim))
        if axis == self.sample_axis:
            name = self.dimension_names[axis] if self.dimension_names else f"axis {axis}"
            raise ValueError(
                f"array {self.path!r}: {name!r} is the sample axis, which {verb} cannot select; choose samples "
                "with split_by_chunk/split_by_time (training) or ds.infer(...) (a range)"
            )
        return axis

    def _indexers(self, indexers: Mapping[Any, Any] | None, kwargs: Mapping[str, Any], verb: str) -> dict[Any, Any]:
        merged: dict[Any, Any] = dict(indexers or {})
        for k, v in kwargs.items():
            if k in merged:
                raise ValueError(f"{verb}: dimension {k!r} is given twice")
            merged[k] = v
        if not merged:
            raise ValueError(f"{verb}() of array {self.path!r} needs at least one dimension to select")
        return merged

    def _with(self, picked: AxisSelection) -> Self:
        chosen = {**self._chosen, picked.axis: picked}
        view: Self = dataclasses.replace(cast(Any, self), selection=tuple(chosen[a] for a in sorted(chosen)))
        return view

    def isel(self, indexers: Mapping[Any, Any] | None = None, **kwargs: Any) -> Self:
        """A view keeping positions of field dimensions: ``isel(level=[0, 3], lat=slice(None, None, -1))``.

        Each value is an int (the axis is dropped), a slice (a negative step
        reverses) or a list of ints (kept in that order); positions count
        within what an earlier selection kept. ``indexers`` may key by
        physical axis number, for arrays without dimension names.

        Raises
        ------
        KeyError
            An unknown dimension.
        ValueError
            The sample axis, a position out of range, or an empty selection.
        """
        g = self
        for dim, key in self._indexers(indexers, kwargs, "isel").items():
            axis = g._field_axis(dim, "isel")
            name = g.dimension_names[axis] if g.dimension_names else None
            g = g._with(
                isel_axis(g.shape[axis], g._chosen.get(axis), key, axis=axis, dim=name, where=f"array {g.path!r}")
            )
        return g

    def sel(
        self,
        indexers: Mapping[str, Any] | None = None,
        *,
        method: SelectMethod = None,
        tolerance: Any = None,
        **kwargs: Any,
    ) -> Self:
        """A view keeping labels of field dimensions, resolved against the store's coordinates (as xarray's ``sel``).

        A label drops the axis, a list keeps it in the given order, a slice
        follows the coordinate's own order (``slice(60, 30)`` on a descending
        latitude) and wraps across the seam of a periodic axis
        (``slice(350, 20)`` on a 0..360 longitude). ``method="nearest"``
        takes the closest label, within ``tolerance`` when given.

        Raises
        ------
        KeyError
            An unknown dimension, a label not in the coordinate (naming the
            nearest ones) or beyond ``tolerance``, or a dimension without a
            coordinate array.
        ValueError
            The sample axis, no dimension names (select by position with
            ``isel``), a slice over a non-monotonic coordinate, or an empty selection.
        """
        g = self
        for dim, key in self._indexers(indexers, kwargs, "sel").items():
            axis = g._field_axis(str(dim), "sel")
            values = g.coord(str(dim))
            if values.ndim == 0:
                raise ValueError(
                    f"array {g.path!r}, dimension {dim!r}: was already selected by a scalar; it has no axis left"
                )
            where = f"array {g.path!r}"
            positions = sel_positions(values, key, method=method, tolerance=tolerance, where=where, dim=str(dim))
            g = g._with(isel_axis(g.shape[axis], g._chosen.get(axis), positions, axis=axis, dim=str(dim), where=where))
        return g
