"""Built-in chunk transforms against the same math done in numpy on zarr-python reads."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import smooth_field, write_array

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.tools.check_transform import read_chunk
from insitubatch.tools.gil_probe import SCHEDSTAT_PATH, _usable_cpus, gil_probe
from insitubatch.transforms import (
    ChunkRead,
    Coarsen,
    DecodedChunk,
    KelvinToCelsius,
    Regrid,
    StandardScaler,
    applies,
    kelvin_to_celsius,
)

# the probe measures with the kernel's per-thread accounting, or with several cores
_CAN_PROBE = Path(SCHEDSTAT_PATH).exists() or _usable_cpus() > 1

N_TIME, N_LEVEL, N_LAT, N_LON = 37, 3, 6, 8
LAT = np.linspace(50.0, 0.0, N_LAT)  # descending, as in ERA5
LON = np.arange(N_LON) * 45.0


@pytest.fixture
def era5(tmp_path):
    """v3 group: surface t2m/u10 (inner-tiled 2x2, partial last chunk), per-level z, coordinates."""
    rng = np.random.default_rng(7)
    root = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    arrays = {
        "t2m": write_array(root, "t2m", 270 + 10 * smooth_field(rng, (N_TIME, N_LAT, N_LON)), (8, 3, 4),
                           dims=("time", "lat", "lon")),
        "u10": write_array(root, "u10", smooth_field(rng, (N_TIME, N_LAT, N_LON)), (8, N_LAT, N_LON),
                           dims=("time", "lat", "lon")),
        "z": write_array(root, "z", 5000 + 100 * smooth_field(rng, (N_TIME, N_LEVEL, N_LAT, N_LON)),
                         (8, N_LEVEL, N_LAT, N_LON), dims=("time", "level", "lat", "lon")),
    }  # fmt: skip
    write_array(root, "lat", LAT, (N_LAT,), dims=("lat",))
    write_array(root, "lon", LON, (N_LON,), dims=("lon",))
    return tmp_path / "era5.zarr", arrays


def _chunk(path: str, data: np.ndarray, index: int = 0) -> DecodedChunk:
    data = np.ascontiguousarray(data)
    data.flags.writeable = False  # the engine may hand out read-only memory
    return DecodedChunk(ChunkRead(path, index), data, index * 8)


def _zarr_chunks(arr: zarr.Array):
    """Each sample-axis chunk of ``arr`` as zarr-python reads it, with its index."""
    size = arr.chunks[0]
    for c in range(-(-arr.shape[0] // size)):
        yield c, arr[c * size : (c + 1) * size]


def _dataset_batches(path, chunk_transforms, variables=("t2m", "u10")):
    """Every batch of one sequential pass over all samples, keyed by sample index."""
    geoms = open_geometries(str(path), variables=list(variables))
    manifest = split_by_chunk(geoms["t2m"], fractions={"all": 1.0})
    rows: dict[str, dict[int, np.ndarray]] = {v: {} for v in variables}
    with InSituDataset(str(path), manifest, geoms, batch_size=5, shuffle=False,
                       chunk_transforms=chunk_transforms) as ds:  # fmt: skip
        for batch in ds.split("all"):
            for label in variables:
                for i, row in zip(batch.sample_indices.tolist(), batch.arrays[label]):
                    rows[label][i] = row.copy()
    return {label: np.stack([r[i] for i in sorted(r)]) for label, r in rows.items()}


# -- kelvin_to_celsius ----------------------------------------------------------------
def test_kelvin_to_celsius_matches_numpy_on_every_zarr_chunk(era5) -> None:
    _, arrays = era5
    for c, x in _zarr_chunks(arrays["t2m"]):
        chunk = _chunk("t2m", x, c)
        out = kelvin_to_celsius(chunk)
        assert out.data.dtype == np.float32
        np.testing.assert_array_equal(out.data, x - np.float32(273.15))
        np.testing.assert_array_equal(chunk.data, x)  # the input is untouched
        assert out.read == chunk.read and out.sample_offset == chunk.sample_offset


def test_kelvin_to_celsius_keeps_float64_and_refuses_integers() -> None:
    x = np.full((2, 3), 300.0)
    np.testing.assert_array_equal(kelvin_to_celsius(_chunk("t", x)).data, x - 273.15)
    with pytest.raises(TypeError, match="floating-point.*'t'.*int16"):
        kelvin_to_celsius(_chunk("t", x.astype("i2")))
    assert isinstance(kelvin_to_celsius, KelvinToCelsius)
    assert kelvin_to_celsius.cache_key == KelvinToCelsius().cache_key


def test_kelvin_to_celsius_through_the_dataset_only_where_scoped(era5) -> None:
    path, arrays = era5
    got = _dataset_batches(path, [applies(["t2m"], kelvin_to_celsius)])
    np.testing.assert_array_equal(got["t2m"], arrays["t2m"][:] - np.float32(273.15))
    np.testing.assert_array_equal(got["u10"], arrays["u10"][:])


# -- StandardScaler -------------------------------------------------------------------
def _surface_and_level_scaler(arrays) -> StandardScaler:
    t2m, z = arrays["t2m"][:], arrays["z"][:]
    return StandardScaler(
        mean={"t2m": np.full((1, 1), t2m.mean()), "z": z.mean(axis=(0, 2, 3)).reshape(N_LEVEL, 1, 1)},
        std={"t2m": np.full((1, 1), t2m.std()), "z": z.std(axis=(0, 2, 3)).reshape(N_LEVEL, 1, 1)},
    )


def test_standard_scaler_matches_numpy_surface_and_per_level(era5) -> None:
    _, arrays = era5
    scaler = _surface_and_level_scaler(arrays)
    for path in ("t2m", "z"):
        m, s = scaler.mean[path], scaler.std[path]
        for c, x in _zarr_chunks(arrays[path]):
            out = scaler(_chunk(path, x, c)).data
            assert out.dtype == np.float32 and out.shape == x.shape
            # the same math in the chunk's dtype is bit-identical...
            same_dtype = (x - m.astype(np.float32)) / (s + scaler.eps).astype(np.float32)
            np.testing.assert_array_equal(out, same_dtype)
            # ...and float64 math agrees to float32 precision
            np.testing.assert_allclose(out, (x.astype(np.float64) - m) / (s + scaler.eps), rtol=0, atol=2e-5)


def test_standard_scaler_standardizes_to_zero_mean_unit_std(era5) -> None:
    _, arrays = era5
    scaler = _surface_and_level_scaler(arrays)
    full = scaler(_chunk("z", arrays["z"][:])).data
    np.testing.assert_allclose(full.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    np.testing.assert_allclose(full.std(axis=(0, 2, 3)), 1, atol=1e-4)


def test_standard_scaler_through_the_dataset(era5) -> None:
    path, arrays = era5
    scaler = StandardScaler({"t2m": 280.0}, {"t2m": 5.0})
    got = _dataset_batches(path, [applies(["t2m"], scaler)])
    x = arrays["t2m"][:]
    np.testing.assert_array_equal(got["t2m"], (x - np.float32(280.0)) / np.float32(5.0 + scaler.eps))
    np.testing.assert_array_equal(got["u10"], arrays["u10"][:])


@pytest.mark.parametrize(
    ("mean", "std", "kwargs", "error", "match"),
    [
        ({"a": 0.0}, {"b": 1.0}, {}, ValueError, r"same array paths; only in mean: \['a'\], only in std: \['b'\]"),
        ({}, {}, {}, ValueError, "at least one array path"),
        ({"a": np.nan}, {"a": 1.0}, {}, ValueError, r"mean\['a'\] has 1 non-finite"),
        ({"a": 0.0}, {"a": [1.0, np.inf]}, {}, ValueError, r"std\['a'\] has 1 non-finite"),
        ({"a": 0.0}, {"a": [1.0, -0.5]}, {}, ValueError, r"std\['a'\] has negative values"),
        ({"a": np.zeros(3)}, {"a": np.ones(4)}, {}, ValueError, r"shape \(3,\).*shape \(4,\) do not broadcast"),
        ({"a": 0.0}, {"a": 0.0}, {"eps": 0.0}, ValueError, "zeros and eps=0"),
        ({"a": 0.0}, {"a": 1.0}, {"eps": -1.0}, ValueError, "eps=-1.0 must be finite and >= 0"),
        ({"a": "x"}, {"a": 1.0}, {}, TypeError, r"mean\['a'\] must be numeric"),
        ([0.0], {"a": 1.0}, {}, TypeError, "mean must be a dict"),
        ({"a": 0.0}, {"a": 1.0}, {"cache_key": 3}, TypeError, "cache_key must be a non-empty str"),
    ],
)
def test_standard_scaler_rejects_bad_statistics(mean, std, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        StandardScaler(mean, std, **kwargs)


def test_standard_scaler_scope_and_shape_errors_name_what_is_wrong() -> None:
    scaler = StandardScaler({"t2m": 280.0, "z": np.ones((3, 1, 1))}, {"t2m": 5.0, "z": np.ones((3, 1, 1))})
    scaler.validate_scope(["t2m", "z"])
    with pytest.raises(ValueError, match=r"scoped to \['u10'\].*statistics for \['t2m', 'z'\]"):
        scaler.validate_scope(["t2m", "u10"])
    with pytest.raises(KeyError, match=r"no statistics for array 'u10'.*applies"):
        scaler(_chunk("u10", np.zeros((2, 4, 5), "f4")))
    with pytest.raises(ValueError, match=r"mean\['z'\] has shape \(3, 1, 1\).*inner shape \(4, 4, 5\)"):
        scaler(_chunk("z", np.zeros((2, 4, 4, 5), "f4")))
    with pytest.raises(ValueError, match=r"inner shape \(4, 5\)"):  # more stat axes than inner axes
        scaler(_chunk("z", np.zeros((2, 4, 5), "f4")))
    with pytest.raises(TypeError, match="floating-point.*'t2m'.*int32"):
        scaler(_chunk("t2m", np.zeros((2, 4, 5), "i4")))


def test_standard_scaler_save_load_round_trip(tmp_path, era5) -> None:
    _, arrays = era5
    scaler = _surface_and_level_scaler(arrays)
    # a group path and a file name without .npz: written exactly where asked
    scaler = StandardScaler({**scaler.mean, "g/t": 1.5}, {**scaler.std, "g/t": 0.0}, eps=1e-3)
    saved = scaler.save(tmp_path / "stats.bin")
    assert saved == tmp_path / "stats.bin" and saved.exists()
    loaded = StandardScaler.load(saved)
    assert loaded.paths == scaler.paths and loaded.eps == scaler.eps
    assert loaded.cache_key == scaler.cache_key
    for p in scaler.paths:
        np.testing.assert_array_equal(loaded.mean[p], scaler.mean[p])
        np.testing.assert_array_equal(loaded.std[p], scaler.std[p])
    x = arrays["z"][:8]
    np.testing.assert_array_equal(loaded(_chunk("z", x)).data, scaler(_chunk("z", x)).data)
    keyed = StandardScaler({"a": 1.0}, {"a": 2.0}, cache_key="stats-v7")
    assert StandardScaler.load(keyed.save(tmp_path / "keyed.npz")).cache_key == "stats-v7"
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="not a StandardScaler file"):
        StandardScaler.load(tmp_path / "other.npz")


def test_standard_scaler_cache_key_follows_the_statistics() -> None:
    a = StandardScaler({"t": 1.0}, {"t": 2.0})
    assert a.cache_key == StandardScaler({"t": 1.0}, {"t": 2.0}).cache_key
    assert a.cache_key != StandardScaler({"t": 1.0}, {"t": 2.5}).cache_key  # a re-fit is a new identity
    assert a.cache_key != StandardScaler({"t": 1.0}, {"t": 2.0}, eps=1e-3).cache_key
    assert StandardScaler({"t": 1.0}, {"t": 2.0}, cache_key="v1").cache_key == "v1"
    # replace() hands the old derived key back in; it is derived again, not kept
    assert dataclasses.replace(a, eps=1e-3).cache_key == StandardScaler({"t": 1.0}, {"t": 2.0}, eps=1e-3).cache_key
    assert "cache_key=" in repr(a) and "array(" not in repr(a)  # a short, stable repr


def test_standard_scaler_statistics_cannot_be_mutated_behind_its_back() -> None:
    mean = {"t": np.array([[1.0]])}
    scaler = StandardScaler(mean, {"t": np.array([[2.0]])})
    mean["t"][0, 0] = 99.0  # the caller's array, not the scaler's
    assert scaler.mean["t"][0, 0] == 1.0
    with pytest.raises(ValueError, match="read-only"):
        scaler.mean["t"][0, 0] = 5.0


# -- Regrid ---------------------------------------------------------------------------
GRID = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype="f4")  # rows: lat 20, 10, 0


def _reference_bilinear(x: np.ndarray, src_lat, src_lon, dst_lat, dst_lon) -> np.ndarray:
    """Separable bilinear with ``np.interp``: along longitude per row, then along latitude per column."""
    lat_order = np.argsort(src_lat)
    lat_sorted = np.asarray(src_lat)[lat_order]
    flat = x.reshape(-1, len(src_lat), len(src_lon)).astype(np.float64)
    out = np.empty((flat.shape[0], len(dst_lat), len(dst_lon)))
    for f, field2d in enumerate(flat):
        rows = np.stack([np.interp(dst_lon, src_lon, field2d[i]) for i in lat_order])
        out[f] = np.stack([np.interp(dst_lat, lat_sorted, rows[:, j]) for j in range(len(dst_lon))], axis=1)
    return out.reshape(*x.shape[:-2], len(dst_lat), len(dst_lon))


def test_regrid_hand_computed_values() -> None:
    regrid = Regrid([20.0, 10.0, 0.0], [0.0, 10.0, 20.0], [5.0, 12.5], [15.0, 2.5])
    out = regrid(_chunk("t", GRID[None])).data
    assert out.shape == (1, 2, 2) and out.dtype == np.float32
    # (5, 15): halfway between rows lat 10/0 and columns lon 10/20 -> (5 + 6 + 8 + 9) / 4
    assert out[0, 0, 0] == pytest.approx(7.0)
    # (12.5, 2.5): 0.25 of row lat 20 + 0.75 of row lat 10; 0.75 of lon 0 + 0.25 of lon 10
    assert out[0, 1, 1] == pytest.approx(0.25 * (0.75 * 1 + 0.25 * 2) + 0.75 * (0.75 * 4 + 0.25 * 5))
    assert regrid.index.shape == (4, 4) and regrid.weights.shape == (4, 4)
    np.testing.assert_allclose(regrid.weights.sum(axis=0), 1.0)


def test_regrid_reproduces_a_bilinear_function_exactly() -> None:
    src_lat, src_lon = np.linspace(60, -60, 13), np.linspace(0, 350, 36)
    dst_lat, dst_lon = np.linspace(-55, 55, 7), np.linspace(3, 347, 11)

    def f(lat, lon):
        return 1 + 0.2 * lat[:, None] - 0.05 * lon[None, :] + 0.001 * lat[:, None] * lon[None, :]

    out = Regrid(src_lat, src_lon, dst_lat, dst_lon)(_chunk("t", f(src_lat, src_lon)[None])).data
    np.testing.assert_allclose(out[0], f(dst_lat, dst_lon), rtol=1e-12, atol=1e-12)


def test_regrid_matches_numpy_reference_on_zarr_chunks(era5) -> None:
    _, arrays = era5
    dst_lat, dst_lon = np.linspace(48, 2, 5), np.linspace(10, 300, 9)
    regrid = Regrid(LAT, LON, dst_lat, dst_lon)
    for path in ("t2m", "z"):
        for c, x in _zarr_chunks(arrays[path]):
            out = regrid(_chunk(path, x, c)).data
            assert out.shape == (*x.shape[:-2], 5, 9) and out.dtype == np.float32
            np.testing.assert_allclose(out, _reference_bilinear(x, LAT, LON, dst_lat, dst_lon), rtol=1e-6)


def test_regrid_identity_when_source_equals_target(era5) -> None:
    _, arrays = era5
    x = arrays["t2m"][:8]
    np.testing.assert_array_equal(Regrid(LAT, LON, LAT, LON)(_chunk("t2m", x)).data, x)
    # a NaN stays where it is: a zero weight never pulls a neighbour's NaN in
    holed = x.copy()
    holed[0, 2, 3] = np.nan
    out = Regrid(LAT, LON, LAT, LON)(_chunk("t2m", holed)).data
    assert np.isnan(out).sum() == 1 and np.isnan(out[0, 2, 3])


def test_regrid_descending_source_equals_ascending_flipped() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 8)).astype("f4")
    dst_lat, dst_lon = [33.0, 7.5, 41.0], [12.0, 200.0]
    down = Regrid(LAT, LON, dst_lat, dst_lon)(_chunk("t", x)).data
    up = Regrid(LAT[::-1], LON, dst_lat, dst_lon)(_chunk("t", x[:, ::-1])).data
    np.testing.assert_allclose(down, up, rtol=1e-6)


def test_regrid_out_of_range_raises_or_clamps() -> None:
    with pytest.raises(ValueError, match=r"1 target lat value\(s\) lie outside.*\[0.0, 50.0\].*out_of_range='clamp'"):
        Regrid(LAT, LON, [60.0], [90.0])
    with pytest.raises(ValueError, match="periodic_lon=True"):
        Regrid(LAT, LON, [10.0], [330.0])
    with pytest.raises(ValueError, match="out_of_range='wrap' must be one of"):
        Regrid(LAT, LON, LAT, LON, out_of_range="wrap")
    clamp = Regrid([20.0, 10.0, 0.0], [0.0, 10.0, 20.0], [30.0, -5.0], [-3.0, 25.0], out_of_range="clamp")
    out = clamp(_chunk("t", GRID[None])).data[0]
    np.testing.assert_array_equal(out, [[GRID[0, 0], GRID[0, 2]], [GRID[2, 0], GRID[2, 2]]])


def test_regrid_periodic_longitude_wraps_the_seam() -> None:
    src_lon = np.arange(0.0, 360.0, 90.0)  # 0, 90, 180, 270
    x = np.array([[[0.0, 10.0, 20.0, 30.0]]])  # one latitude row
    regrid = Regrid([0.0], src_lon, [0.0], [315.0, -45.0, 45.0, 675.0], periodic_lon=True)
    np.testing.assert_allclose(regrid(_chunk("t", x)).data[0, 0], [15.0, 15.0, 5.0, 15.0])
    with pytest.raises(ValueError, match="not less than one period"):
        Regrid([0.0], np.linspace(0, 360, 5), [0.0], [10.0], periodic_lon=True)


def test_regrid_output_inner_and_shape_errors(era5) -> None:
    path, _ = era5
    geoms = open_geometries(str(path))
    regrid = Regrid(LAT, LON, [1.0, 2.0], [3.0, 4.0, 5.0])
    assert regrid.output_inner(geoms["t2m"]) == ((2, 3), np.dtype("f4"))
    assert regrid.output_inner(geoms["z"]) == ((N_LEVEL, 2, 3), np.dtype("f4"))
    other = Regrid([0.0, 1.0], [0.0, 1.0], [0.5], [0.5])
    with pytest.raises(ValueError, match=r"'t2m' to end in the source grid \(2, 2\).*\(6, 8\)"):
        other.output_inner(geoms["t2m"])
    with pytest.raises(ValueError, match=r"source grid \(2, 2\)"):
        other(_chunk("u", np.zeros((1, 3, 3))))
    with pytest.raises(ValueError, match="strictly increasing or strictly decreasing"):
        Regrid([0.0, 1.0, 0.5], [0.0, 1.0], [0.5], [0.5])


def test_regrid_integer_data_rounds_back_to_its_dtype() -> None:
    x = (GRID[None] * 10).astype("i2")
    out = Regrid([20.0, 10.0, 0.0], [0.0, 10.0, 20.0], [5.0], [15.0])(_chunk("t", x)).data
    assert out.dtype == np.int16 and out[0, 0, 0] == 70


def test_regrid_cache_key_follows_the_grids() -> None:
    a = Regrid(LAT, LON, [1.0], [2.0])
    assert a.cache_key == Regrid(LAT, LON, [1.0], [2.0]).cache_key
    assert a.cache_key != Regrid(LAT, LON, [1.0], [2.5]).cache_key
    assert a.cache_key != Regrid(LAT, LON, [1.0], [2.0], out_of_range="clamp").cache_key
    assert dataclasses.replace(a, dst_lon=[3.0]).cache_key == Regrid(LAT, LON, [1.0], [3.0]).cache_key


def test_regrid_through_the_dataset_reshapes_only_its_array(era5) -> None:
    path, arrays = era5
    dst_lat, dst_lon = np.linspace(45, 5, 4), np.linspace(0, 315, 5)
    got = _dataset_batches(path, [applies(["t2m"], Regrid(LAT, LON, dst_lat, dst_lon))])
    assert got["t2m"].shape == (N_TIME, 4, 5)
    np.testing.assert_allclose(got["t2m"], _reference_bilinear(arrays["t2m"][:], LAT, LON, dst_lat, dst_lon), rtol=1e-6)
    np.testing.assert_array_equal(got["u10"], arrays["u10"][:])


# -- Coarsen --------------------------------------------------------------------------
def test_coarsen_matches_numpy_block_mean_on_zarr_chunks(era5) -> None:
    _, arrays = era5
    coarsen = Coarsen(2)
    for c, x in _zarr_chunks(arrays["t2m"]):
        out = coarsen(_chunk("t2m", x, c)).data
        blocks = x.reshape(len(x), N_LAT // 2, 2, N_LON // 2, 2)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, blocks.mean(axis=(2, 4)))  # the same math in float32
        np.testing.assert_allclose(out, blocks.astype(np.float64).mean(axis=(2, 4)), rtol=1e-6, atol=1e-4)


def test_coarsen_axes_block_widths_and_trim(era5) -> None:
    _, arrays = era5
    z = arrays["z"][:8]  # (8, 3, 6, 8)
    out = Coarsen((3, 4), axes=(0, -1))(_chunk("z", z)).data
    np.testing.assert_allclose(out, z.reshape(8, 1, 3, N_LAT, 2, 4).mean(axis=(2, 5)), rtol=1e-6)
    with pytest.raises(ValueError, match=r"k=4 does not divide inner axis 0 of array 't2m' \(length 6.*trim=True"):
        Coarsen(4)(_chunk("t2m", arrays["t2m"][:8]))
    trimmed = Coarsen(4, trim=True)(_chunk("t2m", arrays["t2m"][:8])).data
    np.testing.assert_allclose(trimmed, arrays["t2m"][:8, :4, :8].reshape(8, 1, 4, 2, 4).mean(axis=(2, 4)), rtol=1e-6)
    with pytest.raises(ValueError, match="inner axis 2, but array 't2m' has inner shape"):
        Coarsen(2, axes=(2,))(_chunk("t2m", arrays["t2m"][:8]))
    with pytest.raises(ValueError, match="k=0 must be ints >= 1"):
        Coarsen(0)
    with pytest.raises(ValueError, match="2 block widths for 1 axes"):
        Coarsen((2, 2), axes=(-1,))


def test_coarsen_output_inner_and_integer_input(era5) -> None:
    path, _ = era5
    geoms = open_geometries(str(path))
    assert Coarsen(2).output_inner(geoms["t2m"]) == ((3, 4), np.dtype("f4"))
    assert Coarsen(3, axes=(0,)).output_inner(geoms["z"]) == ((1, N_LAT, N_LON), np.dtype("f4"))
    assert Coarsen(4, trim=True).output_inner(geoms["t2m"]) == ((1, 2), np.dtype("f4"))
    x = np.arange(2 * 4 * 4, dtype="i4").reshape(2, 4, 4)
    out = Coarsen(2)(_chunk("i", x)).data
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, x.reshape(2, 2, 2, 2, 2).mean(axis=(2, 4)))
    assert Coarsen(2).cache_key == Coarsen((2, 2)).cache_key != Coarsen(2, trim=True).cache_key


def test_coarsen_through_the_dataset_reshapes_only_its_array(era5) -> None:
    path, arrays = era5
    got = _dataset_batches(path, [applies(["u10"], Coarsen(2))])
    u = arrays["u10"][:]
    np.testing.assert_array_equal(got["u10"], u.reshape(N_TIME, 3, 2, 4, 2).mean(axis=(2, 4)))
    np.testing.assert_array_equal(got["t2m"], arrays["t2m"][:])


# -- all of them ----------------------------------------------------------------------
def test_read_chunk_assembles_tiles_like_zarr(era5) -> None:
    path, arrays = era5
    g = open_geometries(str(path), variables=["t2m"])["t2m"]
    assert g.tiles_per_chunk == 4
    np.testing.assert_array_equal(read_chunk(zarr.open_group(path, mode="r").store, g, 4), arrays["t2m"][32:37])


@pytest.mark.parametrize(
    "make",
    [
        lambda: kelvin_to_celsius,
        lambda: StandardScaler({"t": 280.0}, {"t": 5.0}),
        lambda: Regrid(
            np.linspace(90, -90, 181), np.arange(0, 360.0), np.linspace(89, -89, 90), np.arange(0, 360.0, 2)
        ),
        lambda: Coarsen(2, trim=True),
    ],
    ids=["kelvin_to_celsius", "StandardScaler", "Regrid", "Coarsen"],
)
def test_builtins_release_the_gil(make) -> None:
    x = 280 + np.random.default_rng(0).standard_normal((4, 181, 360)).astype("f4")
    probe = gil_probe(make(), _chunk("t", x))
    assert probe is not None or not _CAN_PROBE, "the GIL probe gave no verdict on a machine that can run it"
    assert probe is None or not probe.holds_gil, probe


# -- the runnable examples --------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("transforms.py", "epoch 1"),
        ("fit_scaler.py", "standardized train is within"),
    ],
)
def test_examples_run_offline(tmp_path, script, expect) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--path", str(tmp_path / "demo.zarr")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(EXAMPLES.parent), os.environ.get("PYTHONPATH")]))),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert expect in done.stdout
