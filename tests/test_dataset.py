"""InSituDataset end to end, with zarr-python as the oracle for every batch."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, open_fds, smooth_field, write_array

from insitubatch.dataset import InSituDataset
from insitubatch.errors import BadChunkError, DatasetClosedError, StoreReadError
from insitubatch.io.group import open_geometries
from insitubatch.plan.epoch import plan_epoch
from insitubatch.plan.splits import split_by_chunk


def _oracle_pass(view, arrays: dict[str, zarr.Array], sample_axis: int = 0) -> list[int]:
    """Iterate ``view`` and check every label of every batch against zarr reads."""
    seen: list[int] = []
    ds = view.dataset
    for batch in view:
        assert len(batch) <= ds.batch_size
        for label, g in ds.variables.items():
            idx = batch.read_indices(label)
            expected = np.stack([_read_sample(arrays[g.path], int(i), sample_axis) for i in idx])
            np.testing.assert_array_equal(batch.arrays[label], expected, err_msg=f"label {label}")
        seen.extend(batch.sample_indices.tolist())
    return seen


def _read_sample(arr: zarr.Array, i: int, axis: int) -> np.ndarray:
    sel = [slice(None)] * arr.ndim
    sel[axis] = i
    return arr[tuple(sel)]


@pytest.fixture
def era5_like(tmp_path):
    """v3 group: two fields inner-tiled 2x2, a partial final chunk, plus coordinates."""
    rng = np.random.default_rng(1)
    root = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    t2m = write_array(root, "t2m", smooth_field(rng, (53, 6, 10)), (4, 3, 5), dims=("time", "lat", "lon"))
    u10 = write_array(root, "u10", smooth_field(rng, (53, 6, 10)), (4, 6, 10), dims=("time", "lat", "lon"))
    write_array(root, "time", np.arange(53, dtype="i8"), (53,), dims=("time",))
    return tmp_path / "era5.zarr", {"t2m": t2m, "u10": u10}


@pytest.mark.invariant
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("batch_size", [5, 8])
def test_every_batch_matches_zarr_and_each_sample_once(era5_like, shuffle, batch_size) -> None:
    path, arrays = era5_like
    geoms = open_geometries(str(path))
    assert sorted(geoms) == ["t2m", "u10"]
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.7, 0.15, 0.15))
    with InSituDataset(str(path), manifest, batch_size=batch_size, shuffle=shuffle, block_chunks=2) as ds:
        for name in ("train", "val", "test"):
            view = ds.split(name)
            seen = _oracle_pass(view, arrays)
            assert sorted(seen) == manifest.sample_indices(name).tolist()
            assert len(seen) == len(set(seen))
            assert len(view) == -(-len(seen) // batch_size)
            if name == "train" and not shuffle:
                assert seen == sorted(seen)


def test_windowed_labels_drop_anchors_that_run_off_the_array(era5_like) -> None:
    path, arrays = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(
        str(path), manifest, {"x": g, "y": g.shift(6), "past": g.shift(-2)}, batch_size=7, block_chunks=3
    ) as ds:
        seen = _oracle_pass(ds.train, arrays)
    assert sorted(seen) == list(range(2, 53 - 6))


@pytest.mark.invariant
def test_windowed_view_decodes_each_chunk_once(era5_like) -> None:
    path, arrays = era5_like
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, {"x": g, "y": g.shift(4)}, batch_size=6, block_chunks=2) as ds:
        store.reset()
        _oracle_pass(ds.train, arrays)
    # every stored tile of t2m read exactly once although two labels alias it
    assert set(store.chunk_gets().values()) == {1}
    assert len(store.chunk_gets()) == g.n_chunks * g.tiles_per_chunk


@pytest.mark.parametrize("zarr_format, shards", [(2, None), (3, None), (3, (8, 6, 10))])
def test_formats_and_sharding(tmp_path, zarr_format, shards) -> None:
    rng = np.random.default_rng(2)
    root = zarr.open_group(tmp_path / "f.zarr", mode="w", zarr_format=zarr_format)
    data = smooth_field(rng, (37, 6, 10))
    arr = write_array(root, "v", data, (2, 3, 5) if shards else (4, 3, 5), shards=shards)
    g = open_geometries(str(tmp_path / "f.zarr"))["v"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    with InSituDataset(str(tmp_path / "f.zarr"), manifest, batch_size=6, block_chunks=2, seed=3) as ds:
        for name in ("train", "val"):
            seen = _oracle_pass(ds.split(name), {"v": arr})
            assert sorted(seen) == manifest.sample_indices(name).tolist()


def test_sample_axis_two_on_a_5d_array(tmp_path) -> None:
    rng = np.random.default_rng(3)
    root = zarr.open_group(tmp_path / "ngff.zarr", mode="w")
    data = smooth_field(rng, (2, 2, 19, 8, 6), "u2")
    arr = write_array(root, "raw", data, (1, 2, 3, 4, 6))
    geoms = open_geometries(str(tmp_path / "ngff.zarr"), sample_axis=2)
    g = geoms["raw"]
    assert g.inner_shape == (2, 2, 8, 6)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(tmp_path / "ngff.zarr"), manifest, geoms, batch_size=4, block_chunks=2) as ds:
        seen = _oracle_pass(ds.train, {"raw": arr}, sample_axis=2)
    assert sorted(seen) == list(range(19))


def test_shift_and_window_on_a_sample_axis_other_than_zero(tmp_path) -> None:
    # (channel, time, y, x) with time as the sample axis: shifted and windowed reads equal zarr's along axis 1
    rng = np.random.default_rng(5)
    root = zarr.open_group(tmp_path / "ct.zarr", mode="w")
    arr = write_array(root, "v", smooth_field(rng, (3, 29, 6, 5)), (3, 4, 3, 5))
    g = open_geometries(str(tmp_path / "ct.zarr"), sample_axis=1)["v"]
    assert g.inner_shape == (3, 6, 5)
    variables = {"x": g.window([-2, 0]), "y": g.shift(3)}
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    full = arr[...]
    with InSituDataset(str(tmp_path / "ct.zarr"), manifest, variables, batch_size=5, block_chunks=2) as ds:
        for view in (ds.train, ds.val):
            drawn: list[int] = []
            for batch in view:
                anchors = batch.sample_indices
                steps = batch.read_indices("x")
                np.testing.assert_array_equal(steps, np.stack([anchors - 2, anchors], axis=1))
                assert batch.arrays["x"].shape == (len(batch), 2, 3, 6, 5)
                np.testing.assert_array_equal(batch.arrays["x"], np.moveaxis(full[:, steps], 0, 2))
                np.testing.assert_array_equal(batch.arrays["y"], np.moveaxis(full[:, anchors + 3], 0, 1))
                drawn.extend(anchors.tolist())
            # exactly the anchors whose window and shift stay on the array are drawn, each once
            want = [i for i in manifest.sample_indices(view.split).tolist() if i - 2 >= 0 and i + 3 < 29]
            assert sorted(drawn) == want


def test_variables_chunked_differently_on_the_sample_axis(tmp_path) -> None:
    rng = np.random.default_rng(4)
    root = zarr.open_group(tmp_path / "pair.zarr", mode="w")
    raw = write_array(root, "raw", smooth_field(rng, (45, 4, 4)), (1, 4, 4))
    mask = write_array(root, "mask", (rng.random((45, 4, 4)) > 0.5), (30, 4, 4))
    geoms = open_geometries(str(tmp_path / "pair.zarr"))
    manifest = split_by_chunk(geoms["mask"], fractions=(1.0,))
    with InSituDataset(str(tmp_path / "pair.zarr"), manifest, batch_size=8, block_chunks=1) as ds:
        seen = _oracle_pass(ds.train, {"raw": raw, "mask": mask})
    assert sorted(seen) == list(range(45))


def test_unequal_sample_lengths_raise(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "bad.zarr", mode="w")
    write_array(root, "a", np.zeros((10, 2), "f4"), (5, 2))
    write_array(root, "b", np.zeros((12, 2), "f4"), (5, 2))
    geoms = open_geometries(str(tmp_path / "bad.zarr"))
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    with pytest.raises(ValueError, match="'b': 12"):
        InSituDataset(str(tmp_path / "bad.zarr"), manifest)


def test_order_is_deterministic_per_seed_and_epoch(era5_like) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    kw = dict(batch_size=8, block_chunks=2, seed=11)
    with InSituDataset(str(path), manifest, ["t2m"], **kw) as a, InSituDataset(str(path), manifest, ["t2m"], **kw) as b:
        first = [x.sample_indices.tolist() for x in a.train]
        assert first == [x.sample_indices.tolist() for x in b.train]
        a.set_epoch(1)
        second = [x.sample_indices.tolist() for x in a.train]
        assert second != first
        assert sorted(sum(second, [])) == sorted(sum(first, []))


@pytest.mark.invariant
@pytest.mark.parametrize("batch_size, shuffle", [(3, True), (16, True), (16, False)])
def test_gets_per_epoch_equal_distinct_stored_tiles(era5_like, batch_size, shuffle) -> None:
    path, arrays = era5_like
    store = CountingStore(local_store(path))
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(1.0,))
    with InSituDataset(store, manifest, batch_size=batch_size, shuffle=shuffle, block_chunks=3) as ds:
        store.reset()
        for _ in ds.train:
            pass
        expected = sum(g.n_chunks * g.tiles_per_chunk for g in geoms.values())
        assert sum(store.chunk_gets().values()) == expected
        assert ds.gets == expected and ds.cache_misses == sum(g.n_chunks for g in geoms.values())


@pytest.mark.invariant
def test_pool_residency_and_concurrency_stay_bounded(era5_like) -> None:
    path, arrays = era5_like
    store = CountingStore(local_store(path), latency_s=0.005)
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    plan = plan_epoch(manifest, "train", {"t2m": g}, batch_size=4, block_chunks=2, shuffle=True, seed=0, epoch=0)
    budget = plan.working_set_bytes
    with InSituDataset(
        store, manifest, ["t2m"], batch_size=4, block_chunks=2, max_inflight=3, cache_budget_bytes=budget
    ) as ds:
        store.reset()
        _oracle_pass(ds.train, arrays)
        assert ds.pool.totals.peak_resident_bytes <= budget
    assert store.peak_inflight <= 3


@pytest.mark.invariant
def test_budget_below_the_working_set_raises_naming_numbers(era5_like) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(path), manifest, ["t2m"], block_chunks=4, cache_budget_bytes=1000) as ds:
        with pytest.raises(ValueError, match="cache_budget_bytes=1000 cannot hold this iteration's working set of"):
            iter(ds.train)


def test_train_and_val_zipped_share_one_pool(era5_like) -> None:
    path, arrays = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4, block_chunks=2) as ds:
        for tb, vb in zip(ds.train, ds.val):
            np.testing.assert_array_equal(tb.arrays["t2m"], arrays["t2m"][...][tb.sample_indices])
            np.testing.assert_array_equal(vb.arrays["t2m"], arrays["t2m"][...][vb.sample_indices])


@pytest.mark.invariant
def test_kept_batches_are_never_overwritten(era5_like) -> None:
    path, arrays = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4, block_chunks=2) as ds:
        kept = list(ds.train)
        data = arrays["t2m"][...]
        for b in kept:
            np.testing.assert_array_equal(b.arrays["t2m"], data[b.sample_indices])
        # the short final batch is a prefix view of a full-size buffer
        last = kept[-1]
        assert len(last) == 53 % 4 and last.arrays["t2m"].base is not None
        # with nothing kept, buffers are reused
        allocs = ds.buffers.allocations
        for _ in ds.train:
            pass
        assert ds.buffers.allocations - allocs <= ds.prefetch_depth + 3


def test_no_buffer_reuse_escape_hatch(era5_like, monkeypatch) -> None:
    monkeypatch.setenv("INSITUBATCH_NO_BUFFER_REUSE", "1")
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4) as ds:
        n = sum(1 for _ in ds.train)
        assert ds.buffers.allocations == n


def test_breaking_out_early_leaks_no_thread_or_fd(era5_like) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(path), manifest, ["t2m", "u10"], batch_size=2, block_chunks=1) as ds:
        for _ in ds.train:  # warm the shared loop and decode pool once
            break
        gc.collect()
        time.sleep(0.1)
        threads, fds = threading.active_count(), open_fds()
        for _ in range(20):
            for _batch in ds.train:
                break
        del _batch
        gc.collect()
        deadline = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.02)
        assert threading.active_count() <= threads
        assert open_fds() <= fds
        assert not any(t.name == "insitu-prefetch" for t in threading.enumerate())


def test_loop_keeps_serving_other_zarr_work_while_a_consumer_stalls(era5_like) -> None:
    path, arrays = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    other = zarr.open_array(str(path / "u10"), mode="r")
    ds = InSituDataset(str(path), manifest, ["t2m"], batch_size=2, block_chunks=1, prefetch_depth=1)
    it = iter(ds.train)
    next(it)  # the producer is now parked on a full queue, the driver on its permits
    reads, stop = [], threading.Event()

    def victim() -> None:
        while not stop.is_set():
            reads.append(float(other[3, 0, 0]))

    t = threading.Thread(target=victim)
    t.start()
    time.sleep(0.5)
    n_during = len(reads)
    it.close()
    ds.close()
    time.sleep(0.2)
    stop.set()
    t.join(timeout=10)
    assert n_during > 10, "unrelated zarr reads starved while the consumer stalled"
    assert len(reads) > n_during, "zarr reads stopped after the dataset closed"
    np.testing.assert_array_equal(other[:], arrays["u10"][:])  # no CancelledError leaked into zarr


def test_store_failure_raises_in_consumer_naming_the_key(era5_like) -> None:
    path, _ = era5_like
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    store.fail_keys = {g.chunk_key(g.physical_chunk_coord(3, 1))}
    with InSituDataset(store, manifest, ["t2m"], batch_size=4, shuffle=False, block_chunks=1) as ds:
        with pytest.raises(StoreReadError, match=r"array 't2m' chunk \(3, 0, 1\) \(key 't2m/c/3/0/1'\)"):
            for _ in ds.train:
                pass


def _corrupt(path, key: str) -> None:
    with open(path / key, "r+b") as f:
        f.seek(0)
        f.write(b"\xff" * 16)


def test_bad_chunk_raise_and_nan_policies(tmp_path) -> None:
    rng = np.random.default_rng(5)
    root = zarr.open_group(tmp_path / "bad.zarr", mode="w")
    data = smooth_field(rng, (20, 4, 6))
    write_array(root, "v", data, (5, 4, 3))
    g = open_geometries(str(tmp_path / "bad.zarr"))["v"]
    key = g.chunk_key(g.physical_chunk_coord(2, 1))
    _corrupt(tmp_path / "bad.zarr", key)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(str(tmp_path / "bad.zarr"), manifest, ["v"], batch_size=4) as ds:
        with pytest.raises(BadChunkError, match="v"):
            list(ds.train)
    with InSituDataset(str(tmp_path / "bad.zarr"), manifest, ["v"], batch_size=4, on_bad_chunk="nan") as ds:
        batches = list(ds.train)
        assert [(r.array, r.chunk_index, r.inner_coord) for r in ds.bad_chunks] == [("v", 2, (0, 1))]
        ds.set_epoch(1)  # bad_chunks are per epoch: the next epoch starts empty and lists its own
        assert ds.bad_chunks == []
        list(ds.train)
        assert [(r.array, r.chunk_index, r.inner_coord) for r in ds.bad_chunks] == [("v", 2, (0, 1))]
    for b in batches:
        expected = data[b.sample_indices].copy()
        expected[(b.sample_indices >= 10) & (b.sample_indices < 15), :, 3:] = np.nan
        np.testing.assert_array_equal(b.arrays["v"], expected)


def test_max_inflight_overlaps_fetches(era5_like) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))

    def epoch_time(inflight: int) -> float:
        store = CountingStore(local_store(path), latency_s=0.03)
        with InSituDataset(store, manifest, ["t2m"], batch_size=8, block_chunks=8, max_inflight=inflight) as ds:
            t0 = time.perf_counter()
            for _ in ds.train:
                pass
            return time.perf_counter() - t0

    slow, fast = epoch_time(4), epoch_time(8)
    assert slow / fast > 1.3, f"doubling max_inflight did not speed up a 30 ms store ({slow:.3f}s vs {fast:.3f}s)"


def test_closed_dataset_refuses_to_iterate_and_close_is_idempotent(era5_like) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    ds = InSituDataset(str(path), split_by_chunk(g, fractions=(1.0,)), ["t2m"])
    ds.close()
    ds.close()
    with pytest.raises(DatasetClosedError):
        iter(ds.train)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size=0 must be >= 1"),
        ({"block_chunks": -1}, ValueError, "block_chunks=-1 must be >= 1"),
        ({"max_inflight": 0}, ValueError, "max_inflight=0 must be >= 1"),
        ({"prefetch_depth": 0}, ValueError, "prefetch_depth=0 must be >= 1"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int"),
        ({"on_bad_chunk": "skip"}, ValueError, "on_bad_chunk='skip' must be one of"),
        ({"variables": ["nope"]}, ValueError, "variable 'nope' is not an array"),
        (
            {
                "chunk_transforms": [
                    __import__("insitubatch.transforms", fromlist=["applies"]).applies(["zz"], lambda c: c)
                ]
            },
            ValueError,
            r"names \['zz'\], which are not arrays",
        ),
    ],
)
def test_parameters_are_validated(era5_like, kwargs, exc, match) -> None:
    path, _ = era5_like
    g = open_geometries(str(path))["t2m"]
    with pytest.raises(exc, match=match):
        InSituDataset(str(path), split_by_chunk(g, fractions=(1.0,)), **kwargs)
