"""Time coordinates decode as xarray decodes them; dates users type name the instants pandas would slice at.

The oracle is ``xarray.open_zarr`` on stores ``to_zarr`` wrote: CF int64
hours (xarray's default), float days, int32 hours since another epoch, a
UTC-offset reference date, native ``datetime64``, non-standard calendars with
and without ``cftime``.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xarray as xr
import zarr
from dated_stores import open_xr
from zarr.storage import LocalStore

from insitubatch import open_geometries
from insitubatch.errors import CalendarError
from insitubatch.io.dates import TimeAxis
from insitubatch.io.times import decode_time_coordinate, encode_time_coordinate
from insitubatch.testing.data import six_hourly, write_dated

STEPS = 40
ENCODINGS = {
    "int64-hours (xarray default)": None,
    "float-days": {"units": "days since 1979-01-01", "dtype": "float64"},
    "float32-days-since-1970": {"units": "days since 1970-01-01", "dtype": "float32"},
    "int32-hours-since-1900": {"units": "hours since 1900-01-01 00:00:00", "dtype": "int32"},
    "seconds-utc-offset": {"units": "seconds since 1979-01-01T00:00:00+00:00", "dtype": "int64"},
    "minutes-gregorian": {"units": "minutes since 1978-12-31 05:30", "dtype": "float64", "calendar": "gregorian"},
    "standard-ref-before-1677": {"units": "days since 1000-01-01", "dtype": "float64", "calendar": "standard"},
}


def _coord(path) -> np.ndarray:
    return open_geometries(LocalStore(path, read_only=True))["t2m"].coord("time")


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_cf_time_decodes_as_xarray_does(tmp_path, encoding, zarr_format) -> None:
    path = write_dated(
        tmp_path / "s.zarr", six_hourly("1979-01-01", STEPS), zarr_format=zarr_format, encoding=ENCODINGS[encoding]
    )
    mine, oracle = _coord(path), open_xr(path)["time"].values
    assert mine.dtype == oracle.dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(mine, oracle)


def test_fractional_float_days_truncate_to_the_nanosecond_as_xarray_does(tmp_path) -> None:
    """0.1 day is not exact in binary; xarray multiplies and truncates, and so must we."""
    path = tmp_path / "s.zarr"
    ds = xr.Dataset({"t2m": (("time",), np.zeros(5, "f4"))}, coords={"time": np.arange(5) * 0.1 + 0.05})
    ds["time"].attrs.update(units="days since 2000-01-01", calendar="proleptic_gregorian")
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    arr = zarr.open_array(path, path="time", mode="r")
    mine = decode_time_coordinate(arr[:], dict(arr.attrs), name="time")
    np.testing.assert_array_equal(mine, open_xr(path)["time"].values)


def test_native_datetime64_passes_through(tmp_path) -> None:
    path = tmp_path / "native.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    times = six_hourly("2020-01-01", 8)
    root.create_array("time", shape=(8,), dtype="datetime64[ns]", dimension_names=("time",))[:] = times
    root.create_array("t2m", shape=(8, 2), chunks=(4, 2), dtype="f4", dimension_names=("time", "x"))[:] = 0
    mine = _coord(path)
    np.testing.assert_array_equal(mine, open_xr(path)["time"].values)
    np.testing.assert_array_equal(mine, times)


def test_missing_dates_decode_to_nat(tmp_path) -> None:
    times = six_hourly("1979-01-01", 8)
    times[3] = np.datetime64("NaT", "ns")
    for encoding in (None, {"units": "days since 1979-01-01", "dtype": "float64"}):
        path = write_dated(tmp_path / f"nat{encoding is None}.zarr", times, encoding=encoding)
        mine = _coord(path)
        np.testing.assert_array_equal(mine, open_xr(path)["time"].values)
        assert np.isnat(mine[3]) and not np.isnat(mine[[0, 2, 4]]).any()


@pytest.mark.parametrize("calendar", ["noleap", "360_day", "julian", "all_leap"])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_other_calendars_decode_to_cftime_like_xarray(tmp_path, calendar, zarr_format) -> None:
    pytest.importorskip("cftime")
    times = xr.date_range("2000-02-25", periods=STEPS, freq="6h", calendar=calendar, use_cftime=True)
    path = write_dated(tmp_path / "c.zarr", times, zarr_format=zarr_format)
    mine, oracle = _coord(path), open_xr(path)["time"].values
    assert mine.dtype == oracle.dtype == object
    assert list(mine) == list(oracle)
    assert all(type(a) is type(b) for a, b in zip(mine, oracle))


def test_other_calendars_without_cftime_raise_a_clear_error(tmp_path, monkeypatch) -> None:
    times = xr.date_range("2000-01-01", periods=8, freq="6h", calendar="noleap", use_cftime=True)
    path = write_dated(tmp_path / "c.zarr", times)
    monkeypatch.setitem(sys.modules, "cftime", None)  # importing it now fails, as when it is not installed
    g = open_geometries(LocalStore(path, read_only=True))["t2m"]  # opening reads no coordinate
    with pytest.raises(CalendarError, match=r"'time'.*'noleap'.*pip install cftime"):
        g.coord("time")
    assert isinstance(CalendarError("x"), ValueError)


def test_a_coordinate_without_time_units_is_not_time() -> None:
    values = np.arange(4.0)
    assert decode_time_coordinate(values, {}) is None
    assert decode_time_coordinate(values, {"units": "degrees_north"}) is None
    assert decode_time_coordinate(np.array(["a", "b"]), {"units": "days since 2000-01-01"}) is None


def test_units_that_are_no_cf_time_name_the_array() -> None:
    pytest.importorskip("cftime")
    with pytest.raises(CalendarError, match=r"'valid_time'"):
        decode_time_coordinate(np.arange(3), {"units": "fortnights since 2000-01-01"}, name="valid_time")


def test_the_core_imports_neither_pandas_nor_xarray(tmp_path) -> None:
    path = write_dated(tmp_path / "s.zarr", six_hourly("1979-01-01", 16))
    code = textwrap.dedent(
        f"""
        import sys
        from zarr.storage import LocalStore
        import insitubatch as ib
        g = ib.open_geometries(LocalStore({str(path)!r}, read_only=True))["t2m"]
        assert g.coord("time").dtype.kind == "M"
        leaked = sorted(m for m in ("pandas", "xarray", "cftime") if m in sys.modules)
        assert not leaked, leaked
        """
    )
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True, timeout=120)


# -- what users type -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "first", "last"),
    [
        ("2015", "2015-01-01T00", "2015-12-31T23:59:59.999999999"),
        ("2015-02", "2015-02-01", "2015-02-28T23:59:59.999999999"),
        ("2015-12", "2015-12-01", "2015-12-31T23:59:59.999999999"),
        ("2015-12-31", "2015-12-31", "2015-12-31T23:59:59.999999999"),
        ("20151231", "2015-12-31", "2015-12-31T23:59:59.999999999"),
        ("2015-12-31T18", "2015-12-31T18", "2015-12-31T18:59:59.999999999"),
        ("2015-12-31 18:30", "2015-12-31T18:30", "2015-12-31T18:30:59.999999999"),
        ("2015-12-31T18:30:15", "2015-12-31T18:30:15", "2015-12-31T18:30:15.999999999"),
        ("2015-12-31T18:30:15.5", "2015-12-31T18:30:15.5", "2015-12-31T18:30:15.500999999"),
    ],
)
def test_a_date_string_names_its_whole_resolution(text, first, last) -> None:
    lo, hi = TimeAxis().bounds(text)
    assert (lo, hi) == (np.datetime64(first, "ns"), np.datetime64(last, "ns"))


def test_date_objects_name_one_instant() -> None:
    axis = TimeAxis()
    instant = np.datetime64("2016-01-01T06", "ns")
    for value in (dt.datetime(2016, 1, 1, 6), np.datetime64("2016-01-01T06"), instant):
        assert axis.bounds(value) == (instant, instant)
    assert axis.bounds(dt.date(2016, 1, 1)) == (np.datetime64("2016-01-01", "ns"),) * 2


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("2015-13", ValueError, "not a valid date"),
        ("2015-02-30", ValueError, "not a valid date"),
        ("yesterday", ValueError, "ISO 8601"),
        ("2015-12-31T00:00Z", ValueError, "time zones"),
        ("3000-01-01", ValueError, "datetime64"),
        (np.datetime64("NaT", "ns"), ValueError, "NaT"),
        (dt.datetime(2016, 1, 1, tzinfo=dt.UTC), ValueError, "time zone"),
        (2016, TypeError, "not a date"),
    ],
)
def test_what_is_no_date_is_refused_by_name(value, error, match) -> None:
    with pytest.raises(error, match=match):
        TimeAxis().bounds(value)


def test_cftime_axis_reads_dates_of_its_calendar() -> None:
    cftime = pytest.importorskip("cftime")
    values = np.array([cftime.Datetime360Day(2000, 2, d) for d in (28, 29, 30)], dtype=object)
    axis = TimeAxis.of(values)
    assert axis is not None and axis.calendar == "360_day"
    lo, hi = axis.bounds("2000-02-30")  # a day only this calendar has
    assert lo == cftime.Datetime360Day(2000, 2, 30) and hi == cftime.Datetime360Day(2000, 2, 30, 23, 59, 59, 999999)
    assert axis.bounds("2000-02")[1] == cftime.Datetime360Day(2000, 2, 30, 23, 59, 59, 999999)
    assert axis.instant(np.datetime64("2000-02-28")) == values[0]
    assert axis.format(values[2]) == "2000-02-30"


# -- what the writer stores --------------------------------------------------------------
@pytest.mark.parametrize(
    "times",
    [
        six_hourly("1979-01-01", 10),
        np.datetime64("2020-01-01", "ns") + np.array([0, 1, 3]) * np.timedelta64(1, "D"),
        np.datetime64("2020-01-01T00:00:30", "ns") + np.arange(4) * np.timedelta64(90, "s"),
        np.array(["2020-01-01T00:00:00.5"], dtype="datetime64[ns]"),
    ],
    ids=["6-hourly", "daily-gaps", "90s", "one-fractional"],
)
def test_encoding_matches_xarray_and_decodes_back(tmp_path, times) -> None:
    encoded, attrs = encode_time_coordinate(times)
    path = tmp_path / "oracle.zarr"
    xr.Dataset(coords={"time": times}).to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    stored = zarr.open_array(path, path="time", mode="r")
    assert attrs == {k: stored.attrs[k] for k in ("units", "calendar")}
    np.testing.assert_array_equal(encoded, stored[:])
    np.testing.assert_array_equal(decode_time_coordinate(encoded, attrs), times)


def test_encoding_refuses_what_is_no_full_date_axis() -> None:
    with pytest.raises(ValueError, match="NaT"):
        encode_time_coordinate(np.array(["2020-01-01", "NaT"], dtype="datetime64[ns]"))
    with pytest.raises(ValueError, match="dates"):
        encode_time_coordinate(np.arange(3))


def test_cftime_dates_encode_in_their_calendar() -> None:
    pytest.importorskip("cftime")
    times = xr.date_range("2000-02-27", periods=5, freq="12h", calendar="360_day", use_cftime=True).values
    encoded, attrs = encode_time_coordinate(times)
    assert attrs == {"units": "hours since 2000-02-27 00:00:00.000000", "calendar": "360_day"}
    assert list(decode_time_coordinate(encoded, attrs)) == list(times)


def test_a_dataset_over_an_undecodable_calendar_still_trains(tmp_path, monkeypatch, caplog) -> None:
    """Without cftime a noleap store still opens and iterates; batch coords fall back to sample indices."""
    from insitubatch import InSituDataset, split_by_chunk

    times = xr.date_range("2000-01-01", periods=14, freq="6h", calendar="noleap", use_cftime=True)
    path = write_dated(tmp_path / "n.zarr", times)
    monkeypatch.setitem(sys.modules, "cftime", None)
    g = open_geometries(LocalStore(path, read_only=True))["t2m"]
    with caplog.at_level("WARNING", logger="insitubatch"):
        with InSituDataset(str(path), split_by_chunk(g, fractions=(1.0,)), {"x": g}, batch_size=4) as ds:
            batches = list(ds.train)
    assert sum(len(b) for b in batches) == 14
    assert all(set(b.coords) == {"sample"} for b in batches)
    assert sum("batch coords carry sample indices" in r.message for r in caplog.records) == 1
