"""SlotWriter(write_behind=N): writes land on the writer's thread, bounded, errors raised, a kill loses nothing."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from behind_helpers import GatedStore, killed_behind_worker
from write_helpers import (
    BATCH,
    EXTENT,
    GROUP,
    WORKER_TIMEOUT_S,
    array_bytes,
    layout_spec,
    predictions,
    reference_store,
    write_batches,
)
from zarr.storage import LocalStore, MemoryStore

from insitubatch.errors import WriteBehindError, WriteClaimError
from insitubatch.write import SlotWriter, clear_stale_claims, create_layout, plan_slots, write_status

SPAWN = multiprocessing.get_context("spawn")
# No heartbeat fires while a test runs.
QUIET_HEARTBEAT_S = 600.0
QUIET_STALE_AFTER_S = 1200.0
DEPTH = 2
# How long a call that must stay blocked is watched (it would return at once if nothing held it).
BLOCKED_WATCH_S = 0.3
# Seconds each chunk write of the killed worker takes: its queue stays full until the kill.
KILLED_DELAY_S = 0.2


def _behind_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("insitu-write-behind")]


def _writer(store, start: int = 0, stop: int = EXTENT, **options) -> SlotWriter:
    options.setdefault("write_behind", DEPTH)
    return SlotWriter(
        store, start, stop, group=GROUP, heartbeat_s=QUIET_HEARTBEAT_S, stale_after_s=QUIET_STALE_AFTER_S, **options
    )


@pytest.fixture
def gated() -> GatedStore:
    store = GatedStore(MemoryStore())
    create_layout(store, layout_spec(), group=GROUP)
    return store


def test_write_behind_store_equals_the_synchronous_one(gated: GatedStore) -> None:
    with _writer(gated) as writer:
        assert len(_behind_threads()) == 1
        write_batches(writer)
    assert _behind_threads() == []  # the thread ends with the writer
    assert array_bytes(gated) == array_bytes(reference_store())
    assert write_status(gated, GROUP).remaining == ()
    pred = zarr.open_array(gated, path=f"{GROUP}/pred", mode="r")[:]
    np.testing.assert_array_equal(pred, predictions(0, EXTENT)["pred"])


def test_the_caller_may_reuse_its_buffer_at_once(gated: GatedStore) -> None:
    buffer = np.empty((BATCH, 3, 8), dtype=np.float32)
    gated.close_gate()  # nothing lands before every call returned
    with _writer(gated, 0, 12, write_behind=3) as writer:
        for lo in (0, 5):
            buffer[:] = predictions(lo, lo + BATCH)["pred"]
            writer.write("pred", (lo, lo + BATCH), buffer)
        buffer[:] = -1  # overwritten before the writes land
        gated.open_gate()
    pred = zarr.open_array(gated, path=f"{GROUP}/pred", mode="r")[:10]
    np.testing.assert_array_equal(pred, predictions(0, 10)["pred"])


def test_at_most_n_writes_are_held_and_the_next_waits(gated: GatedStore) -> None:
    gated.close_gate()
    writer = _writer(gated, 0, 24).open()
    try:
        for lo in (0, 5):  # DEPTH writes queue and return while none can land
            writer.write("pred", (lo, lo + BATCH), predictions(lo, lo + BATCH)["pred"])
        third = threading.Thread(target=writer.write, args=("pred", (10, 15), predictions(10, 15)["pred"]))
        third.start()
        third.join(BLOCKED_WATCH_S)
        assert third.is_alive()  # back-pressure: the caller waits for a place
        assert gated.chunk_sets == 0
        gated.open_gate()
        third.join(WORKER_TIMEOUT_S)
        assert not third.is_alive()
        writer.flush()
        pred = zarr.open_array(gated, path=f"{GROUP}/pred", mode="r")[:15]
        np.testing.assert_array_equal(pred, predictions(0, 15)["pred"])
    finally:
        gated.open_gate()
        writer.close()
    assert _behind_threads() == []


def _failing_store() -> GatedStore:
    # pred has shards of 6: indices [0, 5) land in shard 0, the one that fails
    store = GatedStore(MemoryStore(), fail_keys=frozenset({f"{GROUP}/pred/c/0/0/0"}))
    create_layout(store, layout_spec(), group=GROUP)
    return store


def test_a_failed_write_raises_at_the_next_call_and_records_nothing() -> None:
    store = _failing_store()
    with pytest.raises(WriteBehindError, match=r"'pred' at \[0, 5\).*OSError: injected failure") as info:
        with _writer(store, 0, 12) as writer:
            writer.write("pred", (0, 5), predictions(0, 5)["pred"])
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            while True:  # the next call after the failure raises it
                writer.write("count", (0, 5), predictions(0, 5)["count"])
                assert time.monotonic() < deadline
    assert isinstance(info.value.__cause__, OSError)
    status = write_status(store, GROUP)
    assert status.claims == () and status.completed == ()  # released, nothing recorded
    assert _behind_threads() == []


def test_a_failed_write_raises_at_the_clean_exit_and_the_later_writes_are_not_made() -> None:
    store = _failing_store()
    store.close_gate()
    with pytest.raises(WriteBehindError, match=r"'pred' at \[0, 5\)"):
        with _writer(store, 0, 12) as writer:
            writer.write("pred", (0, 5), predictions(0, 5)["pred"])
            writer.write("pred", (6, 11), predictions(6, 11)["pred"])  # queued behind the failure
            store.open_gate()
    assert store.chunk_sets == 0  # nothing after the failed write landed
    status = write_status(store, GROUP)
    assert status.claims == () and status.completed == ()
    assert (0, 12) in {(r.start, r.stop) for r in plan_slots(store, group=GROUP).ranges}


def test_a_failed_write_nobody_saw_raises_at_close_and_the_claim_is_released() -> None:
    store = _failing_store()
    writer = _writer(store, 0, 12).open()
    writer.write("pred", (0, 5), predictions(0, 5)["pred"])
    assert store.failed.wait(WORKER_TIMEOUT_S)  # the write failed in the background, unseen
    with pytest.raises(WriteBehindError, match="injected failure"):
        writer.close()
    writer.close()  # idempotent, and the error is not raised twice
    assert write_status(store, GROUP).claims == ()
    assert _behind_threads() == []


def test_an_exception_in_the_body_drops_the_queued_writes_and_records_nothing(gated: GatedStore) -> None:
    gated.close_gate()
    opener = threading.Timer(BLOCKED_WATCH_S, gated.open_gate)  # the write in flight lands while the exit waits
    with pytest.raises(RuntimeError, match="model blew up"):
        with _writer(gated, 0, 24) as writer:
            writer.write("pred", (0, 5), predictions(0, 5)["pred"])  # shard [0, 6): taken by the thread, held
            assert gated.parked.wait(WORKER_TIMEOUT_S)  # (in flight, not still queued, when the body raises)
            writer.write("pred", (12, 17), predictions(12, 17)["pred"])  # shards [12, 18): queued behind it
            opener.start()
            raise RuntimeError("model blew up")
    opener.join()
    pred = zarr.open_array(gated, path=f"{GROUP}/pred", mode="r")[:]
    np.testing.assert_array_equal(pred[:5], predictions(0, 5)["pred"])  # the write in flight finished
    assert np.isnan(pred[12:17]).all()  # the queued one was dropped
    assert gated.chunk_sets == 1
    status = write_status(gated, GROUP)
    assert status.claims == () and status.completed == ()
    assert _behind_threads() == []


def test_a_lost_claim_stops_the_queued_writes(gated: GatedStore) -> None:
    gated.close_gate()
    writer = _writer(gated, 0, 12, force=False).open()
    writer.write("pred", (0, 5), predictions(0, 5)["pred"])
    writer.write("pred", (6, 11), predictions(6, 11)["pred"])
    clear_stale_claims(gated, GROUP, now=time.time() + 2 * QUIET_STALE_AFTER_S)  # judged dead, taken away
    gated.open_gate()
    with pytest.raises((WriteBehindError, WriteClaimError)):
        writer.complete()
    assert write_status(gated, GROUP).completed == ()
    writer.close()
    assert _behind_threads() == []


def test_write_behind_is_validated() -> None:
    with pytest.raises(ValueError, match="write_behind=-1 must be >= 0"):
        SlotWriter(MemoryStore(), 0, 12, write_behind=-1)
    with pytest.raises(TypeError, match="write_behind must be an int"):
        SlotWriter(MemoryStore(), 0, 12, write_behind=2.5)


@pytest.mark.invariant
@pytest.mark.slow
def test_a_worker_killed_mid_queue_resumes_to_the_synchronous_store(tmp_path: Path) -> None:
    path = tmp_path / "o.zarr"
    store = LocalStore(path)
    create_layout(store, layout_spec(), group=GROUP)
    ready = tmp_path / "ready"
    proc = SPAWN.Process(target=killed_behind_worker, args=(str(path), 0, EXTENT, DEPTH, str(ready), KILLED_DELAY_S))
    proc.start()
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while not ready.exists():
            assert proc.is_alive() and time.monotonic() < deadline, "the write-behind worker never got going"
            time.sleep(0.01)
        proc.kill()  # SIGKILL with writes queued: nothing runs after this
        proc.join(WORKER_TIMEOUT_S)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    reference = array_bytes(reference_store())
    assert array_bytes(store) != reference  # killed mid-way: some writes never landed
    assert write_status(store, GROUP).completed == ()  # and the range was not recorded
    cleared = clear_stale_claims(store, GROUP, now=time.time() + 2 * QUIET_STALE_AFTER_S)
    assert [(c.start, c.stop) for c in cleared] == [(0, EXTENT)]
    assert write_status(store, GROUP).remaining == ((0, EXTENT),)  # all of it is planned again
    assert plan_slots(store, group=GROUP).ranges[-1].stop == EXTENT
    with _writer(store, 0, EXTENT) as writer:
        write_batches(writer)
    assert array_bytes(store) == reference
    assert write_status(store, GROUP).remaining == ()
