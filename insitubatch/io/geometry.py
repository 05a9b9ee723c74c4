"""What the engine knows about one zarr array: shape, stored-chunk grid, sample axis.

``ArrayGeometry`` is the single place that maps between the logical view the
engine works in (sample axis first) and zarr's physical axis order and keys.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._zarr_compat import ArrayV2Metadata, ArrayV3Metadata, ChunkProjection
from ..errors import CalendarError, IrregularTimeWarning, TimeAxisError
from .coords import CoordinateSource
from .labelled import Labelled
from .selection import AxisSelection
from .time_offsets import StepAxis, TimeRows, in_time, is_duration, mixed_offsets, parse_duration, sample_time_axis

__all__ = ["ArrayGeometry", "ceil_div", "normalize_axis", "sample_coords"]

logger = logging.getLogger("insitubatch")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ArrayGeometry(Labelled):
    """Shape and chunking of one zarr array, seen along one sample axis.

    ``shape``, ``chunks`` and ``stored_chunks`` are in physical (zarr) axis
    order. ``chunks`` is zarr's read chunk; ``stored_chunks`` is what one store
    key holds (the shard on a sharded array, else ``chunks``). The engine
    reads ``tile_chunks`` at a time ("tiles"): ``read_chunks`` when set (the
    inner chunk of a shard, fetched by byte range), else whole stored chunks. ``offset`` makes a windowed view:
    sample ``i`` of the view reads ``array[i + offset]`` along the sample axis.
    ``selection`` keeps some positions of field axes (``isel`` / ``sel``): a
    sample is then ``inner_shape``, the selected part of ``field_shape``, and
    only the tiles it touches are read.
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    stored_chunks: tuple[int, ...]
    dtype: np.dtype
    # not compared: a NaN fill is unequal to itself, and Python 3.13's dataclass __eq__ compares field by field
    # (no identity shortcut), so a view would never equal itself; the array it reads decides the fill anyway
    fill_value: Any = field(compare=False)
    sample_axis: int = 0
    offset: int = 0
    zarr_format: int = 3
    dimension_names: tuple[str | None, ...] | None = None
    metadata: ArrayV2Metadata | ArrayV3Metadata | None = field(default=None, compare=False, repr=False, hash=False)
    # where this array's coordinate arrays are read from (set by ``open_geometries``)
    coords: CoordinateSource | None = field(default=None, compare=False, repr=False, hash=False)
    selection: tuple[AxisSelection, ...] = ()
    # steps of a native window: sample i reads array[i + offset + s] for each s, as one (steps, *inner) row
    window_steps: tuple[int, ...] = ()
    # the engine's read unit when it is not the stored chunk: a shard's inner chunk, read by byte range
    read_chunks: tuple[int, ...] = ()
    # the read source of a geometry made by a reshaping chunk transform: what its rows come from
    origin: str | None = field(default=None, compare=False, repr=False, hash=False)
    # offsets in time on an irregular time axis: each anchor's read index per step (``io.time_offsets``);
    # ``offset``/``window_steps`` then hold the nominal steps a batch reports
    time_rows: TimeRows | None = field(default=None, repr=False)

    # -- sample axis -----------------------------------------------------
    @functools.cached_property
    def n_samples(self) -> int:
        """Length of the array along the sample axis."""
        return self.shape[self.sample_axis]

    @functools.cached_property
    def tile_chunks(self) -> tuple[int, ...]:
        """What one tile read holds, physical order: ``read_chunks`` (a shard's inner chunk) or the stored chunk."""
        return self.read_chunks or self.stored_chunks

    @property
    def sharded_reads(self) -> bool:
        """Whether tiles are inner chunks of shards, each fetched by byte range after the shard's index."""
        return self.tile_chunks != self.stored_chunks

    @property
    def reads_per_stored_chunk(self) -> int:
        """Read chunks per stored chunk along the sample axis: a sharded array's inner chunks per shard, else 1."""
        if not self.sharded_reads:
            return 1
        return max(1, self.stored_chunks[self.sample_axis] // self.tile_chunks[self.sample_axis])

    @functools.cached_property
    def sample_chunk_size(self) -> int:
        """Samples per tile along the sample axis: the chunk grid splits, blocks and the pool work in."""
        return self.tile_chunks[self.sample_axis]

    @functools.cached_property
    def n_chunks(self) -> int:
        """Number of stored chunks along the sample axis (the last may be partial)."""
        return ceil_div(self.n_samples, self.sample_chunk_size)

    def chunk_len(self, chunk_index: int) -> int:
        """Samples the sample-axis chunk ``chunk_index`` really holds (edge chunks are short)."""
        if not 0 <= chunk_index < self.n_chunks:
            raise ValueError(f"{chunk_index=} is outside [0, {self.n_chunks}) for array {self.path!r}")
        return min(self.sample_chunk_size, self.n_samples - chunk_index * self.sample_chunk_size)

    # -- field (inner) axes ---------------------------------------------
    @functools.cached_property
    def field_shape(self) -> tuple[int, ...]:
        """Every axis but the sample axis, whole, in physical order: what the tiles cover."""
        return tuple(s for k, s in enumerate(self.shape) if k != self.sample_axis)

    @functools.cached_property
    def inner_shape(self) -> tuple[int, ...]:
        """Per-sample payload shape: the selected part of ``field_shape`` (a scalar selection drops its axis)."""
        chosen = self._chosen
        out = []
        for k, s in enumerate(self.shape):
            if k == self.sample_axis:
                continue
            picked = chosen.get(k)
            if picked is None:
                out.append(s)
            elif not picked.drop:
                out.append(picked.size)
        return tuple(out)

    @functools.cached_property
    def inner_dims(self) -> tuple[str | None, ...]:
        """The dimension names of ``inner_shape``'s axes (None where unnamed)."""
        chosen, names = self._chosen, self.dimension_names or (None,) * self.ndim
        return tuple(
            names[k] for k in range(self.ndim) if k != self.sample_axis and not (k in chosen and chosen[k].drop)
        )

    @functools.cached_property
    def inner_stored_chunks(self) -> tuple[int, ...]:
        return tuple(s for k, s in enumerate(self.stored_chunks) if k != self.sample_axis)

    @functools.cached_property
    def tile_shape(self) -> tuple[int, ...]:
        """A tile's extent along the field axes (``tile_chunks`` without the sample axis)."""
        return tuple(s for k, s in enumerate(self.tile_chunks) if k != self.sample_axis)

    @functools.cached_property
    def tile_grid(self) -> tuple[int, ...]:
        """Tiles per field axis (the grid of tiles one sample-axis chunk spans)."""
        return tuple(ceil_div(s, c) for s, c in zip(self.field_shape, self.tile_shape))

    @functools.cached_property
    def tiles_per_chunk(self) -> int:
        return math.prod(self.tile_grid)

    @functools.cached_property
    def tiles_read(self) -> int:
        """Tiles (GETs) one sample-axis chunk of this view reads: those its selection touches."""
        count = 1
        for j, k in enumerate(k for k in range(self.ndim) if k != self.sample_axis):
            picked = self._chosen.get(k)
            size = self.tile_shape[j]
            count *= self.tile_grid[j] if picked is None else len(np.unique(picked.array // size))
        return count

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @functools.cached_property
    def sample_nbytes(self) -> int:
        """Bytes of one sample's payload."""
        return math.prod(self.inner_shape) * self.itemsize

    @functools.cached_property
    def chunk_nbytes(self) -> int:
        """Decoded bytes one full sample-axis chunk keeps: its selected part (all of it without a selection)."""
        return self.sample_chunk_size * self.sample_nbytes

    @functools.cached_property
    def tile_nbytes(self) -> int:
        """Decoded bytes of one full tile: what one read in flight costs once decoded."""
        return math.prod(self.tile_chunks) * self.itemsize

    @functools.cached_property
    def stored_chunk_nbytes(self) -> int:
        """Decoded bytes of one full stored chunk (one tile)."""
        return math.prod(self.stored_chunks) * self.itemsize

    @functools.cached_property
    def _tile_coords(self) -> tuple[tuple[int, ...], ...]:
        return tuple(itertools.product(*(range(n) for n in self.tile_grid)))

    def tile_coord(self, tile_index: int) -> tuple[int, ...]:
        """Inner grid coordinates of tile ``tile_index`` (C order over ``tile_grid``)."""
        if not 0 <= tile_index < self.tiles_per_chunk:
            raise ValueError(f"{tile_index=} is outside [0, {self.tiles_per_chunk}) for array {self.path!r}")
        return self._tile_coords[tile_index]

    def tile_origins(self) -> np.ndarray:
        """``(tiles_per_chunk, len(field_shape))`` origin of each tile in the whole field."""
        grid = np.indices(self.tile_grid).reshape(len(self.tile_grid), self.tiles_per_chunk).T
        return (grid * np.asarray(self.tile_shape, dtype=np.intp)).astype(np.intp)

    def tile_shapes(self) -> np.ndarray:
        """``(tiles_per_chunk, len(field_shape))`` real extent of each tile (edge tiles are clipped)."""
        origins = self.tile_origins()
        return np.minimum(np.asarray(self.tile_shape), np.asarray(self.field_shape) - origins).astype(np.intp)

    def physical_chunk_coord(self, chunk_index: int, tile: int | Sequence[int] = 0) -> tuple[int, ...]:
        """The coordinates (physical order, in the grid of ``tile_chunks``) of a tile of a sample-axis chunk."""
        inner = self.tile_coord(tile) if isinstance(tile, (int, np.integer)) else tuple(int(t) for t in tile)
        if len(inner) != self.ndim - 1:
            raise ValueError(f"tile coordinate {inner} must have {self.ndim - 1} entries for array {self.path!r}")
        coord = list(inner)
        coord.insert(self.sample_axis, int(chunk_index))
        return tuple(coord)

    def chunk_key(self, coord: Sequence[int]) -> str:
        """The store key of the stored chunk at physical ``coord``, in the array's own key encoding."""
        if self.metadata is None:
            raise ValueError(f"geometry of {self.path!r} carries no zarr metadata to encode keys with")
        key = self.metadata.encode_chunk_key(tuple(int(c) for c in coord))
        return f"{self.path}/{key}" if self.path else key

    def tile_key(self, coord: Sequence[int]) -> tuple[str, tuple[int, ...] | None]:
        """Where the tile at ``coord`` (tile grid, physical order) is stored: its key, and its place in the shard.

        The place is the inner-chunk position within the shard when tiles are
        read by byte range (``sharded_reads``), else None (the key is the tile).
        """
        if not self.sharded_reads:
            return self.chunk_key(coord), None
        per = [s // c for s, c in zip(self.stored_chunks, self.tile_chunks)]
        shard = tuple(int(c) // p for c, p in zip(coord, per))
        return self.chunk_key(shard), tuple(int(c) % p for c, p in zip(coord, per))

    def tile_placement(self, chunk_index: int, tile: int | Sequence[int] = 0) -> ChunkProjection:
        """Where a tile's valid data sits: in its decoded stored chunk and in the chunk's pool entry.

        ``chunk_selection`` is physical-order slices into the decoded stored
        chunk; ``out_selection`` is slices into the chunk's logical array
        ``(chunk_len, *inner_shape)`` (sample axis first).
        """
        coord = self.physical_chunk_coord(chunk_index, tile)
        n = self.chunk_len(chunk_index)
        chunk_sel: list[slice] = []
        out_inner: list[slice] = []
        complete = True
        for k, (c, size, ext) in enumerate(zip(coord, self.tile_chunks, self.shape)):
            start = c * size
            stop = min(start + size, ext)
            if stop - start < size:
                complete = False
            chunk_sel.append(slice(0, stop - start))
            if k != self.sample_axis:
                out_inner.append(slice(start, stop))
        return ChunkProjection(
            chunk_coords=coord,
            chunk_selection=tuple(chunk_sel),
            out_selection=(slice(0, n), *out_inner),
            is_complete_chunk=complete,
        )

    # -- views -------------------------------------------------------------
    def shift(self, k: int | str | np.timedelta64) -> ArrayGeometry:
        """A shifted view: sample ``i`` reads ``array[i + offset + k]`` along the sample axis.

        ``k`` is a step count, or a duration (``"6h"``, ``numpy.timedelta64``)
        resolved against the sample axis's time coordinate: on a regular axis
        it becomes the step count it equals (the very same view); on an axis
        with gaps each anchor reads the step stored ``k`` later, and an anchor
        whose time plus ``k`` is not stored is dropped (inference raises).
        A step count on an irregular axis warns (:class:`IrregularTimeWarning`).

        Raises
        ------
        TypeError
            ``k`` is neither an int nor a duration, or mixes steps and durations on an irregular axis.
        TimeAxisError
            A duration on an array without a time coordinate along its sample
            axis, or one that is no whole number of steps of a regular axis.
        """
        if is_duration(k):
            what = f"shift({k!r}) of array {self.path!r}"
            return self._in_time(what, parse_duration(k, what), None)
        if not isinstance(k, (int, np.integer)):
            raise TypeError(f"shift(k) takes an int or a duration ('6h'), got {type(k).__name__}")
        if self.time_rows is not None:
            raise TypeError(mixed_offsets(f"shift({int(k)})", self.path))
        if k:
            self._warn_irregular(f"shift({int(k)})")
        return dataclasses.replace(self, offset=self.offset + int(k))

    def window(self, offsets: Iterable[int | str | np.timedelta64]) -> ArrayGeometry:
        """A native multi-step view: sample ``i`` is ``array[i + offset + s]`` for each ``s``, one ``(steps, *inner)`` row.

        ``window([-1, 0])`` is two input steps; ``window(range(-6, 1, 6))``
        the step six before and this one; ``window(["-6h", "0h"])`` the steps
        six hours before and at the anchor, by the time coordinate (as for
        ``shift``). Composes with ``shift`` and selections; steps that share
        a stored chunk cost one read.

        Raises
        ------
        TypeError
            ``offsets`` is not a sequence of ints, or of durations.
        ValueError
            It is empty, or the view is already windowed.
        TimeAxisError
            Durations the time axis cannot serve (see ``shift``).
        """
        try:
            steps = tuple(offsets)
        except TypeError as exc:
            raise TypeError(f"window(offsets) takes a sequence of ints, got {type(offsets).__name__}") from exc
        if not steps:
            raise ValueError(f"window() of array {self.path!r} needs at least one step")
        if self.window_steps:
            raise ValueError(
                f"array {self.path!r} is already windowed with steps {list(self.window_steps)}; give all steps at once"
            )
        timed = [is_duration(s) for s in steps]
        if all(timed):
            what = f"window({list(steps)!r}) of array {self.path!r}"
            return self._in_time(what, None, tuple(parse_duration(s, what) for s in steps))
        bad = [s for s, t in zip(steps, timed) if t or isinstance(s, bool) or not isinstance(s, (int, np.integer))]
        if bad:
            raise TypeError(f"window() steps must be ints, or all durations ('6h'); got {bad[0]!r} in {list(steps)}")
        if self.time_rows is not None:
            raise TypeError(mixed_offsets(f"window({list(steps)})", self.path))
        if any(steps):
            self._warn_irregular(f"window({[int(s) for s in steps]})")
        return dataclasses.replace(self, window_steps=tuple(int(s) for s in steps))

    # -- offsets in time ---------------------------------------------------
    def step_axis(self, what: str = "an offset in time") -> StepAxis:
        """The sample axis's time coordinate as a :class:`StepAxis` (read once per store).

        Raises
        ------
        TimeAxisError
            The array has no dimension names, no coordinate array for its
            sample dimension, or one that holds no dates.
        """
        dims = self.dimension_names
        dim = dims[self.sample_axis] if dims else None
        try:
            values = self.coord(dim) if dim else None
        except KeyError:
            values = None
        return sample_time_axis(values, self.path, dim, self.n_samples, what)

    def _in_time(self, what: str, shift: int | None, steps: tuple[int, ...] | None) -> ArrayGeometry:
        """This view shifted by ``shift`` ns or windowed at ``steps`` ns: in steps when the axis is regular."""
        has_steps = bool(self.offset or self.window_steps) and self.time_rows is None
        offset, window, rows = in_time(self.step_axis(what), what, shift, steps, self.time_rows, has_steps, self.path)
        if rows is None:
            return dataclasses.replace(self, offset=self.offset + offset, window_steps=window or self.window_steps)
        return dataclasses.replace(self, offset=offset, window_steps=window, time_rows=rows)

    def _warn_irregular(self, what: str) -> None:
        """Warn once when a step-count offset lands on an irregular time axis (nothing to say without one)."""
        try:
            axis = self.step_axis(what)
        except (TimeAxisError, CalendarError):
            return
        if not axis.regular:
            warnings.warn(
                f"{what} of array {self.path!r} counts stored steps on a time axis with gaps or uneven steps "
                f"(first: {axis.gap_text()}), so it pairs anchors with times a varying distance away; give the "
                "offset as a duration ('6h') to pair by time and drop the anchors whose time is not stored",
                IrregularTimeWarning,
                stacklevel=3,
            )

    def read_rows(self, anchors: np.ndarray) -> np.ndarray:
        """``(len(anchors), steps)``: the sample-axis index each anchor reads per step (``-1``: not stored)."""
        if self.time_rows is not None:
            return self.time_rows.rows[anchors]
        return anchors[:, None] + np.asarray(self.read_offsets, dtype=np.int64)[None, :]

    @property
    def read_offsets(self) -> tuple[int, ...]:
        """Every sample-axis offset a sample of this view reads: ``offset + s`` per step."""
        return tuple(self.offset + s for s in self.window_steps or (0,))

    @property
    def row_shape(self) -> tuple[int, ...]:
        """One sample of this view in a batch: ``(steps, *inner_shape)`` when windowed, else ``inner_shape``."""
        return ((len(self.window_steps),) if self.window_steps else ()) + self.inner_shape

    def source_view(self) -> ArrayGeometry:
        """This view's source: its array and selection, without offset or window (what a reader decodes)."""
        return dataclasses.replace(self, offset=0, window_steps=(), time_rows=None)

    def with_sample_axis(self, sample_axis: int) -> ArrayGeometry:
        if self.time_rows is not None:  # its rows were looked up along the old sample axis's times
            raise ValueError(f"array {self.path!r}: choose the sample axis before giving offsets in time")
        return dataclasses.replace(self, sample_axis=normalize_axis(sample_axis, self.ndim, self.path))


def normalize_axis(sample_axis: int, ndim: int, path: str) -> int:
    if not isinstance(sample_axis, (int, np.integer)):
        raise TypeError(f"sample_axis must be an int, got {type(sample_axis).__name__} ({sample_axis!r})")
    if ndim == 0:
        raise ValueError(f"array {path!r} is 0-dimensional: it has no axis to sample along")
    if not -ndim <= sample_axis < ndim:
        raise ValueError(
            f"{sample_axis=} is out of range for array {path!r} with {ndim} dims (shape must have an axis {sample_axis})"
        )
    return int(sample_axis) % ndim


def sample_coords(variables: Iterable[ArrayGeometry], n: int) -> dict[str, np.ndarray]:
    """The sample axis's coordinate (by dimension name) from the first variable whose store has it, else indices.

    A time coordinate that cannot be decoded here (a calendar that needs
    cftime, which is not installed) gives indices and one WARNING: batches
    still flow; date splits and ``coord()`` raise the full error.
    """
    for g in variables:
        dims = g.dimension_names
        name = dims[g.sample_axis] if dims else None
        if name and g.time_rows is not None and len(g.time_rows.rows) == n:  # rows looked up on the anchors' axis
            return {name: g.time_rows.axis.values}
        if name and g.n_samples == n:
            try:
                found = g.coord_or_none(name)
            except CalendarError as exc:
                logger.warning("insitubatch: batch coords carry sample indices: %s", exc)
                break
            if found is not None:
                return {name: found}
    return {"sample": np.arange(n)}
