"""Per-array records of a pass: how one array path's reads are fetched, and a tile that failed."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..io.geometry import ArrayGeometry
from ..transforms import ChunkTransform, output_geometry, stage_outputs

__all__ = ["ArrayReader", "BadChunkRecord"]


@dataclass(frozen=True)
class BadChunkRecord:
    """A tile that failed to decode under ``on_bad_chunk="nan"``."""

    array: str
    chunk_index: int
    inner_coord: tuple[int, ...]


@dataclass
class ArrayReader:
    """Everything the driver needs to fetch, decode and transform one array path's reads.

    ``output`` is the geometry after chunk transforms: what entries hold and
    gather copies. With a pipeline on a multi-tile chunk, tiles are assembled
    into one scratch chunk before the transforms run.
    """

    geometry: ArrayGeometry
    pipeline: tuple[ChunkTransform, ...]
    stages: list
    output: ArrayGeometry
    origins: np.ndarray
    tile_shapes: np.ndarray

    @classmethod
    def build(cls, geometry: ArrayGeometry, pipeline: Sequence[ChunkTransform]) -> ArrayReader:
        pipeline = tuple(pipeline)
        out = output_geometry(geometry, pipeline)
        if geometry.tiles_per_chunk == 1:
            origins = np.zeros((1, len(out.inner_shape)), dtype=np.intp)
        else:
            origins = geometry.tile_origins()
        return cls(geometry, pipeline, stage_outputs(pipeline, geometry), out, origins, geometry.tile_shapes())

    @property
    def assembles(self) -> bool:
        return bool(self.pipeline) and self.geometry.tiles_per_chunk > 1

    @property
    def single(self) -> bool:
        """Whether a ready entry holds one tile spanning the whole (post-transform) field."""
        return self.geometry.tiles_per_chunk == 1 or self.assembles

    @property
    def single_origin(self) -> np.ndarray:
        return np.zeros((1, len(self.output.inner_shape)), dtype=np.intp)

    def entry_tile_shapes(self, chunk_index: int) -> list[tuple[int, ...]]:
        """The real shape of each tile a ready entry of ``chunk_index`` holds."""
        n = self.geometry.chunk_len(chunk_index)
        if self.single:
            return [(n, *self.output.inner_shape)]
        return [(n, *shape) for shape in self.tile_shapes.tolist()]

    def stored_tile_shape(self, n_tiles: int) -> tuple[int, ...]:
        """The full (unclipped) tile shape of a tile file."""
        size = self.geometry.sample_chunk_size
        if n_tiles == 1 and self.single:
            return (size, *self.output.inner_shape)
        return (size, *self.geometry.inner_stored_chunks)

    def selection(self, chunk_index: int, tile: int) -> tuple[slice, ...]:
        """Where a decoded stored chunk's valid data sits (edge chunks are clipped), physical order."""
        inner = self._inner_selections[tile]
        axis = self.geometry.sample_axis
        return (*inner[:axis], slice(0, self.geometry.chunk_len(chunk_index)), *inner[axis:])

    def tile_rows_shape(self, chunk_index: int, tile: int) -> tuple[int, ...]:
        """A decoded tile's shape, sample axis first: the chunk's samples by the tile's clipped inner extent."""
        return (self.geometry.chunk_len(chunk_index), *self._tile_shapes[tile])

    @functools.cached_property
    def _tile_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(shape) for shape in self.tile_shapes.tolist()]

    @functools.cached_property
    def _inner_selections(self) -> list[tuple[slice, ...]]:
        return [tuple(slice(0, int(e)) for e in shape) for shape in self.tile_shapes]

    def ready_origins(self) -> np.ndarray:
        return self.single_origin if self.single else self.origins


def _fill_value(geometry: ArrayGeometry):
    if geometry.dtype.kind in "fc":
        return np.nan
    return geometry.fill_value if geometry.fill_value is not None else 0
