"""What the engine knows about one zarr array: shape, stored-chunk grid, sample axis.

``ArrayGeometry`` is the single place that maps between the logical view the
engine works in (sample axis first) and zarr's physical axis order and keys.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .._zarr_compat import ArrayV2Metadata, ArrayV3Metadata, ChunkProjection
from .coords import Coordinate, CoordinateSource

__all__ = [
    "MAX_CHUNK_BYTES",
    "MAX_CHUNK_BYTES_ENV",
    "MAX_CHUNKS_PER_READ",
    "ArrayGeometry",
    "geometry_of",
]

# Largest decoded chunk the engine will allocate, in bytes. A stored chunk (the
# shard of a sharded array: what one decode returns) and a sample-axis chunk
# across its tiles (what one pool entry holds) must each fit. Real archives keep
# chunks near 1-100 MB and shards within a few GB; metadata past this is corrupt
# or hostile, and believing it would allocate that much. Raise it per call with
# ``max_chunk_bytes=``, or process-wide with the environment variable below.
MAX_CHUNK_BYTES = 4 * 2**30
MAX_CHUNK_BYTES_ENV = "INSITUBATCH_MAX_CHUNK_BYTES"
# Most stored chunks one sample-axis chunk may span, and most inner chunks one
# shard may hold: each costs a GET or a shard-index entry plus a Python call per
# read. 2**20 covers a 4 GiB read of 4 KiB chunks; more is a chunking no engine
# can stream, and its bookkeeping alone would allocate gigabytes.
MAX_CHUNKS_PER_READ = 2**20


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ArrayGeometry:
    """Shape and chunking of one zarr array, seen along one sample axis.

    ``shape``, ``chunks`` and ``stored_chunks`` are in physical (zarr) axis
    order. ``chunks`` is zarr's read chunk; ``stored_chunks`` is what one store
    key holds (the shard on a sharded array, else ``chunks``). The engine reads
    whole stored chunks ("tiles"). ``offset`` makes a windowed view:
    sample ``i`` of the view reads ``array[i + offset]`` along the sample axis.
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    stored_chunks: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    sample_axis: int = 0
    offset: int = 0
    zarr_format: int = 3
    dimension_names: tuple[str | None, ...] | None = None
    metadata: ArrayV2Metadata | ArrayV3Metadata | None = field(default=None, compare=False, repr=False, hash=False)
    # where this array's coordinate arrays are read from (set by ``open_geometries``)
    coords: CoordinateSource | None = field(default=None, compare=False, repr=False, hash=False)

    # -- sample axis -----------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @functools.cached_property
    def n_samples(self) -> int:
        """Length of the array along the sample axis."""
        return self.shape[self.sample_axis]

    @functools.cached_property
    def sample_chunk_size(self) -> int:
        """Samples per stored chunk along the sample axis."""
        return self.stored_chunks[self.sample_axis]

    @functools.cached_property
    def n_chunks(self) -> int:
        """Number of stored chunks along the sample axis (the last may be partial)."""
        return _ceil_div(self.n_samples, self.sample_chunk_size)

    def chunk_len(self, chunk_index: int) -> int:
        """Samples the sample-axis chunk ``chunk_index`` really holds (edge chunks are short)."""
        if not 0 <= chunk_index < self.n_chunks:
            raise ValueError(f"{chunk_index=} is outside [0, {self.n_chunks}) for array {self.path!r}")
        return min(self.sample_chunk_size, self.n_samples - chunk_index * self.sample_chunk_size)

    # -- field (inner) axes ---------------------------------------------
    @functools.cached_property
    def inner_shape(self) -> tuple[int, ...]:
        """Per-sample payload shape: every axis but the sample axis, in physical order."""
        return tuple(s for k, s in enumerate(self.shape) if k != self.sample_axis)

    @functools.cached_property
    def inner_stored_chunks(self) -> tuple[int, ...]:
        return tuple(s for k, s in enumerate(self.stored_chunks) if k != self.sample_axis)

    @functools.cached_property
    def tile_grid(self) -> tuple[int, ...]:
        """Stored chunks per inner axis (the grid of tiles one sample-axis chunk spans)."""
        return tuple(_ceil_div(s, c) for s, c in zip(self.inner_shape, self.inner_stored_chunks))

    @functools.cached_property
    def tiles_per_chunk(self) -> int:
        return math.prod(self.tile_grid)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @functools.cached_property
    def sample_nbytes(self) -> int:
        """Bytes of one sample's payload."""
        return math.prod(self.inner_shape) * self.itemsize

    @functools.cached_property
    def chunk_nbytes(self) -> int:
        """Decoded bytes of one full sample-axis chunk (all its tiles)."""
        return self.sample_chunk_size * self.sample_nbytes

    @functools.cached_property
    def stored_chunk_nbytes(self) -> int:
        """Decoded bytes of one full stored chunk (one tile)."""
        return math.prod(self.stored_chunks) * self.itemsize

    @functools.cached_property
    def _tile_coords(self) -> tuple[tuple[int, ...], ...]:
        return tuple(itertools.product(*(range(n) for n in self.tile_grid)))

    def tile_coord(self, tile_index: int) -> tuple[int, ...]:
        """Inner grid coordinates of tile ``tile_index`` (C order over ``tile_grid``)."""
        if not 0 <= tile_index < self.tiles_per_chunk:
            raise ValueError(f"{tile_index=} is outside [0, {self.tiles_per_chunk}) for array {self.path!r}")
        return self._tile_coords[tile_index]

    def tile_origins(self) -> np.ndarray:
        """``(tiles_per_chunk, len(inner_shape))`` origin of each tile in the inner field."""
        grid = np.indices(self.tile_grid).reshape(len(self.tile_grid), self.tiles_per_chunk).T
        return (grid * np.asarray(self.inner_stored_chunks, dtype=np.intp)).astype(np.intp)

    def tile_shapes(self) -> np.ndarray:
        """``(tiles_per_chunk, len(inner_shape))`` real extent of each tile (edge tiles are clipped)."""
        origins = self.tile_origins()
        return np.minimum(np.asarray(self.inner_stored_chunks), np.asarray(self.inner_shape) - origins).astype(np.intp)

    def physical_chunk_coord(self, chunk_index: int, tile: int | Sequence[int] = 0) -> tuple[int, ...]:
        """The stored-chunk coordinates (physical order) of a tile of a sample-axis chunk."""
        inner = self.tile_coord(tile) if isinstance(tile, (int, np.integer)) else tuple(int(t) for t in tile)
        if len(inner) != self.ndim - 1:
            raise ValueError(f"tile coordinate {inner} must have {self.ndim - 1} entries for array {self.path!r}")
        coord = list(inner)
        coord.insert(self.sample_axis, int(chunk_index))
        return tuple(coord)

    def chunk_key(self, coord: Sequence[int]) -> str:
        """The store key of the stored chunk at physical ``coord``, in the array's own key encoding."""
        if self.metadata is None:
            raise ValueError(f"geometry of {self.path!r} carries no zarr metadata to encode keys with")
        key = self.metadata.encode_chunk_key(tuple(int(c) for c in coord))
        return f"{self.path}/{key}" if self.path else key

    def tile_placement(self, chunk_index: int, tile: int | Sequence[int] = 0) -> ChunkProjection:
        """Where a tile's valid data sits: in its decoded stored chunk and in the chunk's pool entry.

        ``chunk_selection`` is physical-order slices into the decoded stored
        chunk; ``out_selection`` is slices into the chunk's logical array
        ``(chunk_len, *inner_shape)`` (sample axis first).
        """
        coord = self.physical_chunk_coord(chunk_index, tile)
        n = self.chunk_len(chunk_index)
        chunk_sel: list[slice] = []
        out_inner: list[slice] = []
        complete = True
        for k, (c, size, ext) in enumerate(zip(coord, self.stored_chunks, self.shape)):
            start = c * size
            stop = min(start + size, ext)
            if stop - start < size:
                complete = False
            chunk_sel.append(slice(0, stop - start))
            if k != self.sample_axis:
                out_inner.append(slice(start, stop))
        return ChunkProjection(
            chunk_coords=coord,
            chunk_selection=tuple(chunk_sel),
            out_selection=(slice(0, n), *out_inner),
            is_complete_chunk=complete,
        )

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
        """The values labelling dimension ``dim``: its coordinate array, decoded (time as ``datetime64``).

        Raises
        ------
        KeyError
            The array has no such dimension, or the store no coordinate array for it.
        """
        found = self._coordinate(dim)
        if found is None:
            raise KeyError(
                f"array {self.path!r}: dimension {dim!r} has no coordinate array in the store "
                f"(looked for a 1-D array {dim!r} of length {self.shape[self._dim_index(dim)]} next to it "
                "and in its parent groups)"
            )
        return found.values

    # -- views -------------------------------------------------------------
    def shift(self, k: int) -> ArrayGeometry:
        """A windowed view: sample ``i`` reads ``array[i + offset + k]`` along the sample axis."""
        if not isinstance(k, (int, np.integer)):
            raise TypeError(f"shift(k) takes an int, got {type(k).__name__}")
        return dataclasses.replace(self, offset=self.offset + int(k))

    def with_sample_axis(self, sample_axis: int) -> ArrayGeometry:
        return dataclasses.replace(self, sample_axis=_normalize_axis(sample_axis, self.ndim, self.path))


