"""The disk cache inside the loader: warm runs, crash safety, locks, staleness, release-per-block."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, cache_log_entries, local_store

from insitubatch import InSituDataset, applies, open_geometries, split_by_chunk
from insitubatch.errors import CacheLockedError, CacheMissError, StaleCacheError
from insitubatch.io.geometry import ArrayGeometry
from insitubatch.plan.epoch import build_plan, epoch_order

HERE = Path(__file__).parent  # this module, which the child processes import
TESTS = HERE.parent  # helpers


@pytest.fixture
def data(tmp_path):
    root = zarr.open_group(tmp_path / "c.zarr", mode="w")
    rng = np.random.default_rng(0)
    a = rng.random((64, 4, 6), dtype="f4")
    b = rng.random((64, 4, 6), dtype="f4")
    root.create_array("a", shape=a.shape, chunks=(4, 2, 6), dtype="f4")[:] = a  # 2 tiles per chunk
    root.create_array("b", shape=b.shape, chunks=(8, 4, 6), dtype="f4")[:] = b
    return tmp_path / "c.zarr", {"a": a, "b": b}


def _make(store, cache_dir, **kw):
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    kw = {"batch_size": 5, "block_chunks": 2, "seed": 1, "persist": True, **kw}
    return InSituDataset(store, manifest, geoms, cache_dir=cache_dir, **kw)


def _epoch(ds) -> tuple[list[list[int]], list[np.ndarray], object]:
    it = iter(ds.train)
    idx, arrays = [], []
    for batch in it:
        idx.append(batch.sample_indices.tolist())
        arrays.append({k: v.copy() for k, v in batch.arrays.items()})
    return idx, arrays, it.counters


def test_warm_run_in_a_new_process_fetches_and_decodes_nothing(data, tmp_path) -> None:
    path, truth = data
    cache = tmp_path / "cache"
    store = CountingStore(local_store(path))
    with _make(store, cache) as ds:
        store.reset()
        cold_idx, cold_arrays, cold = _epoch(ds)
        assert cold.gets == sum(store.chunk_gets().values()) > 0
        assert len(cache_log_entries(cache)) == 16 + 8  # one line per chunk, written before close
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        sys.path.insert(0, {str(TESTS)!r})
        sys.path.insert(0, {str(TESTS.parent)!r})  # this tree's insitubatch, not an installed one
        from helpers import CountingStore, cache_log_entries, local_store
        from test_cache_engine import _make, _epoch
        store = CountingStore(local_store({str(path)!r}))
        with _make(store, {str(cache)!r}) as ds:
            store.reset()
            idx, arrays, c = _epoch(ds)
        print(json.dumps({{"idx": idx, "gets": sum(store.chunk_gets().values()), "decoded": c.decoded_tiles,
                          "hits": c.hits, "joins": c.joins, "revived": c.revived,
                          "reads": len(ds.plan("train").reads)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    warm = json.loads(out.stdout.strip().splitlines()[-1])
    assert warm["gets"] == 0 and warm["decoded"] == 0
    # every read served without a fetch: revived from disk, still resident, or joined to a revival in flight
    # (a chunk read by two blocks can be admitted again while its first revival is still running)
    assert warm["hits"] + warm["joins"] == warm["reads"] >= 16 + 8
    assert warm["revived"] >= 16 + 8
    assert warm["idx"] == cold_idx
    for idx, arrays in zip(cold_idx, cold_arrays):
        np.testing.assert_array_equal(arrays["a"], truth["a"][idx])
        np.testing.assert_array_equal(arrays["b"], truth["b"][idx])


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    sys.path.insert(0, os.path.dirname(sys.argv[3]))  # helpers
    from test_cache_engine import _make
    from helpers import local_store
    with _make(local_store(sys.argv[1]), sys.argv[2], batch_size=2) as ds:
        for k, batch in enumerate(ds.train):
            if k == 5:
                os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.invariant
def test_a_sigkilled_run_keeps_what_it_finished(data, tmp_path) -> None:
    path, truth = data
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(path), str(cache), str(HERE)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    done = {(e["path"], e["chunk"]) for e in cache_log_entries(cache)}
    assert 0 < len(done) < 24
    store = CountingStore(local_store(path))  # the lock of the killed holder is free at once
    with _make(store, cache) as ds:
        store.reset()
        idx, arrays, c = _epoch(ds)
    refetched = {(k.split("/")[0], int(k.split("/")[2])) for k in store.chunk_gets()}
    assert refetched.isdisjoint(done)
    assert len(refetched) == 24 - len(done)
    assert c.revived >= len(done)
    for i, arr in zip(idx, arrays):
        np.testing.assert_array_equal(arr["a"], truth["a"][i])
        np.testing.assert_array_equal(arr["b"], truth["b"][i])


def test_writers_share_and_readonly_readers_share_but_not_together(data, tmp_path) -> None:
    path, _ = data
    cache = tmp_path / "cache"
    with _make(str(path), cache) as ds:
        _epoch(ds)
        with _make(str(path), cache) as other:  # a second writer shares the directory and revives it all
            _, _, c = _epoch(other)
            assert c.gets == 0 and c.revived == c.revived_from_others >= 24
        with pytest.raises(CacheLockedError, match=f"PID {os.getpid()}"):
            _make(str(path), cache, readonly_cache=True)
    readers = [_make(str(path), cache, readonly_cache=True) for _ in range(3)]
    try:
        for r in readers:
            _, _, c = _epoch(r)
            assert c.gets == 0 and c.revived >= 24 and c.misses == 0
        with pytest.raises(CacheLockedError, match=f"readonly readers.*PID {os.getpid()}"):
            _make(str(path), cache)
    finally:
        for r in readers:
            r.close()


def test_readonly_miss_raises_naming_array_and_chunk(data, tmp_path) -> None:
    path, _ = data
    cache = tmp_path / "cache"
    geoms = open_geometries(str(path))
    with InSituDataset(
        str(path), split_by_chunk(geoms["a"], fractions=(0.5, 0.5)), geoms, cache_dir=cache, persist=True, batch_size=4
    ) as ds:
        list(ds.train)  # warms only the train half
    with InSituDataset(
        str(path),
        split_by_chunk(geoms["a"], fractions=(0.5, 0.5)),
        geoms,
        cache_dir=cache,
        persist=True,
        readonly_cache=True,
        batch_size=4,
    ) as ds:
        list(ds.train)
        with pytest.raises(CacheMissError, match=r"'a'.*chunk 8|'b'.*chunk 4"):
            list(ds.val)


def _scale(factor: float):
    def scale(chunk):
        chunk.data = chunk.data * factor
        return chunk

    scale.cache_key = f"scale-{factor}"
    return scale


def test_editing_a_scoped_transform_invalidates_only_its_array(data, tmp_path) -> None:
    path, truth = data
    cache = tmp_path / "cache"
    with _make(str(path), cache, chunk_transforms=[applies(["a"], _scale(2.0))]) as ds:
        _epoch(ds)
    with pytest.raises(StaleCacheError, match="'a'") as err:
        _make(str(path), cache, chunk_transforms=[applies(["a"], _scale(3.0))])
    assert "'b'" not in str(err.value)
    store = CountingStore(local_store(path))
    with _make(store, cache, chunk_transforms=[applies(["a"], _scale(3.0))], reset_stale_cache=True) as ds:
        store.reset()
        idx, arrays, c = _epoch(ds)
    assert {k.split("/")[0] for k in store.chunk_gets()} == {"a"}  # b revived, a rebuilt
    for i, arr in zip(idx, arrays):
        np.testing.assert_allclose(arr["a"], truth["a"][i] * 3.0, rtol=1e-6)


def test_a_damaged_log_always_raises(data, tmp_path) -> None:
    from insitubatch.errors import CacheCorruptError

    path, _ = data
    cache = tmp_path / "cache"
    with _make(str(path), cache) as ds:
        _epoch(ds)
    with _make(str(path), cache):  # a writer alone folds the first one's log into insitu_cache.jsonl
        pass
    log = cache / "insitu_cache.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join([lines[0], lines[1][:10] + "\n", *lines[2:]]))
    with pytest.raises(CacheCorruptError):
        _make(str(path), cache, reset_stale_cache=True)
    log.write_text("garbage\n" + "".join(lines[1:]))
    with pytest.raises(CacheCorruptError):
        _make(str(path), cache)


def test_mmap_tier_without_persist_leaves_no_files(data, tmp_path) -> None:
    path, truth = data
    cache = tmp_path / "spill"
    with _make(str(path), cache, persist=False) as ds:
        idx, arrays, c = _epoch(ds)
        assert c.misses == 24
        for i, arr in zip(idx, arrays):
            np.testing.assert_array_equal(arr["a"], truth["a"][i])
    assert not list(cache.glob("*.npy"))


def test_one_warning_per_epoch_when_the_cache_serves_nothing(data, tmp_path, caplog) -> None:
    path, truth = data
    cache = tmp_path / "cache"
    with _make(str(path), cache) as ds:
        _epoch(ds)
    # rewrite the archive with other chunkings: every logged entry's tile shapes now disagree
    root = zarr.open_group(path, mode="a")
    for name, chunks in (("a", (4, 4, 3)), ("b", (8, 2, 6))):
        del root[name]
        root.create_array(name, shape=truth[name].shape, chunks=chunks, dtype="f4")[:] = truth[name]
    with caplog.at_level(logging.WARNING, logger="insitubatch"):
        with _make(str(path), cache, shuffle=False) as ds:
            _, arrays, c = _epoch(ds)
            assert c.hits == 0
            warnings = [r for r in caplog.records if "served no chunk" in r.getMessage()]
            assert len(warnings) == 1 and "rejected" in warnings[0].getMessage()
            _epoch(ds)  # same epoch again: no second warning
            assert len([r for r in caplog.records if "served no chunk" in r.getMessage()]) == 1
    np.testing.assert_array_equal(np.concatenate([a["a"] for a in arrays]), truth["a"])


def test_windowed_shuffled_persist_drops_the_residency_floor() -> None:
    # a 256-chunk training split of a longer archive, so every lead's window stays inside it
    g = ArrayGeometry("t2m", ((256 + 240) * 4, 8, 8), (4, 8, 8), (4, 8, 8), np.dtype("f4"), 0.0)
    manifest = split_by_chunk(g, fractions=(1.0,), sample_range=(0, 256 * 4))
    variables = {"x": g, "y24": g.shift(24 * 4), "y240": g.shift(240 * 4)}
    eo = epoch_order(manifest, "train", variables, block_chunks=4, shuffle=True, seed=0, epoch=0)
    held = build_plan(manifest, variables, eo.order, eo.block_starts, 16)
    released = build_plan(manifest, variables, eo.order, eo.block_starts, 16, release_per_block=True)
    chunk = g.chunk_nbytes
    held_floor, released_floor = held.working_set_bytes / chunk, released.working_set_bytes / chunk
    print(f"floor in chunks, leads (0, 24, 240), 256-chunk split: held {held_floor:.0f}, released {released_floor:.0f}")
    assert released_floor <= 3 * 3 * 4  # a few blocks of three leads
    assert held_floor > 4 * released_floor


def test_mmap_tier_unlinks_evicted_entries_and_stays_within_budget(data, tmp_path) -> None:
    path, truth = data
    cache = tmp_path / "spill"
    geoms = open_geometries(str(path))
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    with InSituDataset(str(path), manifest, geoms, cache_dir=cache, batch_size=5, block_chunks=2, seed=1) as ds:
        budget = ds.plan("train").working_set_bytes
    with InSituDataset(
        str(path), manifest, geoms, cache_dir=cache, batch_size=5, block_chunks=2, seed=1, cache_budget_bytes=budget
    ) as ds:
        files_seen = 0
        for batch in ds.train:
            np.testing.assert_array_equal(batch.arrays["a"], truth["a"][batch.sample_indices])
            sizes = [_size_or_zero(f) for f in cache.glob("*.npy")]  # eviction may unlink one as we look
            files_seen = max(files_seen, len(sizes))
            assert sum(sizes) <= 2 * budget  # headers and packed tiles: bounded by the budget
        assert ds.pool.totals.evictions > 0 and ds.pool.totals.peak_resident_bytes <= budget
        assert len(list(cache.glob("*.npy"))) == len(ds.pool)
    assert files_seen < 24 and not list(cache.glob("*.npy"))


def _size_or_zero(f: Path) -> int:
    try:
        return f.stat().st_size
    except FileNotFoundError:
        return 0
