"""What one read source takes from each sample-axis chunk: the tiles a selection touches, cut into pieces.

Without a selection a chunk's entry holds its tiles as decoded (a piece is
a tile). With one, only the tiles the selection touches are read, and each
is cut, once per chunk and in C (``kernels.select_block``), into *pieces*:
blocks that are contiguous in the selected field (``geometry.inner_shape``)
and sit at an origin there. The entry then holds the pieces, so residency,
the disk cache and the gather all see only selected data, and the gather
copies pieces into the batch as it copies tiles: rectangles at origins.

A tile yields one piece per combination of its axes' runs of consecutive
output positions: one for slices and sorted lists (any step, reversed,
across a periodic seam), more only for a list whose order interleaves tiles.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ...io.geometry import ArrayGeometry

__all__ = ["MAX_PIECES", "Piece", "ReadLayout", "plan_reads"]

# Most pieces one chunk of a source may be cut into: each costs a kernel call and a
# pool array per chunk. A list of labels in an order that interleaves tiles on two
# axes multiplies runs; past this, sort the list (the batch axis order follows it).
MAX_PIECES = 4096


@dataclass(frozen=True, eq=False)
class Piece:
    """One contiguous block of the selected field, cut from read tile ``tile``.

    ``offsets[starts[j]:starts[j] + shape[j]]`` are the byte offsets, in a
    C-contiguous ``(rows, *tile_shape)`` tile, of kept axis ``j``'s positions;
    ``fixed`` adds the dropped axes' offset; ``last_run`` marks a last axis
    copied as one run.
    """

    tile: int
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    offsets: np.ndarray
    starts: np.ndarray
    fixed: int
    last_run: bool
    reach: int  # bytes past a row's start the copy reads up to (exclusive): checked against the tile's row

    @property
    def extents(self) -> np.ndarray:
        return np.asarray(self.shape, dtype=np.intp)


@dataclass(frozen=True, eq=False)
class ReadLayout:
    """The tiles a source reads of every sample-axis chunk, and the pieces its entries hold."""

    tiles: tuple[int, ...]  # indices into the geometry's full tile grid, C order
    tile_shapes: tuple[tuple[int, ...], ...]  # each read tile's clipped field extent
    pieces: tuple[Piece, ...]
    by_tile: tuple[tuple[int, ...], ...]  # per read tile: its pieces' indices
    identity: bool  # no selection: piece k is read tile k, as decoded

    @property
    def n_tiles(self) -> int:
        return len(self.tiles)

    @property
    def n_pieces(self) -> int:
        return len(self.pieces)

    def origins(self) -> np.ndarray:
        """``(n_pieces, len(inner_shape))`` origin of each piece in the selected field."""
        n_axes = len(self.pieces[0].origin) if self.pieces else 0
        return np.asarray([p.origin for p in self.pieces], dtype=np.intp).reshape(len(self.pieces), n_axes)


def _runs(positions: np.ndarray) -> list[np.ndarray]:
    """``positions`` (ascending output positions) split where they stop being consecutive."""
    cut = np.flatnonzero(np.diff(positions) != 1) + 1
    return np.split(positions, cut)


def _axis_runs(g: ArrayGeometry, field_axis: int, physical: int) -> dict[int, list[tuple[int, np.ndarray] | int]]:
    """Per touched tile coordinate on one field axis: its runs ``(output start, local indices)``, or a dropped index."""
    size, length = g.tile_shape[field_axis], g.field_shape[field_axis]
    picked = next((a for a in g.selection if a.axis == physical), None)
    out: dict[int, list[tuple[int, np.ndarray] | int]] = {}
    if picked is None:
        for t in range(-(-length // size)):
            out[t] = [(t * size, np.arange(min(size, length - t * size), dtype=np.int64))]
        return out
    idx = picked.array.astype(np.int64)
    tiles = idx // size
    for t in np.unique(tiles).tolist():
        if picked.drop:
            out[t] = [int(idx[0] - t * size)]
            continue
        positions = np.flatnonzero(tiles == t)
        out[t] = [(int(run[0]), idx[run] - t * size) for run in _runs(positions)]
    return out


def plan_reads(g: ArrayGeometry) -> ReadLayout:
    """The tiles ``g``'s selection touches and the pieces they are cut into (identity without a selection).

    Raises
    ------
    ValueError
        The selection would cut a chunk into more than ``MAX_PIECES`` pieces.
    """
    grid = g.tile_grid
    all_shapes = [tuple(int(x) for x in s) for s in g.tile_shapes().tolist()]
    if not g.selection:
        origins = [tuple(int(x) for x in o) for o in g.tile_origins().tolist()]
        whole = tuple(
            Piece(t, origins[t], all_shapes[t], np.empty(0, np.int64), np.empty(0, np.intp), 0, True, 0)
            for t in range(g.tiles_per_chunk)
        )
        return ReadLayout(
            tuple(range(g.tiles_per_chunk)), tuple(all_shapes), whole, tuple((t,) for t in range(len(whole))), True
        )
    field_axes = [k for k in range(g.ndim) if k != g.sample_axis]
    per_axis = [_axis_runs(g, j, k) for j, k in enumerate(field_axes)]
    itemsize = g.itemsize
    tiles: list[int] = []
    shapes: list[tuple[int, ...]] = []
    pieces: list[Piece] = []
    by_tile: list[tuple[int, ...]] = []
    for coord in itertools.product(*(sorted(runs) for runs in per_axis)):
        t = int(np.ravel_multi_index(coord, grid)) if grid else 0
        shape = all_shapes[t]
        strides = [itemsize * math.prod(shape[j + 1 :]) for j in range(len(shape))]
        mine: list[int] = []
        for combo in itertools.product(*(per_axis[j][c] for j, c in enumerate(coord))):
            origin, extent, tables, fixed = [], [], [], 0
            for j, run in enumerate(combo):
                if isinstance(run, int):  # a dropped axis
                    fixed += run * strides[j]
                    continue
                start, local = run
                origin.append(start)
                extent.append(len(local))
                tables.append(local * strides[j])
            offsets = np.concatenate(tables).astype(np.int64) if tables else np.empty(0, np.int64)
            starts = np.concatenate([[0], np.cumsum(extent[:-1])]).astype(np.intp) if extent else np.empty(0, np.intp)
            last = tables[-1] if tables else None
            last_run = last is not None and bool(np.all(np.diff(last) == itemsize))
            reach = fixed + sum(int(t.max()) for t in tables) + itemsize
            mine.append(len(pieces))
            pieces.append(Piece(len(tiles), tuple(origin), tuple(extent), offsets, starts, fixed, last_run, reach))
            if len(pieces) > MAX_PIECES:
                raise ValueError(
                    f"array {g.path!r}: the selection {g.source!r} cuts each chunk into more than {MAX_PIECES} "
                    "pieces (a list of positions whose order interleaves tiles); sort the list"
                )
        tiles.append(t)
        shapes.append(shape)
        by_tile.append(tuple(mine))
    return ReadLayout(tuple(tiles), tuple(shapes), tuple(pieces), tuple(by_tile), False)
