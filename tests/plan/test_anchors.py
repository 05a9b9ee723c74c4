"""Declared missing dates (``missing=``) and anchor frequency (``frequency=``), against xarray.

A manifest's missing dates drop every anchor whose window (any label's
offsets, or the anchor itself) touches one, in every split and rank, with
the same accounting in ``describe()``; a frequency keeps the anchors a whole
number of it after the first date and reads only the chunks they need. The
opt-in fill-value scan reports steps that are all fill value and drops none.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from dated_stores import open_xr
from helpers import CountingStore, local_store
from zarr.storage import LocalStore

from insitubatch import InSituDataset, SplitManifest, open_geometries, scan_fill_steps, split_by_chunk, split_by_time
from insitubatch.errors import TimeAxisError
from insitubatch.testing.data import DATED_LAT, DATED_LON, six_hourly, write_dated

HOUR = np.timedelta64(1, "h")
STEPS = 64
MISSING = ["2000-01-03", ("2000-01-07T06", "2000-01-07T12"), np.datetime64("2000-01-12T18")]


@pytest.fixture
def archive(tmp_path):
    return write_dated(tmp_path / "era5.zarr", six_hourly("2000-01-01", STEPS), chunk=4)


def _geometry(path):
    return open_geometries(LocalStore(path, read_only=True))["t2m"]


def _missing_times(path) -> set[np.datetime64]:
    """The steps ``MISSING`` names, by xarray's own selection."""
    time = open_xr(path)["time"]
    day = time.sel(time="2000-01-03").values
    run = time.sel(time=slice("2000-01-07T06", "2000-01-07T12")).values
    return set(np.concatenate([day, run, time.sel(time=[np.datetime64("2000-01-12T18")]).values]))


def _drawn(path, manifest, variables, **kw) -> list[np.datetime64]:
    out = []
    with InSituDataset(LocalStore(path, read_only=True), manifest, variables, batch_size=3, block_chunks=2, **kw) as ds:
        for split in manifest.names:
            for batch in ds.split(split):
                out.extend(batch.coords["time"].tolist())
    return out


@pytest.mark.parametrize("splitter", ["chunk", "time"])
def test_missing_dates_drop_every_anchor_whose_window_touches_one(archive, splitter) -> None:
    g = _geometry(archive)
    if splitter == "chunk":
        manifest = split_by_chunk(g, fractions=(0.5, 0.25, 0.25), missing=MISSING)
    else:
        ranges = {
            "train": ("2000-01-01", "2000-01-08"),
            "val": ("2000-01-09", "2000-01-12"),
            "test": ("2000-01-13", None),
        }
        manifest = split_by_time(g, ranges, edges="exact", missing=MISSING)
    times = open_xr(archive)["time"].values
    gone = _missing_times(archive)
    variables = {"x": g.window([-1, 0]), "y": g.shift("6h")}
    expected = set()
    for name in manifest.names:
        for i in manifest.sample_indices(name):
            if 1 <= i < STEPS - 1 and not {times[i - 1], times[i], times[i + 1]} & gone:
                expected.add(times[i])
    drawn = [np.datetime64(t, "ns") for t in _drawn(archive, manifest, variables)]
    assert len(drawn) == len(set(drawn))
    assert set(drawn) == expected
    # every rank of two draws its share; together, exactly the anchors expected
    both = [
        np.datetime64(t, "ns") for r in range(2) for t in _drawn(archive, manifest, variables, rank=r, world_size=2)
    ]
    assert set(both) == expected


def test_missing_dates_are_accounted_for_per_split_in_describe_and_the_manifest(archive) -> None:
    g = _geometry(archive)
    manifest = split_by_chunk(g, fractions=(0.5, 0.5), missing=MISSING)
    variables = {"y": g.shift(1)}
    times = open_xr(archive)["time"].values
    gone = _missing_times(archive)
    with InSituDataset(LocalStore(archive, read_only=True), manifest, variables, batch_size=4) as ds:
        info = ds.describe()
        for name in manifest.names:
            anchors = [i for i in manifest.sample_indices(name) if i < STEPS - 1]
            lost = sum(1 for i in anchors if {times[i], times[i + 1]} & gone)
            assert info["splits"][name]["lost"]["missing"] == lost
            assert info["splits"][name]["samples"] == len(anchors) - lost
        assert info["splits"]["train"]["lost"]["missing_times"][0] == "2000-01-03T00:00:00"
    text = manifest.describe(variables)
    assert "missing: 2000-01-03, 2000-01-07T06 .. 2000-01-07T12, 2000-01-12T18:00:00" in text
    assert (
        "split 'train' drops anchors:" in text and "touches a declared missing date (first 2000-01-03T00:00:00" in text
    )


