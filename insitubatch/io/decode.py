"""Synchronous decode of one stored chunk, built from the array's declared codecs.

zarr 3.1 decodes only through its async codec pipeline, which needs an event
loop and hops to threads of its own. The engine decodes on a thread pool it
owns, so this module assembles the same chain once per array and runs it as
plain calls:

* **v3** — the codec list is split the way zarr splits it: array→array
  codecs (transpose, ...), one array→bytes codec (``bytes`` with its
  endianness), then bytes→bytes codecs (zstd, gzip, blosc, crc32c, ...). Each
  codec is handed the ``ArraySpec`` it saw when encoding (array→array codecs
  change it, so it is walked through their ``resolve_metadata`` once, up
  front). Decoding runs the list backwards through each codec's synchronous
  decode (``_zarr_compat.codec_decoder``: zarr's own, or the numcodecs codec
  a wrapper carries).
* **sharded v3** — a whole shard decodes its index (at the start or the
  end; normally ``bytes`` + ``crc32c``, so the checksum is verified), then
  each present inner chunk with the inner chain into its place; absent ones
  (offset and length both 2**64-1) read as the fill value. Nested shards
  work the same way. The engine itself reads one inner chunk at a time when
  the sharding codec is the array's only codec (``ArrayGeometry.sharded_reads``:
  the index once per shard, then a byte range per inner chunk), and decodes
  it with ``make_decoder(geometry, tile=True)``. The chains live in ``io.chain``.
* **v2** — the numcodecs compressor, then the filters in reverse, then a view
  as the array's dtype laid out in its ``order``.

**Decode into the destination.** ``ChunkDecoder.decode_into`` writes a
chunk into memory the caller owns (a pool entry's tile). When the chain is
one compressor that numcodecs can decompress straight into a buffer —
blosc, zstd, lz4, gzip or zlib, behind a native-endian ``bytes`` codec (v3),
inner shard chunks included, or as a filterless C-order v2 compressor — it
does, with no intermediate array. numcodecs accepts an ``out`` larger than
the data and leaves its tail untouched, so the size the frame declares
(blosc and zstd headers, the lz4 prefix, the gzip trailer) is checked
against ``out`` first; a frame of any other size takes the generic path,
which refuses it by its real size: a short frame is a bad chunk, never a
half-written tile. Every other chain decodes as usual and is copied into
``out``.

The codecs themselves (numcodecs' blosc, zstd, zlib) release the GIL; the
glue here is O(codecs + inner chunks) Python per stored chunk, never per
element. Any failure — a codec error, a checksum mismatch, a wrong decoded
size, a shard index pointing outside the shard, a blosc frame whose header
disagrees with its length (c-blosc would read past the end of a truncated
one) — becomes ``BadChunkError`` naming the array, the chunk and its key:
garbage is never returned as data.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype
from zarr.codecs.sharding import ShardingCodec

from .._zarr_compat import (
    ArrayV2Metadata,
    chunk_spec,
    sync,
)
from ..errors import BadChunkError, StoreReadError
from ..validation import Anything, Instance, Table, validate_params
from .chain import CONFIG, PROTOTYPE, Chain, ShardStage, fill_value_of, partial_shards
from .decode_v2 import V2Chain
from .direct import ChunkData, DecodeFailure, as_uint8
from .geometry import ArrayGeometry

__all__ = ["ChunkDecoder", "clip_to_array", "make_decoder", "read_stored_chunk"]


def shard_stage(geometry: ArrayGeometry) -> ShardStage:
    """The sharding stage of a geometry whose tiles are inner chunks: its index and inner chains."""
    metadata = geometry.metadata
    codecs: tuple[Any, ...] = tuple(getattr(metadata, "codecs", ())) if metadata is not None else ()
    codec = codecs[0] if partial_shards(metadata) else None
    if metadata is None or not isinstance(codec, ShardingCodec):
        raise ValueError(f"array {geometry.path!r} is not sharded with the sharding codec alone")
    spec = chunk_spec(metadata, tuple(geometry.stored_chunks), CONFIG, PROTOTYPE)
    return ShardStage(codec, spec)


class ChunkDecoder:
    """Decodes one array's stored chunks: ``decoder(data, coord) -> ndarray``.

    Build it once per array with ``make_decoder``; calls are thread-safe and
    need no event loop.
    """

    def __init__(self, geometry: ArrayGeometry, *, tile: bool = False) -> None:
        metadata = geometry.metadata
        if metadata is None:
            raise ValueError(f"geometry of {geometry.path!r} carries no zarr metadata to build a decoder from")
        self.geometry = geometry
        # a tile decoder of a sharded array read by byte range decodes one inner chunk with the inner chain
        self.inner = tile and geometry.sharded_reads
        self.shape = tuple(geometry.tile_chunks if self.inner else geometry.stored_chunks)
        self.dtype = np.dtype(geometry.dtype)
        spec = chunk_spec(metadata, self.shape, CONFIG, PROTOTYPE)
        self.fill_value = fill_value_of(spec)
        self._chain: V2Chain | Chain
        if isinstance(metadata, ArrayV2Metadata):
            self._chain = V2Chain(metadata, spec)
        elif self.inner:
            self._chain = shard_stage(geometry).inner_chain
        else:
            self._chain = Chain(metadata.codecs, spec)

    @property
    def direct_codec(self) -> Any:
        """The numcodecs compressor that alone decodes a chunk straight into a tile of this dtype, else None."""
        direct = self._chain.direct
        return direct.codec if direct is not None and self._chain.dtype == self.dtype else None

    def encoded_nbytes(self) -> int | None:
        """Bytes each chunk (tile) this decodes takes in the store, where its codecs fix them (none compresses),
        else None: a compressed chunk's size is known only once it is read."""
        chain = self._chain
        if not isinstance(chain, Chain):
            return None
        try:
            return int(chain.encoded_nbytes())
        except Exception:  # noqa: BLE001 - a codec that cannot say (compressors raise NotImplementedError)
            return None

    def fill(self) -> np.ndarray:
        """A stored chunk that was never written: all fill value."""
        return np.full(self.shape, self.fill_value, dtype=self.dtype)

    def __call__(self, data: ChunkData | None, coord: Sequence[int]) -> np.ndarray:
        """The decoded stored chunk at ``coord``, full ``stored_chunks`` shape, C order.

        ``data`` is the key's bytes, or None when the key is missing (read as
        the fill value). The result may be a read-only view of decoded bytes.

        Raises
        ------
        BadChunkError
            The bytes do not decode to this array's chunk.
        """
        if data is None:
            return self.fill()
        try:
            decoded = self._chain(as_uint8(data))
            if decoded.shape != self.shape:
                raise DecodeFailure(f"decoded shape {decoded.shape}, expected {self.shape}")
        except DecodeFailure as exc:
            raise self.bad_chunk(coord, str(exc)) from exc.__cause__
        except (TypeError, ValueError) as exc:  # bytes that no buffer view accepts
            raise self.bad_chunk(coord, str(exc)) from exc
        # One conversion at most: to the array's dtype (byte order) and C order.
        return np.asarray(decoded, dtype=self.dtype, order="C")

    def decode_into(self, data: ChunkData | None, coord: Sequence[int], out: np.ndarray) -> None:
        """Decode the stored chunk at ``coord`` straight into ``out``, memory the caller owns.

        ``out`` is C-contiguous and writeable, with the full ``stored_chunks``
        shape and this array's dtype. Nothing in it aliases ``data``. On
        ``BadChunkError`` its contents are undefined.
        """
        if out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(
                f"out must be a writeable C-contiguous {self.dtype} array of shape {self.shape} for array "
                f"{self.geometry.path!r}, got {out.dtype} {out.shape}"
            )
        if data is None:
            out[...] = self.fill_value
            return
        try:
            self._chain.decode_into(as_uint8(data), out)
        except DecodeFailure as exc:
            raise self.bad_chunk(coord, str(exc)) from exc.__cause__
        except (TypeError, ValueError) as exc:  # bytes that no buffer view accepts, shapes that do not fit
            raise self.bad_chunk(coord, str(exc)) from exc

    def bad_chunk(self, coord: Sequence[int], why: str) -> BadChunkError:
        """The ``BadChunkError`` for the chunk (or inner chunk) at ``coord``, naming its key and ``why``."""
        coord = tuple(int(c) for c in coord)
        if self.inner:
            key, place = self.geometry.tile_key(coord)
            where = f"key {key!r}, inner chunk {place}"
        else:
            where = f"key {self.geometry.chunk_key(coord)!r}"
        return BadChunkError(f"cannot decode chunk {coord} of array {self.geometry.path!r} ({where}): {why}")