def _normalize_axis(sample_axis: int, ndim: int, path: str) -> int:
    if not isinstance(sample_axis, (int, np.integer)):
        raise TypeError(f"sample_axis must be an int, got {type(sample_axis).__name__} ({sample_axis!r})")
    if ndim == 0:
        raise ValueError(f"array {path!r} is 0-dimensional: it has no axis to sample along")
    if not -ndim <= sample_axis < ndim:
        raise ValueError(
            f"{sample_axis=} is out of range for array {path!r} with {ndim} dims (shape must have an axis {sample_axis})"
        )
    return int(sample_axis) % ndim


def _dimension_names(arr: zarr.Array) -> tuple[str | None, ...] | None:
    """v3 ``dimension_names``, else xarray's ``_ARRAY_DIMENSIONS`` attribute (v2, or v3 written that way)."""
    md = arr.metadata
    if isinstance(md, ArrayV3Metadata) and md.dimension_names is not None:
        return tuple(md.dimension_names)
    dims = arr.attrs.get("_ARRAY_DIMENSIONS")
    if isinstance(dims, (list, tuple)) and len(dims) == arr.ndim and all(isinstance(d, str) for d in dims):
        return tuple(dims)
    return None


def _chunk_byte_limit(max_chunk_bytes: int | None) -> int:
    """``max_chunk_bytes``, else the environment's limit, else ``MAX_CHUNK_BYTES``."""
    if max_chunk_bytes is None:
        text = os.environ.get(MAX_CHUNK_BYTES_ENV)
        if not text:
            return MAX_CHUNK_BYTES
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{MAX_CHUNK_BYTES_ENV}={text!r} must be a positive integer number of bytes")
        return value
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, (int, np.integer)):
        raise TypeError(f"max_chunk_bytes must be an int (bytes) or None, got {type(max_chunk_bytes).__name__}")
    if max_chunk_bytes < 1:
        raise ValueError(f"{max_chunk_bytes=} must be >= 1 (bytes), or None for the default {MAX_CHUNK_BYTES}")
    return int(max_chunk_bytes)


