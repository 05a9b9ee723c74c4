"""Kernel benchmarks: each kernel beside its hardware limit and its naive numpy alternative.

Every group holds one shape and times, in the same run:

- the kernel (``gather``, ``assemble_tiles``, ``write_tile``);
- ``memcpy``: ``np.copyto`` of the same number of bytes between two
  contiguous, already-touched buffers — the bandwidth limit;
- ``numpy``: what a numpy loader writes instead — fancy indexing per resident
  tile into the preallocated batch (gather), slice assignment (assembly),
  ``np.save`` (persist); and for untiled gathers also ``numpy_take``,
  ``np.take(window, rows, axis=0, out=batch)`` from one stacked window, numpy's
  best case (it needs the tiles concatenated first, which is not timed).

Run, save a baseline, gate against it, and print the ratio table::

    pytest bench/test_bench_kernels.py --benchmark-timer=time.process_time \\
        --benchmark-min-rounds=5 --benchmark-storage=file://./.benchmarks --benchmark-save=baseline
    pytest bench/test_bench_kernels.py --benchmark-timer=time.process_time \\
        --benchmark-min-rounds=5 --benchmark-storage=file://./.benchmarks \\
        --benchmark-compare --benchmark-compare-fail=median:15%
    python bench/report_kernels.py .benchmarks/*/*_baseline.json

CPU time (``time.process_time``, user + system, page faults included) rather
than wall time: on a shared machine the time a copy spends descheduled is
noise, not a property of the kernel. Every timed call is single-threaded.

Batches are shuffled: ``batch`` rows drawn at random from a resident window of
``2 * batch`` rows held in chunks of ``spc`` samples (1 and 8 per chunk).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from insitubatch._engine.tiles.kernels import assemble_tiles, coalesce_runs, gather
from insitubatch.cache.tilefile import create_tile_file, write_tile


@dataclass(frozen=True)
class Shape:
    name: str
    inner: tuple[int, ...]
    dtype: str
    batch: int
    tile: tuple[int, ...] | None = None  # inner tile shape; None: one tile spans the field


SHAPES = {
    s.name: s
    for s in (
        Shape("era5", (721, 1440), "f4", 8),
        Shape("era5_4x4", (721, 1440), "f4", 8, (181, 360)),
        Shape("wb2", (64, 32), "f4", 256),
        Shape("micro", (2048, 2048), "u2", 16),
    )
}
SAMPLES_PER_CHUNK = (1, 8)


def _touched(shape: tuple[int, ...], dtype: str, fill: int = 1) -> np.ndarray:
    """A buffer whose pages are all resident (a fresh np.empty reads the shared zero page)."""
    a = np.empty(shape, dtype)
    a[...] = fill
    return a


def _tiles_of(chunk: np.ndarray, tile: tuple[int, ...] | None) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
    inner = chunk.shape[1:]
    tile = tile or inner
    corners = list(itertools.product(*(range(0, d, t) for d, t in zip(inner, tile))))
    tiles = [np.ascontiguousarray(chunk[(slice(None), *(slice(o, o + t) for o, t in zip(c, tile)))]) for c in corners]
    return tiles, corners


class GatherCase:
    """A resident window of tiles, one shuffled batch drawn from it, and the buffers to time."""

    def __init__(self, shape: Shape, spc: int) -> None:
        rng = np.random.default_rng(0)
        self.shape = shape
        n_chunks = 2 * shape.batch // spc
        self.tiles: list[np.ndarray] = []
        origins = []
        tiles_of_chunk = []
        self.window = _touched((n_chunks * spc, *shape.inner), shape.dtype, 7)  # for numpy_take only
        for c in range(n_chunks):
            chunk = self.window[c * spc : (c + 1) * spc]
            tiles, corners = _tiles_of(chunk, shape.tile)
            tiles_of_chunk.append(range(len(self.tiles), len(self.tiles) + len(tiles)))
            self.tiles += tiles
            origins += corners
        self.origins = np.asarray(origins, dtype=np.intp)
        self.rows = np.sort(rng.permutation(len(self.window))[: shape.batch])
        rng.shuffle(self.rows)  # batch order is random too
        t, s, d = [], [], []
        for b, row in enumerate(self.rows):
            for tile_id in tiles_of_chunk[row // spc]:
                t.append(tile_id)
                s.append(row % spc)
                d.append(b)
        self.t, self.s, self.d = np.asarray(t), np.asarray(s), np.asarray(d)
        self.runs = coalesce_runs(self.t, self.s, self.d)
        self.out = _touched((shape.batch, *shape.inner), shape.dtype, 0)
        self.src = _touched(self.out.shape, shape.dtype, 3)
        # numpy's per-tile fancy indexing: which batch rows and source rows each tile feeds
        self.per_tile = []
        for tile_id in np.unique(self.t):
            mask = self.t == tile_id
            rect = tuple(slice(o, o + n) for o, n in zip(self.origins[tile_id], self.tiles[tile_id].shape[1:]))
            self.per_tile.append((self.tiles[tile_id], self.s[mask], (self.d[mask], *rect)))

    def check(self) -> None:
        np.testing.assert_array_equal(self.out, self.window[self.rows])


_CASES: dict = {}


def _case(key: tuple, build):
    """Keep only the case being timed in memory: the large shapes are hundreds of MB."""
    if key not in _CASES:
        _CASES.clear()
        _CASES[key] = build()
    return _CASES[key]


GATHER_ROLES = ("gather", "gather_with_runs", "memcpy", "numpy", "numpy_take")


@pytest.mark.parametrize(
    ("name", "spc", "role"),
    [
        (name, spc, role)
        for name in SHAPES
        for spc in SAMPLES_PER_CHUNK
        for role in GATHER_ROLES
        if not (role == "numpy_take" and SHAPES[name].tile)
    ],
)
def test_gather(benchmark, name: str, spc: int, role: str) -> None:
    case = _case(("gather", name, spc), lambda: GatherCase(SHAPES[name], spc))
    benchmark.group = f"gather {name} spc{spc}"
    benchmark.extra_info.update(role=role, bytes=case.out.nbytes, runs=len(case.runs), tiles=len(case.tiles))
    out, tiles, origins, runs = case.out, case.tiles, case.origins, case.runs
    if role == "gather":
        benchmark(gather, out, tiles, origins, runs)
    elif role == "gather_with_runs":
        benchmark(lambda: gather(out, tiles, origins, coalesce_runs(case.t, case.s, case.d)))
    elif role == "memcpy":
        benchmark(np.copyto, out, case.src)
        return
    elif role == "numpy":

        def numpy_gather() -> None:
            for tile, src_rows, index in case.per_tile:
                out[index] = tile[src_rows]

        benchmark(numpy_gather)
    else:
        benchmark(np.take, case.window, case.rows, 0, out)
    case.check()
    out[...] = 0


class AssembleCase:
    def __init__(self, shape: Shape, spc: int) -> None:
        self.chunk = _touched((spc, *shape.inner), shape.dtype, 0)
        self.chunk[...] = np.arange(self.chunk.size, dtype=np.int64).reshape(self.chunk.shape) % 251
        self.tiles, corners = _tiles_of(self.chunk, shape.tile)
        self.origins = np.asarray(corners, dtype=np.intp)
        self.dest = _touched(self.chunk.shape, shape.dtype, 0)
        self.src = _touched(self.chunk.shape, shape.dtype, 3)
        self.rects = [
            (slice(None), *(slice(o, o + n) for o, n in zip(c, t.shape[1:]))) for c, t in zip(corners, self.tiles)
        ]


ASSEMBLE_SHAPES = {
    "era5_4x4": SHAPES["era5_4x4"],
    "micro_4x4": Shape("micro_4x4", (2048, 2048), "u2", 16, (512, 512)),
}


@pytest.mark.parametrize(
    ("name", "spc", "role"),
    [
        (name, spc, role)
        for name in ASSEMBLE_SHAPES
        for spc in SAMPLES_PER_CHUNK
        for role in ("assemble", "memcpy", "numpy")
    ],
)
def test_assemble(benchmark, name: str, spc: int, role: str) -> None:
    case = _case(("assemble", name, spc), lambda: AssembleCase(ASSEMBLE_SHAPES[name], spc))
    benchmark.group = f"assemble {name} spc{spc}"
    benchmark.extra_info.update(role=role, bytes=case.dest.nbytes, tiles=len(case.tiles))
    dest = case.dest
    if role == "assemble":
        benchmark(assemble_tiles, dest, case.tiles, case.origins)
    elif role == "memcpy":
        benchmark(np.copyto, dest, case.src)
        return
    else:

        def slice_assign() -> None:
            for rect, tile in zip(case.rects, case.tiles):
                dest[rect] = tile

        benchmark(slice_assign)
    np.testing.assert_array_equal(dest, case.chunk)
    dest[...] = 0


PERSIST_TILES = {
    "era5": ((1, 721, 1440), "f4"),
    "era5_4x4_spc8": ((8, 181, 360), "f4"),
    "wb2_spc8": ((8, 64, 32), "f4"),
    "micro": ((1, 2048, 2048), "u2"),
}


@pytest.mark.parametrize(("name", "role"), [(n, r) for n in PERSIST_TILES for r in ("persist", "memcpy", "numpy")])
def test_persist(benchmark, tmp_path: Path, name: str, role: str) -> None:
    shape, dtype = PERSIST_TILES[name]
    tile = _touched(shape, dtype, 5)
    benchmark.group = f"persist {name}"
    benchmark.extra_info.update(role=role, bytes=tile.nbytes)
    if role == "persist":
        with create_tile_file(tmp_path / "tile.npy", 2, shape, dtype) as tile_file:
            write_tile(tile_file, 1, tile)  # first touch of the file's pages is not the steady state
            view = benchmark(write_tile, tile_file, 1, tile)
            np.testing.assert_array_equal(view, tile)
            del view
    elif role == "memcpy":
        benchmark(np.copyto, _touched(shape, dtype, 0), tile)
    else:
        path = tmp_path / "tile.npy"
        benchmark(np.save, path, tile)
        np.testing.assert_array_equal(np.load(path), tile)
