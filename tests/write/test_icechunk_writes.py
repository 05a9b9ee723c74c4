"""Slot writes on icechunk as one transaction: a fork per worker, merged, committed once.

Workers run in spawned processes (icechunk's local storage is not fork-safe):
a ``ProcessPoolExecutor`` under ``run_plan``, and SLURM array elements that
hand their forks back through a shared directory. One worker is SIGKILLed in
the middle of its slot after writing part of it wrong; its slot is planned
again and rewritten, and the committed snapshot holds every slot exactly
once, equal to the numpy reference, with nothing of the killed worker's.
Until the commit the branch stays on the layout's snapshot.
"""

from __future__ import annotations

import functools
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from icechunk_helpers import POISON, crash_once, poison, scheduler_task, slot_fork
from write_helpers import ALIGNMENT, EXTENT, GROUP, WORKER_TIMEOUT_S, layout_spec, predictions, write_batches

from insitubatch.errors import WriteClaimError, WriteConflictError
from insitubatch.stores.icechunk_stores import icechunk_store
from insitubatch.write import (
    IcechunkTransaction,
    SlotWriter,
    clear_handoff,
    create_layout,
    icechunk_fork,
    plan_slots,
    run_plan,
    write_status,
)

icechunk = pytest.importorskip("icechunk")

SPAWN = multiprocessing.get_context("spawn")
WORKERS = 2
INDEXED = ("pred", "count")


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    """A repository whose branch ``main`` holds the committed layout (every array at its full extent)."""
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    create_layout(session.store, layout_spec(), group=GROUP)
    session.commit("layout")
    return repo


def _arrays(repo: Any, **version: str) -> dict[str, np.ndarray]:
    store = repo.readonly_session(**version).store
    return {name: zarr.open_array(store, path=f"{GROUP}/{name}", mode="r")[...] for name in INDEXED}


def _assert_untouched(repo: Any, **version: str) -> None:
    """The layout's fill values: NaN predictions, zero counts."""
    arrays = _arrays(repo, **version)
    assert np.isnan(arrays["pred"]).all() and (arrays["count"] == 0).all()


def _assert_committed(repo: Any, snapshot: str, slots: list[tuple[int, int]]) -> None:
    """The snapshot equals the reference, and records each slot complete exactly once."""
    arrays = _arrays(repo, snapshot_id=snapshot)
    want = predictions(0, EXTENT)
    for name in INDEXED:
        np.testing.assert_array_equal(arrays[name], want[name])
        assert not (arrays[name] == POISON).any()
    status = write_status(repo.readonly_session(snapshot_id=snapshot).store, GROUP)
    assert status.completed == ((0, EXTENT),) and status.remaining == () and status.claims == ()
    assert sorted((c.start, c.stop) for c in status.coverage) == sorted(slots)


def _ranges(plan: Any) -> list[tuple[int, int]]:
    return [(r.start, r.stop) for r in plan.ranges]


def test_processes_write_one_commit_and_a_killed_workers_slot_is_rewritten(repo: Any, tmp_path: Path) -> None:
    layout = repo.lookup_branch("main")
    tx = IcechunkTransaction(repo, "main")
    plan = plan_slots(tx.store, group=GROUP, slot_size=ALIGNMENT)
    slots = _ranges(plan)
    assert len(slots) == 4
    victim = slots[1][0]
    work = functools.partial(crash_once, str(tmp_path / "crashed"), victim)

    with ProcessPoolExecutor(WORKERS, mp_context=SPAWN) as pool:
        report = run_plan(tx, plan, work, pool, raise_on_error=False)
    failed = {(o.start, o.stop) for o in report.failed}
    assert (tmp_path / "crashed").exists() and slots[1] in failed  # killed mid-slot, with poison written
    assert set(tx.merged) == set(slots) - failed
    assert repo.lookup_branch("main") == layout  # readers still see the layout's snapshot
    _assert_untouched(repo, branch="main")

    again = plan_slots(tx.store, group=GROUP, slot_size=ALIGNMENT)
    assert set(_ranges(again)) == failed  # exactly what did not come back
    with ProcessPoolExecutor(WORKERS, mp_context=SPAWN) as pool:
        assert run_plan(tx, again, work, pool).ok
    assert tx.merged == tuple(slots) and repo.lookup_branch("main") == layout
    _assert_untouched(repo, branch="main")

    snapshot = tx.commit("predictions")
    assert [s.id for s in repo.ancestry(branch="main")][:2] == [snapshot, layout]  # one commit for every slot
    _assert_committed(repo, snapshot, slots)
    _assert_untouched(repo, snapshot_id=layout)  # the previous snapshot is as it was