# Decoders keyed by the identity of the zarr metadata they were built from;
# an entry goes away with its metadata object. The decoder is held weakly: it
# holds its geometry, and so the metadata and the store (a strong reference
# here kept every store a dataset opened, and its connections, alive).
_DECODERS: dict[tuple[int, bool], tuple[weakref.ref[Any], weakref.ref[ChunkDecoder]]] = {}


def _forget_decoder(key: tuple[int, bool], ref: weakref.ref[Any]) -> None:
    cache = _DECODERS  # None while the interpreter tears module globals down
    if cache is not None and cache.get(key, (None,))[0] is ref:
        del cache[key]


def make_decoder(geometry: ArrayGeometry, *, tile: bool = False) -> ChunkDecoder:
    """The (cached) ``ChunkDecoder`` for ``geometry``'s array: of a stored chunk, or with ``tile`` of one tile.

    A tile is the stored chunk, or a shard's inner chunk when the engine
    reads those by byte range (``geometry.sharded_reads``).
    """
    metadata = geometry.metadata
    tile = tile and geometry.sharded_reads
    key = (id(metadata), tile)
    entry = _DECODERS.get(key)
    held = None if entry is None else entry[1]()
    if entry is not None and entry[0]() is metadata and held is not None and held.dtype == geometry.dtype:
        return held
    decoder = ChunkDecoder(geometry, tile=tile)
    try:
        ref = weakref.ref(metadata, functools.partial(_forget_decoder, key))
    except TypeError:  # metadata that cannot be weakly referenced is simply not cached
        return decoder
    _DECODERS[key] = (ref, weakref.ref(decoder))
    return decoder


