"""The batch gather kernel and its run table, against numpy indexing."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from insitubatch._engine.tiles import kernels
from insitubatch._engine.tiles.kernels import coalesce_runs, gather
from insitubatch._ext import gather as _gather

DTYPES = ["u1", "i2", "<f4", ">f8", "c16", "bool", "M8[s]", "S3", [("a", "u1"), ("b", "<f4")]]


def _random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: object) -> np.ndarray:
    top = 2 if np.dtype(dtype) == np.bool_ else 250  # numpy normalises other bool bytes on copy
    raw = rng.integers(0, top, size=(*shape, np.dtype(dtype).itemsize), dtype=np.uint8)
    return np.ascontiguousarray(raw).view(dtype).reshape(shape)


class Window:
    """Resident chunks of a ``(rows, *inner)`` array, each split into sample-first tiles."""

    def __init__(
        self,
        rng: np.random.Generator,
        inner: tuple[int, ...],
        tile: tuple[int, ...],
        chunk_rows: list[int],
        dtype: object,
    ) -> None:
        self.inner = inner
        self.chunks = [_random_values(rng, (n, *inner), dtype) for n in chunk_rows]
        corners = list(itertools.product(*(range(0, d, t) for d, t in zip(inner, tile))))
        self.tiles: list[np.ndarray] = []
        self.origins: list[tuple[int, ...]] = []
        self.tiles_of_chunk: list[list[int]] = []
        for chunk in self.chunks:
            ids = []
            for corner in corners:
                rect = tuple(slice(o, o + t) for o, t in zip(corner, tile))
                ids.append(len(self.tiles))
                self.tiles.append(np.ascontiguousarray(chunk[(slice(None), *rect)]))
                self.origins.append(corner)
            self.tiles_of_chunk.append(ids)

    def origin_table(self) -> np.ndarray:
        return np.asarray(self.origins, dtype=np.intp).reshape(len(self.tiles), len(self.inner))

    def selection(self, samples: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-(batch row, tile) copies for ``samples`` = ``[(chunk, row), ...]`` in batch order."""
        t, s, d = [], [], []
        for b, (c, row) in enumerate(samples):
            for tile_id in self.tiles_of_chunk[c]:
                t.append(tile_id)
                s.append(row)
                d.append(b)
        return np.asarray(t), np.asarray(s), np.asarray(d)