@pytest.mark.parametrize("executor", ["threads", "serial"])
def test_threads_or_no_executor_give_the_same_snapshot(repo: Any, executor: str) -> None:
    tx = IcechunkTransaction(repo)
    plan = plan_slots(tx.store, group=GROUP, workers=3)
    if executor == "threads":
        with ThreadPoolExecutor(WORKERS) as pool:
            report = run_plan(tx, plan, write_batches, pool)
    else:
        report = run_plan(tx, plan, write_batches)
    assert report.ok and all(o.session is None for o in report.outcomes)  # the forks stay with the transaction
    _assert_committed(repo, tx.commit("predictions"), _ranges(plan))


def test_a_second_fork_of_a_merged_slot_fails_the_merge_naming_what_clashed(repo: Any) -> None:
    tx = IcechunkTransaction(repo)
    first, second = slot_fork(tx, 0, ALIGNMENT), slot_fork(tx, 0, ALIGNMENT, values=poison(0, ALIGNMENT))
    assert tx.merge(first) == ((0, ALIGNMENT),)
    with pytest.raises(WriteConflictError) as info:
        tx.merge(second)
    text = str(info.value)
    assert "array 'out/pred': chunks (0, 0, 0), (1, 0, 0) written by both the fork of slot [0, 12)" in text
    assert "array 'out/count': chunks (0,), (1,), (2,)" in text
    assert "slot [0, 12) recorded complete by both" in text and "Nothing of it was merged" in text
    assert len(info.value.conflicts) == 3
    assert tx.merged == ((0, ALIGNMENT),)
    tx.merge(slot_fork(tx, ALIGNMENT, EXTENT))
    snapshot = tx.commit("predictions")
    _assert_committed(repo, snapshot, [(0, ALIGNMENT), (ALIGNMENT, EXTENT)])  # the clashing fork left no trace


def test_a_fork_of_another_transaction_is_refused(repo: Any) -> None:
    old = IcechunkTransaction(repo)
    stale = slot_fork(old, 0, ALIGNMENT)
    done = IcechunkTransaction(repo)
    done.merge(slot_fork(done, ALIGNMENT, 2 * ALIGNMENT))
    done.commit("one slot")
    tx = IcechunkTransaction(repo)
    with pytest.raises(WriteConflictError, match=r"forked from snapshot \w+, but this transaction .* started from"):
        tx.merge(stale)
    with pytest.raises(ValueError, match="cannot fork any more"):
        done.fork()
    with pytest.raises(ValueError, match="no fork was merged"):
        tx.commit("empty")
    with pytest.raises(ValueError, match=r"branch='dev' is not a branch .* it has \['main'\]"):
        IcechunkTransaction(repo, "dev")
    with pytest.raises(WriteClaimError, match=r"\[12, 24\) is already completed"):
        slot_fork(tx, ALIGNMENT, 2 * ALIGNMENT)  # a committed slot is not written again


def test_a_commit_on_the_same_chunks_meanwhile_fails_the_commit(repo: Any) -> None:
    tx = IcechunkTransaction(repo)
    tx.merge(slot_fork(tx, 0, ALIGNMENT))
    other = repo.writable_session("main")
    zarr.open_array(other.store, path=f"{GROUP}/pred", mode="r+")[0:2] = 5.0
    moved = other.commit("someone else's write")
    with pytest.raises(WriteConflictError, match=r"Chunk double update at 'out/pred': chunk \(0, 0, 0\)") as info:
        tx.commit("predictions")
    assert "Nothing was committed" in str(info.value) and info.value.conflicts
    assert repo.lookup_branch("main") == moved


def test_a_commit_elsewhere_meanwhile_is_rebased_onto(repo: Any) -> None:
    tx = IcechunkTransaction(repo)
    tx.merge(slot_fork(tx, 0, ALIGNMENT))
    other = repo.writable_session("main")
    zarr.open_array(other.store, path=f"{GROUP}/pred", mode="r+")[EXTENT - 2 :] = 5.0  # the last shard
    moved = other.commit("someone else's write")
    snapshot = tx.commit("predictions")
    assert [s.id for s in repo.ancestry(branch="main")][:2] == [snapshot, moved]
    pred = _arrays(repo, snapshot_id=snapshot)["pred"]
    np.testing.assert_array_equal(pred[:ALIGNMENT], predictions(0, ALIGNMENT)["pred"])
    assert (pred[EXTENT - 2 :] == 5.0).all()


def _slurm_env(plan_file: Path, task: int, count: int) -> dict[str, str]:
    return {
        "INSITUBATCH_SLOT_PLAN": str(plan_file),
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_COUNT": str(count),
    }


