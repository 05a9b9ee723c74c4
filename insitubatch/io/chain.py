"""A v3 array's codec chain run as plain calls, and the sharding codec's stage inside it.

``Chain`` decodes one chunk through a v3 codec list without an event loop
(see ``io.decode`` for why); ``ShardStage`` is the sharding codec's part:
the shard index and the inner chunks. They reference each other (a shard's
index and inner chunks are chains, a chain may end in a shard), so they live
in one module.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec
from zarr.buffer.cpu import numpy_buffer_prototype
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.sharding import ShardingCodec
from zarr.dtype import UInt64

from .._zarr_compat import ArrayConfig, ArraySpec, bytes_codec_endian, codec_decoder, shard_index_at_start
from .direct import DecodeFailure, DirectDecode, check_blosc_frame, is_blosc

__all__ = [
    "ABSENT",
    "CONFIG",
    "Chain",
    "INDEX_HALF_EMPTY",
    "INDEX_OK",
    "INDEX_OUTSIDE",
    "PROTOTYPE",
    "ShardStage",
    "fill_value_of",
    "partial_shards",
]

# Shard-index entry of an inner chunk that was never written (zarr sharding spec).
ABSENT = 2**64 - 1
# What ``ShardStage.read_index`` says of each entry.
INDEX_OK, INDEX_HALF_EMPTY, INDEX_OUTSIDE = 0, 1, 2
# Decode into host numpy memory whatever zarr's configured default buffer is.
PROTOTYPE = numpy_buffer_prototype()
CONFIG = ArrayConfig(order="C", write_empty_chunks=False)


def fill_value_of(spec: ArraySpec) -> Any:
    """What a chunk the store lacks reads as, for this spec."""
    # zarr v2 allows a null fill value; zarr then reads missing chunks as the dtype default.
    return spec.dtype.default_scalar() if spec.fill_value is None else spec.fill_value


def _stage(codec: Any) -> Callable[[np.ndarray, ArraySpec], np.ndarray]:
    """One codec's decode as ``numpy -> numpy``, with no event loop."""
    if is_blosc(codec):
        decode = codec_decoder(codec)

        def checked(a: np.ndarray, spec: ArraySpec) -> np.ndarray:
            check_blosc_frame(a)
            return decode(a, spec)

        return checked
    return codec_decoder(codec)


def _run(
    codec: Any, decode: Callable[[np.ndarray, ArraySpec], np.ndarray], data: np.ndarray, spec: ArraySpec
) -> np.ndarray:
    try:
        return decode(data, spec)
    except DecodeFailure:
        raise
    except Exception as exc:  # every codec has its own failure types
        raise DecodeFailure(f"{type(codec).__name__} failed: {exc}") from exc


class Chain:
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
        self._array_bytes = ShardStage(ab, spec) if isinstance(ab, ShardingCodec) else _stage(ab)
        spec = ab.resolve_metadata(spec)
        self._bytes_bytes = []
        for bb in bytes_bytes:
            self._bytes_bytes.append((bb, _stage(bb), spec))
            spec = bb.resolve_metadata(spec)
        # Raw size of the array→bytes input for fixed-size serializers (the `bytes` codec).
        raw = self._array_bytes_spec
        self._raw_nbytes = math.prod(raw.shape) * raw.dtype.to_native_dtype().itemsize
        self._direct = self._direct_stage()

    @property
    def direct(self) -> DirectDecode | None:
        """The numcodecs stage that decodes a chunk straight into its output, where one alone suffices."""
        return self._direct

    def _direct_stage(self) -> DirectDecode | None:
        """The compressor to decode straight into a caller's buffer, when the chain is just that."""
        codec = self._array_bytes_codec
        if self._array_array or len(self._bytes_bytes) != 1 or type(codec) is not BytesCodec:
            return None
        if bytes_codec_endian(codec) not in (None, sys.byteorder):
            return None
        if self.dtype.hasobject or not self.dtype.isnative:
            return None
        return DirectDecode.of(self._bytes_bytes[0][0])

    def decode_into(self, raw: np.ndarray, out: np.ndarray) -> None:
        """Decode into ``out`` (this chain's shape, C-contiguous, writeable)."""
        if self._direct is not None and out.dtype == self.dtype and self._direct(raw, out):
            return
        if isinstance(self._array_bytes, ShardStage) and not self._array_array and not self._bytes_bytes:
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
        if isinstance(self._array_bytes, ShardStage):
            data = self._array_bytes(data)
        else:
            if getattr(self._array_bytes_codec, "is_fixed_size", False) and data.nbytes != self._raw_nbytes:
                raise DecodeFailure(f"decoded {data.nbytes} bytes, expected {self._raw_nbytes}")
            data = _run(self._array_bytes_codec, self._array_bytes, data, self._array_bytes_spec)
        for codec, decode, spec in reversed(self._array_array):
            data = _run(codec, decode, data, spec)
        if data.shape != self.shape:
            raise DecodeFailure(f"decoded shape {data.shape}, expected {self.shape}")
        return data


