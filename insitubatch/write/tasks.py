"""Which slot ranges a worker task writes: from the environment its scheduler gives it.

A scheduler hands each task either its range directly
(``INSITUBATCH_SLOT_START``/``STOP``) or a saved plan plus its own task index
(SLURM job arrays, Kubernetes indexed Jobs, torchrun); :func:`assigned_ranges`
resolves both, :func:`task_index_from_env` the index alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .slots import ENV_PLAN, ENV_SLOT_GROUP, ENV_SLOT_START, ENV_SLOT_STOP, TASK_INDEX_VARIABLES, SlotPlan, SlotRange

__all__ = ["assigned_ranges", "task_index_from_env"]


def task_index_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int | None, str]:
    """The task index (and count, when exported) a scheduler gave this process.

    Consults, in order, ``SLURM_ARRAY_TASK_ID`` (count ``SLURM_ARRAY_TASK_COUNT``),
    ``JOB_COMPLETION_INDEX`` (Kubernetes indexed Jobs), and ``RANK`` (count
    ``WORLD_SIZE``; torchrun).

    Returns
    -------
    (index, count or None, variable name)

    Raises
    ------
    KeyError
        None of the variables is set.
    ValueError
        The variable is not a non-negative integer.
    """
    env = os.environ if env is None else env
    for name, count_name in TASK_INDEX_VARIABLES:
        if name in env:
            try:
                index = int(env[name])
                count = int(env[count_name]) if count_name and count_name in env else None
            except ValueError as exc:
                raise ValueError(f"{name}={env[name]!r} (or its count) is not an integer") from exc
            if index < 0:
                raise ValueError(f"{name}={index} must be >= 0")
            return index, count, name
    names = ", ".join(name for name, _ in TASK_INDEX_VARIABLES)
    raise KeyError(f"no task index in the environment: set one of {names}")


def assigned_ranges(
    plan: SlotPlan | None = None, env: Mapping[str, str] | None = None
) -> tuple[tuple[SlotRange, ...], str]:
    """The slot ranges (and group) the environment assigns to this process.

    ``INSITUBATCH_SLOT_START``/``STOP`` (and ``INSITUBATCH_SLOT_GROUP``) name
    the range directly. Otherwise the plan (``plan``, or the JSON file named
    by ``INSITUBATCH_SLOT_PLAN``) is indexed by the scheduler's task index
    (:func:`task_index_from_env`).

    Returns
    -------
    (ranges, group)

    Raises
    ------
    KeyError
        Neither a range nor a plan plus a task index is in the environment.
    """
    env = os.environ if env is None else env
    if ENV_SLOT_START in env or ENV_SLOT_STOP in env:
        try:
            rng = SlotRange(int(env[ENV_SLOT_START]), int(env[ENV_SLOT_STOP]))
        except KeyError as exc:
            raise KeyError(f"set both {ENV_SLOT_START} and {ENV_SLOT_STOP}, not just one") from exc
        return (rng,), env.get(ENV_SLOT_GROUP, "")
    if plan is None:
        if ENV_PLAN not in env:
            raise KeyError(
                f"no slot range in the environment: set {ENV_SLOT_START}/{ENV_SLOT_STOP}, or "
                f"{ENV_PLAN} to a saved plan plus a scheduler task index"
            )
        plan = SlotPlan.load(env[ENV_PLAN])
    index, count, _ = task_index_from_env(env)
    return plan.ranges_for_task(index, count), plan.group
