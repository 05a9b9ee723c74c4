"""Selections through the loader, against xarray: every batch, the GETs they cost, the cache they leave."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.testing.data import ERA5_LEVELS, write_era5_levels

xr = pytest.importorskip("xarray")

# (what the view does, as (method, kwargs) steps) -> applied to the geometry and to the xarray DataArray alike
SELECTIONS = {
    "two levels": [("isel", {"level": [1, 5]})],
    "one level by label": [("sel", {"level": 500})],
    "levels in a given order": [("sel", {"level": [850, 50, 500]})],
    "descending latitude band": [("sel", {"latitude": slice(60, 30)})],
    "latitude reversed": [("isel", {"latitude": slice(None, None, -1)})],
    "strided longitude": [("isel", {"longitude": slice(3, None, 5)})],
    "across the seam": [("sel", {"longitude": slice(300, 45)})],
    "region and level": [("sel", {"level": 850, "latitude": slice(45, -45)}), ("isel", {"longitude": [0, 1, 2, 31]})],
    "nearest": [("sel", {"level": 520, "method": "nearest"})],
    "composed": [("isel", {"latitude": slice(2, 15)}), ("isel", {"latitude": slice(None, None, -2)})],
}


def _apply(obj, steps, seam_lon=None):
    for method, kwargs in steps:
        kwargs = dict(kwargs)
        how = kwargs.pop("method", None)
        if method == "sel" and isinstance(kwargs.get("longitude"), slice) and seam_lon is not None:
            lon = kwargs.pop("longitude")
            obj = _apply(obj, [("sel", kwargs)]) if kwargs else obj
            obj = xr.concat(
                [obj.sel(longitude=slice(lon.start, None)), obj.sel(longitude=slice(None, lon.stop))], "longitude"
            )
            continue
        obj = getattr(obj, method)(**kwargs, **({"method": how} if how else {}))
    return obj


def _expected(xds, var, steps, indices):
    da = xds[var].isel(time=np.asarray(indices))
    return _apply(da, steps, seam_lon=True).values


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("era5")
    return {
        "v3": write_era5_levels(root / "v3.zarr"),
        "v2": write_era5_levels(root / "v2.zarr", zarr_format=2, chunks=(4, 2, 9, 8)),
        "v3-sharded": write_era5_levels(root / "s.zarr", chunks=(4, 1, 9, 16), shards=(8, 1, 9, 32)),
    }


@pytest.mark.parametrize("store_kind", ["v3", "v2", "v3-sharded"])
@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_every_batch_equals_xarray(stores, store_kind, name) -> None:
    path = stores[store_kind]
    steps = SELECTIONS[name]
    xds = xr.open_zarr(path, consolidated=False).load()  # the oracle in memory: each batch indexes it, not dask
    geoms = open_geometries(str(path))
    view = _apply(geoms["t"], steps)
    manifest = split_by_chunk(geoms["t"], fractions=(0.5, 0.5))
    variables = {"x": view, "y": view.shift(3), "z": _apply(geoms["z"], steps)}
    with InSituDataset(str(path), manifest, variables, batch_size=5, block_chunks=2) as ds:
        assert ds.variables["x"].source == view.source
        for split in (ds.train, ds.val):
            n = 0
            for batch in split:
                for label, var in (("x", "t"), ("y", "t"), ("z", "z")):
                    want = _expected(xds, var, steps, batch.read_indices(label))
                    got = batch.arrays[label]
                    assert got.shape == want.shape, (name, label)
                    np.testing.assert_array_equal(got, want, err_msg=f"{name}: {label} batch {batch.index}")
                n += len(batch)
            assert n > 0


def _tile_keys(path, view, chunks_read):
    """The chunk keys a selection of ``view`` touches in the sample-axis chunks ``chunks_read``."""
    arr = zarr.open_array(str(path / view.path), mode="r")
    grids = []
    for k in range(1, 4):
        picked = view._chosen.get(k)
        size = arr.chunks[k]
        grids.append(sorted(set((picked.array // size).tolist())) if picked else list(range(-(-arr.shape[k] // size))))
    keys = set()
    for c in chunks_read:
        for a in grids[0]:
            for b in grids[1]:
                for d in grids[2]:
                    keys.add(f"{view.path}/{arr.metadata.encode_chunk_key((c, a, b, d))}")
    return keys


@pytest.mark.parametrize(
    ("steps", "fraction"),
    [
        ([("isel", {"level": [2, 4]})], 2 / len(ERA5_LEVELS)),
        ([("isel", {"latitude": slice(0, 9), "longitude": slice(0, 16)})], 1 / 4),
    ],
)
def test_gets_are_the_tiles_a_selection_touches(stores, steps, fraction) -> None:
    path = stores["v3"]
    geoms = open_geometries(str(path))
    view = _apply(geoms["t"], steps)
    store = CountingStore(local_store(path))
    manifest = split_by_chunk(geoms["t"], fractions=(1.0,))
    with InSituDataset(store, manifest, {"x": view, "x_next": view.shift(1)}, batch_size=4, block_chunks=2) as ds:
        store.reset()
        for _ in ds.train:
            pass
        gets = store.chunk_gets()
        assert set(gets) == _tile_keys(path, view, range(geoms["t"].n_chunks))
        assert all(v == 1 for v in gets.values())  # read once, however many labels alias the source
        full = geoms["t"].n_chunks * geoms["t"].tiles_per_chunk
        assert sum(gets.values()) == round(full * fraction)
        info = ds.describe()
        assert info["splits"]["train"]["gets"] == sum(gets.values())
        assert info["variables"]["x"]["selection"] and info["variables"]["x"]["sample_shape"] == list(view.inner_shape)


def test_a_selection_change_never_revives_stale_chunks(stores, tmp_path) -> None:
    path = stores["v3"]
    xds = xr.open_zarr(path, consolidated=False)
    geoms = open_geometries(str(path))
    manifest = split_by_chunk(geoms["t"], fractions=(1.0,))
    cache = tmp_path / "cache"
    for steps in ([("isel", {"level": [0, 1]})], [("isel", {"level": [5, 6]})], [("sel", {"latitude": slice(0, -90)})]):
        view = _apply(geoms["t"], steps)
        for _ in range(2):  # cold, then revived from the cache
            with InSituDataset(str(path), manifest, {"x": view}, cache_dir=cache, persist=True, shuffle=False) as ds:
                for batch in ds.train:
                    np.testing.assert_array_equal(batch.arrays["x"], _expected(xds, "t", steps, batch.sample_indices))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda g: g.isel(height=0), KeyError, r"no dimension 'height'; its dimensions are"),
        (lambda g: g.sel(level=499), KeyError, r"label 499 is not in the coordinate; nearest labels: 250, 500, 700"),
        (lambda g: g.sel(level=600, method="nearest", tolerance=10), KeyError, r"beyond tolerance=10"),
        (
            lambda g: g.sel(latitude=slice(30, 60)),
            ValueError,
            r"dimension 'latitude': the label slice .* selects nothing",
        ),
        (lambda g: g.isel(level=[]), ValueError, r"dimension 'level': the selection \[\] is empty"),
        (lambda g: g.isel(level=9), ValueError, r"position 9 is out of range for its 7 positions"),
        (lambda g: g.isel(time=0), ValueError, r"'time' is the sample axis.*split_by_time.*infer"),
        (lambda g: g.sel(level=500).isel(level=0), ValueError, r"already selected by the scalar"),
        (lambda g: g.isel(level=slice(0.5, 2)), TypeError, r"slices by position, with ints; use sel\(\)"),
        (lambda g: g.sel(level=500, method="closest"), ValueError, r"method='closest' must be None or 'nearest'"),
    ],
)
def test_bad_selections_say_what_is_valid(stores, call, error, match) -> None:
    g = open_geometries(str(stores["v3"]))["t"]
    with pytest.raises(error, match=match) as info:
        call(g)
    assert "'t'" in str(info.value)  # the array is named


def test_a_non_monotonic_coordinate_refuses_label_slices(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "m.zarr", mode="w")
    root.create_array("x", shape=(4,), dtype="f8", dimension_names=("x",))[:] = [3, 1, 2, 0]
    root.create_array("v", shape=(6, 4), chunks=(3, 2), dtype="f4", dimension_names=("time", "x"))
    g = open_geometries(str(tmp_path / "m.zarr"))["v"]
    with pytest.raises(ValueError, match=r"array 'v', dimension 'x': cannot slice by label .* not monotonic"):
        g.sel(x=slice(1, 2))
    assert g.sel(x=[2, 0]).selection[0].indices == (2, 3)  # labels still select


def test_arrays_without_dimension_names_select_by_position(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "n.zarr", mode="w")
    root.create_array("v", shape=(6, 4, 5), chunks=(3, 2, 5), dtype="f4")
    g = open_geometries(str(tmp_path / "n.zarr"))["v"]
    with pytest.raises(ValueError, match=r"no dimension names .* select by position with isel"):
        g.sel(x=1)
    assert g.isel({1: [3, 0], 2: 4}).inner_shape == (2,)


@pytest.mark.parametrize("persist", [False, True])
def test_selections_of_one_array_share_its_reads(stores, tmp_path, persist) -> None:
    """Two selections of one array (and a shift between them) read each stored tile once in all."""
    path = stores["v3"]
    xds = xr.open_zarr(path, consolidated=False)
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t"]
    both = g.sel(level=[850, 500], latitude=slice(60, -60))
    one = g.sel(level=850, latitude=slice(60, -60)).shift(2)
    manifest = split_by_chunk(g, fractions=(1.0,))
    cache = {"cache_dir": tmp_path / "c", "persist": True} if persist else {}
    with InSituDataset(store, manifest, {"both": both, "one": one}, batch_size=4, block_chunks=2, **cache) as ds:
        store.reset()
        for batch in ds.train:
            np.testing.assert_array_equal(
                batch.arrays["one"],
                _expected(xds, "t", [("sel", {"level": 850, "latitude": slice(60, -60)})], batch.read_indices("one")),
            )
        gets = store.chunk_gets()
    assert set(gets.values()) == {1}
    assert set(gets) == _tile_keys(path, both, range(g.n_chunks))


@pytest.mark.parametrize("persist", [False, True])
@pytest.mark.parametrize("block_chunks", [1, 2])
def test_selections_read_each_tile_once_when_the_read_limit_is_tight(stores, tmp_path, persist, block_chunks) -> None:
    """Selections of one chunk wait for read-ahead room together: a wait between them would read tiles twice."""
    path = stores["v3"]
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t"]
    sels = {"both": g.sel(level=[850, 500]), "one": g.sel(level=850).shift(1), "low": g.sel(level=500)}
    manifest = split_by_chunk(g, fractions=(1.0,))
    cache = {"cache_dir": tmp_path / "c", "persist": True} if persist else {}
    # a pinned max_inflight: no read-ahead beyond the working set, so the driver waits for room often
    kw = {"batch_size": 2, "block_chunks": block_chunks, "shuffle": False, "max_inflight": 4}
    with InSituDataset(store, manifest, sels, **kw, **cache) as ds:
        for epoch in range(3):
            store.reset()
            for _batch in ds.train:
                time.sleep(0.02)  # a slow consumer: the driver runs ahead until the read limit holds it
            gets = store.chunk_gets()
            assert set(gets.values()) <= {1}, {k: n for k, n in gets.items() if n > 1}
            if epoch == 0:
                assert set(gets) == _tile_keys(path, sels["both"], range(g.n_chunks))
