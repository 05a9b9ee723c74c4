"""Concurrency: datasets and views iterated side by side, consumers slower and faster than the producer.

Every batch of every pass is checked against zarr-python's read of the
arrays; every pass must see each of its samples exactly once.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, assert_batch_matches, local_store, smooth_field, write_array
from zarr.errors import ZarrUserWarning

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

N = 72
JOIN_S = 60.0
# a consumer this much slower than the producer keeps the prefetch queue full
SLOW_CONSUMER_S = 0.01
# how long a slow consumer waits for the producer to fill the queue before it looks
FILL_DEADLINE_S = 5.0
# a store this slow per GET makes the producer the bottleneck
SLOW_STORE_S = 0.02


def _write(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    root = zarr.open_group(path, mode="w")
    data = {"t2m": smooth_field(rng, (N, 6, 8)), "u10": smooth_field(rng, (N, 6, 8))}
    write_array(root, "t2m", data["t2m"], (4, 3, 8), dims=("time", "lat", "lon"))
    write_array(root, "u10", data["u10"], (3, 6, 4), shards=(6, 6, 8), dims=("time", "lat", "lon"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)  # v3 consolidated metadata: on purpose, HTTP cannot list
        zarr.consolidate_metadata(path)
    return data


@pytest.fixture
def local(tmp_path: Path):
    path = tmp_path / "c.zarr"
    data = _write(path)
    return path, data


def _check_pass(view, data, *, per_batch: Callable[[], None] | None = None) -> list[int]:
    """Iterate ``view``, check every batch against ``data``; return the samples seen."""
    seen: list[int] = []
    for batch in view:
        assert_batch_matches(batch, view.dataset.variables, data)
        seen.extend(batch.sample_indices.tolist())
        if per_batch is not None:
            per_batch()
    assert len(seen) == len(set(seen)), "a sample came twice in one pass"
    return seen


def _run_threads(targets: list[Callable[[], None]]) -> None:
    """Run ``targets`` at once; re-raise the first failure; a thread that outlives ``JOIN_S`` is a hang."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(fn), name=f"consumer-{i}") for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a consumer thread hung"
    if errors:
        raise errors[0]


def test_two_datasets_in_two_threads_over_one_http_store(emulator) -> None:
    data = _write(emulator.root / "c.zarr")
    emulator.configure(latency_s=0.002)
    store = obstore_store(emulator.url_for("c.zarr"), read_only=True)  # one store, shared by both
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.75, 0.25))
    g = geoms["t2m"]
    a = InSituDataset(store, manifest, batch_size=5, block_chunks=2, seed=1, max_inflight=4)
    b = InSituDataset(
        store,
        manifest,
        {"x": g, "later": g.shift(3), "u": geoms["u10"]},
        batch_size=8,
        block_chunks=3,
        seed=2,
        max_inflight=16,
    )
    counts = {"a": 0, "b": 0}

    def epochs(name: str, ds: InSituDataset) -> Callable[[], None]:
        def run() -> None:
            for epoch in range(3):
                ds.set_epoch(epoch)
                seen = _check_pass(ds.train, data)
                assert sorted(seen) == sorted(ds.train.plan().anchors.tolist())
                counts[name] += len(ds.train)
                _check_pass(ds.val, data)
                counts[name] += len(ds.val)

        return run

    try:
        _run_threads([epochs("a", a), epochs("b", b)])
    finally:
        a.close()
        b.close()
        close_store(store)
    assert counts["a"] > 0 and counts["b"] > 0


def test_train_and_val_of_one_dataset_in_two_threads(local) -> None:
    path, data = local
    store = CountingStore(local_store(path), latency_s=0.002)
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    with InSituDataset(store, manifest, batch_size=4, block_chunks=2, max_inflight=3) as ds:
        store.reset()  # zarr's own metadata reads at open time are not the engine's
        results: dict[str, list[int]] = {}

        def run(split: str) -> Callable[[], None]:
            def go() -> None:
                results[split] = _check_pass(ds.split(split), data)

            return go

        _run_threads([run("train"), run("val")])
        for split in ("train", "val"):
            assert sorted(results[split]) == manifest.sample_indices(split).tolist()
        assert store.peak_inflight <= 3  # one max_inflight budget across both passes


def test_train_and_val_zipped(local) -> None:
    path, data = local
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    with InSituDataset(store, manifest, batch_size=4, block_chunks=2) as ds:
        for epoch in range(3):
            ds.set_epoch(epoch)
            pairs = 0
            for tb, vb in zip(ds.train, ds.val):
                assert_batch_matches(tb, ds.variables, data)
                assert_batch_matches(vb, ds.variables, data)
                pairs += 1
            assert pairs == min(len(ds.train), len(ds.val))


