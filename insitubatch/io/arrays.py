"""One open zarr array as an ``ArrayGeometry``: its metadata read, its dimension names found, its size checked.

``geometry_of`` is the one constructor the package uses; ``MAX_CHUNK_BYTES``
and ``MAX_CHUNKS_PER_READ`` are the limits that keep corrupt or hostile
metadata from turning into an allocation.
"""

from __future__ import annotations

import math

import numpy as np
import zarr

from .. import config
from .._zarr_compat import ArrayV3Metadata
from .coords import CoordinateSource
from .decode import partial_shards
from .geometry import ArrayGeometry, ceil_div, normalize_axis

__all__ = ["MAX_CHUNKS_PER_READ", "MAX_CHUNK_BYTES", "chunk_byte_limit", "dimension_names_of", "geometry_of"]

# Largest decoded chunk the engine will allocate, in bytes: the ``max_chunk_bytes`` setting's default (why
# 4 GiB: ``insitubatch.config``). Raise it per call with ``max_chunk_bytes=``, or process-wide with the setting.
MAX_CHUNK_BYTES: int = config.SETTINGS["max_chunk_bytes"].default
_MAX_CHUNK_BYTES_VARIABLE = config.SETTINGS["max_chunk_bytes"].variable
# Most stored chunks one sample-axis chunk may span, and most inner chunks one
# shard may hold: each costs a GET or a shard-index entry plus a Python call per
# read. 2**20 covers a 4 GiB read of 4 KiB chunks; more is a chunking no engine
# can stream, and its bookkeeping alone would allocate gigabytes.
MAX_CHUNKS_PER_READ = 2**20


def dimension_names_of(arr: zarr.Array) -> tuple[str | None, ...] | None:
    """v3 ``dimension_names``, else xarray's ``_ARRAY_DIMENSIONS`` attribute (v2, or v3 written that way)."""
    md = arr.metadata
    if isinstance(md, ArrayV3Metadata) and md.dimension_names is not None:
        return tuple(md.dimension_names)
    dims = arr.attrs.get("_ARRAY_DIMENSIONS")
    if isinstance(dims, (list, tuple)) and len(dims) == arr.ndim and all(isinstance(d, str) for d in dims):
        return tuple(dims)
    return None


def chunk_byte_limit(max_chunk_bytes: int | None) -> int:
    """``max_chunk_bytes``, else the ``max_chunk_bytes`` setting (its variable, else ``MAX_CHUNK_BYTES``)."""
    if max_chunk_bytes is None:
        return int(config.get("max_chunk_bytes"))
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, (int, np.integer)):
        raise TypeError(f"max_chunk_bytes must be an int (bytes) or None, got {type(max_chunk_bytes).__name__}")
    if max_chunk_bytes < 1:
        raise ValueError(f"{max_chunk_bytes=} must be >= 1 (bytes), or None for the default {MAX_CHUNK_BYTES}")
    return int(max_chunk_bytes)


def _check_size(g: ArrayGeometry, limit: int) -> None:
    """Refuse metadata whose chunks would decode to more than ``limit`` bytes, before anything is allocated."""
    override = f"if the array is real, pass max_chunk_bytes= or set {_MAX_CHUNK_BYTES_VARIABLE}"
    for what, nbytes in (("one stored chunk", g.stored_chunk_nbytes), ("one sample-axis chunk", g.chunk_nbytes)):
        if nbytes > limit:
            raise ValueError(
                f"array {g.path!r} (shape {g.shape}, stored chunks {g.stored_chunks}, dtype {g.dtype}): "
                f"{what} decodes to {nbytes} bytes, over max_chunk_bytes={limit}; "
                f"the metadata is likely corrupt ({override})"
            )
    inner_per_shard = math.prod(ceil_div(s, c) for s, c in zip(g.stored_chunks, g.chunks))
    for what, count in (
        ("inner chunks per shard", inner_per_shard),
        ("tiles per sample-axis chunk", g.tiles_per_chunk),
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
    limit = chunk_byte_limit(max_chunk_bytes)
    ndim = arr.ndim
    axis = normalize_axis(sample_axis, ndim, arr.path)
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
        dimension_names=dimension_names_of(arr),
        metadata=arr.metadata,
        coords=coords if coords is not None else CoordinateSource(arr.store),
        # a shard's inner chunks are read alone (by byte range, after its index) when nothing else encodes the shard
        read_chunks=chunks if shards is not None and partial_shards(arr.metadata) else (),
    )
    _check_size(geometry, limit)
    return geometry
