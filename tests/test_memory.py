"""The memory bound: a pass far larger than the pool stays under what the plan predicts.

Peak traced bytes (``tracemalloc``) of a cold pass over a split many times
the pool budget are at most budget + in-flight tiles + batch buffers + a
fixed bookkeeping allowance, and every tile the pool evicts is unreferenced
at once (weak references die before the next batch).
"""

from __future__ import annotations

import fnmatch
import tracemalloc

import numpy as np
import pytest
import zarr
from helpers import EvictionWatch, assert_batch_matches, local_store, smooth_field, write_array

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch._engine.pool.chunk_pool import READY, ChunkPool

N = 512
FIELD = (64, 96)
STORED = (4, 32, 48)  # 2x2 tiles of 24 KB per sample-axis chunk of 4 samples
# the split must dwarf the pool for eviction, not the budget, to bound memory
SPLIT_OVER_BUDGET = 8
# a pass's own bookkeeping beside the data: plan arrays, threads, zarr's buffers and metadata
BOOKKEEPING_BYTES = 1_000_000


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("mem") / "m.zarr"
    root = zarr.open_group(path, mode="w")
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        write_array(root, name, smooth_field(rng, (N, *FIELD)), STORED)
    return local_store(path)


def _bound(ds: InSituDataset) -> int:
    """Budget + decoded tiles in flight + every batch buffer a pass can hold + bookkeeping."""
    tile = max(g.stored_chunk_nbytes for g in ds.variables.values())
    batch = ds.batch_size * sum(g.sample_nbytes for g in ds.outputs.values())
    # queued batches, the one being gathered and the one the consumer holds
    buffers = (ds.prefetch_depth + 2) * batch
    return ds.pool.budget + ds.max_inflight * tile + buffers + BOOKKEEPING_BYTES


def _scale(chunk):
    chunk.data *= 2.0
    return chunk


@pytest.mark.invariant
@pytest.mark.parametrize("transforms", [(), (_scale,)], ids=["tiles", "assembled"])
def test_a_pass_8x_the_budget_stays_under_the_bound_and_frees_evicted_chunks(store, transforms) -> None:
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    with InSituDataset(
        store, manifest, batch_size=8, block_chunks=2, max_inflight=8, chunk_transforms=transforms
    ) as ds:
        plan = ds.train.plan()
        assert plan.read_nbytes.sum() >= SPLIT_OVER_BUDGET * plan.working_set_bytes
        watch = EvictionWatch(ds.pool)
        tracemalloc.start()
        try:
            it = iter(ds.train)
            bound, budget = _bound(ds), ds.pool.budget
            assert budget == plan.working_set_bytes
            for _batch in it:  # held while the tiles are checked, as a consumer would
                live = watch.alive()
                assert not live, f"{len(live)} evicted tiles still referenced; {watch.holders()}"
                del live
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert watch.evicted >= len(plan.reads) - plan.read_ahead_bound
        assert ds.pool.totals.peak_resident_bytes <= budget
        assert peak <= bound, f"peak traced {peak} bytes over the bound {bound}"
        print(f"peak {peak} bound {bound} budget {budget} split {plan.read_nbytes.sum()}")


# -- recycled tiles: evicted decoded memory reused by later decodes -------------------
TILE = (4, 3, 5)
F4 = np.dtype(np.float32)
ORIGINS = np.zeros((1, 2), dtype=np.intp)


def _ready_entry(pool: ChunkPool, owner, key, tiles: list[np.ndarray], recyclable: bool = True):
    entry = pool.admit(key, sum(t.nbytes for t in tiles), np.zeros((len(tiles), 2), dtype=np.intp), owner, recyclable)
    assert entry is not None
    pool.deliver_many([(entry, i, t) for i, t in enumerate(tiles)])
    assert entry.state == READY
    return entry


def _drain_free(pool: ChunkPool) -> list[np.ndarray]:
    """Every tile the free list holds for ``TILE`` (take_tile hands out new memory once it is empty)."""
    taken = []
    while pool.free.nbytes:
        before = pool.totals.recycled_tiles
        tile = pool.take_tile(TILE, F4)
        assert pool.totals.recycled_tiles == before + 1, "free bytes left, but not of this shape"
        taken.append(tile)
    return taken


def test_a_recycled_tile_is_never_one_something_else_still_references() -> None:
    one = np.empty(TILE, F4).nbytes
    pool = ChunkPool(3 * one)
    owner = pool.open_owner(3 * one, 4)
    unreferenced, viewed, held = (np.full(TILE, k, F4) for k in range(3))
    view = viewed[1:]  # a zero-copy batch or tensor over a tile references it
    entry = _ready_entry(pool, owner, ("a", 0), [unreferenced, viewed, held])
    free_id, viewed_id = id(unreferenced), id(viewed)
    del unreferenced, viewed
    pool.unpin(entry, owner)
    # evicting it for the next read keeps only the tile nobody else references
    nxt = pool.admit(("a", 1), 3 * one, np.zeros((3, 2), dtype=np.intp), owner, True)
    assert nxt is not None and pool.totals.evictions == 1
    assert [id(t) for t in _drain_free(pool)] == [free_id]
    assert id(view.base) == viewed_id and (held == 2).all()


