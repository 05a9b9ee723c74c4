"""``InSituDataset.describe()``: the cost before the first byte, the same arithmetic as ``insitubatch inspect``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, smooth_field, write_array

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.plan.cost import format_summary
from insitubatch.tools.inspect_store import inspect_store


@pytest.fixture
def zarr_path(tmp_path):
    rng = np.random.default_rng(3)
    root = zarr.open_group(tmp_path / "d.zarr", mode="w")
    write_array(root, "t2m", smooth_field(rng, (96, 8, 16)), (4, 8, 8), dims=("time", "lat", "lon"))
    write_array(root, "u10", smooth_field(rng, (96, 8, 16)), (4, 8, 16), dims=("time", "lat", "lon"))
    return tmp_path / "d.zarr"


def _dataset(store, **kw) -> InSituDataset:
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.75, 0.25))
    return InSituDataset(store, manifest, geoms, batch_size=8, block_chunks=3, max_inflight=4, **kw)


def test_describe_fetches_nothing_and_matches_a_pass(zarr_path) -> None:
    store = CountingStore(local_store(zarr_path))
    with _dataset(store) as ds:
        store.reset()
        info = ds.describe()
        assert not store.chunk_gets()  # metadata only
        json.dumps(info)
        assert set(info["splits"]) == {"train", "val"}
        assert info["knobs"] == {"batch_size": 8, "block_chunks": 3, "max_inflight": 4, "prefetch_depth": 2}
        assert info["variables"]["t2m"]["tiles"] == 2 and info["variables"]["u10"]["tiles"] == 1
        for name in ("train", "val"):
            view = ds.split(name)
            it = iter(view)
            for _ in it:
                pass
            s, want = view.last_pass, info["splits"][name]
            # a cold pass: exactly the planned GETs, samples and batches
            assert (s.gets, s.samples, s.batches) == (want["gets"], want["samples"], want["batches"])
            assert s.inflight_depth_max <= info["memory"]["inflight_tiles"]
        # residency never exceeded the planned working set of the largest split
        assert ds.pool.totals.peak_resident_bytes <= info["memory"]["working_set_bytes"]


def test_memory_plan_adds_up_and_scales_with_iterations(zarr_path) -> None:
    with _dataset(local_store(zarr_path)) as ds:
        one, two = ds.describe()["memory"], ds.describe(iterations=2)["memory"]
        with pytest.raises(ValueError, match="iterations"):
            ds.describe(iterations=0)
    for m in (one, two):
        assert m["total_bytes"] == m["working_set_bytes"] + m["inflight_bytes"] + m["queue_bytes"]
    assert two["working_set_bytes"] == 2 * one["working_set_bytes"]
    assert two["queue_bytes"] == 2 * one["queue_bytes"]
    assert two["inflight_bytes"] == one["inflight_bytes"]  # one max_inflight across every pass
    assert one["budget"] == "auto"


def test_explicit_budget_and_fat_tiles_are_noted(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "fat.zarr", mode="w")
    # 4 samples of 8 MiB per stored chunk: every GET decodes into a 32 MiB tile
    write_array(root, "x", np.zeros((8, 1024, 2048), "f4"), (4, 1024, 2048))
    store = local_store(tmp_path / "fat.zarr")
    geoms = open_geometries(store)
    with InSituDataset(
        store, split_by_chunk(geoms["x"], fractions=(1.0,)), geoms, batch_size=2, cache_budget_bytes=1 << 30
    ) as ds:
        info = ds.describe(iterations=100)
    assert info["memory"]["budget"] == "explicit" and info["memory"]["budget_bytes"] == 1 << 30
    assert any("each in-flight read costs a whole 32 MiB tile" in n for n in info["notes"])
    assert any("below the working set" in n for n in info["notes"])


def test_print_summary_is_the_inspect_report(zarr_path, capsys) -> None:
    with _dataset(local_store(zarr_path)) as ds:
        ds.print_summary()
        text = capsys.readouterr().out
        info = ds.describe()
    assert text.rstrip("\n") == format_summary(info)
    train = info["splits"]["train"]
    assert f"{train['samples']} samples, {train['batches']} batches" in text
    assert f"{train['reads']} chunk reads = {train['gets']} GETs per epoch" in text
    assert "split      'val'" in text
    # inspect plans the same epoch with the same code: the same GETs and working set
    report = inspect_store(
        str(zarr_path), batch_size=8, block_chunks=3, max_inflight=4, probe=False, fractions=(0.75, 0.25)
    )
    assert f"{train['reads']} chunk reads = {train['gets']} GETs per epoch" in report
    assert [ln for ln in report.splitlines() if ln.startswith("working")] == [
        ln for ln in text.splitlines() if ln.startswith("working")
    ]


def test_a_split_that_can_yield_nothing_is_noted_and_warned_once_per_pass(zarr_path, caplog) -> None:
    """val is the last chunk of 4 samples; a label 8 steps ahead leaves it no anchor: an empty loop, said aloud."""
    store = local_store(zarr_path)
    geoms = open_geometries(store)
    t2m = geoms["t2m"]
    manifest = split_by_chunk(t2m, fractions={"train": 23 / 24, "val": 1 / 24})
    assert manifest.chunks("val") == (23,)
    with InSituDataset(store, manifest, {"x": t2m, "y": t2m.shift(8)}, batch_size=8, block_chunks=3) as ds:
        notes = ds.describe()["notes"]
        (note,) = [n for n in notes if "'val'" in n]
        assert "yields no sample" in note and "window" in note and "empty loop" in note
        assert not [n for n in notes if "'train'" in n and "no sample" in n]
        with caplog.at_level("WARNING", logger="insitubatch"):
            assert list(ds.val) == []
            list(ds.train)
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "split 'val' yields no sample" in warned[0]


def test_a_split_asked_to_be_empty_is_silent(zarr_path, caplog) -> None:
    store = local_store(zarr_path)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(1.0, 0.0, 0.0))
    assert manifest.chunks("val") == manifest.chunks("test") == ()
    with InSituDataset(store, manifest, geoms, batch_size=8) as ds:
        assert not [n for n in ds.describe()["notes"] if "no sample" in n]
        with caplog.at_level("WARNING", logger="insitubatch"):
            assert list(ds.val) == [] and list(ds.test) == []
        assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_rank_dealt_nothing_is_told_so(zarr_path) -> None:
    """val has one chunk of 4 samples and there are 8 ranks cut to the shortest: the note names the rank."""
    store = local_store(zarr_path)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions={"train": 23 / 24, "val": 1 / 24})
    with InSituDataset(store, manifest, geoms, batch_size=8, rank=7, world_size=8, last_batch="drop") as ds:
        assert ds.val.plan().n_samples == 0
        (note,) = [n for n in ds.describe()["notes"] if "'val'" in n]
        assert "rank 7 of 8" in note and "window" not in note


def test_blocks_left_empty_by_a_window_edge_are_dropped_from_the_plan(zarr_path) -> None:
    """24 chunks of 4 samples, one chunk per block, a label 8 steps ahead: the last two chunks plan no block."""
    store = local_store(zarr_path)
    geoms = open_geometries(store)
    t2m = geoms["t2m"]
    manifest = split_by_chunk(t2m, fractions=(1.0,))
    variables = {"x": t2m, "y": t2m.shift(8)}
    with InSituDataset(store, manifest, variables, batch_size=8, block_chunks=1, shuffle=False) as ds:
        plan = ds.train.plan()
        assert plan.n_samples == 96 - 8
        assert plan.n_blocks == 22  # not 24: chunks 22 and 23 hold no valid anchor
        assert all(np.diff(plan.block_starts) > 0)
        assert ds.describe()["splits"]["train"]["blocks"] == 22
    with InSituDataset(store, manifest, variables, batch_size=8, block_chunks=1, seed=3) as ds:  # shuffled too
        plan = ds.train.plan()
        assert plan.n_blocks == 22 and all(np.diff(plan.block_starts) > 0)


@pytest.mark.parametrize("block_chunks", [1, 3, 12])
def test_auto_read_ahead_tops_the_tiles_a_block_holds_up_to_the_cap_and_no_further(zarr_path, block_chunks) -> None:
    """Under "auto" a remote pass reads past its next block only as far as the window could use: the tiles
    one full block holds plus the extra reach the cap; a block that already holds the cap gets nothing more."""
    from insitubatch.plan.sizing import auto_read_ahead

    store = local_store(zarr_path)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(1.0,))
    with InSituDataset(store, manifest, geoms, batch_size=8, block_chunks=block_chunks) as ds:
        plan = ds.train.plan()
        tiles = {g.source: g.tiles_read for g in ds.variables.values()}
        per_read = sum(tiles[source] for source, _ in plan.reads) / len(plan.reads)
        block_tiles = min(len(b) for b in plan.block_reads[:-1]) * per_read
        for cap in (4, 16, 64):
            nbytes, reads = auto_read_ahead(plan, tiles, cap)
            if block_tiles >= cap:
                assert (nbytes, reads) == (0, 0)
            else:
                assert block_tiles + reads * per_read >= cap > block_tiles + (reads - 1) * per_read
                assert nbytes == reads * int(plan.read_nbytes.max())