class ShardStage:
    """The sharding codec's decode: index, then each present inner chunk into its place."""

    def __init__(self, codec: ShardingCodec, spec: ArraySpec) -> None:
        self.shape = tuple(spec.shape)
        self.dtype = spec.dtype.to_native_dtype()
        self.fill = fill_value_of(spec)
        self.inner_shape = tuple(codec.chunk_shape)
        self.grid = tuple(s // c for s, c in zip(self.shape, self.inner_shape))
        index_spec = ArraySpec(
            shape=(*self.grid, 2),
            dtype=UInt64(endianness="little"),
            fill_value=ABSENT,
            config=CONFIG,
            prototype=PROTOTYPE,
        )
        self._index = Chain(codec.index_codecs, index_spec)
        self.index_nbytes = self._index.encoded_nbytes()
        self.index_at_start = shard_index_at_start(codec)
        inner_spec = ArraySpec(
            shape=self.inner_shape, dtype=spec.dtype, fill_value=spec.fill_value, config=CONFIG, prototype=PROTOTYPE
        )
        self._inner = Chain(codec.codecs, inner_spec)

    @property
    def inner_chain(self) -> Chain:
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
            raise DecodeFailure(f"shard index is {raw.size} bytes, expected {self.index_nbytes}")
        try:
            index = self._index(raw)
        except DecodeFailure as exc:
            raise DecodeFailure(f"shard index: {exc}") from exc.__cause__
        offsets, lengths = index[..., 0].copy(), index[..., 1].copy()
        absent = offsets == ABSENT
        problems = np.full(offsets.shape, INDEX_OK, dtype=np.uint8)
        problems[absent != (lengths == ABSENT)] = INDEX_HALF_EMPTY
        lo = self.index_nbytes if self.index_at_start else 0
        outside = ~absent & (lengths != ABSENT) & ((offsets < lo) | (lengths > ABSENT - offsets))
        problems[outside] = INDEX_OUTSIDE
        return offsets, lengths, problems

    def _read_index(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = raw.size
        if n < self.index_nbytes:
            raise DecodeFailure(f"shard is {n} bytes, shorter than its {self.index_nbytes}-byte index")
        if self.index_at_start:
            index_raw, lo, hi = raw[: self.index_nbytes], self.index_nbytes, n
        else:
            index_raw, lo, hi = raw[n - self.index_nbytes :], 0, n - self.index_nbytes
        try:
            index = self._index(index_raw)
        except DecodeFailure as exc:
            raise DecodeFailure(f"shard index: {exc}") from exc.__cause__
        offsets, lengths = index[..., 0], index[..., 1]
        absent = offsets == ABSENT
        if not np.array_equal(absent, lengths == ABSENT):
            where = tuple(int(i) for i in np.argwhere(absent != (lengths == ABSENT))[0])
            raise DecodeFailure(f"shard index entry {where} is half empty")
        # Every present inner chunk must lie in the data region [lo, hi) of the shard.
        outside = ~absent & ((offsets < lo) | (offsets > hi) | (lengths > hi - np.minimum(offsets, hi)))
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            raise DecodeFailure(
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
            except DecodeFailure as exc:
                raise DecodeFailure(f"inner chunk {tuple(int(i) for i in where)}: {exc}") from exc.__cause__


def partial_shards(metadata: Any) -> bool:
    """Whether a sharded array's inner chunks can be read alone: the sharding codec is its only codec.

    An array→array codec before it, or a bytes→bytes codec after it (the
    whole shard compressed again), leaves whole-shard reads only.
    """
    codecs: tuple[Any, ...] = tuple(getattr(metadata, "codecs", ()))
    return len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
