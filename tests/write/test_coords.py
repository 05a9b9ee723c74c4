"""Writes by coordinate: the layout stores its coordinates as xarray reads them; ``write(at=...)`` maps values to indices.

The oracle is ``xarray.open_zarr`` of the output group: its ``valid_time``
decodes to the spec's dates and every stored step holds the forecast for
that valid time.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from dated_writes import ALIGNMENT, EXTENT, GROUP, TIMES, X, dated_spec, forecast, write_by_time
from write_helpers import ManualClock, store_bytes
from zarr.storage import LocalStore

from insitubatch.errors import LayoutMismatchError, WriteIntentRangeError
from insitubatch.tools.cli import main
from insitubatch.write import (
    LayoutSpec,
    OutputArray,
    SlotPlan,
    SlotWriter,
    clear_stale_claims,
    create_layout,
    diff_layout,
    plan_slots,
    read_layout,
    run_plan,
    write_status,
)

# A writer that "dies" mid-slot: no heartbeat during the test, stale once its clock lags this far.
QUIET_HEARTBEAT_S = 600.0
STALE_AFTER_S = 1200.0


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out.zarr"
    create_layout(LocalStore(path), dated_spec(), group=GROUP)
    return path


def _xr(path: Path) -> xr.Dataset:
    return xr.open_zarr(path, group=GROUP, consolidated=False)


def _nan(path: Path) -> bool:
    return bool(np.isnan(zarr.open_array(LocalStore(path), path=f"{GROUP}/pred", mode="r")[:]).all())


def test_the_layout_stores_its_coordinates_as_xarray_reads_them(out: Path) -> None:
    ds = _xr(out)
    np.testing.assert_array_equal(ds["valid_time"].values, TIMES)
    np.testing.assert_array_equal(ds["x"].values, X)
    assert ds["pred"].dims == ("valid_time", "channel", "x")
    stored = zarr.open_array(LocalStore(out), path=f"{GROUP}/valid_time", mode="r")
    assert dict(stored.attrs) == {"units": "hours since 2020-01-01 00:00:00", "calendar": "proleptic_gregorian"}
    assert stored.dtype == np.int64
    layout = read_layout(LocalStore(out), GROUP)
    assert layout.coord is not None and layout.coord.name == "valid_time"
    np.testing.assert_array_equal(layout.coord.values, TIMES)


def test_a_cftime_index_coordinate_keeps_its_calendar(tmp_path: Path) -> None:
    pytest.importorskip("cftime")
    times = xr.date_range("2000-02-25", periods=EXTENT, freq="6h", calendar="360_day", use_cftime=True).values
    path = tmp_path / "o.zarr"
    create_layout(LocalStore(path), dated_spec(times), group=GROUP)
    assert list(_xr(path)["valid_time"].values) == list(times)
    with SlotWriter(LocalStore(path), ALIGNMENT, 2 * ALIGNMENT, group=GROUP) as w:
        w.write("count", at=["2000-02-29T18", "2000-02-30T00"], data=np.array([5, 6], "i4"))  # Feb 30 exists here
    assert _xr(path)["count"].sel(valid_time=times[19:21]).values.tolist() == [5, 6]


def test_writes_by_valid_time_land_where_xarray_finds_them(out: Path) -> None:
    store = LocalStore(out)
    for r in plan_slots(store, group=GROUP).ranges:
        with SlotWriter(store, r.start, r.stop, group=GROUP) as writer:
            write_by_time(writer)
    ds = _xr(out)
    want = forecast(TIMES)
    np.testing.assert_array_equal(ds["pred"].values, want["pred"])
    np.testing.assert_array_equal(ds["count"].sel(valid_time="2020-01-03T06").values, forecast(TIMES[9:10])["count"][0])
    assert write_status(store, GROUP).remaining == ()


def test_writing_at_values_equals_writing_at_their_indices(tmp_path: Path) -> None:
    by_time, by_index = LocalStore(tmp_path / "a.zarr"), LocalStore(tmp_path / "b.zarr")
    for store in (by_time, by_index):
        create_layout(store, dated_spec(), group=GROUP)
    with SlotWriter(by_time, 12, 24, group=GROUP) as w:
        w.write("pred", at=TIMES[13:20], data=forecast(TIMES[13:20])["pred"])
    with SlotWriter(by_index, 12, 24, group=GROUP) as w:
        w.write("pred", (13, 20), forecast(TIMES[13:20])["pred"])
    keep = f"{GROUP}/pred/"
    assert {k: v for k, v in store_bytes(by_time).items() if k.startswith(keep)} == {
        k: v for k, v in store_bytes(by_index).items() if k.startswith(keep)
    }


@pytest.mark.parametrize(
    "at",
    [
        ["2020-01-04T06", "2020-01-04T12"],
        np.array(["2020-01-04T06", "2020-01-04T12"], dtype="datetime64[h]"),
        (dt.datetime(2020, 1, 4, 6), dt.datetime(2020, 1, 4, 12)),
        TIMES[13:15],
    ],
    ids=["strings", "datetime64[h]", "datetimes", "the coordinate's own values"],
)
def test_at_takes_any_date_like(out: Path, at) -> None:
    with SlotWriter(LocalStore(out), 12, 24, group=GROUP) as w:
        w.write("count", at=at, data=np.array([7, 8], "i4"))
        w.write("count", np.array([9], "i4"), at="2020-01-04T18")  # one value; the data second
    assert _xr(out)["count"].values[13:16].tolist() == [7, 8, 9]


@pytest.mark.parametrize(
    ("at", "match"),
    [
        (
            ["2020-01-06T18", "2020-01-07T00"],
            r"'2020-01-07T00' \(valid_time index 24\) is outside this writer's slot \[12, 24\), whose valid_time "
            r"runs 2020-01-04 .. 2020-01-06T18:00",
        ),
        (["2020-01-02T00"], r"'2020-01-02T00' \(valid_time index 4\) is outside"),
        (
            ["2020-01-04T07"],
            r"'2020-01-04T07' is not in coordinate 'valid_time' \(\[0, 44\) \(valid_time 2020-01-01 "
            r".. 2020-01-11T18:00\)\)",
        ),
        ([np.datetime64("2031-01-01")], r"'2031-01-01' is not in coordinate"),
        (["2020-01-04T06", "2020-01-04T18"], "consecutive"),
        (["2020-01-04T12", "2020-01-04T06"], "consecutive"),
        (["soon"], "ISO 8601"),
        ([3.0], "not a date"),
    ],
)
def test_bad_at_values_raise_before_anything_is_written(out: Path, at, match) -> None:
    writer = SlotWriter(LocalStore(out), 12, 24, group=GROUP).open()
    try:
        with pytest.raises(WriteIntentRangeError, match=match):
            writer.write("pred", at=at, data=np.zeros((len(at), 3, 8), "f4"))
    finally:
        writer.close()
    assert _nan(out)


def test_at_and_index_range_are_one_or_the_other(out: Path) -> None:
    with SlotWriter(LocalStore(out), 0, 12, group=GROUP) as w:
        with pytest.raises(TypeError, match="exactly one"):
            w.write("count", (0, 1), np.zeros(1, "i4"), at=TIMES[:1])
        with pytest.raises(TypeError, match="exactly one"):
            w.write("count", data=np.zeros(1, "i4"))
        with pytest.raises(TypeError, match="data is required"):
            w.write("count", at=TIMES[:1])
        w.write("count", at=[], data=np.zeros(0, "i4"))  # nothing to write is no error


def test_at_needs_a_layout_with_an_index_coordinate(tmp_path: Path) -> None:
    spec = dated_spec()
    plain = LayoutSpec(spec.arrays)
    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, plain, group=GROUP)
    assert read_layout(store, GROUP).coord is None
    with SlotWriter(store, 0, 12, group=GROUP) as w:
        assert w.slot_coord is None
        with pytest.raises(WriteIntentRangeError, match=r"coords=\{dim: values\}"):
            w.write("count", at=TIMES[:1], data=np.zeros(1, "i4"))


def test_a_numeric_index_coordinate_is_matched_exactly(tmp_path: Path) -> None:
    lead = np.arange(EXTENT) * 0.5  # lead time in days
    spec = LayoutSpec((OutputArray("skill", (EXTENT,), (4,), "float64", dimension_names=("lead",)),), {"lead": lead})
    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, spec, group=GROUP)
    with SlotWriter(store, 0, 12, group=GROUP) as w:
        w.write("skill", at=[1.0, 1.5, 2], data=np.array([0.9, 0.8, 0.7]))
        with pytest.raises(WriteIntentRangeError, match="1.25 is not in coordinate 'lead'"):
            w.write("skill", at=[1.25], data=np.zeros(1))
        with pytest.raises(WriteIntentRangeError, match="not a number"):
            w.write("skill", at=["2020-01-01"], data=np.zeros(1))
    ds = xr.open_zarr(tmp_path / "o.zarr", group=GROUP, consolidated=False)
    assert ds["skill"].sel(lead=[1.0, 1.5, 2.0]).values.tolist() == [0.9, 0.8, 0.7]


# -- plans, status, resume -----------------------------------------------------------------
def test_plans_and_status_show_slots_by_valid_time(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(out)
    plan = plan_slots(store, group=GROUP, workers=2)
    assert [(r.start, r.stop, r.first, r.last) for r in plan.ranges] == [
        (0, 24, "2020-01-01", "2020-01-06T18:00"),
        (24, 44, "2020-01-07", "2020-01-11T18:00"),
    ]
    doc = json.loads(plan.to_json())
    assert doc["ranges"][1]["first"] == "2020-01-07" and doc["ranges"][1]["last"] == "2020-01-11T18:00"
    back = SlotPlan.from_json(plan.to_json())
    assert [(r.first, r.last) for r in back.ranges] == [(r.first, r.last) for r in plan.ranges]

    with SlotWriter(store, 0, 24, group=GROUP) as w:
        write_by_time(w)
    status = write_status(store, GROUP)
    assert status.describe(24, 44) == "[24, 44) (valid_time 2020-01-07 .. 2020-01-11T18:00)"
    info = status.to_dict()
    assert info["index_coord"] == "valid_time"
    assert info["completed_coords"] == [["2020-01-01", "2020-01-06T18:00"]]
    assert info["remaining_coords"] == [["2020-01-07", "2020-01-11T18:00"]]
    assert info["coverage"][0]["first"] == "2020-01-01"
    assert main(["write-status", str(out), "--group", GROUP]) == 0
    text = capsys.readouterr().out
    assert "completed: [0, 24) (valid_time 2020-01-01 .. 2020-01-06T18:00)" in text
    assert "remaining: [24, 44) (valid_time 2020-01-07 .. 2020-01-11T18:00)" in text


def test_resume_by_valid_time_after_a_killed_writer(out: Path) -> None:
    store = LocalStore(out)
    plan = plan_slots(store, group=GROUP)
    victim = plan.ranges[1]
    for r in plan.ranges:
        if r != victim:
            with SlotWriter(store, r.start, r.stop, group=GROUP) as w:
                write_by_time(w)
    # the victim writes its first steps by valid time, then its process dies: no coverage, a claim left behind
    lagging = ManualClock(time.time() - 2 * STALE_AFTER_S)
    dead = SlotWriter(store, victim.start, victim.stop, group=GROUP, heartbeat_s=QUIET_HEARTBEAT_S,
                      stale_after_s=STALE_AFTER_S, clock=lagging)  # fmt: skip
    dead.open()
    dead.write("pred", at=dead.slot_coord[:3], data=forecast(dead.slot_coord[:3])["pred"])
    dead._claim._stop_heartbeat()

    resumed = plan_slots(store, group=GROUP, resume=True)
    assert (
        [(r.first, r.last) for r in resumed.ranges]
        == [(victim.first, victim.last)]
        == [("2020-01-04", "2020-01-06T18:00")]
    )
    assert [(r.first, r.last) for r in resumed.stale] == [(victim.first, victim.last)]
    assert clear_stale_claims(store, GROUP)
    with SlotWriter(store, victim.start, victim.stop, group=GROUP) as w:
        write_by_time(w)
    assert plan_slots(store, group=GROUP).ranges == ()
    np.testing.assert_array_equal(_xr(out)["pred"].values, forecast(TIMES)["pred"])


def test_the_layout_coordinate_is_fixed_for_the_run(out: Path) -> None:
    store = LocalStore(out)
    before = store_bytes(store)
    create_layout(store, dated_spec(), group=GROUP)  # the same spec: nothing is written
    assert store_bytes(store) == before
    shifted = dated_spec(TIMES + np.timedelta64(1, "D"))
    assert diff_layout(store, shifted, group=GROUP) == (
        "valid_time: coordinate values are [0, 44) (valid_time 2020-01-01 .. 2020-01-11T18:00) in the store but "
        "[0, 44) (valid_time 2020-01-02 .. 2020-01-12T18:00) in the spec",
    )
    with pytest.raises(LayoutMismatchError, match="valid_time: coordinate values"):
        create_layout(store, shifted, group=GROUP)
    with pytest.raises(LayoutMismatchError, match="index_coord is 'valid_time' in the store but None"):
        create_layout(store, LayoutSpec(dated_spec().arrays, {"x": X}), group=GROUP)


@pytest.mark.parametrize(
    ("coords", "match"),
    [
        ({"lat": np.arange(3)}, "no array has a dimension 'lat'"),
        ({"valid_time": TIMES[:-1]}, "43 values but dimension 'valid_time' has length"),
        ({"valid_time": np.repeat(TIMES[:22], 2)}, "repeats a value"),
        ({"valid_time": TIMES.reshape(4, 11)}, "1-D"),
        ({"valid_time": np.array([object()] * EXTENT)}, "dates or numbers"),
        ({"count": np.arange(EXTENT)}, "name of an array"),
    ],
)
def test_bad_coordinates_are_refused_by_the_spec(coords, match) -> None:
    with pytest.raises(ValueError, match=match):
        LayoutSpec(dated_spec().arrays, coords)


@pytest.mark.slow
def test_processes_write_by_valid_time(out: Path) -> None:
    store = LocalStore(out)
    plan = plan_slots(store, group=GROUP, workers=2)
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        report = run_plan(store, plan, write_by_time, pool)
    assert report.ok and len({o.pid for o in report.outcomes}) >= 1
    ds = _xr(out)
    np.testing.assert_array_equal(ds["valid_time"].values, TIMES)
    np.testing.assert_array_equal(ds["pred"].values, forecast(TIMES)["pred"])
    np.testing.assert_array_equal(ds["count"].values, forecast(TIMES)["count"])
