"""run_plan over executors: in-process, threads, spawn processes, dask.distributed; failures; the example."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from write_helpers import ALIGNMENT, GROUP, array_bytes, failing_work, layout_spec, reference_store, write_batches
from zarr.storage import LocalStore, MemoryStore

from insitubatch.errors import SlotRunError
from insitubatch.write import create_layout, plan_slots, run_plan, run_slot, write_status

REPO = Path(__file__).resolve().parents[2]
# Seconds the example may take on a loaded 2-core machine (it aims for a few).
EXAMPLE_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def reference() -> dict[str, bytes]:
    return array_bytes(reference_store())


def _fresh(store):
    create_layout(store, layout_spec(), group=GROUP)
    return plan_slots(store, group=GROUP, workers=4)


def test_in_process_run(reference: dict[str, bytes]) -> None:
    store = MemoryStore()
    report = run_plan(store, _fresh(store), write_batches)
    assert report.ok and [(o.start, o.stop) for o in report.outcomes] == [(0, 12), (12, 24), (24, 36), (36, 44)]
    assert all(o.value > 0 for o in report.outcomes)
    assert array_bytes(store) == reference


def test_thread_pool_run(reference: dict[str, bytes]) -> None:
    store = MemoryStore()
    with cf.ThreadPoolExecutor(4) as pool:
        assert run_plan(store, _fresh(store), write_batches, pool).ok
    assert array_bytes(store) == reference


def test_memory_store_refuses_process_pools() -> None:
    store = MemoryStore()
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(ValueError, match="MemoryStore"):
            run_plan(store, _fresh(store), write_batches, pool)


def test_failures_are_reported_and_resumable(tmp_path: Path, reference: dict[str, bytes]) -> None:
    store = LocalStore(tmp_path / "o.zarr")
    plan = _fresh(store)
    with pytest.raises(SlotRunError, match=r"(?s)1 of 4 ranges failed.*\[12, 24\).*model blew up") as info:
        run_plan(store, plan, failing_work)
    assert [o.ok for o in info.value.outcomes] == [True, False, True, True]
    status = write_status(store, GROUP)
    assert status.remaining == ((ALIGNMENT, 2 * ALIGNMENT),) and status.claims == ()
    report = run_plan(store, plan_slots(store, group=GROUP), write_batches)
    assert [(o.start, o.stop) for o in report.outcomes] == [(ALIGNMENT, 2 * ALIGNMENT)]
    assert array_bytes(store) == reference
    rerun = run_plan(store, plan, write_batches, raise_on_error=False)  # a stale plan: all complete
    assert not rerun.ok and all("already completed" in o.error for o in rerun.failed)


def test_run_slot_reports_instead_of_raising() -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    outcome = run_slot(store, 6, 12, write_batches, group=GROUP)
    assert not outcome.ok and "SlotAlignmentError" in outcome.error


@pytest.mark.slow
def test_spawn_process_pool_run(tmp_path: Path, reference: dict[str, bytes]) -> None:
    store = LocalStore(tmp_path / "o.zarr")
    plan = _fresh(store)
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        report = run_plan(store, plan, write_batches, pool)
    assert report.ok and array_bytes(store) == reference


@pytest.mark.slow
def test_dask_local_cluster_runs_a_plan_end_to_end(write_s3_store, reference: dict[str, bytes]) -> None:
    distributed = pytest.importorskip("distributed")
    plan = _fresh(write_s3_store)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        report = run_plan(write_s3_store, plan, write_batches, client)
        assert report.ok
        assert all(o.pid != os.getpid() for o in report.outcomes)  # ran in the workers
    assert array_bytes(write_s3_store) == reference
    assert write_status(write_s3_store, GROUP).remaining == ()
    assert plan_slots(write_s3_store, group=GROUP).ranges == ()


@pytest.mark.slow
def test_example_inference_write_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "inference_write.py"), "--workers", "2", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        cwd=REPO,
        # this tree's insitubatch, not an installed one (the script's folder comes first on sys.path)
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical" in result.stdout
