"""PassDriver on its own: it fetches a plan's reads into the pool, and stopping it cancels only its own work."""

from __future__ import annotations

import time

import numpy as np
import pytest

from insitubatch._engine.passes.driver import PassDriver
from insitubatch._engine.pool.chunk_pool import READY
from insitubatch._engine.tiles.local_groups import MAX_TILE_GROUP, tile_group

WAIT_S = 30.0  # generous: a loaded CI machine, never a hang


def driver_for(engine, plan, owner) -> PassDriver:
    ctx = engine.context
    return PassDriver(
        store=ctx.store,
        pool=ctx.pool,
        owner=owner,
        plan=plan,
        readers=ctx.readers,
        semaphore=ctx.permits(),
        executor=ctx.executor,
        on_bad_chunk=ctx.on_bad_chunk,
        bad_chunks=ctx.bad_chunks,
    )


def wait_ready(driver: PassDriver, reads) -> None:
    pool, deadline = driver.pool, time.monotonic() + WAIT_S
    with pool.cond:
        while not all(driver.entries[i] is not None and driver.entries[i].state == READY for i in reads):
            assert driver.error is None, driver.error
            assert time.monotonic() < deadline, "the driver never finished these reads"
            pool.cond.wait(0.05)


def assemble(entry, n_rows: int, inner_shape) -> np.ndarray:
    """A ready entry's tiles (sample axis first) placed at their origins: the chunk's rows."""
    out = np.full((n_rows, *inner_shape), np.nan, dtype=np.float32)
    for tile, origin in zip(entry.tiles, entry.origins):
        inner = tuple(slice(int(o), int(o) + n) for o, n in zip(origin, tile.shape[1:]))
        out[(slice(None), *inner)] = tile
    return out


def consume(driver: PassDriver, plan) -> dict[int, np.ndarray]:
    """What a producer does: wait each block, then unpin the reads whose last use it was.

    Returns each read's rows as assembled while it was pinned (an unpinned entry may be evicted).
    """
    rows = {}
    for b in range(plan.n_blocks):
        wait_ready(driver, plan.block_reads[b])
        for i in plan.block_reads[b]:
            rows.setdefault(i, assemble(driver.entries[i], 4, (6, 8)))
        for i in np.flatnonzero(plan.read_last == b):
            driver.pool.unpin(driver.entries[i], driver.owner)
    return rows


def test_a_driver_reads_every_chunk_once_and_the_tiles_are_zarrs(engine) -> None:
    plan = engine.planner.plan("train", 0)
    pool = engine.context.pool
    owner = pool.open_owner(plan.working_set_bytes, plan.read_ahead_bound, reads=len(plan.reads))
    driver = driver_for(engine, plan, owner)
    driver.start()
    try:
        rows = consume(driver, plan)
    finally:
        driver.stop()
        pool.close_owner(owner)
    chunk_keys = [k for k in engine.store.gets if k.startswith("x/c")]
    assert len(chunk_keys) == 12 * 2 and set(engine.store.gets[k] for k in chunk_keys) == {1}
    assert owner.counters.misses == len(plan.reads) and owner.counters.gets == 24
    assert sorted(rows) == list(range(len(plan.reads)))
    for i, (_path, chunk) in enumerate(plan.reads):
        np.testing.assert_array_equal(rows[i], engine.data[chunk * 4 : (chunk + 1) * 4])


def test_stopping_one_driver_cancels_its_fetches_and_leaves_anothers_running(engine) -> None:
    planner, pool = engine.planner, engine.context.pool
    plan_a = planner.make("__a__", 0, (), (0, 24), 4)
    plan_b = planner.make("__b__", 0, (), (24, 48), 4)
    owner_a = pool.open_owner(plan_a.working_set_bytes, plan_a.read_ahead_bound, reads=len(plan_a.reads))
    owner_b = pool.open_owner(plan_b.working_set_bytes, plan_b.read_ahead_bound, reads=len(plan_b.reads))
    engine.store.hold()  # every GET parks until release()
    a, b = driver_for(engine, plan_a, owner_a), driver_for(engine, plan_b, owner_b)
    a.start()
    b.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while engine.store.inflight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        a.stop()
        assert a.tasks.running() == []
        engine.store.release()
        consume(b, plan_b)
    finally:
        engine.store.release()
        a.stop()
        b.stop()
    assert not any(s is not None and s.state == READY for s in a.entries)
    assert b.error is None and b.tasks.running() == []
    abandoned = pool.close_owner(owner_a)
    assert all(s.state != READY for s in abandoned)
    pool.close_owner(owner_b)


@pytest.mark.parametrize(
    ("max_inflight", "decode_threads", "group"),
    [(32, 2, 8), (8, 2, 2), (3, 2, 1), (1, 4, 1), (128, 1, MAX_TILE_GROUP), (32, 16, 1)],
)
def test_a_tile_group_leaves_every_decode_thread_two_groups_of_the_permits(
    max_inflight: int, decode_threads: int, group: int
) -> None:
    assert tile_group(max_inflight, decode_threads) == group
    # two groups per thread fit the permits whenever a group holds more than one tile
    assert group == 1 or 2 * decode_threads * group <= max_inflight
