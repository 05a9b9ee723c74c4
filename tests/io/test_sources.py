"""One dataset from many stores: ``join_stores`` against ``xr.merge``, ``concat_stores`` against ``xr.concat``.

The stores are written by xarray into separate local directories, one of them
served by the loopback HTTP server; GETs are counted at each store.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from helpers import CountingStore, local_store
from servers import HTTPFileServer

from insitubatch import (
    InSituDataset,
    close_store,
    concat_stores,
    icechunk_store,
    join_stores,
    obstore_store,
    open_geometries,
    split_by_chunk,
    split_by_time,
)
from insitubatch.cache.fingerprint import source_identity
from insitubatch.errors import TimeAxisError

CHUNK = 4  # steps per stored chunk along time, in every store here
DOCS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


def _write(ds: xr.Dataset, path: Path, zarr_format: int = 3) -> Path:
    encoding = {v: {"chunks": (CHUNK, *ds[v].shape[1:])} for v in ds.data_vars if "time" in ds[v].dims}
    ds.to_zarr(path, encoding=encoding, zarr_format=zarr_format, consolidated=zarr_format == 2)
    return path


def _grid() -> dict[str, np.ndarray]:
    return {"lat": np.linspace(-30.0, 30.0, 4), "lon": np.arange(5.0)}


def _pressure(times: pd.DatetimeIndex, seed: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    data = {
        "t": (("time", "level", "lat", "lon"), rng.random((len(times), 2, 4, 5), dtype="f4")),
        "z": (("time", "level", "lat", "lon"), rng.random((len(times), 2, 4, 5), dtype="f4")),
    }
    return xr.Dataset(data, coords={"time": times, "level": [500, 850], **_grid()})


def _single(times: pd.DatetimeIndex, seed: int = 1, name: str = "t2m") -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {name: (("time", "lat", "lon"), rng.random((len(times), 4, 5), dtype="f4"))}, coords={"time": times, **_grid()}
    )


def _statics() -> xr.Dataset:
    rng = np.random.default_rng(2)
    data = {
        "lsm": (("lat", "lon"), rng.random((4, 5), dtype="f4")),
        "orog": (("lat", "lon"), rng.random((4, 5), dtype="f4")),
    }
    return xr.Dataset(data, coords=_grid())


def _rows(ref: xr.Dataset, times: np.ndarray) -> list[int]:
    index = ref.get_index("time")
    return [index.get_loc(pd.Timestamp(t)) for t in times]


def _ns(values) -> list[int]:
    """Dates as int64 nanoseconds, to compare lists of them."""
    return np.asarray(values).astype("datetime64[ns]").astype(np.int64).tolist()


def _chunk_gets(store: CountingStore) -> Counter[str]:
    return Counter({k: n for k, n in store.gets.items() if not k.endswith(DOCS)})


@pytest.fixture
def three_stores(tmp_path: Path, http_server: HTTPFileServer):
    """Pressure levels 6-hourly (local), single levels 12-hourly (over HTTP, a later start), statics (local)."""
    pl = _pressure(pd.date_range("2020-01-01", periods=40, freq="6h"))
    sfc = _single(pd.date_range("2020-01-02", periods=20, freq="12h"))
    st = _statics()
    _write(pl, tmp_path / "pl.zarr")
    _write(sfc, http_server.root / "sfc.zarr", zarr_format=2)
    _write(st, tmp_path / "st.zarr")
    counted = {
        "pl": CountingStore(local_store(tmp_path / "pl.zarr")),
        "st": CountingStore(local_store(tmp_path / "st.zarr")),
    }
    stores = {"pl": counted["pl"], "sfc": obstore_store(f"{http_server.url}/sfc.zarr"), "st": counted["st"]}
    return stores, counted, (pl, sfc, st)


def test_a_join_of_three_stores_equals_xr_merge_on_the_common_dates(three_stores, http_server) -> None:
    stores, counted, (pl, sfc, st) = three_stores
    joined = join_stores(stores, variables={"sfc": ["t2m"]})
    ref = xr.merge([pl, sfc, st], join="inner")
    assert joined.anchor == "sfc"  # the coarsest step: 12-hourly
    assert sorted(joined.geometries) == ["t", "t2m", "z"] and sorted(joined.static_fields) == ["lsm", "orog"]
    np.testing.assert_array_equal(joined.common.astype("datetime64[ns]"), ref.time.values)
    # pressure levels: 40 six-hourly steps, 18 of them are the common 12-hourly dates
    report = joined.report["pl"]
    assert (report.steps, report.used, report.left_out) == (40, 18, 22)
    assert report.first_left_out[:2] == ("2020-01-01T00:00:00", "2020-01-01T06:00:00")
    assert joined.report["sfc"].left_out == 2  # its last day runs past the pressure levels
    manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
    http_server.requests.clear()
    for store in counted.values():
        store.reset()
    with InSituDataset(joined, manifest, ["t", "t2m", "z"], statics=["lsm", "orog"], batch_size=3, seed=4) as ds:
        info = ds.describe()
        assert info["client"]["client"] == "store"  # a remote member: every key through the members' own get
        seen = []
        for batch in ds.train:
            times = batch.coords["time"]
            rows = _rows(ref, times)
            for label in ("t", "t2m", "z"):
                np.testing.assert_array_equal(np.asarray(batch.arrays[label]), ref[label].values[rows])
            seen.extend(_ns(times))
        np.testing.assert_array_equal(ds.statics["lsm"], st.lsm.values)
        np.testing.assert_array_equal(ds.statics["orog"], st.orog.values)
    assert sorted(seen) == _ns(ref.time.values)  # every common date once, and nothing else
    # every stored tile of every store read once in the epoch, counted at each store
    pl_gets = _chunk_gets(counted["pl"])  # (the time coordinate was read when the stores were joined)
    assert set(pl_gets.values()) == {1}
    assert {k.split("/")[0] for k in pl_gets} == {"t", "z"}
    http_gets = Counter(p for m, p, _ in http_server.requests if m == "GET" and not p.endswith(DOCS))
    assert set(http_gets.values()) == {1} and all(p.startswith("/sfc.zarr/t2m/") for p in http_gets)
    # describe(): each store's share of the reads is what it was asked for
    shares = info["stores"]
    assert shares["pl"]["tile_reads"]["train"] == sum(pl_gets.values())
    assert shares["sfc"]["tile_reads"]["train"] == sum(http_gets.values())
    assert shares["st"]["tile_reads"]["train"] == 0
    assert shares["pl"]["times"]["left_out"] == 22
    assert shares["pl"]["share"] + shares["sfc"]["share"] == pytest.approx(1.0)


def test_offsets_in_time_pair_by_date_across_joined_stores(tmp_path: Path) -> None:
    pl = _pressure(pd.date_range("2020-01-01", periods=24, freq="6h"))
    sfc = _single(pd.date_range("2020-01-01", periods=12, freq="12h"))
    joined = join_stores({"pl": _write(pl, tmp_path / "pl.zarr"), "sfc": _write(sfc, tmp_path / "sfc.zarr")})
    manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
    views = {"t2m": joined.geometries["t2m"], "t_next": joined.geometries["t"].shift("6h")}
    with InSituDataset(joined, manifest, views, batch_size=4, shuffle=False) as ds:
        assert ds.describe()["client"]["client"] == "local"  # local members: read on the decode threads
        anchors = []
        for batch in ds.train:
            times = batch.coords["time"]
            np.testing.assert_array_equal(np.asarray(batch.arrays["t2m"]), sfc.t2m.sel(time=times).values)
            later = times + np.timedelta64(6, "h")
            np.testing.assert_array_equal(np.asarray(batch.arrays["t_next"]), pl.t.sel(time=later).values)
            np.testing.assert_array_equal(batch.coords["t_next.time"], later)
            anchors.extend(_ns(times))
    # every 12-hourly date whose next 6 hours the pressure levels store, and only those
    assert anchors == [t for t in _ns(sfc.time.values) if t + 6 * 3600 * 10**9 in _ns(pl.time.values)]


def _years(tmp_path: Path, zarr_format: int = 3) -> tuple[list[Path], list[xr.Dataset]]:
    paths, parts = [], []
    for k, year in enumerate((2020, 2021, 2022)):
        times = pd.date_range(f"{year}-01-01", periods=12, freq="6h")
        part = _single(times, seed=10 + k).assign(lsm=_statics().lsm)
        paths.append(_write(part, tmp_path / f"{year}.zarr", zarr_format))
        parts.append(part)
    return paths, parts


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_concat_of_per_year_stores_equals_xr_concat_with_date_splits_across_them(
    tmp_path: Path, zarr_format: int
) -> None:
    paths, parts = _years(tmp_path, zarr_format)
    counted = [CountingStore(local_store(p)) for p in paths]
    concat = concat_stores(counted)
    ref = xr.concat(parts, dim="time", data_vars="minimal")
    got = xr.open_zarr(concat, consolidated=False)
    xr.testing.assert_identical(got.t2m.load(), ref.t2m)  # xarray reads the virtual store as the concatenation
    xr.testing.assert_equal(got.lsm.load(), parts[0].lsm)
    geometry = open_geometries(concat)["t2m"]
    assert geometry.n_samples == 36
    ranges = {"train": ("2020-01-01", "2021-12-31"), "val": ("2022-01-01", None)}
    manifest = split_by_time(geometry, ranges)
    for store in counted:
        store.reset()
    with InSituDataset(concat, manifest, {"t2m": geometry}, batch_size=5, seed=1) as ds:
        info = ds.describe()
        seen: dict[str, list] = {}
        for name in ("train", "val"):
            for batch in ds.split(name):
                times = batch.coords["time"]
                np.testing.assert_array_equal(np.asarray(batch.arrays["t2m"]), ref.t2m.sel(time=times).values)
                seen.setdefault(name, []).extend(_ns(times))
    assert sorted(seen["train"]) == _ns(ref.time.values[:24])  # 2020 and 2021, across the two stores
    assert sorted(seen["val"]) == _ns(ref.time.values[24:])
    for store in counted:  # each stored chunk of each year read once
        gets = _chunk_gets(store)
        assert len(gets) == 3 and set(gets.values()) == {1}
    shares = info["stores"]
    assert [shares[f"part{k}"]["tile_reads"]["train"] for k in range(3)] == [3, 3, 0]
    assert [shares[f"part{k}"]["tile_reads"]["val"] for k in range(3)] == [0, 0, 3]


def test_a_persisted_cache_keeps_each_joined_stores_chunks_apart(tmp_path: Path) -> None:
    times = pd.date_range("2020-01-01", periods=16, freq="6h")
    a, b = _single(times, seed=3, name="t"), _single(times, seed=4, name="t")  # one name, two stores
    joined = join_stores(
        {"a": _write(a, tmp_path / "a.zarr"), "b": _write(b, tmp_path / "b.zarr")}, rename={"b/t": "t_b"}
    )
    manifest = split_by_chunk(joined.geometries["t"], fractions={"train": 1.0})
    kwargs = {"batch_size": 4, "cache_dir": tmp_path / "cache", "persist": True}
    for _ in range(2):  # the second dataset revives every tile from the cache
        with InSituDataset(joined, manifest, ["t", "t_b"], **kwargs) as ds:
            for batch in ds.train:
                rows = _rows(a, batch.coords["time"])
                np.testing.assert_array_equal(np.asarray(batch.arrays["t"]), a.t.values[rows])
                np.testing.assert_array_equal(np.asarray(batch.arrays["t_b"]), b.t.values[rows])
            gets = ds.gets
    assert gets == 0


def test_ranks_share_a_join_chunk_disjoint_and_whole(tmp_path: Path) -> None:
    pl = _pressure(pd.date_range("2020-01-01", periods=48, freq="6h"))
    sfc = _single(pd.date_range("2020-01-01", periods=24, freq="12h"))
    joined = join_stores({"pl": _write(pl, tmp_path / "pl.zarr"), "sfc": _write(sfc, tmp_path / "sfc.zarr")})
    manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
    drawn = []
    for rank in range(2):
        kwargs = {"rank": rank, "world_size": 2, "last_batch": "partial", "batch_size": 4}
        with InSituDataset(joined, manifest, ["t", "t2m"], **kwargs) as ds:
            mine = [t for batch in ds.train for t in _ns(batch.coords["time"])]
        drawn.append(mine)
    assert not set(drawn[0]) & set(drawn[1])
    assert sorted(drawn[0] + drawn[1]) == _ns(sfc.time.values)
    assert abs(len(drawn[0]) - len(drawn[1])) <= CHUNK


# -- bad input ------------------------------------------------------------------------
def test_stores_without_a_common_date_are_refused_naming_their_spans(tmp_path: Path) -> None:
    a = _write(_single(pd.date_range("2020-01-01", periods=8, freq="6h")), tmp_path / "a.zarr")
    b = _write(_single(pd.date_range("2021-01-01", periods=8, freq="6h"), name="u"), tmp_path / "b.zarr")
    with pytest.raises(TimeAxisError, match=r"share no date: store 'a' spans 2020-01-01.*store 'b' spans 2021-01-01"):
        join_stores({"a": a, "b": b})


def test_steps_that_do_not_divide_are_refused_naming_each_stores_step(tmp_path: Path) -> None:
    a = _write(_single(pd.date_range("2020-01-01", periods=8, freq="6h")), tmp_path / "a.zarr")
    b = _write(_single(pd.date_range("2020-01-01", periods=8, freq="9h"), name="u"), tmp_path / "b.zarr")
    with pytest.raises(TimeAxisError, match=r"'a' 6h, 'b' 9h: store 'a''s step 6h does not divide store 'b''s 9h"):
        join_stores({"a": a, "b": b})


def test_a_variable_name_in_two_stores_says_which_and_how_to_choose_or_rename(tmp_path: Path) -> None:
    times = pd.date_range("2020-01-01", periods=8, freq="6h")
    a, b = _write(_single(times), tmp_path / "a.zarr"), _write(_single(times, seed=5), tmp_path / "b.zarr")
    with pytest.raises(ValueError, match=r"'t2m' is in store 'a' and in store 'b'.*variables=.*rename=\{'b/t2m'"):
        join_stores({"a": a, "b": b})
    assert sorted(join_stores({"a": a, "b": b}, variables={"b": []}).geometries) == ["t2m"]
    renamed = join_stores({"a": a, "b": b}, rename={"b/t2m": "t2m_b"})
    assert renamed.labels == {"t2m": "a/t2m", "t2m_b": "b/t2m"}


def test_a_manifest_not_on_the_anchor_dates_is_refused(tmp_path: Path) -> None:
    pl = _write(_pressure(pd.date_range("2020-01-01", periods=24, freq="6h")), tmp_path / "pl.zarr")
    sfc = _write(_single(pd.date_range("2020-01-01", periods=12, freq="12h")), tmp_path / "sfc.zarr")
    joined = join_stores({"pl": pl, "sfc": sfc})
    manifest = split_by_chunk(joined.geometries["t"], fractions={"train": 1.0})  # 24 six-hourly steps
    with pytest.raises(ValueError, match=r"store 'sfc''s 12 time steps .*12h.* is the coarsest"):
        InSituDataset(joined, manifest, ["t", "t2m"])


def test_a_year_that_would_split_a_chunk_is_refused(tmp_path: Path) -> None:
    first = _write(_single(pd.date_range("2020-01-01", periods=10, freq="6h")), tmp_path / "a.zarr")
    second = _write(_single(pd.date_range("2020-01-03T12", periods=8, freq="6h")), tmp_path / "b.zarr")
    with pytest.raises(ValueError, match=r"stores \[\('part0', 10\)\].*4-step chunks.*straddle"):
        concat_stores([first, second])


def test_a_joined_store_is_read_only_and_routes_each_key_to_its_member(tmp_path: Path) -> None:
    times = pd.date_range("2020-01-01", periods=8, freq="6h")
    joined = join_stores({"a": _write(_single(times), tmp_path / "a.zarr")})
    root = zarr.open_group(joined, mode="r")
    assert sorted(k for k, _ in root.members()) == ["a"]
    np.testing.assert_array_equal(zarr.open_array(joined, path="a/t2m", mode="r")[...], _single(times).t2m.values)
    assert not joined.supports_writes
    with pytest.raises(ValueError, match="read-only"):
        zarr.open_array(joined, path="a/t2m", mode="r+")


def test_a_pass_over_joined_and_concatenated_stores_resumes_where_it_stopped(tmp_path: Path) -> None:
    paths, parts = _years(tmp_path)
    pl = xr.concat([_pressure(p.time.to_index(), seed=20 + k) for k, p in enumerate(parts)], dim="time")
    _write(pl, tmp_path / "pl.zarr")

    def dataset() -> InSituDataset:
        joined = join_stores({"years": concat_stores(paths), "pl": tmp_path / "pl.zarr"}, variables={"years": ["t2m"]})
        manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
        return InSituDataset(joined, manifest, ["t2m", "t"], batch_size=4, block_chunks=2, seed=3)

    with dataset() as full:
        expected = [_ns(b.coords["time"]) for b in full.train]
    with dataset() as first:
        it = iter(first.train)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(first.train.state_dict()))
        it.close()
    with dataset() as second:
        second.train.load_state_dict(state)
        tail = []
        for batch in second.train:
            rows = _rows(pl, batch.coords["time"])
            np.testing.assert_array_equal(np.asarray(batch.arrays["t"]), pl.t.values[rows])
            tail.append(_ns(batch.coords["time"]))
    assert tail == expected[3:] and len(expected) == 9


def test_a_persisted_cache_names_the_icechunk_snapshots_a_join_reads(tmp_path: Path) -> None:
    icechunk = pytest.importorskip("icechunk")
    times = pd.date_range("2020-01-01", periods=8, freq="6h")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    versions = []
    for seed in (6, 7):  # two snapshots of one repository
        session = repo.writable_session("main")
        _single(times, seed=seed, name="sst").to_zarr(session.store, mode="w", zarr_format=3, consolidated=False)
        versions.append(session.commit(f"sst {seed}"))
    local = _write(_single(times), tmp_path / "a.zarr")
    identities = set()
    for snapshot in versions:
        joined = join_stores({"a": local, "ocean": icechunk_store(repo, snapshot=snapshot)})
        assert source_identity(joined) is not None
        identities.add(source_identity(joined))
    assert len(identities) == 2  # another snapshot is another cache directory: no chunk of one revives the other
    assert source_identity(join_stores({"a": local})) is None  # plain stores name no version, as alone


def test_offsets_in_time_cross_concatenated_stores_with_gaps_as_xarray_pairs_them(tmp_path: Path) -> None:
    full = pd.date_range("2020-01-01", periods=32, freq="6h")
    halves = [full[:16].delete([5, 6]), full[16:].delete([0, 9])]  # gaps in each, one at the seam
    parts = [_single(times, seed=30 + k) for k, times in enumerate(halves)]
    for part in parts:  # 14 steps each: chunks of 2, so no chunk straddles the seam
        part.to_zarr(
            tmp_path / f"{len(list(tmp_path.iterdir()))}.zarr",
            encoding={"t2m": {"chunks": (2, 4, 5)}},
            consolidated=False,
        )
    concat = concat_stores(sorted(tmp_path.iterdir()))
    ref = xr.concat(parts, dim="time")
    t2m = open_geometries(concat)["t2m"]
    manifest = split_by_chunk(t2m, fractions={"train": 1.0})
    stored = set(_ns(ref.time.values))
    six = 6 * 3600 * 10**9
    with InSituDataset(concat, manifest, {"pair": t2m.window(["-6h", "0h"])}, batch_size=4, seed=2) as ds:
        anchors = []
        for batch in ds.train:
            times = batch.coords["time"]
            before = ref.t2m.sel(time=times - np.timedelta64(6, "h")).values
            np.testing.assert_array_equal(
                np.asarray(batch.arrays["pair"]), np.stack([before, ref.t2m.sel(time=times).values], 1)
            )
            anchors.extend(_ns(times))
    assert sorted(anchors) == sorted(t for t in stored if t - six in stored)  # exactly what xarray can serve


def test_a_join_over_a_gapped_store_draws_exactly_the_dates_both_hold(tmp_path: Path) -> None:
    pl = _pressure(pd.date_range("2020-01-01", periods=32, freq="6h").delete([4, 5, 6, 17]))
    sfc = _single(pd.date_range("2020-01-01", periods=16, freq="12h").delete([11]))
    joined = join_stores({"pl": _write(pl, tmp_path / "pl.zarr"), "sfc": _write(sfc, tmp_path / "sfc.zarr")})
    ref = xr.merge([pl, sfc], join="inner")
    assert joined.report["sfc"].first_left_out == ("2020-01-02T00:00:00", "2020-01-02T12:00:00")  # cut from pl
    manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
    with InSituDataset(joined, manifest, ["t", "t2m"], batch_size=4, seed=5) as ds:
        seen = []
        for batch in ds.train:
            rows = _rows(ref, batch.coords["time"])
            np.testing.assert_array_equal(np.asarray(batch.arrays["t"]), ref.t.values[rows])
            np.testing.assert_array_equal(np.asarray(batch.arrays["t2m"]), ref.t2m.values[rows])
            seen.extend(_ns(batch.coords["time"]))
        lost = ds.describe()["splits"]["train"]["lost"]
    assert sorted(seen) == _ns(ref.time.values)
    # the anchors a store lacks are counted and named as the dates an axis with gaps does not store
    assert (lost["unstored"], lost["unstored_times"]) == (2, ["2020-01-02T00:00:00", "2020-01-02T12:00:00"])


def _sharded(path: Path, data: np.ndarray, chunks: tuple[int, ...] = (2, 3, 4)) -> Path:
    root = zarr.open_group(path, mode="w")
    arr = root.create_array(
        "x", shape=data.shape, dtype="f4", chunks=chunks, shards=(8, 6, 8), dimension_names=("time", "a", "b")
    )
    arr[...] = data
    return path


def test_sharded_stores_concatenate_shard_by_shard_and_read_their_inner_chunks(tmp_path: Path) -> None:
    parts = [np.random.default_rng(k).random((16, 6, 8), dtype="f4") for k in range(3)]
    counted = [CountingStore(local_store(_sharded(tmp_path / f"{k}.zarr", p))) for k, p in enumerate(parts)]
    concat = concat_stores(counted)
    ref = np.concatenate(parts)
    np.testing.assert_array_equal(zarr.open_array(concat, path="x", mode="r")[...], ref)
    x = open_geometries(concat)["x"]
    assert x.sharded_reads and x.n_samples == 48
    for store in counted:
        store.reset()
    with InSituDataset(concat, split_by_chunk(x, fractions={"train": 1.0}), {"x": x}, batch_size=5) as ds:
        for batch in ds.train:
            np.testing.assert_array_equal(np.asarray(batch.arrays["x"]), ref[batch.sample_indices])
    assert all(set(_chunk_gets(s)) == {"x/c/0/0/0", "x/c/1/0/0"} for s in counted)  # each store's own two shards


def test_stores_of_another_layout_are_refused_naming_them(tmp_path: Path) -> None:
    data = np.zeros((16, 6, 8), "f4")
    first, other = _sharded(tmp_path / "a.zarr", data), _sharded(tmp_path / "b.zarr", data, chunks=(4, 3, 4))
    with pytest.raises(
        ValueError, match=r"array 'x' is stored differently in stores \['part1'\] than in 'part0'.*codecs"
    ):
        concat_stores([first, other])


def test_declared_missing_dates_and_frequency_apply_to_every_joined_stores_times(tmp_path: Path) -> None:
    pl = _pressure(pd.date_range("2020-01-01", periods=40, freq="6h"))
    sfc = _single(pd.date_range("2020-01-02", periods=16, freq="12h"))
    joined = join_stores({"pl": _write(pl, tmp_path / "pl.zarr"), "sfc": _write(sfc, tmp_path / "sfc.zarr")})
    ranges = {"train": ("2020-01-02", "2020-01-06"), "val": ("2020-01-07", None)}
    manifest = split_by_time(joined.geometries["t2m"], ranges, missing=["2020-01-03T12"], frequency="24h")
    views = {"t2m": joined.geometries["t2m"], "t": joined.geometries["t"].shift("12h")}  # reads the missing step
    with InSituDataset(joined, manifest, views, batch_size=4, shuffle=False) as ds:
        drawn = []
        for batch in ds.train:
            np.testing.assert_array_equal(np.asarray(batch.arrays["t"]), pl.t.sel(time=batch.coords["t.time"]).values)
            drawn.extend(_ns(batch.coords["time"]))
        lost = ds.describe()["splits"]["train"]["lost"]
        with pytest.raises(TimeAxisError, match=r"declared missing: 2020-01-03T12:00:00"):
            ds.infer()
    days = pd.date_range("2020-01-02", "2020-01-05", freq="24h")  # (the chunk across the val boundary is out)
    assert drawn == _ns(days.delete(1))  # 2020-01-03T00's 12 hours later is declared missing
    assert (lost["missing"], lost["missing_times"]) == (1, ["2020-01-03T12:00:00"])


def test_per_year_stores_over_http_concatenate_and_each_tile_is_fetched_once(http_server: HTTPFileServer) -> None:
    paths, parts = _years(http_server.root, zarr_format=2)  # consolidated: an HTTP endpoint cannot list
    concat = concat_stores([obstore_store(f"{http_server.url}/{p.name}") for p in paths])
    ref = xr.concat(parts, dim="time", data_vars="minimal")
    t2m = open_geometries(concat, variables=["t2m"])["t2m"]
    manifest = split_by_time(t2m, {"train": ("2020", "2021"), "val": ("2022", None)})
    http_server.requests.clear()
    with InSituDataset(concat, manifest, {"t2m": t2m}, batch_size=6, seed=9) as ds:
        for batch in ds.train:
            np.testing.assert_array_equal(
                np.asarray(batch.arrays["t2m"]), ref.t2m.sel(time=batch.coords["time"]).values
            )
    gets = Counter(p for m, p, _ in http_server.requests if m == "GET" and "/t2m/" in p and not p.endswith(DOCS))
    assert set(gets.values()) == {1}  # from the server's side: each chunk of 2020 and 2021 once, none of 2022
    assert sorted({p.split("/")[1] for p in gets}) == ["2020.zarr", "2021.zarr"] and len(gets) == 6
    close_store(concat)


def test_one_store_is_no_list_of_stores_to_concatenate(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="a list of stores"):
        concat_stores(str(tmp_path / "2020.zarr"))


def test_groups_of_one_store_join_as_stores_do(tmp_path: Path) -> None:
    pl = _pressure(pd.date_range("2020-01-01", periods=16, freq="6h"))
    sfc = _single(pd.date_range("2020-01-01", periods=16, freq="6h"))
    for group, ds in (("pressure", pl), ("surface", sfc)):
        encoding = {v: {"chunks": (CHUNK, *ds[v].shape[1:])} for v in ds.data_vars}
        ds.to_zarr(tmp_path / "era5.zarr", group=group, encoding=encoding, zarr_format=3, consolidated=False)
    store = CountingStore(local_store(tmp_path / "era5.zarr"))
    joined = join_stores(
        {"pl": (store, "pressure"), "sfc": (store, "surface"), "st": _write(_statics(), tmp_path / "st.zarr")}
    )
    assert joined.labels == {"t": "pl/t", "z": "pl/z", "t2m": "sfc/t2m", "lsm": "st/lsm", "orog": "st/orog"}
    ref = xr.merge([pl, sfc, _statics()])
    manifest = split_by_chunk(joined.geometries["t2m"], fractions={"train": 1.0})
    store.reset()
    with InSituDataset(joined, manifest, None, statics=["lsm"], batch_size=5) as ds:
        for batch in ds.train:
            rows = _rows(ref, batch.coords["time"])
            for label in ("t", "z", "t2m"):
                np.testing.assert_array_equal(np.asarray(batch.arrays[label]), ref[label].values[rows])
        np.testing.assert_array_equal(ds.statics["lsm"], ref.lsm.values)
    gets = _chunk_gets(store)
    assert set(gets.values()) == {1} and {k.split("/")[0] for k in gets} == {"pressure", "surface"}
    with pytest.raises(TypeError, match=r"store 'pl' must be a store, a URL, or a \(store, group\) pair"):
        join_stores({"pl": (store, "pressure", "extra")})
