"""The engine without a dataset: a small real zarr array, a ``PassContext`` and an ``EpochPlanner`` over it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, smooth_field, write_array

from insitubatch._engine.loop import decode_pool
from insitubatch._engine.passes.context import PassContext
from insitubatch._engine.pool.buffers import BufferPool
from insitubatch._engine.pool.chunk_pool import ChunkPool
from insitubatch._engine.reads.reader import ArrayReader
from insitubatch.io.group import open_geometries
from insitubatch.plan.planner import EpochPlanner
from insitubatch.plan.splits import split_by_chunk

SHAPE = (48, 6, 8)  # 12 sample chunks of 4, each 2 tiles along the last axis
CHUNKS = (4, 6, 4)
DECODE_THREADS = 2


@dataclass
class Engine:
    store: CountingStore
    data: np.ndarray
    context: PassContext
    planner: EpochPlanner


def make_engine(
    path,
    *,
    batch_size: int = 4,
    block_chunks: int = 2,
    prefetch_depth: int = 2,
    budget: int | None = None,
    shuffle: bool = True,
) -> Engine:
    store = CountingStore(local_store(path))
    data = np.asarray(zarr.open_array(store=local_store(path), path="x", mode="r")[...])
    g = open_geometries(store)["x"]
    readers = {"x": ArrayReader.build(g, ())}
    outputs = {"x": readers["x"].output}
    context = PassContext(
        store=store,
        readers=readers,
        outputs=outputs,
        offsets={"x": 0},
        pool=ChunkPool(budget),
        buffers=BufferPool(),
        executor=decode_pool(DECODE_THREADS),
        max_inflight=4,
        decode_threads=DECODE_THREADS,
        prefetch_depth=prefetch_depth,
        on_bad_chunk="raise",
        cache=None,
        persist=False,
        batch_transforms=(),
        sample_coords=lambda: {"sample": np.arange(SHAPE[0])},
    )
    planner = EpochPlanner(
        manifest=split_by_chunk(g, fractions=(1.0,)),
        outputs=outputs,
        batch_size=batch_size,
        block_chunks=block_chunks,
        shuffle=shuffle,
        seed=0,
        rank=0,
        world_size=1,
        last_batch=None,
        release_per_block=False,
    )
    return Engine(store, data, context, planner)


@pytest.fixture
def engine_path(tmp_path):
    path = tmp_path / "e.zarr"
    root = zarr.open_group(store=local_store(path, read_only=False), mode="w")
    write_array(root, "x", smooth_field(np.random.default_rng(0), SHAPE), CHUNKS)
    return path


@pytest.fixture
def engine_factory(engine_path):
    """``make(**options)``: an engine over the test's array; every one made is closed after the test."""
    made: list[Engine] = []

    def make(**options) -> Engine:
        made.append(make_engine(engine_path, **options))
        return made[-1]

    yield make
    for e in made:
        e.context.close()


@pytest.fixture
def engine(engine_factory) -> Engine:
    return engine_factory()