def assert_same_bytes(actual: np.ndarray, expected: np.ndarray) -> None:
    """Byte equality: NaNs and padding compare as stored, whatever the dtype."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_array_equal(
        np.ascontiguousarray(actual).reshape(-1).view(np.uint8),
        np.ascontiguousarray(expected).reshape(-1).view(np.uint8),
    )


def _reference(window: Window, samples: list[tuple[int, int]], dtype: object) -> np.ndarray:
    out = np.zeros((len(samples), *window.inner), dtype=dtype)
    for b, (c, row) in enumerate(samples):
        out[b] = window.chunks[c][row]
    return out


def _random_window(rng: np.random.Generator, dtype: object) -> Window:
    nd = int(rng.integers(0, 4))
    inner = tuple(int(x) for x in rng.integers(1, 8, size=nd))
    tile = tuple(int(rng.integers(1, d + 1)) for d in inner)
    chunk_rows = [int(x) for x in rng.integers(1, 6, size=int(rng.integers(1, 4)))]
    return Window(rng, inner, tile, chunk_rows, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ["shuffled", "sequential"])
def test_gather_matches_numpy_indexing(dtype: object, order: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{order}".encode()))
    for _ in range(30):
        window = _random_window(rng, dtype)
        everything = [(c, r) for c, chunk in enumerate(window.chunks) for r in range(len(chunk))]
        if order == "shuffled":
            rng.shuffle(everything)
        samples = everything[: int(rng.integers(0, len(everything) + 1))]
        out = np.zeros((len(samples), *window.inner), dtype=dtype)
        runs = coalesce_runs(*window.selection(samples))
        gather(out, window.tiles, window.origin_table(), runs)
        assert_same_bytes(out, _reference(window, samples, dtype))


@pytest.mark.parametrize("dtype", ["u1", "S3", "<f4", "c16"])
def test_streaming_stores_copy_the_same_bytes(dtype: str) -> None:
    """Large batches bypass the caches; force that path on small ones (odd sizes and alignments)."""
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    for _ in range(30):
        window = _random_window(rng, dtype)
        everything = [(c, r) for c, chunk in enumerate(window.chunks) for r in range(len(chunk))]
        rng.shuffle(everything)
        out = np.zeros((len(everything), *window.inner), dtype=dtype)
        gather(out, window.tiles, window.origin_table(), coalesce_runs(*window.selection(everything)), stream=True)
        assert_same_bytes(out, _reference(window, everything, dtype))
    big = Window(rng, (300, 97), (300, 97), [3], dtype)  # whole-row runs of ~29-116 KB
    out = np.zeros((3, 300, 97), dtype=dtype)
    runs = coalesce_runs(*big.selection([(0, 2), (0, 0), (0, 1)]))
    gather(out, big.tiles, big.origin_table(), runs, stream=True)
    assert_same_bytes(out, _reference(big, [(0, 2), (0, 0), (0, 1)], dtype))


def test_a_copy_past_the_stream_threshold_can_be_kept_cached() -> None:
    """``stream=False`` overrides the size rule: a batch over ``STREAM_MIN_BYTES`` copied the cached way, same bytes."""
    rng = np.random.default_rng(5)
    rows = kernels.STREAM_MIN_BYTES // (64 * 64 * 4) + 2
    window = Window(rng, (64, 64), (32, 64), [rows], "<f4")
    picked = [(0, r) for r in rng.permutation(rows).tolist()]
    out = np.zeros((rows, 64, 64), dtype="<f4")
    assert out.nbytes >= kernels.STREAM_MIN_BYTES
    gather(out, window.tiles, window.origin_table(), coalesce_runs(*window.selection(picked)), stream=False)
    assert_same_bytes(out, _reference(window, picked, "<f4"))


def test_gather_writes_only_the_runs_rows() -> None:
    rng = np.random.default_rng(3)
    window = Window(rng, (5, 7), (2, 3), [4], "f4")
    out = np.full((6, 5, 7), -1, dtype="f4")
    t, s, d = window.selection([(0, 2), (0, 3)])
    gather(out, window.tiles, window.origin_table(), coalesce_runs(t, s, d + 3))
    np.testing.assert_array_equal(out[3:5], window.chunks[0][2:4])
    assert (out[:3] == -1).all() and (out[5:] == -1).all()


def test_edge_tiles_land_in_their_smaller_rectangles() -> None:
    rng = np.random.default_rng(4)
    window = Window(rng, (721, 1440 // 8), (181, 60), [3], "f4")  # 721 = 3*181 + 178: edge row of tiles
    assert {tile.shape[1] for tile in window.tiles} == {181, 178}
    out = np.zeros((3, 721, 180), "f4")
    gather(out, window.tiles, window.origin_table(), coalesce_runs(*window.selection([(0, 2), (0, 0), (0, 1)])))
    np.testing.assert_array_equal(out, window.chunks[0][[2, 0, 1]])


def test_one_row_batch_and_empty_selections() -> None:
    rng = np.random.default_rng(5)
    window = Window(rng, (4, 6), (4, 6), [3, 2], "i2")
    out = np.zeros((1, 4, 6), "i2")
    gather(out, window.tiles, window.origin_table(), coalesce_runs(*window.selection([(1, 1)])))
    np.testing.assert_array_equal(out[0], window.chunks[1][1])

    before = out.copy()
    gather(out, window.tiles, window.origin_table(), np.empty((0, 4), np.int64))
    gather(out, window.tiles, window.origin_table(), [[0, 0, 0, 0]])  # a zero-length run
    gather(out, [], np.empty((0, 2)), [])
    np.testing.assert_array_equal(out, before)
    gather(np.zeros((0, 4, 6), "i2"), window.tiles, window.origin_table(), [])
    assert coalesce_runs([], [], []).shape == (0, 4)


@pytest.mark.parametrize("rank", range(7))
def test_any_inner_rank_a_transform_makes_gathers_and_assembles(rank: int) -> None:
    """A chunk transform may drop, add or reorder inner axes: the kernels take the destination's rank, whatever it is."""
    rng = np.random.default_rng(40 + rank)
    inner = tuple(int(x) for x in rng.integers(1, 4, size=rank))
    tile = tuple(int(rng.integers(1, d + 1)) for d in inner)
    window = Window(rng, inner, tile, [3, 2], "<f4")
    samples = [(1, 1), (0, 2), (0, 0), (1, 0)]
    out = np.zeros((len(samples), *inner), "<f4")
    gather(out, window.tiles, window.origin_table(), coalesce_runs(*window.selection(samples)))
    assert_same_bytes(out, _reference(window, samples, "<f4"))
    whole = np.zeros_like(window.chunks[0])
    per_chunk = len(window.tiles_of_chunk[0])
    kernels.assemble_tiles(whole, window.tiles[:per_chunk], window.origin_table()[:per_chunk])
    assert_same_bytes(whole, window.chunks[0])


