"""Time steps that hold nothing but the fill value: found by an opt-in scan that reports, never drops.

An archive's outage often leaves no hole in its time axis but a step whose
chunks were never written: zarr reads a missing chunk as the fill value, so
the step looks like data. :func:`scan_fill_steps` reads an array one stored
chunk along the sample axis at a time and lists the steps whose every value
is the fill value (NaN counts as a NaN fill; a v2 array without one reads
zeros there). It drops nothing: pass what it
finds to ``missing=`` of ``split_by_time``/``split_by_chunk`` to leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..stores.obstore_stores import as_store
from ..validation import Anything, Instance, Table, validate_params
from .geometry import ArrayGeometry
from .time_offsets import StepAxis, exact_text

__all__ = ["FillSteps", "scan_fill_steps"]


@dataclass(frozen=True)
class FillSteps:
    """What :func:`scan_fill_steps` found: the steps of ``path`` that are all fill value.

    ``indices`` are sample-axis indices; ``times`` their dates (ISO, each
    naming its one instant) when the sample axis has a time coordinate, else
    empty; ``scanned`` the steps read.
    """

    path: str
    fill_value: Any
    indices: tuple[int, ...]
    times: tuple[str, ...]
    scanned: int

    @property
    def missing(self) -> list[str]:
        """The steps' dates, as ``missing=`` takes them (empty without a time coordinate: see ``indices``)."""
        return list(self.times)

    def __str__(self) -> str:
        if not self.indices:
            return f"{self.path!r}: none of {self.scanned} steps is all fill value ({self.fill_value!r})"
        shown = ", ".join((self.times or tuple(str(i) for i in self.indices))[:10]) + (
            f" and {len(self.indices) - 10} more" if len(self.indices) > 10 else ""
        )
        return (
            f"{self.path!r}: {len(self.indices)} of {self.scanned} steps hold only the fill value "
            f"({self.fill_value!r}): {shown}; pass missing=[...] to a splitter to leave them out"
        )


def _all_fill(rows: np.ndarray, fill: Any) -> np.ndarray:
    """``(rows,)``: whether each row (sample axis first) holds nothing but ``fill``."""
    flat = rows.reshape(len(rows), -1)
    if fill is not None and isinstance(fill, float | np.floating) and np.isnan(fill):
        return np.asarray(np.isnan(flat).all(axis=1))
    return np.asarray((flat == fill).all(axis=1))


# What ``scan_fill_steps`` accepts (``validation``)
SCAN_PARAMETERS: Table = {
    "store": [Anything("as_store: a zarr Store, or a URL/path to open")],
    "geometry": [Instance(ArrayGeometry, "an ArrayGeometry")],
    "sample_range": [Anything("a (start, stop) pair inside the array, or None for all of it")],
}


@validate_params(SCAN_PARAMETERS)
def scan_fill_steps(store: Any, geometry: ArrayGeometry, *, sample_range: tuple[int, int] | None = None) -> FillSteps:
    """Read ``geometry``'s array (whole field) and report the sample-axis steps that are all fill value.

    Parameters
    ----------
    store
        The store the geometry was opened from (a zarr ``Store``, URL or path).
    geometry
        The array, from ``open_geometries``; its selection is ignored (a step
        is empty when all of it is).
    sample_range
        ``(start, stop)`` indices to scan; default the whole axis. Reads one
        stored chunk along the sample axis at a time.

    Raises
    ------
    ValueError
        A ``sample_range`` outside the array.
    """
    n, axis = geometry.n_samples, geometry.sample_axis
    start, stop = (0, n) if sample_range is None else (int(sample_range[0]), int(sample_range[1]))
    if not 0 <= start < stop <= n:
        raise ValueError(f"sample_range={(start, stop)} must satisfy 0 <= start < stop <= {n} for {geometry.path!r}")
    array = zarr.open_array(store=as_store(store), path=geometry.path, mode="r")
    fill = array.fill_value
    if fill is None:  # a v2 array without one: zarr reads a chunk never written as zeros
        fill = np.zeros((), dtype=array.dtype)[()]
    size = geometry.stored_chunks[axis]
    found: list[np.ndarray] = []
    for lo in range(start - start % size, stop, size):
        a, b = max(lo, start), min(lo + size, stop)
        where: list[slice] = [slice(None)] * array.ndim
        where[axis] = slice(a, b)
        rows = np.moveaxis(np.asarray(array[tuple(where)]), axis, 0)
        found.append(a + np.flatnonzero(_all_fill(rows, fill)))
    indices = np.concatenate(found) if found else np.zeros(0, np.int64)
    times: tuple[str, ...] = ()
    dims = geometry.dimension_names
    dim = dims[axis] if dims else None
    if dim and len(indices):
        try:
            values = geometry.coord(dim)
        except KeyError:
            values = None
        steps = StepAxis.of(values) if values is not None else None
        if steps is not None:
            times = tuple(exact_text(steps.axis, steps.instant(steps.ticks[i])) for i in indices.tolist())
    fill_value = fill.item() if isinstance(fill, np.generic) else fill
    return FillSteps(geometry.path, fill_value, tuple(int(i) for i in indices), times, stop - start)
