"""The memory bound: a pass far larger than the pool stays under what the plan predicts.

Peak traced bytes (``tracemalloc``) of a cold pass over a split many times
the pool budget are at most budget + in-flight tiles + batch buffers + a
fixed bookkeeping allowance, and every tile the pool evicts is unreferenced
at once (weak references die before the next batch).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zarr
from helpers import EvictionWatch, local_store, smooth_field, write_array

from insitubatch import InSituDataset, open_geometries, split_by_chunk

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


@pytest.mark.parametrize("transforms", [(), (_scale,)], ids=["tiles", "assembled"])
def test_a_pass_8x_the_budget_stays_under_the_bound_and_frees_evicted_chunks(store, transforms) -> None:
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    with InSituDataset(store, manifest, batch_size=8, block_chunks=2, max_inflight=8,
                       chunk_transforms=transforms) as ds:
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