def test_origins_of_another_rank_than_the_destination_name_its_inner_dims() -> None:
    """The failure a transform that changed the rank met when its tile kept the stored array's origins."""
    with pytest.raises(ValueError, match=r"origins must have shape \(1, 1\), got \(1, 2\): .* out's 1 inner dims"):
        gather(np.zeros((2, 6), "f4"), [np.zeros((2, 6), "f4")], [[0, 0]], [[0, 0, 0, 2]])
    with pytest.raises(ValueError, match=r"origins must have shape \(1, 3\), got \(1, 2\): .* dest's 3 inner dims"):
        kernels.assemble_tiles(np.zeros((2, 2, 6, 8), "f4"), [np.zeros((2, 2, 6, 8), "f4")], [[0, 0]])


def test_scalar_samples_gather_as_one_block() -> None:
    tiles = [np.arange(10, dtype="f8"), np.arange(100, 105, dtype="f8")]
    out = np.zeros(7, "f8")
    runs = coalesce_runs([1, 1, 1, 0, 0, 0, 0], [0, 1, 2, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6])
    assert runs.tolist() == [[0, 5, 3, 4], [1, 0, 0, 3]]
    gather(out, tiles, np.empty((2, 0), np.intp), runs)
    np.testing.assert_array_equal(out, [100, 101, 102, 5, 6, 7, 8])


def test_coalesce_merges_consecutive_rows_per_tile() -> None:
    # two tiles of one chunk, a sequential batch of 4 rows: one run per tile
    t = np.array([0, 1] * 4)
    s = np.repeat(np.arange(4), 2)
    runs = coalesce_runs(t, s, s)
    assert runs.tolist() == [[0, 0, 0, 4], [1, 0, 0, 4]]
    assert runs.dtype == np.int64 and runs.flags.c_contiguous
    # a break in the source or the destination splits the run
    assert coalesce_runs([0, 0, 0], [0, 1, 3], [0, 1, 2]).tolist() == [[0, 0, 0, 2], [0, 3, 2, 1]]
    assert coalesce_runs([0, 0, 0], [0, 1, 2], [0, 1, 3]).tolist() == [[0, 0, 0, 2], [0, 2, 3, 1]]
    with pytest.raises(ValueError, match="equally long"):
        coalesce_runs([0], [0, 1], [0])


def test_coalesced_runs_cover_exactly_the_requested_rows() -> None:
    rng = np.random.default_rng(6)
    for _ in range(50):
        n = int(rng.integers(0, 40))
        t = rng.integers(0, 3, size=n)
        s = rng.integers(0, 10, size=n)
        d = rng.permutation(n)
        runs = coalesce_runs(t, s, d)
        expanded = sorted((int(tt), int(ss) + k, int(dd) + k) for tt, ss, dd, nn in runs for k in range(nn))
        assert expanded == sorted(zip(t.tolist(), s.tolist(), d.tolist()))


