"""Shared pieces of the icechunk write tests (no tests here): what spawned workers and tasks run.

A spawned child imports these by module name, so they live outside the test module.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
from write_helpers import BATCH, GROUP, predictions, write_batches

from insitubatch.write import SlotWriter, assigned_ranges, icechunk_fork

# What a killed writer leaves in the chunks it got to: no value a finished slot ever holds.
POISON = -999


def poison(lo: int, hi: int) -> dict[str, np.ndarray]:
    """Values no correct write produces, shaped like ``predictions(lo, hi)``."""
    return {name: np.full_like(values, POISON) for name, values in predictions(lo, hi).items()}


def crash_once(marker: str, victim: int, writer: SlotWriter) -> int:
    """Runner work: the first writer of the slot starting at ``victim`` writes part of it wrong, then is SIGKILLed.

    ``marker`` (a file) records that the crash happened, so the slot's next writer writes it properly.
    """
    if writer.start == victim and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        lo, hi = writer.start, writer.start + BATCH
        for name, values in poison(lo, hi).items():
            writer.write(name, (lo, hi), values)
        os.kill(os.getpid(), signal.SIGKILL)
    return write_batches(writer)


def scheduler_task(handoff: str, env: dict[str, str], marker: str, victim: int) -> None:
    """One SLURM array element: its ranges from the plan and its task index, written in one fork of the handoff."""
    ranges, group = assigned_ranges(env=env)
    with icechunk_fork(handoff) as store:
        for r in ranges:
            with SlotWriter(store, r.start, r.stop, group=group) as writer:
                crash_once(marker, victim, writer)


def slot_fork(tx: Any, start: int, stop: int, *, values: Any = None) -> Any:
    """A fork of ``tx`` with ``[start, stop)`` written through a slot writer (``values`` instead of the predictions)."""
    fork = tx.fork()
    with SlotWriter(fork.store, start, stop, group=GROUP) as writer:
        if values is None:
            write_batches(writer)
        else:
            for name, data in values.items():
                writer.write(name, (start, stop), data)
    return fork
