"""What a write layout should be: ``OutputArray`` (one array at full extent) and ``LayoutSpec`` (the group).

Pure values, checked when built; ``layout`` creates and reads them in a store.
A spec may carry coordinates (``write.coords``): the values labelling a
dimension, stored as their own arrays, the index axis's one addressing writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .coords import coordinate_values, encode_coordinate

__all__ = ["LayoutSpec", "OutputArray"]

# zarr's "use the default" marker for codec arguments.
_AUTO = "auto"


def _ints(name: str, value: Sequence[int], *, minimum: int) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value)
    except TypeError as exc:
        raise TypeError(f"{name}={value!r} must be a sequence of integers") from exc
    if any(v < minimum for v in out) or any(int(v) != v for v in value):
        raise ValueError(f"{name}={value!r} must hold integers >= {minimum}")
    return out


@dataclass(frozen=True)
class OutputArray:
    """One array of a write layout.

    Parameters
    ----------
    name
        Array name inside the group (no ``/``; may not start with ``.`` or ``__``).
    shape
        Full, final shape. Along ``index_axis`` this is the run's fixed extent.
    chunks
        zarr's chunk shape (the inner chunk when ``shards`` is given).
    dtype
        Anything ``numpy.dtype`` accepts.
    shards
        Shard shape (each a multiple of ``chunks``), or ``None`` for no sharding.
    index_axis
        The axis slot ranges cut along, or ``None`` for an array that is not on
        the indexed dimension (coordinates, static fields): workers never write
        those; the coordinator writes them once.
    fill_value
        zarr fill value, or ``None`` for zarr's default for the dtype.
    compressors, filters, serializer
        zarr ``create_array`` codec arguments (``"auto"`` is zarr's default).
    dimension_names
        Optional name per axis.
    attributes
        Array attributes set at creation (not compared by :func:`diff_layout`).
    """

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: Any
    shards: tuple[int, ...] | None = None
    index_axis: int | None = 0
    fill_value: Any = None
    compressors: Any = _AUTO
    filters: Any = _AUTO
    serializer: Any = _AUTO
    dimension_names: tuple[str | None, ...] | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or "/" in name or name.startswith((".", "__")):
            raise ValueError(
                f"name={name!r} must be a non-empty array name without '/' that does not start "
                "with '.' or '__' (those are reserved)"
            )
        shape = _ints("shape", self.shape, minimum=0)
        chunks = _ints("chunks", self.chunks, minimum=1)
        if len(chunks) != len(shape):
            raise ValueError(f"{name}: chunks={chunks} must have one entry per axis of shape={shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "chunks", chunks)
        if self.shards is not None:
            shards = _ints("shards", self.shards, minimum=1)
            if len(shards) != len(shape) or any(s % c for s, c in zip(shards, chunks)):
                raise ValueError(
                    f"{name}: shards={shards} must have one entry per axis, each a multiple of chunks={chunks}"
                )
            object.__setattr__(self, "shards", shards)
        if self.index_axis is not None and not -len(shape) <= self.index_axis < len(shape):
            raise ValueError(f"{name}: index_axis={self.index_axis} is out of range for shape={shape}")
        if self.index_axis is not None:
            object.__setattr__(self, "index_axis", self.index_axis % len(shape))
        np.dtype(self.dtype)  # fail here, with numpy's message, on a dtype zarr cannot take
        if self.dimension_names is not None:
            names = tuple(self.dimension_names)
            if len(names) != len(shape):
                raise ValueError(f"{name}: dimension_names={names} must have one entry per axis of shape={shape}")
            object.__setattr__(self, "dimension_names", names)

    @property
    def indexed(self) -> bool:
        """Whether slot workers write this array."""
        return self.index_axis is not None

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``zarr.Group.create_array``."""
        kwargs: dict[str, Any] = {
            "shape": self.shape,
            "chunks": self.chunks,
            "dtype": self.dtype,
            "shards": self.shards,
            "compressors": self.compressors,
            "filters": self.filters,
            "serializer": self.serializer,
            "dimension_names": self.dimension_names,
            "attributes": dict(self.attributes),
        }
        if self.fill_value is not None:
            kwargs["fill_value"] = self.fill_value
        return kwargs


@dataclass(frozen=True)
class LayoutSpec:
    """Every array of an output group; the indexed ones share one extent along their index axis.

    Parameters
    ----------
    arrays
        The arrays, at least one of them indexed.
    coords
        ``{dimension: values}``: the values labelling a dimension of the
        arrays (valid times, latitudes...), dates or numbers, one per index.
        :func:`create_layout` stores each as a 1-D array named after the
        dimension (dates CF-encoded as xarray encodes them, so
        ``xarray.open_zarr`` of the output decodes them). The one on the index
        axis (the name the indexed arrays give that axis) is the *index
        coordinate*: plans and status show slots by it, and
        ``SlotWriter.write(at=...)`` addresses writes by it; its values must
        be distinct.
    """

    arrays: tuple[OutputArray, ...]
    coords: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        arrays = tuple(self.arrays)
        object.__setattr__(self, "arrays", arrays)
        if not all(isinstance(a, OutputArray) for a in arrays):
            raise TypeError("arrays must hold OutputArray objects")
        names = [a.name for a in arrays]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"array names must be unique; repeated: {duplicates}")
        indexed = [a for a in arrays if a.indexed]
        if not indexed:
            raise ValueError("no array has an index_axis; at least one array must be indexed")
        extents = {a.name: a.shape[a.index_axis] for a in indexed if a.index_axis is not None}
        if len(set(extents.values())) != 1:
            raise ValueError(
                f"indexed arrays must share one extent along their index axis, got {extents}; "
                "one slot plan cuts all of them"
            )
        object.__setattr__(self, "coords", self._checked_coords(names))

    def _checked_coords(self, names: list[str]) -> dict[str, np.ndarray]:
        if not isinstance(self.coords, Mapping):
            raise TypeError(f"coords must be a mapping of dimension name to values, got {type(self.coords).__name__}")
        lengths: dict[str, set[int]] = {}
        for a in self.arrays:
            for dim, size in zip(a.dimension_names or (), a.shape):
                if dim is not None:
                    lengths.setdefault(dim, set()).add(size)
        out = {}
        for name, given in self.coords.items():
            values = coordinate_values(str(name), given)
            if name in names:
                raise ValueError(
                    f"coords[{name!r}] has the name of an array of the spec; a coordinate is its own array"
                )
            if name not in lengths:
                raise ValueError(
                    f"coords[{name!r}]: no array has a dimension {name!r} (dimension_names); "
                    f"dimensions: {sorted(lengths)}"
                )
            if lengths[name] != {len(values)}:
                raise ValueError(
                    f"coords[{name!r}] has {len(values)} values but dimension {name!r} has length "
                    f"{sorted(lengths[name])} in the arrays"
                )
            if name == self.index_dim and len(np.unique(values)) != len(values):
                raise ValueError(f"coords[{name!r}] repeats a value: the index coordinate must name each index once")
            out[str(name)] = values
        return out

    @property
    def extent(self) -> int:
        """Length of the indexed dimension."""
        return next(a.shape[a.index_axis] for a in self.arrays if a.index_axis is not None)

    @property
    def indexed(self) -> dict[str, int]:
        """Indexed array names and their index axis."""
        return {a.name: a.index_axis for a in self.arrays if a.index_axis is not None}

    @property
    def index_dim(self) -> str | None:
        """The name every indexed array gives its index axis, or ``None`` when they do not all name it alike."""
        dims = {
            a.dimension_names[a.index_axis] if a.dimension_names is not None else None
            for a in self.arrays
            if a.index_axis is not None
        }
        return dims.pop() if len(dims) == 1 else None

    @property
    def index_coord(self) -> str | None:
        """The coordinate on the index axis (by which writes may be addressed), or ``None``."""
        dim = self.index_dim
        return dim if dim is not None and dim in self.coords else None

    def coordinate_arrays(self) -> tuple[tuple[OutputArray, np.ndarray], ...]:
        """Each coordinate as the array that stores it and the values it holds (encoded)."""
        out = []
        for name, values in self.coords.items():
            stored, attrs = encode_coordinate(values)
            spec = OutputArray(
                name,
                (len(stored),),
                (max(len(stored), 1),),
                stored.dtype,
                index_axis=None,
                dimension_names=(name,),
                attributes=attrs,
            )
            out.append((spec, stored))
        return tuple(out)