def _check_size(g: ArrayGeometry, limit: int) -> None:
    """Refuse metadata whose chunks would decode to more than ``limit`` bytes, before anything is allocated."""
    override = f"if the array is real, pass max_chunk_bytes= or set {MAX_CHUNK_BYTES_ENV}"
    for what, nbytes in (("one stored chunk", g.stored_chunk_nbytes), ("one sample-axis chunk", g.chunk_nbytes)):
        if nbytes > limit:
            raise ValueError(
                f"array {g.path!r} (shape {g.shape}, stored chunks {g.stored_chunks}, dtype {g.dtype}): "
                f"{what} decodes to {nbytes} bytes, over max_chunk_bytes={limit}; "
                f"the metadata is likely corrupt ({override})"
            )
    inner_per_shard = math.prod(_ceil_div(s, c) for s, c in zip(g.stored_chunks, g.chunks))
    for what, count in (
        ("stored chunks per sample-axis chunk", g.tiles_per_chunk),
        ("inner chunks per shard", inner_per_shard),
    ):
        if count > MAX_CHUNKS_PER_READ:
            raise ValueError(
                f"array {g.path!r} (shape {g.shape}, chunks {g.chunks}, stored chunks {g.stored_chunks}) has "
                f"{count} {what}, over the limit of {MAX_CHUNKS_PER_READ}; the chunking is corrupt or too fine to stream"
            )


def geometry_of(
    arr: zarr.Array,
    *,
    sample_axis: int = 0,
    max_chunk_bytes: int | None = None,
    coords: CoordinateSource | None = None,
) -> ArrayGeometry:
    """The ``ArrayGeometry`` of an open zarr array.

    ``coords`` is where its coordinate arrays are read from (default: the array's own store).

    Raises
    ------
    ValueError
        A chunk would decode to more than ``max_chunk_bytes`` (default
        ``MAX_CHUNK_BYTES``, or the ``INSITUBATCH_MAX_CHUNK_BYTES`` environment
        variable), or a read spans more than ``MAX_CHUNKS_PER_READ`` chunks.
    """
    limit = _chunk_byte_limit(max_chunk_bytes)
    ndim = arr.ndim
    axis = _normalize_axis(sample_axis, ndim, arr.path)
    chunks = tuple(int(c) for c in arr.chunks)
    shards = getattr(arr, "shards", None)
    stored = tuple(int(c) for c in shards) if shards is not None else chunks
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject or dtype.kind == "T" or (dtype.kind in "US" and dtype.itemsize == 0):
        raise ValueError(
            f"array {arr.path!r} has variable-size dtype {arr.dtype}; only fixed-size dtypes are supported"
        )
    geometry = ArrayGeometry(
        path=arr.path,
        shape=tuple(int(s) for s in arr.shape),
        chunks=chunks,
        stored_chunks=stored,
        dtype=dtype,
        fill_value=arr.fill_value,
        sample_axis=axis,
        offset=0,
        zarr_format=arr.metadata.zarr_format,
        dimension_names=_dimension_names(arr),
        metadata=arr.metadata,
        coords=coords if coords is not None else CoordinateSource(arr.store),
    )
    _check_size(geometry, limit)
    return geometry


def sample_coords(variables: Iterable[ArrayGeometry], n: int) -> dict[str, np.ndarray]:
    """The sample axis's coordinate (by dimension name) from the first variable whose store has it, else indices."""
    for g in variables:
        dims = g.dimension_names
        name = dims[g.sample_axis] if dims else None
        if name and g.n_samples == n:
            found = g._coordinate(name)
            if found is not None:
                return {name: found.values}
    return {"sample": np.arange(n)}
