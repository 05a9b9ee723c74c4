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
* **sharded v3** — the stored chunk is the whole shard. Its index (at the
  start or the end) is itself a small chain (normally ``bytes`` + ``crc32c``,
  so the checksum is verified); each present inner chunk is decoded with the
  inner chain and placed in the shard; absent ones (offset and length both
  2**64-1) read as the fill value. Nested shards work the same way.
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
import math
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype
from zarr.buffer.cpu import numpy_buffer_prototype
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.sharding import ShardingCodec
from zarr.dtype import UInt64

from .._zarr_compat import (
    ArrayConfig,
    ArraySpec,
    ArrayV2Metadata,
    bytes_codec_endian,
    chunk_spec,
    codec_decoder,
    shard_index_at_start,
    sync,
)
from ..errors import BadChunkError, StoreReadError
from .decode_v2 import _V2Chain
from .direct import ChunkData, _as_uint8, _check_blosc_frame, _DecodeFailure, _Direct, _is_blosc
from .geometry import ArrayGeometry

__all__ = ["ChunkDecoder", "clip_to_array", "make_decoder", "read_stored_chunk"]

# Shard-index entry of an inner chunk that was never written (zarr sharding spec).
_ABSENT = 2**64 - 1
# What ``_ShardStage.read_index`` says of each entry.
INDEX_OK, INDEX_HALF_EMPTY, INDEX_OUTSIDE = 0, 1, 2
# Decode into host numpy memory whatever zarr's configured default buffer is.
_PROTOTYPE = numpy_buffer_prototype()
_CONFIG = ArrayConfig(order="C", write_empty_chunks=False)


def _fill_value(spec: ArraySpec) -> Any:
    # zarr v2 allows a null fill value; zarr then reads missing chunks as the dtype default.
    return spec.dtype.default_scalar() if spec.fill_value is None else spec.fill_value


def _stage(codec: Any) -> Callable[[np.ndarray, ArraySpec], np.ndarray]:
    """One codec's decode as ``numpy -> numpy``, with no event loop."""
    if _is_blosc(codec):
        decode = codec_decoder(codec)

        def checked(a: np.ndarray, spec: ArraySpec) -> np.ndarray:
            _check_blosc_frame(a)
            return decode(a, spec)

        return checked
    return codec_decoder(codec)


def _run(
    codec: Any, decode: Callable[[np.ndarray, ArraySpec], np.ndarray], data: np.ndarray, spec: ArraySpec
) -> np.ndarray:
    try:
        return decode(data, spec)
    except _DecodeFailure:
        raise
    except Exception as exc:  # every codec has its own failure types
        raise _DecodeFailure(f"{type(codec).__name__} failed: {exc}") from exc


class _Chain:
    """A v3 codec list, decoded last to first: bytes→bytes, array→bytes, array→array."""

    def __init__(self, codecs: Sequence[Any], spec: ArraySpec) -> None:
        array_array = [c for c in codecs if isinstance(c, ArrayArrayCodec)]
        array_bytes = [c for c in codecs if isinstance(c, ArrayBytesCodec)]
        bytes_bytes = [c for c in codecs if isinstance(c, BytesBytesCodec)]
        if len(array_bytes) != 1 or len(array_array) + 1 + len(bytes_bytes) != len(codecs):
            raise ValueError(f"codec list {list(codecs)!r} needs exactly one array→bytes codec")
        self.shape = tuple(spec.shape)
        self.dtype = spec.dtype.to_native_dtype()
        self._array_array = []
        for aa in array_array:
            self._array_array.append((aa, _stage(aa), spec))
            spec = aa.resolve_metadata(spec)
        (ab,) = array_bytes
        self._array_bytes_codec = ab
        self._array_bytes_spec = spec
        self._array_bytes = _ShardStage(ab, spec) if isinstance(ab, ShardingCodec) else _stage(ab)
        spec = ab.resolve_metadata(spec)
        self._bytes_bytes = []
        for bb in bytes_bytes:
            self._bytes_bytes.append((bb, _stage(bb), spec))
            spec = bb.resolve_metadata(spec)
        # Raw size of the array→bytes input for fixed-size serializers (the `bytes` codec).
        raw = self._array_bytes_spec
        self._raw_nbytes = math.prod(raw.shape) * raw.dtype.to_native_dtype().itemsize
        self._direct = self._direct_stage()

    def _direct_stage(self) -> _Direct | None:
        """The compressor to decode straight into a caller's buffer, when the chain is just that."""
        codec = self._array_bytes_codec
        if self._array_array or len(self._bytes_bytes) != 1 or type(codec) is not BytesCodec:
            return None
        if bytes_codec_endian(codec) not in (None, sys.byteorder):
            return None
        if self.dtype.hasobject or not self.dtype.isnative:
            return None
        return _Direct.of(self._bytes_bytes[0][0])

    def decode_into(self, raw: np.ndarray, out: np.ndarray) -> None:
        """Decode into ``out`` (this chain's shape, C-contiguous, writeable)."""
        if self._direct is not None and out.dtype == self.dtype and self._direct(raw, out):
            return
        if isinstance(self._array_bytes, _ShardStage) and not self._array_array and not self._bytes_bytes:
            self._array_bytes.decode_into(raw, out)
            return
        out[...] = self(raw)

    def encoded_nbytes(self) -> int:
        """Encoded size of one chunk; only for fixed-size chains such as a shard index."""
        nbytes = self._array_bytes_codec.compute_encoded_size(self._raw_nbytes, self._array_bytes_spec)
        for codec, _, spec in self._bytes_bytes:
            nbytes = codec.compute_encoded_size(nbytes, spec)
        return nbytes

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        data = raw
        for codec, decode, spec in reversed(self._bytes_bytes):
            data = _run(codec, decode, data, spec)
        if isinstance(self._array_bytes, _ShardStage):
            data = self._array_bytes(data)
        else:
            if getattr(self._array_bytes_codec, "is_fixed_size", False) and data.nbytes != self._raw_nbytes:
                raise _DecodeFailure(f"decoded {data.nbytes} bytes, expected {self._raw_nbytes}")
            data = _run(self._array_bytes_codec, self._array_bytes, data, self._array_bytes_spec)
        for codec, decode, spec in reversed(self._array_array):
            data = _run(codec, decode, data, spec)
        if data.shape != self.shape:
            raise _DecodeFailure(f"decoded shape {data.shape}, expected {self.shape}")
        return data


