"""A coordinate's metadata comes from what opening the variables already read: consolidated metadata, a listing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from helpers import CountingStore, local_store
from zarr.errors import ZarrUserWarning

from insitubatch.io.group import open_geometries
from insitubatch.testing.data import era5_levels_dataset, write_era5_levels

METADATA = {2: "time/.zarray", 3: "time/zarr.json"}


def _write(path, zarr_format: int, consolidated: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)  # v3 consolidated metadata is not in the spec yet
        return write_era5_levels(path, zarr_format=zarr_format, consolidated=consolidated)


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("consolidated", [True, False], ids=["consolidated", "plain"])
def test_named_variables_on_a_consolidated_store_read_the_coordinate_in_one_get(
    tmp_path, zarr_format, consolidated
) -> None:
    path = _write(tmp_path / "e.zarr", zarr_format, consolidated)
    store = CountingStore(local_store(path))
    g = open_geometries(store, variables=["t2m"])["t2m"]
    store.reset()
    times = g.coord("time")
    np.testing.assert_array_equal(times, xr.open_zarr(path, consolidated=False).time.values)
    # with consolidated metadata only the coordinate's data is read; without, its metadata first
    assert store.gets[METADATA[zarr_format]] == (0 if consolidated else 1)
    assert sum(store.chunk_gets().values()) == 1


def test_the_listed_arrays_give_the_coordinate_without_its_metadata_read(tmp_path) -> None:
    path = _write(tmp_path / "e.zarr", 3, consolidated=True)
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t2m"]  # the group is listed: every array's metadata is in hand
    store.reset()
    np.testing.assert_array_equal(g.coord("time"), xr.open_zarr(path, consolidated=False).time.values)
    assert store.gets[METADATA[3]] == 0


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stale_consolidated_metadata_is_not_trusted_for_a_grown_coordinate(tmp_path, zarr_format) -> None:
    """Steps appended after consolidating: the coordinate is opened afresh, as the variable was."""
    path = _write(tmp_path / "e.zarr", zarr_format, consolidated=True)
    more = era5_levels_dataset(n_time=32).isel(time=slice(24, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        more[["t", "z", "t2m", "gmean"]].to_zarr(path, append_dim="time", consolidated=False)
    store = CountingStore(local_store(path))
    g = open_geometries(store, variables=["t2m"])["t2m"]
    assert g.n_samples == 32
    store.reset()
    np.testing.assert_array_equal(g.coord("time"), xr.open_zarr(path, consolidated=False).time.values)
    assert store.gets[METADATA[zarr_format]] == 1
