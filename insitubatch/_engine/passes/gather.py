"""Per-batch gather orchestration: build the index table with numpy, copy in C.

For each label, a batch's samples map to (chunk, row) on that label's own
chunk grid; every resident tile of those chunks contributes its rows to
its rectangle of the batch. Python work here is O(chunks x tiles) per batch;
the per-row work is two C calls: the run table (``batch_runs``) and the copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import cast

import numpy as np

from ...io.geometry import ArrayGeometry
from ..pool.chunk_pool import Entry
from ..tiles.kernels import STREAM_MIN_BYTES, batch_runs, gather

__all__ = ["batch_row_bytes", "gather_label", "label_indices", "streams"]


def batch_row_bytes(geometries: Iterable[ArrayGeometry]) -> int:
    """Bytes one sample fills in a batch: its row of every output array (a windowed row holds every step)."""
    return sum(math.prod(g.row_shape) * g.dtype.itemsize for g in geometries)


def streams(batch_bytes: int) -> bool:
    """Whether a batch of ``batch_bytes`` (all its arrays) is written past the caches.

    The consumer reads a batch after its last array is gathered, so what
    decides is the whole batch, not one array's copy: four ERA5-like
    variables of 32 samples are 8.3 MB each (under the 8 MiB of four L2s),
    33 MB together.
    """
    return batch_bytes >= STREAM_MIN_BYTES


def gather_label(
    out: np.ndarray,
    anchors: np.ndarray,
    geometry: ArrayGeometry,
    entry_of: Callable[[int], Entry],
    *,
    stream: bool | None = None,
) -> None:
    """Fill ``out`` (``(len(anchors), *row_shape)``) with ``geometry``'s samples at ``anchors + offset``.

    A windowed view's rows are ``(steps, *inner)``: its samples at every
    ``anchors + offset + step`` are gathered by the same C call straight
    into ``out`` seen as ``(len(anchors) * steps, *inner)``.
    ``entry_of(chunk_index)`` returns the ready entry holding that chunk;
    ``stream``: non-temporal stores (:func:`streams` of the whole batch), or
    ``None`` to decide on this array's bytes.
    """
    if len(anchors) == 0:
        return
    if geometry.time_rows is not None:  # offsets in time on an irregular axis: each anchor's rows, looked up
        samples = geometry.read_rows(anchors).reshape(-1).astype(anchors.dtype, copy=False)
        out = out.reshape(len(samples), *geometry.inner_shape)
    elif geometry.window_steps:
        samples = (anchors[:, None] + np.asarray(geometry.read_offsets, dtype=anchors.dtype)[None, :]).reshape(-1)
        out = out.reshape(len(samples), *geometry.inner_shape)
    else:
        samples = anchors + geometry.offset
    size = geometry.sample_chunk_size
    n_tiles = entry_of(int(samples[0]) // size).n_tiles  # every ready entry of a label holds as many tiles
    chunks, runs = batch_runs(samples, size, n_tiles)
    entries = [entry_of(c) for c in chunks.tolist()]
    # a ready entry holds every tile (None marks only a tile still pending)
    tiles = cast("list[np.ndarray]", [t for e in entries for t in e.tiles])
    # a transformed chunk is one tile of the transform's rank, at the origin of that rank (``ready_origins``)
    origins = np.concatenate([e.origins for e in entries]) if len(entries) > 1 else entries[0].origins
    try:
        gather(out, tiles, origins, runs, stream=stream)
    except ValueError as exc:  # an entry that does not hold what the label's output geometry says: name it
        raise ValueError(
            f"gathering array {geometry.path!r} (source {geometry.source!r}, rows {geometry.row_shape} "
            f"{geometry.dtype}) from chunks {chunks.tolist()}: {exc}"
        ) from exc


def label_indices(geometry: ArrayGeometry, anchors: np.ndarray) -> np.ndarray:
    """The sample-axis indices a label reads for ``anchors``: ``(n,)``, or ``(n, steps)`` when windowed."""
    windowed = bool(geometry.window_steps) if geometry.time_rows is None else geometry.time_rows.windowed
    if geometry.time_rows is None and not windowed:
        return anchors + geometry.offset
    rows = geometry.read_rows(anchors)
    return rows if windowed else rows[:, 0]
