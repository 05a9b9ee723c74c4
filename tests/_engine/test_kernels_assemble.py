"""The tile assembly kernel against numpy slicing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from insitubatch._engine.tiles import kernels
from insitubatch._engine.tiles.kernels import assemble_tiles, fill_region


def _random_case(rng: np.random.Generator, ndim: int):
    dst_shape = tuple(int(x) for x in rng.integers(1, 7, size=ndim))
    tile_shape = tuple(int(rng.integers(0, d + 1)) for d in dst_shape)
    origin = tuple(int(rng.integers(0, d - t + 1)) for d, t in zip(dst_shape, tile_shape))
    return dst_shape, tile_shape, origin


@pytest.mark.parametrize("dtype", ["u1", "f4", "f8", "c8", "i2"])
def test_fill_region_matches_numpy(dtype: str) -> None:
    rng = np.random.default_rng(7)
    for ndim in (1, 2, 4):
        for _ in range(20):
            dst_shape, rect, origin = _random_case(rng, ndim)
            dst = rng.integers(0, 100, size=dst_shape).astype(dtype)
            value = np.nan if np.dtype(dtype).kind in "fc" else 3
            expected = dst.copy()
            expected[tuple(slice(o, o + r) for o, r in zip(origin, rect))] = value
            fill_region(dst, origin, rect, value)
            np.testing.assert_array_equal(dst, expected)


def test_non_contiguous_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="dst must be C-contiguous"):
        fill_region(np.zeros((6, 4), "f4").T, (0, 0), (2, 2), 0)


def test_bad_geometry_names_the_problem() -> None:
    dst = np.zeros((4, 6), "f4")
    with pytest.raises(ValueError, match="on axis 1 does not fit"):
        fill_region(dst, (0, 5), (2, 2), 0)
    with pytest.raises(ValueError, match="destination has 2 dims"):
        fill_region(dst, (0,), (2,), 0)
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros((4, 6), "f4")
        ro.flags.writeable = False
        fill_region(ro, (0, 0), (2, 2), 0)


def _split_into_tiles(chunk: np.ndarray, tile: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
    """A chunk's sample-first tiles (edge tiles smaller) and their inner origins."""
    inner = chunk.shape[1:]
    corners = list(itertools.product(*(range(0, d, t) for d, t in zip(inner, tile))))
    tiles = [np.ascontiguousarray(chunk[(slice(None), *(slice(o, o + t) for o, t in zip(c, tile)))]) for c in corners]
    return tiles, np.asarray(corners, dtype=np.intp).reshape(len(corners), len(inner))


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("dtype", ["u1", ">i2", "<f4", "c16", "M8[ms]"])
def test_assemble_tiles_rebuilds_the_chunk(monkeypatch: pytest.MonkeyPatch, dtype: str, stream: bool) -> None:
    if stream:  # the path large destinations take: non-temporal stores
        monkeypatch.setattr(kernels, "STREAM_MIN_BYTES", 0)
    rng = np.random.default_rng(11)
    for _ in range(30):
        nd = int(rng.integers(0, 4))
        inner = tuple(int(x) for x in rng.integers(1, 9, size=nd))
        tile = tuple(int(rng.integers(1, d + 1)) for d in inner)
        rows = int(rng.integers(0, 4))
        chunk = rng.integers(0, 100, size=(rows, *inner)).astype(dtype)
        tiles, origins = _split_into_tiles(chunk, tile)
        order = rng.permutation(len(tiles))  # any order: each tile knows its origin
        dest = np.zeros_like(chunk)
        assemble_tiles(dest, [tiles[i] for i in order], origins[order])
        np.testing.assert_array_equal(dest, chunk)


def test_assemble_tiles_of_a_4x4_tiled_era5_field() -> None:
    rng = np.random.default_rng(12)
    chunk = rng.random((2, 721, 1440), dtype=np.float32)
    tiles, origins = _split_into_tiles(chunk, (181, 360))
    assert len(tiles) == 16 and tiles[-1].shape == (2, 178, 360)
    dest = np.empty_like(chunk)
    assemble_tiles(dest, tiles, origins)
    np.testing.assert_array_equal(dest, chunk)


def test_assemble_tiles_rejects_what_does_not_fit() -> None:
    dest = np.zeros((2, 4, 6), "f4")
    with pytest.raises(ValueError, match=r"tiles\[0\] has 3 rows but dest has 2"):
        assemble_tiles(dest, [np.zeros((3, 2, 2), "f4")], [[0, 0]])
    with pytest.raises(ValueError, match=r"\[5:7\) on inner axis 1 does not fit dest's extent 6"):
        assemble_tiles(dest, [np.zeros((2, 2, 2), "f4")], [[0, 5]])
    with pytest.raises(ValueError, match=r"tiles\[0\] must be C-contiguous"):
        assemble_tiles(dest, [np.zeros((2, 2, 4), "f4")[:, :, ::2]], [[0, 0]])
    with pytest.raises(ValueError, match="dest must be C-contiguous"):
        assemble_tiles(np.zeros((2, 6, 4), "f4").transpose(0, 2, 1), [], np.empty((0, 2)))
    with pytest.raises(ValueError, match=r"origins must have shape \(1, 2\)"):
        assemble_tiles(dest, [np.zeros((2, 2, 2), "f4")], [0, 0])
    assemble_tiles(dest, [], np.empty((0, 2), np.intp))  # nothing to do is fine
    assert not dest.any()


def test_bad_tile_rectangle_is_filled_across_the_sample_axis() -> None:
    rng = np.random.default_rng(13)
    chunk = rng.random((5, 9, 13)).astype("f4")
    tiles, origins = _split_into_tiles(chunk, (4, 5))
    bad = 4  # an inner tile; its rows everywhere become NaN
    dest = np.empty_like(chunk)
    assemble_tiles(dest, [t for i, t in enumerate(tiles) if i != bad], np.delete(origins, bad, axis=0))
    rect = tiles[bad].shape[1:]
    fill_region(dest, (0, *origins[bad]), (dest.shape[0], *rect), np.nan)
    expected = chunk.copy()
    expected[:, origins[bad][0] : origins[bad][0] + rect[0], origins[bad][1] : origins[bad][1] + rect[1]] = np.nan
    np.testing.assert_array_equal(dest, expected)
    # the same rectangle on a few batch rows only
    batch = chunk.copy()
    fill_region(batch, (1, *origins[bad]), (2, *rect), -7)
    expected = chunk.copy()
    expected[1:3, origins[bad][0] : origins[bad][0] + rect[0], origins[bad][1] : origins[bad][1] + rect[1]] = -7
    np.testing.assert_array_equal(batch, expected)


def test_unbuilt_source_tree_says_how_to_build(tmp_path) -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "insitubatch"
    shutil.copytree(src, tmp_path / "insitubatch", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "import insitubatch"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install -e ." in proc.stderr
    assert "BuildError" in proc.stderr
