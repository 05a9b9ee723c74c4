"""``insitubatch inspect``: variables, chunk and tile sizes, working set and read concurrency."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries, open_statics
from insitubatch.plan.cost import format_summary
from insitubatch.plan.epoch import plan_epoch
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.testing.data import DatasetSpec, write_era5_like
from insitubatch.testing.emulator import Emulator
from insitubatch.tools.inspect_store import add_inspect_parser, inspect_store, run_inspect
from insitubatch.tools.selection_args import parse_selection

SPEC = DatasetSpec(
    n_time=64,
    n_lat=8,
    n_lon=16,
    variables=("2m_temperature", "10m_u_component_of_wind"),
    samples_per_chunk=4,
    inner_tiles=(1, 2),
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect")
    return write_era5_like(root / SPEC.name, SPEC)


def _value(text: str, label: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(label))
    return line[len(label) :].strip()


def test_lists_variables_with_chunk_and_tile_sizes(dataset: Path) -> None:
    text = inspect_store(str(dataset), batch_size=8, block_chunks=2, max_inflight=4)
    for name in SPEC.variables:
        row = next(ln for ln in text.splitlines() if ln.startswith(name))
        # shape, stored chunk, 2 tiles, 4 samples per chunk, chunk 4*8*16*4 B, tile half of it
        assert "(64, 8, 16)" in row and "float32" in row
        assert re.search(r"\(4, 8, 8\)\s+2\s+4\s+0\.002\s+0\.001\s", row), row
    assert "lat" not in {ln.split()[0] for ln in text.splitlines() if ln.strip()}  # coordinates skipped


def test_working_set_and_concurrency_follow_the_knobs(dataset: Path) -> None:
    store = obstore_store(dataset, read_only=True)
    geoms = open_geometries(store)
    plan = plan_epoch(
        split_by_chunk(next(iter(geoms.values()))),
        "train",
        geoms,
        batch_size=8,
        block_chunks=2,
        shuffle=True,
        seed=0,
        epoch=0,
    )
    text = inspect_store(store, batch_size=8, block_chunks=2, max_inflight=4, prefetch_depth=3)
    assert "batch_size=8, block_chunks=2, max_inflight=4, prefetch_depth=3" in text
    working = float(re.match(r"([\d.]+) MB", _value(text, "working")).group(1))
    assert working == pytest.approx(plan.working_set_bytes / 1e6, abs=1e-3)
    gets = int(re.search(r"= (\d+) GETs per epoch", text).group(1))
    assert gets == len(plan.reads) * 2  # two tiles per chunk read
    assert _value(text, "in flight").startswith("4 tiles at once")
    assert f"{plan.n_samples} samples, {plan.n_batches} batches" in text
    assert "chunks are split into 2 tiles" in text


def test_concurrent_iterations_bound_is_the_automatic_budget_and_its_growth_is_logged(
    dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = obstore_store(dataset, read_only=True)
    geoms = open_geometries(store)
    knobs = {"batch_size": 8, "block_chunks": 2, "max_inflight": 4, "prefetch_depth": 2}
    text = inspect_store(store, iterations=2, **knobs)
    printed = float(re.search(r"pool budget 2 × working = ([\d.]+) MB", text).group(1))
    with InSituDataset(store, split_by_chunk(next(iter(geoms.values()))), **knobs, seed=0) as ds:
        with caplog.at_level(logging.WARNING, logger="insitubatch"):
            with ds.train.iterate() as a, ds.train.iterate() as b:
                budget = ds.pool.budget
                next(a), next(b)
        assert budget == 2 * ds.train.plan().working_set_bytes
        assert budget / 1e6 == pytest.approx(printed, abs=1e-3)
        grew = [r.getMessage() for r in caplog.records if "automatic pool budget grows" in r.getMessage()]
        assert len(grew) == 1 and f"to {budget} bytes" in grew[0] and "--iterations 2" in grew[0]
    with pytest.raises(ValueError, match="iterations=0"):
        inspect_store(store, iterations=0, probe=False)


def test_defaults_come_from_the_dataset(dataset: Path) -> None:
    import inspect as pyinspect

    from insitubatch.dataset import InSituDataset

    params = pyinspect.signature(InSituDataset).parameters
    text = inspect_store(str(dataset), probe=False)
    assert f"max_inflight={params['max_inflight'].default}" in text
    assert f"batch_size={params['batch_size'].default}" in text


def test_probes_stored_size_over_http(dataset: Path) -> None:
    with Emulator(dataset.parent, latency_s=0.0) as emu:
        text = inspect_store(emu.url_for(dataset.name), batch_size=4, block_chunks=2)
        heads = emu.stats().heads
    row = next(ln for ln in text.splitlines() if ln.startswith("2m_temperature"))
    assert row.split()[-1] != "-" and float(row.split()[-1]) > 0
    assert heads == len(SPEC.variables)
    assert "on the wire" in text


def test_bad_knob_and_unknown_variable_raise(dataset: Path) -> None:
    with pytest.raises(ValueError, match="max_inflight"):
        inspect_store(str(dataset), max_inflight=-1)
    with pytest.raises(ValueError, match="nope"):
        inspect_store(str(dataset), variables=["nope"])


def test_cli_subcommand(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="insitubatch")
    add_inspect_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inspect", str(dataset), "--batch-size", "8", "--max-inflight", "2", "--no-probe"])
    assert args.run is run_inspect
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"store      {dataset}")
    assert "max_inflight=2" in out and "10m_u_component_of_wind" in out


LEVELS = np.array([50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000])


@pytest.fixture(scope="module")
def levels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """13 levels stored one per chunk, 2 x 2 tiles per level, a land-sea mask and their coordinates."""
    path = tmp_path_factory.mktemp("levels") / "lv.zarr"
    root = zarr.open_group(path, mode="w")
    for name, values in (
        ("level", LEVELS),
        ("latitude", np.linspace(90, -90, 16)),
        ("longitude", np.arange(0, 360, 22.5)),
        ("time", np.arange(40, dtype="i8")),
    ):
        root.create_array(name, data=values, dimension_names=(name,))
    t = root.create_array("t", shape=(40, 13, 16, 16), chunks=(4, 1, 8, 8), dtype="f4", dimension_names=LEVEL_DIMS)
    t[...] = np.random.default_rng(0).standard_normal(t.shape).astype("f4")
    lsm = root.create_array("lsm", shape=(16, 16), dtype="f4", dimension_names=("latitude", "longitude"))
    lsm[...] = 0.5
    return path


LEVEL_DIMS = ("time", "level", "latitude", "longitude")


def test_a_selection_is_described_as_the_dataset_would_read_it(levels: Path) -> None:
    sel = {"level": [500, 850], "latitude": slice(60, 0)}
    text = inspect_store(str(levels), batch_size=8, max_inflight=4, sel=sel)
    store = obstore_store(levels, read_only=True)
    g = open_geometries(store, variables=["t"])["t"]
    lsm = open_statics(store, variables=["lsm"])["lsm"]
    manifest = split_by_chunk(g)
    with InSituDataset(
        store,
        manifest,
        {"t": g.sel(sel)},
        statics={"lsm": lsm.sel(latitude=slice(60, 0))},
        batch_size=8,
        max_inflight=4,
    ) as ds:
        expected = format_summary(ds.describe())
    for label in ("reads", "working", "static"):
        assert _value(text, label) == _value(expected, label), label
    assert re.search(r"t\[level=.*latitude=.*\]: 4 of 52 tiles per chunk", text), text
    whole = inspect_store(str(levels), batch_size=8, max_inflight=4)
    gets = int(_value(text, "reads").split("= ")[1].split()[0])
    assert gets * 13 == int(_value(whole, "reads").split("= ")[1].split()[0])  # 4 of 52 tiles: 1/13 of the GETs
    assert "latitude=3:8 (5, 16)" in _value(text, "static") and "lsm (16, 16)" in _value(whole, "static")
    left = [ln for ln in whole.splitlines() if ln.startswith("left out")]
    assert sorted(ln.split()[2].rstrip(":") for ln in left) == ["latitude", "level", "longitude", "time"]


def test_cli_selections_match_the_api(levels: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="insitubatch")
    add_inspect_parser(parser.add_subparsers(dest="command"))
    argv = ["inspect", str(levels), "--batch-size", "8", "--no-probe", "--sel", "level=500,850"]
    args = parser.parse_args([*argv, "--isel", "longitude=::-1", "--sel", "latitude=60:0"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    api = inspect_store(
        str(levels),
        batch_size=8,
        probe=False,
        sel={"level": [500, 850], "latitude": slice(60, 0)},
        isel={"longitude": slice(None, None, -1)},
    )
    assert out.strip() == api.strip()
    assert parse_selection(["time=2020-01-01:", "level=0.5", "x=a,b"], "--sel") == {
        "time": slice("2020-01-01", None),
        "level": 0.5,
        "x": ["a", "b"],
    }
    with pytest.raises(argparse.ArgumentTypeError, match="DIM=VALUE"):
        parse_selection(["level"], "--sel")
    with pytest.raises(ValueError, match=r"no array has dimension\(s\) \['plev'\].*'level'"):
        inspect_store(str(levels), sel={"plev": 500})


def _sharded_store(root: Path) -> Path:
    """A sharded v3 array (shards of 4 x 2 x 2 inner chunks) beside a plain one, written by zarr-python."""
    group = zarr.open_group(root / "sh.zarr", mode="w", zarr_format=3)
    rng = np.random.default_rng(5)
    for name, shards in (("s", (16, 16, 20)), ("p", None)):
        group.create_array(
            name, shape=(96, 16, 20), chunks=(4, 8, 10), shards=shards, dtype="f4", dimension_names=("time", "y", "x")
        )[...] = rng.random((96, 16, 20), dtype="f4")
    return root / "sh.zarr"


@pytest.mark.parametrize("where", ["local", "emulator"])
@pytest.mark.parametrize("arrays", [["s"], ["s", "p"]])
def test_inspect_counts_a_sharded_arrays_gets_as_describe_and_the_server_do(tmp_path, where, arrays) -> None:
    """One GET per shard index and per run of adjacent inner chunks, not one per tile: describe()'s cost path."""
    path = _sharded_store(tmp_path)
    knobs = {"batch_size": 8, "block_chunks": 2, "max_inflight": 4}
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        url = str(path) if where == "local" else emu.url_for("sh.zarr")
        text = inspect_store(url, variables=arrays, probe=False, **knobs)
        store = obstore_store(url, read_only=True)
        geoms = open_geometries(store, variables=arrays)
        tiles = len(split_by_chunk(geoms["s"]).chunks("train")) * geoms["s"].tiles_read
        emu.reset_stats()
        with InSituDataset(store, split_by_chunk(geoms["s"]), geoms, **knobs) as ds:
            info = ds.describe()
            opened = emu.stats().gets_where(lambda k: "/c/" in k)
            for _ in ds.train:
                pass
            sent = ds.train.last_pass.gets
        served = emu.stats().gets_where(lambda k: "/c/" in k) - opened
    gets = int(re.search(r"= (\d+) GETs per epoch", text).group(1))
    assert gets == info["splits"]["train"]["gets"] == sent
    if where == "emulator":
        assert served == gets and opened == info["open"]["gets"] > 0
        assert f"open       {opened} GETs ({info['open']['bytes']} bytes) as it opens" in text
        if arrays == ["s"]:  # runs of inner chunks: fewer GETs than tiles, however many indexes
            assert gets < tiles
    else:
        assert info["open"]["gets"] == 0 and "open  " not in text
        assert gets == tiles + info["splits"]["train"]["index_gets"] + (tiles if "p" in arrays else 0)