def test_missing_dates_round_trip_in_the_manifest_json_and_older_formats_stay(archive, tmp_path) -> None:
    g = _geometry(archive)
    plain = split_by_chunk(g)
    assert '"format": 1' in plain.to_json() and "missing" not in plain.to_json()
    manifest = split_by_chunk(g, missing=MISSING, frequency="12h")
    manifest.save(str(tmp_path / "m.json"))
    back = SplitManifest.load(str(tmp_path / "m.json"))
    assert back == manifest and back.fingerprint() == manifest.fingerprint() != plain.fingerprint()
    assert back.missing[0] == ("2000-01-03", "2000-01-03") and back.frequency == "12h"
    assert '"format": 4' in manifest.to_json()


def test_inference_raises_for_a_declared_missing_date(archive) -> None:
    g = _geometry(archive)
    manifest = split_by_chunk(g, fractions=(1.0,), missing=["2000-01-03T06"])
    with InSituDataset(LocalStore(archive, read_only=True), manifest, {"t": g}, batch_size=4) as ds:
        with pytest.raises(TimeAxisError, match="declared missing: 2000-01-03T06:00:00"):
            ds.infer(start="2000-01-03", stop="2000-01-04")
        assert sum(len(b) for b in ds.infer(start="2000-01-04", stop="2000-01-05")) == 8


def test_frequency_draws_every_twelve_hours_and_reads_only_the_chunks_they_need(tmp_path) -> None:
    # one step per chunk (ERA5's common layout): anchors every 24h need a quarter of the chunks, and a
    # window one step back another quarter
    path = write_dated(tmp_path / "daily.zarr", six_hourly("2000-01-01", 40), chunk=1)
    g = _geometry(path)
    manifest = split_by_chunk(g, fractions=(1.0,), frequency="24h")
    times = open_xr(path)["time"].values
    store = CountingStore(local_store(path))
    with InSituDataset(store, manifest, {"x": g.window(["-6h", "0h"])}, batch_size=4) as ds:
        store.reset()
        got = [t for b in ds.train for t in b.coords["time"].tolist()]
        gets = store.chunk_gets()
    wanted = [t for t in times[1:] if (t - times[0]) % np.timedelta64(24, "h") == np.timedelta64(0, "h")]
    assert sorted(np.datetime64(t, "ns") for t in got) == wanted
    read = sorted(int(k.split("/")[-3]) for k in gets)  # t2m/c/<time>/0/0
    assert read == sorted(
        {i for t in wanted for i in (int(np.flatnonzero(times == t)[0]) - 1, int(np.flatnonzero(times == t)[0]))}
    )
    assert all(n == 1 for n in gets.values())  # read once


def test_frequency_on_a_gapped_axis_counts_from_the_first_date(tmp_path) -> None:
    times = six_hourly("2000-01-01", 30)
    keep = np.ones(30, bool)
    keep[[2, 9]] = False
    path = write_dated(tmp_path / "gapped.zarr", times[keep], chunk=4)
    g = _geometry(path)
    manifest = split_by_chunk(g, fractions=(0.5, 0.5), frequency="12h")
    drawn = sorted(np.datetime64(t, "ns") for t in _drawn(path, manifest, {"t": g}))
    assert drawn == [t for t in times[keep] if (t - times[0]) % np.timedelta64(12, "h") == np.timedelta64(0, "h")]


def test_a_frequency_that_is_not_a_multiple_of_the_step_raises(archive) -> None:
    g = _geometry(archive)
    with pytest.raises(TimeAxisError, match=r"frequency='9h' is not a whole multiple of the archive's 6h step"):
        split_by_chunk(g, frequency="9h")
    with pytest.raises(TimeAxisError, match=r"frequency='3h'"):
        split_by_time(g, {"train": ("2000", None)}, frequency="3h")
    with pytest.raises(ValueError, match="is not a duration"):
        split_by_chunk(g, frequency="twice a day")