def _run_tasks(handoff: str, envs: list[dict[str, str]], marker: Path, victim: int) -> list[int | None]:
    procs = [SPAWN.Process(target=scheduler_task, args=(handoff, env, str(marker), victim)) for env in envs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WORKER_TIMEOUT_S)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return codes


def test_scheduler_tasks_hand_their_forks_back_through_a_shared_directory(repo: Any, tmp_path: Path) -> None:
    layout = repo.lookup_branch("main")
    tx = IcechunkTransaction(repo)
    plan = plan_slots(tx.store, group=GROUP, slot_size=ALIGNMENT)
    slots = _ranges(plan)
    plan_file = tmp_path / "plan.json"
    plan.save(plan_file)
    handoff = str(tmp_path / "handoff")
    tx.hand_off(handoff)
    with pytest.raises(FileExistsError, match="already holds a transaction"):
        tx.hand_off(handoff)
    marker = tmp_path / "crashed"
    envs = [_slurm_env(plan_file, task, len(slots)) for task in range(len(slots))]

    codes = _run_tasks(handoff, envs, marker, victim=slots[2][0])
    assert codes == [0, 0, -signal.SIGKILL, 0]
    collected = IcechunkTransaction.collect(repo, handoff)
    assert set(collected.merged) == set(slots) - {slots[2]}
    assert _ranges(plan_slots(collected.store, group=GROUP, slot_size=ALIGNMENT)) == [slots[2]]
    assert repo.lookup_branch("main") == layout

    # the array element that died runs again; a finished one runs twice (its new fork replaces its old one)
    assert _run_tasks(handoff, [envs[2], envs[0]], marker, victim=slots[2][0]) == [0, 0]
    collected = IcechunkTransaction.collect(repo, handoff)  # collecting again starts over: nothing merged twice
    assert collected.merged == tuple(slots)
    _assert_untouched(repo, branch="main")
    snapshot = collected.commit("predictions")
    _assert_committed(repo, snapshot, slots)
    with pytest.raises(FileNotFoundError, match="holds no transaction.json"):
        IcechunkTransaction.collect(repo, handoff)  # the commit cleared the handoff


def test_collect_refuses_forks_whose_chunks_the_branch_changed_since_the_handoff(repo: Any, tmp_path: Path) -> None:
    tx = IcechunkTransaction(repo)
    handoff = tmp_path / "handoff"
    tx.hand_off(handoff)
    for start, stop in ((0, ALIGNMENT), (ALIGNMENT, 2 * ALIGNMENT)):
        with icechunk_fork(handoff) as store, SlotWriter(store, start, stop, group=GROUP) as writer:
            write_batches(writer)
    with pytest.raises(RuntimeError, match="model blew up"), icechunk_fork(handoff) as store:
        with SlotWriter(store, 2 * ALIGNMENT, 3 * ALIGNMENT, group=GROUP) as writer:
            write_batches(writer)
            raise RuntimeError("model blew up")  # a failed task saves no fork
    other = repo.writable_session("main")
    zarr.open_array(other.store, path=f"{GROUP}/count", mode="r+")[ALIGNMENT] = 1
    other.commit("someone else's write")
    with pytest.raises(
        WriteConflictError,
        match=r"array 'out/count': chunk \(3,\) written by both the fork of slot "
        r"\[12, 24\) and commits on branch 'main' since the handoff's snapshot",
    ):
        IcechunkTransaction.collect(repo, handoff)
    clear_handoff(handoff)
    with pytest.raises(FileNotFoundError, match="no transaction was handed off"):
        IcechunkTransaction.collect(repo, handoff)


def test_a_writable_icechunk_store_of_ours_takes_the_layout_a_slot_and_its_commit(tmp_path: Path) -> None:
    layout = icechunk_store(tmp_path / "repo", read_only=False)  # a repository created for it
    create_layout(layout, layout_spec(), group=GROUP)
    layout.session.commit("layout")
    with icechunk_store(tmp_path / "repo", read_only=False) as store:
        with SlotWriter(store, 0, ALIGNMENT, group=GROUP) as writer:
            write_batches(writer)
        snapshot = store.session.commit("first slot")
    reader = icechunk_store(tmp_path / "repo", snapshot=snapshot)
    status = write_status(reader, GROUP)
    assert status.completed == ((0, ALIGNMENT),) and status.remaining == ((ALIGNMENT, EXTENT),)
    want = predictions(0, ALIGNMENT)
    for name in INDEXED:
        np.testing.assert_array_equal(zarr.open_array(reader, path=f"{GROUP}/{name}")[:ALIGNMENT], want[name])
