"""PassTasks on its own: a pass's tasks and decode-pool jobs are cancelled or awaited as one, and its waits timed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

from insitubatch._engine.stats import PassCounters
from insitubatch._engine.tiles.tasks import PassTasks

SHORT_S = 0.05  # a wait long enough to measure, short enough not to slow the suite
EPS_S = 0.005  # clock reads a few statements apart


def test_cancelling_waits_for_the_jobs_and_undoes_what_a_cancelled_task_left_running() -> None:
    release = threading.Event()
    undone: list[str] = []

    async def scenario() -> None:
        tasks = PassTasks(asyncio.get_running_loop(), PassCounters(), gated=False)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            job = pool.submit(release.wait, 10)
            orphaned = pool.submit(release.wait, 10)
            tasks.track(job)
            tasks.orphan(orphaned, lambda: undone.append("cleanup"))
            never = asyncio.get_running_loop().create_future()
            spawned = tasks.spawn(asyncio.wait_for(never, None), work=True)
            await asyncio.sleep(0)
            assert tasks.running() == [spawned]
            stopping = asyncio.ensure_future(tasks.cancel_all(None))
            await asyncio.sleep(SHORT_S)
            assert not stopping.done() and spawned.cancelled()  # the task is gone; the jobs still run
            assert undone == []
            release.set()
            await stopping
            assert job.done() and orphaned.done() and undone == ["cleanup"]
            assert tasks.running() == []

    asyncio.run(scenario())


def test_a_gated_pass_waits_for_its_first_blocks_work_and_the_work_that_started() -> None:
    order: list[str] = []

    async def scenario() -> None:
        tasks = PassTasks(asyncio.get_running_loop(), PassCounters(), gated=True)

        async def later() -> None:
            await asyncio.sleep(SHORT_S)
            order.append("later")

        async def first() -> None:
            await asyncio.sleep(0)
            tasks.spawn(later(), work=True)  # started by a first-block read: waited for too
            order.append("first")

        assert tasks.gated
        tasks.spawn(first(), work=True)
        tasks.spawn(asyncio.sleep(10))  # not work (a pump, a prefetch): not waited for
        await tasks.first_block_lands()
        order.append("landed")
        assert not tasks.gated
        await tasks.cancel_all(None)

    asyncio.run(scenario())
    assert order == ["first", "later", "landed"]


def test_waiting_for_room_counts_as_budget_wait_only_while_no_work_is_active() -> None:
    counters = PassCounters()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        tasks = PassTasks(loop, counters, gated=False)
        wake = asyncio.Event()
        t0 = time.perf_counter()
        busy = tasks.spawn(asyncio.sleep(SHORT_S), work=True)
        ended: list[float] = []
        busy.add_done_callback(lambda _: ended.append(time.perf_counter()))  # runs after the pass's own
        loop.call_later(3 * SHORT_S, wake.set)
        await tasks.wait(wake)  # work active for SHORT_S at least, then idle until woken
        t1 = time.perf_counter()
        stalled = counters.trace.budget_wait_s
        # from the work's end to the wake-up: never the part of the wait while the work ran
        assert t0 + 3 * SHORT_S - ended[0] - EPS_S <= stalled <= t1 - t0 - SHORT_S + EPS_S

        tasks.work_started()  # work active for the whole wait: nothing counts
        loop.call_later(SHORT_S, wake.set)
        await tasks.wait(wake)
        assert counters.trace.budget_wait_s == stalled
        tasks.work_ended(busy)
        assert counters.trace.budget_wait_s == stalled  # not waiting: an end of work starts no stall

    asyncio.run(scenario())