def test_bad_missing_dates_raise_naming_them(archive, tmp_path) -> None:
    g = _geometry(archive)
    with pytest.raises(ValueError, match=r"missing holds '2000-13-01'"):
        split_by_chunk(g, missing=["2000-13-01"])
    with pytest.raises(ValueError, match="ends before it starts"):
        split_by_chunk(g, missing=[("2000-01-05", "2000-01-04")])
    with pytest.raises(TypeError, match="list of dates"):
        split_by_chunk(g, missing="2000-01-03")
    root = zarr.open_group(tmp_path / "plain.zarr", mode="w", zarr_format=3)
    root.create_array("x", shape=(8, 2), chunks=(4, 2), dtype="f4")
    with pytest.raises(TimeAxisError, match="array 'x' has no dimension names"):
        split_by_chunk(open_geometries(LocalStore(tmp_path / "plain.zarr"))["x"], missing=["2000-01-01"])


def test_the_fill_scan_reports_steps_that_are_all_fill_value_and_drops_nothing(tmp_path) -> None:
    times = six_hourly("2000-01-01", 24)
    path = write_dated(tmp_path / "holes.zarr", times, chunk=5)
    arr = zarr.open_array(path / "t2m", mode="r+")
    fill = arr.fill_value
    arr[4] = fill  # a step inside a chunk
    arr[10:15] = fill  # a whole chunk: zarr reads it as fill either way
    arr[20, 0, 0] = fill  # one cell of fill is data, not a hole
    g = _geometry(path)
    found = scan_fill_steps(LocalStore(path, read_only=True), g)
    assert found.indices == (4, 10, 11, 12, 13, 14)
    assert found.missing[:2] == ["2000-01-02T00:00:00", "2000-01-03T12:00:00"]
    assert "6 of 24 steps hold only the fill value" in str(found)
    assert scan_fill_steps(LocalStore(path, read_only=True), g, sample_range=(11, 13)).indices == (11, 12)
    # what it reports, missing= drops: exactly those steps, not their whole days
    manifest = split_by_chunk(g, fractions=(1.0,), missing=found.missing)
    drawn = {np.datetime64(t, "ns") for t in _drawn(path, manifest, {"t": g})}
    assert drawn == set(times) - {times[i] for i in found.indices}
    nan = tmp_path / "nan.zarr"
    root = zarr.open_group(nan, mode="w", zarr_format=3)
    a = root.create_array(
        "v", shape=(6, DATED_LAT, DATED_LON), chunks=(2, DATED_LAT, DATED_LON), dtype="f4", fill_value=float("nan")
    )
    a[:] = 1.0
    a[3] = np.nan
    assert scan_fill_steps(LocalStore(nan), open_geometries(LocalStore(nan))["v"]).indices == (3,)
    v2 = tmp_path / "v2.zarr"
    group = zarr.open_group(v2, mode="w", zarr_format=2)
    b = group.create_array("w", shape=(6, 2), chunks=(1, 2), dtype="f4", fill_value=None)
    b[[0, 1, 3, 4, 5]] = 2.0  # step 2's chunk is never written: zarr reads it as zeros
    assert scan_fill_steps(LocalStore(v2), open_geometries(LocalStore(v2))["w"]).indices == (2,)


def test_the_dataset_s_missing_and_frequency_join_its_manifest_s(archive) -> None:
    g = _geometry(archive)
    declared = split_by_chunk(g, fractions=(0.5, 0.5), missing=MISSING[:1], frequency="12h")
    plain = split_by_chunk(g, fractions=(0.5, 0.5), missing=MISSING[:1])
    variables = {"x": g.window([-1, 0])}
    with InSituDataset(LocalStore(archive, read_only=True), declared, variables, batch_size=4) as a:
        expected = a.plan("train")
    with InSituDataset(
        LocalStore(archive, read_only=True), plain, variables, batch_size=4, frequency=np.timedelta64(12, "h")
    ) as b:
        assert b.manifest == declared and b.plan("train").reads == expected.reads
        assert np.array_equal(b.plan("train").order, expected.order)
    with InSituDataset(LocalStore(archive, read_only=True), plain, variables, missing=MISSING[1:], batch_size=4) as c:
        assert c.manifest.missing == split_by_chunk(g, missing=MISSING).missing
    with pytest.raises(ValueError, match=r"frequency='24h' differs from the manifest's '12h'"):
        InSituDataset(LocalStore(archive, read_only=True), declared, variables, frequency="24h")
