"""A pass on its own (``PassState`` over a ``PassContext``): zarr's rows in plan order; close stops everything it made."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from insitubatch._engine.passes.producer import PassIterator, PassState
from insitubatch.errors import DatasetClosedError

WAIT_S = 30.0


def start_pass(engine, split: str = "train", start_batch: int = 0) -> PassIterator:
    ctx = engine.context
    state = PassState(ctx, split, engine.planner.plan(split, ctx.epoch), ctx.epoch, start_batch)
    ctx.passes.add(state)
    state.start()
    return PassIterator(state)


def wait_until(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_pass_yields_zarrs_rows_in_plan_order(engine) -> None:
    plan = engine.planner.plan("train", 0)
    it = start_pass(engine)
    seen = []
    for k, batch in enumerate(it):
        assert batch.index == k and batch.offsets == {"x": 0}
        np.testing.assert_array_equal(batch.arrays["x"], engine.data[batch.sample_indices])
        seen.append(batch.sample_indices.copy())
    assert len(seen) == plan.n_batches
    np.testing.assert_array_equal(np.concatenate(seen), plan.anchors)
    assert it.counters.batches == plan.n_batches and it.stats.finished
    assert engine.context.epoch_counters == [it.counters]


def test_a_resumed_pass_starts_at_its_batch(engine) -> None:
    plan = engine.planner.plan("train", 0)
    batches = list(start_pass(engine, start_batch=plan.n_batches - 2))
    assert [b.index for b in batches] == [plan.n_batches - 2, plan.n_batches - 1]


def test_closing_a_pass_stops_its_producer_and_releases_its_pins(engine_factory) -> None:
    engine = engine_factory(prefetch_depth=1)
    it = start_pass(engine)
    state = it._state
    wait_until(lambda: state.queue.full())  # the producer is parked on a full queue
    assert state.thread.is_alive()
    it.close()
    assert not state.thread.is_alive()
    assert state.driver.tasks.running() == []
    assert state.owner.closed
    assert all(not s.pinned for s in engine.context.pool._entries.values())
    assert list(it) == []  # a pass the caller closed simply ends
    it.close()  # idempotent


def test_closing_the_context_closes_open_passes_and_their_consumer_is_told(engine) -> None:
    it = start_pass(engine)
    next(it)
    producer = it._state.thread
    engine.context.close()
    assert not producer.is_alive()
    with pytest.raises(DatasetClosedError, match="closed while this pass was open"):
        next(it)
    with pytest.raises(DatasetClosedError):
        engine.context.check_open()


def test_no_thread_outlives_a_pass(engine) -> None:
    before = {t.ident for t in threading.enumerate() if t.name == "insitu-prefetch"}
    it = start_pass(engine)
    next(it)
    it.close()
    after = {t.ident for t in threading.enumerate() if t.name == "insitu-prefetch"}
    assert after <= before
