"""Native windows and batch coordinates, against xarray: values, valid times, GETs, adapters."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CountingStore, local_store

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.testing.data import write_era5_levels

xr = pytest.importorskip("xarray")


@pytest.fixture(scope="module")
def era5(tmp_path_factory):
    # 8 steps per stored chunk along time, two tiles per field
    return write_era5_levels(tmp_path_factory.mktemp("windows") / "era5.zarr", chunks=(8, 1, 17, 16), n_time=40)


def test_windows_equal_xarray_with_shifts_and_selections(era5) -> None:
    xds = xr.open_zarr(era5, consolidated=False)
    g = open_geometries(str(era5))["t"].sel(level=[850, 500])
    manifest = split_by_chunk(g, fractions=(0.75, 0.25))
    variables = {
        "inputs": g.window([-1, 0]),
        "target": g.shift(1),
        "history": open_geometries(str(era5))["t2m"].window(range(-6, 1, 6)).isel(latitude=slice(None, None, -1)),
    }
    with InSituDataset(str(era5), manifest, variables, batch_size=6, block_chunks=2) as ds:
        times = xds.time.values
        for view in (ds.train, ds.val):
            for batch in view:
                n = len(batch)
                steps = batch.read_indices("inputs")
                assert batch.arrays["inputs"].shape == (n, 2, 2, 17, 32)
                want = xds.t.sel(level=[850, 500]).values[steps]
                np.testing.assert_array_equal(batch.arrays["inputs"], want)
                np.testing.assert_array_equal(
                    batch.arrays["target"], xds.t.sel(level=[850, 500]).values[steps[:, 1] + 1]
                )
                hist = xds.t2m.isel(latitude=slice(None, None, -1)).values[batch.read_indices("history")]
                np.testing.assert_array_equal(batch.arrays["history"], hist)
                # coordinates: anchors' valid times, and each shifted/windowed label's
                np.testing.assert_array_equal(batch.coords["time"], times[batch.sample_indices])
                np.testing.assert_array_equal(batch.coords["inputs.time"], times[steps])
                np.testing.assert_array_equal(batch.coords["target.time"], times[batch.sample_indices + 1])
        # anchors whose window runs off the array are dropped in training
        assert ds.train.plan().anchors.min() >= 6
        coords = ds.inner_coords["inputs"]
        np.testing.assert_array_equal(coords["level"], [850, 500])
        np.testing.assert_array_equal(coords["latitude"], xds.latitude.values)


def test_a_window_costs_the_gets_of_one_step(era5) -> None:
    store = CountingStore(local_store(era5))
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, {"x": g}, batch_size=8, shuffle=False) as plain:
        store.reset()
        for _ in plain.train:
            pass
        one_step = sum(store.chunk_gets().values())
    with InSituDataset(store, manifest, {"x": g.window([-1, 0])}, batch_size=8, block_chunks=2) as windowed:
        store.reset()
        for _ in windowed.train:
            pass
        gets = store.chunk_gets()
    assert set(gets.values()) == {1}  # read once, though two steps (and two blocks) share chunks
    assert sum(gets.values()) == one_step == g.n_chunks * g.tiles_per_chunk


def test_inference_raises_where_training_drops(era5) -> None:
    g = open_geometries(str(era5))["t2m"]
    with InSituDataset(str(era5), split_by_chunk(g, fractions=(1.0,)), {"x": g.window([-2, 0])}) as ds:
        with pytest.raises(ValueError, match=r"label 'x' reads anchor \+ \[-2, 0\]"):
            ds.infer((0, 10))
        batches = list(ds.infer((2, 10), batch_size=4))
        assert batches[0].arrays["x"].shape == (4, 2, 17, 32)


def test_windows_compose_only_once(era5) -> None:
    g = open_geometries(str(era5))["t2m"]
    with pytest.raises(ValueError, match="already windowed"):
        g.window([0, 1]).window([0])
    with pytest.raises(TypeError, match="window\\(\\) steps must be ints"):
        g.window([0, 1.5])
    with pytest.raises(ValueError, match="at least one step"):
        g.window([])


def test_coords_reach_every_view_through_the_adapters(era5) -> None:
    torch = pytest.importorskip("torch")
    from insitubatch import as_torch, to_torch

    xds = xr.open_zarr(era5, consolidated=False)
    g = open_geometries(str(era5))["t2m"]
    with InSituDataset(str(era5), split_by_chunk(g, fractions=(1.0,)), {"x": g, "y": g.shift(2)}, batch_size=5) as ds:
        for tensors, coords in as_torch(ds.train, coords=True):
            assert isinstance(tensors["x"], torch.Tensor)
            np.testing.assert_array_equal(coords["y.time"], coords["time"] + np.timedelta64(12, "h"))
            assert set(coords["time"]).issubset(set(xds.time.values))
        assert all(isinstance(item, dict) for item in as_torch(ds.train))  # training items stay dicts by default
        assert all(isinstance(item, tuple) for item in as_torch(ds.infer()))  # inference pairs, as before
        batch = next(iter(ds.train))
        tensors, coords = to_torch(batch, coords=True)
        assert coords is batch.coords and set(tensors) == {"x", "y"}
