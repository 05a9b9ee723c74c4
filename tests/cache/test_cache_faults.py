"""The disk cache's faults inside the loader: a full disk, damaged tile files, the disk budget.

Each pass is compared with zarr batch by batch. A full disk is a real small
filesystem (a tmpfs) where this machine may mount one, and always also
``ENOSPC`` injected at the tile-file write path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, FullAfter, can_mount_tmpfs, local_store, small_tmpfs

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.errors import CacheCorruptError

# 16 chunks of 16 KiB: a 160 KiB tmpfs takes a handful before it is full
SHAPE, CHUNKS = (64, 32, 32), (4, 32, 32)
N_CHUNKS = SHAPE[0] // CHUNKS[0]
TMPFS_SIZE = "160k"
# chunks the injected full disk lets through first
INJECTED_ROOM = 5


@pytest.fixture
def data(tmp_path):
    root = zarr.open_group(tmp_path / "d.zarr", mode="w")
    x = np.random.default_rng(3).random(SHAPE, dtype="f4")
    root.create_array("x", shape=SHAPE, chunks=CHUNKS, dtype="f4")[:] = x
    return tmp_path / "d.zarr", x


@pytest.fixture(
    params=[
        "injected",
        pytest.param(
            "tmpfs",
            marks=pytest.mark.skipif(
                not can_mount_tmpfs(), reason="mounting a tmpfs needs root; the injected twin always runs"
            ),
        ),
    ]
)
def full_disk(request, tmp_path, monkeypatch) -> Iterator[Path]:
    """A cache_dir whose disk fills after a few chunks: a real small tmpfs, or injected ENOSPC."""
    where = tmp_path / "cache"
    where.mkdir()
    if request.param == "injected":
        monkeypatch.setattr(os, "posix_fallocate", FullAfter(INJECTED_ROOM))
        yield where
    else:
        with small_tmpfs(where, TMPFS_SIZE):
            yield where


def _make(store, cache_dir, **kw) -> InSituDataset:
    geoms = open_geometries(store)
    kw = {"batch_size": 6, "block_chunks": 2, "seed": 2, "persist": True, **kw}
    return InSituDataset(store, split_by_chunk(geoms["x"], fractions=(1.0,)), geoms, cache_dir=cache_dir, **kw)


def _check_pass(ds: InSituDataset, x: np.ndarray):
    it = iter(ds.train)
    n = 0
    for batch in it:
        np.testing.assert_array_equal(batch.arrays["x"], x[batch.sample_indices])
        n += len(batch)
    assert n == SHAPE[0]
    return it.counters


@contextmanager
def _warnings(caplog, text: str) -> Iterator[list[str]]:
    """The insitubatch WARNINGs containing ``text`` logged inside the block (filled in when it ends)."""
    found: list[str] = []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="insitubatch"):
        yield found
    found += [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_full_disk_under_persist_degrades_and_later_runs_are_correct(data, full_disk, caplog) -> None:
    path, x = data
    store = CountingStore(local_store(path))
    with _warnings(caplog, "is full") as warned, _make(store, full_disk) as ds:
        c = _check_pass(ds, x)
        assert 0 < c.not_persisted < N_CHUNKS and not ds.cache.persisting
        _check_pass(ds, x)  # a later pass of the same dataset goes on too, without a second warning
    (warning,) = warned
    assert repr(str(full_disk)) in warning and "bytes free" in warning
    persisted = {e[1] for e in _logged(full_disk)}
    assert 0 < len(persisted) < N_CHUNKS
    with _warnings(caplog, "is full") as warned, _make(store, full_disk) as ds:  # a warm run on the still-full disk
        store.reset()
        c = _check_pass(ds, x)
        assert c.revived == len(persisted)
        fetched = {int(k.split("/")[2]) for k in store.chunk_gets()}
        assert fetched == set(range(N_CHUNKS)) - persisted
    assert len(warned) <= 1


def _logged(cache_dir: Path) -> set[tuple[str, int]]:
    from helpers import cache_log_entries

    return {(e["path"], e["chunk"]) for e in cache_log_entries(cache_dir)}


def test_a_full_disk_under_spill_keeps_chunks_in_memory_within_the_budget(data, full_disk, caplog) -> None:
    path, x = data
    budget = x.nbytes  # room for every chunk: the spill files alone would outgrow the small disk
    with _warnings(caplog, "is full") as warned:
        with _make(str(path), full_disk, persist=False, cache_budget_bytes=budget) as ds:
            for _ in range(2):
                _check_pass(ds, x)
            assert ds.pool.totals.peak_resident_bytes <= budget
    (warning,) = warned
    assert "in memory" in warning
    assert not list(full_disk.glob("*.npy")) and not list(full_disk.glob(".*.tmp"))


def _damage(cache_dir: Path, chunk: int) -> Path:
    (target,) = cache_dir.glob(f"cache-*-{chunk}-x.npy")
    with open(target, "r+b") as f:  # one payload byte, same size
        f.seek(target.stat().st_size - 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    return target


def test_a_damaged_tile_file_is_refetched_with_one_warning(data, tmp_path, caplog) -> None:
    path, x = data
    cache = tmp_path / "cache"
    store = CountingStore(local_store(path))
    with _make(store, cache) as ds:
        _check_pass(ds, x)
    target = _damage(cache, 5)
    with _warnings(caplog, "is damaged") as warned, _make(store, cache) as ds:
        store.reset()
        c = _check_pass(ds, x)
        assert list(store.chunk_gets()) == ["x/c/5/0/0"]  # only the damaged chunk is fetched again
        assert c.revived == N_CHUNKS - 1
    (warning,) = warned
    assert str(target) in warning and "chunk 5" in warning
    with _warnings(caplog, "is damaged") as warned, _make(store, cache) as ds:  # repaired on disk
        store.reset()
        _check_pass(ds, x)
        assert not store.chunk_gets()
    assert warned == []


def test_a_damaged_tile_file_raises_under_on_corrupt_cache_raise(data, tmp_path) -> None:
    path, x = data
    cache = tmp_path / "cache"
    with _make(str(path), cache) as ds:
        _check_pass(ds, x)
    target = _damage(cache, 3)
    with _make(str(path), cache, on_corrupt_cache="raise") as ds:
        with pytest.raises(CacheCorruptError, match=str(target)):
            _check_pass(ds, x)


def test_the_disk_budget_caps_the_directory_with_one_warning_per_pass(data, tmp_path, caplog) -> None:
    path, x = data
    cache = tmp_path / "cache"
    with _make(str(path), tmp_path / "probe") as ds:
        _check_pass(ds, x)
        chunk_file = next((tmp_path / "probe").glob("cache-*.npy")).stat().st_size
    cap = 6 * chunk_file + chunk_file // 2
    with _warnings(caplog, "cache_disk_bytes") as warned, _make(str(path), cache, cache_disk_bytes=cap) as ds:
        c = _check_pass(ds, x)
        assert c.not_persisted == N_CHUNKS - 6
        c = _check_pass(ds, x)  # a second pass: the six revive, the rest are fetched, one more warning
        assert c.revived + c.hits >= 6
    assert len(warned) == 2 and f"cache_disk_bytes={cap}" in warned[0]
    assert sum(p.stat().st_size for p in cache.glob("*.npy")) <= cap
    assert len(_logged(cache)) == 6


def test_cache_disk_bytes_is_validated(data, tmp_path) -> None:
    path, _ = data
    with pytest.raises(ValueError, match="cache_disk_bytes"):
        _make(str(path), tmp_path / "c", cache_disk_bytes=0)
    with pytest.raises(ValueError, match="persist=True"):
        _make(str(path), tmp_path / "c", persist=False, cache_disk_bytes=1 << 20)
    with pytest.raises(ValueError, match="need a cache_dir"):
        _make(str(path), None, persist=False, cache_disk_bytes=1 << 20)
    with pytest.raises(ValueError, match="on_corrupt_cache='skip'"):
        _make(str(path), tmp_path / "c", on_corrupt_cache="skip")
