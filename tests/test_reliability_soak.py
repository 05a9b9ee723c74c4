"""Soak: many epochs with shuffle, a persisted cache and early breaks leave RSS, threads, fds and mmaps flat."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, assert_batch_matches, local_store, open_fds, smooth_field, write_array

from insitubatch.dataset import InSituDataset
from insitubatch.errors import DatasetClosedError
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk

EPOCHS = 30
# Epochs before measuring: the decode pool, the batch buffers and glibc's
# per-thread arenas reach their steady size in the first few.
WARMUP_EPOCHS = 5
# every third epoch leaves its training loop after the first batch
BREAK_EVERY = 3
# every fourth epoch also iterates train and val zipped
ZIP_EVERY = 4
# Flat means: the second half of the measured epochs peaks no higher than the
# first half (a leak of one thread, fd or mapping per pass would add 5 to 15),
# and no measurement exceeds the first one by more than a transient allowance
# (a cancelled pass's decode task may still hold a tile file open for a moment).
RSS_SLACK_BYTES = 16 * 2**20
TREND_SLACK = {"threads": 0, "fds": 1, "maps_besides_entries": 2, "rss": RSS_SLACK_BYTES}
ABSOLUTE_SLACK = {"threads": 0, "fds": 2, "maps_besides_entries": 8, "rss": 2 * RSS_SLACK_BYTES}
SOAK_BUDGET_S = 60.0
SETTLE_S = 5.0


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _passes_settle() -> None:
    """Give closing passes a moment to join their producer threads."""
    deadline = time.monotonic() + SETTLE_S
    while any(t.name == "insitu-prefetch" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)


def _resources(pool) -> dict[str, int]:
    gc.collect()
    return {
        "rss": _rss_bytes(),
        "threads": threading.active_count(),
        "fds": open_fds(),
        "maps_besides_entries": _maps() - len(pool),
    }


@pytest.fixture
def soak_data(tmp_path: Path):
    rng = np.random.default_rng(21)
    path = tmp_path / "soak.zarr"
    root = zarr.open_group(path, mode="w")
    data = {
        "t2m": smooth_field(rng, (96, 8, 10)),
        "u10": smooth_field(rng, (96, 8, 10)),
    }
    write_array(root, "t2m", data["t2m"], (4, 4, 5), dims=("time", "lat", "lon"))
    write_array(root, "u10", data["u10"], (6, 8, 10), shards=(12, 8, 10), dims=("time", "lat", "lon"))
    return path, data


@pytest.mark.slow
def test_thirty_epochs_with_a_persisted_cache_and_early_breaks_stay_flat(soak_data, tmp_path: Path) -> None:
    path, data = soak_data
    store = CountingStore(local_store(path))
    geoms = open_geometries(store)
    g = geoms["t2m"]
    manifest = split_by_chunk(g, fractions=(0.75, 0.25))
    variables = {"x": g, "next": g.shift(2), "u": geoms["u10"]}  # a window: blocks release and revive chunks
    ds = InSituDataset(
        store,
        manifest,
        variables,
        batch_size=6,
        block_chunks=2,
        shuffle=True,
        cache_dir=tmp_path / "cache",
        persist=True,
        max_inflight=8,
    )
    t0 = time.monotonic()
    samples: list[dict[str, int]] = []
    batches = 0
    working_set = 0
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        # at most train and val are open at once (zipped): the auto budget is the sum of their working sets
        working_set = max(working_set, ds.train.plan().working_set_bytes + ds.val.plan().working_set_bytes)
        early = epoch % BREAK_EVERY == BREAK_EVERY - 1
        seen = []
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, data)
            seen.extend(batch.sample_indices.tolist())
            batches += 1
            if early:
                break
        if not early:
            assert len(seen) == len(set(seen)) == len(ds.train.plan().anchors)
            for batch in ds.val:
                assert_batch_matches(batch, ds.variables, data)
                batches += 1
        if epoch % ZIP_EVERY == 0:  # train and val zipped: two passes on one pool, the longer one cut short
            for tb, vb in zip(ds.train, ds.val):
                assert_batch_matches(tb, ds.variables, data)
                assert_batch_matches(vb, ds.variables, data)
                batches += 2
        if epoch >= 1:
            # every chunk was persisted in epoch 0: later epochs revive from disk, never fetch
            assert ds.gets == 0, f"epoch {epoch} fetched {ds.gets} chunks although the cache holds them all"
        del batch
        if epoch >= WARMUP_EPOCHS:
            _passes_settle()
            samples.append(_resources(ds.pool))
    elapsed = time.monotonic() - t0

    half = len(samples) // 2
    first = {k: max(x[k] for x in samples[:half]) for k in samples[0]}
    second = {k: max(x[k] for x in samples[half:]) for k in samples[0]}
    for key in samples[0]:
        assert second[key] <= first[key] + TREND_SLACK[key], f"{key} grows: {first[key]} then {second[key]}"
        worst = max(x[key] for x in samples)
        assert worst <= samples[0][key] + ABSOLUTE_SLACK[key], f"{key}: {samples[0][key]} at first, {worst} at worst"
    assert ds.pool.totals.peak_resident_bytes <= working_set  # residency never outgrew the open passes' floor
    assert not any(t.name == "insitu-prefetch" for t in threading.enumerate())
    assert elapsed < SOAK_BUDGET_S, f"{EPOCHS} epochs took {elapsed:.1f}s"
    print(f"soak: {EPOCHS} epochs, {batches} batches in {elapsed:.1f}s; first half peaks {first}, second {second}")

    # close() is idempotent and releases the cache: a second dataset takes the directory over
    fds_open = open_fds()
    ds.close()
    ds.close()
    assert open_fds() < fds_open
    with pytest.raises(DatasetClosedError):
        iter(ds.train)
    with pytest.raises(DatasetClosedError):
        for _ in ds.val:
            pass
    with pytest.raises(DatasetClosedError):
        ds.infer()
    with InSituDataset(
        store, manifest, variables, batch_size=6, block_chunks=2, cache_dir=tmp_path / "cache", persist=True
    ) as again:
        for batch in again.train:
            assert_batch_matches(batch, again.variables, data)
        assert again.gets == 0


def test_closing_the_dataset_under_an_open_pass_raises_in_its_consumer(soak_data) -> None:
    path, data = soak_data
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    ds = InSituDataset(str(path), manifest, ["t2m"], batch_size=4, prefetch_depth=1)
    it = iter(ds.train)
    assert_batch_matches(next(it), ds.variables, data)
    ds.close()
    with pytest.raises(DatasetClosedError, match="closed while this pass was open"):
        next(it)
    # a pass the caller closes simply ends
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4) as other:
        it = iter(other.train)
        next(it)
        it.close()
        with pytest.raises(StopIteration):
            next(it)


def test_a_closed_dataset_refuses_every_entry_point(soak_data, tmp_path: Path) -> None:
    path, _ = soak_data
    g = open_geometries(str(path))["t2m"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.5))
    ds = InSituDataset(str(path), manifest, ["t2m"], batch_size=4, cache_dir=tmp_path / "c", persist=True)
    next(iter(ds.train))
    ds.close()
    for _ in range(3):
        ds.close()
    for start in (lambda: iter(ds.train), lambda: iter(ds.val), lambda: ds.train.iterate(0), lambda: ds.infer((0, 8))):
        with pytest.raises(DatasetClosedError, match="closed"):
            start()
    # the writer lock went with close(): another dataset may write the directory now
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4, cache_dir=tmp_path / "c", persist=True) as again:
        next(iter(again.train))