class _ShardStage:
    """The sharding codec's decode: index, then each present inner chunk into its place."""

    def __init__(self, codec: ShardingCodec, spec: ArraySpec) -> None:
        self.shape = tuple(spec.shape)
        self.dtype = spec.dtype.to_native_dtype()
        self.fill = _fill_value(spec)
        self.inner_shape = tuple(codec.chunk_shape)
        self.grid = tuple(s // c for s, c in zip(self.shape, self.inner_shape))
        index_spec = ArraySpec(
            shape=(*self.grid, 2),
            dtype=UInt64(endianness="little"),
            fill_value=_ABSENT,
            config=_CONFIG,
            prototype=_PROTOTYPE,
        )
        self._index = _Chain(codec.index_codecs, index_spec)
        self.index_nbytes = self._index.encoded_nbytes()
        self.index_at_start = shard_index_at_start(codec)
        inner_spec = ArraySpec(
            shape=self.inner_shape, dtype=spec.dtype, fill_value=spec.fill_value, config=_CONFIG, prototype=_PROTOTYPE
        )
        self._inner = _Chain(codec.codecs, inner_spec)

    @property
    def inner_chain(self) -> _Chain:
        """The codec chain of one inner chunk."""
        return self._inner

    def read_index(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, lengths, problems)`` from the index bytes alone (read by a ranged GET).

        A damaged index (wrong size, failed checksum) raises. A damaged entry
        only marks its inner chunk: ``problems`` is ``INDEX_HALF_EMPTY`` or
        ``INDEX_OUTSIDE`` there, ``INDEX_OK`` elsewhere (an absent chunk has
        both offset and length ``2**64 - 1``). The shard's size is not known
        from the index alone, so an entry past its end shows when the read of
        that inner chunk comes back short.
        """
        if raw.size != self.index_nbytes:
            raise _DecodeFailure(f"shard index is {raw.size} bytes, expected {self.index_nbytes}")
        try:
            index = self._index(raw)
        except _DecodeFailure as exc:
            raise _DecodeFailure(f"shard index: {exc}") from exc.__cause__
        offsets, lengths = index[..., 0].copy(), index[..., 1].copy()
        absent = offsets == _ABSENT
        problems = np.zeros(offsets.shape, dtype=np.uint8)
        problems[absent != (lengths == _ABSENT)] = INDEX_HALF_EMPTY
        lo = self.index_nbytes if self.index_at_start else 0
        outside = ~absent & (lengths != _ABSENT) & ((offsets < lo) | (lengths > _ABSENT - offsets))
        problems[outside] = INDEX_OUTSIDE
        return offsets, lengths, problems

    def _read_index(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = raw.size
        if n < self.index_nbytes:
            raise _DecodeFailure(f"shard is {n} bytes, shorter than its {self.index_nbytes}-byte index")
        if self.index_at_start:
            index_raw, lo, hi = raw[: self.index_nbytes], self.index_nbytes, n
        else:
            index_raw, lo, hi = raw[n - self.index_nbytes :], 0, n - self.index_nbytes
        try:
            index = self._index(index_raw)
        except _DecodeFailure as exc:
            raise _DecodeFailure(f"shard index: {exc}") from exc.__cause__
        offsets, lengths = index[..., 0], index[..., 1]
        absent = offsets == _ABSENT
        if not np.array_equal(absent, lengths == _ABSENT):
            where = tuple(int(i) for i in np.argwhere(absent != (lengths == _ABSENT))[0])
            raise _DecodeFailure(f"shard index entry {where} is half empty")
        # Every present inner chunk must lie in the data region [lo, hi) of the shard.
        outside = ~absent & ((offsets < lo) | (offsets > hi) | (lengths > hi - np.minimum(offsets, hi)))
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            raise _DecodeFailure(
                f"shard index entry {where} (offset {int(offsets[where])}, length {int(lengths[where])}) "
                f"points outside the shard's data bytes [{lo}, {hi})"
            )
        return offsets, lengths, ~absent

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        self.decode_into(raw, out)
        return out

    def decode_into(self, raw: np.ndarray, out: np.ndarray) -> None:
        """Each present inner chunk straight into its region of ``out``; absent ones as the fill value."""
        offsets, lengths, present = self._read_index(raw)
        if not present.all():
            out[...] = self.fill
        for where in zip(*np.nonzero(present)):
            start = int(offsets[where])
            region = out[tuple(slice(int(i) * c, (int(i) + 1) * c) for i, c in zip(where, self.inner_shape))]
            try:
                if region.flags.c_contiguous:
                    self._inner.decode_into(raw[start : start + int(lengths[where])], region)
                else:
                    region[...] = self._inner(raw[start : start + int(lengths[where])])
            except _DecodeFailure as exc:
                raise _DecodeFailure(f"inner chunk {tuple(int(i) for i in where)}: {exc}") from exc.__cause__


def partial_shards(metadata: Any) -> bool:
    """Whether a sharded array's inner chunks can be read alone: the sharding codec is its only codec.

    An array→array codec before it, or a bytes→bytes codec after it (the
    whole shard compressed again), leaves whole-shard reads only.
    """
    codecs: tuple[Any, ...] = tuple(getattr(metadata, "codecs", ()))
    return len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)


def shard_stage(geometry: ArrayGeometry) -> _ShardStage:
    """The sharding stage of a geometry whose tiles are inner chunks: its index and inner chains."""
    metadata = geometry.metadata
    codecs: tuple[Any, ...] = tuple(getattr(metadata, "codecs", ())) if metadata is not None else ()
    codec = codecs[0] if partial_shards(metadata) else None
    if metadata is None or not isinstance(codec, ShardingCodec):
        raise ValueError(f"array {geometry.path!r} is not sharded with the sharding codec alone")
    spec = chunk_spec(metadata, tuple(geometry.stored_chunks), _CONFIG, _PROTOTYPE)
    return _ShardStage(codec, spec)


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
        spec = chunk_spec(metadata, self.shape, _CONFIG, _PROTOTYPE)
        self.fill_value = _fill_value(spec)
        self._chain: _V2Chain | _Chain
        if isinstance(metadata, ArrayV2Metadata):
            self._chain = _V2Chain(metadata, spec)
        elif self.inner:
            self._chain = shard_stage(geometry).inner_chain
        else:
            self._chain = _Chain(metadata.codecs, spec)

    @property
    def direct_codec(self) -> Any:
        """The numcodecs compressor that alone decodes a chunk straight into a tile of this dtype, else None."""
        direct = self._chain._direct
        return direct.codec if direct is not None and self._chain.dtype == self.dtype else None

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
            decoded = self._chain(_as_uint8(data))
            if decoded.shape != self.shape:
                raise _DecodeFailure(f"decoded shape {decoded.shape}, expected {self.shape}")
        except _DecodeFailure as exc:
            raise self._bad(coord, str(exc)) from exc.__cause__
        except (TypeError, ValueError) as exc:  # bytes that no buffer view accepts
            raise self._bad(coord, str(exc)) from exc
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
            self._chain.decode_into(_as_uint8(data), out)
        except _DecodeFailure as exc:
            raise self._bad(coord, str(exc)) from exc.__cause__
        except (TypeError, ValueError) as exc:  # bytes that no buffer view accepts, shapes that do not fit
            raise self._bad(coord, str(exc)) from exc

    def _bad(self, coord: Sequence[int], why: str) -> BadChunkError:
        coord = tuple(int(c) for c in coord)
        if self.inner:
            key, place = self.geometry.tile_key(coord)
            where = f"key {key!r}, inner chunk {place}"
        else:
            where = f"key {self.geometry.chunk_key(coord)!r}"
        return BadChunkError(f"cannot decode chunk {coord} of array {self.geometry.path!r} ({where}): {why}")


# Decoders keyed by the identity of the zarr metadata they were built from;
# an entry goes away with its metadata object.
_DECODERS: dict[tuple[int, bool], tuple[weakref.ref[Any], ChunkDecoder]] = {}


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
    if entry is not None and entry[0]() is metadata and entry[1].dtype == geometry.dtype:
        return entry[1]
    decoder = ChunkDecoder(geometry, tile=tile)
    try:
        ref = weakref.ref(metadata, functools.partial(_forget_decoder, key))
    except TypeError:  # metadata that cannot be weakly referenced is simply not cached
        return decoder
    _DECODERS[key] = (ref, decoder)
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
