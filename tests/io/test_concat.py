"""``concat_stores`` of per-year stores whose chunks do not tile a year, against ``xr.concat``.

A year of 6-hourly steps (1464 in 2020, 1460 in 2021 and 2022) in time chunks
of 8 leaves 2021 with a partial last chunk: the virtual axis pads it to its
chunk boundary with rows no store holds. xarray is the oracle for every drawn
anchor; GETs are counted at each member store.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from helpers import CountingStore, local_store
from servers import HTTPFileServer

from insitubatch import InSituDataset, close_store, concat_stores, obstore_store, open_geometries, split_by_time
from insitubatch.errors import IrregularTimeWarning

DOCS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
SIX_HOURS = np.timedelta64(6, "h")


def _year(year: int, seed: int) -> xr.Dataset:
    times = pd.date_range(f"{year}-01-01", f"{year}-12-31T18", freq="6h")
    rng = np.random.default_rng(seed)
    data = rng.random((len(times), 3, 4), dtype="f4")
    return xr.Dataset(
        {"t2m": (("time", "lat", "lon"), data)}, coords={"time": times, "lat": np.arange(3.0), "lon": np.arange(4.0)}
    )


def _years(tmp_path: Path, chunk: int | None, zarr_format: int = 3) -> tuple[list[Path], list[xr.Dataset]]:
    """Stores of 2020, 2021, 2022 in time chunks of ``chunk`` (``None``: each year one chunk); v2 consolidated."""
    paths, parts = [], []
    for k, year in enumerate((2020, 2021, 2022)):
        part = _year(year, seed=k)
        steps = chunk or part.sizes["time"]
        path = tmp_path / f"{year}.zarr"
        part.to_zarr(
            path, encoding={"t2m": {"chunks": (steps, 3, 4)}}, zarr_format=zarr_format, consolidated=zarr_format == 2
        )
        paths.append(path)
        parts.append(part)
    return paths, parts


def _ns(values) -> list[int]:
    return np.asarray(values).astype("datetime64[ns]").astype(np.int64).tolist()


def _chunk_gets(store: CountingStore) -> Counter[str]:
    return Counter({k: n for k, n in store.gets.items() if not k.endswith(DOCS)})


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_years_with_a_partial_last_chunk_concatenate_as_xr_concat_pairs_them(tmp_path: Path, zarr_format: int) -> None:
    paths, parts = _years(tmp_path, chunk=8, zarr_format=zarr_format)
    counted = [CountingStore(local_store(p)) for p in paths]
    concat = concat_stores(counted)
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat)["t2m"]
    assert t2m.n_samples == 1464 + 1464 + 1460  # 2021's 1460 steps padded to 183 chunks of 8
    manifest = split_by_time(t2m, {"train": ("2020", "2021"), "val": ("2022", None)})
    views = {"x": t2m, "next": t2m.shift("6h"), "pair": t2m.window(["-6h", "0h"])}
    for store in counted:
        store.reset()
    stored = set(_ns(ref.time.values))
    six = 6 * 3600 * 10**9
    # hedge=False: a GET slowed by a loaded machine is not duplicated, so the counts are the plan's own
    with InSituDataset(concat, manifest, views, batch_size=256, seed=3, hedge=False) as ds:
        lost = ds.describe()["splits"]["train"]["lost"]
        drawn: dict[str, list[int]] = {}
        for name in ("train", "val"):
            for batch in ds.split(name):
                times = batch.coords["time"]
                now = ref.t2m.sel(time=times).values
                np.testing.assert_array_equal(np.asarray(batch.arrays["x"]), now)
                np.testing.assert_array_equal(
                    np.asarray(batch.arrays["next"]), ref.t2m.sel(time=times + SIX_HOURS).values
                )
                before = ref.t2m.sel(time=times - SIX_HOURS).values
                np.testing.assert_array_equal(np.asarray(batch.arrays["pair"]), np.stack([before, now], 1))
                drawn.setdefault(name, []).extend(_ns(times))
    servable = sorted(t for t in stored if t + six in stored and t - six in stored)  # what xarray can serve
    cut = _ns([np.datetime64("2022-01-01")])[0]
    assert sorted(drawn["train"]) == [t for t in servable if t < cut]  # across the seam 2020/2021 and 2021/2022
    assert sorted(drawn["val"]) == [t for t in servable if t >= cut]
    assert lost["unstored"] == 4  # 2021's four padded rows, named as padding: they have no date
    for store, part in zip(counted, parts):  # each stored chunk of each year fetched once, none more
        gets = _chunk_gets(store)
        assert len(gets) == -(-part.sizes["time"] // 8) and set(gets.values()) == {1}


def test_the_padding_reads_as_nat_and_no_pass_draws_it(tmp_path: Path) -> None:
    paths, parts = _years(tmp_path, chunk=8)
    concat = concat_stores(paths)
    got = xr.open_zarr(concat, consolidated=False)
    pad = slice(1464 + 1460, 1464 + 1464)
    assert np.isnat(got.time.values[pad]).all() and not np.isnat(np.delete(got.time.values, np.r_[pad])).any()
    stored = got.isel(time=~np.isnat(got.time.values))
    xr.testing.assert_equal(stored.t2m.load(), xr.concat(parts, dim="time").t2m)
    t2m = open_geometries(concat)["t2m"]
    manifest = split_by_time(t2m, {"train": ("2021-12-31", "2022-01-02")})  # whole chunks: 2021's last, 2022's first
    with InSituDataset(concat, manifest, {"x": t2m}, batch_size=4, seed=0) as ds:
        drawn = sorted(t for batch in ds.train for t in _ns(batch.coords["time"]))
        inferred = [t for batch in ds.infer(start="2021-12-31", stop="2022-01-02") for t in _ns(batch.coords["time"])]
    expected = _ns(pd.date_range("2021-12-31", "2022-01-02T18", freq="6h"))
    assert drawn == expected and inferred == expected  # inference skips the padding: it has no date to infer


def test_a_step_offset_over_the_padding_warns_once_and_never_reads_a_padded_row(tmp_path: Path) -> None:
    paths, parts = _years(tmp_path, chunk=8)
    concat = concat_stores(paths)
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat)["t2m"]
    with pytest.warns(IrregularTimeWarning, match="holds no date") as caught:
        after = t2m.shift(1)
    assert len(caught) == 1
    manifest = split_by_time(t2m, {"train": ("2021-12-31", "2022-01-02")})
    with InSituDataset(concat, manifest, {"x": t2m, "after": after}, batch_size=8, seed=0) as ds:
        drawn = []
        for batch in ds.train:
            times = batch.coords["time"]
            np.testing.assert_array_equal(np.asarray(batch.arrays["after"]), ref.t2m.sel(time=times + SIX_HOURS).values)
            drawn.extend(_ns(times))
    # shift(1) at 2021-12-31T18 reads the first padded row: that anchor is not drawn
    assert sorted(drawn) == _ns(pd.date_range("2021-12-31", "2021-12-31T12", freq="6h")) + _ns(
        pd.date_range("2022-01-01", "2022-01-02T18", freq="6h")
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_years_of_one_chunk_each_concatenate_as_xr_concat_each_read_once(tmp_path: Path, zarr_format: int) -> None:
    paths, parts = _years(tmp_path, chunk=None, zarr_format=zarr_format)  # 1464, 1460, 1460 steps: one chunk each
    counted = [CountingStore(local_store(p)) for p in paths]
    concat = concat_stores(counted)
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat)["t2m"]
    assert (t2m.n_samples, t2m.sample_chunk_size) == (1464 * 2 + 1460, 1464)  # one virtual chunk per year
    stored = xr.open_zarr(concat, consolidated=False).isel(time=~np.isnat(t2m.coord("time")))
    xr.testing.assert_equal(stored.t2m.load(), ref.t2m)  # 2021's chunk, padded by 4 rows, decodes as stored
    manifest = split_by_time(t2m, {"train": ("2020", "2021"), "val": ("2022", None)})
    for store in counted:
        store.reset()
    views = {"x": t2m, "next": t2m.shift("6h")}
    with InSituDataset(concat, manifest, views, batch_size=512, seed=5, hedge=False) as ds:  # counts: the plan's
        drawn: dict[str, list[int]] = {}
        for name in ("train", "val"):
            for batch in ds.split(name):
                times = batch.coords["time"]
                np.testing.assert_array_equal(np.asarray(batch.arrays["x"]), ref.t2m.sel(time=times).values)
                np.testing.assert_array_equal(
                    np.asarray(batch.arrays["next"]), ref.t2m.sel(time=times + SIX_HOURS).values
                )
                drawn.setdefault(name, []).extend(_ns(times))
    times = ref.get_index("time")
    servable = _ns(times[times.isin(times + pd.Timedelta("6h"))] - pd.Timedelta("6h"))
    assert sorted(drawn["train"]) == [t for t in servable if t < _ns([np.datetime64("2022-01-01")])[0]]
    assert sorted(drawn["val"]) == [t for t in servable if t >= _ns([np.datetime64("2022-01-01")])[0]]
    for store in counted:  # each year's one chunk fetched once (2021's read by train, then by next's seam)
        assert list(_chunk_gets(store).values()) == [1]


def test_a_store_of_several_shorter_chunks_is_refused_naming_it(tmp_path: Path) -> None:
    first = _year(2020, seed=0)
    first.to_zarr(tmp_path / "a.zarr", encoding={"t2m": {"chunks": (1464, 3, 4)}}, consolidated=False)
    second = _year(2021, seed=1)
    second.to_zarr(tmp_path / "b.zarr", encoding={"t2m": {"chunks": (8, 3, 4)}}, consolidated=False)
    with pytest.raises(ValueError, match=r"\('part1', 1460, 8\).*1464-step chunks of store 'part0'"):
        concat_stores([tmp_path / "a.zarr", tmp_path / "b.zarr"])


def test_years_of_one_chunk_each_over_http_are_fetched_once_each(http_server: HTTPFileServer) -> None:
    paths, parts = _years(http_server.root, chunk=None, zarr_format=2)  # consolidated: an HTTP endpoint cannot list
    concat = concat_stores([obstore_store(f"{http_server.url}/{p.name}") for p in paths])  # recoded on the async path
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat, variables=["t2m"])["t2m"]
    manifest = split_by_time(t2m, {"train": ("2021", None)})
    http_server.requests.clear()
    with InSituDataset(concat, manifest, {"x": t2m}, batch_size=512, seed=7, hedge=False) as ds:
        drawn = []
        for batch in ds.train:
            np.testing.assert_array_equal(np.asarray(batch.arrays["x"]), ref.t2m.sel(time=batch.coords["time"]).values)
            drawn.extend(_ns(batch.coords["time"]))
    assert sorted(drawn) == _ns(ref.time.values[1464:])  # 2021 (padded by 4 rows) and 2022, every stored step
    gets = Counter(p for m, p, _ in http_server.requests if m == "GET" and "/t2m/" in p and not p.endswith(DOCS))
    assert gets == Counter({"/2021.zarr/t2m/0.0.0": 1, "/2022.zarr/t2m/0.0.0": 1})  # from the server's side
    close_store(concat)


def test_years_with_gaps_cut_and_partial_chunks_pair_by_time_as_xarray(tmp_path: Path) -> None:
    parts = []
    for k, year in enumerate((2020, 2021)):
        part = _year(year, seed=20 + k)
        cut = [5, 6, 700] if year == 2020 else [0, 1, 1459]  # gaps inside, and at both ends of the seam
        part = part.isel(time=np.setdiff1d(np.arange(part.sizes["time"]), cut))
        part.to_zarr(tmp_path / f"{year}.zarr", encoding={"t2m": {"chunks": (8, 3, 4)}}, consolidated=False)
        parts.append(part)
    concat = concat_stores([tmp_path / "2020.zarr", tmp_path / "2021.zarr"])
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat)["t2m"]
    manifest = split_by_time(t2m, {"train": ("2020", None)})
    with InSituDataset(concat, manifest, {"pair": t2m.window(["-6h", "0h"])}, batch_size=256, seed=4) as ds:
        drawn = []
        for batch in ds.train:
            times = batch.coords["time"]
            before = ref.t2m.sel(time=times - SIX_HOURS).values
            np.testing.assert_array_equal(
                np.asarray(batch.arrays["pair"]), np.stack([before, ref.t2m.sel(time=times).values], 1)
            )
            drawn.extend(_ns(times))
        lost = ds.describe()["splits"]["train"]["lost"]
    stored = set(_ns(ref.time.values))
    assert sorted(drawn) == sorted(t for t in stored if t - 6 * 3600 * 10**9 in stored)  # what xarray can serve
    # three anchors want a cut time (named); 2020's 1461 steps are padded by three rows (no date to name)
    assert (lost["unstored"], lost["unstored_times"]) == (
        6,
        ["2020-01-02T12:00:00", "2020-06-24T00:00:00", "2021-01-01T06:00:00"],
    )
