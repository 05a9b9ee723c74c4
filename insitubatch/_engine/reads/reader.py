"""Per-array records of a pass: how one array path's reads are fetched, and a tile that failed."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...io.geometry import ArrayGeometry
from ...transforms import ChunkTransform, output_geometry, stage_outputs
from .pieces import ReadLayout, plan_reads

__all__ = ["ArrayReader", "BadChunkRecord", "fill_value_of"]


@dataclass(frozen=True)
class BadChunkRecord:
    """A tile that failed to decode under ``on_bad_chunk="nan"``."""

    array: str
    chunk_index: int
    inner_coord: tuple[int, ...]


@dataclass
class ArrayReader:
    """Everything the driver needs to fetch, decode and transform one read source's chunks.

    ``geometry`` is the source: an array path and its selection (no offset).
    ``layout`` lists the tiles each sample-axis chunk reads and the pieces
    its entry holds (the tiles themselves without a selection). ``output``
    is the geometry after chunk transforms: what entries hold and gather
    copies. With a pipeline on a chunk of several pieces, they are assembled
    into one scratch chunk (the selected block) before the transforms run.
    """

    geometry: ArrayGeometry
    pipeline: tuple[ChunkTransform, ...]
    stages: list
    output: ArrayGeometry
    layout: ReadLayout
    origins: np.ndarray  # each piece's origin in the selected field (what a pending entry holds)

    @classmethod
    def build(cls, geometry: ArrayGeometry, pipeline: Sequence[ChunkTransform]) -> ArrayReader:
        pipeline = tuple(pipeline)
        out = output_geometry(geometry, pipeline)
        layout = plan_reads(geometry)
        return cls(geometry, pipeline, stage_outputs(pipeline, geometry), out, layout, layout.origins())

    @property
    def source(self) -> str:
        """The pool and disk-cache name of this reader's chunks (``ArrayGeometry.source``)."""
        return self.geometry.source

    @property
    def n_tiles(self) -> int:
        """Tiles (GETs) one sample-axis chunk reads: those the selection touches."""
        return self.layout.n_tiles

    @property
    def assembles(self) -> bool:
        return bool(self.pipeline) and self.layout.n_pieces > 1

    @property
    def single(self) -> bool:
        """Whether a ready entry holds one array spanning the whole (selected, post-transform) field."""
        return self.layout.n_pieces == 1 or self.assembles

    @property
    def single_origin(self) -> np.ndarray:
        return np.zeros((1, len(self.output.inner_shape)), dtype=np.intp)

    def entry_tile_shapes(self, chunk_index: int) -> list[tuple[int, ...]]:
        """The real shape of each array a ready entry of ``chunk_index`` holds."""
        n = self.geometry.chunk_len(chunk_index)
        if self.single:
            return [(n, *self.output.inner_shape)]
        return [(n, *p.shape) for p in self.layout.pieces]

    def stored_tile_shape(self, n_tiles: int) -> tuple[int, ...]:
        """The full (unclipped) shape of one of a tile file's ``n_tiles`` arrays."""
        size = self.geometry.sample_chunk_size
        if n_tiles == 1 and self.single:
            return (size, *self.output.inner_shape)
        return (size, *self._piece_box)

    @functools.cached_property
    def _piece_box(self) -> tuple[int, ...]:
        """Per axis, the largest piece extent (a tile's, without a selection)."""
        if self.layout.identity:
            return self.geometry.tile_shape
        return tuple(int(x) for x in np.max([p.shape for p in self.layout.pieces], axis=0))

    def tile_coord(self, chunk_index: int, k: int) -> tuple[int, ...]:
        """Physical stored-chunk coordinates of read tile ``k`` of a sample-axis chunk."""
        return self.geometry.physical_chunk_coord(chunk_index, self.layout.tiles[k])

    def tile_inner_coord(self, k: int) -> tuple[int, ...]:
        """Read tile ``k``'s coordinates in the field's tile grid."""
        return self.geometry.tile_coord(self.layout.tiles[k])

    def clip(self, chunk_index: int, k: int) -> tuple[slice, ...]:
        """Where read tile ``k``'s valid data sits in its decoded stored chunk (edge chunks are clipped), physical order."""
        inner = self._inner_clips[k]
        axis = self.geometry.sample_axis
        return (*inner[:axis], slice(0, self.geometry.chunk_len(chunk_index)), *inner[axis:])

    def tile_rows_shape(self, chunk_index: int, k: int) -> tuple[int, ...]:
        """Read tile ``k`` decoded, sample axis first: the chunk's samples by the tile's clipped extent."""
        return (self.geometry.chunk_len(chunk_index), *self.layout.tile_shapes[k])

    @functools.cached_property
    def _inner_clips(self) -> list[tuple[slice, ...]]:
        return [tuple(slice(0, int(e)) for e in shape) for shape in self.layout.tile_shapes]

    def ready_origins(self) -> np.ndarray:
        return self.single_origin if self.single else self.origins


def fill_value_of(geometry: ArrayGeometry):
    """What a tile the store lacks (or a bad one) holds: NaN for floats, else the array's fill value or 0."""
    if geometry.dtype.kind in "fc":
        return np.nan
    return geometry.fill_value if geometry.fill_value is not None else 0
