"""Many processes, one zarr group: concurrent slot writers, claim races, a killed worker.

Processes start with the spawn context (obstore's runtime is not fork-safe).
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from write_helpers import (
    ALIGNMENT,
    EXIT_LOST,
    EXTENT,
    GROUP,
    WORKER_TIMEOUT_S,
    array_bytes,
    claim_worker,
    crash_worker,
    join_all,
    layout_spec,
    reference_store,
    write_batches,
    write_worker,
)
from zarr.storage import LocalStore

from insitubatch.errors import WriteClaimError
from insitubatch.write import (
    SlotWriter,
    clear_stale_claims,
    create_layout,
    plan_slots,
    write_status,
)

SPAWN = multiprocessing.get_context("spawn")
# Heartbeat and staleness for the killed worker: short, so the test waits little.
CRASH_HEARTBEAT_S = 0.1
CRASH_STALE_AFTER_S = 1.0
# Racers for one claim.
RACERS = 4


@pytest.fixture(scope="module")
def reference() -> dict[str, bytes]:
    return array_bytes(reference_store())


def _run_writers(store: zarr.abc.store.Store, workers: int) -> None:
    create_layout(store, layout_spec(), group=GROUP)
    plan = plan_slots(store, group=GROUP, workers=workers)
    assert len(plan.ranges) == workers
    barrier = SPAWN.Barrier(workers)
    procs = [SPAWN.Process(target=write_worker, args=(store, r.start, r.stop, barrier)) for r in plan.ranges]
    for p in procs:
        p.start()
    assert join_all(procs) == [0] * workers


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
def test_processes_write_local_store_bit_identical(tmp_path: Path, reference: dict[str, bytes], workers: int) -> None:
    store = LocalStore(tmp_path / "out.zarr")
    _run_writers(store, workers)
    assert array_bytes(store) == reference
    status = write_status(store, GROUP)
    assert status.completed == ((0, EXTENT),) and status.remaining == () and status.claims == ()
    assert plan_slots(store, group=GROUP).ranges == ()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
def test_processes_write_s3_bit_identical(write_s3_store, reference: dict[str, bytes], workers: int) -> None:
    _run_writers(write_s3_store, workers)
    assert array_bytes(write_s3_store) == reference
    assert write_status(write_s3_store, GROUP).remaining == ()


@pytest.mark.slow
def test_racing_for_one_claim_on_s3_exactly_one_wins(write_s3_store) -> None:
    create_layout(write_s3_store, layout_spec(), group=GROUP)
    ready, attempted = SPAWN.Barrier(RACERS), SPAWN.Barrier(RACERS)
    procs = [
        SPAWN.Process(target=claim_worker, args=(write_s3_store, 0, ALIGNMENT, ready, attempted)) for _ in range(RACERS)
    ]
    for p in procs:
        p.start()
    codes = join_all(procs)
    assert sorted(codes) == [0] + [EXIT_LOST] * (RACERS - 1)
    status = write_status(write_s3_store, GROUP)
    assert status.claims == () and status.coverage == ()  # the winner released without completing


@pytest.mark.invariant
@pytest.mark.slow
def test_racing_for_overlapping_claims_at_most_one_proceeds(write_s3_store) -> None:
    create_layout(write_s3_store, layout_spec(), group=GROUP)
    ranges = [(0, 2 * ALIGNMENT), (ALIGNMENT, 3 * ALIGNMENT), (0, ALIGNMENT)]
    ready, attempted = SPAWN.Barrier(len(ranges)), SPAWN.Barrier(len(ranges))
    procs = [SPAWN.Process(target=claim_worker, args=(write_s3_store, a, b, ready, attempted)) for a, b in ranges]
    for p in procs:
        p.start()
    codes = join_all(procs)
    assert set(codes) <= {0, EXIT_LOST}
    # (0, 24) overlaps both others; the other two are disjoint from each other
    winners = {r for r, c in zip(ranges, codes) if c == 0}
    assert winners in ({(0, 24)}, {(12, 36)}, {(0, 12)}, {(12, 36), (0, 12)}, set())


@pytest.mark.invariant
@pytest.mark.slow
def test_killed_worker_goes_stale_and_its_slot_is_replanned(tmp_path: Path, reference: dict[str, bytes]) -> None:
    store = LocalStore(tmp_path / "out.zarr")
    create_layout(store, layout_spec(), group=GROUP)
    plan = plan_slots(store, group=GROUP)
    victim = plan.ranges[1]
    for r in plan.ranges:  # every other slot completes normally
        if r != victim:
            with SlotWriter(store, r.start, r.stop, group=GROUP) as writer:
                write_batches(writer)

    ready = tmp_path / "ready"
    proc = SPAWN.Process(
        target=crash_worker,
        args=(store, victim.start, victim.stop, str(ready), CRASH_HEARTBEAT_S, CRASH_STALE_AFTER_S),
    )
    proc.start()
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while not ready.exists():
        assert proc.is_alive() and time.monotonic() < deadline, "crash worker never got going"
        time.sleep(0.05)
    # alive and heartbeating: the slot is in progress, not planned
    live = plan_slots(store, group=GROUP)
    assert live.ranges == () and (victim.start, victim.stop) in {(r.start, r.stop) for r in live.in_progress}
    with pytest.raises(WriteClaimError, match="live"):
        SlotWriter(store, victim.start, victim.stop, group=GROUP).open()

    proc.kill()  # SIGKILL mid-slot: no cleanup runs
    proc.join(WORKER_TIMEOUT_S)
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while not write_status(store, GROUP).stale_claims:
        assert time.monotonic() < deadline, "the dead worker's claim never went stale"
        time.sleep(CRASH_HEARTBEAT_S)

    status = write_status(store, GROUP)
    assert [(c.start, c.stop) for c in status.stale_claims] == [(victim.start, victim.stop)]
    assert status.remaining == ((victim.start, victim.stop),)  # coverage excludes the slot
    resumed = plan_slots(store, group=GROUP, resume=True)
    assert resumed.ranges == (victim,)  # only the dead slot; completed ones are never re-planned
    assert resumed.stale == (victim,)
    with pytest.raises(WriteClaimError, match="clear-stale"):
        SlotWriter(store, victim.start, victim.stop, group=GROUP).open()

    assert [(c.start, c.stop) for c in clear_stale_claims(store, GROUP)] == [(victim.start, victim.stop)]
    with SlotWriter(store, victim.start, victim.stop, group=GROUP) as writer:
        write_batches(writer)
    assert plan_slots(store, group=GROUP).ranges == ()
    assert array_bytes(store) == reference
    np.testing.assert_array_equal(
        zarr.open_array(store, path=f"{GROUP}/count")[:], zarr.open_array(reference_store(), path=f"{GROUP}/count")[:]
    )
