"""Per-batch gather orchestration: build the index table with numpy, copy in C.

For each label, a batch's samples map to (chunk, row) on that label's own
chunk grid; every resident tile of those chunks contributes its rows to
its rectangle of the batch. Python work here is O(chunks x tiles) per batch;
the per-row work is one vectorised table and one ``nogil`` kernel call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from ..io.geometry import ArrayGeometry
from .kernels import coalesce_runs, gather
from .pool import Entry

__all__ = ["gather_label"]


def gather_label(
    out: np.ndarray,
    anchors: np.ndarray,
    geometry: ArrayGeometry,
    entry_of: Callable[[int], Entry],
) -> None:
    """Fill ``out`` (``(len(anchors), *inner)``) with ``geometry``'s samples at ``anchors + offset``.

    ``entry_of(chunk_index)`` returns the ready entry holding that chunk.
    """
    n = len(anchors)
    if n == 0:
        return
    samples = anchors + geometry.offset
    size = geometry.sample_chunk_size
    chunk = samples // size
    within = samples - chunk * size
    unique, inverse = np.unique(chunk, return_inverse=True)
    entries = [entry_of(int(c)) for c in unique]
    n_tiles = entries[0].n_tiles
    # a ready entry holds every tile (None marks only a tile still pending)
    tiles = cast("list[np.ndarray]", [t for s in entries for t in s.tiles])
    origins = np.concatenate([s.origins for s in entries]) if len(entries) > 1 else entries[0].origins
    tile_index = (inverse[:, None] * n_tiles + np.arange(n_tiles)[None, :]).T.ravel()
    src_rows = np.tile(within, n_tiles)
    dst_rows = np.tile(np.arange(n, dtype=np.int64), n_tiles)
    # group rows of one tile together so consecutive rows coalesce into one copy
    order = np.argsort(tile_index, kind="stable")
    runs = coalesce_runs(tile_index[order], src_rows[order], dst_rows[order])
    gather(out, tiles, origins, runs)
