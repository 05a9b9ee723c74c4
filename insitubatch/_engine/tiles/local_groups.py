"""A local store's tile group read and decoded in one call, the GIL released once (``_ext/tilegroup``).

A decode thread reading a local directory tile by tile releases and takes
back the GIL five times per tile (open, fstat, read, close, decode); on small
tiles those hand-overs, not the codec, set the pace. ``LocalGroups`` sends
the tiles that allow it — a plain key of a zstd or blosc array whose tiles
are sample-first — through the kernel in one call: a full tile is decoded
straight into its own memory, an edge tile into a per-thread chunk whose
leading block is copied. Every other tile, and any tile the kernel hands back
(a missing or unreadable file, a frame that does not declare the chunk's
size), takes the general path, which reads, raises or falls back exactly as
before. ``decode_buffer`` is the same kernel for one tile whose bytes are
already in memory (a network store's), ``decode_group`` for a batch of them
(a network store's tiles that landed together).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import numcodecs.blosc
import numcodecs.zstd
import numpy as np

import insitubatch._ext.tilegroup as _tilegroup

from ...io.decode import ChunkDecoder
from ...stores.local_files import LocalFiles

__all__ = ["MAX_TILE_GROUP", "PLACED", "LocalGroups", "decode_buffer", "decode_group", "kernel_kind", "tile_group"]

PLACED: int = _tilegroup.PLACED

# the kernel's codec kinds, and the numcodecs extension whose exported entry points it calls
_ZSTD, _BLOSC = 1, 2

# most tiles one decode job reads, decodes and places on a store with a synchronous get
# (``tile_group``): a group costs the loop one submit and one wake-up, and on small tiles
# 8 beat 4 by ~10% and 16 added nothing (bench.engine_probe, 64 kB zstd tiles)
MAX_TILE_GROUP = 8


def tile_group(max_inflight: int, decode_threads: int) -> int:
    """Tiles per job on a synchronous store: every decode thread keeps two groups of the permits in flight.

    One decoding and one queued, so no thread waits for the loop; never more than ``MAX_TILE_GROUP``.
    """
    return max(1, min(MAX_TILE_GROUP, max_inflight // (2 * max(decode_threads, 1))))


_KINDS = {numcodecs.zstd.Zstd: (_ZSTD, numcodecs.zstd), numcodecs.blosc.Blosc: (_BLOSC, numcodecs.blosc)}
_bind_lock = threading.Lock()
# a file read into the scratch buffer may be this much larger than its decoded tile
# (zstd's worst case is ~1/256 over, blosc's 16 bytes, plus a frame header)
_SCRATCH_SLACK = 1 / 128
_SCRATCH_MIN_EXTRA = 4096
_SCRATCH_MAX_GROWTH = 4


def kernel_kind(decoder: ChunkDecoder) -> int:
    """The kernel's codec kind for an array's chunks, or 0 when they go the general way."""
    entry = _KINDS.get(type(decoder.direct_codec))
    if entry is None or not 1 <= len(decoder.shape) <= _tilegroup.MAX_DIMS:
        return 0
    kind, module = entry
    with _bind_lock:
        if not _tilegroup.bound(kind) and not _tilegroup.bind(kind, os.fsencode(module.__file__)):
            return 0  # this numcodecs build does not export the entry points
    return kind


class LocalGroups:
    """The kernel's side of one pass over a local directory: which arrays qualify, and each thread's buffer."""

    def __init__(self, files: LocalFiles, decoders: Mapping[str, ChunkDecoder], kinds: Mapping[str, int]) -> None:
        """``kinds``: the arrays whose tiles the kernel reads, by path, with their ``kernel_kind``."""
        self.files = files
        self.kinds = dict(kinds)
        chunk_bytes = max((decoders[p].dtype.itemsize * int(np.prod(decoders[p].shape)) for p in self.kinds), default=0)
        self._capacity = int(chunk_bytes * (1 + _SCRATCH_SLACK)) + _SCRATCH_MIN_EXTRA
        # a file larger than this (a chunk stored uncompressible and padded, or not a chunk at all) goes the
        # general way rather than growing every decode thread's buffer without bound
        self._max_capacity = _SCRATCH_MAX_GROWTH * self._capacity
        self._whole_bytes = chunk_bytes  # an edge tile's whole stored chunk decodes here before its block is copied
        self._local = threading.local()

    def run(
        self, kind: int, paths: list[bytes], dests: list[np.ndarray], stored: list[tuple[int, ...]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read and decode ``paths[i]`` into ``dests[i]``: ``(status, file bytes, [read_ns, decode_ns])``.

        ``stored[i]`` is the tile's stored chunk shape; a smaller ``dests[i]``
        (an edge tile) gets the chunk's leading block. ``status[i]`` is 0 for a
        placed tile; any other leaves ``dests[i]`` untouched for the general path.
        """
        local = self._local
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = np.empty(self._capacity, dtype=np.uint8)
            local.whole = np.empty(self._whole_bytes, dtype=np.uint8)
        n = len(paths)
        status = np.empty(n, dtype=np.int32)
        nbytes = np.zeros(n, dtype=np.int64)
        times = np.zeros(2, dtype=np.int64)
        shapes = np.array(stored, dtype=np.int64).reshape(n, -1)
        _tilegroup.read_decode(kind, paths, dests, shapes, scratch, local.whole, status, nbytes, times)
        if (status == _tilegroup.GROW).any() and len(scratch) < self._max_capacity:  # a bigger buffer next time
            local.scratch = np.empty(min(2 * len(scratch), self._max_capacity), dtype=np.uint8)
        return status, nbytes, times


def decode_buffer(kind: int, raw: np.ndarray, dest: np.ndarray, stored: tuple[int, ...], whole: np.ndarray) -> int:
    """Decompress one chunk's bytes (a flat uint8 array) into ``dest``, GIL released; ``PLACED`` when done.

    For a tile whose bytes came over the network: the frame checks, the
    decompression and an edge tile's copy out of ``whole`` (a uint8 buffer of
    at least the chunk's bytes) in one C call. Any other status leaves
    ``dest`` untouched for the general path.
    """
    return _tilegroup.decode_buffer(kind, raw, dest, np.asarray(stored, dtype=np.int64), whole)


def decode_group(
    kind: int, raws: list[np.ndarray], dests: list[np.ndarray], stored: list[tuple[int, ...]], whole: np.ndarray
) -> tuple[np.ndarray, int]:
    """Decompress ``raws[i]`` (flat uint8 arrays) into ``dests[i]``, GIL released once: ``(status, decode_ns)``.

    ``decode_buffer`` for a batch: ``stored[i]`` is the tile's stored chunk
    shape (one rank for the batch), ``whole`` a uint8 buffer of at least the
    largest chunk's bytes for the edge tiles. ``status[i]`` is ``PLACED``
    for a placed tile; any other leaves ``dests[i]`` untouched for the general path.
    """
    n = len(raws)
    status = np.empty(n, dtype=np.int32)
    times = np.zeros(1, dtype=np.int64)
    _tilegroup.decode_group(kind, raws, dests, np.array(stored, dtype=np.int64).reshape(n, -1), whole, status, times)
    return status, int(times[0])
