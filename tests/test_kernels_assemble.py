"""The tile assembly kernel against numpy slicing."""

from __future__ import annotations

import numpy as np
import pytest

from insitubatch.kernels import fill_region, place_tile

DTYPES = ["u1", "i2", "<f4", ">f8", "c8", "bool", "M8[s]"]


def _random_case(rng: np.random.Generator, ndim: int):
    dst_shape = tuple(int(x) for x in rng.integers(1, 7, size=ndim))
    tile_shape = tuple(int(rng.integers(0, d + 1)) for d in dst_shape)
    origin = tuple(int(rng.integers(0, d - t + 1)) for d, t in zip(dst_shape, tile_shape))
    return dst_shape, tile_shape, origin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 5])
def test_place_tile_matches_numpy_slicing(dtype: str, ndim: int) -> None:
    rng = np.random.default_rng(ndim * 31 + len(dtype))
    for _ in range(25):
        dst_shape, tile_shape, origin = _random_case(rng, ndim)
        dst = rng.integers(0, 100, size=dst_shape).astype(dtype)
        tile = rng.integers(0, 100, size=tile_shape).astype(dtype)
        expected = dst.copy()
        expected[tuple(slice(o, o + t) for o, t in zip(origin, tile_shape))] = tile
        place_tile(dst, tile, origin)
        np.testing.assert_array_equal(dst, expected)


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
    dst = np.zeros((4, 6), "f4")
    with pytest.raises(ValueError, match="tile must be C-contiguous"):
        place_tile(dst, np.zeros((4, 6), "f4")[:, ::2], (0, 0))
    with pytest.raises(ValueError, match="dst must be C-contiguous"):
        place_tile(np.zeros((6, 4), "f4").T, np.zeros((2, 2), "f4"), (0, 0))


def test_bad_geometry_names_the_problem() -> None:
    dst = np.zeros((4, 6), "f4")
    with pytest.raises(ValueError, match="dtype float64 does not match dst dtype float32"):
        place_tile(dst, np.zeros((2, 2), "f8"), (0, 0))
    with pytest.raises(ValueError, match="on axis 1 does not fit"):
        place_tile(dst, np.zeros((2, 2), "f4"), (0, 5))
    with pytest.raises(ValueError, match="destination has 2 dims"):
        place_tile(dst, np.zeros((2,), "f4"), (0,))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros((4, 6), "f4")
        ro.flags.writeable = False
        place_tile(ro, np.zeros((2, 2), "f4"), (0, 0))


def test_unbuilt_source_tree_says_how_to_build(tmp_path) -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "insitubatch"
    shutil.copytree(src, tmp_path / "insitubatch", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-c", "import insitubatch"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "pip install -e ." in proc.stderr
    assert "BuildError" in proc.stderr
