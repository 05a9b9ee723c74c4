"""Resumable passes and the inference pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch.testing.emulator import Emulator


@pytest.fixture
def path(tmp_path):
    root = zarr.open_group(tmp_path / "r.zarr", mode="w")
    x = np.random.default_rng(0).random((90, 3, 4), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(5, 3, 4), dtype="f4", dimension_names=("time", "a", "b"))[:] = x
    t = root.create_array("time", shape=(90,), chunks=(90,), dtype="i8", dimension_names=("time",))
    t[:] = np.arange(90) * 3600 + 1_000_000
    return tmp_path / "r.zarr"


def _ds(store, **kw):
    g = open_geometries(store)["x"]
    m = split_by_chunk(g, fractions=(1.0,))
    return InSituDataset(store, m, {"x": g, "y": g.shift(3)}, batch_size=4, block_chunks=2, seed=7, **kw)


@pytest.mark.invariant
@pytest.mark.parametrize("k", [0, 1, 5, 11])
def test_resume_after_k_batches_yields_the_tail_and_rereads_nothing_consumed(path, k) -> None:
    with _ds(str(path)) as full:
        full.set_epoch(2)
        expected = [b.sample_indices.tolist() for b in full.train]
    with _ds(str(path)) as first:
        first.set_epoch(2)
        it = iter(first.train)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(first.train.state_dict()))
        it.close()
    assert state["batches_consumed"] == k and state["epoch"] == 2
    store = CountingStore(local_store(path))
    with _ds(store) as second:
        second.train.load_state_dict(state)
        store.reset()
        tail = [b.sample_indices.tolist() for b in second.train]
        plan = second.plan("train", 2)
    assert tail == expected[k:]
    # no chunk only consumed before the checkpoint was fetched
    first_row = plan.batch_rows(k)[0]
    b0 = int(np.searchsorted(plan.block_starts, first_row, side="right")) - 1
    needed = {key for i, key in enumerate(plan.reads) if plan.read_last[i] >= b0}
    fetched = {(p, int(key.split("/")[2])) for key in store.chunk_gets() for p in ["x"] if key.startswith("x/")}
    assert fetched <= needed
    assert len(fetched) == len(needed)


@pytest.mark.parametrize("sharded", [False, True], ids=["chunks", "shards"])
def test_a_resumed_remote_pass_equals_zarr_and_reads_only_what_its_tail_needs(tmp_path, sharded) -> None:
    # a remote pass sends the reads its first block holds first: on a resumed pass, some were first used earlier
    data = np.random.default_rng(3).random((96, 3, 4), dtype="f4")
    root = zarr.open_group(tmp_path / "r.zarr", mode="w")
    layout = {"shards": (16, 3, 4), "chunks": (4, 3, 4)} if sharded else {"chunks": (4, 3, 4)}
    root.create_array("x", shape=data.shape, dtype="f4", dimension_names=("time", "a", "b"), **layout)[:] = data
    with Emulator(tmp_path, latency_s=0.002, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("r.zarr"), read_only=True)
        g = open_geometries(store, variables=["x"])["x"]
        kw = dict(batch_size=4, block_chunks=2, seed=5)
        manifest = split_by_chunk(g, fractions=(1.0,))
        with InSituDataset(store, manifest, {"x": g, "y": g.shift(2)}, **kw) as first:
            it = iter(first.train)
            for _ in range(9):
                next(it)
            state = first.train.state_dict()
            it.close()
        with InSituDataset(store, manifest, {"x": g, "y": g.shift(2)}, **kw) as second:
            second.train.load_state_dict(state)
            emu.reset_stats()
            tail = list(second.train)
            plan = second.plan("train", 0)
            gets = {k: s.gets for k, s in emu.stats().keys.items() if k.startswith("r.zarr/x/c/")}
    assert [b.sample_indices.tolist() for b in tail] == [
        plan.anchors[slice(*plan.batch_rows(k))].tolist() for k in range(9, plan.n_batches)
    ]
    for b in tail:
        np.testing.assert_array_equal(b.arrays["x"], data[b.sample_indices])
        np.testing.assert_array_equal(b.arrays["y"], data[b.sample_indices + 2])
    b0 = int(np.searchsorted(plan.block_starts, plan.batch_rows(9)[0], side="right")) - 1
    per = 4 if sharded else 1  # read chunks per stored object
    needed = {int(plan.reads[i][1]) // per for i in range(len(plan.reads)) if plan.read_last[i] >= b0}
    assert {int(k.rsplit("/", 3)[1]) for k in gets} == needed  # no object only the consumed batches used


def test_loading_a_foreign_state_names_the_mismatch(path) -> None:
    with _ds(str(path)) as ds:
        state = ds.train.state_dict()
    g = open_geometries(str(path))["x"]
    with InSituDataset(
        str(path), split_by_chunk(g, fractions=(1.0,)), {"x": g}, batch_size=8, seed=7, block_chunks=2
    ) as other:
        with pytest.raises(ValueError, match="batch_size: saved 4, this dataset has 8"):
            other.train.load_state_dict(state)
    with _ds(str(path)) as ds:
        with pytest.raises(ValueError, match="batches_consumed.*exceeds"):
            ds.train.load_state_dict({**state, "batches_consumed": 10_000})


def test_infer_is_sequential_with_coords_from_the_store(path) -> None:
    x = zarr.open_array(str(path / "x"), mode="r")[...]
    times = zarr.open_array(str(path / "time"), mode="r")[...]
    with _ds(str(path)) as ds:
        view = ds.infer((10, 41), batch_size=8)
        seen = []
        for batch in view:
            np.testing.assert_array_equal(batch.arrays["y"], x[batch.sample_indices + 3])
            np.testing.assert_array_equal(batch.coords["time"], times[batch.sample_indices])
            seen.extend(batch.sample_indices.tolist())
        assert seen == list(range(10, 41)) and len(view) == 4
        assert [b.sample_indices.tolist() for b in ds.infer()][-1][-1] == 86  # default: every full window


def test_infer_raises_for_a_window_off_the_array(path) -> None:
    with _ds(str(path)) as ds:
        with pytest.raises(ValueError, match=r"label 'y' reads anchor \+ 3.*\[0, 87\)"):
            ds.infer((80, 90))
        with pytest.raises(ValueError, match="0 <= start < stop <= 90"):
            ds.infer((5, 5))


def test_infer_without_a_coordinate_array_uses_indices(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "n.zarr", mode="w")
    root.create_array("v", shape=(12, 2), chunks=(4, 2), dtype="f4")[:] = 1
    g = open_geometries(str(tmp_path / "n.zarr"))["v"]
    with InSituDataset(str(tmp_path / "n.zarr"), split_by_chunk(g, fractions=(1.0,)), batch_size=5) as ds:
        coords = [b.coords for b in ds.infer()]
    np.testing.assert_array_equal(np.concatenate([c["sample"] for c in coords]), np.arange(12))
