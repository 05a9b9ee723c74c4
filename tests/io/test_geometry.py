"""ArrayGeometry and open_geometries against zarr's own metadata and indexing."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store

from insitubatch.io.arrays import geometry_of
from insitubatch.io.group import open_geometries


@pytest.fixture
def cf_group(tmp_path):
    """An xarray/CF-shaped v3 group: coordinates, a grid mapping and data variables."""
    root = zarr.open_group(tmp_path / "cf.zarr", mode="w")
    root.create_array("time", shape=(10,), chunks=(10,), dtype="i8", dimension_names=("time",))
    root.create_array("lat", shape=(5,), chunks=(5,), dtype="f4", dimension_names=("lat",))
    root.create_array("spatial_ref", shape=(), dtype="i4")
    root.create_array("t2m", shape=(10, 5, 6), chunks=(4, 5, 3), dtype="f4", dimension_names=("time", "lat", "lon"))
    root.create_array("station", shape=(10,), chunks=(5,), dtype="f4", dimension_names=("time",))
    sub = root.create_group("levels")
    sub.create_array(
        "u",
        shape=(10, 2, 5, 6),
        chunks=(2, 1, 5, 6),
        shards=(4, 2, 5, 6),
        dtype="f4",
        dimension_names=("time", "level", "lat", "lon"),
    )
    return tmp_path / "cf.zarr"


def test_skips_coordinates_and_grid_mappings(cf_group) -> None:
    geoms = open_geometries(str(cf_group))
    assert sorted(geoms) == ["levels/u", "station", "t2m"]  # station over ('time',) is data


def test_v2_array_dimensions_attribute(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "v2.zarr", mode="w", zarr_format=2)
    t = root.create_array("time", shape=(6,), chunks=(3,), dtype="i8")
    t.attrs["_ARRAY_DIMENSIONS"] = ["time"]
    x = root.create_array("x", shape=(6, 4), chunks=(3, 2), dtype="f4")
    x.attrs["_ARRAY_DIMENSIONS"] = ["time", "y"]
    geoms = open_geometries(str(tmp_path / "v2.zarr"))
    assert list(geoms) == ["x"]
    assert geoms["x"].zarr_format == 2 and geoms["x"].dimension_names == ("time", "y")


def test_variables_bypass_the_coordinate_test(cf_group) -> None:
    geoms = open_geometries(str(cf_group), variables=["time", "t2m"])
    assert list(geoms) == ["time", "t2m"]


def test_named_variables_are_opened_together(cf_group) -> None:
    """Their metadata GETs are in flight at once: on a remote store one round trip opens them all, not one each."""
    names = ["time", "t2m", "station", "levels/u"]
    store = CountingStore(local_store(cf_group), latency_s=0.05)
    geoms = open_geometries(store, variables=names)
    assert list(geoms) == names
    assert store.peak_inflight >= len(names), store.peak_inflight
    assert geoms["levels/u"].shape == zarr.open_array(cf_group / "levels" / "u", mode="r").shape


def test_of_several_bad_names_the_first_is_named(cf_group) -> None:
    with pytest.raises(ValueError, match="variable 'nope' is not an array"):
        open_geometries(str(cf_group), variables=["t2m", "nope", "levels/nope"])


def test_bad_requests_name_the_problem(cf_group) -> None:
    with pytest.raises(ValueError, match="variable 'nope' is not an array"):
        open_geometries(str(cf_group), variables=["nope"])
    with pytest.raises(ValueError, match="'spatial_ref' is 0-dimensional"):
        open_geometries(str(cf_group), variables=["spatial_ref"])
    with pytest.raises(ValueError, match="sample_axis=3 is out of range for array 't2m'"):
        open_geometries(str(cf_group), variables=["t2m"], sample_axis=3)


def test_a_sharded_geometry_reads_inner_chunks_out_of_its_shards(cf_group) -> None:
    g = open_geometries(str(cf_group))["levels/u"]
    assert g.chunks == (2, 1, 5, 6) and g.stored_chunks == (4, 2, 5, 6)
    assert g.sharded_reads and g.tile_chunks == g.chunks
    assert g.sample_chunk_size == 2 and g.n_chunks == 5 and g.chunk_len(4) == 2
    assert g.inner_shape == (2, 5, 6) and g.tiles_per_chunk == 2 and g.tile_nbytes == 2 * 5 * 6 * 4
    # tile 1 of sample-axis chunk 3 is inner chunk (1, 1, 0, 0) of shard (1, 0, 0, 0)
    assert g.tile_key(g.physical_chunk_coord(3, 1)) == ("levels/u/c/1/0/0/0", (1, 1, 0, 0))


def test_tile_grid_and_placement_match_zarr_regions(cf_group) -> None:
    arr = zarr.open_array(cf_group / "t2m", mode="r+")
    data = np.random.default_rng(0).random(arr.shape, dtype="f4")
    arr[:] = data
    g = geometry_of(arr)
    assert g.tile_grid == (1, 2) and g.tiles_per_chunk == 2
    np.testing.assert_array_equal(g.tile_origins(), [[0, 0], [0, 3]])
    for c in range(g.n_chunks):
        chunk = np.zeros((g.chunk_len(c), *g.inner_shape), "f4")
        for t in range(g.tiles_per_chunk):
            p = g.tile_placement(c, t)
            region = tuple(
                slice(cc * s, cc * s + sel.stop)
                for cc, s, sel in zip(p.chunk_coords, g.stored_chunks, p.chunk_selection)
            )
            chunk[p.out_selection] = arr[region]
        start = c * g.sample_chunk_size
        np.testing.assert_array_equal(chunk, data[start : start + g.chunk_len(c)])


def test_sample_axis_two_and_key_order(tmp_path) -> None:
    arr = zarr.create_array(tmp_path / "s.zarr", shape=(2, 3, 7, 4, 5), chunks=(1, 3, 2, 4, 5), dtype="u2")
    g = geometry_of(arr, sample_axis=2)
    assert g.n_samples == 7 and g.sample_chunk_size == 2 and g.n_chunks == 4
    assert g.inner_shape == (2, 3, 4, 5) and g.tile_grid == (2, 1, 1, 1)
    assert g.physical_chunk_coord(3, 1) == (1, 0, 3, 0, 0)
    p = g.tile_placement(3, 1)
    assert p.out_selection[0] == slice(0, 1) and not p.is_complete_chunk
    assert g.with_sample_axis(-1).sample_axis == 4


def test_v2_slash_separator_keys(tmp_path) -> None:
    arr = zarr.create_array(
        tmp_path / "k.zarr",
        shape=(4, 4),
        chunks=(2, 2),
        dtype="f4",
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    assert geometry_of(arr).chunk_key((1, 0)) == "1/0"


def test_shift_makes_a_window_view(cf_group) -> None:
    g = open_geometries(str(cf_group))["t2m"]
    assert g.shift(3).offset == 3 and g.shift(3).shift(-1).offset == 2
    assert g.shift(3) != g and g.shift(0) == g
    with pytest.raises(TypeError):
        g.shift(1.5)
