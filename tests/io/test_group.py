"""Opening a group: data variables, statics and coordinates sorted; no listing when the arrays are named."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr

from insitubatch import StoreReadError, obstore_store
from insitubatch.io.group import open_geometries, scan_group
from insitubatch.testing.emulator import Emulator


def _weather_group(path, *, zarr_format: int = 3, attr_dims: bool = False):
    """time x lat x lon data, a level variable, statics (2-D mask, 0-D scalar), coordinates and a grid mapping."""
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)

    def make(name, shape, dims, dtype="f4", chunks=None):
        kwargs = {} if attr_dims or zarr_format == 2 else {"dimension_names": dims}
        arr = root.create_array(name, shape=shape, chunks=chunks or shape, dtype=dtype, **kwargs)
        if attr_dims or zarr_format == 2:
            arr.attrs["_ARRAY_DIMENSIONS"] = list(dims)
        return arr

    make("time", (12,), ("time",), "i8")[:] = np.arange(12)
    make("lat", (4,), ("lat",))[:] = [60, 30, 0, -30]
    make("lon", (6,), ("lon",))[:] = np.arange(6) * 60
    make("t2m", (12, 4, 6), ("time", "lat", "lon"), chunks=(4, 4, 6))[:] = 1
    make("series", (12,), ("time",), chunks=(4,))[:] = 2
    make("lsm", (4, 6), ("lat", "lon"))[:] = 3
    make("scale", (), ())[...] = 4
    crs = root.create_array("crs", shape=(), dtype="i4")
    crs.attrs["grid_mapping_name"] = "latitude_longitude"
    return path


@pytest.mark.parametrize(("zarr_format", "attr_dims"), [(3, False), (3, True), (2, False)])
def test_variables_statics_and_coordinates_are_sorted(tmp_path, zarr_format, attr_dims) -> None:
    path = _weather_group(tmp_path / "g.zarr", zarr_format=zarr_format, attr_dims=attr_dims)
    contents = scan_group(str(path))
    assert sorted(contents.variables) == ["series", "t2m"]  # the 1-D series over time is data
    assert sorted(contents.statics) == ["lsm", "scale"]
    assert contents.sample_dim == "time"
    left_out = contents.left_out()
    assert left_out["lsm"].startswith("static") and left_out["scale"].startswith("static")
    assert left_out["crs"] == "grid mapping"
    assert {left_out[c] for c in ("time", "lat", "lon")} == {
        "coordinate of dimension 'time'",
        "coordinate of dimension 'lat'",
        "coordinate of dimension 'lon'",
    }
    assert sorted(open_geometries(str(path))) == ["series", "t2m"]


def test_coordinates_are_read_once_and_decoded(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "c.zarr", mode="w")
    times = np.arange("2020-01-01T00", "2020-01-02T00", np.timedelta64(6, "h"), dtype="datetime64[ns]")
    root.create_array("time", shape=(4,), dtype="M8[ns]", dimension_names=("time",))[:] = times
    sub = root.create_group("surface")
    sub.create_array("t2m", shape=(4, 3), chunks=(2, 3), dtype="f4", dimension_names=("time", "x"))
    g = open_geometries(str(tmp_path / "c.zarr"))["surface/t2m"]
    np.testing.assert_array_equal(g.coord("time"), times)  # found in the parent group
    assert g.coord("time") is g.coord("time")  # read once
    with pytest.raises(KeyError, match="dimension 'x' has no coordinate array"):
        g.coord("x")
    with pytest.raises(KeyError, match="no dimension 'level'; its dimensions are"):
        g.coord("level")


def test_coord_or_none_is_coord_or_none_where_the_store_has_no_coordinate(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "o.zarr", mode="w")
    root.create_array("x", shape=(3,), dtype="f8", dimension_names=("x",))[:] = [10.0, 20.0, 30.0]
    root.create_array("v", shape=(4, 3, 2), chunks=(2, 3, 2), dtype="f4", dimension_names=("time", "x", "y"))
    g = open_geometries(str(tmp_path / "o.zarr"))["v"]
    assert g.coord_or_none("time") is None and g.coord_or_none("y") is None  # no coordinate arrays: no error
    np.testing.assert_array_equal(g.coord_or_none("x"), zarr.open_array(tmp_path / "o.zarr", path="x")[:])
    np.testing.assert_array_equal(g.isel(x=[2, 0]).coord_or_none("x"), [30.0, 10.0])  # the selection applies
    assert g.isel(x=1).coord_or_none("x") == 20.0
    with pytest.raises(KeyError, match="no dimension 'level'; its dimensions are"):
        g.coord_or_none("level")


def test_a_one_dimensional_variable_has_one_tile(tmp_path) -> None:
    path = _weather_group(tmp_path / "g.zarr")
    g = open_geometries(str(path))["series"]
    assert g.inner_shape == () and g.tiles_per_chunk == 1
    assert g.tile_origins().shape == (1, 0) and g.tile_shapes().shape == (1, 0)


@pytest.fixture
def served(tmp_path):
    _weather_group(tmp_path / "plain.zarr")
    _weather_group(tmp_path / "consolidated.zarr")
    with pytest.warns(UserWarning, match="Consolidated metadata"):  # zarr: not part of the v3 spec yet
        zarr.consolidate_metadata(str(tmp_path / "consolidated.zarr"))
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        yield emu


def _unlistable(served, name):
    """An HTTP store whose listing fails at once (HTTP cannot list; no retries): listing would raise."""
    return obstore_store(served.url_for(name), read_only=True, retry={"max_retries": 0})


def test_named_variables_open_over_http_without_listing(served) -> None:
    geoms = open_geometries(_unlistable(served, "plain.zarr"), variables=["t2m", "series"])
    assert sorted(geoms) == ["series", "t2m"]
    assert geoms["t2m"].coord("lat").tolist() == [60, 30, 0, -30]


def test_consolidated_metadata_lists_without_the_store(served) -> None:
    with warnings.catch_warnings():  # some zarr lines warn that v3 consolidation is not in the spec yet
        warnings.filterwarnings("ignore", message="Consolidated metadata")
        assert sorted(open_geometries(_unlistable(served, "consolidated.zarr"))) == ["series", "t2m"]


def test_a_store_that_cannot_list_says_what_to_pass(served) -> None:
    store = _unlistable(served, "plain.zarr")
    with pytest.raises(StoreReadError, match="consolidated metadata .* pass variables=") as info:
        open_geometries(store)
    assert "\n" not in str(info.value) and info.value.__cause__ is not None
    with pytest.raises(ValueError, match="variable 'nope' is not an array .*cannot list"):
        open_geometries(store, variables=["nope"])


def test_a_group_of_only_coordinates_or_nothing_raises_naming_what_it_holds(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "coords.zarr", mode="w")
    root.create_array("time", shape=(4,), dtype="i8", dimension_names=("time",))
    root.create_array("lat", shape=(3,), dtype="f4", dimension_names=("lat",))
    with pytest.raises(ValueError, match="no data variable") as info:
        open_geometries(str(tmp_path / "coords.zarr"))
    message = str(info.value)
    assert "'time' (coordinate of dimension 'time')" in message and "'lat'" in message
    assert "variables=[...]" in message
    zarr.open_group(tmp_path / "empty.zarr", mode="w")
    with pytest.raises(ValueError, match="holds no arrays at all"):
        open_geometries(str(tmp_path / "empty.zarr"))


def test_each_variable_is_sampled_along_the_sample_dimension_wherever_it_lies(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "t.zarr", mode="w")
    root.create_array("a", shape=(8, 3, 4), chunks=(4, 3, 4), dtype="f4", dimension_names=("time", "y", "x"))
    root.create_array("b", shape=(3, 4, 8), chunks=(3, 4, 4), dtype="f4", dimension_names=("y", "x", "time"))
    geoms = open_geometries(str(tmp_path / "t.zarr"))
    assert geoms["a"].sample_axis == 0 and geoms["b"].sample_axis == 2
    assert geoms["b"].inner_shape == (3, 4) and geoms["b"].n_samples == 8
