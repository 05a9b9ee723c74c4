"""What a write layout should be: ``OutputArray`` (one array at full extent) and ``LayoutSpec`` (the group).

Pure values, checked when built; ``layout`` creates and reads them in a store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    """

    arrays: tuple[OutputArray, ...]

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

    @property
    def extent(self) -> int:
        """Length of the indexed dimension."""
        return next(a.shape[a.index_axis] for a in self.arrays if a.index_axis is not None)

    @property
    def indexed(self) -> dict[str, int]:
        """Indexed array names and their index axis."""
        return {a.name: a.index_axis for a in self.arrays if a.index_axis is not None}