def test_tiles_the_decode_does_not_own_are_never_recycled() -> None:
    one = np.empty(TILE, F4).nbytes
    pool = ChunkPool(one)
    owner = pool.open_owner(one, 4)
    # a transform's output or a disk-cache mapping lands through replace_tiles
    replaced = pool.admit(("a", 0), one, ORIGINS, owner, True)
    assert pool.replace_tiles(replaced, [np.zeros(TILE, F4)], ORIGINS) and not replaced.recyclable
    pool.unpin(replaced, owner)
    # a tile that views another array's memory
    viewing = None
    for key, tile, recyclable in ((("a", 1), np.zeros((2, *TILE), F4)[0], True), (("a", 2), np.zeros(TILE, F4), False)):
        if viewing is not None:
            pool.unpin(viewing, owner)
        viewing = _ready_entry(pool, owner, key, [tile], recyclable)
        del tile
    pool.unpin(viewing, owner)
    assert pool.admit(("a", 3), one, ORIGINS, owner, True) is not None
    assert pool.totals.evictions == 3 and pool.free.nbytes == 0


def test_pinned_tiles_are_never_recycled_and_clear_lets_the_free_list_go() -> None:
    one = np.empty(TILE, F4).nbytes
    pool = ChunkPool(2 * one)
    owner = pool.open_owner(2 * one, 4)
    pinned = _ready_entry(pool, owner, ("a", 0), [np.zeros(TILE, F4)])
    unpinned = _ready_entry(pool, owner, ("a", 1), [np.ones(TILE, F4)])
    pool.unpin(unpinned, owner)
    third = pool.admit(("a", 2), one, ORIGINS, owner, True)
    assert third is not None and pool.contains(("a", 0)) and not pool.contains(("a", 1))
    taken = _drain_free(pool)
    assert len(taken) == 1 and taken[0] is not pinned.tiles[0] and (pinned.tiles[0] == 0).all()
    # the free list holds no more than the pending reads await: here the one read admitted
    assert pool.free.nbytes == 0
    pool.deliver(third, 0, taken[0])
    pool.unpin(unpinned, owner)
    pool.unpin(pinned, owner)
    pool.unpin(third, owner)
    assert pool.free.keep([np.zeros(TILE, F4)], one) == 0  # as an eviction would leave it
    assert pool.free.nbytes == one
    pool.clear()
    assert pool.free.nbytes == 0 and pool.free.take(TILE, F4) is None and len(pool) == 0


def _keeping(kept: list):
    def keep(chunk):
        kept.append((chunk.data, chunk.data.copy()))  # the transform holds its input after returning it
        return chunk

    return keep


@pytest.mark.parametrize("keep_inputs", [False, True], ids=["tiles", "kept-by-a-transform"])
def test_recycled_tiles_never_leak_stale_data_into_batches(tmp_path, keep_inputs) -> None:
    # edge tiles clipped on both inner axes and a short last chunk: each tile shape recycles on its own
    data = smooth_field(np.random.default_rng(11), (45, 13, 22))
    root = zarr.open_group(tmp_path / "r.zarr", mode="w")
    write_array(root, "v", data, (4, 5, 8))
    write_array(root, "w", -data, (4, 5, 8))
    store = local_store(tmp_path / "r.zarr")
    oracle = {name: zarr.open_array(store, path=name)[...] for name in ("v", "w")}
    manifest = split_by_chunk(open_geometries(store)["v"], fractions=(1.0,))
    kept: list = []
    with InSituDataset(
        store,
        manifest,
        batch_size=3,
        block_chunks=1,
        max_inflight=4,
        chunk_transforms=[_keeping(kept)] if keep_inputs else (),
    ) as ds:
        held = []
        for epoch in range(2):
            ds.train.set_epoch(epoch)
            for batch in ds.train:
                assert_batch_matches(batch, ds.variables, oracle)
                held.append((batch, {k: a.copy() for k, a in batch.arrays.items()}))
        # the passes went far past the budget: tiles were evicted, and reused unless a transform owns them
        assert ds.pool.totals.evictions > 0
        assert (ds.pool.totals.recycled_tiles > 0) is not keep_inputs
        for batch, copies in held:  # nothing a batch or a transform still holds was ever overwritten
            for k, a in batch.arrays.items():
                np.testing.assert_array_equal(a, copies[k])
        for array, snapshot in kept:
            np.testing.assert_array_equal(array, snapshot)


# -- the bound under max_inflight="auto" on a remote store ---------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The module's arrays behind a loopback HTTP store in its own process, 10 ms away (its allocations are
    not this process's)."""
    from insitubatch.testing.emulator import EmulatorProcess

    root = tmp_path_factory.mktemp("served")
    group = zarr.open_group(root / "m.zarr", mode="w")
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        write_array(group, name, smooth_field(rng, (N, *FIELD)), STORED)
    data = {name: zarr.open_array(root / "m.zarr" / name, mode="r")[...] for name in ("a", "b")}
    with EmulatorProcess(root, latency_s=0.01, jitter_s=0.002) as emu:
        yield emu.url_for("m.zarr"), data


