"""Date splits and date-bounded inference against xarray's ``.sel(time=slice(a, b))``.

``edges="exact"`` must select exactly xarray's samples; the default
chunk-granular split the subset of them whose whole chunk lies inside the
range, with the rest reported as dropped. Iterating a split reads the values
xarray selects.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
import xarray as xr
import zarr
from dated_stores import open_xr
from zarr.storage import LocalStore

from insitubatch import InSituDataset, SplitManifest, open_geometries, split_by_chunk, split_by_time
from insitubatch.plan.dates import coordinate_range
from insitubatch.testing.data import six_hourly, write_dated

CHUNK = 7  # 42 hours: chunks straddle every day boundary somewhere
STEPS = 124  # 2015-12-20 .. 2016-01-19T18
# WeatherBench2-style: train up to a year's end, validate a stretch, test the rest (open end)
RANGES = {
    "train": ("2015-12-20", "2015-12-31"),
    "val": ("2016-01-01", "2016-01-07"),
    "test": ("2016-01-08", None),
}


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def dated(tmp_path, request):
    return write_dated(tmp_path / "era5.zarr", six_hourly("2015-12-20", STEPS), chunk=CHUNK, zarr_format=request.param)


def _geometry(path):
    return open_geometries(LocalStore(path, read_only=True))["t2m"]


def _sel(path, start, stop) -> np.ndarray:
    """The dates xarray selects for ``slice(start, stop)``."""
    return open_xr(path)["time"].sel(time=slice(start, stop)).values


def test_exact_edges_select_what_xarray_selects(dated) -> None:
    m = split_by_time(_geometry(dated), RANGES, edges="exact")
    times = open_xr(dated)["time"].values
    for name, (a, b) in RANGES.items():
        np.testing.assert_array_equal(times[m.sample_indices(name)], _sel(dated, a, b))
        assert m.split_dates(name).samples == len(m.sample_indices(name))
    assert sorted(np.concatenate([m.sample_indices(n) for n in m.names]).tolist()) == list(range(STEPS))


def test_chunk_edges_keep_the_whole_chunks_and_report_the_rest(dated) -> None:
    m = split_by_time(_geometry(dated), RANGES)
    times = open_xr(dated)["time"].values
    chunk_of = np.arange(STEPS) // CHUNK
    for name, (a, b) in RANGES.items():
        selected = np.flatnonzero(np.isin(times, _sel(dated, a, b)))
        whole = [i for i in selected if set(np.flatnonzero(chunk_of == chunk_of[i])) <= set(selected)]
        assert m.sample_indices(name).tolist() == whole
        assert set(m.chunks(name)) == {int(chunk_of[i]) for i in whole}
        dates = m.split_dates(name)
        assert dates.samples == len(whole)
        assert sum(r.samples for r in dates.dropped) == len(selected) - len(whole)
        assert not dates.shared_chunks
    used = [c for n in m.names for c in m.chunks(n)]
    assert len(used) == len(set(used)), "a chunk serves two splits"
    # the boundary chunks (2015-12-31/2016-01-01 and 2016-01-07/08) are dropped from both sides
    assert m.split_dates("train").dropped[-1].last == "2015-12-31T18:00"
    assert m.split_dates("val").dropped[0].first == "2016-01-01"


def test_exact_edges_share_the_straddling_chunks_and_say_so(dated) -> None:
    m = split_by_time(_geometry(dated), RANGES, edges="exact")
    train, val = set(m.chunks("train")), set(m.chunks("val"))
    assert train & val == set(m.split_dates("train").shared_chunks) & set(m.split_dates("val").shared_chunks) != set()
    assert "chunk 6 straddles a boundary: another split reads it too" in m.describe()
    assert "chunks 6, 10 straddle boundaries" in m.describe()


@pytest.mark.parametrize(
    "bounds",
    [
        ("2016", "2016"),
        ("2016-01", None),
        ("2016-01-03T12", "2016-01-05T06"),
        ("2016-01-03 12:00", "2016-01-05 06:00:00"),
        (dt.datetime(2016, 1, 3, 12), dt.datetime(2016, 1, 5, 6)),
        (np.datetime64("2016-01-03T12"), np.datetime64("2016-01-05")),
        (None, "2015-12-25"),
        ("2016-01-03T13", "2016-01-05T05"),  # between steps
    ],
    ids=str,
)
def test_every_kind_of_bound_matches_xarray(dated, bounds) -> None:
    m = split_by_time(_geometry(dated), {"only": bounds}, edges="exact")
    times = open_xr(dated)["time"].values
    np.testing.assert_array_equal(times[m.sample_indices("only")], _sel(dated, *bounds))


def test_noleap_calendar_splits_like_xarray(tmp_path) -> None:
    pytest.importorskip("cftime")
    times = xr.date_range("2000-02-20", periods=60, freq="6h", calendar="noleap", use_cftime=True)
    path = write_dated(tmp_path / "noleap.zarr", times, chunk=CHUNK)
    ranges = {"train": ("2000-02-20", "2000-02-28"), "val": ("2000-03-01", None)}  # no Feb 29 in noleap
    m = split_by_time(_geometry(path), ranges, edges="exact")
    decoded = open_xr(path)["time"].values
    for name, (a, b) in ranges.items():
        assert list(decoded[m.sample_indices(name)]) == list(_sel(path, a, b))
    assert m.split_dates("val").first == "2000-03-01"


@pytest.mark.parametrize(
    ("ranges", "match"),
    [
        ({"train": ("2015-12-20", "2016-01-02"), "val": ("2016-01-01", None)}, "overlap"),
        ({"train": ("2015", "2015-12-31"), "val": ("2015-12-31T18", None)}, "overlap"),
        ({"train": (None, None), "val": ("2016-01-10", None)}, "overlap"),
        ({"train": ("2016-01-05", "2016-01-01")}, "after"),
        ({"train": ("2017-01-01", None)}, "holds no sample.*2015-12-20.*2016-01-19T18:00"),
        ({"train": ("2015-12-21T06", "2015-12-21T12")}, "no whole chunk.*edges='exact'"),
        ({"train": ("not a date", None)}, "ISO 8601"),
    ],
)
def test_bad_ranges_raise_with_the_reason(dated, ranges, match) -> None:
    with pytest.raises(ValueError, match=match):
        split_by_time(_geometry(dated), ranges)


def test_bad_arguments_raise(dated) -> None:
    g = _geometry(dated)
    with pytest.raises(ValueError, match="edges"):
        split_by_time(g, RANGES, edges="nearest")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        split_by_time(g, [("2016", None)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(start, stop\) pair"):
        split_by_time(g, {"train": "2016"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ArrayGeometry"):
        split_by_time("t2m", RANGES)  # type: ignore[arg-type]


def test_a_store_without_time_says_how_to_split_instead(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "plain.zarr", mode="w", zarr_format=3)
    root.create_array("x", shape=(20, 2), chunks=(5, 2), dtype="f4", dimension_names=("step", "c"))
    root.create_array("step", shape=(20,), dtype="f8", dimension_names=("step",))[:] = np.arange(20) * 0.5
    g = open_geometries(LocalStore(tmp_path / "plain.zarr"))["x"]
    with pytest.raises(ValueError, match="holds no dates.*split_by_chunk"):
        split_by_time(g, {"train": ("2016", None)})
    root.create_array("y", shape=(20, 2), chunks=(5, 2), dtype="f4")  # no dimension names at all
    with pytest.raises(ValueError, match="no dimension names.*sample_range"):
        split_by_time(open_geometries(LocalStore(tmp_path / "plain.zarr"))["y"], {"train": ("2016", None)})


def test_numeric_coordinates_select_by_inclusive_value() -> None:
    values = np.arange(10) * 0.5
    assert coordinate_range(values, 1.0, 2.5) == (2, 6)
    assert coordinate_range(values, None, 0.2) == (0, 1)
    assert coordinate_range(values, 7, None) == (10, 10)
    with pytest.raises(TypeError, match="number"):
        coordinate_range(values, "2016", None)
    with pytest.raises(ValueError, match="does not increase"):
        coordinate_range(values[::-1], 1.0, 2.0)


# -- the manifest ----------------------------------------------------------------------------
def test_the_manifest_records_the_dates_and_round_trips(dated, tmp_path) -> None:
    for edges in ("chunk", "exact"):
        m = split_by_time(_geometry(dated), RANGES, edges=edges)
        doc = json.loads(m.to_json())
        assert doc["format"] == 2 and doc["edges"] == edges and doc["dim"] == "time"
        assert doc["dates"]["test"]["start"] == "2016-01-08" and doc["dates"]["test"]["stop"] is None
        # a chunk of 42 hours straddles 2016-01-07/08: chunk edges stop before it, exact ones at the day's end
        assert doc["dates"]["val"]["last"] == {"chunk": "2016-01-06T06:00", "exact": "2016-01-07T18:00"}[edges]
        m.save(str(tmp_path / f"{edges}.json"))
        back = SplitManifest.load(str(tmp_path / f"{edges}.json"))
        assert back == m and back.fingerprint() == m.fingerprint()
        for name in m.names:
            np.testing.assert_array_equal(back.sample_indices(name), m.sample_indices(name))


def test_chunk_splits_keep_format_1_and_their_fingerprint(dated) -> None:
    m = split_by_chunk(_geometry(dated), fractions=(0.5, 0.5))
    doc = json.loads(m.to_json())
    assert doc["format"] == 1 and set(doc) == {
        "format",
        "array",
        "n_samples",
        "sample_chunk_size",
        "splits",
        "sample_range",
        "fractions",
        "contiguous",
        "seed",
    }
    assert SplitManifest.from_json(m.to_json()) == m
    with pytest.raises(KeyError, match="split_by_chunk"):
        m.split_dates("train")
    with pytest.raises(ValueError, match="format 7"):
        SplitManifest.from_json(json.dumps({**doc, "format": 7}))


def test_describe_shows_dates_counts_and_drops(dated) -> None:
    m = split_by_time(_geometry(dated), RANGES)
    text = str(m)
    assert text == m.describe()
    assert "edges='chunk'" in text
    for name in RANGES:
        d = m.split_dates(name)
        assert f"{d.first} .. {d.last}: {d.samples} samples" in text
    assert f"left out {m.split_dates('train').dropped[0]}: in a chunk that straddles" in text
    assert "left out 2016-01-08 (1 sample)" in text
    plain = split_by_chunk(_geometry(dated), fractions=(0.5, 0.5)).describe()
    assert "split by chunk fractions [0.5, 0.5]" in plain and "samples 0 .. " in plain


# -- reading what the splits name ------------------------------------------------------------
@pytest.mark.parametrize("edges", ["chunk", "exact"])
def test_iterating_a_date_split_reads_xarray_s_values(dated, edges) -> None:
    g = _geometry(dated)
    m = split_by_time(g, RANGES, edges=edges)
    oracle = open_xr(dated)["t2m"]
    times = open_xr(dated)["time"].values
    with InSituDataset(LocalStore(dated, read_only=True), m, {"t2m": g}, batch_size=10, block_chunks=2) as ds:
        for name in RANGES:
            got = sorted((int(i), row) for b in ds.split(name) for i, row in zip(b.sample_indices, b.arrays["t2m"]))
            want = oracle.sel(time=times[m.sample_indices(name)]).values
            assert [i for i, _ in got] == m.sample_indices(name).tolist()
            np.testing.assert_array_equal(np.stack([r for _, r in got]), want)


def test_infer_takes_inclusive_dates(dated) -> None:
    g = _geometry(dated)
    oracle = open_xr(dated)
    with InSituDataset(LocalStore(dated, read_only=True), split_by_chunk(g, fractions=(1.0,)), {"t2m": g}) as ds:
        for start, stop in [("2016-01-01", "2016-01-02"), ("2016-01-03T06", None), (None, "2015-12-21")]:
            batches = list(ds.infer(start=start, stop=stop, batch_size=8))
            got = np.concatenate([b.arrays["t2m"] for b in batches])
            np.testing.assert_array_equal(got, oracle["t2m"].sel(time=slice(start, stop)).values)
        with pytest.raises(ValueError, match="not both"):
            ds.infer((0, 4), start="2016-01-01")
        with pytest.raises(ValueError, match="selects no sample.*2015-12-20"):
            ds.infer(start="2030-01-01")
        with pytest.raises(TypeError, match="not a date"):
            ds.infer(start=3)


def test_a_date_split_through_the_torch_adapter(dated) -> None:
    torch = pytest.importorskip("torch")
    from insitubatch import as_torch

    g = _geometry(dated)
    m = split_by_time(g, RANGES, edges="exact")
    times = open_xr(dated)["time"].values
    with InSituDataset(LocalStore(dated, read_only=True), m, {"t2m": g}, batch_size=16, shuffle=False) as ds:
        rows = torch.cat([item["t2m"] for item in as_torch(ds.val)])
    want = open_xr(dated)["t2m"].sel(time=slice(*RANGES["val"])).values
    np.testing.assert_array_equal(rows.numpy(), want)
    assert len(want) == len(times[m.sample_indices("val")])