def test_a_consumer_slower_than_the_producer(local) -> None:
    path, data = local
    store = CountingStore(local_store(path))
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, ["t2m", "u10"], batch_size=3, block_chunks=2, prefetch_depth=2) as ds:
        plan = ds.train.plan()
        queued: list[int] = []
        it = iter(ds.train)
        state = it._state

        def slow() -> None:
            # give the producer time to run ahead (a loaded CI box may need more than one step's sleep)
            deadline = time.monotonic() + FILL_DEADLINE_S
            while state.queue.qsize() < ds.prefetch_depth and time.monotonic() < deadline and state.thread.is_alive():
                time.sleep(SLOW_CONSUMER_S)
            queued.append(state.queue.qsize())
            time.sleep(SLOW_CONSUMER_S)

        seen: list[int] = []
        for batch in it:
            assert_batch_matches(batch, ds.variables, data)
            seen.extend(batch.sample_indices.tolist())
            slow()
        assert sorted(seen) == list(range(N))
        # the producer ran ahead and waited: the queue was full, never over its depth
        assert max(queued) == ds.prefetch_depth
        # (a wrapping store is read as a remote one: under max_inflight="auto" it may read further ahead)
        assert ds.pool.totals.peak_resident_bytes <= plan.working_set_bytes + ds.context.read_ahead(plan)[0]


def test_a_consumer_faster_than_the_producer(local) -> None:
    path, data = local
    store = CountingStore(local_store(path), latency_s=SLOW_STORE_S)
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, batch_size=4, block_chunks=1, max_inflight=2, prefetch_depth=1) as ds:
        store.reset()
        waits = []
        t_last = time.perf_counter()
        seen: list[int] = []
        for batch in ds.train:
            now = time.perf_counter()
            waits.append(now - t_last)
            assert_batch_matches(batch, ds.variables, data)
            seen.extend(batch.sample_indices.tolist())
            t_last = time.perf_counter()
        assert sorted(seen) == list(range(N))
        # the consumer spent the epoch waiting: at least half the time the GETs needed, two at a time
        gets = sum(store.chunk_gets().values())
        assert sum(waits) >= 0.5 * SLOW_STORE_S * gets / 2
        assert store.peak_inflight <= 2


def test_many_threads_each_with_its_own_dataset_over_one_store(local) -> None:
    path, data = local
    store = CountingStore(local_store(path), latency_s=0.001)
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))

    def one(seed: int) -> Callable[[], None]:
        def run() -> None:
            with InSituDataset(
                store, manifest, batch_size=3 + seed, block_chunks=1 + seed % 3, seed=seed, prefetch_depth=1 + seed % 2
            ) as ds:
                for epoch in range(2):
                    ds.set_epoch(epoch)
                    assert sorted(_check_pass(ds.train, data)) == list(range(N))

        return run

    _run_threads([one(seed) for seed in range(4)])


# -- abandoned overlapping passes ------------------------------------------------------------------
# a store this slow per GET keeps the first pass's fetches in flight while the second pins them
ABANDON_STORE_S = 0.05
# the hard limit on a pass left waiting on a chunk another pass was fetching
ABANDON_TIMEOUT_S = 120


def _shares_pending(second, first) -> bool:
    """Whether pass ``second`` pins a chunk pass ``first`` is still fetching (the case that used to hang)."""
    fetcher = first.owner.id
    return any(s is not None and s.state == "pending" and s.fetcher == fetcher for s in second.driver.entries)


def _wait_fetching(state) -> None:
    """Wait until pass ``state`` has a fetch of its own in flight (it admits its next block on the loop)."""
    deadline = time.monotonic() + FILL_DEADLINE_S
    while not _shares_pending(state, state):
        assert time.monotonic() < deadline, (
            f"the first pass never fetched: {[(s.state, s.fetcher) if s else None for s in state.driver.entries]}"
        )
        time.sleep(0.002)


def _wait_shared(second, first) -> None:
    """Wait until iterator ``second`` pins a chunk that the pass ``first`` (an iterator or its state) fetches."""
    first = getattr(first, "_state", first)
    deadline = time.monotonic() + FILL_DEADLINE_S
    while not _shares_pending(second._state, first):
        assert time.monotonic() < deadline, (
            "the second pass never pinned a chunk the first was fetching: "
            f"{[(s.state, s.fetcher) if s else None for s in second._state.driver.entries]} (first is {first.owner.id})"
        )
        time.sleep(0.002)