def test_non_contiguous_inputs_are_rejected() -> None:
    tile = np.zeros((2, 4, 6), "f4")
    out = np.zeros((2, 4, 6), "f4")
    runs = [[0, 0, 0, 2]]
    with pytest.raises(ValueError, match=r"tiles\[1\] must be C-contiguous"):
        gather(out, [tile, np.zeros((2, 4, 12), "f4")[:, :, ::2]], [[0, 0], [0, 0]], runs)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        gather(np.zeros((2, 6, 4), "f4").transpose(0, 2, 1), [tile], [[0, 0]], runs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tiles": [np.zeros((2, 4, 6), "f8")]}, ValueError, r"tiles\[0\] has dtype float64 but out has dtype float32"),
        ({"tiles": [np.zeros((2, 24), "f4")]}, ValueError, r"tiles\[0\] has 2 dims"),
        ({"tiles": [[[0.0]]]}, TypeError, r"tiles\[0\] must be a numpy.ndarray"),
        ({"origins": [[0, 1]]}, ValueError, r"\[1:7\) on inner axis 1 does not fit out's extent 6"),
        ({"origins": [[-1, 0]]}, ValueError, r"\[-1:3\) on inner axis 0"),
        ({"origins": [[0, 0, 0]]}, ValueError, r"origins must have shape \(1, 2\)"),
        ({"origins": [[0.0, 0.0]]}, ValueError, "origins must hold integers"),
        ({"runs": [[1, 0, 0, 1]]}, ValueError, r"runs\[0\] names tile 1, but there are 1 tiles"),
        (
            {"runs": [[0, 0, 0, 1], [0, 1, 0, 2]]},
            ValueError,
            r"runs\[1\] reads rows \[1:3\) of tiles\[0\], which has 2 rows",
        ),
        ({"runs": [[0, 0, 2, 2]]}, ValueError, r"runs\[0\] writes rows \[2:4\) of out, which has 3 rows"),
        ({"runs": [[0, 0, -1, 1]]}, ValueError, r"writes rows \[-1:0\)"),
        ({"runs": [[0, 0, 0, -1]]}, ValueError, "n_rows=-1"),
        ({"runs": [[0, 0, 0]]}, ValueError, r"runs must have shape \('n', 4\)"),
        ({"out": np.zeros((3, 4, 6), "f4")[:0:-1]}, ValueError, "out must be C-contiguous"),
        ({"out": np.float32(0.0)}, TypeError, "out must be a numpy.ndarray"),
        ({"out": np.zeros((), "f4")}, ValueError, "leading row"),
    ],
)
def test_bad_tables_name_the_problem(kwargs: dict, error: type, match: str) -> None:
    args = {
        "out": np.zeros((3, 4, 6), "f4"),
        "tiles": [np.zeros((2, 4, 6), "f4")],
        "origins": [[0, 0]],
        "runs": [[0, 0, 0, 2]],
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        gather(**args)


def test_read_only_out_is_rejected_and_read_only_tiles_are_fine() -> None:
    tile = np.ones((1, 3), "u1")
    tile.flags.writeable = False
    out = np.zeros((1, 3), "u1")
    gather(out, [tile], [[0]], [[0, 0, 0, 1]])
    assert out.tolist() == [[1, 1, 1]]
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        gather(out, [tile], [[0]], [[0, 0, 0, 1]])


def test_openmp_build_flag_is_reported() -> None:
    assert isinstance(_gather.OPENMP, bool)


@pytest.mark.parametrize("seed", range(40))
def test_batch_runs_gather_what_numpy_indexing_reads(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size, n_tiles = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    n_chunks = int(rng.integers(1, 7))
    tile_width = [int(w) for w in rng.integers(1, 4, size=n_tiles)]
    field = rng.standard_normal((n_chunks * size, sum(tile_width))).astype(np.float32)
    edges = np.cumsum([0, *tile_width])
    # shuffled draws, sequential runs, repeats: whatever a batch may ask for
    kind = seed % 3
    n = int(rng.integers(1, 3 * size + 2))
    if kind == 0:
        samples = rng.integers(0, len(field), size=n)
    elif kind == 1:
        start = int(rng.integers(0, len(field)))
        samples = np.arange(start, min(start + n, len(field)))
    else:
        samples = np.sort(rng.choice(len(field), size=min(n, len(field)), replace=False))
    chunks, runs = kernels.batch_runs(samples, size, n_tiles)
    np.testing.assert_array_equal(chunks, np.unique(samples // size))
    tiles = [
        np.ascontiguousarray(field[c * size : (c + 1) * size, edges[t] : edges[t + 1]])
        for c in chunks.tolist()
        for t in range(n_tiles)
    ]
    origins = np.array([[edges[t]] for _ in chunks for t in range(n_tiles)], dtype=np.intp)
    out = np.full((len(samples), field.shape[1]), np.nan, dtype=np.float32)
    gather(out, tiles, origins, runs)
    np.testing.assert_array_equal(out, field[samples])
    if kind == 1:  # consecutive rows of one chunk are one run per tile
        assert len(runs) == n_tiles * len(np.unique(samples // size))


def test_batch_runs_refuse_what_has_no_chunk() -> None:
    with pytest.raises(ValueError, match="size=0"):
        kernels.batch_runs(np.arange(3), 0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        kernels.batch_runs(np.array([2, -1]), 4, 1)
    chunks, runs = kernels.batch_runs(np.empty(0, dtype=np.int64), 4, 2)
    assert chunks.shape == (0,) and runs.shape == (0, 4)
