"""Decode straight into the caller's buffer, and the frame checks that make that safe.

numcodecs' blosc, zstd, lz4, gzip and zlib can decompress into an ``out``
buffer; numcodecs accepts one larger than the data and leaves its tail
untouched, so the size each frame declares is checked against ``out`` first
(see ``insitubatch.io.decode``). The blosc frame check is also run before
any generic blosc decode: c-blosc 1.x trusts the header's length.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from numcodecs.blosc import Blosc as _NumcodecsBlosc
from numcodecs.gzip import GZip as _NumcodecsGZip
from numcodecs.lz4 import LZ4 as _NumcodecsLZ4
from numcodecs.zlib import Zlib as _NumcodecsZlib
from numcodecs.zstd import Zstd as _NumcodecsZstd
from zarr.abc.buffer import Buffer
from zarr.codecs.blosc import BloscCodec

from .._zarr_compat import numcodec_behind, wrapped_numcodec

__all__ = ["ChunkData", "DecodeFailure", "DirectDecode", "as_uint8", "check_blosc_frame", "is_blosc"]

ChunkData = bytes | bytearray | memoryview | np.ndarray | Buffer


# The c-blosc 1.x frame header that numcodecs' Blosc writes: version,
# versionlz, flags, typesize (one byte each), then nbytes, blocksize and cbytes
# (uint32, little-endian). A flag marks a frame stored uncompressed.
_BLOSC_HEADER = struct.Struct("<BBBBIII")
_BLOSC_MEMCPYED = 0x02


class DecodeFailure(Exception):
    """A decode stage failed, inside the decoders; ``ChunkDecoder`` raises it as a ``BadChunkError`` naming array, chunk and key."""


def is_blosc(codec: Any) -> bool:
    return isinstance(codec, (BloscCodec, _NumcodecsBlosc)) or isinstance(wrapped_numcodec(codec), _NumcodecsBlosc)


def check_blosc_frame(data: Any) -> None:
    """Refuse a blosc frame whose header disagrees with its length, before blosc reads it.

    c-blosc 1.x takes the header's word for the frame's size: it reads
    ``cbytes`` bytes of source however long the buffer is, so a truncated
    chunk comes back as data with garbage (or zeros) in its tail, and an empty
    or very short one is read past its end, which can crash the process.
    """
    raw = as_uint8(data)
    n = raw.nbytes
    if n < _BLOSC_HEADER.size:
        raise DecodeFailure(f"blosc frame is {n} bytes, shorter than its {_BLOSC_HEADER.size}-byte header")
    _, _, flags, _, nbytes, _, cbytes = _BLOSC_HEADER.unpack_from(raw.data)
    if cbytes != n:
        raise DecodeFailure(f"blosc header says the frame is {cbytes} bytes, the chunk holds {n}")
    if flags & _BLOSC_MEMCPYED and nbytes + _BLOSC_HEADER.size != cbytes:
        raise DecodeFailure(f"blosc header says {nbytes} bytes are stored uncompressed in a {cbytes}-byte frame")


# zstd frame header (RFC 8878 §3.1.1): magic, then a descriptor byte whose top two
# bits size the frame-content-size field, bit 5 marks a single segment (no window
# byte) and the low two bits size the dictionary id.
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_FCS_BYTES = (0, 2, 4, 8)
_ZSTD_DICT_BYTES = (0, 1, 2, 4)
# gzip members end in ISIZE: the uncompressed length modulo 2**32 (RFC 1952 §2.3.1).
_GZIP_MIN_BYTES = 18


def _zstd_content_size(raw: np.ndarray) -> int | None:
    """The decompressed size a zstd frame header declares; None when absent or unreadable."""
    if raw.nbytes < 6 or int.from_bytes(raw[:4].tobytes(), "little") != _ZSTD_MAGIC:
        return None
    fhd = int(raw[4])
    single = bool(fhd & 0x20)
    fcs_code = fhd >> 6
    size = _ZSTD_FCS_BYTES[fcs_code] or (1 if single else 0)
    if size == 0:
        return None
    pos = 5 + (0 if single else 1) + _ZSTD_DICT_BYTES[fhd & 0x03]
    if raw.nbytes < pos + size:
        return None
    value = int.from_bytes(raw[pos : pos + size].tobytes(), "little")
    return value + 256 if size == 2 else value


def _declared_size(codec: Any, raw: np.ndarray) -> int | None:
    """What the frame says it decompresses to; None when it does not say (then no direct decode)."""
    if isinstance(codec, _NumcodecsBlosc):
        check_blosc_frame(raw)
        return _BLOSC_HEADER.unpack_from(raw.data)[4]
    if isinstance(codec, _NumcodecsZstd):
        return _zstd_content_size(raw)
    if isinstance(codec, _NumcodecsLZ4):
        return int.from_bytes(raw[:4].tobytes(), "little") if raw.nbytes >= 4 else None
    if isinstance(codec, _NumcodecsGZip):
        return int.from_bytes(raw[-4:].tobytes(), "little") if raw.nbytes >= _GZIP_MIN_BYTES else None
    return None  # zlib: numcodecs itself refuses an ``out`` of any other size


_DIRECT_CODECS = (_NumcodecsBlosc, _NumcodecsZstd, _NumcodecsLZ4, _NumcodecsGZip, _NumcodecsZlib)


class DirectDecode:
    """One numcodecs compressor that decompresses straight into the caller's buffer."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.sized = not isinstance(codec, _NumcodecsZlib)

    @staticmethod
    def of(codec: Any) -> DirectDecode | None:
        inner = numcodec_behind(codec)
        return DirectDecode(inner) if isinstance(inner, _DIRECT_CODECS) else None

    def __call__(self, raw: np.ndarray, out: np.ndarray) -> bool:
        """Decode ``raw`` into ``out`` (C-contiguous); False, untouched, unless the frame declares out's size.

        A frame of another (or no) declared size goes the generic way, which
        decodes it whole and refuses it by its real size (or takes a frame
        layout this check does not know, such as several zstd frames).
        """
        dest = out.reshape(-1).view(np.uint8)
        if self.sized:
            expected = dest.nbytes % 2**32 if isinstance(self.codec, _NumcodecsGZip) else dest.nbytes
            if _declared_size(self.codec, raw) != expected:
                return False
        try:
            self.codec.decode(raw, out=dest)
        except Exception as exc:  # every codec has its own failure types
            raise DecodeFailure(f"{type(self.codec).__name__} failed: {exc}") from exc
        return True


def as_uint8(data: ChunkData) -> np.ndarray:
    """A flat uint8 view of the chunk bytes (no copy for host memory)."""
    if isinstance(data, Buffer):
        return data.as_numpy_array().reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)
