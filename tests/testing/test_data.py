"""The one data generator's presets, read back by zarr-python and xarray (the oracles)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from insitubatch.testing.data import (
    DATED_LAT,
    DATED_LON,
    DEMO_VARIABLES,
    ERA5_LEVELS,
    ERA5_LEVELS_13,
    dated_field,
    demo,
    era5_13_levels,
    era5_181x360,
    era5_levels_dataset,
    six_hourly,
    write_dated,
    write_era5_levels,
    write_era5_like,
    write_levels,
)
from insitubatch.tools.demo import write_demo_dataset


def test_the_demo_preset_is_what_zarr_reads(tmp_path: Path) -> None:
    path = write_demo_dataset(tmp_path / "demo.zarr", shape=(48, 8, 16), chunks=(16, 8, 8))
    group = zarr.open_group(path, mode="r")
    assert json.loads((path / "zarr.json").read_text())["consolidated_metadata"] is not None
    fields = [group[name][:] for name in DEMO_VARIABLES]
    for name, values in zip(DEMO_VARIABLES, fields):
        assert group[name].shape == (48, 8, 16) and group[name].chunks == (16, 8, 8)
        assert values.dtype == np.float32 and np.isfinite(values).all()
    assert not np.array_equal(fields[0], fields[1])  # each variable its own field
    assert group["time"].attrs["units"].startswith("hours since")
    np.testing.assert_array_equal(group["time"][:], np.arange(48) * 6)


def test_the_demo_keeps_a_group_already_there(tmp_path: Path) -> None:
    path = write_demo_dataset(tmp_path / "demo.zarr", shape=(32, 8, 16), chunks=(16, 8, 8))
    zarr.open_group(path, mode="a").attrs["mine"] = "keep"
    again = write_demo_dataset(path)  # another shape asked for: the group there is the user's, kept as is
    group = zarr.open_group(again, mode="r")
    assert group.attrs["mine"] == "keep" and group["t2m"].shape == (32, 8, 16)


def test_the_demo_refuses_chunks_that_do_not_tile_the_grid() -> None:
    with pytest.raises(ValueError, match=r"chunks=\(16, 6, 8\)"):
        demo((64, 10, 16), (16, 6, 8))
    assert demo((64, 10, 16), (16, 5, 8)).inner_tiles == (2, 2)


def test_the_realistic_preset_tiles_each_chunk_two_by_two(tmp_path: Path) -> None:
    assert era5_181x360(4096).chunks == (8, 91, 180)
    spec = era5_181x360(16, (91, 180))
    path = write_era5_like(tmp_path / spec.name, spec)
    group = zarr.open_group(path, mode="r")
    arr = group["2m_temperature"]
    assert arr.shape == (16, 91, 180) and arr.chunks == (8, 46, 90)
    assert [c["name"] for c in arr.metadata.to_dict()["codecs"]] == ["bytes", "blosc"]
    assert np.isfinite(arr[:]).all()


def test_the_levels_store_is_the_dataset_xarray_reads_back(tmp_path: Path) -> None:
    path = write_era5_levels(tmp_path / "era5.zarr", n_time=8)
    expected = era5_levels_dataset(n_time=8)
    found = xr.open_zarr(path, consolidated=False).load()
    xr.testing.assert_identical(found[list(expected.data_vars)].drop_encoding(), expected)
    np.testing.assert_array_equal(found["level"], ERA5_LEVELS)
    assert zarr.open_group(path, mode="r")["time"].dtype == np.int64  # CF-encoded hours, not native dates


def test_the_block_wise_levels_preset_is_what_xarray_selects_from(tmp_path: Path) -> None:
    spec = era5_13_levels(20, n_lat=16, n_lon=32)
    assert spec.chunks == (8, 1, 4, 8) and spec.shape == (20, 13, 16, 32)
    path = write_levels(tmp_path / "levels.zarr", spec)
    assert json.loads((path / "zarr.json").read_text())["consolidated_metadata"] is not None
    arr = zarr.open_group(path, mode="r")["t"]
    assert arr.chunks == spec.chunks and arr.metadata.dimension_names == ("time", "level", "latitude", "longitude")
    rng = np.random.default_rng(0)  # the values are drawn block by block: 8, 8, then the last 4 steps
    expected = np.concatenate([rng.standard_normal((n, 13, 16, 32), dtype="f4") for n in (8, 8, 4)])
    np.testing.assert_array_equal(arr[:], expected)
    ds = xr.open_zarr(path, consolidated=True)
    np.testing.assert_array_equal(ds["level"], ERA5_LEVELS_13)
    assert ds["latitude"][0] == 90 and ds["latitude"][-1] == -90 and ds["longitude"][0] == 0
    assert ds["time"].values[1] - ds["time"].values[0] == np.timedelta64(6, "h")
    two = ds["t"].sel(level=[850, 500]).values
    np.testing.assert_array_equal(two, expected[:, [ERA5_LEVELS_13.index(850), ERA5_LEVELS_13.index(500)]])


def test_the_levels_writer_holds_one_block_not_the_store(tmp_path: Path) -> None:
    spec = era5_13_levels(128, n_lat=64, n_lon=128, tiles=(1, 1))
    whole = 4 * np.prod(spec.shape)  # 54.5 MB; one block of 8 steps is 3.4 MB
    tracemalloc.start()
    try:
        write_levels(tmp_path / "levels.zarr", spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < whole / 4, f"peak {peak / 1e6:.1f} MB for a {whole / 1e6:.1f} MB store"


def test_the_levels_preset_refuses_tiles_past_the_grid() -> None:
    with pytest.raises(ValueError, match=r"tiles=\(4, 40\)"):
        era5_13_levels(8, n_lon=32, tiles=(4, 40))


def test_the_dated_store_holds_one_value_band_per_step(tmp_path: Path) -> None:
    times = six_hourly("2001-03-01", 10)
    path = write_dated(tmp_path / "dated.zarr", times, chunk=4)
    found = xr.open_zarr(path, consolidated=False)
    np.testing.assert_array_equal(found["time"].values, times)
    values = found["t2m"].values
    assert values.shape == (10, DATED_LAT, DATED_LON)
    np.testing.assert_array_equal(values, dated_field(10))
    steps = np.arange(10)[:, None, None]
    assert ((values >= steps) & (values < steps + 1)).all()
