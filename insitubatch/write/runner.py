"""Run a slot plan on any ``concurrent.futures`` executor (or a dask.distributed ``Client``).

The runner is deliberately thin: it submits one task per range and collects
what each reports. Supervision (retries, placement, resources) stays with the
executor or the cluster scheduler; a task that failed leaves its range
unclaimed (or, after a crash, stale) and uncovered, so the next
``plan_slots(resume=True)`` returns it.

Given an :class:`~.icechunk.IcechunkTransaction` instead of a store, each
range is written in a fork of its own, which the task hands back in its
outcome and the runner merges; a range whose fork does not come back (or
does not merge) is not in the transaction, and the next
``plan_slots(tx.store)`` returns it.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zarr.abc.store import Store
from zarr.storage import MemoryStore

from ..errors import SlotRunError, WriteConflictError
from ..progress import progress
from ..stores.icechunk_stores import icechunk_session
from .icechunk import IcechunkTransaction
from .slots import SlotPlan
from .writer import SlotWriter

__all__ = ["RunReport", "SlotOutcome", "run_plan", "run_slot"]

WorkFn = Callable[[SlotWriter], Any]


@dataclass(frozen=True)
class SlotOutcome:
    """What one task reported for its range."""

    start: int
    stop: int
    ok: bool
    host: str
    pid: int
    seconds: float
    value: Any = None
    error: str | None = None
    # the fork a range of an icechunk transaction was written in, handed back for the coordinator to merge
    session: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class RunReport:
    """Every task's outcome, in range order."""

    outcomes: tuple[SlotOutcome, ...]

    @property
    def ok(self) -> bool:
        """Whether every range was written and recorded complete."""
        return all(o.ok for o in self.outcomes)

    @property
    def failed(self) -> tuple[SlotOutcome, ...]:
        """The outcomes of ranges that failed."""
        return tuple(o for o in self.outcomes if not o.ok)


def _resolve(store: Store | str) -> Store:
    if isinstance(store, str):
        from ..stores.obstore_stores import obstore_store

        return obstore_store(store, read_only=False)
    return store


def run_slot(
    store: Store | str,
    start: int,
    stop: int,
    work: WorkFn,
    *,
    group: str = "",
    writer_options: Mapping[str, Any] | None = None,
) -> SlotOutcome:
    """Write one range: open a :class:`SlotWriter`, call ``work(writer)``, record completion.

    This is the function a runner submits; it also serves a scheduler task
    that writes one range itself. It never raises for a failure of the work:
    the error (with traceback) is in the outcome.

    Parameters
    ----------
    store
        The zarr store, or a URL opened writable in the task.
    start, stop
        The range.
    work
        Called with the open writer; its return value lands in ``value``.
        Must be picklable by the executor (a module-level function or a
        ``functools.partial`` of one).
    group
        Path of the output group.
    writer_options
        Further :class:`SlotWriter` keyword arguments.

    Returns
    -------
    SlotOutcome
        With ``session``, the fork, when ``store`` is an icechunk fork's store.
    """
    began = time.perf_counter()
    host, pid = socket.gethostname(), os.getpid()
    try:
        resolved = _resolve(store)
        with SlotWriter(resolved, start, stop, group=group, **dict(writer_options or {})) as writer:
            value = work(writer)
    except Exception:
        return SlotOutcome(start, stop, False, host, pid, time.perf_counter() - began, error=traceback.format_exc())
    fork = icechunk_session(resolved)  # an icechunk fork goes back with the outcome: its changes are the slot
    fork = fork if type(fork).__name__ == "ForkSession" else None
    return SlotOutcome(start, stop, True, host, pid, time.perf_counter() - began, value=value, session=fork)


def _executor(executor: Any) -> cf.Executor | None:
    if executor is None or isinstance(executor, cf.Executor):
        return executor
    if hasattr(executor, "get_executor"):
        # a dask.distributed Client; pure=False so reruns of a range are not served from cache
        return executor.get_executor(pure=False)
    raise TypeError(f"executor={executor!r} must be a concurrent.futures.Executor, a dask.distributed.Client, or None")