@pytest.mark.parametrize("block_chunks", [2, None], ids=["small-blocks", "default-blocks"])
def test_auto_concurrency_on_a_remote_store_stays_within_describes_bound(served, block_chunks) -> None:
    """At default knobs ("auto" reads in flight, the automatic budget) over HTTP, two passes (a cold one,
    whose window climbs, and a warm one) hold no more than ``describe()``'s ``total_bytes``: the pool within
    its budget, the reads in flight within the plan's, decoded tiles, bodies and batches all traced."""
    from insitubatch import obstore_store

    url, data = served
    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=["a", "b"])
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    knobs = {} if block_chunks is None else {"block_chunks": block_chunks}
    with InSituDataset(store, manifest, geoms, batch_size=8, **knobs) as ds:
        memory = ds.describe()["memory"]
        assert memory["inflight_auto"] and ds.max_inflight == "auto"
        tracemalloc.start()
        try:
            peaks = []
            for epoch in range(2):
                ds.set_epoch(epoch)
                seen = 0
                for batch in ds.train:
                    assert_batch_matches(batch, ds.variables, data)
                    seen += len(batch)
                assert seen == len(manifest.sample_indices("train"))
                peaks.append(ds.train.last_pass.inflight_peak)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert max(peaks) <= memory["inflight_tiles"]
        assert ds.pool.totals.peak_resident_bytes <= memory["working_set_bytes"] + memory["read_ahead_bytes"]
        assert peak <= memory["total_bytes"] + BOOKKEEPING_BYTES, f"peak traced {peak} over {memory['total_bytes']}"
        print(f"auto: peak traced {peak} bound {memory['total_bytes']} in flight {peaks} of {memory['inflight_tiles']}")


# our code that allocates what a held shard index keeps: its entries (``io/chain.py``) and its slot
INDEX_CODE = ("*/insitubatch/io/chain.py", "*/insitubatch/_engine/reads/shard_index.py")
# besides the held indexes: numpy's cache of freed small blocks (bounded), the index codec chain's buffers
INDEX_CODE_ALLOWANCE = 64_000


def _index_pass(tmp_path, steps: int, shards_held: int) -> tuple[int, int, int]:
    """One pass over ``steps`` shards with room for ``shards_held`` indexes: ``(bytes our index code still holds
    allocated afterwards, the budget, one index's held_index_bytes)``."""
    from insitubatch._engine.reads import shard_index
    from insitubatch.io.decode import shard_stage

    root = zarr.open_group(tmp_path / f"s{steps}.zarr", mode="w", zarr_format=3)
    root.create_array(
        "v", shape=(steps, 16, 16), chunks=(1, 4, 4), shards=(1, 16, 16), dtype="f4", dimension_names=("t", "y", "x")
    )[...] = np.arange(steps * 256, dtype="f4").reshape(steps, 16, 16)
    store = local_store(tmp_path / f"s{steps}.zarr")
    g = open_geometries(store)["v"]
    each = shard_index.held_index_bytes(shard_stage(g))
    budget = shards_held * each
    shard_index_budget = shard_index.SHARD_INDEX_BUDGET_BYTES
    shard_index.SHARD_INDEX_BUDGET_BYTES = budget
    try:
        with InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), {"v": g}, batch_size=64, block_chunks=8) as ds:
            assert ds.describe()["memory"]["shard_index_bytes"] == min(budget, steps * each)  # (not steps x each)
            tracemalloc.start(1)
            try:
                for _ in ds.train:
                    pass
                snapshot = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            assert ds.context.shard_indexes.gets == steps  # every shard's index read, all but the last few let go
            assert ds.train.last_pass.gets == ds.describe()["splits"]["train"]["gets"]
    finally:
        shard_index.SHARD_INDEX_BUDGET_BYTES = shard_index_budget
    held = sum(t.size for t in snapshot.traces if any(fnmatch.fnmatch(t.traceback[-1].filename, c) for c in INDEX_CODE))
    return held, budget, each


@pytest.mark.invariant
@pytest.mark.slow
def test_shard_indexes_held_stay_within_the_budget_however_many_shards_a_pass_reads(tmp_path) -> None:
    """A pass over 128 or 512 shards holds the same bounded few indexes afterwards: the budget ``describe()``
    states, not one index per shard read.

    512 shards suffice: an index kept per shard would hold 512 x ~1.3 kB, over 5 times the budget and allowance.
    """
    few, budget, each = _index_pass(tmp_path, 128, 16)
    many, _, _ = _index_pass(tmp_path, 512, 16)
    assert 512 * each > 5 * (budget + INDEX_CODE_ALLOWANCE)  # (what the sizes above are chosen for)
    assert few <= budget + INDEX_CODE_ALLOWANCE and many <= budget + INDEX_CODE_ALLOWANCE, (few, many, budget)
    assert many - few < 16 * each  # keeping every index would hold (512 - 128) x each more
