"""Offsets in time (``shift("6h")``, ``window(["-6h", "0h"])``) against xarray's ``.sel(time=t + 6h)``.

Stores are written by xarray (CF-encoded time) or by zarr (native
``datetime64``), then steps are cut out of the time axis. Over a whole epoch
of every split (and every rank), each drawn anchor's values equal what
xarray selects at its times, and the anchors drawn are exactly those whose
every wanted time xarray holds. On a regular axis a duration is its step
count: the same geometry, plan and reads.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr
from dated_stores import open_xr
from zarr.storage import LocalStore

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk, split_by_time
from insitubatch.errors import IrregularTimeWarning, TimeAxisError
from insitubatch.testing.data import DATED_LAT, DATED_LON, dated_field, six_hourly, write_dated

HOUR = np.timedelta64(1, "h")
STEPS = 80
CUT = [5, 17, 18, 33, 40, 41, 42, 66]  # single steps and a run of three: gaps of 12 and 24 hours


def _cut(times: np.ndarray, cut=CUT) -> np.ndarray:
    keep = np.ones(len(times), dtype=bool)
    keep[cut] = False
    return times[keep]


def _write_native(path, times: np.ndarray, chunk: int):
    """``t2m(time, lat, lon)`` with a native ``datetime64[ns]`` time coordinate, written by zarr."""
    root = zarr.open_group(path, mode="w", zarr_format=3)
    t = root.create_array("time", shape=(len(times),), dtype="datetime64[ns]", dimension_names=("time",))
    t[:] = times
    a = root.create_array(
        "t2m",
        shape=(len(times), DATED_LAT, DATED_LON),
        chunks=(chunk, DATED_LAT, DATED_LON),
        dtype="f4",
        dimension_names=("time", "lat", "lon"),
    )
    a[:] = dated_field(len(times))
    return path


@pytest.fixture(params=["cf", "native"])
def gapped(tmp_path, request):
    times = _cut(six_hourly("2000-01-01", STEPS))
    if request.param == "cf":
        return write_dated(tmp_path / "gapped.zarr", times, chunk=7)
    return _write_native(tmp_path / "gapped.zarr", times, chunk=7)


def _geometry(path):
    return open_geometries(LocalStore(path, read_only=True))["t2m"]


def _servable(times: np.ndarray, offsets: list[np.timedelta64]) -> set[np.datetime64]:
    """The anchors xarray can serve: every time ``t + offset`` is on the axis."""
    held = set(times.tolist())
    return {t for t in times.tolist() if all((np.datetime64(t, "ns") + o).astype(int) in held for o in offsets)}


def _draw_everything(path, variables, oracle_offsets, *, world_size=1, batch_size=5, by_date=False):
    """Every anchor drawn by every rank over every split, each row checked against xarray."""
    xd = open_xr(path)
    drawn: list[int] = []
    for rank in range(world_size):
        g = _geometry(path)
        if by_date:  # every sample in the split its own date falls in, as xarray's .sel(time=slice(...)) selects
            ranges = {"train": (None, "2000-01-12"), "val": ("2000-01-13", "2000-01-16"), "test": ("2000-01-17", None)}
            manifest = split_by_time(g, ranges, edges="exact")
        else:
            manifest = split_by_chunk(g, fractions=(0.6, 0.2, 0.2))
        with InSituDataset(
            LocalStore(path, read_only=True),
            manifest,
            variables(g),
            batch_size=batch_size,
            block_chunks=2,
            rank=rank,
            world_size=world_size,
        ) as ds:
            for split in manifest.names:
                for batch in ds.split(split):
                    for i, t in enumerate(batch.coords["time"]):
                        for label, offsets in oracle_offsets.items():
                            want = xd["t2m"].sel(time=[t + o for o in offsets]).values
                            got = batch.arrays[label][i]
                            assert np.array_equal(got.reshape(want.shape), want), (split, label, t)
                            assert np.array_equal(
                                np.asarray(batch.coords[f"{label}.time"][i]).reshape(-1), [t + o for o in offsets]
                            )
                        drawn.append(int(np.datetime64(t, "ns").astype(np.int64)))
    return drawn


@pytest.mark.parametrize("by_date", [False, True], ids=["by-chunk", "by-date"])
def test_shift_and_window_in_hours_pair_what_xarray_selects(gapped, by_date) -> None:
    offsets = {"inputs": [-6 * HOUR, 0 * HOUR], "target": [6 * HOUR]}
    drawn = _draw_everything(
        gapped, lambda g: {"inputs": g.window(["-6h", "0h"]), "target": g.shift("6h")}, offsets, by_date=by_date
    )
    times = open_xr(gapped)["time"].values
    assert len(drawn) == len(set(drawn))  # each anchor once
    assert set(drawn) == _servable(times, [-6 * HOUR, 0 * HOUR, 6 * HOUR])


def test_offsets_of_several_steps_find_the_time_across_a_gap(tmp_path) -> None:
    """Hourly (HRRR-like): +6h is 6 stored steps ahead, or fewer where a step is cut, and xarray agrees."""
    times = _cut(np.datetime64("2021-07-01T00", "ns") + np.arange(120) * HOUR, [7, 8, 30, 61, 62, 63, 90])
    path = write_dated(tmp_path / "hourly.zarr", times, chunk=6)
    variables = lambda g: {"x": g.window(["-3h", "0h"]), "y": g.shift(np.timedelta64(6, "h"))}  # noqa: E731
    drawn = _draw_everything(path, variables, {"x": [-3 * HOUR, 0 * HOUR], "y": [6 * HOUR]})
    assert set(drawn) == _servable(times, [-3 * HOUR, 0 * HOUR, 6 * HOUR])
    assert len(drawn) == len(set(drawn))


def test_every_rank_draws_its_share_and_together_exactly_the_servable_anchors(gapped) -> None:
    offsets = {"target": [12 * HOUR]}
    drawn = _draw_everything(gapped, lambda g: {"target": g.shift("12h")}, offsets, world_size=2)
    times = open_xr(gapped)["time"].values
    assert set(drawn) == _servable(times, [0 * HOUR, 12 * HOUR])


def test_a_regular_axis_resolves_durations_to_the_very_same_steps(tmp_path) -> None:
    path = write_dated(tmp_path / "regular.zarr", six_hourly("2000-01-01", 60), chunk=7)
    g = _geometry(path)
    assert g.shift("6h") == g.shift(1) and g.shift("6h").time_rows is None
    assert g.window(["-12h", "0h"]) == g.window([-2, 0])
    assert g.window(["-6h", "0h"]).shift("12h") == g.window([-1, 0]).shift(2)
    manifest = split_by_chunk(g, fractions=(0.8, 0.2))
    plans = []
    for variables in (
        {"x": g.window(["-6h", "0h"]), "y": g.shift("6h")},
        {"x": g.window([-1, 0]), "y": g.shift(1)},
    ):
        with InSituDataset(LocalStore(path, read_only=True), manifest, variables, batch_size=4) as ds:
            plans.append(ds.plan("train"))
            assert "lost" not in ds.describe()["splits"]["train"]
    time_form, step_form = plans
    assert np.array_equal(time_form.order, step_form.order)
    assert time_form.reads == step_form.reads and time_form.block_reads == step_form.block_reads


def test_inference_raises_naming_the_times_the_archive_lacks(gapped) -> None:
    g = _geometry(gapped)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(LocalStore(gapped, read_only=True), manifest, {"y": g.shift("6h")}, batch_size=4) as ds:
        # 2000-01-02T06 (index 5 of the full axis) was cut: the anchor at 00:00 that day wants it
        with pytest.raises(TimeAxisError, match=r"does not store: 2000-01-02T06:00:00"):
            ds.infer(start="2000-01-02", stop="2000-01-02T12")
        batches = list(ds.infer(start="2000-01-01", stop="2000-01-01T18"))  # no gap in reach: it runs
        assert [str(t)[:13] for b in batches for t in b.coords["y.time"]][0] == "2000-01-01T06"
        with pytest.raises(TimeAxisError, match="does not store"):
            ds.infer()


def test_describe_counts_each_split_s_lost_anchors_and_names_the_first_times(gapped) -> None:
    g = _geometry(gapped)
    manifest = split_by_chunk(g, fractions=(0.6, 0.2, 0.2))
    times = open_xr(gapped)["time"].values
    with InSituDataset(LocalStore(gapped, read_only=True), manifest, {"y": g.shift("6h")}, batch_size=4) as ds:
        info = ds.describe()
        total = 0
        for name in manifest.names:
            anchors = manifest.sample_indices(name)
            anchors = anchors[anchors < len(times) - 1]  # the last has no time after it: the edge, no loss
            wanted = times[anchors] + 6 * HOUR
            lost = int((~np.isin(wanted, times)).sum())
            assert info["splits"][name].get("lost", {"unstored": 0})["unstored"] == lost
            assert info["splits"][name]["samples"] == len(anchors) - lost
            total += lost
        train = info["splits"]["train"]["lost"]
        assert train["unstored_times"][0] == "2000-01-02T06:00:00"
        assert any("split 'train' drops anchors" in n and "2000-01-02T06:00:00" in n for n in info["notes"])
        assert total == sum(1 for k in CUT if k - 1 not in CUT)  # the step before each cut run loses its target


def test_a_step_offset_on_an_irregular_axis_warns_once_naming_the_first_gap(gapped) -> None:
    g = _geometry(gapped)
    with pytest.warns(IrregularTimeWarning, match=r"first: 2000-01-02 is followed by 2000-01-02T12:00 \(12h"):
        g.shift(1)
    with pytest.warns(IrregularTimeWarning):
        g.window([-1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.window([0])  # no offset: nothing to warn about
        g.shift(0)


def test_durations_on_an_array_without_time_raise_naming_it(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "plain.zarr", mode="w", zarr_format=3)
    root.create_array("x", shape=(20, 2), chunks=(5, 2), dtype="f4", dimension_names=("step", "c"))
    root.create_array("step", shape=(20,), dtype="f8", dimension_names=("step",))[:] = np.arange(20) * 0.5
    root.create_array("y", shape=(20, 2), chunks=(5, 2), dtype="f4")
    root.create_array("z", shape=(20, 2), chunks=(5, 2), dtype="f4", dimension_names=("when", "c"))
    gs = open_geometries(LocalStore(tmp_path / "plain.zarr"))
    with pytest.raises(TimeAxisError, match=r"coordinate 'step' of array 'x' holds no dates"):
        gs["x"].shift("6h")
    with pytest.raises(TimeAxisError, match=r"array 'y' has no dimension names"):
        gs["y"].window(["-6h", "0h"])
    with pytest.raises(TimeAxisError, match=r"array 'z' has no time coordinate along its sample axis 'when'"):
        open_geometries(LocalStore(tmp_path / "plain.zarr"), variables=["z"])["z"].shift(np.timedelta64(6, "h"))


def test_bad_durations_raise_clearly(tmp_path, gapped) -> None:
    regular = _geometry(write_dated(tmp_path / "regular.zarr", six_hourly("2000-01-01", 20), chunk=7))
    with pytest.raises(TimeAxisError, match=r"5h is no whole number of the time axis's 6h steps"):
        regular.shift("5h")
    with pytest.raises(ValueError, match=r"'6 hours' is not a duration"):
        regular.shift("6 hours")
    with pytest.raises(TypeError, match="ints, or all durations"):
        regular.window(["-6h", 0])
    g = _geometry(gapped)
    with pytest.raises(TypeError, match="offsets of the other kind"):
        g.shift("6h").shift(1)
    with pytest.warns(IrregularTimeWarning), pytest.raises(TypeError, match="offsets of the other kind"):
        g.shift(1).window(["-6h", "0h"])


def test_shifts_in_time_compose_with_windows_on_a_gapped_axis(gapped) -> None:
    g = _geometry(gapped)
    view = g.window(["-6h", "0h"]).shift("12h")
    times = open_xr(gapped)["time"].values
    rows = view.time_rows.rows
    for i, t in enumerate(times):
        for j, o in enumerate((6 * HOUR, 12 * HOUR)):
            hit = np.flatnonzero(times == t + o)
            assert rows[i, j] == (hit[0] if len(hit) else -1)


def test_a_noleap_calendar_pairs_by_its_own_dates(tmp_path) -> None:
    """cftime dates (no 29 February): +6h from 28 February 18:00 is 1 March, and xarray agrees."""
    import datetime as dt

    import xarray as xr

    stamps = np.asarray(xr.date_range("2001-02-27", periods=24, freq="6h", calendar="noleap", use_cftime=True))
    stamps = np.delete(stamps, [4, 9, 10])
    path = write_dated(tmp_path / "noleap.zarr", stamps, chunk=4)
    xd = open_xr(path)  # a noleap calendar decodes to cftime dates
    g = _geometry(path)
    manifest = split_by_chunk(g, fractions=(1.0,))
    drawn = []
    with InSituDataset(LocalStore(path, read_only=True), manifest, {"y": g.shift("6h")}, batch_size=4) as ds:
        for batch in ds.train:
            for i, t in enumerate(batch.coords["time"]):
                want = xd["t2m"].sel(time=t + dt.timedelta(hours=6)).values
                assert np.array_equal(batch.arrays["y"][i], want)
                drawn.append(t)
    held = set(stamps.tolist())
    assert set(drawn) == {t for t in stamps.tolist() if t + dt.timedelta(hours=6) in held}


def test_a_time_axis_that_does_not_increase_raises(tmp_path) -> None:
    stamps = six_hourly("2000-01-01", 12)[::-1].copy()
    g = _geometry(_write_native(tmp_path / "backwards.zarr", stamps, chunk=4))
    with pytest.raises(TimeAxisError, match=r"time coordinate 'time' of array 't2m' does not increase"):
        g.shift("6h")


def test_over_http_a_gapped_epoch_reads_each_needed_chunk_once(http_server) -> None:
    """The remote path (engine client, admission order) with offsets in time and a frequency: GETs counted
    by the loopback server are the chunks the drawn anchors and their windows need, each once."""
    times = _cut(six_hourly("2000-01-01", STEPS))
    write_dated(http_server.root / "gapped.zarr", times, chunk=2)
    store = obstore_store(f"{http_server.url}/gapped.zarr", read_only=True)
    g = open_geometries(store, variables=["t2m"])["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,), frequency="24h")
    xd = open_xr(http_server.root / "gapped.zarr")
    variables = {"x": g.window(["-6h", "0h"]), "y": g.shift("6h")}
    with InSituDataset(store, manifest, variables, batch_size=4, block_chunks=3) as ds:
        http_server.requests.clear()
        drawn = []
        for batch in ds.train:
            for i, t in enumerate(batch.coords["time"]):
                assert np.array_equal(batch.arrays["x"][i], xd["t2m"].sel(time=[t - 6 * HOUR, t]).values)
                assert np.array_equal(batch.arrays["y"][i], xd["t2m"].sel(time=t + 6 * HOUR).values)
                drawn.append(int(np.datetime64(t, "ns").astype(np.int64)))
        gets = [path for method, path, _ in http_server.requests if method == "GET" and "/t2m/c/" in path]
    day = 24 * 3600 * 10**9
    first = int(times[0].astype(np.int64))
    servable = _servable(times, [-6 * HOUR, 0 * HOUR, 6 * HOUR])
    assert len(drawn) == len(set(drawn)) and set(drawn) == {t for t in servable if (t - first) % day == 0}
    index = {int(t): k for k, t in enumerate(times.astype(np.int64))}
    needed = {(index[t] + d) // 2 for t in drawn for d in (-1, 0, 1)}
    assert sorted(int(p.split("/")[-3]) for p in gets) == sorted(needed)  # each needed chunk once, no other


def test_offsets_in_time_and_declared_times_survive_a_reshaping_chunk_transform(gapped) -> None:
    """A transform's output has no dimension names: the time axis comes from the labels' views before it."""
    from insitubatch.transforms import Coarsen

    g = _geometry(gapped)
    manifest = split_by_chunk(g, fractions=(1.0,), missing=["2000-01-04"], frequency="12h")
    times = open_xr(gapped)["time"].values
    xd = open_xr(gapped)["t2m"].coarsen(lon=2).mean()
    variables = {"y": g.shift("6h")}
    with InSituDataset(
        LocalStore(gapped, read_only=True), manifest, variables, batch_size=4, chunk_transforms=[Coarsen((1, 2))]
    ) as ds:
        drawn = []
        for batch in ds.train:
            for i, t in enumerate(batch.coords["time"]):
                np.testing.assert_allclose(batch.arrays["y"][i], xd.sel(time=t + 6 * HOUR).values, rtol=1e-6)
                drawn.append(t)
        assert ds.describe()["splits"]["train"]["lost"]["missing"] > 0
        with pytest.raises(TimeAxisError, match="declared missing: 2000-01-04T00:00:00"):
            ds.infer(start="2000-01-03T18", stop="2000-01-04")
    day = np.datetime64("2000-01-04", "ns")
    expected = [
        t
        for t in times
        if (t - times[0]) % (12 * HOUR) == np.timedelta64(0, "h")
        and t + 6 * HOUR in times
        and not (day <= t < day + 24 * HOUR or day <= t + 6 * HOUR < day + 24 * HOUR)
    ]
    assert sorted(drawn) == expected
    # no label offset in time: the missing dates and the frequency alone need the views' time axis
    with InSituDataset(
        LocalStore(gapped, read_only=True), manifest, {"now": g}, batch_size=4, chunk_transforms=[Coarsen((1, 2))]
    ) as ds:
        now = sorted(t for batch in ds.train for t in batch.coords["time"])
        assert ds.describe()["splits"]["train"]["lost"]["off_frequency"] > 0
    assert now == [
        t for t in times if (t - times[0]) % (12 * HOUR) == np.timedelta64(0, "h") and not day <= t < day + 24 * HOUR
    ]


def test_the_sample_axis_is_chosen_before_offsets_in_time(gapped) -> None:
    g = _geometry(gapped)
    assert g.with_sample_axis(0).shift("6h").time_rows is not None
    with pytest.raises(ValueError, match="choose the sample axis before giving offsets in time"):
        g.shift("6h").with_sample_axis(0)