def run_plan(
    store: Store | str | IcechunkTransaction | None,
    plan: SlotPlan,
    work: WorkFn,
    executor: cf.Executor | Any | None = None,
    *,
    writer_options: Mapping[str, Any] | None = None,
    raise_on_error: bool = True,
) -> RunReport:
    """Write every range of ``plan``, one task per range, on ``executor``.

    Parameters
    ----------
    store
        The zarr store (picklable: ``LocalStore``, obstore-backed ``ObjectStore``),
        a URL each task opens writable, ``None`` for the plan's ``store_url``,
        or an :class:`~insitubatch.write.IcechunkTransaction`: each range is
        written in a fork of its own and merged into the transaction when it
        comes back (commit it with ``tx.commit(message)``).
    plan
        From :func:`plan_slots`.
    work
        ``work(writer)`` writes the writer's range (``writer.start``,
        ``writer.stop``) through ``writer.write``. Must be picklable.
    executor
        A ``concurrent.futures.Executor`` (``ProcessPoolExecutor`` with the
        spawn or forkserver context, ``ThreadPoolExecutor``,
        ``dask.distributed.Client.get_executor()``), a ``dask.distributed.Client``
        itself, or ``None`` to run the ranges one after another here.
    writer_options
        Further :class:`SlotWriter` keyword arguments for every range.
    raise_on_error
        Raise :class:`~insitubatch.errors.SlotRunError` when a range failed.

    Returns
    -------
    RunReport
        For a transaction, an outcome is ``ok`` only if its fork merged.

    Raises
    ------
    SlotRunError
        Some ranges failed and ``raise_on_error``; ``.outcomes`` holds them all.
    ValueError
        ``store`` is a ``MemoryStore`` and the executor runs other processes,
        or no store at all.
    """
    if store is None:
        store = plan.store_url
        if store is None:
            raise ValueError("store=None and the plan has no store_url; pass the store")
    pool = _executor(executor)
    if isinstance(store, MemoryStore) and pool is not None and not isinstance(pool, cf.ThreadPoolExecutor):
        raise ValueError("a MemoryStore lives in this process only; run it with executor=None or a ThreadPoolExecutor")
    tx: IcechunkTransaction | None = None
    stores: list[Store | str]
    if isinstance(store, IcechunkTransaction):
        tx = store
        stores = [tx.fork_store() for _ in plan.ranges]  # a fork per range, each merged when it comes back
    else:
        stores = [store] * len(plan.ranges)
    args = [(target, r.start, r.stop, work) for target, r in zip(stores, plan.ranges, strict=True)]
    kwargs: dict[str, Any] = {"group": plan.group, "writer_options": dict(writer_options or {})}
    outcomes: list[SlotOutcome] = []
    if pool is None:
        outcomes = [run_slot(*a, **kwargs) for a in progress(args, desc="slots", unit="range")]
    else:
        futures = {pool.submit(run_slot, *a, **kwargs): a for a in args}
        for future in progress(cf.as_completed(futures), total=len(futures), desc="slots", unit="range"):
            _, start, stop, _ = futures[future]
            try:
                outcomes.append(future.result())
            except Exception as exc:  # the task never reported: worker died, pickling failed...
                detail = "".join(traceback.format_exception(exc))
                outcomes.append(SlotOutcome(start, stop, False, "", -1, 0.0, error=detail))
    outcomes.sort(key=lambda o: (o.start, o.stop))
    if tx is not None:
        outcomes = [_merged(tx, o) for o in outcomes]
    report = RunReport(tuple(outcomes))
    if raise_on_error and not report.ok:
        first = report.failed[0]
        raise SlotRunError(
            f"{len(report.failed)} of {len(report.outcomes)} ranges failed; they stay unrecorded, so "
            f"plan_slots(resume=True) returns them. First, [{first.start}, {first.stop}):\n{first.error}",
            report.outcomes,
        )
    return report


def _merged(tx: IcechunkTransaction, outcome: SlotOutcome) -> SlotOutcome:
    """``outcome`` after its fork is merged into ``tx`` (a fork that clashes fails it); the fork is dropped."""
    if not outcome.ok:
        return dataclasses.replace(outcome, session=None)
    if outcome.session is None:
        error = "the task reported success but handed back no icechunk fork; nothing of its range was merged"
        return dataclasses.replace(outcome, ok=False, error=error)
    try:
        tx.merge(outcome.session)
    except WriteConflictError as exc:
        return dataclasses.replace(outcome, ok=False, session=None, error=str(exc))
    return dataclasses.replace(outcome, session=None)
