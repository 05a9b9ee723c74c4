"""Static fields and every array shape, through the public API, against xarray."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CountingStore, local_store

from insitubatch import InSituDataset, StaticField, open_geometries, open_statics, split_by_chunk
from insitubatch.testing.data import write_era5_levels

xr = pytest.importorskip("xarray")


@pytest.fixture(scope="module")
def era5(tmp_path_factory):
    return write_era5_levels(tmp_path_factory.mktemp("statics") / "era5.zarr")


def test_variables_none_takes_the_sample_axis_and_says_what_it_left_out(era5) -> None:
    g = open_geometries(str(era5))["t"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(era5), manifest, batch_size=5) as ds:
        assert sorted(ds.variables) == ["gmean", "t", "t2m", "z"]
        left_out = ds.describe()["left_out"]
        assert left_out["lsm"].startswith("static") and left_out["orog"].startswith("static")
        assert left_out["latitude"] == "coordinate of dimension 'latitude'"
        xds = xr.open_zarr(era5, consolidated=False)
        for batch in ds.train:
            assert batch.arrays["gmean"].shape == (len(batch),)  # a 1-D variable batches as (batch,)
            np.testing.assert_array_equal(batch.arrays["gmean"], xds.gmean.values[batch.sample_indices])


def test_statics_are_read_once_and_shared_by_every_batch(era5) -> None:
    store = CountingStore(local_store(era5))
    statics = open_statics(store)
    assert sorted(statics) == ["lsm", "orog"] and isinstance(statics["lsm"], StaticField)
    g = open_geometries(store)["t"]
    region = {"latitude": slice(60, -30), "longitude": slice(300, 60)}
    chosen = {"lsm": statics["lsm"].sel(region), "orog": statics["orog"]}
    manifest = split_by_chunk(g, fractions=(1.0,))
    store.reset()
    with InSituDataset(store, manifest, {"t": g.sel(region)}, statics=chosen, batch_size=5) as ds:
        coordinates = ("time/", "latitude/", "longitude/", "level/")  # read once too, for selections and batch coords
        static_gets = {k: v for k, v in store.chunk_gets().items() if not k.startswith(coordinates)}
        assert static_gets == {"lsm/c/0/0": 1, "orog/c/0/0": 1}
        xds = xr.open_zarr(era5, consolidated=False)
        want = xr.concat(
            [
                xds.lsm.sel(latitude=slice(60, -30), longitude=slice(300, None)),
                xds.lsm.sel(latitude=slice(60, -30), longitude=slice(None, 60)),
            ],
            "longitude",
        ).values
        np.testing.assert_array_equal(ds.statics["lsm"], want)
        np.testing.assert_array_equal(ds.statics["orog"], xds.orog.values)
        assert not ds.statics["lsm"].flags.writeable
        store.reset()
        addresses = set()
        for batch in ds.train:
            assert batch.statics["lsm"] is ds.statics["lsm"]  # the same object: never copied per batch
            addresses.add(batch.statics["orog"].__array_interface__["data"][0])
        assert len(addresses) == 1
        assert not any(k.startswith(("lsm", "orog")) for k in store.chunk_gets())  # not read again
        info = ds.describe()
        assert info["statics"]["lsm"]["shape"] == list(want.shape)
        assert info["memory"]["statics_bytes"] == want.nbytes + xds.orog.values.nbytes


def test_statics_reach_torch_once(era5) -> None:
    torch = pytest.importorskip("torch")
    from insitubatch import as_torch

    g = open_geometries(str(era5))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(era5), manifest, {"t2m": g}, statics=["lsm"], batch_size=4) as ds:
        pointers = set()
        for item in as_torch(ds.train):
            assert isinstance(item["lsm"], torch.Tensor) and item["lsm"].shape == ds.statics["lsm"].shape
            pointers.add(item["lsm"].data_ptr())
        assert len(pointers) == 1  # one tensor, handed to every item
        np.testing.assert_array_equal(item["lsm"].numpy(), ds.statics["lsm"])


def test_a_zero_dimensional_array_is_a_static(tmp_path) -> None:
    import zarr

    root = zarr.open_group(tmp_path / "z.zarr", mode="w")
    root.create_array("v", shape=(8, 3), chunks=(4, 3), dtype="f4", dimension_names=("time", "x"))[:] = 1
    root.create_array("scale", shape=(), dtype="f8")[...] = 2.5
    statics = open_statics(str(tmp_path / "z.zarr"))
    assert list(statics) == ["scale"]
    g = open_geometries(str(tmp_path / "z.zarr"))["v"]
    with InSituDataset(str(tmp_path / "z.zarr"), split_by_chunk(g, fractions=(1.0,)), statics=statics) as ds:
        assert ds.statics["scale"].shape == () and float(ds.statics["scale"]) == 2.5


def test_labels_name_a_variable_or_a_static_not_both(era5) -> None:
    g = open_geometries(str(era5))["t2m"]
    with pytest.raises(ValueError, match=r"labels \['t2m'\] name both a variable and a static"):
        InSituDataset(
            str(era5), split_by_chunk(g, fractions=(1.0,)), {"t2m": g}, statics={"t2m": open_statics(str(era5))["lsm"]}
        )
    with pytest.raises(TypeError, match=r"statics\['m'\] must be a StaticField"):
        InSituDataset(str(era5), split_by_chunk(g, fractions=(1.0,)), {"t2m": g}, statics={"m": g})