def _check_coord(geometry: ArrayGeometry, chunk_coord: Sequence[int]) -> tuple[int, ...]:
    coord = tuple(int(c) for c in chunk_coord)
    grid = tuple(-(-s // c) for s, c in zip(geometry.shape, geometry.stored_chunks))
    if len(coord) != len(grid) or not all(0 <= c < g for c, g in zip(coord, grid)):
        raise ValueError(f"{chunk_coord=} is outside the stored-chunk grid {grid} of array {geometry.path!r}")
    return coord


def clip_to_array(geometry: ArrayGeometry, coord: Sequence[int], decoded: np.ndarray) -> np.ndarray:
    """The part of a decoded stored chunk inside the array (a view; edge chunks are short)."""
    coord = _check_coord(geometry, coord)
    region = tuple(
        slice(0, min(size, extent - c * size)) for c, size, extent in zip(coord, geometry.stored_chunks, geometry.shape)
    )
    return decoded[region]


# What ``read_stored_chunk`` accepts (``validation``)
READ_CHUNK_PARAMETERS: Table = {
    "store": [Anything("the zarr Store holding the array")],
    "geometry": [Instance(ArrayGeometry, "an ArrayGeometry")],
    "chunk_coord": [Anything("a stored chunk's index along every axis, inside the chunk grid")],
}


@validate_params(READ_CHUNK_PARAMETERS)
def read_stored_chunk(store: Store, geometry: ArrayGeometry, chunk_coord: Sequence[int]) -> np.ndarray:
    """Fetch, decode and clip one stored chunk: equal to zarr's read of that region.

    Parameters
    ----------
    store
        Any zarr ``Store`` holding the array.
    geometry
        The array's geometry (``geometry_of`` / ``open_geometries``).
    chunk_coord
        Stored-chunk (shard) coordinates in physical axis order.

    Returns
    -------
    numpy.ndarray
        The chunk's values, physical axis order, clipped to the array extent.

    Raises
    ------
    ValueError
        ``chunk_coord`` is outside the array's stored-chunk grid.
    StoreReadError
        The store request failed.
    BadChunkError
        The stored bytes do not decode.
    """
    coord = _check_coord(geometry, chunk_coord)
    key = geometry.chunk_key(coord)
    try:
        data = sync(store.get(key, prototype=default_buffer_prototype()))
    except Exception as exc:  # any backend's failure, named for the user
        raise StoreReadError(f"reading chunk {coord} of array {geometry.path!r} (key {key!r}) failed: {exc}") from exc
    return clip_to_array(geometry, coord, make_decoder(geometry)(data, coord))