def _finish(it, ds, data, expected: list[int]) -> None:
    """Drain ``it`` in a thread that must end within the hard timeout; every sample once, equal to zarr's."""
    seen: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for batch in it:
                assert_batch_matches(batch, ds.variables, data)
                seen.extend(batch.sample_indices.tolist())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    t = threading.Thread(target=run, name="survivor")
    t.start()
    t.join(JOIN_S)
    assert not t.is_alive(), "the surviving pass hung on a chunk the abandoned pass was fetching"
    if errors:
        raise errors[0]
    assert sorted(seen) == sorted(expected)


# more than the train split's reads in one pass
_PERMITS_FOR_EVERY_READ = 64


def _slow_ds(path, max_inflight: int = 2, **kw) -> InSituDataset:
    store = CountingStore(local_store(path), latency_s=ABANDON_STORE_S)
    g = open_geometries(store)["t2m"]
    manifest = split_by_chunk(g, fractions=(0.7, 0.15, 0.15))
    # blocks of several batches: a pass that yielded its first batch still fetches its next block
    return InSituDataset(store, manifest, batch_size=4, block_chunks=4, max_inflight=max_inflight, **kw)


def _first_block_keys(ds) -> frozenset[str]:
    """Store keys of the reads the first block of this epoch's train pass holds."""
    plan = ds.train.plan()
    keys = set()
    for i in plan.block_reads[0]:
        source, chunk = plan.reads[i]
        g = ds.readers[source].geometry
        keys.update(g.tile_key(g.physical_chunk_coord(chunk, t))[0] for t in range(g.tiles_per_chunk))
    return frozenset(keys)


def _abandon_first(ds, how: str):
    """Start a train pass, start a second that shares its fetches, abandon the first; return the second.

    The store holds every GET from the second pass's start until the first is gone, so the chunks
    they share are certainly still in flight when the first is abandoned.
    """
    store = ds.store
    if how == "break":
        # the first block's GETs pass and every later one parks, so the first pass is certainly still
        # fetching its next block when the second starts, and the second can read the first block again
        # (the first may have dropped what its first batch alone used)
        assert len(ds.train.plan().reads) < _PERMITS_FOR_EVERY_READ
        store.hold(allow=_first_block_keys(ds))
        for _ in ds.train:  # the loop's iterator dies with this frame after the break
            first = ds.train._pass()
            _wait_fetching(first)  # its next block, parked
            second = iter(ds.train)
            _wait_shared(second, first)
            del first
            break
        store.release()
        return second
    first = iter(ds.train)
    store.hold()
    second = iter(ds.train)
    _wait_shared(second, first)
    if how == "close":
        first.close()
    else:  # garbage collection
        del first
        gc.collect()
    store.release()
    return second


@pytest.mark.timeout(ABANDON_TIMEOUT_S)
@pytest.mark.parametrize("how", ["close", "break", "gc"])
@pytest.mark.parametrize("cache", [False, True], ids=["memory", "disk-cache"])
def test_abandoning_a_pass_never_hangs_one_that_shares_its_fetches(local, tmp_path, how, cache) -> None:
    path, data = local
    kw = {"cache_dir": tmp_path / "cache", "persist": True} if cache else {}
    # "break" parks every GET but the first block's from the start: permits for every read of the pass,
    # so a later block's parked GETs never hold one the first block needs
    with _slow_ds(path, max_inflight=_PERMITS_FOR_EVERY_READ if how == "break" else 2, **kw) as ds:
        second = _abandon_first(ds, how)
        _finish(second, ds, data, ds.train.plan().anchors.tolist())


@pytest.mark.timeout(ABANDON_TIMEOUT_S)
def test_a_zip_of_train_and_val_abandoned_beside_a_train_pass(local) -> None:
    path, data = local
    with _slow_ds(path) as ds:
        ds.store.hold()
        pair = zip(ds.train, ds.val)
        train_pass = ds.train._pass()
        second = iter(ds.train)
        _wait_shared(second, train_pass)
        del pair, train_pass  # what a finished `for a, b in zip(...)` does with its iterators
        gc.collect()
        ds.store.release()
        _finish(second, ds, data, ds.train.plan().anchors.tolist())


@pytest.mark.timeout(ABANDON_TIMEOUT_S)
@pytest.mark.parametrize("closed", ["train", "infer"])
def test_infer_beside_a_train_pass_either_closed(local, closed) -> None:
    path, data = local
    with _slow_ds(path) as ds:
        view = ds.infer()
        if closed == "train":  # the second pass pins chunks the first is fetching, then the first closes
            first, second = iter(ds.train), iter(view)
            expected = view.plan().anchors.tolist()
        else:
            first, second = iter(view), iter(ds.train)
            expected = ds.train.plan().anchors.tolist()
        ds.store.hold()
        _wait_shared(second, first)
        first.close()
        ds.store.release()
        _finish(second, ds, data, expected)
