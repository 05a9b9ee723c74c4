"""``LocalTiles``: the tile source of a store read on the decode threads (a local directory, memory).

A wanted tile queues here; a pump on the loop sends the queue to the decode
pool in groups, each tile under one of the pass's read permits from then
until its job ended. The job reads the keys itself (``TileJobs.group_job``):
there is no GET to await on the loop.
"""

from __future__ import annotations

import asyncio
import collections

from ..pool.chunk_pool import Entry
from ..reads.reader import ArrayReader
from ..reads.window import WindowUser
from .landings import Landings, release_permits
from .tasks import PassTasks
from .tile_jobs import TileJobs
from .wants import Want, Wants

__all__ = ["LocalTiles"]


class LocalTiles:
    """Tiles of a synchronous store: queued as wanted, read and decoded a group per decode-pool job."""

    def __init__(
        self,
        *,
        wants: Wants,
        semaphore: WindowUser,
        jobs: TileJobs,
        landings: Landings,
        tasks: PassTasks,
        group: int,
    ) -> None:
        self.wants = wants
        self.semaphore = semaphore  # the read permits: one per tile from its group's start to its landing
        self.jobs = jobs
        self.landings = landings
        self.tasks = tasks
        self.group = group
        self._queued: collections.deque[Want] = collections.deque()  # tiles waiting for a permit
        self._pump: asyncio.Task | None = None

    def want(self, entry: Entry, reader: ArrayReader, chunk_index: int, start: bool = True) -> None:
        """Loop: read the tiles ``entry`` needs: each joins a read of the same stored tile still waiting, else queues."""
        fresh = self.wants.add(entry, reader, chunk_index, self.semaphore.window.ticket())
        self._queued.extend(fresh)
        if fresh and (self._pump is None or self._pump.done()):
            self._pump = self.tasks.spawn(self._pump_tiles())

    def start(self, hold_shards: bool = False) -> None:
        """Loop: nothing waits to start here (the pump sends what is queued)."""

    async def _pump_tiles(self) -> None:
        """Queued tiles go to the decode pool in groups of ``self.group``.

        Each tile holds one ``max_inflight`` permit from here until its job
        ended. Tiles queue up while the permits are all out; with permits
        free, the pump waits up to ``self.group - 1`` loop turns for the
        driver to admit more, so a group costs one submit and one wake-up
        even when the decode pool keeps up.
        """
        queued, semaphore, size, tasks = self._queued, self.semaphore, self.group, self.tasks
        while queued:
            await semaphore.acquire()
            held = 1
            try:
                for _ in range(size - 1):
                    if len(queued) >= size:
                        break
                    await asyncio.sleep(0)  # one more admission turn of the driver: a fuller group
                group = [queued.popleft()]
                while queued and len(group) < size and not semaphore.locked():
                    await semaphore.acquire()  # free: returns without suspending
                    held += 1
                    group.append(queued.popleft())
                fut, job = self.landings.submit(self.jobs.group_job, group)
            except BaseException:  # cancelled while gathering a group: its permits go back
                release_permits(semaphore, held)
                raise

            # the permits go back when the job's outcome lands, whatever happens to the tasks
            def give_back(_fut: asyncio.Future, n: int = held) -> None:
                release_permits(semaphore, n)

            fut.add_done_callback(give_back)
            tasks.track(job)
            tasks.work_started()  # this pass has work active until the group lands
            fut.add_done_callback(tasks.work_ended)
